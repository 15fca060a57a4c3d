"""Late responses (issue 42: "the value's own time versus the scrape's time"): dcgm-exporter reads a request's values
from DCGM when it serves it, after the connection and any queueing, then maps pods, renders and sends them; a local
reader reads GPU after GPU. A value can then be newer than its scrape's start (`timestamp_ns`) by up to the response's
length, which the record keeps as `scrape_end_ns` (tests/report/sensor_runs.py `late_ms`: values read up to 300 ms
after the scrape's start, the page complete up to 50 ms after that).

The grid below was fixed before its first run (session 27, when the report did not read `scrape_end_ns`): 19 of its
60 groups failed, 9 windows of the local reader's outside their hard bound (up to 86.5 J off against ± 30.7 J).
Since the report reads the ends (DESIGN.md, "Sources, scraping and sample time"), 57 pass; the three in `MISSED`
fail as the same shapes and refreshes do without late responses (test_energy_accuracy.py's groups)."""

from __future__ import annotations

import functools

import pytest

from tests.ahead import on_two_processes
from tests.report.sensor_runs import WINDOWS, Judged, assert_group_holds, grid_specs, judge, side_groups

SHAPES = ("model", "steady", "ramp", "steps", "square", "bursts")
REFRESHES = (0, 0.1, 1, 2, 10)
SENSORS = (("average", "held"), ("instant", "continuous"))
SEEDS = range(5100, 5108)
LATE_MS = 300
GRID = grid_specs(SEEDS, SHAPES, REFRESHES, SENSORS, late_ms=LATE_MS)

AHEAD = {"test_late_responses_stay_inside_their_uncertainty_and_bound": [(judge, GRID)]}

MISSED = {  # (shape, refresh s, gauge/counter): the figures since the report reads the ends; issue 42 is open
    ("steady", 1, "instant/continuous"): "5 of 40 valid windows outside, up to 2.5× (the energy's clock: a period "
                                         "2.1-3.3 ms off against a stated spread of 1.1-1.3 ms)",
    ("square", 1, "average/held"): "10 of 40 valid windows outside, up to 2,557× (a square wave at the refresh's "
                                   "period, through a one-second average: every refresh sees it alike)",
    ("square", 2, "average/held"): "3 of 39 valid windows outside, up to 1.7×",
}


@functools.cache  # (judged once for every group)
def _judged() -> list[Judged]:
    return on_two_processes(judge, GRID)


@pytest.mark.parametrize(("shape", "refresh", "sensors"), side_groups(SHAPES, REFRESHES, SENSORS, MISSED))
def test_late_responses_stay_inside_their_uncertainty_and_bound(shape: str, refresh: float, sensors: str) -> None:
    """40 windows (5-300 s × 8 seeds): the bound holds in every one; the uncertainty covers the error in ≥ 95 % of
    the valid ones; ≥ 90 % of those with ≥ 5 refreshes are valid (issue 42's criteria)."""
    assert_group_holds(_judged(), shape, refresh, sensors, len(WINDOWS) * len(SEEDS))
