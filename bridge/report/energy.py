"""Run-level energy: `nvidia_total_gpu_energy` (J), `nvidia_average_gpu_power` (W), `nvidia_total_gpu_power`
(W), and, when the benchmark JSON holds token/request counts (and its concurrency), the rest of AIPerf 0.13's
energy-efficiency family with its tags, units and order (AIPerf 0.13.0,
ai-dynamo/aiperf `src/aiperf/metrics/energy_efficiency_analyzer.py`).

Sums run over GPU identities: device-level fields (power, energy) are carried only by a GPU's own record,
never by its MIG instances', so nothing is counted twice.
- `aiperf`: AIPerf's EnergyEfficiencyAnalyzer: energy = Σ AIPerf counter deltas over [start, end + grace];
  average power = energy / (end − start); with no energy counter at all, energy = Σ avg power × duration.
- `interpolated`: energy = Σ interpolated counter increases over exactly [start, end], timed at DCGM's refresh
  when the values are not fresh (bridge/report/refresh.py), with a bound (the sum of the GPUs'); a GPU with no
  energy counter contributes the trapezoidal integral of its power instead (per GPU, not all-or-nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.report.refresh import (
    ENERGY_KEY,
    MIN_REFRESHES_PER_WINDOW,
    POWER_KEY,
    RefreshedDelta,
    series_cadence,
    window_delta,
)
from bridge.report.series import Series
from bridge.report.stats import (
    CounterDelta,
    counter_delta_aiperf,
    counter_delta_interpolated,
    gauge_mean,
    integrate_gauge,
)
from bridge.report.window import Window
from bridge.samples import CounterMode

_MJ_TO_J = 1e6


@dataclass(frozen=True, slots=True)
class EnergyTotals:
    total_energy_j: float | None
    average_power_w: float | None
    total_power_w: float | None  # Σ over GPUs of the window's mean power
    duration_s: float
    gpus_with_counter: int
    gpus_integrated: int  # GPUs whose energy came from integrating power (no counter)
    source: str  # dcgm_counter | power_integration | mixed | unavailable
    bound_j: float | None = None  # ± Σ of the GPUs' bounds (interpolated counters; bridge/report/refresh.py)
    refresh_period_s: float | None = None  # the slowest DCGM refresh behind the energy (None: fresh values)
    refreshes_per_window: float | None = None  # the window's length in those refresh periods
    refresh_at_least: bool = False  # that period is a lower bound (fewer than two new values were seen)

    @property
    def too_few_refreshes(self) -> bool:
        """The window spans fewer than two refreshes: the energy rests on too few of them."""
        return self.refreshes_per_window is not None and self.refreshes_per_window < MIN_REFRESHES_PER_WINDOW


def energy_totals(series: Sequence[Series], window: Window, mode: CounterMode) -> EnergyTotals:
    if window.start_ns is None or window.end_ns is None:
        return EnergyTotals(None, None, None, 0.0, 0, 0, "unavailable")
    start, end, grace = window.start_ns, window.end_ns, window.grace_ns
    duration_s = max(end - start, 0) / 1e9
    total_power: float | None = None
    energy_j = bound_j = 0.0
    counted = integrated = 0
    slowest: float | None = None
    at_least = False
    for s in series:
        power = s.values.get(POWER_KEY)
        if power is not None:
            mean = gauge_mean(s.timestamps, power, start, end)
            if mean is not None:
                total_power = (total_power or 0.0) + mean
        counter = s.values.get(ENERGY_KEY)
        if counter is not None:
            delta: CounterDelta | RefreshedDelta | None
            if mode == "aiperf":
                delta = counter_delta_aiperf(s.timestamps, counter, start, end + grace)
            else:
                cadence = series_cadence(s.timestamps, s.values)
                delta = counter_delta_interpolated(s.timestamps, counter, start, end, grace)
                if delta is not None:
                    delta, bound = window_delta(s.timestamps, s.values, ENERGY_KEY, cadence, start, end, delta)
                    bound_j += (bound or 0.0) * _MJ_TO_J
                period = None if cadence.fresh else cadence.period_s
                if period is not None and period >= (slowest or 0.0):
                    slowest, at_least = period, cadence.at_least
            if delta is not None:
                energy_j += delta.delta * _MJ_TO_J
                counted += 1
                continue
        if mode == "interpolated" and power is not None:
            joules = integrate_gauge(s.timestamps, power, start, end, grace)
            if joules is not None:
                energy_j += joules
                integrated += 1
    if mode == "aiperf":
        if counted and energy_j > 0:
            average = energy_j / duration_s if duration_s > 0 else None
            return EnergyTotals(energy_j, average, total_power, duration_s, counted, 0, "dcgm_counter")
        if total_power and duration_s > 0:
            return EnergyTotals(total_power * duration_s, total_power, total_power, duration_s, 0,
                                len(series), "power_integration")
        return EnergyTotals(None, None, total_power, duration_s, 0, 0, "unavailable")
    if not counted and not integrated:
        return EnergyTotals(None, None, total_power, duration_s, 0, 0, "unavailable")
    source = "mixed" if counted and integrated else "dcgm_counter" if counted else "power_integration"
    average = energy_j / duration_s if duration_s > 0 else None
    spans = duration_s / slowest if slowest else None
    return EnergyTotals(energy_j, average, total_power, duration_s, counted, integrated, source,
                        bound_j if counted else None, slowest, spans, at_least)


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
_AMD_KEYS = {"amd_energy_consumption": ENERGY_KEY, "amd_power": POWER_KEY}  # MJ and W, as the NVIDIA keys


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
    if "nvidia_total_gpu_energy" in out and totals.bound_j is not None:
        out["nvidia_total_gpu_energy"]["bound"] = totals.bound_j  # ± J, beside AIPerf's keys
    return out


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


def amd_series(series: Sequence[Series]) -> list[Series]:
    """The AMD GPUs' series with their energy and power under the keys `energy_totals` reads (same units), so the
    `amd_*` family is computed by the same rules as the NVIDIA one; empty when no AMD GPU reported either."""
    from dataclasses import replace

    out = []
    for s in series:
        found = {ours: s.values[theirs] for theirs, ours in _AMD_KEYS.items() if theirs in s.values}
        if found:
            out.append(replace(s, values=found))
    return out
