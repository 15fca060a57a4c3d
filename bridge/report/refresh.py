"""DCGM's refresh cadence, read from the recording, and counters timed at their refresh, not at our scrape.

dcgm-exporter does not read the GPU when it is scraped: its collectors have DCGM watch their fields with an
update frequency of the collect interval, `-c` / `DCGM_EXPORTER_INTERVAL` ms, 30 000 by default
(NVIDIA/dcgm-exporter `pkg/cmd/app.go`, flag `collect-interval`; the collectors call
`WatchDeviceFields(..., int64(config.CollectInterval)*1000)`, in µs), and a scrape returns DCGM's latest
samples. Between two DCGM samples every scrape repeats the same values, and the page carries no sample time.

So a value that first appears at scrape k was sampled after scrape k−1 (which still had the old one) and no
later than scrape k: its sample instant lies in the bracket (t[k−1], t[k]]. DCGM samples a watched field
periodically, so the brackets of a run's new values line up on a grid `phase + j·period`, which the fit below
recovers far more precisely than any one bracket; each new value is timed at the grid instant inside its
bracket.

- `Cadence`: per series, how many scrapes brought a new value and the period between them. When (nearly)
  every scrape brings one, the values are fresh and the scrape time is the sample time (`fresh`).
- `refreshed_delta`: a counter's increase over [start, end] from its values timed at their refresh, read
  between refreshes by cubic Hermite interpolation when the power gauge gives the energy counter's slope at
  each refresh (linear otherwise), with a bound on how far each edge can move.
- The bound at an edge: the counter cannot decrease (between resets), so its true value at the edge lies
  between the last value known to be sampled at or before it and the first known to be sampled at or after
  it; beyond the last refresh seen, the counter grows by at most 1.5 × the highest rate seen.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from bridge.report.ages import FreshAges, fresh_ages, refresh_ages
from bridge.report.uncertainty import GAUGE_AVERAGING_S, GridSpread, fresh_uncertainty, refreshed_uncertainty
from bridge.sources import COUNTER_HOLD_S, LOCAL_SOURCES

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from bridge.report.stats import CounterDelta

T = TypeVar("T")

# A series is fresh when at least this share of its scrapes brought a new value (DCGM refreshes at least
# as often as we scrape: the scrape time is the sample time, to within the refresh period).
FRESH_SHARE = 0.75
# The grid is trusted when at least this share of the brackets holds one of its instants.
_GRID_FIT = 0.8
# Beyond the last refresh seen, the counter grows by at most this many times the highest rate seen.
_RATE_MARGIN = 1.5
# A window shorter than this many refresh periods rests on too few refreshes (the report says so).
MIN_REFRESHES_PER_WINDOW = 2.0
ENERGY_KEY = "nvidia_energy_consumption"  # MJ
POWER_KEY = "nvidia_power_usage"  # W
INSTANT_POWER_KEY = "nvidia_power_usage_instant"  # W
# AIPerf's AMD pair, in the same units (AIPerf's amd_energy_consumption is MJ, amd_power W): one GPU's series carries
# one vendor's pair, and every rule here (cadence, bound, uncertainty, sanity, totals) reads it the same way.
VENDOR_KEYS = {"nvidia": (ENERGY_KEY, POWER_KEY), "amd": ("amd_energy_consumption", "amd_power")}


def slope_key(values: Mapping[str, object]) -> str:
    """The gauge that gives the energy counter's rate at a refresh: DCGM's instant power where the exporter serves it
    (DCGM_FI_DEV_POWER_USAGE_INSTANT, field 157), else the power gauge, which on Ampere and newer (but GA100) is a
    one-second trailing average (nvmlDeviceGetPowerUsage, NVML API reference) and lags a swing by half a second."""
    power = energy_keys(values)[1]
    return INSTANT_POWER_KEY if power == POWER_KEY and INSTANT_POWER_KEY in values else power


def energy_keys(values: Mapping[str, object]) -> tuple[str, str]:
    """(energy counter, power gauge) keys of one GPU's series: AMD's where it carries one of them and no NVIDIA
    one, else NVIDIA's."""
    amd = VENDOR_KEYS["amd"]
    if ENERGY_KEY not in values and POWER_KEY not in values and (amd[0] in values or amd[1] in values):
        return amd
    return ENERGY_KEY, POWER_KEY


@dataclass(frozen=True, slots=True)
class Cadence:
    """How often DCGM refreshed a series' values, as the scrapes saw it."""

    scrapes: int  # scrapes with a value
    refreshes: int  # distinct refreshes seen: the first scrape and every scrape that brought a new value
    period_ns: float | None  # between refreshes; None with fewer than two new values
    phase_ns: float | None = None  # one refresh instant of the fitted grid (None: no regular grid)
    at_least: bool = False  # the period is a lower bound: fewer than two new values were seen
    # How far the fitted grid can move while every bracket still holds one of its instants (ns; None: no grid, or
    # one the brackets do not all agree with): its phase at the chosen period, and its period, turning the grid
    # about `pivot_ns` (the middle of the brackets); where the energy's clock sets the period, its period spread
    # is that clock's two standard errors.
    phase_spread_ns: float | None = None
    period_spread_ns: float | None = None
    pivot_ns: float | None = None
    # The period is the energy's clock (`_measured_period`): the refreshes are then timed at the counter updates their
    # values show, on the GPU's clock, so no drift of that clock against DCGM's is left beneath them.
    energy_clock: bool = False
    # Indices (into the series' samples) of the scrapes that brought a new refresh.
    new: NDArray[np.int64] | None = field(default=None, repr=False, compare=False)

    @property
    def fresh(self) -> bool:
        """Every scrape (nearly) brought a new value, or nothing says otherwise: timing by scrape is right."""
        if self.scrapes < 2 or self.period_ns is None:
            return True
        return (self.refreshes - 1) >= FRESH_SHARE * (self.scrapes - 1)

    @property
    def period_s(self) -> float | None:
        return None if self.period_ns is None else self.period_ns / 1e9

    def instant(self, lo: float, hi: float) -> float:
        """The best estimate of the sample instant of a value first seen at `hi`, last absent at `lo`."""
        mid = (lo + hi) / 2
        if self.phase_ns is None or not self.period_ns:
            return mid
        grid = self.phase_ns + self.period_ns * round((mid - self.phase_ns) / self.period_ns)
        return min(max(grid, lo), hi)

    def instant_spread(self, t: float) -> float | None:
        """How far the grid instant nearest `t` can be from the true refresh instant (None: no agreed grid)."""
        if self.phase_spread_ns is None or self.period_spread_ns is None or self.pivot_ns is None \
                or not self.period_ns:
            return None
        return self.phase_spread_ns / 2 + abs(t - self.pivot_ns) / self.period_ns * self.period_spread_ns

    @property
    def grid_spread(self) -> GridSpread | None:
        """How far the fitted grid can move (None: no grid every bracket agrees with)."""
        if self.phase_spread_ns is None or self.period_spread_ns is None or self.pivot_ns is None \
                or not self.period_ns:
            return None
        return GridSpread(self.phase_spread_ns, self.period_spread_ns, self.pivot_ns, self.period_ns)

    def instant_before(self, t: float) -> float:
        """The latest refresh instant at or before `t` (a series' first value, sampled before it was seen)."""
        if self.phase_ns is None or not self.period_ns:
            return t - (self.period_ns or 0.0) / 2
        return self.phase_ns + self.period_ns * math.floor((t - self.phase_ns) / self.period_ns)


