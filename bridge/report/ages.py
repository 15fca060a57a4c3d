"""How old a series' readings are: what the energy counter's own readings say of it.

A served value is the counter's at some instant before its scrape: its last update (NVML's counter holds each value
for 100 ms: measured on an H200 by scripts/check-gpu.sh, bench/RESULTS.md "A real GPU"), and, from an exporter, DCGM's
last sample of it (up to one refresh, `-c`, which a fresh series cannot show: every scrape sees a new value whether
DCGM sampled 10 or 300 ms before it). A reading k that lags its scrape by a_k sits P·(a_k − ā) below what its
neighbours say the counter was at its scrape time (ā their mean age): a least-squares quadratic through the
`_NEIGHBOURS` readings either side (the power's own curvature taken out) predicts it, and the readings' deviations
from their predictions carry their ages.

- Where the counter holds its value for a known period on a regular grid, a reading's age is the time since the grid's
  last instant: a sawtooth of its scrape time. `_fit_hold_grid` finds the grid's phase (and a slow drift of its
  period) from the deviations; each reading is then timed at the instant it shows.
- Whatever the fit leaves, or all of it where no grid fits, is described statistically (`Staleness`): the 95 % quantile
  of the difference between two readings' ages (the window's edges lie far apart: independent), and how far the mean
  age can be off, which moves both edges alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

# The normal distribution's scale from a median absolute deviation, and its two-sided 95 % point.
_SD_PER_MAD = 1.482602
_Z95 = 1.959964
# The 95 % quantile of the difference between two independent ages, each uniform over a range, as a share of it.
_APART95 = 1 - math.sqrt(0.05)
# Readings either side of one that its neighbours' quadratic predicts (~±1.3 s at AIPerf's 333 ms): enough for their
# ages to average out (a 333 ms scrape against a 100 ms counter update repeats its pattern every three readings).
_NEIGHBOURS = 4
# The hold grid's phase is searched in this many steps of its period, then refined between the best three.
_PHASES = 100
# The hold grid is fitted on at most this many readings, spread evenly over the window (with their neighbours): the
# fit's cost is these readings times the ~200 phases and periods tried, whatever the run's length (an hour at 3 Hz
# is 10,800 readings a GPU: 64 GPUs' fits took 26 CPU-s at the end of a run, bench/bench_longrun.py).
_FIT_READINGS = 300
# A drifting grid's period is searched (~90 fits for an hour) on fewer: its precision comes from their span.
_DRIFT_READINGS = 100
# Drifts of the hold grid's period searched where a fixed one does not fit: a clock off by up to ±0.5 %, first on
# the readings of a stretch this long (where the V about the true period spans ~0.5 % of it: a hold of walk).
_DRIFTS = (-5e-3, -3e-3, -2e-3, -1e-3, -5e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3)
_FIRST_SPAN_S = 20.0
# How far a GPU's update clock can run from the host's (DCGM's): the H200's update periods measured 100.0-100.2 ms
# on the host's clock (scripts/check-gpu.sh, bench/RESULTS.md "A real GPU"), a grid up to 0.2 % off.
CLOCK_DRIFT = 2e-3


@dataclass(frozen=True, slots=True)
class Staleness:
    """What is left unknown of the readings' ages (seconds)."""

    q95_s: float  # 95 % of the differences between two readings' ages lie within ± this
    shift_s: float  # the best estimate of the readings' mean age: the edges are read this much later
    mean_error_s: float  # how far the mean age can be from `shift_s`
    most_s: float  # the most any reading can lag (hard): the exporter's slowest possible refresh + the hold
    walk_s: float = 0.0  # 95 % of the time, a part no reading shows differs at most this much between the edges
    beneath: Beneath | None = None  # readings at one phase of the hold: what may hide beneath them, per window
    # A fitted hold grid's updates jitter about its instants by up to this (the fit's residual spread, ±): a reading
    # scraped this close to an update may show the update before it or the one after, a whole hold apart.
    near_s: float = 0.0

    def walk_between(self, start: int, end: int) -> float:
        """`walk_s`, or what hides beneath readings at one phase of the hold walks between edges at these instants."""
        return self.walk_s if self.beneath is None else self.beneath.walk_s(start, end)


