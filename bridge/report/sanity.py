"""Counter sanity (interpolated mode): an energy counter's impossible values are dropped and counted before any
delta is read from it.

- A value that is negative or not finite is rejected.
- A value that falls below half of the counter's high-water mark and comes back to it later is a glitch (one
  scrape that read 0, a torn read): every low value of the dip is dropped. A reset stays low and grows again
  from there; a low stretch that reaches the end of the data without growing cannot be told from a glitch and
  is held as uncertain (dropped, counted: the verdict says so).
- An increase above the longest time the two values can be apart × the higher of 2 × the highest power the gauge
  showed nearby and what any accelerator board can draw (4 kW) is rejected (a 1e308 read). The time is taken from
  the brackets: a value first seen at scrape k was sampled after scrape k−1, so two values first seen at scrapes a
  and k are at most t[k] − t[a−1] apart.

AIPerf mode never sees this: its per-GPU values stay AIPerf's own (DECISIONS.md "Counters").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge.report.refresh import energy_keys
from bridge.report.series import Series
from bridge.report.stats import RESET_FRACTION

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

# Power can at most double between what the gauge showed and what the counter drew (a burst between readings)...
_POWER_MARGIN = 2.0
# ...and a gauge read between bursts, or averaged over a second (nvmlDeviceGetPowerUsage), can show far less than a
# burst drew: an increase is only impossible beyond what any accelerator board draws. The largest announced
# packages (2025-26: NVIDIA B300 / GB300 ~1.4 kW, AMD MI355X 1.4 kW, NVIDIA Rubin Ultra ~3.6 kW) stay under 4 kW.
_MOST_ANY_BOARD_W = 4000.0


@dataclass(frozen=True, slots=True)
class CounterCheck:
    values: NDArray[np.float64]  # the counter with every dropped value NaN (the input itself when none was)
    glitches: int = 0  # values of dips that came back to the earlier level
    rejected: int = 0  # negative, not finite, or an implausible increase
    held: int = 0  # a low stretch at the end of the data: a glitch or a reset, nobody can tell
    # The sample times of the dropped values, by kind (glitch, rejected, held), for the verdict's window.
    times: tuple[tuple[str, int], ...] = ()

    @property
    def dropped(self) -> int:
        return self.glitches + self.rejected + self.held

    def between(self, start: int, end: int) -> dict[str, int]:
        """How many values of each kind were dropped at sample times in [start, end]."""
        out = {"glitches": 0, "rejected": 0, "held": 0}
        for kind, t in self.times:
            if start <= t <= end:
                out[kind] += 1
        return out


def sanitize(series: Sequence[Series]) -> tuple[list[Series], dict[tuple[str, tuple[str, str | None]], CounterCheck]]:
    """Every series with its energy counter checked (interpolated mode), and the checks that dropped something,
    by (endpoint, GPU identity). A series whose counter changed gets a new timestamp view, so that no cadence
    computed from the raw values is reused for it (refresh.series_cadence keys on the array)."""
    import dataclasses

    out: list[Series] = []
    checks: dict[tuple[str, tuple[str, str | None]], CounterCheck] = {}
    for s in series:
        energy_key, power_key = energy_keys(s.values)
        counter = s.values.get(energy_key)
        check = None if counter is None else check_counter(s.timestamps, counter, s.values.get(power_key))
        if check is None or not check.dropped:
            out.append(s)
            continue
        checks[(s.endpoint, s.meta.identity)] = check
        out.append(dataclasses.replace(s, timestamps=s.timestamps[:], values={**s.values, energy_key: check.values}))
    return out, checks


def check_counter(ts: NDArray[np.int64], counter_mj: NDArray[np.float64],
                  power_w: NDArray[np.float64] | None) -> CounterCheck:
    """The energy counter (MJ) with its impossible values dropped; `power_w` aligned with `ts` (None: no gauge,
    increases are not checked)."""
    import numpy as np

    present = ~np.isnan(counter_mj)
    bad = present & (~np.isfinite(counter_mj) | (counter_mj < 0))
    at = np.flatnonzero(present & ~bad)
    v = counter_mj[at]
    steps = np.diff(v)
    implausible = _implausible(ts, at, v, power_w)
    if not bad.any() and bool(np.all(steps >= 0)) and not implausible.any():
        return CounterCheck(counter_mj)
    values = counter_mj.copy()
    values[bad] = math.nan
    kinds = _walk(ts, at, v, power_w)
    values[at[kinds != ""]] = math.nan
    times = sorted([("rejected", int(t)) for t in ts[bad].tolist()]
                   + [(str(kind), int(t)) for kind, t in zip(kinds[kinds != ""].tolist(), ts[at[kinds != ""]].tolist(),
                                                            strict=True)], key=lambda kt: kt[1])
    count = {kind: sum(1 for k, _ in times if k == kind) for kind in ("glitches", "rejected", "held")}
    return CounterCheck(values, count["glitches"], count["rejected"], count["held"], tuple(times))


def _implausible(ts: NDArray[np.int64], at: NDArray[np.int64], v: NDArray[np.float64],
                 power_w: NDArray[np.float64] | None) -> NDArray[np.bool_]:
    """Per step of `v` (the valid values at indices `at`): more than the power nearby can have drawn. Vectorised
    over the refreshes (the fast path every sane counter takes): "nearby" is the stretch of the previous value,
    the one before it and the new one."""
    import numpy as np

    flags = np.zeros(max(v.size - 1, 0), dtype=bool)
    if power_w is None or v.size < 2:
        return flags
    changes = np.flatnonzero(np.diff(v) != 0) + 1
    if not changes.size:
        return flags
    starts = np.concatenate(([0], changes))  # where each value was first seen
    with np.errstate(invalid="ignore"):
        stretch = np.fmax.reduceat(power_w[at], starts)  # NaN only where a stretch has no power at all
    before = np.concatenate(([np.nan], stretch[:-1]))
    nearby = np.fmax(np.fmax(stretch, before), np.concatenate(([np.nan], before[:-1])))[1:]
    t = ts[at]
    previous = starts[:-1]
    since = np.where(previous > 0, t[np.maximum(previous - 1, 0)], t[0] - _longest_bracket(ts, at, v))
    elapsed_s = (t[changes] - since) / 1e9
    with np.errstate(invalid="ignore", over="ignore"):  # (a 1e308 read overflows to inf: implausible too)
        increase_j = (v[changes] - v[changes - 1]) * 1e6
        ceiling = np.maximum(_POWER_MARGIN * np.maximum(nearby, 0.0), _MOST_ANY_BOARD_W)
        flags[changes - 1] = (increase_j > 0) & (increase_j > ceiling * elapsed_s)
    return flags


def _plausible(ts: NDArray[np.int64], at: NDArray[np.int64], power_w: NDArray[np.float64], a: int, k: int,
               increase_mj: float, first_bracket_ns: int) -> bool:
    """Whether `increase_mj` from the value first seen at position `a` to the one at `k` fits the power nearby
    (`first_bracket_ns`: how long before the first scrape its value can have been sampled, `_longest_bracket`)."""
    import numpy as np

    lo, hi = at[max(a - 1, 0)], at[min(k + 1, at.size - 1)]
    nearby = power_w[lo: hi + 1]
    if not np.isfinite(nearby).any():
        return True
    top = float(np.nanmax(nearby))
    since = int(ts[at[a - 1]]) if a > 0 else int(ts[at[0]]) - first_bracket_ns
    elapsed_s = (int(ts[at[k]]) - since) / 1e9
    return increase_mj * 1e6 <= max(_POWER_MARGIN * max(top, 0.0), _MOST_ANY_BOARD_W) * elapsed_s


def _longest_bracket(ts: NDArray[np.int64], at: NDArray[np.int64], v: NDArray[np.float64]) -> int:
    """How long before the first scrape its value can have been sampled: the longest any value stayed unchanged
    plus one scrape spacing (the refresh is at most that slow, as far as the data tells)."""
    import numpy as np

    t = ts[at]
    if not t.size:
        return 0
    changes = np.concatenate(([0], np.flatnonzero(np.diff(v) != 0) + 1))  # where each value was first seen
    last = np.concatenate((changes[1:], [t.size])) - 1  # and last seen
    spacing = int(np.max(np.diff(t))) if t.size > 1 else 0
    return int(np.max(t[last] - t[changes])) + spacing


def _walk(ts: NDArray[np.int64], at: NDArray[np.int64], v: NDArray[np.float64],
          power_w: NDArray[np.float64] | None) -> NDArray[np.str_]:
    """Per valid value, why it is dropped ("glitches", "rejected", "held") or "" when kept — value by value."""
    import numpy as np

    kinds = np.full(v.size, "", dtype="<U8")
    keep = np.ones(v.size, dtype=bool)
    first_bracket = _longest_bracket(ts, at, v)  # once: it does not depend on the value being looked at
    mark, mark_at = (float(v[0]), 0) if v.size else (0.0, 0)
    k = 1
    while k < v.size:
        value = float(v[k])
        if value < mark * RESET_FRACTION:
            back = np.flatnonzero(v[k + 1:] >= mark)
            if back.size:  # a glitch: the counter returns to where it was
                stop = k + 1 + int(back[0])
                keep[k:stop] = False
                kinds[k:stop] = "glitches"
                k = stop
                continue
            if not bool(np.any(v[k + 1:] > value)):  # low to the end, never growing: cannot tell
                keep[k:] = False
                kinds[k:] = "held"
                break
            mark, mark_at = value, k  # a reset: the counter runs again from here
        elif value > mark:
            if power_w is not None and not _plausible(ts, at, power_w, _first_seen_kept(v, keep, mark_at), k,
                                                       value - mark, first_bracket):
                keep[k] = False
                kinds[k] = "rejected"
            else:
                mark, mark_at = value, k
        k += 1
    return kinds


def _first_seen_kept(v: NDArray[np.float64], keep: NDArray[np.bool_], k: int) -> int:
    while k > 0 and keep[k - 1] and v[k - 1] == v[k]:
        k -= 1
    return k