FRESH = Cadence(0, 0, None)


def changes(ts: NDArray[np.int64], rows: NDArray[np.float64]) -> NDArray[np.int64]:
    """Indices k ≥ 1 where any row differs from sample k−1 (NaN equals NaN: a blank is not a new value)."""
    import numpy as np

    if ts.size < 2:
        return np.zeros(0, dtype=np.int64)
    a, b = rows[:, :-1], rows[:, 1:]
    differ = (a != b) & ~(np.isnan(a) & np.isnan(b))
    return np.flatnonzero(differ.any(axis=0)) + 1


def cadence_of(ts: NDArray[np.int64], rows: NDArray[np.float64], *, counting: bool = True,
               energy: NDArray[np.float64] | None = None, power: NDArray[np.float64] | None = None,
               averaging_s: float = 0.0, ends: NDArray[np.int64] | None = None) -> Cadence:
    """The cadence of one series from the rows (fields) that change at every refresh. `counting`: one of the
    rows is the energy counter, which no refresh leaves unchanged (a GPU draws power even when idle), so a
    long stretch without a new value is a refresh at least that slow, not a quiet GPU. `energy` (MJ) and `power`
    (W), aligned with `ts`, measure the time between refreshes too (`_durations`), which pins the period down
    where the brackets alone leave it loose (a few refreshes, scrapes in step with them); `averaging_s`, how long a
    span the power reading may be a trailing average of (`_measured_period`). `ends`: when each scrape was complete
    (a response read its values between its start and its end: a refresh lies after the start of the last scrape
    without it and before the end of the first with it)."""
    import numpy as np

    seen = np.flatnonzero(~np.isnan(rows).all(axis=0))
    new = seen[changes(ts[seen], rows[:, seen])]  # (indices into all the samples)
    previous = seen[np.searchsorted(seen, new) - 1]
    scrapes, refreshes = int(seen.size), int(new.size) + (1 if seen.size else 0)
    if new.size < 2:
        longest = _longest_unchanged(ts[seen], new, seen) if counting else None
        return Cadence(scrapes, refreshes, longest, new=new, at_least=longest is not None)
    if new.size >= FRESH_SHARE * (scrapes - 1):  # fresh: the mean spacing says enough (no sort of every gap)
        return Cadence(scrapes, refreshes, float(ts[new[-1]] - ts[new[0]]) / (new.size - 1), new=new)
    lo = ts[previous].astype(np.float64)
    hi = (ts if ends is None else ends)[new].astype(np.float64)
    mids = (lo + hi) / 2
    durations = None if energy is None or power is None else _durations(energy[new], power[new])
    period = _rough_period(mids, durations)
    cadence = Cadence(scrapes, refreshes, period, new=new)
    if cadence.fresh or period <= 0:
        return cadence
    clock = None if durations is None or power is None else (durations, power[new])
    return _fit_grid(cadence, lo, hi, mids, clock, averaging_s)


def _rough_period(mids: NDArray[np.float64], durations: NDArray[np.float64] | None) -> float:
    """The period the grid fit starts from: the energy's own clock (the median time between refreshes that the
    energy drawn and the power say) where it lies within the brackets' spacings, else their median spacing. (With
    scrapes a little faster than the refresh, 333 ms against 500 ms, the brackets lie one or two scrape intervals
    apart, never one period: the fit, which searches within 10 % of where it starts, then finds no grid or a wrong
    one. A counter that disagrees with its gauge says nothing of the period.)"""
    import numpy as np

    gaps = np.diff(mids)
    if durations is not None:
        finite = durations[np.isfinite(durations)]
        clock = float(np.median(finite)) if finite.size >= 2 else math.nan
        if float(np.min(gaps)) <= clock <= float(np.max(gaps)):
            return clock
    return float(np.median(gaps))


def _durations(energy: NDArray[np.float64], power: NDArray[np.float64]) -> NDArray[np.float64]:
    """The time between consecutive refreshes, from what DCGM read at them: the energy drawn (MJ) over the mean
    of the two powers (W), in ns (a trapezoid: exact for power that moves linearly between them). NaN where
    it cannot tell (a reset, no power)."""
    import numpy as np

    drawn = np.diff(energy) * 1e6
    mean = (power[1:] + power[:-1]) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        seconds = np.where((drawn > 0) & (mean > 0), drawn / mean, np.nan)
    return seconds * 1e9


def _longest_unchanged(t: NDArray[np.int64], new: NDArray[np.int64], seen: NDArray[np.int64]) -> float | None:
    """With fewer than two new values: the longest stretch of scrapes that saw one value (a lower bound on the
    period), when it spans at least four scrapes."""
    import numpy as np

    cuts = np.searchsorted(seen, new)
    bounds = np.concatenate(([0], cuts, [t.size]))
    longest = max(((int(b) - int(a), float(t[b - 1] - t[a])) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
                   if b > a), default=(0, 0.0))
    return longest[1] if longest[0] >= 4 and longest[1] > 0 else None


