"""Interpolated energy is within 0.5 % of ground truth over a 20 s window at 3 Hz, with and without a reset.

Ground truth comes from two places: the seeded simulator's model (`NodeModel.energy_joules`, counters in
whole mJ, optional refresh cadence and scripted counter resets), and an analytic power curve whose
integral is known in closed form (independent of the simulator's code).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pytest

from bridge.report import build_report
from bridge.report.stats import counter_delta_interpolated
from bridge.report.window import explicit_window
from bridge.samples import GpuRecord
from tests.ahead import on_two_processes
from tests.report.helpers import MS, S, rec, recs
from tests.report.sensor_runs import (
    REFRESHES,
    SENSORS,
    SHAPES,
    STEADY_SHAPES,
    GroupKey,
    Judged,
    SettlingSteps,
    Sinusoids,
    energies,
    grid_specs,
    judge,
    judge_groups,
    loose,
    powers,
)

START = 1_800_000_000 * S
END = START + 20 * S
GRACE = 666 * MS
TOLERANCE = 0.005


def scrape_times(rng: random.Random) -> list[int]:
    """3 Hz with ±20 ms jitter, from a random phase before the window to past the grace."""
    t = START - rng.randrange(200 * MS, 533 * MS)
    out = []
    while t <= END + GRACE:
        out.append(t)
        t += 333 * MS + rng.randrange(-20 * MS, 20 * MS)
    return out


def _energy(records: list[GpuRecord], mode: str = "interpolated") -> float:
    built = build_report(records, window=explicit_window(START, END, GRACE), counter_mode=mode)  # type: ignore[arg-type]
    assert built.energy.total_energy_j is not None
    return built.energy.total_energy_j


@pytest.mark.parametrize("reset", [False, True], ids=["no-reset", "reset"])
@pytest.mark.parametrize("refresh_ms", [0, 33], ids=["fresh", "refresh-33ms"])
def test_interpolated_energy_matches_the_simulators_ground_truth(reset: bool, refresh_ms: int) -> None:
    from bridge.simulator.config import SimulatorConfig
    from bridge.simulator.model import NodeModel

    worst = 0.0
    for seed in range(12):
        model = NodeModel(SimulatorConfig(gpus=2, seed=seed, refresh_ms=refresh_ms, boot_ns=START - 86_400 * S))
        rng = random.Random(seed)
        if reset:  # a driver reload: every GPU's counters restart from 0 inside the window
            model.reset_counters(START + rng.randrange(2 * S, 18 * S))
        records = [rec(t, {"nvidia_energy_consumption": model.counter_mj(gpu, t) * 1e-9,
                           "nvidia_power_usage": model.power_watts(gpu, model.sample_time_ns(t))},
                       uuid=f"GPU-{gpu}", index=gpu)
                   for t in scrape_times(rng) for gpu in range(2)]
        truth = model.energy_joules(0, START, END) + model.energy_joules(1, START, END)
        worst = max(worst, abs(_energy(records) / truth - 1))
        built = build_report(records, window=explicit_window(START, END, GRACE))
        gpus = built.telemetry_data["endpoints"]["127.0.0.1:19401"]["gpus"]
        assert all(g["metrics"]["nvidia_energy_consumption"].get("resets", 0) == int(reset) for g in gpus.values())
    assert worst < TOLERANCE


def _analytic_power(t_s: float) -> float:
    return 300.0 + 120.0 * math.sin(2 * math.pi * t_s / 7.0) + 40.0 * math.sin(2 * math.pi * t_s / 1.3)


def _analytic_energy(t0_s: float, t1_s: float) -> float:
    """∫ power dt in joules, in closed form."""
    def antiderivative(t: float) -> float:
        return (300.0 * t - 120.0 * 7.0 / (2 * math.pi) * math.cos(2 * math.pi * t / 7.0)
                - 40.0 * 1.3 / (2 * math.pi) * math.cos(2 * math.pi * t / 1.3))
    return antiderivative(t1_s) - antiderivative(t0_s)


@pytest.mark.parametrize("reset", [False, True], ids=["no-reset", "reset"])
def test_interpolated_energy_matches_an_analytic_power_curve(reset: bool) -> None:
    worst_ours = worst_aiperf = 0.0
    for seed in range(12):
        rng = random.Random(seed)
        reset_s = rng.uniform(2, 18) if reset else math.inf
        records = []
        for t in scrape_times(rng):
            s = (t - START) / S
            # The counter counts from 1 MJ at boot, or from 0 at the reset (whole mJ, as DCGM's).
            joules = _analytic_energy(reset_s, s) if s >= reset_s else 1e6 + _analytic_energy(-100, s)
            records.append(rec(t, {"nvidia_energy_consumption": math.floor(joules * 1e3) * 1e-9,
                                   "nvidia_power_usage": _analytic_power(s)}))
        truth = _analytic_energy(0, 20)
        worst_ours = max(worst_ours, abs(_energy(records) / truth - 1))
        worst_aiperf = max(worst_aiperf, abs(_energy(records, "aiperf") / truth - 1))
    assert worst_ours < TOLERANCE
    assert worst_aiperf > worst_ours  # AIPerf's wider span (and, with a reset, the clamp) is worse


# --- a slow DCGM refresh (dcgm-exporter -c): values timed at their refresh, with a bound -----------------------

REFRESHES_S = (0, 0.1, 1, 10, 30)
WINDOWS_S = (20, 60, 300)


def _refreshed_run(refresh_s: float, window_s: int, seed: int, *, truth_of: str = "model", aligned: bool = False,
                   reset_at_s: float | None = None) -> tuple[list[GpuRecord], int, int, float]:
    """A run scraped at 3 Hz ± 20 ms from a warmup (two refreshes) to the first scrape after the final one that
    sees a newer refresh (what the sidecar's final_refresh_wait does), the window at a random phase of DCGM's
    refresh grid (`aligned`: at START, on a refresh instant, as this file's first harness has it). Values
    repeat between refresh instants floor(t / R)·R, as the exporter's do."""
    from bridge.simulator.config import SimulatorConfig
    from bridge.simulator.model import NodeModel

    refresh = round(refresh_s * S)
    rng = random.Random(f"{seed}:{refresh_s}:{window_s}")
    start = START if aligned else START + rng.randrange(0, 40 * S)
    end = start + window_s * S
    model = NodeModel(SimulatorConfig(gpus=1, seed=seed, refresh_ms=round(refresh_s * 1000),
                                      boot_ns=START - 86_400 * S))
    if reset_at_s is not None:  # a driver reload: the counter restarts from 0 (ground truth does not)
        model.reset_counters(start + round(reset_at_s * S))

    # The closed-form curves: the settling steps, or the sinusoids (`_analytic_power`, `_analytic_energy`).
    curve = {"steps": lambda: SettlingSteps(random.Random(f"steps:{seed}")), "analytic": Sinusoids}.get(truth_of)
    shape = None if curve is None else curve()

    scrapes, t, final = [], start - max(2 * refresh, 2 * S) - rng.randrange(0, S), None
    while True:
        scrapes.append(t)
        if final is None and t >= end:
            final = t
        elif final is not None and (model.sample_time_ns(t) > model.sample_time_ns(final) or t > final + 40 * S):
            break
        t += 333 * MS + rng.randrange(-20 * MS, 20 * MS)
    # (counter in MJ, power in W) as the exporter shows them at each scrape: the curves' for all scrapes at once,
    # bit for bit as one call each (tests/report/test_sensor_runs.py)
    if shape is None:
        counter = [model.counter_mj(0, t) * 1e-9 for t in scrapes]
        power = [round(model.power_watts(0, model.sample_time_ns(t)), 3) for t in scrapes]
        truth = model.energy_joules(0, start, end)
    else:
        s = np.array([model.sample_time_ns(t) - START for t in scrapes]) / S
        counter = (np.floor((1e6 + energies(shape, -100, s)[0]) * 1e3) * 1e-9).tolist()
        power = powers(shape, s).tolist()
        truth = shape.energy((start - START) / S, (end - START) / S)
    return recs(scrapes, counter, power), start, end, truth


def _with_bound(records: list[GpuRecord], start: int, end: int) -> tuple[float, float, dict[str, float]]:
    built = build_report(records, window=explicit_window(start, end, GRACE))
    assert built.energy.total_energy_j is not None and built.energy.bound_j is not None
    gpu = built.telemetry_data["endpoints"]["127.0.0.1:19401"]["gpus"]["gpu_0"]["metrics"]
    return built.energy.total_energy_j, built.energy.bound_j, gpu["nvidia_energy_consumption"]


@pytest.mark.parametrize("window_s", WINDOWS_S)
@pytest.mark.parametrize("refresh_s", REFRESHES_S)
def test_energy_over_the_first_harness_is_within_1_percent_from_two_refreshes_and_within_its_bound(
        refresh_s: float, window_s: int) -> None:
    """The issue's acceptance on this file's harness (8 seeds, the window from START, which lies on DCGM's
    refresh grid): within 0.5 % with fresh values, 1 % wherever the window spans two refresh periods, and the
    bound covering the error everywhere."""
    worst = 0.0
    for seed in range(8):
        records, start, end, truth = _refreshed_run(refresh_s, window_s, seed, aligned=True)
        energy, bound, _ = _with_bound(records, start, end)
        assert abs(energy - truth) <= bound, (seed, energy, truth, bound)
        worst = max(worst, abs(energy / truth - 1))
    if refresh_s <= 0.1:
        assert worst < TOLERANCE
    elif window_s >= 2 * refresh_s:
        assert worst < 0.01


@pytest.mark.parametrize("window_s", WINDOWS_S)
@pytest.mark.parametrize("refresh_s", REFRESHES_S)
def test_energy_on_a_slow_refresh_is_close_to_the_simulators_ground_truth_and_within_its_bound(
        refresh_s: float, window_s: int) -> None:
    """A window at a random phase of the refresh grid (as a benchmark's is): edges between refreshes."""
    worst = 0.0
    for seed in range(6):
        records, start, end, truth = _refreshed_run(refresh_s, window_s, seed)
        energy, bound, gpu = _with_bound(records, start, end)
        error = abs(energy - truth)
        assert error <= bound, (seed, error, bound)  # the bound covers the true error, always
        if window_s >= 2 * refresh_s:  # (else the energy is the power integral, kept within the counter's bound)
            assert gpu["bound"] * 1e6 == pytest.approx(bound)  # the GPU's bound (MJ) is the run's (J) for one GPU
        worst = max(worst, error / truth)
    periods = window_s / refresh_s if refresh_s else math.inf
    if refresh_s <= 0.1:
        assert worst < TOLERANCE  # fresh values (or a refresh faster than the scrapes): as before
    elif periods >= 10:
        assert worst < 0.01
    elif periods >= 2:
        # The simulator's 5-20 s load swings are more than a 10-30 s refresh can follow: each edge can be off by
        # up to ~amplitude x period / pi of energy, whatever the method (the oracle test below), ~1-2 % of a
        # window of a few refreshes, shrinking as the window grows.
        assert worst < 0.025


@pytest.mark.parametrize("refresh_s", REFRESHES_S)
def test_the_bound_covers_the_error_on_a_curve_faster_than_the_refresh(refresh_s: float) -> None:
    """1.3 s and 7 s swings: a slow refresh cannot follow them, and the bound must say so."""
    for window_s in WINDOWS_S:
        for seed in range(4):
            records, start, end, truth = _refreshed_run(refresh_s, window_s, seed, truth_of="analytic")
            energy, bound, _ = _with_bound(records, start, end)
            assert abs(energy - truth) <= bound, (window_s, seed, energy, truth, bound)


def test_a_slow_refresh_is_timed_at_its_refresh_not_at_the_scrape() -> None:
    """Against today's scrape-timed reading of the same records: 30 s refresh, 60 s window."""
    ours = theirs = 0.0
    for seed in range(6):
        records, start, end, truth = _refreshed_run(30, 60, seed)
        ours = max(ours, abs(_with_bound(records, start, end)[0] / truth - 1))
        scrape_timed = counter_delta_interpolated(
            np.array([r.timestamp_ns for r in records], dtype=np.int64),
            np.array([r.telemetry_data["nvidia_energy_consumption"] for r in records]), start, end, GRACE)
        assert scrape_timed is not None
        theirs = max(theirs, abs(scrape_timed.delta * 1e6 / truth - 1))
    assert theirs > 0.05 and ours < theirs / 2, (ours, theirs)


def test_at_two_30_s_refreshes_even_the_exact_refresh_instants_leave_between_1_and_2_5_percent() -> None:
    """Why the 60 s window on a 30 s refresh is held to 2.5 %, not 1 %: read at DCGM's true refresh instants
    (an oracle no recording can beat), the simulator's 5-20 s load swings still move the energy by over 1 %, and
    by no more than the 2.5 % the recorded path is held to (each edge off by ~amplitude x period / pi): both
    against the simulator's true energy, so a reader that drifts from the truth fails either way."""
    from bridge.report.refresh import refreshed_delta, series_cadence
    from bridge.report.series import SeriesAccumulator

    worst = 0.0
    for seed in range(16):
        records, start, end, truth = _refreshed_run(30, 60, seed)
        (series,) = SeriesAccumulator().add_all(records).finish()
        cadence = series_cadence(series.timestamps, series.values)
        exact = dataclasses.replace(cadence, period_ns=30e9, phase_ns=0.0)  # the simulator's grid: floor(t/R)·R
        delta = refreshed_delta(series.timestamps, series.values["nvidia_energy_consumption"], exact, start, end,
                                series.values["nvidia_power_usage"] * 1e-6)
        assert delta is not None
        worst = max(worst, abs(delta.delta * 1e6 / truth - 1))
    assert 0.01 < worst < 0.025, worst


@pytest.mark.parametrize("refresh_s", [1, 10, 30])
def test_a_reset_inside_a_slow_refresh_is_still_a_reset(refresh_s: int) -> None:
    """The counter restarts from 0 between two refreshes: one reset, and the energy still close and in its bound."""
    for seed in range(4):
        records, start, end, truth = _refreshed_run(refresh_s, 120, seed, reset_at_s=47.3)
        energy, bound, gpu = _with_bound(records, start, end)
        assert gpu["resets"] == 1
        assert abs(energy - truth) <= bound
        # As close as without a reset at this many refreshes a window (the tests above): the interval the reset
        # fell in is a trapezoid of the powers at its two refreshes.
        assert energy == pytest.approx(truth, rel={1: 0.01, 10: 0.02, 30: 0.03}[refresh_s])


# --- issue 27's criteria, kept as regression tests: the uncertainty and the verdict over >= 200 GPU windows -------
#
# Development (used while the uncertainty model was written): the harnesses above, DEVELOPMENT_SEEDS and the
# sinusoid curve (`_analytic_power`). SEEDS_TUNED_27 were issue 27's acceptance set, but the set was grown after a
# pooled figure failed and the method was tuned while they were measured (issue 42): development seeds now; issue
# 42's acceptance set is ACCEPTANCE_SEEDS_42 below.
# Twenty seeds (800 windows), not the first five alone: the pooled median ratio of five seeds' 200 windows scatters
# from 2.8 to 5.6 between seed sets for one and the same code (DECISIONS.md, "Tightness, a fifth look"), so five
# seeds cannot judge it. Seeds 9006-9020 were added in session 17 and first run with the code they now test.
DEVELOPMENT_SEEDS = range(0, 10)
# Issue 42 (open): a fresh exporter series carries its readings' ages, a hold DCGM's grid may hide among them
# (DECISIONS.md, "Error bars on real sensors"), also where the counter counts continuously, as these harnesses' does:
# coverage and the bound hold, the tightness criteria below do not (the figure each measured).
_LOOSER_ON_AN_IDEAL_COUNTER = "issue 42: the readings' ages on an ideal counter: "
SEEDS_TUNED_27 = range(9001, 9021)
ACCEPTANCE_REFRESHES_S = (0, 0.5, 2, 10, 30)
ACCEPTANCE_WINDOWS_S = (20, 60, 120, 300)


class Window27(NamedTuple):
    refresh_s: float
    window_s: int
    family: str
    error: float  # |energy − truth|, J
    uncertainty: float
    bound: float
    energy: float
    valid: bool  # the verdict's


def _runs27(seeds: Sequence[int], families: tuple[str, ...],
            refreshes: tuple[float, ...] = ACCEPTANCE_REFRESHES_S) -> list[tuple[str, float, int, int]]:
    """One GPU window per (family, refresh, window length, seed)."""
    return [(family, refresh_s, window_s, seed) for family in families for refresh_s in refreshes
            for window_s in ACCEPTANCE_WINDOWS_S for seed in seeds]


def _acceptance_windows(runs: list[tuple[str, float, int, int]]) -> list[Window27]:
    """The runs' windows judged on two processes (or ahead: `AHEAD`)."""
    return on_two_processes(_window27, runs)


def _window27(run: tuple[str, float, int, int]) -> Window27:
    family, refresh_s, window_s, seed = run
    records, start, end, truth = _refreshed_run(refresh_s, window_s, seed, truth_of=family)
    built = build_report(records, window=explicit_window(start, end, GRACE))
    energy = built.energy
    assert energy.total_energy_j is not None and energy.uncertainty_j is not None
    assert energy.bound_j is not None
    return Window27(refresh_s, window_s, family, abs(energy.total_energy_j - truth), energy.uncertainty_j,
                    energy.bound_j, energy.total_energy_j, built.telemetry_data["measurement"]["valid"])


def _assert_the_uncertainty_is_honest(windows: list[Window27]) -> list[Window27]:
    """The bound covers every window; where the verdict says valid, the uncertainty covers >= 95 %; with fresh values
    over >= 60 s it is at most 0.1 % of the energy. Returns the valid windows."""
    assert all(w.error <= w.bound for w in windows)
    valid = [w for w in windows if w.valid]
    # Only the windows shorter than two refreshes (20 s on a 10 s or 30 s refresh) are not valid.
    assert {(w.refresh_s, w.window_s) for w in windows if not w.valid} <= {(10, 20), (30, 20)}
    covered = np.mean([w.error <= w.uncertainty for w in valid])
    assert covered >= 0.95, sorted(valid, key=lambda w: w.uncertainty / max(w.error, 1e-12))[:5]
    for w in valid:
        if w.refresh_s == 0 and w.window_s >= 60:
            assert w.uncertainty <= 1e-3 * w.energy, w
    return valid


def _median_ratio(valid: list[Window27]) -> float:
    """The median uncertainty over the median true error (+ the counter's 1 mJ at each edge)."""
    return float(np.median([w.uncertainty for w in valid]) / (np.median([w.error for w in valid]) + 2e-3))


DEVELOPMENT_27 = _runs27(DEVELOPMENT_SEEDS[:3], ("model", "analytic"))
TUNED_27 = _runs27(SEEDS_TUNED_27, ("model", "steps"))


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=_LOOSER_ON_AN_IDEAL_COUNTER + "0.37 % at R=0 over 60 s (criterion 0.1 %)")
def test_the_uncertainty_covers_the_error_on_the_development_set() -> None:
    valid = _assert_the_uncertainty_is_honest(_acceptance_windows(DEVELOPMENT_27))
    assert _median_ratio(valid) <= 5  # (measured: 2.7)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=_LOOSER_ON_AN_IDEAL_COUNTER + "median ratio 7.85 (criterion 5)")
def test_on_issue_27s_tuned_seeds_the_uncertainty_covers_the_error() -> None:
    """Issue 27: >= 200 GPU windows over refresh periods 0-30 s and 20-300 s windows, on held-out seeds of the
    simulator's model and the held-out settling-steps family: where the verdict calls the window valid,
    `uncertainty` covers the true error in >= 95 %, `bound` in every window; with fresh values over >= 60 s windows
    the uncertainty is at most 0.1 % of the energy; the median uncertainty is at most 5x the median error (plus the
    counter's resolution). (Measured: 98.6 % covered, median ratio 3.5.)"""
    windows = _acceptance_windows(TUNED_27)
    assert len(windows) >= 800
    valid = _assert_the_uncertainty_is_honest(windows)
    assert _median_ratio(valid) <= 5


# Seeds first run at the end of session 14's tuning, then used in session 15 to measure candidate changes (DECISIONS.md,
# "Tightness, third pass"): seen, not held out.
SEEN_SEEDS = (*range(31001, 31006), *range(47001, 47006))
# First run in session 15 to measure a candidate, then measured again while issue 27's method was tuned: development
# seeds too (issue 42).
SEEDS_MEASURED_15 = range(90001, 90011)
SEEN_15 = _runs27(SEEN_SEEDS, ("model", "steps"))
MEASURED_15 = _runs27(SEEDS_MEASURED_15, ("model", "steps", "analytic"))
OTHER_REFRESHES = _runs27(range(95001, 95021), ("model", "steps", "analytic"), refreshes=(1, 3, 5))


@pytest.mark.slow
def test_on_seeds_seen_in_session_15_the_uncertainty_is_honest() -> None:
    """Coverage >= 95 % of valid windows and the bound in all, on 400 windows (measured: 98.7 %)."""
    windows = _acceptance_windows(SEEN_15)
    assert len(windows) >= 400
    _assert_the_uncertainty_is_honest(windows)


@functools.cache  # (two tests judge these windows)
def _unseen_windows() -> list[Window27]:
    windows = _acceptance_windows(MEASURED_15)
    assert len(windows) >= 600
    return windows


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=_LOOSER_ON_AN_IDEAL_COUNTER + "0.41 % at R=0 over 60 s (criterion 0.1 %)")
def test_on_session_15s_seeds_the_uncertainty_is_honest() -> None:
    """600 GPU windows over all three curve families (measured: 99.5 % covered)."""
    _assert_the_uncertainty_is_honest(_unseen_windows())


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=_LOOSER_ON_AN_IDEAL_COUNTER + "median ratio 8.14 (criterion 5)")
def test_on_session_15s_seeds_the_median_uncertainty_is_at_most_5x_the_median_error() -> None:
    """(Measured: 4.0; 6.1 before the energy's clock was corrected for the power's curvature, DECISIONS.md, "Tightness,
    a fifth look".)"""
    windows = _unseen_windows()
    assert _median_ratio([w for w in windows if w.valid]) <= 5


