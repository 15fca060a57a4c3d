"""The refresh cadence read from a recording (bridge/report/refresh.py), on hand-built series."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.report.refresh import cadence_of, field_periods, series_cadence

S, MS = 1_000_000_000, 1_000_000


def _series(refresh_s: float, seconds: float = 120.0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Scrapes every 333 ms of an exporter refreshing every `refresh_s` (phase 0.123 s): energy at every
    refresh, a profiling ratio DCGM refreshes every fourth one, a temperature that moves in whole degrees."""
    ts = np.arange(0, round(seconds * S), 333 * MS, dtype=np.int64) + 10 * S
    refresh = np.floor((ts - 123 * MS) / (refresh_s * S))
    energy = 1000.0 + refresh * 0.4
    slow = np.floor(refresh / 4) * 0.01
    temperature = 40.0 + np.floor(np.sin(refresh / 3.0) * 1.5)
    return ts, {"nvidia_energy_consumption": energy, "nvidia_power_usage": 300.0 + refresh % 7,
                "nvidia_sm_active": slow, "nvidia_temperature": temperature}


def test_the_period_and_the_phase_come_from_the_brackets_of_new_values():
    ts, values = _series(10.0)
    cadence = series_cadence(ts, values)
    assert not cadence.fresh
    assert cadence.period_s == pytest.approx(10.0, rel=0.01)
    assert cadence.phase_ns is not None
    off = (cadence.phase_ns - 123 * MS) % (10 * S)  # from DCGM's true grid, either way round
    assert min(off, 10 * S - off) < 0.17 * S  # within half a scrape interval


def test_values_new_at_every_scrape_are_fresh_and_none_new_gives_a_lower_bound():
    ts = np.arange(0, 30 * S, 333 * MS, dtype=np.int64)
    assert cadence_of(ts, np.arange(ts.size, dtype=np.float64)[None, :]).fresh
    flat = cadence_of(ts, np.full((1, ts.size), 5.0))
    assert not flat.fresh and flat.at_least and flat.period_s == pytest.approx(ts[-1] / S - ts[0] / S)
    # Without an energy counter a quiet field proves nothing: no period, taken as fresh.
    assert cadence_of(ts, np.full((1, ts.size), 5.0), counting=False).fresh


def test_a_field_on_a_slower_grid_of_its_own_is_listed_and_a_seldom_changing_one_is_not():
    ts, values = _series(2.0)
    cadence = series_cadence(ts, values)
    fields = field_periods(ts, values, cadence)
    assert fields.keys() == {"nvidia_sm_active"}
    assert fields["nvidia_sm_active"] == pytest.approx(8.0, rel=0.1)


def test_a_refresh_a_little_slower_than_the_scrapes_takes_its_period_from_the_energys_clock():
    """500 ms refreshes seen by 333 ms scrapes: new values come one or two scrape intervals apart, never one period
    apart, so the brackets alone start the grid fit from the wrong period; the energy drawn over the power says
    0.5 s, and the grid follows."""
    ts = np.arange(0, 60 * S, 333 * MS, dtype=np.int64) + 10 * S
    refresh = np.floor((ts - 123 * MS) / (500 * MS))
    power = 300.0 + 20.0 * np.sin(refresh / 5.0)
    energy = 1000.0 + np.cumsum(np.concatenate(([0.0], np.diff(refresh)))) * 0.5 * power * 1e-6  # MJ
    cadence = series_cadence(ts, {"nvidia_energy_consumption": energy, "nvidia_power_usage": power})
    assert not cadence.fresh and cadence.phase_ns is not None
    assert cadence.period_s == pytest.approx(0.5, rel=0.01)
    off = (cadence.phase_ns - 123 * MS) % (500 * MS)
    assert min(off, 500 * MS - off) < 50 * MS


