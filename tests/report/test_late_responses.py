"""Late responses (issue 42: "the value's own time versus the scrape's time"): dcgm-exporter reads a request's values
from DCGM when it serves it, after the connection and any queueing, then maps pods, renders and sends them; a local
reader reads GPU after GPU. A value can then be newer than its scrape's start (`timestamp_ns`) by up to the response's
length, which the record keeps as `scrape_end_ns` (tests/report/sensor_runs.py `late_ms`: values read up to 300 ms
after the scrape's start, the page complete up to 50 ms after that).

Measured before the report read `scrape_end_ns` (session 27, seeds 0-7, values read up to 100 ms late): at a 1 s
refresh, steady power read through the instant gauge was inside its uncertainty in 19 of 24 valid windows (one 5.9×
out), a ramp in 21 of 24.

The grid below was fixed before its first run."""

from __future__ import annotations

import functools

import pytest

from tests.ahead import on_two_processes
from tests.report.sensor_runs import WINDOWS, Judged, RunSpec, judge

SHAPES = ("model", "steady", "ramp", "steps", "square", "bursts")
REFRESHES = (0, 0.1, 1, 2, 10)
SENSORS = (("average", "held"), ("instant", "continuous"))
SEEDS = range(5100, 5108)
LATE_MS = 300
GRID = [RunSpec(shape, refresh, window, gauge, counter, seed, late_ms=LATE_MS) for shape in SHAPES
        for refresh in REFRESHES for gauge, counter in SENSORS for window in WINDOWS for seed in SEEDS]

AHEAD = {"test_late_responses_stay_inside_their_uncertainty_and_bound": [(judge, GRID)]}


@functools.cache  # (judged once for every group)
def _judged() -> list[Judged]:
    return on_two_processes(judge, GRID)


@pytest.mark.parametrize("shape", SHAPES)
def test_late_responses_stay_inside_their_uncertainty_and_bound(shape: str) -> None:
    """Each refresh × sensors: 40 windows (5-300 s × 8 seeds). The bound holds in every window; the uncertainty covers
    the error in ≥ 95 % of the valid ones; ≥ 90 % of those with ≥ 5 refreshes are valid (issue 42's criteria)."""
    failed = []
    for refresh in REFRESHES:
        for gauge, counter in SENSORS:
            group = [j for j in _judged() if j.spec.shape == shape and j.spec.refresh_s == refresh
                     and (j.spec.gauge, j.spec.counter) == (gauge, counter)]
            assert len(group) == len(WINDOWS) * len(SEEDS)
            name = f"{refresh} s {gauge}/{counter}"
            broken = [(j.spec.window_s, j.spec.seed, round(j.error, 1), round(j.bound, 1)) for j in group
                      if j.error > j.bound]
            if broken:
                failed.append(f"{name}: bound broken {broken}")
            valid = [j for j in group if j.valid]
            missed = [(j.spec.window_s, j.spec.seed, round(j.error / j.uncertainty, 2)) for j in valid
                      if j.error > j.uncertainty]
            if len(missed) > 0.05 * len(valid):
                failed.append(f"{name}: {len(missed)} of {len(valid)} valid windows outside {missed}")
            enough = [j for j in group if j.refreshes is None or j.refreshes >= 5]
            if sum(j.valid for j in enough) < 0.9 * len(enough):
                failed.append(f"{name}: {sum(j.valid for j in enough)} of {len(enough)} valid "
                              f"{sorted({r for j in enough for r in j.reasons})}")
    assert not failed, failed
