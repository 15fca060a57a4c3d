"""Scrapes a second apart (issue 42: "the value's own time versus the scrape's time", "scrape jitter"): AIPerf
collects every 333 ms, but a user's sidecar, Prometheus or vmagent often scrapes every second (`--interval 1`), and
dcgm-exporter's collect interval (`-c`) is then a round share of it or the same: 100, 500, 1000 ms. A refresh that
divides the scrapes' spacing is read at nearly one phase of it: each served value's age beneath its scrape walks only
with the scrapes' jitter (here ± 20 ms a scrape, a response's time, as AIPerf's), so the readings' deviations show
almost none of it, yet the two edges' ages may lie a refresh apart.

The grid below was fixed before its first run (session 28). That run, on the report as it was: 26 of its 60 groups
failed, the bound held in every window. Since a refresh may walk beneath the readings (bridge/report/ages.py
`_walking_refresh`), 53 pass; the 7 in `MISSED` fail with their figures (DECISIONS.md, "Session 28")."""

from __future__ import annotations

import functools

import pytest

from tests.ahead import on_two_processes
from tests.report.sensor_runs import WINDOWS, Judged, assert_group_holds, grid_specs, judge, side_groups

SHAPES = ("model", "steady", "ramp", "steps", "square", "bursts")
REFRESHES = (0, 0.1, 0.5, 1, 2)
SENSORS = (("average", "held"), ("instant", "continuous"))
SEEDS = range(5200, 5208)
SCRAPE_MS = 1000
GRID = grid_specs(SEEDS, SHAPES, REFRESHES, SENSORS, scrape_ms=SCRAPE_MS)

AHEAD = {"test_scrapes_a_second_apart_stay_inside_their_uncertainty_and_bound": [(judge, GRID)]}

# (shape, refresh s, gauge/counter): the figures since a refresh may walk beneath the readings (bridge/report/ages.py
# `_walking_refresh`); issue 42 is open.
MISSED: dict[tuple[str, float, str], str] = {
    ("steady", 1, "average/held"): "4 of 40 valid windows outside, up to 1.9×",
    ("ramp", 0, "average/held"): "4 of 40 valid windows outside, up to 1.6× (the local reader: readings at one phase "
                                 "of its hold)",
    ("ramp", 2, "average/held"): "6 of 40 valid windows outside, up to 1.2× (timed at the refreshes)",
    ("square", 0, "average/held"): "5 of 40 valid windows outside, up to 3.5× (the local reader)",
    ("square", 0, "instant/continuous"): "4 of 40 valid windows outside, up to 4.0× (the local reader)",
    ("square", 0.5, "average/held"): "3 of 40 valid windows outside, up to 1.2×",
    ("square", 1, "instant/continuous"): "4 of 37 valid windows outside, up to 2.8×",
}


@functools.cache  # (judged once for every group)
def _judged() -> list[Judged]:
    return on_two_processes(judge, GRID)


@pytest.mark.parametrize(("shape", "refresh", "sensors"), side_groups(SHAPES, REFRESHES, SENSORS, MISSED))
def test_scrapes_a_second_apart_stay_inside_their_uncertainty_and_bound(shape: str, refresh: float,
                                                                        sensors: str) -> None:
    """40 windows (5-300 s × 8 seeds): the bound holds in every one; the uncertainty covers the error in ≥ 95 % of
    the valid ones; ≥ 90 % of those with ≥ 5 refreshes are valid (issue 42's criteria)."""
    assert_group_holds(_judged(), shape, refresh, sensors, len(WINDOWS) * len(SEEDS))
