"""The energy's expected error (`uncertainty`, beside `avg`), from the data itself: no fitted constants.

`bound` (bridge/report/refresh.py) is what monotonicity guarantees: the counter's value at an edge lies
between the readings around it. The truth is nearly always much closer, and how close the data tells:

- Fresh values (nearly every scrape shows a new value), read by linear interpolation at the instants the readings
  show (bridge/report/ages.py: a served value is the counter's last update, up to its hold and an exporter's refresh
  before its scrape). Per edge, inside the interval of readings h apart that holds it at fraction x, from the
  counter's own rates (the power gauge may be a one-second average and show neither a step nor a spike): the
  power's change ΔP between the neighbouring intervals, ΔP·h·x(1−x) (exact for a step inside it); a transient the
  neighbours do not show (the interval's energy X beyond their mean rate), X·max(x, 1−x); each beyond what the
  readings' age noise alone makes of those rates. The edges' shape terms add (a load that starts with the window and
  stops with it misses the same way at both); the ages' own share (the power × the 95 % quantile of two ages'
  difference) in quadrature, with what hides beneath readings at one phase of the hold (ages.py `Beneath`: the
  higher edge power × its walk between the edges); the power's change across the window × how far the mean age can
  be off on top.
- A slow refresh, read by cubic Hermite interpolation with the power gauge as the slope (exact for power that
  is quadratic between two refreshes; DCGM's instant power where the exporter serves it, refresh.py `slope_key`).
  The shape term has two parts, in quadrature:
  - what the refreshes resolve: the reader's own error on the refreshes near the edge, each read from its two
    neighbours alone as if it were missing (a leave-one-out check at twice the spacing, at the middle; the
    largest of them), carried to the edge by the Hermite error's own form f⁗·h⁴·x²(1−x)²/24: at fraction x
    of a spacing half as wide, x²(1−x)² of the check;
  - what they miss: a power that swings between refreshes shows as a gauge reading away from what the counter's
    rates either side say the power there is (their mean less the curvature's share, P''·h²/6 on a regular grid,
    P'' from the counter's rates alone: equal for a power the refreshes follow, up to its cubic terms); its
    largest size D near the edge enters the reader through the slopes (the Hermite slope basis: at most
    D·h·x(1−x)) and through the energy it moves inside the interval (a swing of size D that the counter's
    interval mean does not see, at its slowest one period per interval: D·h·(1 − cos 2πx)/2π).
  Without a gauge (a linear reading) the check stands as it is. The timing term: each refresh is timed at the
  fitted grid's instant in its bracket, and the grid can still move by its phase spread and its period spread
  (the ranges every bracket allows, or two standard errors of the energy's clock where that sets the period,
  refresh.py `_measured_period`): a phase error moves both edges alike and cancels but for the power's change
  across the window, a period error turns the grid about its pivot; with no agreed grid, each edge can sit
  anywhere in half its bracket.
  The edges' shape terms, the phase term and the period term are independent: they add in quadrature.
- On a slow refresh, the counter's hold (bridge/sources `COUNTER_HOLD_S`: NVML's counter updates every 100 ms,
  measured on an H200 by scripts/check-gpu.sh): DCGM sampled each value up to a hold after the update it shows. The
  refreshes' ages (ages.py `refresh_ages`) move the edges by their mean; their spread enters as for fresh values,
  and a transient inside an edge's interval (`_transient`) in quadrature with its shape term. Where DCGM's grid
  times the refreshes (not the energy's clock, which shows the GPU's own), the age beneath them walks by the two
  clocks' drift over the window, which no refreshed value shows: the higher of the edges' powers × that walk, in
  quadrature.
- The counter's resolution (1 mJ for DCGM and NVML), once per edge.

An edge beyond the readings (nothing after the window's end, say) has no better estimate than its bound; the
result is never more than the bound. The power integral (the cross-check and the fallback) carries |ΔP|·h/2
per interval (the trapezoid's worst case for monotone power between readings), plus, for a gauge that is
itself an average (NVML: a one-second average on Ampere and newer, nvmlDeviceGetPowerUsage), the power's change
across the window times that span, plus, on a slow refresh, the highest power times how far the edges' refresh
instants can be off.

Per source: the terms read the source's own readings and brackets, so a reader with other timing (issue 22's
NVML and AMD readers: fresh values, an energy counter of its own resolution) gets its own numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from bridge.report.ages import Staleness

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

# How the refresh grid can still move (bridge/report/refresh.py `Cadence`), ns: its phase, its period (turning
# the grid about `pivot`), and the period itself.
Reader = Callable[[int, int, float], float]


class GridSpread(NamedTuple):
    phase_ns: float
    period_ns: float
    pivot_ns: float
    period: float

# nvmlDeviceGetPowerUsage: "On Ampere (except GA100) or newer GPUs, the returned power draw is a one-second
# average" (NVML API reference). DCGM's power field reads it.
GAUGE_AVERAGING_S = 1.0


def fresh_uncertainty(ts: NDArray[np.int64], counter: NDArray[np.float64], start: int, end: int,
                      edge_bounds: tuple[float, float], resolution: float, stale: Staleness,
                      late: NDArray[np.float64] | None = None) -> float:
    """The expected error of a fresh counter's increase over [start, end] (the counter's unit, MJ for energy), the
    edges already moved by the readings' mean age. Per edge, inside the interval of readings h apart that holds it at
    fraction x, from the counter's own rates (a power gauge may be a one-second average, nvmlDeviceGetPowerUsage, and
    show neither a step nor a spike):
    - the power's change: the rates of the neighbouring intervals differ by ΔP, and a line read inside the interval is
      off by up to ΔP·h·x(1−x) (exact for a step inside it);
    - a transient the neighbours do not show: the interval's energy beyond its neighbours' mean rate, X, lies before
      or after the edge, unknown: up to X·max(x, 1−x);
    - the readings' ages: each edge's reading is off by the power there times its age's deviation, whose differences
      have the 95 % quantile `q95`; the share every reading may hide moves the two edges alike and leaves the
      power's change across the window times how far the mean age can be off (`mean_error_s`);
    - a part no reading shows (readings at one phase of the hold, `Staleness.walk_between`): the higher edge power
      times its walk between the edges, in quadrature with the ages;
    - a reading's instant in doubt (`late`: how far from its instant each reading's value may be, refresh.py
      `_lateness`: a late response, an update the fitted grid's jitter leaves either side): the edge's power times
      the larger of its two readings', in quadrature with the ages.
    The edges' shapes add (a load that starts with the window and stops with it misses the same way at both), the ages
    in quadrature with them, the shared age and the counter's resolution at each edge on top; never more than the
    bound."""
    import numpy as np

    valid = np.flatnonzero(~np.isnan(counter))
    t, v = ts[valid], counter[valid]
    shapes: list[float] = []
    ages: list[float] = []
    edge_power: list[float] = []
    lateness = None if late is None else late[valid]
    for edge, edge_bound in zip((start, end), edge_bounds, strict=True):
        i = int(np.searchsorted(t, edge, side="right"))
        if (i == 0 or i == t.size) and t.size >= 4:  # beyond the readings: the line of the nearest interval, extended
            beyond = _extended(t, v, i, edge, stale)
            shapes.append(min(beyond[0], edge_bound))
            ages.append(beyond[1] * stale.q95_s / math.sqrt(2))
            if lateness is not None:
                ages.append(beyond[1] * float(lateness[min(i, t.size - 1)]))
            edge_power.append(beyond[1])
            continue
        if not 0 < i < t.size or t[i] <= t[i - 1]:
            shapes.append(edge_bound)
            edge_power.append(0.0)
            continue
        a = i - 1
        h = float(t[i] - t[a]) / 1e9
        x = (edge - int(t[a])) / float(t[i] - t[a])
        here = _rate(t, v, a)
        assert here is not None
        before, after = (_rate(t, v, k) for k in (a - 1, a + 1))
        before = here if before is None else before
        after = here if after is None else after
        power = _rate(t, v, max(a - 1, 0), min(a + 2, t.size - 1)) or here  # over three intervals: the ages average
        # What the readings' ages alone make of these rates at 95 % (a rate over h moves by P × the difference of its
        # two readings' ages / h): the change (r_{a+1} − r_{a−1})·h mixes four ages, sd 2·σ·P; the transient
        # (r_a − the neighbours' mean)·h, sd √5·σ·P; with q95 = 1.96·√2·σ for the difference of two ages.
        change = _beyond(abs(after - before) * h, 2 / math.sqrt(2) * power * stale.q95_s)
        transient = _beyond(abs(here - (before + after) / 2) * h, math.sqrt(5 / 2) * power * stale.q95_s)
        shapes.append(change * x * (1 - x) + transient * max(x, 1 - x))
        ages.append(power * stale.q95_s / math.sqrt(2))
        if lateness is not None:
            ages.append(power * float(max(lateness[a], lateness[i])))
        edge_power.append(power)
    shared = abs(edge_power[1] - edge_power[0]) * stale.mean_error_s
    walk = max(edge_power) * stale.walk_between(start, end)  # (a part no reading shows: not noise in the rates)
    # The shapes add: a benchmark's load starts at its window's start and stops at its end, and a line read across
    # both steps misses the same way twice (the power is lower before the start and after the end).
    return min(sum(shapes) + math.hypot(*ages, walk) + shared + 2 * resolution, sum(edge_bounds))


def _extended(t: NDArray[np.int64], v: NDArray[np.float64], i: int, edge: int, stale: Staleness) -> tuple[float, float]:
    """(shape term, power) for an edge a little beyond the readings (0 < δ: the final scrape's value is older than the
    window's end): the counter is extended at the nearest interval's rate, which is off from the power beyond it by at
    most the change the last three intervals show, beyond the ages' noise; over δ."""
    last = i == t.size
    k = t.size - 2 if last else 0  # the nearest interval
    rates = [_rate(t, v, j) for j in ((k, k - 1, k - 2) if last else (k, k + 1, k + 2))]
    known = [r for r in rates if r is not None]
    power = known[0]
    change = _beyond(max(known) - min(known), 2 / math.sqrt(2) * power * stale.q95_s / (float(t[k + 1] - t[k]) / 1e9))
    delta = abs(edge - int(t[-1] if last else t[0])) / 1e9
    return change * delta, power


def _beyond(seen: float, noise: float) -> float:
    """What of `seen` the noise does not explain (in quadrature)."""
    return math.sqrt(max(seen * seen - noise * noise, 0.0))


def _rate(t: NDArray[np.int64], v: NDArray[np.float64], k: int, to: int | None = None) -> float | None:
    """The counter's mean rate (per s) from reading k to reading `to` (k+1 by default); None outside the readings,
    0 across a reset."""
    to = k + 1 if to is None else to
    if not 0 <= k < to < t.size or t[to] <= t[k]:
        return None
    return max(float(v[to] - v[k]), 0.0) / (float(t[to] - t[k]) / 1e9)


def refreshed_uncertainty(tau: NDArray[np.float64], cum: NDArray[np.float64], rate: NDArray[np.float64] | None,
                          lo: NDArray[np.float64], hi: NDArray[np.float64], edges: tuple[float, float],
                          bounds: tuple[float, float], grid: GridSpread | None, base: int, resolution: float,
                          read: Reader, hold: Staleness | None = None) -> float:
    """The expected error of a counter's increase timed at its refreshes (`refresh.refreshed_delta`'s arrays:
    instants and brackets relative to `base`, cumulative increase, rate per ns; `edges` relative too), at most
    the sum of the edges' `bounds`. `read(a, b, at)`: the counter's reader from refreshes a and b alone."""
    shapes: list[float] = []
    rates: list[float | None] = []
    for edge, bound in zip(edges, bounds, strict=True):
        interval = _interval(tau, edge)
        shape = None if interval is None else _shape_term(tau, cum, rate, interval, edge, read)
        if interval is None or shape is None:
            shapes.append(bound)  # beyond the refreshes seen, or too few of them: only the hard bound is known
            rates.append(None)
            continue
        h = float(tau[interval + 1] - tau[interval])
        rate_here = float(cum[interval + 1] - cum[interval]) / h
        x = min(max((edge - float(tau[interval])) / h, 0.0), 1.0)
        noise = 0.0 if hold is None else math.sqrt(5 / 2) * rate_here * hold.q95_s * 1e9  # (the ages' share, as fresh)
        share = _share(rate, interval, x)
        transient = _beyond(_transient(tau, cum, interval), noise) * max(share, 1 - share)
        step = _beyond(_step(tau, cum, interval), noise) * x * (1 - x)
        shapes.append(min(math.sqrt(shape * shape + transient * transient + step * step), bound))
        rates.append(rate_here)
    timing = _timing_term(lo, hi, tau, edges, rates, grid, base)
    r0, r1 = (r if r is not None else 0.0 for r in rates)
    ages = 0.0 if hold is None else math.hypot(r0, r1) * hold.q95_s / math.sqrt(2)  # (rates per ns, ages in s)
    walk = 0.0 if hold is None else max(r0, r1) * hold.walk_s  # (shared by every reading: not noise in the rates)
    shared = 0.0 if hold is None else abs(r1 - r0) * hold.mean_error_s
    spread = math.sqrt(shapes[0] ** 2 + shapes[1] ** 2 + timing ** 2 + (ages * 1e9) ** 2 + (walk * 1e9) ** 2)
    return min(spread + shared * 1e9 + 2 * resolution, sum(bounds))


def _share(rate: NDArray[np.float64] | None, i: int, x: float) -> float:
    """How much of an energy in refresh interval i that its ends' rates do not show the reader puts before fraction
    x (refresh.py `_read`): the Hermite basis h01 = 3x² − 2x³ where both ends have a gauge reading (the slopes carry
    none of it), else the line's x. A burst wholly on one side of the edge is misplaced by the rest: near an end of
    the interval, more than the line's max(x, 1 − x) (at x = 0.1, 0.97 of it against 0.9)."""
    if rate is None or not (math.isfinite(float(rate[i])) and math.isfinite(float(rate[i + 1]))):
        return x
    return x * x * (3 - 2 * x)


def _transient(tau: NDArray[np.float64], cum: NDArray[np.float64], i: int) -> float:
    """The energy in refresh interval i that its neighbours' rates do not account for (the counter's unit): a burst
    inside it lies before or after the edge, nobody can tell. Interval i's mean rate against what the rates beside it
    predict (a line from the two on its left, from the two on its right, or a quadratic through the four), the least
    of them: a ramp or a curve that the neighbours follow, or a step at one of its ends, leaves nothing; a transient
    inside it leaves its energy. 0 with fewer than two neighbours."""
    here = _interval_rate(tau, cum, i)
    if here is None:
        return 0.0
    r = {d: _interval_rate(tau, cum, i + d) for d in (-2, -1, 1, 2)}
    guesses = []
    if r[-1] is not None and r[-2] is not None:
        guesses.append(2 * r[-1] - r[-2])
    if r[1] is not None and r[2] is not None:
        guesses.append(2 * r[1] - r[2])
    if r[-1] is not None and r[1] is not None:
        guesses.append((r[-1] + r[1]) / 2 if r[-2] is None or r[2] is None
                       else (4 * (r[-1] + r[1]) - (r[-2] + r[2])) / 6)  # (the quadratic through the four, at i)
    if not guesses:
        return 0.0
    return min(abs(here - g) for g in guesses) * float(tau[i + 1] - tau[i])


def _step(tau: NDArray[np.float64], cum: NDArray[np.float64], i: int) -> float:
    """A step in the power inside refresh interval i (counter units over the interval): the rates on its left and
    those on its right each foretell its rate (a line through the two nearest on each side), and they disagree by
    the step. Power the refreshes follow (a ramp, a curve) leaves nothing, a step ΔP leaves ΔP·h: it moves a reading
    at fraction x of the interval by up to ΔP·h·x(1−x) (exact for a step at the edge; the replayed H200 phases,
    whose load changes at the window's edges, missed by this much at 1-2 s refreshes). 0 without two rates a side."""
    left1, left2, right1, right2 = (_interval_rate(tau, cum, i + d) for d in (-1, -2, 1, 2))
    if left1 is None or left2 is None or right1 is None or right2 is None or tau[i + 1] <= tau[i]:
        return 0.0
    return abs((2 * left1 - left2) - (2 * right1 - right2)) * float(tau[i + 1] - tau[i])


def _interval_rate(tau: NDArray[np.float64], cum: NDArray[np.float64], j: int) -> float | None:
    """Refresh interval j's mean rate (counter units per ns); None outside the refreshes or for an empty one."""
    if not 0 <= j < tau.size - 1 or tau[j + 1] <= tau[j]:
        return None
    return float(cum[j + 1] - cum[j]) / float(tau[j + 1] - tau[j])


def _interval(tau: NDArray[np.float64], edge: float) -> int | None:
    """The refresh interval [tau[i], tau[i+1]] that holds `edge` (None: outside the refreshes, or empty)."""
    import numpy as np

    n = tau.size
    if n < 2 or not tau[0] <= edge <= tau[-1]:
        return None
    i = min(int(np.searchsorted(tau, edge, side="right")) - 1, n - 2)
    return i if tau[i + 1] > tau[i] else None


def _timing_term(lo: NDArray[np.float64], hi: NDArray[np.float64], tau: NDArray[np.float64], edges: tuple[float, float],
                 rates: list[float | None], grid: GridSpread | None, base: int) -> float:
    """What the refresh instants' timing leaves uncertain. With an agreed grid, both edges move with it: by its
    phase (which cancels but for the power's change across the window) and its period (which turns the grid
    about its pivot). Without one, each edge anywhere in half its bracket, independently."""
    r0, r1 = (r if r is not None else 0.0 for r in rates)
    if grid is not None:
        pivot = grid.pivot_ns - base
        turn = grid.period_ns / grid.period * abs(r1 * (edges[1] - pivot) - r0 * (edges[0] - pivot))
        return math.hypot(abs(r1 - r0) * grid.phase_ns / 2, turn)  # (the phase at a period, and the period)
    halves = []
    for edge, r in zip(edges, (r0, r1), strict=True):
        i = _interval(tau, edge)
        widths = [] if i is None else [float(hi[k] - lo[k]) / 2 for k in (i, i + 1) if math.isfinite(lo[k])]
        halves.append(r * max(widths, default=0.0))
    return math.hypot(*halves)


def _shape_term(tau: NDArray[np.float64], cum: NDArray[np.float64], rate: NDArray[np.float64] | None, i: int,
                edge: float, read: Reader) -> float | None:
    """How far a reading at `edge`, inside interval i, can be off for the power's shape between refreshes (see the
    module doc). None with fewer than three refreshes."""
    check = _leave_one_out(tau, cum, i, read)
    unresolved = _unresolved_power(tau, cum, rate, i)
    if check is None or unresolved is None:
        return check  # no gauge to tell a smooth power from one the refreshes miss: the check as it stands
    h = float(tau[i + 1] - tau[i])
    x = min(max((edge - float(tau[i])) / h, 0.0), 1.0)
    smooth = check * (x * (1 - x)) ** 2
    missed = unresolved * h * (x * (1 - x) + (1 - math.cos(2 * math.pi * x)) / (2 * math.pi))
    return math.hypot(smooth, missed)


def _leave_one_out(tau: NDArray[np.float64], cum: NDArray[np.float64], i: int, read: Reader) -> float | None:
    """The reader's own error on the refreshes near interval i, each read from its two neighbours alone as if it
    were missing (at twice the spacing, at the middle); the largest of them. None with fewer than three refreshes."""
    n = tau.size
    errors = [abs(float(cum[k]) - read(k - 1, k + 1, float(tau[k])))
              for k in range(max(i - 2, 1), min(i + 4, n - 1))]
    return max(errors) if errors else None


def _unresolved_power(tau: NDArray[np.float64], cum: NDArray[np.float64], rate: NDArray[np.float64] | None,
                      i: int) -> float | None:
    """The power the refreshes near interval i do not resolve (counter units per ns): the largest difference
    between the gauge at a refresh and what the counter's rates over the intervals either side of it say the
    power there is. Their mean is the power at the refresh plus its curvature's share, P''·(h₁² + h₂²)/12 (exact for
    quadratic power on a regular grid), P'' taken from the counter alone (`_rates_curvature`), so a power the
    refreshes follow leaves no difference, while a swing they miss still shows in the gauge: the counter's rates
    average it out. None without a gauge there."""
    if rate is None:
        return None
    found = []
    for k in range(max(i - 1, 1), min(i + 3, tau.size - 1)):
        if not math.isfinite(rate[k]):
            continue
        h1, h2 = float(tau[k] - tau[k - 1]), float(tau[k + 1] - tau[k])
        before = float(cum[k] - cum[k - 1]) / (h1 or math.inf)
        after = float(cum[k + 1] - cum[k]) / (h2 or math.inf)
        curvature = _rates_curvature(tau, cum, k)
        curved = 0.0 if curvature is None else curvature * (h1 * h1 + h2 * h2) / 12
        found.append(abs(float(rate[k]) - ((before + after) / 2 - curved)))
    return max(found) if found else None


def _rates_curvature(tau: NDArray[np.float64], cum: NDArray[np.float64], k: int) -> float | None:
    """The power's second derivative near refresh k from the counter alone: the second divided difference of the
    mean rates of three consecutive intervals at their middles (exact for quadratic power on a regular grid), the
    mean over the two such triples around k that the refreshes hold. None where they hold neither."""
    found = []
    for first in (k - 2, k - 1):  # intervals first, first + 1, first + 2 (interval j runs from tau[j] to tau[j+1])
        if first < 0 or first + 3 >= tau.size or not all(tau[j + 1] > tau[j] for j in range(first, first + 3)):
            continue
        middles = [float(tau[j] + tau[j + 1]) / 2 for j in range(first, first + 3)]
        rates = [float(cum[j + 1] - cum[j]) / float(tau[j + 1] - tau[j]) for j in range(first, first + 3)]
        slope0 = (rates[1] - rates[0]) / (middles[1] - middles[0])
        slope1 = (rates[2] - rates[1]) / (middles[2] - middles[1])
        found.append(2 * (slope1 - slope0) / (middles[2] - middles[0]))
    return sum(found) / len(found) if found else None


def trapezoid_error_j(grid_ns: NDArray[np.float64], curve_w: NDArray[np.float64]) -> float:
    """The expected error (J) of the trapezoids of a power gauge read at `grid_ns` (see the module doc): |ΔP|·h/2
    per interval, plus the power's change across the span times the gauge's averaging span."""
    import numpy as np

    steps = float(np.sum(np.abs(np.diff(curve_w)) * np.diff(grid_ns))) / 2 / 1e9
    return steps + abs(float(curve_w[-1] - curve_w[0])) * GAUGE_AVERAGING_S