def _fit_grid(cadence: Cadence, lo: NDArray[np.float64], hi: NDArray[np.float64], mids: NDArray[np.float64],
              clock: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None,
              averaging_s: float = 0.0) -> Cadence:
    """The grid `phase + j·period` that best fits the brackets, kept when most brackets hold one of its instants.

    Each new value gets its refresh number j from the step since the previous one (a missed refresh is a step
    of two). For a trial period P, the phases every bracket allows are [max(lo − P·j), min(hi − P·j)]; the
    overshoot max(lo − P·j) − min(hi − P·j) is convex in P, so a ternary search finds the period that every
    bracket (or, with a late response, nearly every one) agrees with, and the phase is the middle of the
    allowed range. `clock`: the measured durations between refreshes (`_durations`) and the power at each refresh,
    where the energy can time them (`_measured_period`).
    """
    import numpy as np

    assert cadence.period_ns is not None
    rough = cadence.period_ns
    steps = np.maximum(np.round(np.diff(mids) / rough), 1.0)
    j = np.concatenate(([0.0], np.cumsum(steps)))
    lo0, hi0 = lo - lo[0], hi - lo[0]  # relative: keeps float64 exact
    scratch = np.empty_like(j)  # (the search calls overshoot ~250 times: no temporaries, no dispatch per call)

    def overshoot(period: float) -> float:
        np.multiply(period, j, out=scratch)
        latest = np.subtract(lo0, scratch).max()
        return float(latest - np.subtract(hi0, scratch, out=scratch).min())

    a, b = 0.9 * rough, 1.1 * rough
    for _ in range(100):
        m1, m2 = a + (b - a) / 3, b - (b - a) / 3
        if overshoot(m1) <= overshoot(m2):
            b = m2
        else:
            a = m1
    period = (a + b) / 2
    period_spread = 0.0  # (brackets that disagree, a late response among them: the grid misses by `overshoot`)
    energy_clock = False
    if overshoot(period) < 0:  # every bracket agrees with a range of periods: take the middle of it
        low, high = _root(overshoot, period, 0.9 * rough), _root(overshoot, period, 1.1 * rough)
        period = (low + high) / 2
        period_spread = (high - low) / 2
        measured = None if clock is None else _measured_period(*clock, steps, averaging_s)
        # The energy's clock, where the brackets agree and it is the sharper of the two (the brackets leave the
        # period anywhere in [low, high]; the energy's durations wander with power swings between refreshes).
        # Its spread is then its own: two standard errors (~95 %), within the brackets' range.
        if measured is not None and low <= measured[0] <= high and measured[1] < (high - low) / math.sqrt(12):
            period = measured[0]
            period_spread = min(math.hypot(2 * measured[1], measured[2]), max(high - period, period - low))
            energy_clock = True
    phase = (np.max(lo0 - period * j) + np.min(hi0 - period * j)) / 2
    grid = phase + period * j
    slack = 1e6  # 1 ms: times are request starts
    inside = float(np.mean((grid >= lo0 - slack) & (grid <= hi0 + slack)))
    if inside < _GRID_FIT:
        return cadence
    return replace(cadence, period_ns=float(period), phase_ns=float(lo[0] + phase),
                   phase_spread_ns=abs(overshoot(period)), period_spread_ns=period_spread, energy_clock=energy_clock,
                   pivot_ns=float(lo[0] + phase + period * j[-1] / 2))


def _measured_period(durations: NDArray[np.float64], power: NDArray[np.float64],
                     steps: NDArray[np.float64], averaging_s: float = 0.0) -> tuple[float, float, float] | None:
    """The period the energy measures, its standard error, and how far a power reading's averaging may bias it:
    the mean of the durations between consecutive refreshes (steps of one, near their median), each corrected for
    the power's curvature; None with fewer than four of them.

    A trapezoid's energy is off by −P''·h³/12 (the leading term of the Euler-Maclaurin formula), so a duration
    measured with it is off by −P''·h³/(12·P̄); P'' is the gauge's second difference at the interval's two
    refreshes (their mean, where their neighbours are one step away). What the correction leaves is not
    independent from one interval to the next: a power swing the refreshes sample at an alias, or a step's kink
    shared out between neighbours, leaves errors that largely cancel in the mean. The standard error is
    therefore Newey and West's (Econometrica 55, 1987: the Bartlett-weighted autocovariances, never negative) with
    ⌈n^⅓⌉ lags, the rate Andrews (Econometrica 59, 1991) finds best for that kernel, where the plain one (lag 0
    alone) overstates the error of a mean whose terms cancel.

    A power reading that is a trailing average over A (`averaging_s`: nvmlDeviceGetPowerUsage on Ampere and newer)
    reads P'·A/2 low on a slope, so each duration reads h·P'·A/(2P̄) = A·ΔP/(2P̄) long (ΔP the readings' change over
    the interval), the same way all along a ramp. Whether the reading is such an average the data does not say: the
    durations stand as read (exact for an instant reading), and the lag's mean, which no number of intervals averages
    away, is the bias's size (the period's spread holds it; which clock is sharper is the standard error's call).
    """
    import numpy as np

    single = (steps == 1) & np.isfinite(durations)
    if np.count_nonzero(single) < 4:
        return None
    h = float(np.median(durations[single]))
    power = np.where(power > 0, power, np.nan)  # (a zero reading is a glitch: no curvature from it)
    second = np.full(power.size, np.nan)  # P'' at each refresh whose neighbours are both one step away
    second[1:-1] = np.where((steps[:-1] == 1) & (steps[1:] == 1), (power[2:] - 2 * power[1:-1] + power[:-2]) / h**2,
                            np.nan)
    ends = np.vstack((second[:-1], second[1:]))  # per interval, at its two refreshes
    known = np.count_nonzero(np.isfinite(ends), axis=0)
    curvature = np.where(known > 0, np.nansum(ends, axis=0) / np.maximum(known, 1), np.nan)
    corrected = durations + h**3 * curvature / (12 * (power[:-1] + power[1:]) / 2)
    keep = single & np.isfinite(corrected) & (np.abs(durations - h) <= 0.2 * h)
    if np.count_nonzero(keep) < 4:
        return None
    measured = corrected[keep]
    return float(np.mean(measured)), _newey_west_error(measured), averaging_s * 1e9 * _drift_per_mean(power) / 2