@pytest.mark.slow
def test_on_refresh_periods_no_set_above_was_built_on_every_family_is_covered() -> None:
    """1, 3 and 5 s refreshes (the sets above have 0, 0.5, 2, 10 and 30 s), 80 windows for each refresh and curve
    family: the uncertainty covers at least 90 % of each group (within sampling noise of 95 % for 80 windows), the
    bound every window. A change that is honest on the sets above can still fail here: a Simpson energy clock
    (DECISIONS.md, "Tightness, third pass") covered 89 % of the simulator's 1 s windows. (Measured: 97-100 %.)"""
    windows = _acceptance_windows(OTHER_REFRESHES)
    assert all(w.error <= w.bound for w in windows)
    for refresh_s in (1, 3, 5):
        for family in ("model", "steps", "analytic"):
            group = [w for w in windows if w.valid and w.refresh_s == refresh_s and w.family == family]
            assert len(group) >= 72
            covered = np.mean([w.error <= w.uncertainty for w in group])
            assert covered >= 0.9, (refresh_s, family, covered)


def test_on_a_10_s_refresh_a_power_the_refreshes_miss_is_stated_and_one_they_follow_is_not() -> None:
    """The simulator's load moves over minutes with a small 5-20 s ripple; the analytic curve swings every 1.3 s
    and 7 s, which a 10 s refresh cannot follow. Both uncertainties cover their errors; the followed power's is
    well below the missed one's (the gauge disagrees with the counter's rates around it only for the second)."""
    stated: dict[str, list[float]] = {"model": [], "analytic": []}
    for family, values in stated.items():
        for seed in range(4):
            records, start, end, truth = _refreshed_run(10, 120, seed, truth_of=family)
            energy = build_report(records, window=explicit_window(start, end, GRACE)).energy
            assert energy.total_energy_j is not None and energy.uncertainty_j is not None
            assert abs(energy.total_energy_j - truth) <= energy.uncertainty_j, (family, seed)
            values.append(energy.uncertainty_j)
    assert np.median(stated["model"]) < np.median(stated["analytic"]) / 2