class Beneath(NamedTuple):
    """Readings taken at nearly one phase of the counter's hold (scrapes every multiple of it: 0.1, 0.5, 1 s) all show
    about the same age, so their deviations show no hold, however old each value is (up to a hold). That age moves the
    two edges alike, but for the clocks' drift over the window (the scrapes on the host's clock, the updates on the
    GPU's, `CLOCK_DRIFT`), and by a whole update where the phase crosses one (a wrap: a scrape that sees two updates,
    or none, which the deviations show at `wraps_ns`, each within `reach_ns`). An exporter's refresh runs on the
    scrapes' clock: its age beneath them does not walk, and a wrap of it repeats a value, which the cadence shows."""

    hold_s: float
    drift: float  # how fast the hidden age can walk (s per s)
    wraps_ns: tuple[int, ...]
    reach_ns: int

    def walk_s(self, start: int, end: int) -> float:
        span_s = max(end - start, 0) / 1e9
        if any(start - self.reach_ns <= w <= end + self.reach_ns for w in self.wraps_ns):
            return self.hold_s + 0.95 * self.drift * span_s  # a wrap between the edges: a whole update, and the walk
        return _drift_walk(self.drift, span_s, self.hold_s)


class FreshAges(NamedTuple):
    instants_ns: NDArray[np.int64]  # each sample's time less its known age (its scrape time where none is known)
    stale: Staleness


class _Operator(NamedTuple):
    """The least-squares quadratic through each reading's neighbours, as weights: prediction = Σ weights·q[k + d]."""

    centre: NDArray[np.int64]
    offsets: tuple[int, ...]
    weights: NDArray[np.float64]  # (readings, neighbours)
    spread: NDArray[np.float64]  # √(the residual's variance over one reading's): the prediction's own noise too
    rate: NDArray[np.float64]  # the counter's rate there (per s)


class _Readings(NamedTuple):
    """The grid's fit on some readings: their times (each with its neighbours, where laid out), the neighbours'
    quadratic, and the readings' deviations from it."""

    t: NDArray[np.float64]
    operator: _Operator
    deviations: NDArray[np.float64]


def fresh_ages(ts: NDArray[np.int64], counter: NDArray[np.float64], hold_s: float, refresh_most_s: float,
               local: bool) -> FreshAges:
    """A fresh series' readings' ages. `refresh_most_s`: the slowest exporter refresh the data allows (0 for a local
    reader, `local`, whose reads show the counter's own hold alone)."""
    import numpy as np

    from bridge.report.stats import cumulative_increase

    most = refresh_most_s + hold_s
    valid = np.flatnonzero(~np.isnan(counter))
    t = (ts[valid] - ts[valid][0]).astype(np.float64) / 1e9 if valid.size else np.zeros(0)
    cum, _ = cumulative_increase(t, counter[valid])
    operator = _local_operator(t, cum)
    if operator is None:
        return FreshAges(ts, _unknown_age(most))
    deviations = _apply(operator, cum)
    # Readings at one phase of the hold show its ages only where they wrap, and a grid fitted to those alone is one of
    # many (a latency that drifts wraps them as a drifting clock does, but leaves every age as it was between wraps).
    beneath = _beneath(t, operator, deviations, hold_s, ts[valid])
    fit = None if beneath is not None else _fit_hold_grid(t, operator, deviations, hold_s)
    walking = 0.0 if local else _walking_refresh(t, counter[valid], refresh_most_s, hold_s)
    if fit is None:
        stale = _statistical(deviations, hold_s, most)
        if beneath is not None:  # the hold's mean age anywhere in it, the edges moved alike but for its walk
            stale = replace(stale, mean_error_s=max(stale.mean_error_s, hold_s), beneath=beneath)
        return FreshAges(ts, _with_walking(stale, walking))
    ages, walk = fit
    instants = ts.copy()
    instants[valid] = ts[valid] - np.round(ages * 1e9).astype(np.int64)
    left = _local_operator(t - ages, cum)
    rest = deviations if left is None else _apply(left, cum)
    spread = min(4 * _median_abs(rest), most)
    q95 = min(math.hypot(_q95_apart(rest, most), walk), most)  # (the walk: how well the readings pin the period)
    if local:  # the reads show the counter's own updates: nothing hides beneath the grid
        return FreshAges(instants, Staleness(q95, 0.0, spread / 2, most, near_s=spread / 2))
    # From an exporter the grid found may be DCGM's, locked to the counter's own, whose hold then hides beneath it.
    stale = Staleness(q95, hold_s / 2, hold_s / 2 + spread / 2, most, near_s=spread / 2)
    # Nothing tells whether the two clocks drift apart (a drift too slow to wrap within the run moves the hidden hold
    # slowly, and the neighbours' quadratic takes it up): the two edges' shares are independent.
    return FreshAges(instants, _with_walking(with_hidden(stale, hold_s), walking))


