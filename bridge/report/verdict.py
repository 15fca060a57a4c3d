"""The validity verdict: `telemetry_data.measurement`, per GPU and for the run, with reason codes and their fixes.

A measurement is valid when every GPU's window rests on enough data (the rules below, after NVIDIA srt-slurm's
`core/power/contract.py`, which gates power traces with `MAX_SAMPLE_GAP_SECONDS = 3.0` and reason codes):

- sampling coverage, scrapes that brought a sample / scrapes due in the window, is at least 0.95;
- the longest gap between samples around the window is at most max(3 s, 3 × the scrape interval);
- the window holds at least 2 of the exporter's refreshes (DCGM's collect interval, bridge/report/refresh.py);
- the window lies inside the sampled span (phase marks on another clock fall outside it);
- the energy counter had no glitch, rejected value or reset in the window (bridge/report/sanity.py);
- the counter agrees with the power gauge's integral (bridge/report/energy.py, `GpuEnergy.agrees`).

A NOT-valid verdict changes no exit code by itself (`--require-valid` does: bridge/report/cli.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.endpoints import REFRESH_FIX, display_key
from bridge.report.energy import EnergyTotals, GpuEnergy
from bridge.report.refresh import MIN_REFRESHES_PER_WINDOW
from bridge.report.sanity import CounterCheck
from bridge.report.series import Series
from bridge.report.window import Window
from bridge.samples import NOT_FAILED_SCRAPES

if TYPE_CHECKING:
    from bridge.samples import ScrapeFailure

MIN_COVERAGE = 0.95
MAX_GAP_S = 3.0  # srt-slurm's MAX_SAMPLE_GAP_SECONDS
GAP_INTERVALS = 3.0

# Reason code → what to do about it (README "The measurement verdict" lists the same).
FIXES: Mapping[str, str] = {
    "no_data": "no sample of this GPU lies in the window: check the window (phase marks, --start-ns/--end-ns) "
               "and that the exporter served this GPU during the run",
    "low_coverage": "fewer than 95 % of the scrapes due in the window brought a sample: see error_summary, "
                    "check the exporter's health and the node's load",
    "sample_gap": "the samples stop for longer than max(3 s, 3 × the scrape interval): see error_summary, "
                  "check the exporter's health and the node's load",
    "too_few_refreshes": f"the window holds fewer than 2 DCGM refreshes: {REFRESH_FIX}, or run longer",
    "window_outside_samples": "the window lies outside the sampled span: check that the benchmark's clock and the "
                              "sidecar's agree (NTP) and that the sidecar ran through the whole benchmark",
    "counter_glitch": "the energy counter read impossible values in the window (dropped and counted): check the "
                      "exporter and the driver (dmesg)",
    "counter_reset": "the energy counter reset in the window (a driver reload or GPU reset): rerun",
    "counter_unsupported": "the GPU's energy counter reads 0 throughout, which AMD's exporter writes where the "
                           "counter is not supported (consumer and APU parts, ROCm/device-metrics-exporter issue "
                           "#259): the energy is the power gauge's integral where there is one; check `amd-smi "
                           "metric -E` on the node",
    "counter_stuck": "the energy counter did not move over 2 or more refreshes while the GPU drew power (a frozen "
                     "counter, as on MI100 under ROCm 6.0-6.1, ROCm/amdsmi issue #22): the energy is the power "
                     "gauge's integral; update ROCm and the driver, and check that `amd-smi metric -E` moves",
    "counter_power_disagree": "the energy counter and the power gauge's integral disagree: check which fields the "
                              "exporter serves (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, DCGM_FI_DEV_POWER_USAGE)",
    "no_gpu_selected": "no GPU served a pod matching --gpu-pods: see the reason beside it and "
                       "docs/kubernetes.md (shared nodes)",
    "no_pod_labels": "no GPU carries pod labels: run dcgm-exporter in Kubernetes mode with the kubelet's "
                     "pod-resources socket mounted, and have the pods request their GPUs (device plugin or DRA)",
    "no_matching_pod": "no GPU is attributed to a pod matching --gpu-pods: check the NAMESPACE/GLOB",
    "gpu_shared_with_other_pods": "a GPU served a matching and another pod at once (MIG, time-slicing, MPS): it "
                                  "is listed under pods.shared and not counted",
    "duplicate_series": "a page held one series (metric name and labels) twice with different values (the first "
                        "was used, the last with --counter-mode aiperf; see error_summary): check the exporter's "
                        "collectors and its custom-metrics file",
    "no_hash": "the report stores no SHA-256 of its record log or events file: rebuild it with `dcgm-bridge report`",
    "hash_mismatch": "the record log's or the events file's bytes are not those the report was built from: rebuild "
                     "the report",
    "window_differs": "the report's window is not the one the events file's phase marks give: rebuild the report, "
                      "or give `validate` the window the report was built over as `report` takes it (--start-ns/"
                      "--end-ns, --phase-manifest: a cancelled AIPerf run's is its phase_manifest.json)",
    "report_differs": "a value of the report, its CSV section or a phase file differs from the rebuild from the "
                      "record log: rebuild the report",
    # Issue 46: each in its own block (`requests`, `roles`, `idle`, `steady_state`), never the run's verdict.
    "too_few_requests": "fewer than 20 requests were attributed energy: the distribution's tail (p99) rests on "
                        "too few; run more requests",
    "no_output_tokens": "no request reported output tokens: run AIPerf with streaming and a tokenizer",
    "no_token_counts": "the role's efficiency needs AIPerf's token counts: give `report --requests "
                       "profile_export.jsonl` (AIPerf writes it by default; `profile -- aiperf` reads it)",
    "no_role_energy": "no GPU of the role has a usable energy: see the role's GPUs' measurement",
    "idle_under_load": "a quiet window showed load (utilisation above 5 %, or power still falling) and was not "
                       "used as idle: stop what else runs on the GPUs, or lengthen --idle-window",
    "idle_baseline_moved": "the idle power before and after the benchmark differ beyond their uncertainty "
                           "(temperature, clocks): lengthen --idle-window, let the GPUs settle first",
    "no_idle_baseline": "no quiet window was usable for a GPU: give --idle-window, longer, on idle GPUs",
    "idle_window_short": "a quiet window holds fewer than 5 power readings: lengthen --idle-window",
    "no_steady_state": "the power and the request concurrency never held within 10 % for 10 s and a fifth of the "
                       "window: run longer at a fixed concurrency",
}


def gpu_measurement(s: Series, window: Window, energy: GpuEnergy | None, check: CounterCheck | None,
                    failures: int) -> dict[str, Any]:
    """One GPU's verdict over the window (resolved), with what it rests on. `failures`: failed scrapes of the
    GPU's endpoint in the window."""
    import numpy as np

    assert window.start_ns is not None and window.end_ns is not None
    start, end = window.start_ns, window.end_ns
    ts = s.timestamps
    reasons: list[str] = []
    interval = float(np.median(np.diff(ts))) if ts.size >= 2 else 0.0
    inside = int(np.count_nonzero((ts >= start) & (ts <= end)))
    out: dict[str, Any] = {"valid": True, "reasons": reasons}
    if not ts.size or not inside and (ts[-1] < start or ts[0] > end):
        reasons.append("no_data")
        out["valid"] = False
        return out
    # Any stretch of W holds at least floor(W / interval) ticks of a regular schedule (rounding would count one more
    # than a short window can hold at some phases: a false low coverage).
    due = max(int((end - start) // interval) if interval > 0 else 1, inside + failures, 1)
    coverage = min(inside / due, 1.0)
    gap = _longest_gap(ts, start, end)
    out.update(coverage=coverage, scrape_interval_s=interval / 1e9, longest_gap_s=gap / 1e9)
    if coverage < MIN_COVERAGE:
        reasons.append("low_coverage")
    if gap > max(MAX_GAP_S * 1e9, GAP_INTERVALS * interval):
        reasons.append("sample_gap")
    if start < int(ts[0]) - interval or end > int(ts[-1]) + interval:
        reasons.append("window_outside_samples")
    if check is not None:
        dropped = check.between(start - round(interval), end + window.grace_ns)
        out.update(dropped)
        if any(dropped.values()):
            reasons.append("counter_glitch")
    if energy is not None:
        reasons.extend(_energy_reasons(energy, out))
    out["valid"] = not reasons
    return out


def _energy_reasons(energy: GpuEnergy, out: dict[str, Any]) -> list[str]:
    reasons = []
    out["energy_source"] = energy.source
    if energy.counter_state is not None:  # the counter was not used (bridge/report/energy.py amd_counter_state)
        out["counter_state"] = energy.counter_state
        reasons.append(f"counter_{energy.counter_state}")
    if energy.uncertainty_j is not None:
        out["uncertainty_j"] = energy.uncertainty_j
    if energy.refreshes is not None:
        out["refreshes"] = energy.refreshes
        if energy.refreshes < MIN_REFRESHES_PER_WINDOW:
            reasons.append("too_few_refreshes")
    if energy.resets:
        out["resets"] = energy.resets
        reasons.append("counter_reset")
    if energy.counter_j is not None and energy.power_j is not None:
        out["counter_j"], out["power_integral_j"] = energy.counter_j, energy.power_j
        out["disagreement_limit_j"] = energy.disagreement_limit_j
        out["counter_power_agree"] = energy.agrees
        if energy.agrees is False:
            reasons.append("counter_power_disagree")
            out["energy_used"] = energy.source  # which of the two the report used
    return reasons


def _longest_gap(ts: Any, start: int, end: int) -> int:
    """The longest gap between samples over [start, end], counting from the last sample at or before the start
    (else the start) to the first at or after the end (else the end)."""
    import numpy as np

    lo = max(int(np.searchsorted(ts, start, side="right")) - 1, 0)
    hi = min(int(np.searchsorted(ts, end, side="left")), ts.size - 1)
    points = np.concatenate(([min(start, int(ts[lo]))], ts[lo: hi + 1], [max(end, int(ts[hi]))]))
    return int(np.max(np.diff(points))) if points.size >= 2 else 0


def measurement(series: Sequence[Series], keys: Mapping[tuple[str, tuple[str, str | None]], str], window: Window,
                energy: EnergyTotals, checks: Mapping[tuple[str, tuple[str, str | None]], CounterCheck],
                errors: Sequence[ScrapeFailure], amd_energy: EnergyTotals | None = None) -> dict[str, Any]:
    """`telemetry_data.measurement`: the run's verdict (valid when every GPU's is), its reasons and their fixes,
    and each GPU's (`gpus` → endpoint → GPU key, as `endpoints`). `energy` is the NVIDIA GPUs' totals,
    `amd_energy` the AMD GPUs' (their `energy_source` keys prefixed `amd_`): each GPU is judged on its own."""
    assert window.start_ns is not None and window.end_ns is not None
    amd_gpus = amd_energy.gpus if amd_energy is not None else ()
    by_gpu = {(g.endpoint, g.identity): g for g in (*energy.gpus, *amd_gpus)}
    failures: dict[str, int] = {}
    duplicates = 0
    for failure in errors:
        if window.start_ns <= failure.time_ns <= window.end_ns:
            if failure.kind in NOT_FAILED_SCRAPES:
                duplicates += failure.kind == "duplicate_series"
                continue
            key = display_key(failure.endpoint)
            failures[key] = failures.get(key, 0) + 1
    gpus: dict[str, dict[str, Any]] = {}
    reasons: dict[str, None] = {}
    for s in series:
        ident = (s.endpoint, s.meta.identity)
        entry = gpu_measurement(s, window, by_gpu.get(ident), checks.get(ident), failures.get(s.endpoint, 0))
        gpus.setdefault(s.endpoint, {})[keys.get(ident, s.meta.gpu_uuid)] = entry
        reasons.update(dict.fromkeys(entry["reasons"]))
    if not series:
        reasons["no_data"] = None
    if duplicates:
        reasons["duplicate_series"] = None
    out: dict[str, Any] = {"valid": not reasons, "reasons": list(reasons),
                           "fixes": {code: FIXES[code] for code in reasons}}
    if duplicates:
        out["duplicate_series_pages"] = duplicates  # pages in the window that held a series twice, differing
    if energy.gpus:
        out["energy_source"] = energy.source
        out["power_from_samples"] = energy.power_from_samples
    if amd_energy is not None and amd_energy.gpus:
        out["amd_energy_source"] = amd_energy.source
        out["amd_power_from_samples"] = amd_energy.power_from_samples
    out["gpus"] = gpus
    return out


def window_and_hash(window: Window, file: str | None, sha256: str | None, run_id: str | None = None,
                    events: Path | None = None) -> dict[str, Any]:
    """What `dcgm-bridge validate` needs to redo the report: the window, and the record log's file name and the
    SHA-256 of its bytes as written (gzip included; none when there is no log or it could not be read), with the
    run taken from it when it holds several; and the same of the events file the phase marks came from."""
    out: dict[str, Any] = {"window": {"start_ns": window.start_ns, "end_ns": window.end_ns,
                                      "grace_ns": window.grace_ns}}
    if file is not None and sha256 is not None:
        out["record_log"] = {"file": file, "sha256": sha256}
        if run_id is not None:
            out["record_log"]["run_id"] = run_id
    events_sha256 = file_sha256(events) if events is not None else None
    if events is not None and events_sha256 is not None:
        out["events"] = {"file": events.name, "sha256": events_sha256}
    return out


def file_sha256(path: Path) -> str | None:
    import hashlib

    try:
        with path.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def verdict_line(block: Mapping[str, Any]) -> str:
    """The console's closing line: `measurement valid` or `measurement NOT valid: <reasons> — <fix>`."""
    verdict = block.get("measurement")
    if not isinstance(verdict, Mapping):
        return "measurement not assessed"
    if verdict.get("valid"):
        return "measurement valid"
    reasons = [str(r) for r in verdict.get("reasons", [])]
    fixes = [FIXES.get(r, "") for r in reasons]
    return f"measurement NOT valid: {', '.join(reasons)} — {'; '.join(f for f in fixes if f)}"


def with_reasons(verdict: Mapping[str, Any], codes: Sequence[str]) -> dict[str, Any]:
    """The run's verdict with `codes` (a selection's reasons, report/pods.py) added: NOT valid when any is."""
    reasons = dict.fromkeys([*verdict.get("reasons", ()), *codes])
    return {**verdict, "valid": bool(verdict.get("valid", True)) and not codes, "reasons": list(reasons),
            "fixes": {code: FIXES[code] for code in reasons if code in FIXES}}