def test_the_missed_power_is_nothing_for_power_the_refreshes_follow_and_the_swing_for_one_they_miss() -> None:
    """The shape term's missed-power part on a 10 s refresh grid (`uncertainty._unresolved_power`): quadratic power
    (followed: the counter's rates and the gauge agree once the curvature's share is taken out) leaves nothing; a
    1.3 s swing of 40 W the refreshes alias shows at about its size."""
    from bridge.report.uncertainty import _unresolved_power

    tau = np.arange(12, dtype=np.float64) * 10e9  # ns
    t = tau / 1e9

    def followed(s: np.ndarray) -> np.ndarray:
        return 250.0 + 3.0 * s - 0.04 * s**2

    cum = (250.0 * t + 1.5 * t**2 - 0.04 / 3 * t**3) * 1e-6  # MJ
    assert _unresolved_power(tau, cum, followed(t) * 1e-15, 5) == pytest.approx(0.0, abs=1e-9 * 250e-15)

    omega = 2 * math.pi / 1.3
    swing_cum = cum + (-40.0 / omega * (np.cos(omega * t) - 1)) * 1e-6
    swing_rate = (followed(t) + 40.0 * np.sin(omega * t)) * 1e-15
    found = _unresolved_power(tau, swing_cum, swing_rate, 5)
    assert found is not None and 0.5 * 40e-15 <= found <= 2 * 40e-15


