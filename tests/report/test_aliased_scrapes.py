"""Scrapes every multiple of the energy counter's 100 ms hold (issue 42): readings at one phase of the hold show no
hold, yet a wrap of that phase between the edges puts them a whole update apart (tests/report/aliased.py). Found in
session 25: README's sidecar at `--interval 0.1` on a loaded machine read a GPU's energy 12 J off against a stated
± 2 J (bench/aliased_hold.py: errors up to 19.8× the stated uncertainty).

The grid below was fixed before its first run."""

from __future__ import annotations

import functools
import math

import pytest

from bridge.report import build_report
from bridge.report.window import explicit_window
from bridge.simulator.sensors import Sensors
from tests.ahead import on_two_processes
from tests.report.aliased import GRACE, START, AliasedJudged, AliasedSpec, judge_aliased
from tests.report.helpers import MS, URL, S, recs
from tests.report.sensor_runs import SHAPES

INTERVALS = (0.1, 0.5, 1.0)
READERS = (False, True)  # scraped from an exporter; read by the local NVML reader
SEEDS = range(40)
GRID = [AliasedSpec(interval, seed, local=local) for interval in INTERVALS for local in READERS for seed in SEEDS]

# Issue 42's load shapes at the same intervals and readers (the smooth power above is what the change was designed
# on), 30 windows a group on seeds fixed before their first run.
SHAPED_SEEDS = range(3000, 3030)
SHAPED_GRID = [AliasedSpec(interval, seed, local=local, shape=shape) for shape in SHAPES for interval in INTERVALS
               for local in READERS for seed in SHAPED_SEEDS]

AHEAD = {"test_scrapes_at_one_phase_of_the_hold_are_inside_their_uncertainty_in_95_percent_of_windows":
         [(judge_aliased, GRID)],
         "test_every_load_shape_scraped_at_one_phase_of_the_hold_is_inside_its_uncertainty_in_95_percent_of_windows":
         [(judge_aliased, SHAPED_GRID)]}


@functools.cache  # (judged once for every group)
def _judged(shaped: bool = False) -> list[AliasedJudged]:
    return on_two_processes(judge_aliased, SHAPED_GRID if shaped else GRID)


@pytest.mark.parametrize("interval", INTERVALS)
@pytest.mark.parametrize("local", READERS, ids=("exporter", "local"))
def test_scrapes_at_one_phase_of_the_hold_are_inside_their_uncertainty_in_95_percent_of_windows(
        interval: float, local: bool) -> None:
    """Each interval × reader: 40 windows, half on a fixed update grid, half drifting; latency ramps up to 40 ms."""
    judged = [j for j in _judged() if j.spec.interval_s == interval and j.spec.local == local]
    assert len(judged) == len(SEEDS)
    assert all(j.error <= j.bound for j in judged)
    valid = [j for j in judged if j.valid]
    assert len(valid) >= 0.9 * len(judged), [j.reasons for j in judged if not j.valid]
    missed = [(j.spec.seed, round(j.error, 2), round(j.uncertainty, 2)) for j in valid if j.error > j.uncertainty]
    assert len(missed) <= 0.05 * len(valid), missed
    counter_missed = [j.spec.seed for j in valid if j.counter_error > j.counter_uncertainty]
    assert len(counter_missed) <= 0.05 * len(valid), counter_missed


# The first run's figures (2026-12-07): idle at 0.1 s from an exporter, 2 of 30 valid windows outside (0.7 J against
# ± 0.6 J and ± 0.7 J); square at 0.5 s and 1 s from an exporter, 2 of 30 each (up to 42.9 J against ± 17.9 J). Both
# pass since session 28 states the exporter's refresh that may walk beneath scrapes at whole holds (ages.py
# `_walking_refresh`).
MISSED: dict[str, str] = {}
# (bursts, 1 s, local, failed its first run too: one window 223.9 J off against a bound of ± 200.5 J, the end edge
# extrapolated at a burst's rate past a reading 0.69 s after it, beyond AIPerf's grace; fixed in refresh.py
# `_reaching`, since when it passes)


@pytest.mark.parametrize("shape", [
    pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=f"issue 42 (open): {MISSED[s]}")) if s in MISSED else s
    for s in SHAPES])
def test_every_load_shape_scraped_at_one_phase_of_the_hold_is_inside_its_uncertainty_in_95_percent_of_windows(
        shape: str) -> None:
    """Each interval × reader: 30 windows; valid in ≥ 90 % but for the spike at an edge (issue 42's criterion)."""
    for interval in INTERVALS:
        for local in READERS:
            judged = [j for j in _judged(shaped=True)
                      if j.spec.shape == shape and j.spec.interval_s == interval and j.spec.local == local]
            group = (interval, "local" if local else "exporter")
            assert len(judged) == len(SHAPED_SEEDS)
            assert all(j.error <= j.bound for j in judged), group
            valid = [j for j in judged if j.valid]
            assert shape == "spike" or len(valid) >= 0.9 * len(judged), (group, [j.reasons for j in judged])
            missed = [(j.spec.seed, round(j.error, 2), round(j.uncertainty, 2)) for j in valid
                      if j.error > j.uncertainty]
            assert len(missed) <= 0.05 * len(valid), (group, missed)


POWER_W = 400.0


def _steady_run(latency_end_ms: float) -> tuple[float, float, float]:
    """(error, uncertainty, the counter's uncertainty) for 400 W steady, the counter held on a fixed 100 ms grid,
    scrapes every 100 ms at 70 ms past its updates, the reads' latency ramping from 0 to `latency_end_ms` over 75
    scrapes, the window from the 20th scrape to the 60th: the read phase crosses an update inside the window where the
    ramp passes 30 ms (at scrape 75 × 30 / latency_end_ms)."""
    sensors = Sensors(phase_s=0.0)

    def energy_j(t_ns: int) -> float:
        return 1e6 + POWER_W * (t_ns - START) / S

    scrapes = [START + 2 * S + 70 * MS + k * 100 * MS for k in range(75)]
    reads = [t + round(latency_end_ms * MS * k / 75) for k, t in enumerate(scrapes)]
    counter = [sensors.counter_mj(energy_j, t) * 1e-9 for t in reads]
    gauge = [sensors.gauge_w(energy_j, lambda _: POWER_W, t) for t in reads]
    start, end = scrapes[20] + 50 * MS, scrapes[60] + 50 * MS
    built = build_report(recs(scrapes, counter, gauge, url=URL), window=explicit_window(start, end, GRACE))
    energy = built.energy
    (gpu,) = energy.gpus
    assert energy.total_energy_j is not None and energy.uncertainty_j is not None
    assert gpu.counter_uncertainty_j is not None
    return abs(energy.total_energy_j - POWER_W * (end - start) / S), energy.uncertainty_j, gpu.counter_uncertainty_j


def test_a_wrap_of_the_hidden_phase_between_the_edges_is_stated_as_a_whole_update() -> None:
    error, stated, counter_stated = _steady_run(60.0)  # (the wrap at scrape 37)
    assert math.isclose(error, POWER_W * 0.1, abs_tol=2.0)  # (the construction: the edges a whole update apart)
    assert stated >= error and counter_stated >= error


def test_without_a_wrap_the_hidden_age_is_not_stated_whole() -> None:
    """The hidden age moves both edges alike: what is left is its walk, not two independent ages of a hold."""
    error, stated, _ = _steady_run(20.0)  # (the phase reaches 90 ms: no wrap)
    assert error < 1.0
    assert stated <= POWER_W * 0.1 / 4
