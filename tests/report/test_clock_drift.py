"""The energy counter's update clock drifts against DCGM's (issue 42): the GPU updates its counter every 100 ms on
its own clock, DCGM samples it on the host's every `-c` ms, so a served value's age beneath the refresh walks by the
drift times the time elapsed (an H200's update periods measured 100.0-100.2 ms on the host's clock:
bench/RESULTS.md, "A real GPU"). No refreshed value shows such a walk (it scales every rate alike), so a window's
uncertainty states it: never more than the clocks' drift allows, nor than the readings' span allows where they
show no wrap.

Truth: steady power, a closed-form integral; the counter is it in whole mJ at its last update (the simulator's
sensor model, bridge/simulator/sensors.py), served as of DCGM's last refresh before each scrape; scrapes every
333 ms ± 20 ms as AIPerf's."""

from __future__ import annotations

import math
import random

import pytest

from bridge.report import build_report
from bridge.report.ages import refresh_ages
from bridge.report.window import explicit_window
from bridge.simulator.sensors import Sensors
from tests.report.helpers import MS, S, served

BASE = 1_800_000_000 * S
POWER_W = 500.0


def records(drift: float, refresh_s: float, length_s: float, seed: int, phase_s: float | None = None) -> list:
    rng = random.Random(seed)
    sensors = Sensors(counter_update_s=0.1, drift=drift, phase_s=rng.uniform(0, 0.1) if phase_s is None else phase_s)
    return served(rng, refresh_s, BASE, BASE + round(length_s * S), lambda at: {
        "nvidia_energy_consumption": sensors.counter_mj(_energy_j, at) * 1e-9, "nvidia_power_usage": POWER_W})


def _energy_j(t_ns: int) -> float:
    return POWER_W * (t_ns - BASE) / S + 1e6


def error_and_stated(log: list, start_s: float, end_s: float) -> tuple[float, float]:
    start, end = BASE + round(start_s * S), BASE + round(end_s * S)
    built = build_report(log, window=explicit_window(start, end, 666 * MS))
    total, stated = built.energy.total_energy_j, built.energy.uncertainty_j
    assert total is not None and stated is not None and built.energy.bound_j is not None
    error = abs(total - POWER_W * (end_s - start_s))
    assert error <= built.energy.bound_j
    return error, stated


# Fixed before the first run: every drift × refresh × seed, one 30 s window in 36 s of readings each.
DRIFTS = (1.5e-3, -1.5e-3, 2e-3, -8e-4, 5e-4)
REFRESHES = (0.5, 1.0, 2.0)
SEEDS = range(10)


def test_a_counter_clock_drifting_against_dcgms_is_inside_the_uncertainty_in_95_percent_of_windows() -> None:
    """150 windows: the served values' hidden age walks up to 60 ms over 30 s (30 J at 500 W) unless it wraps;
    where the energy's clock times the refreshes it shows the counter's own updates and no walk is left."""
    found = [error_and_stated(records(drift, refresh_s, 36.0, seed), 3.0, 33.0)
             for drift in DRIFTS for refresh_s in REFRESHES for seed in SEEDS]
    walked = [error for error, _ in found if error > 1.0]
    assert len(walked) >= len(found) // 4  # the walk is there in many windows: the test can fail
    covered = sum(error <= stated for error, stated in found) / len(found)
    assert covered >= 0.95, covered


@pytest.mark.parametrize("refresh_s", REFRESHES)
def test_a_locked_grid_states_no_more_than_the_drift_allows(refresh_s: float) -> None:
    """The counter's clock the host's (no drift): the age never walks, the error is the counter's resolution, and
    the uncertainty is at most what a 0.2 % drift could walk over the window (plus the readings' own terms)."""
    for seed in range(4):
        error, stated = error_and_stated(records(0.0, refresh_s, 36.0, seed), 3.0, 33.0)
        assert error < 0.05
        assert stated <= 0.95 * 2e-3 * 30 * POWER_W + 2.0, (refresh_s, seed, stated)


def test_the_walk_is_the_drift_over_the_window_at_most_a_hold_over_the_readings_span() -> None:
    """Refreshes every second, no wrap among them: the drift is at most 0.2 %, and less than a hold over their span."""
    import numpy as np

    for span_s, expected in ((36.0, 0.95 * 2e-3 * 30), (600.0, 0.95 * 0.1 / 600 * 30)):
        t = np.arange(0.0, span_s + 1e-9, 1.0)
        ages = refresh_ages(t, POWER_W * 1e-6 * t, 0.1, 30.0)
        assert ages.walk_s == pytest.approx(expected, rel=1e-9), span_s
    t = np.arange(0.0, 601.0, 1.0)
    assert refresh_ages(t, POWER_W * 1e-6 * t, 0.1, 600.0).walk_s == pytest.approx((1 - math.sqrt(0.05)) * 0.1)
    assert refresh_ages(t, POWER_W * 1e-6 * t, 0.1, 0.0).walk_s == 0.0  # (timed by the energy's clock)
