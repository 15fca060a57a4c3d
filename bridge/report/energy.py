"""Run-level energy: `nvidia_total_gpu_energy` (J), `nvidia_average_gpu_power` (W), `nvidia_total_gpu_power`
(W), and, when the benchmark JSON holds token/request counts, AIPerf's efficiency ratios (AIPerf 0.13.0,
ai-dynamo/aiperf `src/aiperf/metrics/energy_efficiency_analyzer.py`).

Sums run over GPU identities: device-level fields (power, energy) are carried only by a GPU's own record,
never by its MIG instances', so nothing is counted twice.
- `aiperf`: AIPerf's EnergyEfficiencyAnalyzer: energy = Σ AIPerf counter deltas over [start, end + grace];
  average power = energy / (end − start); with no energy counter at all, energy = Σ avg power × duration.
- `interpolated`: energy = Σ interpolated counter increases over exactly [start, end]; a GPU with no energy
  counter contributes the trapezoidal integral of its power instead (per GPU, not all-or-nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.report.series import Series
from bridge.report.stats import (
    counter_delta_aiperf,
    counter_delta_interpolated,
    gauge_mean,
    integrate_gauge,
)
from bridge.report.window import Window
from bridge.samples import CounterMode

ENERGY_KEY = "nvidia_energy_consumption"  # MJ
POWER_KEY = "nvidia_power_usage"  # W
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


def energy_totals(series: Sequence[Series], window: Window, mode: CounterMode) -> EnergyTotals:
    if window.start_ns is None or window.end_ns is None:
        return EnergyTotals(None, None, None, 0.0, 0, 0, "unavailable")
    start, end, grace = window.start_ns, window.end_ns, window.grace_ns
    duration_s = max(end - start, 0) / 1e9
    total_power: float | None = None
    energy_j = 0.0
    counted = integrated = 0
    for s in series:
        power = s.values.get(POWER_KEY)
        if power is not None:
            mean = gauge_mean(s.timestamps, power, start, end)
            if mean is not None:
                total_power = (total_power or 0.0) + mean
        counter = s.values.get(ENERGY_KEY)
        if counter is not None:
            if mode == "aiperf":
                delta = counter_delta_aiperf(s.timestamps, counter, start, end + grace)
            else:
                delta = counter_delta_interpolated(s.timestamps, counter, start, end, grace)
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
    return EnergyTotals(energy_j, average, total_power, duration_s, counted, integrated, source)


def _avg(benchmark: Mapping[str, Any] | None, tag: str) -> float | None:
    if not benchmark:
        return None
    entry = benchmark.get(tag)
    value = entry.get("avg") if isinstance(entry, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def energy_metrics(totals: EnergyTotals, benchmark: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Top-level `nvidia_*` metrics as `{"unit", "avg"}`, each only when its inputs exist (AIPerf's rule)."""
    out: dict[str, dict[str, Any]] = {}
    if totals.total_power_w is not None and totals.total_power_w > 0:
        out["nvidia_total_gpu_power"] = {"unit": "W", "avg": totals.total_power_w}
    energy = totals.total_energy_j
    if energy is None or energy <= 0:
        return out
    if totals.average_power_w is not None and totals.average_power_w > 0:
        out["nvidia_average_gpu_power"] = {"unit": "W", "avg": totals.average_power_w}
    out["nvidia_total_gpu_energy"] = {"unit": "J", "avg": energy}
    output_tokens = _avg(benchmark, "total_osl")
    if output_tokens:
        out["nvidia_output_tokens_per_joule"] = {"unit": "tokens/J", "avg": output_tokens / energy}
        out["nvidia_energy_per_output_token"] = {"unit": "mJ/token", "avg": energy * 1e3 / output_tokens}
    total_tokens = (_avg(benchmark, "total_isl") or 0.0) + (output_tokens or 0.0)
    if total_tokens > 0:
        out["nvidia_energy_per_total_token"] = {"unit": "mJ/token", "avg": energy * 1e3 / total_tokens}
    requests = _avg(benchmark, "request_count")
    if requests:
        per_request = energy / requests
        out["nvidia_energy_per_request"] = {"unit": "J/request", "avg": per_request}
        latency_ms = _avg(benchmark, "request_latency")
        if latency_ms:
            out["nvidia_energy_delay_product"] = {"unit": "J*s", "avg": per_request * latency_ms / 1e3}
    power = totals.average_power_w
    if power and power > 0:
        for tag, name, unit in (("request_throughput", "nvidia_performance_per_watt", "requests/sec/W"),
                                ("output_token_throughput", "nvidia_output_tps_per_watt", "tokens/sec/W"),
                                ("goodput", "nvidia_goodput_per_watt", "requests/sec/W")):
            value = _avg(benchmark, tag)
            if value is not None:
                out[name] = {"unit": unit, "avg": value / power}
    return out
