"""Run-level energy: `nvidia_total_gpu_energy` (J), `nvidia_average_gpu_power` (W), `nvidia_total_gpu_power`
(W), and, when the benchmark JSON holds token/request counts (and its concurrency), the rest of AIPerf 0.13's
energy-efficiency family with its tags, units and order (AIPerf 0.13.0,
ai-dynamo/aiperf `src/aiperf/metrics/energy_efficiency_analyzer.py`).

Totals are per vendor, as AIPerf's (`vendor`: `nvidia_*` from NVIDIA GPUs, `amd_*` from AMD GPUs, never one summed
into the other), by the same rules: an AMD GPU's `amd_energy_consumption` (MJ) and `amd_power` (W) are read as an
NVIDIA GPU's counter and gauge (bridge/report/refresh.py `energy_keys`).

Sums run over GPU identities: device-level fields (power, energy) are carried only by a GPU's own record,
never by its MIG instances', so nothing is counted twice.
- `aiperf`: AIPerf's EnergyEfficiencyAnalyzer: energy = Σ AIPerf counter deltas over [start, end + grace];
  average power = energy / (end − start); with no energy counter at all, energy = Σ avg power × duration.
- `interpolated`: energy = Σ interpolated counter increases over exactly [start, end], timed at DCGM's refresh
  when the values are not fresh (bridge/report/refresh.py), with a bound and an uncertainty (the sums of the
  GPUs'; bridge/report/uncertainty.py), each GPU's counter cross-checked against its power integral; a GPU with
  no usable counter (none, or fewer than two refreshes in the window) contributes the integral of its power
  instead, labelled (per GPU, not all-or-nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.report.refresh import (
    ENERGY_RESOLUTION_MJ,
    MIN_REFRESHES_PER_WINDOW,
    VENDOR_KEYS,
    Cadence,
    energy_keys,
    source_cadence,
    window_delta,
)
from bridge.report.series import Series
from bridge.report.stats import counter_delta_aiperf, counter_delta_interpolated, gauge_mean
from bridge.report.uncertainty import trapezoid_error_j
from bridge.report.window import Window
from bridge.samples import CounterMode

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

_MJ_TO_J = 1e6
# The counter and the power integral disagree when they differ by more than this many times their combined
# expected error (issue 27).
DISAGREE_FACTOR = 3.0


@dataclass(frozen=True, slots=True)
class GpuEnergy:
    """One GPU's energy over the window (interpolated mode): what it came from, and how good it is."""

    endpoint: str
    identity: tuple[str, str | None]
    joules: float | None
    source: str  # counter | power_integral | unavailable
    uncertainty_j: float | None = None
    bound_j: float | None = None  # hard, from the counter's readings (None: no usable counter reading)
    counter_j: float | None = None
    counter_uncertainty_j: float | None = None
    power_j: float | None = None  # the power gauge's integral, the cross-check
    power_uncertainty_j: float | None = None
    refreshes: int | None = None  # DCGM refreshes that can lie inside the window (None: fresh values)
    resets: int = 0
    counter_state: str | None = None  # "unsupported" or "stuck": the counter was not used (`amd_counter_state`)

    @property
    def disagreement_limit_j(self) -> float | None:
        """How far the counter and the power integral may differ: 3 × their combined expected error."""
        if self.counter_uncertainty_j is None or self.power_uncertainty_j is None:
            return None
        # (The counter's own error never below its resolution at each edge, even where its bound is 0.)
        counter = max(self.counter_uncertainty_j, 2 * ENERGY_RESOLUTION_MJ * _MJ_TO_J)
        return DISAGREE_FACTOR * (counter + self.power_uncertainty_j)

    @property
    def agrees(self) -> bool | None:
        """The counter and the power integral agree (None: one of them is missing)."""
        limit = self.disagreement_limit_j
        if limit is None or self.counter_j is None or self.power_j is None:
            return None
        return abs(self.counter_j - self.power_j) <= limit