def _drift_per_mean(power: NDArray[np.float64]) -> float:
    """|ΔP|/P̄ a refresh: the least-squares line through the power readings (one a refresh) against their mean (a
    line through them all, not the last less the first: one noisy reading at an end would read as a trend)."""
    import numpy as np

    k = np.flatnonzero(np.isfinite(power))
    if k.size < 3:
        return 0.0
    p = power[k]
    slope = float(np.polyfit(k.astype(np.float64), p, 1)[0])
    mean = float(np.mean(p))
    return abs(slope) / mean if mean > 0 else 0.0


def _newey_west_error(x: NDArray[np.float64]) -> float:
    """The standard error of the mean of a series whose terms may be correlated (Newey-West, ⌈n^⅓⌉ lags)."""
    import numpy as np

    n = x.size
    d = x - np.mean(x)
    lags = math.ceil(n ** (1 / 3))
    covariance = [float(d[: n - j] @ d[j:]) / n for j in range(lags + 1)]
    variance = covariance[0] + 2 * sum((1 - j / (lags + 1)) * covariance[j] for j in range(1, lags + 1))
    return math.sqrt(max(variance, 0.0) / n)


def _root(f: Callable[[float], float], inside: float, outside: float) -> float:
    """Where the convex `f` crosses 0 between `inside` (f < 0) and `outside` (or `outside` if it never does)."""
    if f(outside) < 0:
        return outside
    for _ in range(60):
        middle = (inside + outside) / 2
        inside, outside = (middle, outside) if f(middle) < 0 else (inside, middle)
    return (inside + outside) / 2


# (id(timestamps), and id(ends) where the series has them) -> their cadence; (id(timestamps), id(counter), …) -> the
# counter's readings' ages. An entry is removed when one of its arrays is freed (`weakref.finalize`), so an id that
# numpy reuses for a new array never finds the old array's entry (numpy arrays are not hashable: no value key).
_CADENCES: dict[tuple[int, ...], Cadence] = {}
_AGES: dict[tuple[object, ...], FreshAges] = {}


def _while_alive(store: dict[Any, T], key: Any, arrays: Sequence[NDArray[Any]], compute: Callable[[], T]) -> T:
    """`store[key]`, computed once and kept while every one of `arrays` lives."""
    found = store.get(key)
    if found is None:
        found = compute()
        if len(store) > 4096:
            store.clear()
        store[key] = found
        for array in arrays:
            weakref.finalize(array, store.pop, key, None)
    return found


def series_cadence(ts: NDArray[np.int64], values: Mapping[str, NDArray[np.float64]],
                   ends: NDArray[np.int64] | None = None) -> Cadence:
    """A series' cadence from its energy counter (no refresh leaves it unchanged while the GPU draws power, and
    DCGM may watch other fields at other rates), else its power gauge, else every field it has. Kept while the
    series' timestamp array lives: the report asks for it per metric block, per endpoint, for the energy and
    per phase. `ends`: the scrapes' ends (`Series.ends`)."""
    arrays = (ts,) if ends is None else (ts, ends)
    return _while_alive(_CADENCES, tuple(map(id, arrays)), arrays, lambda: _series_cadence(ts, values, ends))


# (digest of the times' bytes, of the counter's, …) -> the readings' ages, and whether their instants are the
# times themselves (no age known: `read_at` then reads at the edges as they are), for the latest few series: reports
# built again over the same records (other windows over one log, as the replays and the accuracy tests build them)
# fit each series once.
_AGES_BY_VALUE: dict[tuple[object, ...], tuple[FreshAges, bool]] = {}
_AGES_BY_VALUE_KEPT = 16


def _fresh_ages(ts: NDArray[np.int64], counter: NDArray[np.float64], most_s: float, local: bool) -> FreshAges:
    """`ages.fresh_ages`, kept while the series' arrays live: the fit depends on the series alone, and the report
    reads each GPU's energy for its metrics, the run's totals and every phase; and by the arrays' bits for the
    latest series (the same bits give the same fit)."""
    def by_value() -> FreshAges:
        key = (_digest(ts), _digest(counter), most_s, local)
        found = _AGES_BY_VALUE.pop(key, None)  # (re-inserted below: the newest last)
        if found is None:
            ages = fresh_ages(ts, counter, COUNTER_HOLD_S, most_s, local)
            found = ages, ages.instants_ns is ts
            while len(_AGES_BY_VALUE) >= _AGES_BY_VALUE_KEPT:
                del _AGES_BY_VALUE[next(iter(_AGES_BY_VALUE))]
        _AGES_BY_VALUE[key] = found
        ages, scrape_times = found
        return ages._replace(instants_ns=ts) if scrape_times else ages

    return _while_alive(_AGES, (id(ts), id(counter), most_s, local), (ts, counter), by_value)


def _digest(array: NDArray[Any]) -> tuple[str, tuple[int, ...], bytes]:
    import numpy as np

    from bridge.digest import blake2b

    return array.dtype.str, array.shape, blake2b(np.ascontiguousarray(array).data, digest_size=16).digest()


def source_cadence(endpoint: str, ts: NDArray[np.int64], values: Mapping[str, NDArray[np.float64]],
                   ends: NDArray[np.int64] | None = None) -> Cadence:
    """`series_cadence`, except for a local reader (bridge.sources `LOCAL_SOURCES`: NVML's counter holds for
    100 ms): the values it holds between updates are that hold, not a DCGM refresh, and its reads are timed by
    their scrape (fresh), the hold covered by the readings' ages (`ages.fresh_ages`). Timed as a refresh grid
    instead, an H200's counter read every 73 ms found no grid (its updates drift against any fixed
    period) and understated the cool-down's error (bench/RESULTS.md, "A real GPU")."""
    if endpoint in LOCAL_SOURCES:
        return Cadence(int(ts.size), int(ts.size), None)
    return series_cadence(ts, values, ends)


