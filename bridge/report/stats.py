"""Statistics over one series' samples: gauge stats, counter deltas (both modes), codes.

All functions take a sorted int64 timestamp array and an aligned float64 value array (NaN = absent) and
return plain Python numbers, so the JSON writer never sees numpy scalars.

Counter modes (DECISIONS.md "Counters" has the why):
- `aiperf`: AIPerf 0.13's exact rule (`GpuMetricTimeSeries.to_metric_result_filtered` in ai-dynamo/aiperf
  `src/aiperf/common/models/telemetry_models.py`): last valid in-window sample minus the last valid sample strictly
  before the window (else the first valid in-window one), clamped at 0, no reset handling.
- `interpolated`: the counter is read at the window's two edges by linear interpolation between the
  samples bracketing each edge, and the increase between them is reset-aware like PromQL `increase()`,
  with two refinements: a small dip (out-of-order scrapes) is not a reset, and the part of a reset
  interval lost before the reset is estimated from the neighbouring rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    # Columns aligned with one series' timestamps: arrays, or the rows of one matrix.
    Columns = Sequence[NDArray[np.float64]] | NDArray[np.float64]
    Times = NDArray[np.int64] | NDArray[np.float64]  # ns: scrape times, or estimated refresh instants


PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
# A decrease to below this fraction of the counter's high-water mark is a reset; a smaller dip is an
# out-of-order or stale scrape (timestamps are request starts, and responses can overtake each other).
RESET_FRACTION = 0.5
# PromQL extrapolates to a window edge only when the gap is under 1.1 average intervals, else by half one.
_EXTRAPOLATION_THRESHOLD = 1.1
# Samples looked at in one step of the reset search after a reset; the span doubles while no reset turns up.
_FIRST_SPAN, _MAX_SPAN = 32, 8192


@dataclass(frozen=True, slots=True)
class CounterDelta:
    delta: float
    resets: int = 0


def _window_slice(ts: NDArray[np.int64], start: int, end: int) -> slice:
    """Indices with start ≤ ts ≤ end: `searchsorted` left for the start, right for the end (AIPerf's)."""
    import numpy as np

    lo = int(np.searchsorted(ts, start, side="left"))
    hi = int(np.searchsorted(ts, end, side="right"))
    return slice(lo, hi)


def _linear_percentiles(ordered: NDArray[np.float64]) -> NDArray[np.float64]:
    """np.percentile(values, PERCENTILES) ("linear") along the last axis of already sorted values, in one
    vectorised step (a row of nine per row of values).

    np.percentile's per-call overhead would be paid once per metric per GPU at shutdown; this
    repeats its arithmetic exactly (numpy's _compute_virtual_index and _lerp) on the sorted values.
    """
    import numpy as np

    n = ordered.shape[-1]
    quantiles = np.asarray(PERCENTILES, dtype=np.float64) / 100
    virtual = (n - 1) * quantiles
    previous = np.floor(virtual)
    gamma = virtual - previous
    lo = np.clip(previous.astype(np.int64), 0, n - 1)
    hi = np.clip(lo + 1, 0, n - 1)
    below = virtual < 0
    lo[below], gamma[below] = 0, 0.0
    above = virtual >= n - 1
    lo[above], hi[above], gamma[above] = n - 1, n - 1, 0.0
    a, b = ordered[..., lo], ordered[..., hi]
    diff = b - a
    result: NDArray[np.float64] = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
    return result


def gauge_stats(ts: NDArray[np.int64], values: NDArray[np.float64], start: int, end: int, unit: str,
                *, count_nan_slots: bool = False) -> dict[str, Any] | None:
    """AIPerf's gauge stats and key order over [start, end]; None when no valid sample is in it.

    `count_nan_slots` reproduces AIPerf's `count` (in-window snapshots including NaN slots).
    """
    import numpy as np

    window = values[_window_slice(ts, start, end)]
    valid = window[~np.isnan(window)]
    if valid.size == 0:
        return None
    ordered = np.sort(valid)
    std = float(np.std(valid, ddof=1)) if valid.size >= 2 else 0.0
    count = int(window.size if count_nan_slots else valid.size)
    return _gauge_dict(unit, float(np.mean(valid)), _linear_percentiles(ordered).tolist(), float(ordered[0]),
                       float(ordered[-1]), std, count, float(np.sum(valid)))


class Scratch:
    """Work arrays reused from one series to the next. A fresh array of a few MB costs a page fault per 4 KiB
    when first written (glibc hands large blocks back to the kernel when freed), which costs more than the
    arithmetic done in it (bench/NOTES.md)."""

    def __init__(self) -> None:
        self._arrays: dict[str, Any] = {}

    def array(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        import numpy as np

        size = int(np.prod(shape))
        held = self._arrays.get(name)
        if held is None or held.size < size or held.dtype != dtype:
            held = self._arrays[name] = np.empty(max(size, 1), dtype=dtype)
        return held[:size].reshape(shape)


def gauge_stats_columns(ts: NDArray[np.int64], columns: Columns, start: int, end: int, units: Sequence[str], *,
                        count_nan_slots: bool = False, scratch: Scratch | None = None) -> list[dict[str, Any] | None]:
    """`gauge_stats` of several columns of one series over one window, equal to it to the bit.

    The columns without a NaN in the window (nearly all) share one sort and one call per statistic: each is a
    row of a matrix, contiguous, so numpy's pairwise sums add in the same order as for the column alone
    (tests/report/test_stats.py checks it). A column with a NaN in the window goes through `gauge_stats`.
    """
    import numpy as np

    scratch = scratch or Scratch()
    out: list[dict[str, Any] | None] = [None] * len(columns)
    sl = _window_slice(ts, start, end)
    n = sl.stop - sl.start
    if n <= 0 or not len(columns):
        return out
    matrix = _window(columns, sl)
    # np.sum, np.mean and np.std(ddof=1) as numpy computes them (_methods._mean, _var), the sum done once. A
    # column with a NaN has a NaN sum (so do +inf with -inf: they take the one-by-one path too, as exact).
    sums = np.add.reduce(matrix, axis=1)
    gaps = np.isnan(sums)
    for i in np.flatnonzero(gaps).tolist():
        out[i] = gauge_stats(ts, columns[i], start, end, units[i], count_nan_slots=count_nan_slots)
    clean = np.flatnonzero(~gaps).tolist()
    if not clean:
        return out
    if len(clean) < len(columns):
        matrix, sums = matrix[clean], sums[clean]
    avgs = sums / n
    work = scratch.array("work", matrix.shape, np.float64)
    if n >= 2:
        np.subtract(matrix, avgs[:, None], out=work)
        np.multiply(work, work, out=work)
        stds = np.sqrt(np.add.reduce(work, axis=1) / (n - 1)).tolist()
    else:
        stds = [0.0] * len(clean)
    np.copyto(work, matrix)
    # A full sort of each row, not a partition at the percentiles' ranks: numpy's vectorised sort takes 1/5 to 1/15
    # of the partition's time on a row of an hour's samples (bench/NOTES.md, "The sidecar's completion").
    work.sort(axis=1)
    pcts = _linear_percentiles(work).tolist()
    lows, highs = work[:, 0].tolist(), work[:, -1].tolist()
    for row, (i, avg, total) in enumerate(zip(clean, avgs.tolist(), sums.tolist(), strict=True)):
        out[i] = _gauge_dict(units[i], avg, pcts[row], lows[row], highs[row], stds[row], n, total)
    return out


def _window(columns: Columns, sl: slice) -> NDArray[np.float64]:
    """The window of every column, as the rows of a matrix (a view when `columns` is one)."""
    import numpy as np

    if isinstance(columns, np.ndarray):
        window: NDArray[np.float64] = columns[:, sl]
        return window
    stacked: NDArray[np.float64] = np.stack([column[sl] for column in columns])
    return stacked


def _gauge_dict(unit: str, avg: float, pcts: list[float], low: float, high: float, std: float, count: int,
                total: float) -> dict[str, Any]:
    out: dict[str, Any] = {"unit": unit, "avg": avg}
    for p, value in zip(PERCENTILES, pcts, strict=True):
        out[f"p{p}"] = value
    out.update(min=low, max=high, std=std, count=count, sum=total)
    return out


def gauge_mean(ts: NDArray[np.int64], values: NDArray[np.float64], start: int, end: int) -> float | None:
    import numpy as np

    window = values[_window_slice(ts, start, end)]
    valid = window[~np.isnan(window)]
    return float(np.mean(valid)) if valid.size else None


def code_stats(ts: NDArray[np.int64], values: NDArray[np.float64], start: int, end: int,
               unit: str) -> dict[str, Any] | None:
    """A code (XID): the last value seen in the window and the largest; a code is never differenced."""
    import numpy as np

    window = values[_window_slice(ts, start, end)]
    valid = window[~np.isnan(window)]
    if valid.size == 0:
        return None
    return {"unit": unit, "last": _number(valid[-1]), "max": _number(np.max(valid))}


def counter_delta_aiperf(ts: NDArray[np.int64], values: NDArray[np.float64], start: int,
                         end: int) -> CounterDelta | None:
    """AIPerf: max(last valid in [start, end] − (last valid before start, else first valid in window), 0)."""
    import numpy as np

    sl = _window_slice(ts, start, end)
    window = values[sl]
    valid_in = np.flatnonzero(~np.isnan(window))
    if valid_in.size == 0:
        return None
    last = float(window[valid_in[-1]])
    before = values[: sl.start]
    valid_before = np.flatnonzero(~np.isnan(before))
    ref = float(before[valid_before[-1]]) if valid_before.size else float(window[valid_in[0]])
    return CounterDelta(max(last - ref, 0.0))


def counter_delta_interpolated(ts: NDArray[np.int64], values: NDArray[np.float64], start: int, end: int,
                               grace_ns: int) -> CounterDelta | None:
    """The counter's increase over exactly [start, end], read by interpolation at both edges.

    Samples used: the last one at or before `start` (any age: a warmup or configure-time scrape is a
    fine reference), every one inside, and the first one at or after `end` if it lands within
    `end + grace_ns`. An edge with no bracketing sample is extrapolated with the nearest interval's rate,
    PromQL style. None when no valid sample lies in [start, end + grace].
    """
    import numpy as np

    valid = ~np.isnan(values)
    t = ts[valid]
    v = values[valid]
    if t.size == 0:
        return None
    inside = _window_slice(t, start, end + grace_ns)
    if inside.start >= inside.stop:
        return None
    first = inside.start - 1 if inside.start > 0 else inside.start  # left bracket when there is one
    after_end = int(np.searchsorted(t, end, side="left"))  # first sample at or after `end`
    last = min(after_end, inside.stop - 1)
    t = t[first: last + 1]
    v = v[first: last + 1]
    cum, resets = cumulative_increase(t, v)
    if t.size == 1:
        return CounterDelta(0.0, 0)
    base = int(t[0])  # relative times keep float64 exact to the nanosecond
    tf = (t - base).astype(np.float64)
    at_start = _read_edge(tf, cum, float(start - base))
    at_end = _read_edge(tf, cum, float(end - base))
    return CounterDelta(max(at_end - at_start, 0.0), resets)


def counter_deltas_interpolated(ts: NDArray[np.int64], columns: Columns, start: int, end: int, grace_ns: int, *,
                                scratch: Scratch | None = None) -> list[CounterDelta | None]:
    """`counter_delta_interpolated` of several columns of one series, equal to it to the bit.

    The columns with no NaN among the samples it uses (nearly all) share the slicing, the differences and the
    running sums (row by row, as for one column); each reads its edges with `np.interp`. A column with a NaN
    there goes through `counter_delta_interpolated`.
    """
    import numpy as np

    scratch = scratch or Scratch()
    out: list[CounterDelta | None] = [None] * len(columns)
    inside = _window_slice(ts, start, end + grace_ns)
    after_end = int(np.searchsorted(ts, end, side="left"))  # first sample at or after `end`
    gappy: list[int] = list(range(len(columns)))
    if len(columns) and inside.start < inside.stop and after_end >= inside.start:
        first = inside.start - 1 if inside.start > 0 else inside.start  # the left bracket, when there is one
        last = min(after_end, inside.stop - 1)
        seen = _window(columns, slice(first, inside.stop))
        whole = ~np.isnan(np.add.reduce(seen, axis=1))  # no NaN (and not +inf with -inf: those go one by one)
        gappy = np.flatnonzero(~whole).tolist()
        used = seen[:, : last + 1 - first] if not gappy else seen[whole, : last + 1 - first]
        _clean_counter_deltas(ts[first: last + 1], used, np.flatnonzero(whole).tolist(), start, end, out, scratch)
    for i in gappy:  # (also every column when the window holds no sample or ends before it starts)
        out[i] = counter_delta_interpolated(ts, columns[i], start, end, grace_ns)
    return out


def _clean_counter_deltas(t: NDArray[np.int64], used: NDArray[np.float64], indices: list[int], start: int, end: int,
                          out: list[CounterDelta | None], scratch: Scratch) -> None:
    """counter_delta_interpolated's last steps for columns with no NaN among the samples `t` it uses."""
    import numpy as np

    if t.size == 1:
        for i in indices:
            out[i] = CounterDelta(0.0, 0)
        return
    base = int(t[0])  # relative times keep float64 exact to the nanosecond
    tf = (t - base).astype(np.float64)
    steps = np.subtract(used[:, 1:], used[:, :-1], out=scratch.array("steps", (used.shape[0], used.shape[1] - 1),
                                                                       np.float64))  # np.diff
    simple = np.minimum.reduce(steps, axis=1) >= 0  # (no NaN here) never decreasing
    dipping = np.flatnonzero(~simple)
    if dipping.size:  # cumulative_increase's first span, for all of them at once: a dip adds nothing
        values = used[dipping]
        marks = np.maximum.accumulate(values, axis=1)[:, :-1]  # the high-water mark before each value
        later = values[:, 1:]
        steps[dipping] = np.maximum(later - marks, 0.0)  # (rows with a reset are redone one by one below)
        simple[dipping] = ~((later < marks) & (later < marks * RESET_FRACTION)).any(axis=1)
    cum = scratch.array("work", used.shape, np.float64)
    cum[:, 0] = 0.0
    np.cumsum(steps, axis=1, out=cum[:, 1:])
    for row, (i, plain) in enumerate(zip(indices, simple.tolist(), strict=True)):
        row_cum, resets = (cum[row], 0) if plain else cumulative_increase(t, used[row])
        at_start = _read_edge(tf, row_cum, float(start - base))
        at_end = _read_edge(tf, row_cum, float(end - base))
        out[i] = CounterDelta(max(at_end - at_start, 0.0), resets)


def cumulative_increase(t: Times, v: NDArray[np.float64],
                        rates: NDArray[np.float64] | None = None) -> tuple[NDArray[np.float64], int]:
    """Running increase since the first sample: monotone, reset-aware, dip-tolerant. `rates` (aligned with `v`,
    per unit of `t`; NaN where unknown): the counter's rate at each sample, for a reset interval's lost part."""
    import numpy as np

    n = v.size
    cum = np.zeros(n, dtype=np.float64)
    if n < 2:
        return cum, 0
    dv = np.diff(v)
    if bool(np.all(dv >= 0)):  # the common case: no dip, no reset
        np.cumsum(dv, out=cum[1:])
        return cum, 0
    increments = np.zeros(n - 1, dtype=np.float64)
    reset_at: list[int] = []
    # Sample by sample: a value at or above the high-water mark adds its excess and raises the mark; one below
    # half the mark is a reset (it counts in full from zero, and becomes the mark); anything between is a dip
    # (a stale or out-of-order scrape): nothing added, the mark stands. Done a span at a time: up to the next
    # reset, the mark is the running maximum. The first span is the whole series (dips but no reset: one step);
    # after a reset the search starts small again and doubles, so that many resets do not cost n each.
    high = float(v[0])
    i, span = 1, n
    while i < n:
        seg = v[i: i + span]
        marks = np.maximum.accumulate(np.concatenate(([high], seg)))[:-1]  # the mark before each value
        falls = np.flatnonzero((seg < marks) & (seg < marks * RESET_FRACTION))
        stop = int(falls[0]) if falls.size else seg.size
        np.maximum(seg[:stop] - marks[:stop], 0.0, out=increments[i - 1: i - 1 + stop])
        if not falls.size:
            high = max(high, float(seg.max()))
            i, span = i + seg.size, min(span * 2, _MAX_SPAN)
            continue
        reset = i + stop
        value = float(v[reset])
        increments[reset - 1] = max(value, 0.0)  # the counter restarted from zero
        reset_at.append(reset - 1)
        high = value
        i, span = reset + 1, _FIRST_SPAN
    if reset_at:
        _estimate_reset_intervals(t, increments, reset_at, rates)
    np.cumsum(increments, out=cum[1:])
    return cum, len(reset_at)


def _estimate_reset_intervals(t: Times, increments: NDArray[np.float64], reset_at: list[int],
                              at: NDArray[np.float64] | None = None) -> None:
    """Add the part of a reset interval that happened before the reset, from the neighbouring rate.

    PromQL counts only the post-reset value; at 3 Hz that loses up to one interval of energy (~1.7 % of a
    20 s window). The interval's increase is at least the post-reset value and, at the neighbours' rate,
    rate × its duration: the larger of the two is kept. With the rate at both ends known (`at`: the power
    gauge of a slow refresh, whose interval is long enough for the neighbours' rate to have moved), the
    interval's is their mean instead (a trapezoid).
    """
    resets = set(reset_at)
    dt = (t[1:] - t[:-1]).astype("float64")
    for j in reset_at:
        ends = [] if at is None else [float(at[j]), float(at[j + 1])]
        if ends and all(r == r for r in ends):  # neither NaN
            rates = ends
        else:
            rates = [increments[k] / dt[k] for k in (j - 1, j + 1)
                     if 0 <= k < increments.size and k not in resets and dt[k] > 0]
        if rates:
            increments[j] = max(float(increments[j]), sum(rates) / len(rates) * float(dt[j]))


def _read_edge(t: NDArray[np.float64], cum: NDArray[np.float64], edge: float) -> float:
    """The cumulative increase at `edge`: interpolated inside the samples, extrapolated outside."""
    import numpy as np

    if t[0] <= edge <= t[-1]:
        return float(np.interp(edge, t, cum))
    average = (t[-1] - t[0]) / (t.size - 1)
    if edge < t[0]:
        gap = t[0] - edge
        rate = (cum[1] - cum[0]) / (t[1] - t[0]) if t[1] > t[0] else 0.0
        reach = gap if gap < average * _EXTRAPOLATION_THRESHOLD else average / 2
        return float(cum[0] - rate * reach)
    gap = edge - t[-1]
    rate = (cum[-1] - cum[-2]) / (t[-1] - t[-2]) if t[-1] > t[-2] else 0.0
    reach = gap if gap < average * _EXTRAPOLATION_THRESHOLD else average / 2
    return float(cum[-1] + rate * reach)


def _number(value: Any) -> float | int:
    """A code as an int when it is integral (XID 79, not 79.0)."""
    as_float = float(value)
    return int(as_float) if as_float.is_integer() else as_float