@dataclass(frozen=True, slots=True)
class EnergyTotals:
    total_energy_j: float | None
    average_power_w: float | None
    total_power_w: float | None  # Σ over GPUs of the window's mean power
    duration_s: float
    gpus_with_counter: int
    gpus_integrated: int  # GPUs whose energy came from integrating power (no usable counter)
    source: str  # dcgm_counter | power_integration | mixed | unavailable
    bound_j: float | None = None  # ± Σ of the GPUs' bounds (interpolated counters; bridge/report/refresh.py)
    refresh_period_s: float | None = None  # the slowest DCGM refresh behind the energy (None: fresh values)
    refreshes_per_window: float | None = None  # the window's length in those refresh periods
    refresh_at_least: bool = False  # that period is a lower bound (fewer than two new values were seen)
    uncertainty_j: float | None = None  # ± Σ of the GPUs' expected errors (bridge/report/uncertainty.py)
    gpus: tuple[GpuEnergy, ...] = ()  # per GPU (interpolated mode)

    @property
    def too_few_refreshes(self) -> bool:
        """The window spans fewer than two refreshes: the energy rests on too few of them."""
        return self.refreshes_per_window is not None and self.refreshes_per_window < MIN_REFRESHES_PER_WINDOW

    @property
    def power_from_samples(self) -> bool:
        """Some GPU's energy (so the average power) is the sampled power's integral, not its counter's."""
        return any(g.source == "power_integral" for g in self.gpus)


def vendor_series(series: Sequence[Series], vendor: str = "nvidia") -> list[Series]:
    """The series of one vendor's GPUs (`nvidia`: also those carrying neither vendor's energy or power)."""
    keys = VENDOR_KEYS[vendor]
    return [s for s in series if energy_keys(s.values) == keys]


def has_energy(series: Sequence[Series]) -> bool:
    """Some series carries its vendor's energy counter or power gauge."""
    return any(key in s.values for s in series for key in energy_keys(s.values))


def energy_totals(series: Sequence[Series], window: Window, mode: CounterMode, vendor: str = "nvidia") -> EnergyTotals:
    """One vendor's totals over the window, from its GPUs among `series` (the others are left out)."""
    series = vendor_series(series, vendor)
    if window.start_ns is None or window.end_ns is None:
        return EnergyTotals(None, None, None, 0.0, 0, 0, "unavailable")
    if mode == "interpolated":
        return _interpolated_totals(series, window)
    start, end, grace = window.start_ns, window.end_ns, window.grace_ns
    duration_s = max(end - start, 0) / 1e9
    total_power = _total_power(series, start, end)
    energy_j = 0.0
    counted = 0
    for s in series:
        counter = s.values.get(energy_keys(s.values)[0])
        delta = None if counter is None else counter_delta_aiperf(s.timestamps, counter, start, end + grace)
        if delta is not None:
            energy_j += delta.delta * _MJ_TO_J
            counted += 1
    if counted and energy_j > 0:
        average = energy_j / duration_s if duration_s > 0 else None
        return EnergyTotals(energy_j, average, total_power, duration_s, counted, 0, "dcgm_counter")
    if total_power and duration_s > 0:
        return EnergyTotals(total_power * duration_s, total_power, total_power, duration_s, 0,
                            len(series), "power_integration")
    return EnergyTotals(None, None, total_power, duration_s, 0, 0, "unavailable")


def _total_power(series: Sequence[Series], start: int, end: int) -> float | None:
    total: float | None = None
    for s in series:
        power = s.values.get(energy_keys(s.values)[1])
        mean = None if power is None else gauge_mean(s.timestamps, power, start, end)
        if mean is not None:
            total = (total or 0.0) + mean
    return total