def _walking_refresh(t: NDArray[np.float64], counter: NDArray[np.float64], refresh_most_s: float,
                     hold_s: float) -> float:
    """How slow an exporter's refresh may be whose ages walk beneath a fresh series' readings unseen (s; 0: none).
    A refresh that divides the scrapes' spacing (dcgm-exporter's `-c 500` or `-c 1000` under scrapes every second)
    is read at nearly one phase of it: each value's age walks only with the scrapes' jitter, the neighbours' quadratic
    takes the walk up (and a hold grid fits it as well as a 100 ms one: both walk alike between wraps), and the two
    edges' ages can lie up to a refresh apart (tests/report/test_scrape_intervals.py).
    - Scrapes that see no new value, a median spacing longer than the hold apart (the counter moves while the GPU
      draws power), show a refresh at least that slow: one as slow as the new values' spacing (`refresh_most_s`).
    - Otherwise a refresh slower than half the spacing steps its phase by a share of itself each scrape, which the
      deviations show; one that divides it is at most half of it, and, as exporters' refreshes are whole holds
      (`-c` 100, 500, 1000 ms), only where the spacing is a whole number of holds within its own jitter (under AIPerf's
      333 ms a refresh's phase steps a third of a hold or more each scrape, which the deviations show)."""
    import numpy as np

    if refresh_most_s <= hold_s:
        return 0.0
    spacings = np.diff(t)
    same = np.flatnonzero(np.diff(counter) == 0)
    if same.size >= 2 and float(np.median(spacings[same])) > hold_s:
        return refresh_most_s
    typical = float(np.median(spacings))
    jitter = _SD_PER_MAD * _median_abs(spacings - typical)  # (robust: boundary scrapes at phase marks cut spacings)
    return refresh_most_s / 2 if abs(typical - hold_s * round(typical / hold_s)) < jitter else 0.0


def _with_walking(ages: Staleness, walking_s: float) -> Staleness:
    """`ages` with a refresh of up to `walking_s` beneath them: each edge's share anywhere in it (`with_hidden`), and
    the mean age up to that much further off."""
    if not walking_s:
        return ages
    return replace(with_hidden(ages, walking_s), mean_error_s=min(ages.mean_error_s + walking_s, ages.most_s))