def _series_cadence(ts: NDArray[np.int64], values: Mapping[str, NDArray[np.float64]],
                    ends: NDArray[np.int64] | None) -> Cadence:
    import numpy as np

    energy_key, power_key = energy_keys(values)
    energy = values.get(energy_key)
    marker = energy if energy is not None else values.get(power_key)
    if marker is not None:
        rows = marker[None, :]
    elif values:
        rows = np.stack(list(values.values()))
    else:
        return Cadence(int(ts.size), int(ts.size), None)
    slope = slope_key(values)  # (the energy's clock: the power at each refresh)
    averaging = 0.0 if slope == INSTANT_POWER_KEY else GAUGE_AVERAGING_S
    return cadence_of(ts, rows, counting=energy is not None, energy=energy, power=values.get(slope),
                      averaging_s=averaging, ends=ends)


def field_periods(ts: NDArray[np.int64], values: Mapping[str, NDArray[np.float64]],
                  cadence: Cadence) -> dict[str, float]:
    """Fields DCGM refreshes on a slower grid of their own (seconds): their new values come at a regular spacing
    over 1.5 × the series' period. (A field that merely changes seldom, a temperature in whole degrees, changes
    at irregular multiples of the period and is not listed.)"""
    import numpy as np

    if cadence.period_ns is None or cadence.at_least or cadence.fresh:
        return {}
    out: dict[str, float] = {}
    for key, column in values.items():
        seen = np.flatnonzero(~np.isnan(column))
        new = seen[changes(ts[seen], column[None, seen])]
        if new.size < 4:
            continue
        gaps = np.diff(ts[new]).astype(np.float64)
        typical = float(np.median(gaps))
        regular = float(np.mean(np.abs(gaps - typical) <= 0.25 * typical)) >= 0.8
        if regular and typical > 1.5 * cadence.period_ns:
            out[key] = typical / 1e9
    return out


def refreshes_in(ts: NDArray[np.int64], rows: NDArray[np.float64], start: int, end: int) -> int:
    """Distinct refreshes among the samples in [start, end]: what a gauge's statistics rest on."""
    import numpy as np

    lo = int(np.searchsorted(ts, start, side="left"))
    hi = int(np.searchsorted(ts, end, side="right"))
    if hi <= lo:
        return 0
    return 1 + int(changes(ts[lo:hi], rows[:, lo:hi]).size)


@dataclass(frozen=True, slots=True)
class RefreshedDelta:
    delta: float
    resets: int
    bound: float  # how far the delta can be from the truth, from how far each edge can move
    uncertainty: float = 0.0  # the error the data supports (bridge/report/uncertainty.py), at most `bound`


def refreshed_delta(ts: NDArray[np.int64], values: NDArray[np.float64], cadence: Cadence, start: int, end: int,
                    slope: NDArray[np.float64] | None = None, resolution: float = 0.0,
                    hold_s: float = 0.0, ends: NDArray[np.int64] | None = None) -> RefreshedDelta | None:
    """A counter's increase over [start, end] with its values timed at their refresh (see the module doc).

    `slope` (aligned with `ts`, counter units per second; for the energy counter, the power gauge in MJ/s)
    gives the counter's rate at each refresh instant; `resolution`, the counter's step (for the uncertainty and
    the bound); `hold_s`, how long the counter holds a value (DCGM sampled it up to that late: the refreshes' ages,
    `ages.refresh_ages`, move the edges by their mean, widen each edge's bound by the rest and enter the
    uncertainty); `ends`, the scrapes' ends (a refresh first seen at a scrape lies before its end). None when the
    counter has no value at all.
    """
    import numpy as np

    from bridge.report.stats import cumulative_increase

    valid = ~np.isnan(values)
    t, v = ts[valid], values[valid]
    if t.size == 0:
        return None
    ended = t if ends is None else ends[valid]
    base = float(t[0])
    if cadence.fresh:  # every sample is its own refresh, sampled when scraped
        obs = np.arange(t.size)
        tau = lo = hi = t.astype(np.float64) - base
        slope = None
    else:  # the first value, then every new refresh of the series (the counter's value may repeat in one)
        new = np.flatnonzero(v[1:] != v[:-1]) + 1  # (and may change where the markers' did not)
        if cadence.new is not None and cadence.new.size:
            at = np.flatnonzero(valid)
            where = np.minimum(np.searchsorted(at, cadence.new), at.size - 1)
            same = (at[where] == cadence.new) & (where > 0)
            new = np.union1d(new, where[same])
        obs = np.concatenate(([0], new))
        lo = np.concatenate(([-math.inf], t[new - 1].astype(np.float64)))
        hi = ended[obs].astype(np.float64)
        tau = np.array([cadence.instant_before(float(ended[0]))]
                       + [cadence.instant(a, b) for a, b in zip(lo[1:].tolist(), hi[1:].tolist(), strict=True)])
        tau = np.maximum.accumulate(tau - base)  # relative: float64 exact to the ns
        lo, hi = lo - base, hi - base
    rate = None
    if slope is not None:
        s = slope[valid][obs] * 1e-9  # per ns
        rate = np.where(np.isnan(s) | (s < 0), np.nan, s)
    cum, resets = cumulative_increase(tau, v[obs], rate)
    hold = None
    if hold_s:  # the refreshes' ages: their spread from the data, their mean anywhere in [0, hold]
        hold = refresh_ages(tau / 1e9, cum, hold_s, (end - start) / 1e9, cadence.energy_clock)
    shift = 0.0 if hold is None else hold.shift_s * 1e9
    e0, e1 = float(start) - base + shift, float(end) - base + shift
    at0, bound0 = _edge(tau, cum, rate, lo, hi, e0)
    at1, bound1 = _edge(tau, cum, rate, lo, hi, e1)
    if hold is not None:  # the rest of the hold either way, at the highest rate near each edge, and the step
        late = float(_top_rate(tau, cum, rate)) * max(hold.most_s - hold.shift_s, hold.shift_s) * 1e9
        bound0 += late + resolution
        bound1 += late + resolution
    expected = refreshed_uncertainty(tau, cum, rate, lo, hi, (e0, e1), (bound0, bound1), cadence.grid_spread, int(base),
                                     resolution, lambda a, b, at: read_between(tau, cum, rate, a, b, at), hold)
    return RefreshedDelta(float(max(at1 - at0, 0.0)), resets, bound0 + bound1, expected)