def gpu_energy(s: Series, window: Window) -> GpuEnergy:
    """One GPU's energy over exactly [start, end] (interpolated mode): the counter's increase, cross-checked
    against the power integral; the power integral, labelled, where the counter is unusable (missing, or the
    window holds fewer than two of its refreshes)."""
    assert window.start_ns is not None and window.end_ns is not None
    start, end = window.start_ns, window.end_ns
    cadence = source_cadence(s.endpoint, s.timestamps, s.values, s.ends)
    refreshes = None if cadence.fresh else refreshes_inside(s.timestamps, cadence, start, end)
    energy_key, power_key = energy_keys(s.values)
    power = s.values.get(power_key)
    integral = None if power is None else power_integral(s.timestamps, power, cadence, start, end)
    power_j = None if integral is None else integral.joules
    power_u = None if integral is None else integral.uncertainty_j
    counter = s.values.get(energy_key)
    state = None
    if counter is not None and s.meta.platform == "amd":
        state = amd_counter_state(s.timestamps, counter, power, start, end + window.grace_ns, cadence.fresh)
        counter = None if state is not None else counter  # never its 0 J: the power integral, or nothing
    fresh = None if counter is None else counter_delta_interpolated(s.timestamps, counter, start, end,
                                                                    window.grace_ns)
    read = None if fresh is None else window_delta(s.timestamps, s.values, energy_key, cadence, start, end, fresh,
                                                   window.grace_ns, s.endpoint, s.ends)
    if read is None or read.delta is None:
        if integral is None:
            return GpuEnergy(s.endpoint, s.meta.identity, None, "unavailable", refreshes=refreshes,
                             counter_state=state)
        return GpuEnergy(s.endpoint, s.meta.identity, power_j, "power_integral", power_u, power_j=power_j,
                         power_uncertainty_j=power_u, refreshes=refreshes, counter_state=state)
    counter_j = read.delta.delta * _MJ_TO_J
    bound = (read.bound or 0.0) * _MJ_TO_J
    expected = (read.uncertainty or 0.0) * _MJ_TO_J
    few = refreshes is not None and refreshes < MIN_REFRESHES_PER_WINDOW
    if few and integral is not None and power_u is not None:
        # The counter rests on too few refreshes: the power integral, kept inside what the counter guarantees
        # (the truth lies within counter ± bound), with the bound measured from the value kept.
        kept = min(max(integral.joules, counter_j - bound), counter_j + bound)
        return GpuEnergy(s.endpoint, s.meta.identity, kept, "power_integral", min(power_u, 2 * bound),
                         abs(kept - counter_j) + bound, counter_j, expected, power_j, power_u, refreshes,
                         read.delta.resets)
    return GpuEnergy(s.endpoint, s.meta.identity, counter_j, "counter", expected, bound, counter_j, expected, power_j,
                     power_u, refreshes, read.delta.resets)


def amd_counter_state(ts: NDArray[np.int64], counter: NDArray[np.float64], power: NDArray[np.float64] | None,
                      start: int, end: int, fresh: bool) -> str | None:
    """Whether an AMD energy counter can be read over [start, end] (with the readings on either side): None when
    it can, "unsupported" when it reads 0 throughout (AMD's exporter writes 0 where the counter is not supported:
    an RX 7900 XTX, ROCm/device-metrics-exporter issue #259), "stuck" when it does not move over at least 2 of the
    exporter's refreshes while the power gauge reads above 0 (a frozen counter: MI100 under ROCm 6.0-6.1,
    ROCm/amdsmi issues #22 and #38). `fresh`: every scrape brings new values (the source's cadence).
    A power gauge that never changes shows no refresh either: then nothing is said (the verdict's
    `too_few_refreshes` is)."""
    import numpy as np

    lo = max(int(np.searchsorted(ts, start, side="left")) - 1, 0)
    hi = int(np.searchsorted(ts, end, side="right")) + 1
    values = counter[lo:hi]
    read = values[~np.isnan(values)]
    if not read.size:
        return None
    if not np.any(read):
        return "unsupported"
    if np.any(read != read[0]) or power is None:
        return None
    watts = power[lo:hi]
    watts = watts[~np.isnan(watts)]
    # The exporter's refreshes are seen in the power gauge (the counter, frozen, shows none): where every scrape is
    # fresh each interval is one, else each change of the power reading.
    spans = watts.size - 1 if fresh else int(np.count_nonzero(np.diff(watts)))
    return "stuck" if spans >= 2 and float(np.mean(watts)) > 0 else None


@dataclass(frozen=True, slots=True)
class PowerIntegral:
    joules: float
    uncertainty_j: float  # bridge/report/uncertainty.py


def power_integral(ts: NDArray[np.int64], power_w: NDArray[np.float64], cadence: Cadence, start: int,
                   end: int) -> PowerIntegral | None:
    """∫ power dt over [start, end] (J) from the gauge's readings, timed at their refresh when the values are not
    fresh, held flat beyond the readings; with its expected error: the trapezoids', plus on a slow refresh the
    highest power times how far the edges' refresh instants can be off. None without a reading or with
    end ≤ start."""
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
        spreads = [cadence.instant_spread(float(e)) for e in (start, end)]
        stale = float(np.max(p)) * sum(w if w is not None else cadence.period_ns or 0.0 for w in spreads) / 1e9
    lo, hi = float(start - base), float(end - base)
    inside = (instants > lo) & (instants < hi)
    grid = np.concatenate(([lo], instants[inside], [hi]))
    curve = np.interp(grid, instants, p)
    return PowerIntegral(float(np.trapezoid(curve, grid) / 1e9), trapezoid_error_j(grid, curve) + stale)