def refresh_ages(t: NDArray[np.float64], cum: NDArray[np.float64], hold_s: float, span_s: float,
                 counter_clock: bool = False) -> Staleness:
    """The ages of a slow refresh's values at their refresh instants (`t` in seconds, `cum` reset-free), for a window
    `span_s` long: DCGM read the counter's last update, up to the hold before its sample, so the mean age lies anywhere
    in [0, hold]. DCGM's grid runs on the host's clock, the counter's on the GPU's, and one drifts against the other:
    the age beneath the refreshes walks by the drift over the window, which no refreshed value shows (it scales every
    rate alike), and wraps by a hold when one clock's update passes the other's, which the deviations show. The drift
    is at most `CLOCK_DRIFT`, and less than a hold over the readings' span where none wrapped.

    `counter_clock`: the refreshes are timed by the energy's clock, at the counter updates their values show
    (refresh.py `Cadence.energy_clock`): no walk is left beneath them, but a wrap between the edges moves them a whole
    hold apart."""
    operator = _local_operator(t, cum)
    if operator is None:
        return Staleness(_APART95 * hold_s, hold_s / 2, hold_s / 2, hold_s)
    deviations = _apply(operator, cum)
    ages = Staleness(_q95_apart(deviations, hold_s), hold_s / 2, hold_s / 2, hold_s)
    if _wraps(t, operator, deviations, hold_s):  # the edges' ages independent, uniform over the hold; or a hold apart
        # (a part every reading shares between wraps: not noise in the rates, as the walk below)
        return replace(ages, walk_s=hold_s if counter_clock else _APART95 * hold_s)
    if counter_clock:
        return ages
    return replace(ages, walk_s=_drift_walk(_unwrapped_drift(t, hold_s), span_s, hold_s))


def _unwrapped_drift(t: NDArray[np.float64], hold_s: float) -> float:
    """How far the two clocks can drift apart where the readings show no wrap: `CLOCK_DRIFT`, and less than a hold
    over their span."""
    return min(CLOCK_DRIFT, hold_s / max(float(t[-1] - t[0]), 1e-9))


def _drift_walk(drift: float, span_s: float, hold_s: float) -> float:
    """The drift anywhere within its most: the walk over `span_s` within 0.95 of its most, 95 % of the time (and no
    more than two independent ages' difference, where the most is a whole hold)."""
    return min(0.95 * drift * max(span_s, 0.0), _APART95 * hold_s)


def with_hidden(ages: Staleness, hidden_s: float) -> Staleness:
    """`ages` with a part of up to `hidden_s` that no reading shows and that may differ between the edges: uniform,
    independent, its difference's 95 % quantile (1 − √0.05) of its range, in quadrature."""
    return replace(ages, q95_s=math.hypot(ages.q95_s, _APART95 * hidden_s))


def _statistical(deviations: NDArray[np.float64], hold_s: float, most: float) -> Staleness:
    """No hold grid fits: the ages vary over `spread` (uniform over [0, L] has a median deviation of L/4). A part that
    no reading shows: up to the hold, where DCGM samples on a grid locked to the counter's own (so only where the
    exporter's refresh, `spread`, is at least as slow), and it may drift, unseen. So the mean age lies in
    [0, spread/2 + that]. With no grid to show that a hold exists (a counter that counts continuously has none, and a
    curve the quadratic misses widens `spread` too), the edges stay where they are and the whole range is uncertain."""
    spread = min(4 * _median_abs(deviations), most)
    hidden = min(hold_s, spread, max(most - spread, 0.0))
    return with_hidden(Staleness(_q95_apart(deviations, most), 0.0, min(spread / 2 + hidden, most), most), hidden)


def _unknown_age(most: float) -> Staleness:
    """Too few readings to tell: any age up to the most, the two edges' independent, the edges read where they are."""
    return Staleness(_APART95 * most, 0.0, most, most)


def _wraps(t: NDArray[np.float64], operator: _Operator, deviations: NDArray[np.float64], hold_s: float) -> bool:
    return bool(_wrapped(t, operator, deviations, hold_s).size)


