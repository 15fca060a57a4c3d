"""The energy's expected error (`uncertainty`, beside `avg`), from the data itself: no fitted constants.

`bound` (bridge/report/refresh.py) is what monotonicity guarantees: the counter's value at an edge lies
between the readings around it. The truth is nearly always much closer, and how close the data tells:

- The edge term. A counter read between two readings h apart by linear interpolation is off by
  |ΔP|·h·x(1−x)/2 at fraction x when power changes linearly by ΔP between them: at most |ΔP|·h/8. Fresh values
  (the scrape time is the sample time) use that, with ΔP from the power gauge at the two readings. A slow
  refresh is read by cubic Hermite interpolation with the power gauge as the slope, which is exact for linear
  power; what is left is how far the power departed from a line over the refresh interval, which the data
  measures: the interval's trapezoid residual |E − (P₀ + P₁)·h/2| (E the counter's increase over it); the
  largest of the edge's interval and its two neighbours is taken.
- The refresh-bracket term (slow refresh only). Each refresh is timed at the fitted grid instant inside its
  bracket; the grid can still move by its phase spread (the range every bracket allows), or, with no grid, by
  the bracket's width. Half of that, times the interval's mean power.
- The counter's resolution (1 mJ for DCGM and NVML), once per edge.

An edge beyond the readings (nothing after the window's end, say) has no better estimate than its bound. The
two edges add; the sum is capped at `bound`. The power integral (the cross-check and the fallback) carries
|ΔP|·h/2 per interval (the trapezoid's worst case for monotone power between readings) plus, for a gauge
that is itself an average (NVML: a one-second average on Ampere and newer, nvmlDeviceGetPowerUsage), the
power's change across the window times that averaging span.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from bridge.report.refresh import Cadence

# nvmlDeviceGetPowerUsage: "On Ampere (except GA100) or newer GPUs, the returned power draw is a one-second
# average" (NVML API reference). DCGM's power field reads it.
GAUGE_AVERAGING_S = 1.0


def fresh_uncertainty(ts: NDArray[np.int64], counter: NDArray[np.float64], power_w: NDArray[np.float64] | None,
                      start: int, end: int, bound: float, resolution: float) -> float:
    """The expected error of a fresh counter's increase over [start, end] (the counter's unit, MJ for energy)."""
    import numpy as np

    from bridge.report.refresh import fresh_edge_bound

    valid = np.flatnonzero(~np.isnan(counter))
    t, v = ts[valid], counter[valid]
    p = None if power_w is None else power_w[valid] * 1e-6  # W → MJ/s
    edges = []
    for edge in (start, end):
        i = int(np.searchsorted(t, edge, side="right"))
        if 0 < i < t.size:
            h = float(t[i] - t[i - 1]) / 1e9
            if int(t[i - 1]) == edge or h <= 0:
                continue
            change = _power_change(t, v, p, i)
            if change is None:
                edges.append(fresh_edge_bound(t, v, edge))
                continue
            edges.append(change * h / 8 + _fresh_residual(t, v, p, i))
        else:
            edges.append(fresh_edge_bound(t, v, edge))
    return combine(edges, resolution, bound)


def combine(edges: list[float], resolution: float, bound: float) -> float:
    """The two edges' errors are independent (each edge falls at its own place between readings): they add in
    quadrature; the counter's resolution adds once per edge; never more than the hard bound."""
    return min(math.sqrt(sum(e * e for e in edges)) + 2 * resolution, bound)


def _fresh_residual(t: NDArray[np.int64], v: NDArray[np.float64], p: NDArray[np.float64] | None, i: int) -> float:
    """The largest trapezoid residual |ΔE − (P₀ + P₁)·h/2| of the intervals around reading i (0 without a gauge):
    what the counter and the gauge disagree on between readings, from the power's curvature and from readings
    that are not quite at their scrape time (a refresh faster than the scrapes, but not instantaneous)."""
    if p is None:
        return 0.0
    out = 0.0
    for k in range(max(i - 1, 1), min(i + 2, t.size)):
        h = float(t[k] - t[k - 1]) / 1e9
        residual = float(v[k] - v[k - 1]) - float(p[k] + p[k - 1]) / 2 * h
        if math.isfinite(residual) and v[k] >= v[k - 1]:
            out = max(out, abs(residual))
    return out