# The energy counter's step: DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counts whole mJ (1e-9 MJ), as NVML's
# nvmlDeviceGetTotalEnergyConsumption does.
ENERGY_RESOLUTION_MJ = 1e-9


@dataclass(frozen=True, slots=True)
class WindowDelta:
    """A counter's increase over the window as the report gives it; for the energy counter, its hard bound and the
    expected error (bridge/report/uncertainty.py), both in the counter's unit."""

    delta: CounterDelta | RefreshedDelta | None
    bound: float | None = None
    uncertainty: float | None = None


def window_delta(ts: NDArray[np.int64], values: Mapping[str, NDArray[np.float64]], key: str, cadence: Cadence,
                 start: int, end: int, fresh: CounterDelta, grace_ns: int = 0, endpoint: str = "",
                 ends: NDArray[np.int64] | None = None) -> WindowDelta:
    """A counter's increase over [start, end] as the report gives it, and, for the energy counter, its bound and
    uncertainty: `fresh` (the scrape-timed delta, not None) when the series' values are fresh, else the delta
    timed at DCGM's refreshes (the power gauge as the energy's slope). The one rule behind the per-GPU metrics
    (telemetry_data.py) and the run's energy totals (energy.py).

    The energy counter's readings are never taken as fresher than the data shows: each lags its scrape by the
    counter's hold (bridge/sources `COUNTER_HOLD_S`) and, from an exporter, by up to one of its refreshes
    (`ages.fresh_ages`); a fresh series is read at the edges moved by its readings' mean age. Where the scrapes'
    ends are known (`ends`), a response may have read its values as late as its end: a refresh is bracketed by them,
    an edge's bound floored by them, and a fresh series' edge readings may be that much newer (`_lateness`)."""
    energy_key, _ = energy_keys(values)
    energy = key == energy_key
    power = values.get(slope_key(values)) if energy else None
    if not energy:
        if cadence.fresh:
            return WindowDelta(fresh)
        return WindowDelta(refreshed_delta(ts, values[key], cadence, start, end, ends=ends))
    if cadence.fresh:
        from bridge.report.stats import counter_delta_interpolated

        local = endpoint in LOCAL_SOURCES
        ages = _fresh_ages(ts, values[key], 0.0 if local else _slowest_refresh(ts, cadence), local)
        stale, shown = ages.stale, ages.instants_ns  # each reading at the instant it shows, where its age is known
        shift = round(stale.shift_s * 1e9)
        once, counter, late = _first_showings(shown, values[key], _lateness(ts, shown, ends, stale.near_s))
        read = counter_delta_interpolated(once, counter, start + shift, end + shift,
                                          _reaching(once, end + shift, grace_ns + shift)) or fresh
        edge_bounds = stale_edge_bounds(ts, values[key], start, end, read_at(shown, ts, (start + shift, end + shift)),
                                        round(stale.most_s * 1e9), ends)
        if edge_bounds is None:
            return WindowDelta(read)
        expected = fresh_uncertainty(once, counter, start + shift, end + shift, edge_bounds, ENERGY_RESOLUTION_MJ,
                                     stale, late)
        return WindowDelta(read, sum(edge_bounds), expected)
    # Timed at DCGM's refreshes: each refresh read the counter's last update, up to the hold before it.
    timed = refreshed_delta(ts, values[key], cadence, start, end, None if power is None else power * 1e-6,  # W → MJ/s
                            ENERGY_RESOLUTION_MJ, COUNTER_HOLD_S, ends)
    if timed is None:
        return WindowDelta(timed)
    return WindowDelta(timed, timed.bound, timed.uncertainty)


def _reaching(t: NDArray[np.int64], end: int, grace_ns: int) -> int:
    """The grace, or as far as the first reading at or after `end` (`t`: valid readings, in time order) where one
    lies beyond it: the end is read between the readings either side of it, as the uncertainty takes it.
    Extrapolating the last interval's rate past a reading that exists can leave the range the readings allow (a burst
    that ends at the edge, read every 1 s)."""
    import numpy as np

    after = int(np.searchsorted(t, end, side="left"))
    return max(grace_ns, int(t[after]) - end) if after < t.size else grace_ns


def _first_showings(shown: NDArray[np.int64], values: NDArray[np.float64], late: NDArray[np.float64] | None = None
                    ) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64] | None]:
    """The valid readings, each update once: readings of the same update show the same instant, and a line read
    through two readings at one instant has no slope to extrapolate with (`late`, per reading, alongside)."""
    import numpy as np

    valid = np.flatnonzero(~np.isnan(values))
    t = shown[valid]
    first = np.ones(t.size, dtype=bool)
    first[1:] = t[1:] != t[:-1]
    return t[first], values[valid][first], None if late is None else late[valid][first]