def _wrapped(t: NDArray[np.float64], operator: _Operator, deviations: NDArray[np.float64],
             hold_s: float) -> NDArray[np.int64]:
    """The readings that show an age jumping by a hold (one clock drifting against the other). The neighbours'
    quadratic shares such a step out (on a regular grid the readings either side of it deviate by ±0.44 of it): a
    deviation of half what a hold's step in the middle of the readings makes of them."""
    import numpy as np

    if not deviations.size:
        return np.zeros(0, dtype=np.int64)
    step = float(np.max(np.abs(_age_deviations(operator, np.where(t > t[t.size // 2], hold_s, 0.0)))))
    return np.flatnonzero(np.abs(deviations) >= step / 2)


def _beneath(t: NDArray[np.float64], operator: _Operator, deviations: NDArray[np.float64], hold_s: float,
             at_ns: NDArray[np.int64]) -> Beneath | None:
    """What may hide beneath readings a hold at some phase would leave as they are: at its best phase its deviations'
    median under `hold_s / 50` (where `_fit_hold_grid` finds ages too small to fit). Where one would, their wraps
    (`_wraps`: a deviation of half a hold's step, at the readings that show it) and how fast the hidden age can walk
    (`CLOCK_DRIFT`, and less than a hold over the readings' span where none wrapped). None where a hold would show."""
    import numpy as np

    if not hold_s or not deviations.size:
        return None
    sampled = _spread_out(t, operator, deviations, _FIT_READINGS)
    phases = np.arange(_PHASES, dtype=np.float64) * (hold_s / _PHASES)
    shown = np.abs(_age_deviations(sampled.operator, _grid_ages(sampled.t[np.newaxis, :] - phases[:, np.newaxis],
                                                                  hold_s)))
    if float(np.min(np.median(shown, axis=1))) >= hold_s / 50:
        return None
    wrapped = _wrapped(t, operator, deviations, hold_s)
    times = at_ns[operator.centre]
    spacing = float(np.median(np.diff(times))) if times.size > 1 else 0.0
    drift = CLOCK_DRIFT if wrapped.size else _unwrapped_drift(t, hold_s)
    return Beneath(hold_s, drift, tuple(int(w) for w in times[wrapped]), round((_NEIGHBOURS + 1) * spacing))


def _median_abs(x: NDArray[np.float64]) -> float:
    import numpy as np

    return float(np.median(np.abs(x))) if x.size else 0.0


def _q95_apart(deviations: NDArray[np.float64], most: float) -> float:
    """The 95 % quantile of the difference between the ages of two readings far apart (as a window's edges are).
    Ages are bounded (a hold, a refresh): their differences have tails no heavier than the normal's, so the pairs' own
    95 % quantile is used where it is smaller than the normal's from their median (which stands where the power's steps
    fatten the pairs' tail)."""
    import numpy as np

    if not deviations.size:
        return _APART95 * most
    apart = np.abs(deviations - np.roll(deviations, deviations.size // 2))
    return min(_Z95 * _SD_PER_MAD * float(np.median(apart)), float(np.quantile(apart, 0.95)), most)


def _local_operator(t: NDArray[np.float64], cum: NDArray[np.float64]) -> _Operator | None:
    """The quadratic through each reading's `_NEIGHBOURS` either side, and the scale that turns a reading's deviation
    from it into seconds of age. None with too few readings."""
    import numpy as np

    n, w = t.size, _NEIGHBOURS
    if n < 2 * w + 8:
        return None
    centre = np.arange(w, n - w)
    offsets = tuple(d for d in range(-w, w + 1) if d)
    x = np.stack([t[centre + d] - t[centre] for d in offsets], axis=1)  # (m, 2w): times relative to the reading
    design = np.stack([np.ones_like(x), x, x * x], axis=-1)  # (m, 2w, 3)
    with np.errstate(all="ignore"):
        inverse = _inverse_3x3(design.transpose(0, 2, 1) @ design)
        weights = (inverse @ design.transpose(0, 2, 1))[:, 0, :]  # the quadratic's value at the reading
        span = x[:, -1] - x[:, 0]
        rate = (cum[centre + offsets[-1]] - cum[centre + offsets[0]]) / np.where(span > 0, span, np.nan)
        spread = np.sqrt(1 + inverse[:, 0, 0])
    keep = np.isfinite(spread) & np.isfinite(rate) & (rate > 0) & np.isfinite(weights).all(axis=1)
    if np.count_nonzero(keep) < 8:
        return None
    return _Operator(centre[keep], offsets, weights[keep], spread[keep], rate[keep])


def _inverse_3x3(m: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each symmetric 3×3 matrix's inverse, by its cofactors (an SVD a matrix cost ~50 µs: 0.5 s at the end of an hour
    at 3 Hz per GPU); the pseudo-inverse where one is near singular (fewer than three distinct neighbour times)."""
    import numpy as np

    a, b, c, d, e, f = m[:, 0, 0], m[:, 0, 1], m[:, 0, 2], m[:, 1, 1], m[:, 1, 2], m[:, 2, 2]
    co = np.stack([d * f - e * e, c * e - b * f, b * e - c * d, a * f - c * c, b * c - a * e, a * d - b * b], axis=1)
    det = a * co[:, 0] + b * co[:, 1] + c * co[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        inverse = co[:, [[0, 1, 2], [1, 3, 4], [2, 4, 5]]] / det[:, np.newaxis, np.newaxis]
    near = ~(np.abs(det) > 1e-9 * np.abs(a * d * f))
    if near.any():
        inverse[near] = np.linalg.pinv(m[near])
    return inverse


def _apply(operator: _Operator, cum: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per reading: how far below its neighbours' prediction the counter lies there, in seconds of the local power:
    the reading's age less its neighbours' mean (`_age_deviations`), the power's shape aside."""
    return _below(operator, cum) / operator.rate


def _age_deviations(operator: _Operator, ages: NDArray[np.float64]) -> NDArray[np.float64]:
    """What `_apply` gives for readings of these ages (seconds) and a steady power: a reading a_k old sits P·a_k below
    the truth, its neighbours' prediction P·Σ w·a below it."""
    return -_below(operator, ages)


def _below(operator: _Operator, q: NDArray[np.float64]) -> NDArray[np.float64]:
    """Along q's last axis (one row per candidate where q is 2-D)."""
    import numpy as np

    at = _columns(operator.centre, q)
    predicted = np.zeros((*q.shape[:-1], operator.centre.size))
    term = np.empty_like(predicted)
    for j, d in enumerate(operator.offsets):
        predicted += np.multiply(operator.weights[:, j], at(d), out=term)
    predicted -= at(0)
    predicted /= operator.spread
    return predicted


def _columns(centre: NDArray[np.int64], q: NDArray[np.float64]) -> Callable[[int], NDArray[np.float64]]:
    """q's values at the readings `d` places along, along its last axis: a strided view where the readings are evenly
    spaced (all of them, or laid out by `_spread_out`), a gathered copy otherwise (4x slower on the grid's phase
    scans, which are most of a report's time)."""
    import numpy as np

    m = centre.size
    step = int(centre[1] - centre[0]) if m > 1 else 1
    if step < 1 or (m > 2 and not np.all(np.diff(centre) == step)):
        return lambda d: q[..., centre + d]
    return lambda d: q[..., centre[0] + d:centre[0] + d + step * (m - 1) + 1:step]


def _fit_hold_grid(t: NDArray[np.float64], operator: _Operator, deviations: NDArray[np.float64],
                   hold_s: float) -> tuple[NDArray[np.float64], float] | None:
    """The readings' ages where the counter holds each value for `hold_s` on a regular grid, a = (t − φ) mod period,
    whose deviations (`_apply` of the ages, with the counter's sign) explain at least three quarters of the readings'
    (their median absolute residual at most half of theirs); and the walk the readings leave the ages' two ends (the
    halves' disagreement, `_walk`, or the period search's).
    A fixed period first; a drifting one where the fixed one fits neither the whole nor each half alike (a period off
    by 0.1 % walks 24 ms over a 24 s run, yet its median residual may stay small: bench/accuracy_groups.py, steady
    power on a drifting grid). None where no grid does (a continuous counter, an exporter's own refresh slower than
    the hold, too few readings)."""
    import numpy as np

    base = _median_abs(deviations)
    if not hold_s or base < hold_s / 50:  # (ages this small change nothing worth a grid)
        return None
    sampled = _spread_out(t, operator, deviations, _FIT_READINGS)
    period = hold_s
    loss, phase = _best_phase(*sampled, period)
    residual = _residual(sampled, period, phase)
    walk = math.inf if residual > base / 2 else _walk(sampled, period)  # (no fixed grid fits: no halves to compare)
    # A half's phase is pinned to about a period over its readings (the nearest ages either side of a grid instant).
    resolution = 2 * period / (sampled.operator.centre.size // 2)
    if walk > 2 * (residual + resolution):  # a drifting grid
        drifting, drifting_walk = _drifting_period(t, operator, deviations, hold_s)
        drifting_loss, drifting_phase = _best_phase(*sampled, drifting)
        if drifting_loss < loss:
            period, phase, walk = drifting, drifting_phase, drifting_walk
            residual = _residual(sampled, period, phase)
    if residual > base / 2:
        return None
    return np.mod(t - phase, period), walk


def _walk(readings: _Readings, period: float) -> float:
    """How far the ages of the readings' two ends can be off each other where the period is: the best phases of the
    first and the second half of the readings differ by the period's error times half their span, which the window's
    edges (a whole span apart) show twice over."""
    half = readings.operator.centre.size // 2
    first = _best_phase(*_part(readings, slice(0, half)), period)[1]
    second = _best_phase(*_part(readings, slice(half, None)), period)[1]
    apart = (second - first) % period
    return 2 * min(apart, period - apart)


def _drifting_period(t: NDArray[np.float64], operator: _Operator, deviations: NDArray[np.float64],
                     hold_s: float) -> tuple[float, float]:
    """The period of a hold grid whose clock drifts against the scrapes'. Over a span T a period off by δ·period walks
    δ·T, so the loss is V-shaped about the true period only within about a quarter hold of walk: the period is
    searched first on the readings of a short stretch at the middle (`_FIRST_SPAN_S`: every drift of `_DRIFTS` and
    none), then on stretches twice as long, each about the last one's best within its reach. Returns the period and
    the walk its uncertainty allows over the readings' span (seconds)."""
    import numpy as np

    times = t[operator.centre]
    middle, whole = (times[0] + times[-1]) / 2, times[-1] - times[0]
    span = min(_FIRST_SPAN_S, whole)

    def on(span: float) -> tuple[_Readings, Callable[[float], float]]:
        inside = np.flatnonzero(np.abs(times - middle) <= span / 2)
        readings = _spread_out(t, _rows(operator, inside), deviations[inside], _DRIFT_READINGS)
        return readings, lambda period: _best_phase(*readings, period)[0]

    readings, loss = on(span)
    best = min((hold_s * (1 + drift) for drift in (0.0, *_DRIFTS)), key=loss)
    reach = hold_s * hold_s / span / 2  # (the V's half-width is a quarter hold of walk over the span: twice that)
    lo, hi = _narrowed(loss, best - reach, best + reach, 8)
    best = min(best, (lo + hi) / 2, key=loss)
    while span < whole:  # each longer stretch: the last best is within the last V's reach
        span = min(2 * span, whole)
        readings, loss = on(span)
        candidates = np.linspace(best - reach, best + reach, 5)  # (half a reach apart: the next V's width)
        best = float(min(candidates, key=loss))
        lo, hi = _narrowed(loss, best - reach / 2, best + reach / 2, 5)
        best = min(best, (lo + hi) / 2, key=loss)
        reach = hold_s * hold_s / span / 2
    # The loss falls in steps, a reading's quarter hold each, as readings cross grid instants: the periods within
    # one step of the least are all the readings allow, their middle the best guess, their spread the walk left over
    # the span.
    periods = np.linspace(best - reach / 2, best + reach / 2, 21)
    losses = np.array([loss(period) for period in periods])
    allowed = periods[losses <= losses.min() + hold_s / 4 / readings.deviations.size]
    step = periods[1] - periods[0]
    return float(np.mean(allowed)), float(allowed[-1] - allowed[0] + step) / hold_s * whole


def _rows(operator: _Operator, keep: NDArray[np.int64]) -> _Operator:
    return _Operator(operator.centre[keep], operator.offsets, operator.weights[keep], operator.spread[keep],
                     operator.rate[keep])


def _part(readings: _Readings, rows: slice) -> _Readings:
    """Some of the readings' rows, their laid-out times kept whole (the operator indexes into them)."""
    import numpy as np

    keep = np.arange(readings.operator.centre.size)[rows]
    return _Readings(readings.t, _rows(readings.operator, keep), readings.deviations[keep])


def _narrowed(loss: Callable[[float], float], lo: float, hi: float, rounds: int) -> tuple[float, float]:
    """[lo, hi] narrowed about `loss`'s minimum by a golden-section search: by 0.618 a round, one evaluation each."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    loss_a, loss_b = loss(a), loss(b)
    for _ in range(rounds):
        if loss_a <= loss_b:
            hi, b, loss_b = b, a, loss_a
            a = hi - ratio * (hi - lo)
            loss_a = loss(a)
        else:
            lo, a, loss_a = a, b, loss_b
            b = lo + ratio * (hi - lo)
            loss_b = loss(b)
    return lo, hi


def _spread_out(t: NDArray[np.float64], operator: _Operator, deviations: NDArray[np.float64], most: int) -> _Readings:
    """At most `most` of the operator's readings, evenly spread, each with its neighbours laid out beside it (times
    repeated where neighbourhoods overlap): the same problem on fewer readings, for the grid's fit."""
    import numpy as np

    n, w = operator.centre.size, _NEIGHBOURS
    if n <= most and t.size <= n + 2 * w:  # (every reading's: nothing to spare)
        return _Readings(t, operator, deviations)
    keep = np.linspace(0, n - 1, min(n, most)).round().astype(np.int64)
    block = np.arange(-w, w + 1)
    laid = t[(operator.centre[keep][:, np.newaxis] + block).ravel()]
    centre = np.arange(keep.size, dtype=np.int64) * block.size + w
    return _Readings(laid, _rows(operator, keep)._replace(centre=centre), deviations[keep])


def _best_phase(t: NDArray[np.float64], operator: _Operator, deviations: NDArray[np.float64],
                period: float) -> tuple[float, float]:
    """(the loss, the phase) of the hold grid of `period` that best explains the deviations: the mean absolute
    residual, each reading's at most a quarter hold (one given the update either side of an instant, by its jitter
    or a step of the power, counts no more). A mean, not a median: a median moves only where a reading crosses a grid
    instant, and stayed flat over periods 0.1 % apart on 20 s of readings (bench/accuracy_groups.py, steady power)."""
    import numpy as np

    def scan(phases: NDArray[np.float64]) -> tuple[float, float]:
        ages = _grid_ages(t[np.newaxis, :] - phases[:, np.newaxis], period)  # one row per phase
        residuals = _below(operator, ages)  # (deviations − _age_deviations, in place: exactly the same)
        residuals += deviations
        np.abs(residuals, out=residuals)
        losses = np.minimum(residuals, period / 4, out=residuals).mean(axis=1)
        k = int(np.argmin(losses))
        return float(losses[k]), float(phases[k])

    step = period / _PHASES
    loss, phase = scan(np.arange(_PHASES, dtype=np.float64) * step)
    # Refine about the best step twice (the loss is V-shaped about the true phase): to 1e-5 of the period.
    for _ in range(2):
        loss, phase = scan(phase + np.linspace(-step, step, 41, dtype=np.float64))
        step /= 20
    return loss, phase % period


def _grid_ages(x: NDArray[np.float64], period: float) -> NDArray[np.float64]:
    """x mod period for the phase scans, as x − period·⌊x / period⌋: 15x faster than numpy's `mod` (which computes
    each floating remainder exactly), within ~1e-14 s of it and a rounding either side of [0, period)."""
    import numpy as np

    ages = np.divide(x, period)
    np.floor(ages, out=ages)
    ages *= period
    return np.subtract(x, ages, out=ages)


def _residual(readings: _Readings, period: float, phase: float) -> float:
    """The median absolute residual of the readings' deviations from a hold grid's."""
    ages = _grid_ages(readings.t - phase, period)
    return _median_abs(readings.deviations - _age_deviations(readings.operator, ages))