# --- issue 42's acceptance: real sensors, by group, on seeds fixed before the first run ---------------------------
#
# tests/report/sensor_runs.py serves each run as an H200's sensors and dcgm-exporter would (a 1 s average or an instant
# gauge; a counter held for 100 ms on a fixed or drifting grid, or a continuous one; values up to one refresh old).
# A group is one refresh period × load shape × sensor variant: 40 windows each (5 lengths × 8 seeds), 280 groups.
# ACCEPTANCE_SEEDS_42 were written here in session 18 before this test first ran; whatever they give is reported in
# the session's note, and they are never replaced. Development used seeds 0-7 (bench/accuracy_groups.py).

ACCEPTANCE_SEEDS_42 = range(42_001, 42_009)
ACCEPTANCE_42 = grid_specs(ACCEPTANCE_SEEDS_42)  # (judged ahead where these tests are selected: tests/conftest.py)


@functools.cache
def _acceptance_42() -> dict[GroupKey, list[Judged]]:
    groups = judge_groups(ACCEPTANCE_42)
    assert len(groups) == len(SHAPES) * len(REFRESHES) * len(SENSORS) == 280
    assert all(len(g) == 40 for g in groups.values())
    return groups


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "issue 42 (open), measured in session 19: 72 of 280 groups under 95 % (worst: a square wave at a 1 s refresh "
    "with the averaged gauge, 57.5 %; held counters at R <= 2 s 75-92.5 %); pooled 96.0 % of 10,161 valid windows. "
    "Session 20 (a step's term, the vectorised fit): still 72 groups, the same worst (57.5 %). Session 22 (the hold "
    "grid's drifting period searched on lengthening stretches, its walk stated): 62 groups, the same worst. Session 23 "
    "(the counter clock's walk beneath DCGM's refreshes stated, wraps found at the quadratic's own step response, a "
    "burst's share as the Hermite reader splits it, the averaged gauge's lag in the energy's clock): 27 groups, the "
    "worst a square wave at a 1 s refresh with the averaged gauge and a continuous counter, 62.5 %"))