def _lateness(ts: NDArray[np.int64], shown: NDArray[np.int64], ends: NDArray[np.int64] | None,
              near_s: float = 0.0) -> NDArray[np.float64] | None:
    """How far from the instant it is read at (`shown`) each reading's value may be (s). A response reads its values
    between its scrape's start and its end (dcgm-exporter gathers from DCGM as it serves a request; a local reader
    reads field after field): timed at its scrape's start, up to the response's length newer. Timed at an update of
    the fitted hold grid (`ages.fresh_ages`): a later update where one fell before the response ended (whole holds),
    and a hold either way for a reading scraped within the grid's jitter (`near_s`) of an update. None: neither."""
    import numpy as np

    if shown is ts:
        return None if ends is None else (ends - ts).astype(float) / 1e9
    whole = 0.0 if ends is None else COUNTER_HOLD_S * ((ends - shown).astype(float) / 1e9 // COUNTER_HOLD_S)
    age = (ts - shown).astype(float) / 1e9
    near = (age < near_s) | (age > COUNTER_HOLD_S - near_s)
    return np.maximum(whole, np.where(near, COUNTER_HOLD_S, 0.0))


def _slowest_refresh(ts: NDArray[np.int64], cadence: Cadence) -> float:
    """The slowest exporter refresh (s) a fresh series allows: nearly every scrape saw a new value, so DCGM sampled
    at least that often (the mean spacing of the new values)."""
    import numpy as np

    if cadence.period_ns is not None:
        return cadence.period_ns / 1e9
    return float(np.median(np.diff(ts))) / 1e9 if ts.size >= 2 else 0.0


def read_at(shown: NDArray[np.int64], ts: NDArray[np.int64], instants: tuple[int, int]) -> tuple[int, int]:
    """Where on the scrapes' clock the counter is read for `instants` on the readings' own (`shown`): the same
    fraction of the way between the same two readings."""
    import numpy as np

    if shown is ts:
        return instants
    a, b = (float(np.interp(float(i), shown.astype(np.float64), ts.astype(np.float64))) for i in instants)
    return round(a), round(b)


def stale_edge_bounds(ts: NDArray[np.int64], values: NDArray[np.float64], start: int, end: int,
                      at: tuple[int, int], most_ns: int, ends: NDArray[np.int64] | None = None
                      ) -> tuple[float, float] | None:
    """How far the counter's true value at each edge can be from its reading (read at `at`, on the scrapes' clock),
    for readings that lag their scrape by up to `most_ns`: the truth lies between the last reading at or before the
    edge (its value is older still) and the first one scraped `most_ns` after it, plus the counter's step (it counts
    whole mJ, rounding down). Where the scrapes' `ends` are known, a reading may be as new as its end: the floor is
    the last reading whose scrape ended by the edge. None: no valid sample."""
    import numpy as np

    from bridge.report.stats import cumulative_increase

    valid = ~np.isnan(values)
    t, v = ts[valid], values[valid]
    if t.size == 0:
        return None
    e = t if ends is None else ends[valid]
    cum, _ = cumulative_increase(t, v)
    return tuple(_stale_edge_bound(t, e, cum, edge, read, most_ns) + ENERGY_RESOLUTION_MJ  # type: ignore[return-value]
                 for edge, read in zip((start, end), at, strict=True))


def _stale_edge_bound(t: NDArray[np.int64], e: NDArray[np.int64], cum: NDArray[np.float64], edge: int, at: int,
                      most_ns: int) -> float:
    import numpy as np

    n = int(t.size)
    if n < 2:
        return 0.0
    rel = (t - t[0]).astype(np.float64)
    rate = _RATE_MARGIN * _highest_rate(rel, cum, most_ns, None if e is t else (e - t[0]).astype(np.float64))  # per ns
    before = int(np.searchsorted(e, edge, side="right")) - 1
    after = int(np.searchsorted(t, edge + most_ns, side="left"))
    floor = float(cum[before]) if before >= 0 else float(cum[0]) - rate * float(e[0] - edge + most_ns)
    ceiling = float(cum[after]) if after < n else float(cum[-1]) + rate * float(edge + most_ns - t[-1])
    x = float(at - t[0])
    value = float(np.interp(x, rel, cum)) if rel[0] <= x <= rel[-1] else (
        float(cum[0]) - rate * (rel[0] - x) if x < rel[0] else float(cum[-1]) + rate * (x - rel[-1]))
    value = min(max(value, floor), ceiling)
    return float(max(value - floor, ceiling - value))


def _highest_rate(rel: NDArray[np.float64], cum: NDArray[np.float64], most_ns: int,
                  ended: NDArray[np.float64] | None = None) -> float:
    """The highest mean rate the readings allow, per ns. Readings that lag their scrapes by up to `most_ns` can show an
    update between two scrapes a few ms apart: each reading is paired with the first at least 2·`most_ns` later, whose
    values are at least `most_ns` apart in truth. `ended`: the scrapes' ends (relative as `rel`), where a value may be
    as new as its end: a pair then lies apart from the first one's end."""
    import numpy as np

    newest = rel if ended is None else ended
    if most_ns <= 0 and ended is None:
        return max(float(np.max(np.diff(cum) / np.maximum(np.diff(rel), 1.0))), 0.0)
    later = np.searchsorted(rel, newest + 2 * max(most_ns, 1), side="left")
    paired = np.flatnonzero(later < rel.size)
    if not paired.size:  # the readings span less: their whole span, less the lag
        span = float(rel[-1] - newest[0]) - most_ns
        return max(float(cum[-1] - cum[0]) / max(span, float(most_ns), 1.0), 0.0)
    spans = rel[later[paired]] - newest[paired] - most_ns
    return max(float(np.max((cum[later[paired]] - cum[paired]) / spans)), 0.0)


def fresh_bound(ts: NDArray[np.int64], values: NDArray[np.float64], start: int, end: int) -> float | None:
    """The bound `refreshed_delta` gives fresh values (each scrape its own sample), from the two samples around
    each edge only (the report pays this for every GPU at shutdown): between them the counter can be anywhere
    from one to the other, so an edge read by interpolation at fraction f of the interval can be off by
    max(f, 1 − f) of its increase; past the data, by 1.5 × the nearest interval's rate × the gap."""
    edges = fresh_edge_bounds(ts, values, start, end)
    return None if edges is None else sum(edges)


def fresh_edge_bounds(ts: NDArray[np.int64], values: NDArray[np.float64], start: int,
                      end: int) -> tuple[float, float] | None:
    """`fresh_bound`'s two terms, one per edge (None: no valid sample)."""
    import numpy as np

    valid = ~np.isnan(values)
    t, v = ts[valid], values[valid]
    if t.size == 0:
        return None
    return fresh_edge_bound(t, v, start), fresh_edge_bound(t, v, end)


def fresh_edge_bound(t: NDArray[np.int64], v: NDArray[np.float64], edge: int) -> float:
    """`fresh_bound`'s term for one edge, over the valid samples `t`, `v`."""
    import numpy as np

    from bridge.report.stats import RESET_FRACTION

    n = int(t.size)
    i = int(np.searchsorted(t, edge, side="right"))  # the first sample after the edge
    if 0 < i < n:
        t0, t1, v0, v1 = int(t[i - 1]), int(t[i]), float(v[i - 1]), float(v[i])
        if t0 == edge or t1 <= t0:
            return 0.0  # read at a sample
        step = v1 if v1 < v0 * RESET_FRACTION else max(v1 - v0, 0.0)  # a reset counts from zero
        f = (edge - t0) / (t1 - t0)
        return max(f, 1.0 - f) * step
    if n >= 2:
        a, b = (0, 1) if i == 0 else (n - 2, n - 1)
        span = int(t[b] - t[a])
        rate = max(float(v[b] - v[a]), 0.0) / span if span > 0 else 0.0
        return _RATE_MARGIN * rate * abs(edge - int(t[a if i == 0 else b]))
    return 0.0


def _edge(tau: NDArray[np.float64], cum: NDArray[np.float64], rate: NDArray[np.float64] | None,
          lo: NDArray[np.float64], hi: NDArray[np.float64], edge: float) -> tuple[float, float]:
    """(the cumulative increase read at `edge`, how far the truth can be from it)."""
    import numpy as np

    n = tau.size
    top = _top_rate(tau, cum, rate)
    # Known at or before the edge: first seen by then. Known at or after: still absent at a scrape after it.
    before = int(np.searchsorted(hi, edge, side="right")) - 1
    after = int(np.searchsorted(lo, edge, side="left"))
    floor = float(cum[before]) if before >= 0 else float(cum[0]) - top * (hi[0] - edge)
    last_absent = float(lo[-1]) if math.isfinite(lo[-1]) else float(tau[-1])  # (the first value: its instant)
    ceiling = float(cum[after]) if after < n else float(cum[-1]) + top * max(edge - last_absent, 0.0)
    value = _read(tau, cum, rate, edge)
    value = min(max(value, floor), ceiling)
    return float(value), float(max(value - floor, ceiling - value))


def _top_rate(tau: NDArray[np.float64], cum: NDArray[np.float64], rate: NDArray[np.float64] | None) -> float:
    import numpy as np

    rates = [0.0]
    if tau.size >= 2:
        dt = np.diff(tau)
        ok = dt > 0
        if ok.any():
            rates.append(float(np.max(np.diff(cum)[ok] / dt[ok])))
    if rate is not None and np.isfinite(rate).any():
        rates.append(float(np.nanmax(rate)))
    return _RATE_MARGIN * max(rates)


def _read(tau: NDArray[np.float64], cum: NDArray[np.float64], rate: NDArray[np.float64] | None,
          edge: float) -> float:
    """The cumulative increase at `edge`: Hermite (or linear) between refreshes, extrapolated outside."""
    import numpy as np

    n = tau.size
    if n == 1:
        r = rate[0] if rate is not None and np.isfinite(rate[0]) else 0.0
        return float(cum[0] + r * (edge - tau[0]))
    if edge <= tau[0]:
        return float(cum[0] - _reach(tau, cum, rate, 0, 1, tau[0] - edge))
    if edge >= tau[-1]:
        return float(cum[-1] + _reach(tau, cum, rate, n - 1, n - 2, edge - tau[-1]))
    i = min(int(np.searchsorted(tau, edge, side="right")) - 1, n - 2)
    h = float(tau[i + 1] - tau[i])
    c0, c1 = float(cum[i]), float(cum[i + 1])
    if h <= 0:
        return c1
    x = (edge - float(tau[i])) / h
    m0 = float(rate[i]) if rate is not None else math.nan
    m1 = float(rate[i + 1]) if rate is not None else math.nan
    if math.isnan(m0) or math.isnan(m1):
        return c0 + (c1 - c0) * x
    secant = (c1 - c0) / h
    # Fritsch-Carlson: slopes of at most 3 × the secant keep the cubic monotone between the two refreshes.
    if secant <= 0:
        m0 = m1 = 0.0
    else:
        scale = min(1.0, 3 * secant / max(m0, m1, 1e-300))
        m0, m1 = m0 * scale, m1 * scale
    x2, x3 = x * x, x * x * x
    value = ((2 * x3 - 3 * x2 + 1) * c0 + (x3 - 2 * x2 + x) * h * m0
             + (-2 * x3 + 3 * x2) * c1 + (x3 - x2) * h * m1)
    return min(max(value, c0), c1)


def read_between(tau: NDArray[np.float64], cum: NDArray[np.float64], rate: NDArray[np.float64] | None, a: int, b: int,
                 edge: float) -> float:
    """`_read` from refreshes a and b alone (the uncertainty reads each refresh from its neighbours this way)."""
    pair = [a, b]
    return _read(tau[pair], cum[pair], None if rate is None else rate[pair], edge)


def _reach(tau: NDArray[np.float64], cum: NDArray[np.float64], rate: NDArray[np.float64] | None,
           at: int, neighbour: int, gap: float) -> float:
    """The counter's growth over `gap` beyond refresh `at`: the rate there (the power gauge), else the
    neighbouring interval's mean rate; never negative. (A trend fitted to the last interval did worse over a
    slow refresh: the power has turned by the time the next refresh comes.)"""
    r = float(rate[at]) if rate is not None else math.nan
    if math.isnan(r):
        h = abs(float(tau[at] - tau[neighbour]))
        r = abs(float(cum[at] - cum[neighbour])) / h if h > 0 else 0.0
    return max(r, 0.0) * gap


def endpoint_cadence(cadences: Sequence[Cadence]) -> Cadence:
    """An endpoint's cadence: its GPUs are collected together, so the series with most scrapes speaks for it."""
    if not cadences:
        return FRESH
    return max(cadences, key=lambda c: (c.scrapes, c.refreshes))
