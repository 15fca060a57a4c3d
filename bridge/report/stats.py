"""Statistics over one series' samples: gauge stats, counter deltas (both modes), codes, power integrals.

All functions take a sorted int64 timestamp array and an aligned float64 value array (NaN = absent) and
return plain Python numbers, so the JSON writer never sees numpy scalars.

Counter modes (DESIGN-report.md has the why):
- `aiperf`: AIPerf 0.13's exact rule (aiperf-compat.md §7): last valid in-window sample minus the last valid
  sample strictly before the window (else the first valid in-window one), clamped at 0, no reset handling.
- `interpolated`: the counter is read at the window's two edges by linear interpolation between the
  samples bracketing each edge, and the increase between them is reset-aware like PromQL `increase()`,
  with two refinements: a small dip (out-of-order scrapes) is not a reset, and the part of a reset
  interval lost before the reset is estimated from the neighbouring rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

CounterMode = Literal["interpolated", "aiperf"]
COUNTER_MODES: tuple[CounterMode, ...] = ("interpolated", "aiperf")

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
# A decrease to below this fraction of the counter's high-water mark is a reset; a smaller dip is an
# out-of-order or stale scrape (timestamps are request starts, and responses can overtake each other).
RESET_FRACTION = 0.5
# PromQL extrapolates to a window edge only when the gap is under 1.1 average intervals, else by half one.
_EXTRAPOLATION_THRESHOLD = 1.1


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
    """np.percentile(values, PERCENTILES) ("linear") on already sorted values, in one vectorised step.

    np.percentile costs ~0.25 ms per call in overhead, paid once per metric per GPU at shutdown; this
    repeats its arithmetic exactly (numpy's _compute_virtual_index and _lerp) on the sorted array.
    """
    import numpy as np

    n = ordered.size
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
    a, b = ordered[lo], ordered[hi]
    diff = b - a
    result = a + diff * gamma
    late = gamma >= 0.5
    result[late] = (b - diff * (1 - gamma))[late]
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
    pcts = _linear_percentiles(ordered)
    out: dict[str, Any] = {"unit": unit, "avg": float(np.mean(valid))}
    for p, value in zip(PERCENTILES, pcts, strict=True):
        out[f"p{p}"] = float(value)
    out["min"] = float(ordered[0])
    out["max"] = float(ordered[-1])
    out["std"] = float(np.std(valid, ddof=1)) if valid.size >= 2 else 0.0
    out["count"] = int(window.size if count_nan_slots else valid.size)
    out["sum"] = float(np.sum(valid))
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
    cum, resets = _cumulative_increase(t, v)
    if t.size == 1:
        return CounterDelta(0.0, 0)
    base = int(t[0])  # relative times keep float64 exact to the nanosecond
    tf = (t - base).astype(np.float64)
    at_start = _read_edge(tf, cum, float(start - base))
    at_end = _read_edge(tf, cum, float(end - base))
    return CounterDelta(max(at_end - at_start, 0.0), resets)


def _cumulative_increase(t: NDArray[np.int64], v: NDArray[np.float64]) -> tuple[NDArray[np.float64], int]:
    """Running increase since the first sample: monotone, reset-aware, dip-tolerant."""
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
    high = float(v[0])
    for i in range(1, n):
        value = float(v[i])
        if value >= high:
            increments[i - 1] = value - high
            high = value
        elif value < high * RESET_FRACTION:
            increments[i - 1] = max(value, 0.0)  # the counter restarted from zero
            reset_at.append(i - 1)
            high = value
        # else: a dip (stale or out-of-order scrape); the high-water mark stands, no increase
    if reset_at:
        _estimate_reset_intervals(t, increments, reset_at)
    np.cumsum(increments, out=cum[1:])
    return cum, len(reset_at)


def _estimate_reset_intervals(t: NDArray[np.int64], increments: NDArray[np.float64], reset_at: list[int]) -> None:
    """Add the part of a reset interval that happened before the reset, from the neighbouring rate.

    PromQL counts only the post-reset value; at 3 Hz that loses up to one interval of energy (~1.7 % of a
    20 s window). The interval's increase is at least the post-reset value and, at the neighbours' rate,
    rate × its duration: the larger of the two is kept.
    """
    resets = set(reset_at)
    dt = (t[1:] - t[:-1]).astype("float64")
    for j in reset_at:
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


def integrate_gauge(ts: NDArray[np.int64], values: NDArray[np.float64], start: int, end: int,
                    grace_ns: int) -> float | None:
    """∫ value dt over [start, end] in value·seconds (trapezoids; edges interpolated, held flat outside)."""
    import numpy as np

    valid = ~np.isnan(values)
    t = ts[valid]
    v = values[valid]
    inside = _window_slice(t, start, end + grace_ns)
    if inside.start >= inside.stop or end <= start:
        return None
    first = max(inside.start - 1, 0)
    base = int(t[first])
    t = (t[first: inside.stop] - base).astype(np.float64)
    v = v[first: inside.stop]
    lo, hi = float(start - base), float(end - base)
    interior = (t > lo) & (t < hi)
    grid = np.concatenate(([lo], t[interior], [hi]))
    curve = np.interp(grid, t, v)
    return float(np.trapezoid(curve, grid) / 1e9)


def _number(value: Any) -> float | int:
    """A code as an int when it is integral (XID 79, not 79.0)."""
    as_float = float(value)
    return int(as_float) if as_float.is_integer() else as_float