def test_acceptance_42_in_every_group_the_uncertainty_covers_95_percent_of_the_valid_windows() -> None:
    failing = {}
    for key, group in _acceptance_42().items():
        valid = [j for j in group if j.valid]
        covered = np.mean([j.error <= j.uncertainty for j in valid]) if valid else 1.0
        if covered < 0.95:
            failing[key] = round(float(covered), 3)
    assert not failing, failing


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "issue 42 (open), measured in session 19: 115 of 280 groups looser (steady power at a 100 ms refresh 13-133x: "
    "the hold DCGM's grid may hide; spikes, bursts and sinusoids read fresh up to 527x); session 20: 117; session 22: "
    "117; session 23: 148 (the walk stated where nothing shows it: steady, idle and capped power at 0.5-2 s "
    "refreshes up to 23x on a continuous counter or a grid locked to DCGM's)"))
def test_acceptance_42_in_every_group_the_uncertainty_is_at_most_5x_the_error_or_8x_on_slow_refreshes() -> None:
    failing = {}
    for key, group in _acceptance_42().items():
        ratio = loose(group)
        if ratio is not None and ratio > (5 if key[1] <= 2 else 8):
            failing[key] = round(ratio, 2)
    assert not failing, failing


@pytest.mark.slow
def test_acceptance_42_the_bound_covers_every_window() -> None:
    outside = [j for group in _acceptance_42().values() for j in group if j.error > j.bound]
    assert not outside, outside[:5]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "issue 42 (open), measured in session 19: 5 groups, all square waves at 10-30 s refreshes, 75-87.5 % valid "
    "(counter_power_disagree)"))