def refreshes_inside(ts: NDArray[np.int64], cadence: Cadence, start: int, end: int) -> int:
    """DCGM refreshes that can lie inside [start, end]: new values whose bracket (the scrape before, the scrape
    that first saw them) overlaps it."""
    import numpy as np

    new = cadence.new
    if new is None or not new.size:
        return 0
    return int(np.count_nonzero((ts[new] >= start) & (ts[new - 1] <= end)))


def _interpolated_totals(series: Sequence[Series], window: Window) -> EnergyTotals:
    assert window.start_ns is not None and window.end_ns is not None
    start, end = window.start_ns, window.end_ns
    duration_s = max(end - start, 0) / 1e9
    gpus = tuple(gpu_energy(s, window) for s in series)
    used = [g for g in gpus if g.joules is not None]
    counted = sum(1 for g in used if g.source == "counter")
    integrated = len(used) - counted
    total_power = _total_power(series, start, end)
    if not used:
        return EnergyTotals(None, None, total_power, duration_s, 0, 0, "unavailable", gpus=gpus)
    energy_j = sum(g.joules or 0.0 for g in used)
    bounds = [g.bound_j for g in used if g.bound_j is not None]
    slowest: float | None = None
    at_least = False
    for s in series:
        cadence = source_cadence(s.endpoint, s.timestamps, s.values, s.ends)
        period = None if cadence.fresh else cadence.period_s
        if energy_keys(s.values)[0] in s.values and period is not None and period >= (slowest or 0.0):
            slowest, at_least = period, cadence.at_least
    source = "mixed" if counted and integrated else "dcgm_counter" if counted else "power_integration"
    average = energy_j / duration_s if duration_s > 0 else None
    spans = duration_s / slowest if slowest else None
    return EnergyTotals(energy_j, average, total_power, duration_s, counted, integrated, source,
                        sum(bounds) if bounds else None, slowest, spans, at_least,
                        sum(g.uncertainty_j or 0.0 for g in used), gpus)


