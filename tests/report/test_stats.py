"""Gauge stats, both counter rules, codes and power integrals, on hand-made series."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.report.energy import power_integral
from bridge.report.refresh import FRESH
from bridge.report.stats import (
    code_stats,
    counter_delta_aiperf,
    counter_delta_interpolated,
    gauge_stats,
)

S = 1_000_000_000
NAN = float("nan")


def arrays(times_s: list[float], values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([round(t * S) for t in times_s], dtype=np.int64), np.array(values, dtype=np.float64)


# -- gauges -----------------------------------------------------------------------------------------
def test_gauge_stats_have_aiperfs_keys_in_aiperfs_order() -> None:
    ts, v = arrays([0, 1, 2], [1.0, 2.0, 3.0])
    out = gauge_stats(ts, v, 0, 2 * S, "W")
    assert out is not None
    assert list(out) == ["unit", "avg", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99",
                         "min", "max", "std", "count", "sum"]


def test_gauge_percentiles_are_numpys_linear_ones_and_std_uses_ddof_1() -> None:
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    ts, v = arrays(list(range(6)), values)
    out = gauge_stats(ts, v, 0, 5 * S, "W")
    assert out is not None
    for p in (1, 5, 10, 25, 50, 75, 90, 95, 99):
        assert out[f"p{p}"] == pytest.approx(float(np.percentile(values, p)), rel=1e-15)
    assert out["std"] == pytest.approx(float(np.std(values, ddof=1)), rel=1e-15)
    assert (out["min"], out["max"], out["count"]) == (1.0, 9.0, 6)
    assert out["sum"] == pytest.approx(sum(values))


def test_a_single_sample_has_a_std_of_zero() -> None:
    ts, v = arrays([1], [42.0])
    out = gauge_stats(ts, v, 0, 2 * S, "W")
    assert out is not None and out["std"] == 0.0 and out["count"] == 1


def test_window_edges_are_inclusive_at_both_ends() -> None:
    ts, v = arrays([0.999999999, 1, 2, 3, 3.000000001], [100.0, 1.0, 2.0, 3.0, 100.0])
    out = gauge_stats(ts, v, 1 * S, 3 * S, "W")
    assert out is not None and (out["count"], out["max"], out["min"]) == (3, 3.0, 1.0)


def test_a_gauge_with_no_valid_sample_in_the_window_is_omitted() -> None:
    ts, v = arrays([0, 1, 5], [1.0, NAN, 2.0])
    assert gauge_stats(ts, v, S, 2 * S, "W") is None


def test_aiperf_counts_nan_slots_but_interpolated_mode_counts_valid_samples() -> None:
    ts, v = arrays([0, 1, 2], [1.0, NAN, 3.0])
    aiperf = gauge_stats(ts, v, 0, 2 * S, "W", count_nan_slots=True)
    ours = gauge_stats(ts, v, 0, 2 * S, "W")
    assert aiperf is not None and ours is not None
    assert (aiperf["count"], ours["count"]) == (3, 2)
    assert aiperf["avg"] == ours["avg"] == 2.0


# -- codes ------------------------------------------------------------------------------------------
def test_an_xid_code_reports_the_last_and_largest_code_never_a_delta() -> None:
    ts, v = arrays([0, 1, 2, 3], [0.0, 79.0, 13.0, 13.0])
    assert code_stats(ts, v, 0, 3 * S, "code") == {"unit": "code", "last": 13, "max": 79}


# -- AIPerf's counter rule ----------------------------------------------------------------------------
def test_aiperf_counter_is_last_in_window_minus_last_before_it() -> None:
    ts, v = arrays([-1, 0.5, 1, 2, 3], [10.0, 12.0, 13.0, 15.0, 99.0])
    delta = counter_delta_aiperf(ts, v, S, 2 * S)
    assert delta is not None and delta.delta == 3.0  # 15 (t=2) − 12 (t=0.5, the last before t=1)


def test_aiperf_counter_falls_back_to_the_first_in_window_sample_without_a_reference() -> None:
    ts, v = arrays([1, 2, 3], [13.0, 15.0, 18.0])
    delta = counter_delta_aiperf(ts, v, S, 3 * S)
    assert delta is not None and delta.delta == 5.0


def test_aiperf_counter_walks_back_past_nan_slots_for_its_reference() -> None:
    ts, v = arrays([0, 0.5, 1, 2], [10.0, NAN, 13.0, 15.0])
    delta = counter_delta_aiperf(ts, v, S, 2 * S)
    assert delta is not None and delta.delta == 5.0


def test_aiperf_counter_clamps_a_reset_to_zero_as_aiperf_does() -> None:
    ts, v = arrays([0, 1, 2, 3], [90.0, 100.0, 5.0, 8.0])
    delta = counter_delta_aiperf(ts, v, 0, 3 * S)
    assert delta is not None and delta.delta == 0.0


def test_aiperf_counter_with_a_single_sample_and_no_reference_is_zero() -> None:
    ts, v = arrays([1], [13.0])
    delta = counter_delta_aiperf(ts, v, S, 2 * S)
    assert delta is not None and delta.delta == 0.0


def test_aiperf_counter_with_nothing_in_the_window_is_omitted() -> None:
    ts, v = arrays([0, 5], [1.0, 2.0])
    assert counter_delta_aiperf(ts, v, S, 2 * S) is None


# -- interpolated counters ----------------------------------------------------------------------------
def test_interpolated_counter_reads_the_value_at_both_edges() -> None:
    # 10 units/s; samples at -0.2, 0.3, ..., bracketing [0, 2] on both sides.
    times = [-0.2, 0.3, 0.8, 1.3, 1.8, 2.3]
    ts, v = arrays(times, [1000 + 10 * t for t in times])
    delta = counter_delta_interpolated(ts, v, 0, 2 * S, 666_000_000)
    assert delta is not None and delta.delta == pytest.approx(20.0, rel=1e-12) and delta.resets == 0


def test_the_grace_lets_a_final_scrape_after_the_end_bracket_it() -> None:
    times = [-0.2, 0.3, 0.8, 1.3, 1.8, 2.5]
    ts, v = arrays(times, [10 * t for t in times])
    with_grace = counter_delta_interpolated(ts, v, 0, 2 * S, 666_000_000)
    assert with_grace is not None and with_grace.delta == pytest.approx(20.0, rel=1e-12)
    # Without grace the 2.5 s scrape is not used: the end is extrapolated from the last interval.
    no_grace = counter_delta_interpolated(ts, v, 0, 2 * S, 0)
    assert no_grace is not None and no_grace.delta == pytest.approx(20.0, rel=1e-12)


def test_a_reset_inside_the_window_is_counted_and_the_increases_are_summed() -> None:
    # 10 units/s, reset to 0 at t=1.05 s; samples every 0.1 s from -0.05 to 2.05.
    times = [-0.05 + 0.1 * i for i in range(22)]
    values = [500 + 10 * t if t < 1.05 else 10 * (t - 1.05) for t in times]
    ts, v = arrays(times, values)
    delta = counter_delta_interpolated(ts, v, 0, 2 * S, 666_000_000)
    assert delta is not None and delta.resets == 1
    assert delta.delta == pytest.approx(20.0, rel=1e-9)  # the pre-reset part of the interval is estimated


def test_aiperf_mode_loses_everything_on_the_same_reset() -> None:
    times = [-0.05 + 0.1 * i for i in range(22)]
    values = [500 + 10 * t if t < 1.05 else 10 * (t - 1.05) for t in times]
    ts, v = arrays(times, values)
    delta = counter_delta_aiperf(ts, v, 0, 2 * S + 666_000_000)
    assert delta is not None and delta.delta == 0.0


def test_a_small_dip_from_out_of_order_scrapes_is_not_a_reset() -> None:
    times = [0.0, 0.5, 1.0, 1.5, 2.0]
    ts, v = arrays(times, [1000.0, 1005.0, 1004.9, 1015.0, 1020.0])
    delta = counter_delta_interpolated(ts, v, 0, 2 * S, 0)
    assert delta is not None and delta.resets == 0 and delta.delta == pytest.approx(20.0)


def test_an_interpolated_counter_with_nothing_near_the_window_is_omitted() -> None:
    ts, v = arrays([0, 10], [1.0, 2.0])
    assert counter_delta_interpolated(ts, v, 2 * S, 3 * S, 666_000_000) is None


def test_an_edge_without_a_bracket_is_extrapolated_by_at_most_half_an_interval_past_a_gap() -> None:
    # Samples only inside [0.9, 1.1] of a [0, 2] window, 0.1 s apart: each edge is 0.9 s away, far more
    # than 1.1 intervals, so each side is extrapolated by half an interval (PromQL's rule).
    times = [0.9, 1.0, 1.1]
    ts, v = arrays(times, [10 * t for t in times])
    delta = counter_delta_interpolated(ts, v, 0, 2 * S, 0)
    assert delta is not None and delta.delta == pytest.approx(3.0)


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(1.0, 1000.0),
    phase=st.floats(0.0, 0.333),
    jitter=st.lists(st.floats(-0.02, 0.02), min_size=80, max_size=80),
)
def test_a_constant_rate_counter_is_exact_whatever_the_scrape_phase(rate: float, phase: float,
                                                                    jitter: list[float]) -> None:
    times = sorted(-0.4 + phase + 0.333 * i + j for i, j in enumerate(jitter))
    ts, v = arrays(times, [1e6 + rate * t for t in times])
    delta = counter_delta_interpolated(ts, v, 0, 20 * S, 666_000_000)
    assert delta is not None and delta.delta == pytest.approx(20 * rate, rel=1e-6)


# -- integrals ----------------------------------------------------------------------------------------
def test_power_integrates_to_joules_over_exactly_the_window() -> None:
    times = [-0.5 + 0.25 * i for i in range(20)]
    ts, v = arrays(times, [100.0 + 50.0 * t for t in times])  # linear: trapezoids are exact
    integral = power_integral(ts, v, FRESH, 0, 4 * S)
    assert integral is not None and math.isclose(integral.joules, 100 * 4 + 25 * 16, rel_tol=1e-9)


def _integral_of_averaged(power: Callable[[float], float], energy: Callable[[float], float]) -> tuple[float, float]:
    """(∫ over [0, 4 s], its uncertainty) from a one-second trailing average gauge (the H200's, the sensor model
    bridge/simulator/sensors.py) read every 0.25 s, of a curve with power `power(t)` and energy `energy(t)`."""
    from bridge.simulator.sensors import Sensors

    gauge = Sensors(gauge_update_s=0.0, average_s=1.0)
    times = [-0.5 + 0.25 * i for i in range(20)]
    ts, _ = arrays(times, times)
    v = np.array([gauge.gauge_w(lambda t_ns: energy(t_ns / S), lambda t_ns: power(t_ns / S), int(t)) for t in ts])
    integral = power_integral(ts, v, FRESH, 0, 4 * S)
    assert integral is not None
    return integral.joules, integral.uncertainty_j


def test_the_power_integrals_uncertainty_covers_a_lagging_gauge_on_a_ramp_and_is_not_vacuous() -> None:
    """100 + 50t W for 4 s is 800 J; a one-second average gauge reads it 25 W low throughout (100 J short): the
    uncertainty covers those 100 J and is no more than three times them."""
    joules, uncertainty = _integral_of_averaged(lambda t: 100 + 50 * t, lambda t: 100 * t + 25 * t * t)
    assert joules == pytest.approx(800 - 100, abs=0.01)
    assert 100 <= uncertainty <= 300, uncertainty


@pytest.mark.parametrize("period_s", [3, 5, 7, 20])
def test_the_power_integrals_uncertainty_covers_its_true_error_on_a_swinging_load(period_s: float) -> None:
    """300 W ± 100 W swinging with `period_s`, through the one-second average gauge: the error against the
    closed-form energy lies within the uncertainty."""
    w = 2 * math.pi / period_s

    def energy(t: float) -> float:
        return 300 * t + 100 / w * (1 - math.cos(w * t))

    joules, uncertainty = _integral_of_averaged(lambda t: 300 + 100 * math.sin(w * t), energy)
    assert abs(joules - (energy(4) - energy(0))) <= uncertainty, (joules, energy(4), uncertainty)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=80))
def test_the_vectorised_percentiles_are_numpys_to_the_bit(values):
    import numpy as np

    from bridge.report.stats import PERCENTILES, _linear_percentiles

    array = np.asarray(values, dtype=np.float64)
    assert np.array_equal(_linear_percentiles(np.sort(array)), np.percentile(array, PERCENTILES))


# -- several columns at once (the report's path) ------------------------------------------------------
def _reference_cumulative_increase(v: np.ndarray) -> tuple[list[float], list[int]]:
    """The counter rule sample by sample, as stats.py had it before the reset search was vectorised."""
    increments = [0.0] * (v.size - 1)
    resets: list[int] = []
    high = float(v[0])
    for i in range(1, v.size):
        value = float(v[i])
        if value >= high:
            increments[i - 1] = value - high
            high = value
        elif value < high * 0.5:
            increments[i - 1] = max(value, 0.0)
            resets.append(i - 1)
            high = value
    return increments, resets


def _walk(rng: np.random.Generator, n: int, kinds: str = "rrrrfdz") -> np.ndarray:
    """A counter that mostly rises, with dips (stale scrapes), resets and flat stretches."""
    kinds = rng.choice(np.array(list(kinds)), n)
    values, value = [], float(rng.uniform(0.0, 1e6))
    for kind in kinds:
        if kind == "r":
            value += float(rng.uniform(0.0, 1e3))
        elif kind == "d":
            value *= float(rng.uniform(0.5, 1.0))
        elif kind == "z":
            value = float(rng.uniform(0.0, 10.0))
        values.append(value)
    return np.asarray(values, dtype=np.float64)


@st.composite
def counters(draw: st.DrawFn) -> np.ndarray:
    return _walk(np.random.default_rng(draw(st.integers(0, 2**32))), draw(st.integers(2, 300)))


@settings(max_examples=300, deadline=None)
@given(counters())
def test_the_reset_search_finds_what_the_sample_by_sample_rule_finds(values: np.ndarray) -> None:
    from bridge.report.stats import cumulative_increase

    increments, resets = _reference_cumulative_increase(values)
    times = np.arange(values.size, dtype=np.int64) * S
    cum, count = cumulative_increase(times, values)
    assert count == len(resets)
    if not resets:  # (with resets, the reset intervals are re-estimated from the neighbouring rates)
        assert np.array_equal(cum, np.concatenate(([0.0], np.cumsum(increments))))


def test_the_reset_search_spans_long_series_and_many_resets() -> None:
    from bridge.report.stats import cumulative_increase

    rng = np.random.default_rng(7)
    for shape in ("rising", "dips", "sawtooth", "oscillating"):
        steps = rng.uniform(0, 5, 20_000)
        values = np.cumsum(steps) + 1e3
        if shape == "dips":
            values[rng.integers(1, values.size, 500)] *= 0.9
        elif shape == "sawtooth":
            values = np.mod(values, 997.0)
        elif shape == "oscillating":
            values[::2] = 0.0
        increments, resets = _reference_cumulative_increase(values)
        _, count = cumulative_increase(np.arange(values.size, dtype=np.int64) * S, values)
        assert count == len(resets), shape


def _as_row_block(columns: list[np.ndarray]) -> np.ndarray:
    """The columns as the report hands them over: rows of one matrix (Series.matrix), gathered from strided
    columns of a block of records × keys, as the reader and the sidecar's spool hold them."""
    from bridge.report.series import GpuMeta, Series

    block = np.stack(columns, axis=1)
    keys = [f"k{i}" for i in range(len(columns))]
    meta = GpuMeta(0, "GPU-0", None, None, None, None, None, None, "nvidia", None, None)
    series = Series("e", "u", meta, np.arange(block.shape[0]), {key: block[:, i] for i, key in enumerate(keys)})
    return series.matrix(keys)