def test_acceptance_42_not_by_refusing_90_percent_of_windows_with_5_refreshes_are_valid() -> None:
    """In every group but the spike at an edge (a shape chosen by its definition, not by the product's detection);
    fresh values count as a refresh a scrape."""
    failing = {}
    for key, group in _acceptance_42().items():
        enough = [j for j in group if j.refreshes is None or j.refreshes >= 5]
        if key[0] != "spike" and enough and np.mean([j.valid for j in enough]) < 0.9:
            failing[key] = sorted({r for j in enough for r in j.reasons})
    assert not failing, failing


@pytest.mark.slow
def test_acceptance_42_steady_power_is_valid_in_every_window_with_2_refreshes() -> None:
    refused = [(j.spec, j.reasons) for key, group in _acceptance_42().items() if key[0] in STEADY_SHAPES
               for j in group if (j.refreshes is None or j.refreshes >= 2) and not j.valid]
    assert not refused, refused[:5]


@pytest.mark.parametrize("y", [0.2, 0.5, 0.8])
def test_a_step_inside_a_refresh_interval_is_its_size_times_the_interval_and_a_ramp_is_nothing(y: float) -> None:
    """`uncertainty._step` on a 2 s refresh grid: power from 200 W to 500 W at fraction y of interval 3 leaves 300 W ×
    2 s (a reading at fraction x of that interval is off by up to that × x(1−x), closed form); a ramp leaves 0."""
    from bridge.report.uncertainty import _step

    tau = np.arange(8, dtype=np.float64) * 2e9  # ns
    at = (3 + y) * 2.0  # s
    t = tau / 1e9
    cum = np.where(t < at, 200.0 * t, 200.0 * at + 500.0 * (t - at)) * 1e-15  # J, in counter units of 1e15 J
    assert _step(tau, cum, 3) == pytest.approx(300.0 * 2.0 * 1e-15, rel=1e-9)
    ramp = (200.0 * t + 10.0 * t * t) * 1e-15
    assert _step(tau, ramp, 3) == pytest.approx(0.0, abs=1e-9 * 200.0 * 2.0 * 1e-15)


# The grids judged ahead where their tests are selected (tests/ahead.py): by test name.
AHEAD = {
    "test_the_uncertainty_covers_the_error_on_the_development_set": [(_window27, DEVELOPMENT_27)],
    "test_on_issue_27s_tuned_seeds_the_uncertainty_covers_the_error": [(_window27, TUNED_27)],
    "test_on_seeds_seen_in_session_15_the_uncertainty_is_honest": [(_window27, SEEN_15)],
    "test_on_session_15s_seeds_the_uncertainty_is_honest": [(_window27, MEASURED_15)],
    "test_on_session_15s_seeds_the_median_uncertainty_is_at_most_5x_the_median_error": [(_window27, MEASURED_15)],
    "test_on_refresh_periods_no_set_above_was_built_on_every_family_is_covered": [(_window27, OTHER_REFRESHES)],
    **{name: [(judge, ACCEPTANCE_42)] for name in globals() if name.startswith("test_acceptance_42_")},
}


def test_every_grid_judged_ahead_is_named_after_a_test_here() -> None:
    assert all(callable(globals().get(name)) for name in AHEAD), set(AHEAD) - set(globals())
    assert sum(name.startswith("test_acceptance_42_") for name in AHEAD) == 5