def _avg(benchmark: Mapping[str, Any] | None, tag: str) -> float | None:
    if not benchmark:
        return None
    entry = benchmark.get(tag)
    value = entry.get("avg") if isinstance(entry, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def profiling_concurrency(benchmark: Mapping[str, Any] | None) -> int | None:
    """The concurrency of the first profiling phase in AIPerf's `input_config` (its EnergyEfficiencyAnalyzer
    reads `cfg.get_profiling_phases()[0].concurrency`); None for request-rate runs."""
    config = benchmark.get("input_config") if benchmark else None
    phases = config.get("phases") if isinstance(config, Mapping) else None
    if not isinstance(phases, list):
        return None
    profiling = [p for p in phases if isinstance(p, Mapping)
                 and (p.get("kind") == "profiling" or (p.get("kind") is None and not p.get("exclude_from_results")))]
    raw = profiling[0].get("concurrency") if profiling else None
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else None


# AIPerf 0.13's energy-efficiency family (aiperf/metrics/types/power_efficiency_metrics.py): tag, CSV header,
# unit, in the order its EnergyEfficiencyAnalyzer emits them (the order they take at the end of its JSON).
ENERGY_FAMILY: tuple[tuple[str, str, str], ...] = (
    ("nvidia_total_gpu_power", "Total GPU Power", "W"),
    ("nvidia_average_gpu_power", "Average GPU Power", "W"),
    ("nvidia_total_gpu_energy", "Total GPU Energy", "J"),
    ("nvidia_output_tokens_per_joule", "Output Tokens per Joule", "tokens/J"),
    ("nvidia_energy_per_output_token", "Energy per Output Token", "mJ/token"),
    ("nvidia_energy_per_total_token", "Energy per Total Token", "mJ/token"),
    ("nvidia_energy_per_request", "Energy per Request", "joules/request"),
    ("nvidia_energy_per_user", "Energy per User", "joules/user"),
    ("nvidia_energy_delay_product", "Energy Delay Product", "J*s"),
    ("nvidia_performance_per_watt", "Performance per Watt", "requests/sec/W"),
    ("nvidia_output_tps_per_watt", "Output Tokens per Second per Watt", "tokens/sec/W"),
    ("nvidia_goodput_per_watt", "Goodput per Watt", "good-req/s/W"),
)
# AIPerf emits the same family per platform, `amd_` for AMD GPUs (AmdTotalGpuEnergyMetric, …: the same headers and
# units), platforms in sorted order: amd's before nvidia's.
ENERGY_FAMILY = tuple((tag.replace("nvidia_", "amd_", 1), header, unit) for tag, header, unit in ENERGY_FAMILY) + \
    ENERGY_FAMILY
ENERGY_TAGS = frozenset(tag for tag, _, _ in ENERGY_FAMILY)


def energy_metrics(totals: EnergyTotals, benchmark: Mapping[str, Any] | None = None,
                   concurrency: int | None = None, vendor: str = "nvidia") -> dict[str, dict[str, Any]]:
    """Top-level `nvidia_*` (or `amd_*`: `vendor`) metrics as `{"unit", "avg"}`, each only when its inputs exist
    (AIPerf's rule), in AIPerf's order. `concurrency` defaults to the benchmark JSON's profiling concurrency."""
    if vendor != "nvidia":
        return {tag.replace("nvidia_", f"{vendor}_", 1): value
                for tag, value in energy_metrics(totals, benchmark, concurrency).items()}
    values: dict[str, float] = {}
    if totals.total_power_w is not None and totals.total_power_w > 0:
        values["nvidia_total_gpu_power"] = totals.total_power_w
    energy = totals.total_energy_j
    if energy is not None and energy > 0:
        _energy_family(values, energy, totals.average_power_w, benchmark,
                       concurrency if concurrency is not None else profiling_concurrency(benchmark))
    out = {tag: {"unit": unit, "avg": values[tag]} for tag, _, unit in ENERGY_FAMILY if tag in values}
    if "nvidia_total_gpu_energy" in out and totals.uncertainty_j is not None:
        out["nvidia_total_gpu_energy"]["uncertainty"] = totals.uncertainty_j  # ± J expected, beside AIPerf's keys
    if "nvidia_total_gpu_energy" in out and totals.bound_j is not None:
        out["nvidia_total_gpu_energy"]["bound"] = totals.bound_j  # ± J hard, beside AIPerf's keys
    return out


def vendor_energy_metrics(nvidia: EnergyTotals, amd: EnergyTotals | None,
                          benchmark: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Both vendors' families, each from its own GPUs' totals, platforms in AIPerf's order (sorted: amd's first)."""
    out = energy_metrics(amd, benchmark, vendor="amd") if amd is not None else {}
    return {**out, **energy_metrics(nvidia, benchmark)}


def _energy_family(values: dict[str, float], energy: float, power: float | None,
                   benchmark: Mapping[str, Any] | None, concurrency: int | None) -> None:
    if power is not None and power > 0:
        values["nvidia_average_gpu_power"] = power
    values["nvidia_total_gpu_energy"] = energy
    output_tokens = _avg(benchmark, "total_osl")
    if output_tokens:
        values["nvidia_output_tokens_per_joule"] = output_tokens / energy
        values["nvidia_energy_per_output_token"] = energy * 1e3 / output_tokens
    total_tokens = (_avg(benchmark, "total_isl") or 0.0) + (output_tokens or 0.0)
    if total_tokens > 0:
        values["nvidia_energy_per_total_token"] = energy * 1e3 / total_tokens
    requests = _avg(benchmark, "request_count")
    if requests:
        values["nvidia_energy_per_request"] = energy / requests
        latency_ms = _avg(benchmark, "request_latency")
        if latency_ms:
            values["nvidia_energy_delay_product"] = energy / requests * latency_ms / 1e3
    if concurrency:
        values["nvidia_energy_per_user"] = energy / concurrency
    if power and power > 0:
        # AIPerf compares these to None, not truthiness: a 0.0 goodput is a valid 0 per watt.
        for tag, name in (("request_throughput", "nvidia_performance_per_watt"),
                          ("output_token_throughput", "nvidia_output_tps_per_watt"),
                          ("goodput", "nvidia_goodput_per_watt")):
            value = _avg(benchmark, tag)
            if value is not None:
                values[name] = value / power

