"""`telemetry_data.idle`: each GPU's idle power from the quiet windows `profile --idle-window` kept before and after
the benchmark, and the run's energy split into idle and active.

Per GPU and window: idle power = the window's energy (energy.gpu_energy: the counter's increase over exactly the
window, the report's rule) ÷ its length, ± (its stated uncertainty ÷ length, in quadrature with the power readings'
standard error of the mean). A window is **under load** (flagged, never used as idle) when the GPU's mean utilisation
in it exceeds `BUSY_UTILIZATION_PCT`, or its power falls from the window's first half to its second by more than
three standard errors and `SETTLING_SHARE` (the GPU still coming down from work). A GPU's idle power is the mean
of its usable windows; where both are usable and differ by more than twice their combined uncertainty, the baseline
**moved** (flagged; the mean is still given). Idle energy = idle power × the report window's length; active = the
GPU's energy − idle energy (Kepler's split, with a measured baseline instead of the lowest power ever seen).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bridge.events import IdleWindow
from bridge.report.energy import GpuEnergy, gpu_energy
from bridge.report.refresh import energy_keys
from bridge.report.series import Series
from bridge.report.window import Window, explicit_window

BUSY_UTILIZATION_PCT = 5.0
SETTLING_SHARE = 0.05
MOVED_FACTOR = 2.0
MIN_READINGS = 5  # power readings a window needs for its power and its noise
_UTIL_KEYS = ("nvidia_gpu_utilization", "amd_gpu_utilization")


def _window_power(s: Series, w: IdleWindow) -> dict[str, Any]:
    import numpy as np

    span_s = (w.end_ns - w.start_ns) / 1e9
    energy = gpu_energy(s, explicit_window(w.start_ns, w.end_ns, 0))
    inside = (s.timestamps >= w.start_ns) & (s.timestamps <= w.end_ns)
    gauge = s.values.get(energy_keys(s.values)[1])
    watts = gauge[inside] if gauge is not None else np.zeros(0)
    watts = watts[~np.isnan(watts)]
    out: dict[str, Any] = {"which": w.which, "start_ns": w.start_ns, "end_ns": w.end_ns, "readings": int(watts.size)}
    if energy.joules is None or watts.size < MIN_READINGS:
        out.update(power_w=None, uncertainty_w=None, under_load=False, reasons=["idle_window_short"])
        return out
    power = energy.joules / span_s
    noise = float(np.std(watts, ddof=1)) / math.sqrt(watts.size)
    out["power_w"] = power
    out["uncertainty_w"] = math.hypot((energy.uncertainty_j or 0.0) / span_s, noise)
    util = next((s.values[k][inside] for k in _UTIL_KEYS if k in s.values), None)
    util_mean = float(np.nanmean(util)) if util is not None and np.any(~np.isnan(util)) else None
    half = watts.size // 2
    first, second = watts[:half], watts[half:]
    spread = math.hypot(float(np.std(first, ddof=1)) / math.sqrt(first.size) if first.size > 1 else 0.0,
                        float(np.std(second, ddof=1)) / math.sqrt(second.size) if second.size > 1 else 0.0)
    fall = float(np.mean(first) - np.mean(second))
    busy = util_mean is not None and util_mean > BUSY_UTILIZATION_PCT
    settling = fall > 3 * spread and fall > SETTLING_SHARE * float(np.mean(second))
    out["utilization_pct"] = util_mean
    out["under_load"] = busy or settling
    out["reasons"] = ["idle_under_load"] if busy or settling else []
    return out


def idle_block(series: Sequence[Series], gpus: Sequence[GpuEnergy], windows: Sequence[IdleWindow],
               window: Window) -> dict[str, Any] | None:
    """Per GPU: each idle window's power and flags, the idle power used, idle and active energy; the run's sums and
    reasons. None when the run kept no idle window."""
    if not windows or window.start_ns is None or window.end_ns is None:
        return None
    duration_s = (window.end_ns - window.start_ns) / 1e9
    per_gpu: dict[str, Any] = {}
    idle_j = idle_u = active_j = 0.0
    reasons: list[str] = []
    complete = True
    for s, g in zip(series, gpus, strict=True):
        measured = [_window_power(s, w) for w in windows]
        usable = [m for m in measured if m["power_w"] is not None and not m["under_load"]]
        entry: dict[str, Any] = {"windows": measured}
        gpu_reasons = [r for m in measured for r in m["reasons"]]
        if len(usable) == 2:
            a, b = usable
            if abs(a["power_w"] - b["power_w"]) > MOVED_FACTOR * math.hypot(a["uncertainty_w"], b["uncertainty_w"]):
                gpu_reasons.append("idle_baseline_moved")
        if usable:
            power = sum(m["power_w"] for m in usable) / len(usable)
            u = math.sqrt(sum(m["uncertainty_w"] ** 2 for m in usable)) / len(usable)
            if "idle_baseline_moved" in gpu_reasons:  # the truth lies between: half their distance on top
                u = math.hypot(u, abs(usable[0]["power_w"] - usable[1]["power_w"]) / 2)
            entry.update(idle_power_w=power, idle_uncertainty_w=u, idle_j=power * duration_s,
                         idle_uncertainty_j=u * duration_s)
            if g.joules is not None:
                entry["active_j"] = g.joules - power * duration_s
                active_j += entry["active_j"]
            idle_j += power * duration_s
            idle_u += u * duration_s
        else:
            gpu_reasons.append("no_idle_baseline")
            complete = False
        entry["reasons"] = list(dict.fromkeys(gpu_reasons))
        reasons.extend(entry["reasons"])
        per_gpu[f"{s.endpoint} {s.meta.gpu_uuid}"] = entry
    out: dict[str, Any] = {"windows": [{"which": w.which, "start_ns": w.start_ns, "end_ns": w.end_ns}
                                       for w in windows], "gpus": per_gpu}
    if complete:
        out.update(idle_j=idle_j, idle_uncertainty_j=idle_u, active_j=active_j)
    out["reasons"] = list(dict.fromkeys(reasons))
    out["valid"] = not out["reasons"]
    return out