def _power_change(t: NDArray[np.int64], v: NDArray[np.float64], p: NDArray[np.float64] | None,
                  i: int) -> float | None:
    """|ΔP| between readings i−1 and i (MJ/s): the gauge's, else half the change of the neighbouring intervals'
    mean rates (two intervals apart), else None."""
    if p is not None and math.isfinite(p[i - 1]) and math.isfinite(p[i]):
        return abs(float(p[i] - p[i - 1]))
    if i >= 2 and i + 1 < t.size:
        before = float(v[i - 1] - v[i - 2]) / (float(t[i - 1] - t[i - 2]) / 1e9 or math.inf)
        after = float(v[i + 1] - v[i]) / (float(t[i + 1] - t[i]) / 1e9 or math.inf)
        return abs(after - before) / 2
    return None


def refreshed_edge_uncertainty(tau: NDArray[np.float64], cum: NDArray[np.float64], rate: NDArray[np.float64] | None,
                               lo: NDArray[np.float64], hi: NDArray[np.float64], edge: float, bound: float,
                               spread_ns: float | None) -> float:
    """One edge's expected error for a counter timed at its refreshes (`refresh.refreshed_delta`'s arrays:
    instants, cumulative increase, rate per ns, brackets), at most the edge's `bound`."""
    import numpy as np

    n = tau.size
    if n < 2 or not tau[0] <= edge <= tau[-1]:
        return bound
    i = min(int(np.searchsorted(tau, edge, side="right")) - 1, n - 2)
    h = float(tau[i + 1] - tau[i])
    if h <= 0:
        return bound
    x = (edge - float(tau[i])) / h
    shape = _shape_term(tau, cum, rate, i)
    widths = [float(hi[k] - lo[k]) for k in (i, i + 1) if math.isfinite(lo[k])]
    width = spread_ns if spread_ns is not None else max(widths, default=h)
    timing = float(cum[i + 1] - cum[i]) / h * width / 2
    return min(4 * x * (1 - x) * shape + timing, bound) if shape is not None else bound


def _shape_term(tau: NDArray[np.float64], cum: NDArray[np.float64], rate: NDArray[np.float64] | None,
                i: int) -> float | None:
    """How far interval i's reading can be off for the power's shape between refreshes (see the module doc)."""
    n = tau.size
    h = float(tau[i + 1] - tau[i])
    if rate is not None and math.isfinite(rate[i]) and math.isfinite(rate[i + 1]):
        residuals = [abs(float(cum[k + 1] - cum[k]) - float(rate[k] + rate[k + 1]) / 2 * float(tau[k + 1] - tau[k]))
                     for k in range(max(i - 1, 0), min(i + 2, n - 1))
                     if math.isfinite(rate[k]) and math.isfinite(rate[k + 1])]
        return max(residuals)
    means = [float(cum[k + 1] - cum[k]) / float(tau[k + 1] - tau[k]) for k in (i - 1, i + 1)
             if 0 <= k < n - 1 and tau[k + 1] > tau[k]]
    if len(means) < 2:
        return None
    return abs(means[1] - means[0]) / 2 * h / 8


@dataclass(frozen=True, slots=True)
class PowerIntegral:
    joules: float
    uncertainty_j: float


def power_integral(ts: NDArray[np.int64], power_w: NDArray[np.float64], cadence: Cadence, start: int,
                   end: int) -> PowerIntegral | None:
    """∫ power dt over [start, end] (J) from the gauge's readings, timed at their refresh when the values are not
    fresh, held flat beyond the readings; with its expected error. None without a reading or with end ≤ start."""
    import numpy as np

    valid = np.flatnonzero(~np.isnan(power_w))
    if not valid.size or end <= start:
        return None
    t, p = ts[valid], power_w[valid]
    base = int(t[0])
    if cadence.fresh:
        instants = (t - base).astype(np.float64)
        stale = 0.0
    else:  # the first reading and every one that changed, each at its refresh instant (the bracket's grid point)
        new = np.concatenate(([0], np.flatnonzero(np.diff(p) != 0) + 1))
        instants = np.array([cadence.instant_before(float(t[0]))] + [cadence.instant(float(t[k - 1]), float(t[k]))
                                                                       for k in new[1:].tolist()]) - base
        instants = np.maximum.accumulate(instants)
        p = p[new]
        stale = float(np.max(p)) * (cadence.phase_spread_ns if cadence.phase_spread_ns is not None
                                    else cadence.period_ns or 0.0) / 1e9
    lo, hi = float(start - base), float(end - base)
    inside = (instants > lo) & (instants < hi)
    grid = np.concatenate(([lo], instants[inside], [hi]))
    curve = np.interp(grid, instants, p)
    joules = float(np.trapezoid(curve, grid) / 1e9)
    steps = float(np.sum(np.abs(np.diff(curve)) * np.diff(grid))) / 2 / 1e9
    averaging = abs(float(curve[-1] - curve[0])) * GAUGE_AVERAGING_S
    return PowerIntegral(joules, steps + averaging + stale)