@st.composite
def series_columns(draw: st.DrawFn) -> tuple[np.ndarray, list[np.ndarray], int, int]:
    """Up to six columns of one series (rising, dipping, resetting; some with a NaN or three) and a window
    that mostly overlaps the samples."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    n = draw(st.integers(1, 120))
    ts = np.cumsum(rng.integers(0, 2 * S, n) * (rng.random(n) > 0.05))  # (equal times too)
    columns = []
    for _ in range(draw(st.integers(1, 6))):
        column = _walk(rng, n, draw(st.sampled_from(["rrrrfdz", "rrrf", "rrrd", "rrrrrrrrrrrrd"])))
        column[rng.integers(0, n, draw(st.sampled_from([0, 0, 0, 1, 3])))] = NAN
        columns.append(column)
    span = int(ts[-1])
    start = round(span * draw(st.floats(-0.2, 1.1)))
    end = start + round(span * draw(st.floats(0.0, 1.2)))
    return ts, columns, start, end


@settings(max_examples=400, deadline=None)
@given(series_columns(), st.booleans())
@pytest.mark.slow
def test_gauge_stats_of_several_columns_are_gauge_stats_column_by_column(case, nan_slots: bool) -> None:
    from bridge.report.stats import gauge_stats_columns

    ts, columns, start, end = case
    units = [f"u{i}" for i in range(len(columns))]
    alone = [gauge_stats(ts, column, start, end, unit, count_nan_slots=nan_slots)
             for column, unit in zip(columns, units, strict=True)]
    for together in (columns, _as_row_block(columns)):
        assert gauge_stats_columns(ts, together, start, end, units, count_nan_slots=nan_slots) == alone


@settings(max_examples=400, deadline=None)
@given(series_columns(), st.sampled_from([0, 666_000_000, 3 * S]))
def test_interpolated_counters_of_several_columns_are_the_one_column_rule(case, grace: int) -> None:
    from bridge.report.stats import counter_deltas_interpolated

    ts, columns, start, end = case
    alone = [counter_delta_interpolated(ts, column, start, end, grace) for column in columns]
    for together in (columns, _as_row_block(columns)):
        assert counter_deltas_interpolated(ts, together, start, end, grace) == alone


def test_long_columns_sum_in_the_same_order_together_as_alone() -> None:
    # numpy's pairwise sums work in blocks of 128 and its iterator buffers 8192 values: rows of a matrix must
    # still add up like the column alone, for windows longer than both.
    from bridge.report.stats import gauge_stats_columns

    rng = np.random.default_rng(3)
    ts = np.arange(30_000, dtype=np.int64) * (S // 3)
    columns = [rng.normal(1e3, 5e2, ts.size) * 10.0 ** rng.integers(-3, 9) for _ in range(8)]
    for start, end in ((0, int(ts[-1])), (S, 3_000 * S), (5 * S, 5 * S + 8_200 * (S // 3))):
        alone = [gauge_stats(ts, column, start, end, "W") for column in columns]
        for together in (columns, _as_row_block(columns)):
            assert gauge_stats_columns(ts, together, start, end, ["W"] * 8) == alone