def test_the_energys_clock_takes_out_the_trapezoids_error_for_power_that_curves():
    """A 2 s refresh under power that curves (quadratic in time): each duration the energy measures with a
    trapezoid is off by −P''·h³/(12·P̄), the same sign every time, so their mean is off by ~0.4 ms; corrected for
    the gauge's curvature it is exact."""
    from bridge.report.refresh import _durations, _measured_period

    t = np.arange(41) * 2.0  # s
    power = 300.0 + 5.0 * t - 0.08 * t**2  # W
    energy = (300.0 * t + 2.5 * t**2 - 0.08 / 3 * t**3) * 1e-6  # MJ, the exact integral
    durations = _durations(energy, power)
    steps = np.ones(durations.size)
    measured = _measured_period(durations, power, steps)
    assert measured is not None
    assert abs(float(np.mean(durations)) - 2 * S) > 0.1 * MS  # the trapezoid's own clock
    assert measured[0] == pytest.approx(2 * S, abs=1e3)  # within 1 µs
    assert _measured_period(durations[:3], power[:4], steps[:3]) is None  # too few to say


def test_the_clocks_standard_error_allows_for_errors_that_cancel_and_keeps_those_that_do_not():
    """Newey-West: durations whose errors alternate (a swing the refreshes sample at its alias) cancel in the mean,
    and the plain scatter/√n overstates the mean's error (here twice over); independent errors keep scatter/√n."""
    from bridge.report.refresh import _newey_west_error

    n = 60
    alternating = 2e9 + 5e6 * (-1.0) ** np.arange(n)
    plain = float(np.std(alternating) / np.sqrt(n))
    assert _newey_west_error(alternating) < plain / 2
    assert abs(float(np.mean(alternating)) - 2e9) <= _newey_west_error(alternating) + 1.0
    independent = 2e9 + np.random.default_rng(7).normal(0, 5e6, 4000)
    assert _newey_west_error(independent) == pytest.approx(float(np.std(independent) / np.sqrt(4000)), rel=0.15)


def test_the_energys_clock_passes_over_a_refresh_without_power_quietly():
    """A zero or missing power reading leaves its intervals out of the clock, without a numpy warning."""
    import warnings

    from bridge.report.refresh import _durations, _measured_period

    t = np.arange(21) * 2.0
    power = 300.0 + 5.0 * t
    energy = (300.0 * t + 2.5 * t**2) * 1e-6
    power[5], power[9] = 0.0, np.nan
    durations = _durations(energy, power)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        measured = _measured_period(durations, power, np.ones(durations.size))
    assert measured is not None and measured[0] == pytest.approx(2 * S, abs=1e3)


@pytest.mark.parametrize("spec", [("square", 0.1, 20, "instant", "continuous", 1),  # the instants: the scrapes
                                  ("steps", 0.1, 60, "average", "held", 0),  # ages known from the exporter's grid
                                  ("steps", 0, 60, "average", "held", 1)],  # a local reader's
                         ids=["scrape-times", "exporter-ages", "local-ages"])
def test_reports_built_again_over_the_same_records_give_what_a_first_build_gives(spec: tuple) -> None:
    """The readings' ages are kept by the series' bits across reports (`refresh._fresh_ages`): every window's figures
    over one run equal, to the bit, those of a report whose ages were fitted afresh."""
    from bridge.report import build_report, refresh
    from bridge.report.window import explicit_window
    from tests.report.sensor_runs import GRACE, RunSpec, make_run

    run = make_run(RunSpec(*spec))
    third = (run.end - run.start) // 3
    windows = [(run.start, run.end), (run.start, run.start + third), (run.start + third, run.end)]

    def figures(start: int, end: int, afresh: bool) -> tuple[float | None, ...]:
        if afresh:
            refresh._AGES_BY_VALUE.clear()
        energy = build_report(run.records, window=explicit_window(start, end, GRACE)).energy
        return energy.total_energy_j, energy.uncertainty_j, energy.bound_j

    kept = [figures(a, b, afresh=False) for a, b in windows]
    assert kept == [figures(a, b, afresh=True) for a, b in windows]
