"""The `telemetry_data` block (AIPerf 0.13.0, ai-dynamo/aiperf `src/aiperf/gpu_telemetry/accumulator.py`,
`export_results`): summary, endpoints → GPUs → metrics, error_summary.

GPU keys are `gpu_<index>` as AIPerf's, but two identities sharing an index under one endpoint never
overwrite each other: a MIG instance is `gpu_<index>_mig<GPU_I_ID>`, and GPUs of several hosts behind
one URL get `@<hostname>` (or `@<uuid>` when the hostname does not tell them apart).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Protocol

from bridge.endpoints import REFRESH_FIX, display_key
from bridge.fields import FieldSpec, FieldTable
from bridge.redact import redact_url
from bridge.report.energy import amd_counter_state
from bridge.report.events import EndpointState
from bridge.report.refresh import (
    MIN_REFRESHES_PER_WINDOW,
    Cadence,
    RefreshedDelta,
    endpoint_cadence,
    energy_keys,
    field_periods,
    refreshes_in,
    source_cadence,
    window_delta,
)
from bridge.report.series import GpuMeta, Series
from bridge.report.stats import (
    CounterDelta,
    Scratch,
    code_stats,
    counter_delta_aiperf,
    counter_delta_interpolated,
    counter_deltas_interpolated,
    gauge_stats,
    gauge_stats_columns,
)
from bridge.report.window import Window
from bridge.samples import CounterMode, MetricKind, ScrapeFailure

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

XID_KEY = "nvidia_xid_errors"

# AIPerf's own keys that our field table does not carry (pynvml/amdsmi collectors): read from AIPerf logs.
_AIPERF_EXTRA: Mapping[str, tuple[str, str, MetricKind]] = {
    "nvidia_jpg_utilization": ("NVIDIA JPEG Utilization", "%", MetricKind.GAUGE),
    "amd_power": ("AMD GPU Power", "W", MetricKind.GAUGE),
    "amd_energy_consumption": ("AMD Energy Consumption", "MJ", MetricKind.COUNTER),
    "amd_gfx_activity": ("AMD GFX Activity", "%", MetricKind.GAUGE),
    "amd_umc_activity": ("AMD UMC Activity", "%", MetricKind.GAUGE),
    "amd_mm_activity": ("AMD MM Activity", "%", MetricKind.GAUGE),
    "amd_memory_used": ("AMD GPU Memory Used", "GB", MetricKind.GAUGE),
    "amd_temperature": ("AMD GPU Temperature", "°C", MetricKind.GAUGE),
    "amd_ecc_uncorrectable": ("AMD ECC Uncorrectable Errors", "count", MetricKind.COUNTER),
    "amd_throttle_status": ("AMD Throttle Status", "count", MetricKind.GAUGE),
}


@dataclass(frozen=True, slots=True)
class MetricLabel:
    key: str
    display: str
    unit: str
    kind: MetricKind

    @property
    def label(self) -> str:
        return f"{self.display} ({self.unit})"


def label_for(key: str, table: FieldTable) -> MetricLabel:
    spec: FieldSpec | None = table.by_key.get(key)
    if spec is not None:
        return MetricLabel(key, spec.display, spec.unit, spec.kind)
    extra = _AIPERF_EXTRA.get(key)
    if extra is not None:
        return MetricLabel(key, *extra)
    return MetricLabel(key, key, "count", MetricKind.GAUGE)  # AIPerf's fallback unit for unknown fields


def ordered_keys(series: Iterable[Series], table: FieldTable) -> list[str]:
    """The field table's order (AIPerf's display order), then keys it does not know, as first seen."""
    present: dict[str, None] = {}
    for s in series:
        for key in s.values:
            present.setdefault(key, None)
    known = [k for k in table.by_key if k in present]
    return known + [k for k in present if k not in table.by_key]


@dataclass(frozen=True)
class RunInfo:
    """What the lifecycle knows about endpoints and failures (from the events file or in memory)."""

    endpoints_configured: Sequence[str] | None = None  # URLs; None → the record log's source URLs
    endpoints_successful: Sequence[str] | None = None  # reachable at configure; None → those with data
    errors: Sequence[ScrapeFailure] = ()
    states: Sequence[EndpointState] = ()


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    url: str  # redacted
    display: str
    reachable: bool  # at configure time
    up_at_end: bool  # reachable and not down at the window's end (or back up by then)
    has_data: bool
    reason: str | None = None


@dataclass(frozen=True)
class Block:
    data: dict[str, Any]
    endpoints: list[EndpointStatus] = field(default_factory=list)


def format_time(ns: int, tz: tzinfo | None = None) -> str:
    """AIPerf's summary datetime: naive local time (or naive `tz` time), µs precision, ns truncated."""
    seconds, rest = divmod(ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, tz) + timedelta(microseconds=rest // 1000)
    return stamp.replace(tzinfo=None).isoformat()


def endpoint_statuses(info: RunInfo, series: Sequence[Series], until_ns: int | None) -> list[EndpointStatus]:
    with_data = {s.endpoint for s in series}
    if info.endpoints_configured is not None:
        urls = [redact_url(u) for u in info.endpoints_configured]
    else:
        urls = list(dict.fromkeys(redact_url(s.source_url) for s in series if s.source_url))
    successful_keys = (
        {display_key(u) for u in info.endpoints_successful} if info.endpoints_successful is not None else with_data
    )
    latest: dict[str, EndpointState] = {}
    for state in sorted(info.states, key=lambda s: s.time_ns):
        if until_ns is None or state.time_ns <= until_ns:
            latest[display_key(state.endpoint)] = state
    out: list[EndpointStatus] = []
    for url in urls:
        key = display_key(url)
        reachable = key in successful_keys
        last = latest.get(key)
        up = last.state == "up" if last is not None else reachable
        reason = None
        if not up:
            reason = (last.reason if last is not None and last.reason else None) or \
                ("unreachable at configure time" if not reachable else "down")
        out.append(EndpointStatus(url, key, reachable, up, key in with_data, reason))
    return out


def gpu_keys(series: Sequence[Series]) -> dict[tuple[str, str | None], str]:
    """identity → `gpu_<index>[_mig<id>|_partition<id>][@host]`, unique within one endpoint's series."""
    by_index: dict[int | None, list[GpuMeta]] = {}
    for s in series:
        by_index.setdefault(s.meta.gpu_index, []).append(s.meta)
    keys: dict[tuple[str, str | None], str] = {}
    for index, metas in by_index.items():
        base = f"gpu_{index if index is not None else 'unknown'}"
        uuids = list(dict.fromkeys(m.gpu_uuid for m in metas))
        hosts_tell = len({m.hostname for m in metas}) == len(uuids) and all(m.hostname for m in metas)
        for meta in metas:
            key = base
            if meta.gpu_instance_id is not None:  # an AMD compute partition is named as one (normalize.py)
                key += f"_{'partition' if meta.platform == 'amd' else 'mig'}{meta.gpu_instance_id}"
            if len(uuids) > 1:
                key += f"@{meta.hostname}" if hosts_tell else f"@{meta.gpu_uuid}"
            keys[meta.identity] = key
    # Last resort (cannot happen with distinct identities, but a key must never be overwritten).
    seen: dict[str, int] = {}
    for identity, key in list(keys.items()):
        if key in seen:
            seen[key] += 1
            keys[identity] = f"{key}#{seen[key]}"
        else:
            seen[key] = 0
    return keys


class _Counted(Protocol):
    @property
    def identity(self) -> tuple[str, str | None]: ...

    @property
    def platform(self) -> str: ...


def gpus_text(gpus: Iterable[tuple[str, _Counted]]) -> str:
    """A count of (endpoint, GPU metadata) as people say it: "2 GPUs (4 MIG instances)", "8 GPUs (64 partitions)" —
    a MIG instance or an AMD compute partition (normalize.py) is part of its GPU, never a GPU of its own."""
    unique = {(endpoint, meta.identity, meta.platform) for endpoint, meta in gpus}
    count = len({(endpoint, uuid) for endpoint, (uuid, _), _ in unique})
    parts = []
    for amd, noun in ((False, "MIG instance"), (True, "partition")):
        instances = sum(1 for _, (_, instance), p in unique if instance is not None and (p == "amd") == amd)
        if instances:
            parts.append(f"{instances} {noun}{'' if instances == 1 else 's'}")
    text = f"{count} GPU{'' if count == 1 else 's'}"
    return text + (f" ({', '.join(parts)})" if parts else "")


def identity_keys(series: Sequence[Series]) -> dict[tuple[str, tuple[str, str | None]], str]:
    """(endpoint, identity) → the GPU's key in `endpoints` (as `build_block` names them)."""
    by_endpoint: dict[str, list[Series]] = {}
    for s in series:
        by_endpoint.setdefault(s.endpoint, []).append(s)
    return {(endpoint, identity): key for endpoint, members in by_endpoint.items()
            for identity, key in gpu_keys(sorted(members, key=_gpu_sort_key)).items()}


def metric_result(ts: NDArray[np.int64], values: NDArray[np.float64], label: MetricLabel, window: Window,
                  mode: CounterMode) -> dict[str, Any] | None:
    """One metric of one GPU over the window, by kind and counter mode (`values` aligned with `ts`)."""
    assert window.start_ns is not None and window.end_ns is not None
    start, end, grace, key = window.start_ns, window.end_ns, window.grace_ns, label.key
    if mode == "aiperf":
        # AIPerf's window [start, end + grace] for everything; XID is a counter there (unit "count").
        if label.kind == MetricKind.COUNTER or key == XID_KEY:
            delta = counter_delta_aiperf(ts, values, start, end + grace)
            unit = "count" if key == XID_KEY else label.unit
            return None if delta is None else {"unit": unit, "avg": delta.delta}
        if label.kind == MetricKind.CODE:
            return code_stats(ts, values, start, end + grace, label.unit)
        return gauge_stats(ts, values, start, end + grace, label.unit, count_nan_slots=True)
    if label.kind == MetricKind.COUNTER:
        return _counter_result(label.unit, counter_delta_interpolated(ts, values, start, end, grace))
    if label.kind == MetricKind.CODE:
        return code_stats(ts, values, start, end, label.unit)
    return gauge_stats(ts, values, start, end, label.unit)


def _counter_result(unit: str, delta: CounterDelta | RefreshedDelta | None, *,
                    bound: float | None = None, uncertainty: float | None = None) -> dict[str, Any] | None:
    if delta is None:
        return None
    out: dict[str, Any] = {"unit": unit, "avg": delta.delta}
    if uncertainty is not None:
        out["uncertainty"] = uncertainty  # ± the error the data supports (bridge/report/uncertainty.py)
    if delta.resets:
        out["resets"] = delta.resets
    if bound is not None:
        out["bound"] = bound  # ± how far the truth can be, in the same unit (bridge/report/refresh.py)
    return out


def refreshed_counters(s: Series, counters: Sequence[MetricLabel], cadence: Cadence, window: Window,
                       fresh_deltas: Sequence[CounterDelta | None]) -> dict[str, dict[str, Any] | None]:
    """The interpolated counters of one GPU, timed at their DCGM refresh when the values are not fresh
    (with fresh values, `fresh_deltas` as computed today); the energy counter carries its bound either way."""
    assert window.start_ns is not None and window.end_ns is not None
    out: dict[str, dict[str, Any] | None] = {}
    for label, fresh in zip(counters, fresh_deltas, strict=True):
        if fresh is None:  # no valid sample in [start, end + grace]: omitted, whatever the cadence
            out[label.key] = None
            continue
        energy_key, power_key = energy_keys(s.values)
        if s.meta.platform == "amd" and label.key == energy_key and amd_counter_state(
                s.timestamps, s.values[label.key], s.values.get(power_key), window.start_ns,
                window.end_ns + window.grace_ns, cadence.fresh) is not None:
            out[label.key] = None  # unsupported or stuck: never its 0 J (the verdict says which)
            continue
        read = window_delta(s.timestamps, s.values, label.key, cadence, window.start_ns, window.end_ns, fresh,
                            window.grace_ns, s.endpoint, s.ends)
        out[label.key] = _counter_result(label.unit, read.delta, bound=read.bound, uncertainty=read.uncertainty)
    return out


def series_metrics(s: Series, labels: Sequence[MetricLabel], window: Window, mode: CounterMode,
                   scratch: Scratch | None = None) -> dict[str, dict[str, Any]]:
    """Every metric of one GPU over the window, in `labels` order (metrics with no valid sample omitted):
    `metric_result` of each, to the bit, with the gauges and the interpolated counters computed together
    (`gauge_stats_columns`, `counter_deltas_interpolated`: a few numpy calls per GPU, not per metric). The
    columns are first gathered into one matrix (one row each, contiguous), in a work array reused from one
    GPU to the next."""
    import numpy as np

    assert window.start_ns is not None and window.end_ns is not None
    start, end, grace = window.start_ns, window.end_ns, window.grace_ns
    present = [label for label in labels if label.key in s.values]
    gauges = [label for label in present if _is_gauge(label, mode)]
    counters = [label for label in present if label.kind == MetricKind.COUNTER] if mode == "interpolated" else []
    grouped = {label.key for label in gauges + counters}
    others = [label for label in present if label.key not in grouped]
    scratch = scratch or Scratch()
    keys = [label.key for label in gauges + counters + others]
    matrix = s.matrix(keys, scratch.array("matrix", (len(keys), len(s)), np.float64))
    g, c = len(gauges), len(gauges) + len(counters)
    stats = gauge_stats_columns(s.timestamps, matrix[:g], start, end + grace if mode == "aiperf" else end,
                                [label.unit for label in gauges], count_nan_slots=mode == "aiperf", scratch=scratch)
    deltas = counter_deltas_interpolated(s.timestamps, matrix[g:c], start, end, grace, scratch=scratch)
    results: dict[str, dict[str, Any] | None] = {label.key: result for label, result in zip(gauges, stats, strict=True)}
    if mode == "interpolated":
        cadence = source_cadence(s.endpoint, s.timestamps, s.values, s.ends)
        results.update(refreshed_counters(s, counters, cadence, window, deltas))
        if not cadence.fresh:  # what the gauges rest on: how many distinct DCGM refreshes the window holds
            refreshes = refreshes_in(s.timestamps, matrix[:c], start, end)
            for label in gauges:
                if results[label.key] is not None:
                    results[label.key]["refreshes"] = refreshes  # type: ignore[index]
    results.update((label.key, metric_result(s.timestamps, row, label, window, mode))
                   for label, row in zip(others, matrix[c:], strict=True))
    metrics: dict[str, dict[str, Any]] = {}
    for label in present:
        result = results[label.key]
        if result is not None:
            metrics[label.key] = result
    return metrics


def _is_gauge(label: MetricLabel, mode: CounterMode) -> bool:
    """What `metric_result` computes with `gauge_stats` (XID is a counter in aiperf mode, as AIPerf has it)."""
    if label.kind in (MetricKind.COUNTER, MetricKind.CODE):
        return False
    return mode != "aiperf" or label.key != XID_KEY


def gpu_entry(s: Series, labels: Sequence[MetricLabel], window: Window, mode: CounterMode,
              scratch: Scratch | None = None) -> dict[str, Any]:
    meta = s.meta
    entry: dict[str, Any] = {"gpu_index": meta.gpu_index, "gpu_name": meta.gpu_name, "gpu_uuid": meta.gpu_uuid,
                             "platform": meta.platform, "hostname": meta.hostname, "namespace": meta.namespace,
                             "pod_name": meta.pod_name, "gpu_instance_id": meta.gpu_instance_id,
                             "gpu_instance_profile": meta.gpu_instance_profile}
    if meta.platform == "amd" and not meta.gpu_uuid.startswith("unknown:"):
        # keyed by the board serial (normalize.amd_identity); shown by the device UUID where the source has one,
        # as AIPerf 0.13's amdsmi collector does, the serial beside it
        entry["gpu_uuid"] = meta.device_uuid or meta.gpu_uuid
        if meta.gpu_uuid != meta.device_uuid:  # (else no serial: the key is the device UUID)
            entry["serial_number"] = meta.gpu_uuid
    entry = {k: v for k, v in entry.items() if v is not None}  # AIPerf dumps with exclude_none
    entry["metrics"] = series_metrics(s, labels, window, mode, scratch)
    return entry


def error_summary(info: RunInfo, since_ns: int | None = None, until_ns: int | None = None) -> list[dict[str, Any]]:
    """Failed scrapes and endpoints lost mid-run, grouped by (type, message), first occurrence first."""
    counts: dict[tuple[str, str], int] = {}

    def inside(t: int) -> bool:
        return (since_ns is None or t >= since_ns) and (until_ns is None or t <= until_ns)

    for failure in info.errors:
        if inside(failure.time_ns):
            k: tuple[str, str] = (failure.kind, f"{display_key(failure.endpoint)}: {failure.message}")
            counts[k] = counts.get(k, 0) + 1
    for state in info.states:
        if state.state == "down" and inside(state.time_ns):
            k = ("endpoint_down", f"{display_key(state.endpoint)}: {state.reason or 'down'}")
            counts[k] = counts.get(k, 0) + 1
    return [{"error_details": {"type": kind, "message": message}, "count": n} for (kind, message), n in counts.items()]


def energy_window(window: Window, mode: CounterMode, tz: tzinfo | None = None) -> dict[str, Any]:
    """The span the energy covers, beside AIPerf's `end_time` (which adds the grace): `[start, end]` interpolated,
    `[start, end + grace]` in AIPerf's mode, as AIPerf counts."""
    assert window.start_ns is not None and window.end_ns is not None
    end = window.end_ns + (window.grace_ns if mode == "aiperf" else 0)
    return {"start_time": format_time(window.start_ns, tz), "end_time": format_time(end, tz),
            "duration_s": (end - window.start_ns) / 1e9, "grace_s": window.grace_ns / 1e9,
            "end_time_includes_grace": mode == "aiperf"}


def build_block(series: Sequence[Series], window: Window, table: FieldTable, mode: CounterMode, info: RunInfo,
                *, tz: tzinfo | None = None, errors_between: tuple[int | None, int | None] = (None, None)) -> Block:
    """`telemetry_data` for one window; `window` must be resolved (no open bound) unless there is no data."""
    statuses = endpoint_statuses(info, series, None if window.end_ns is None else window.end_ns + window.grace_ns)
    summary: dict[str, Any] = {
        "endpoints_configured": [s.url for s in statuses],
        "endpoints_successful": [s.url for s in statuses if s.up_at_end],
    }
    if window.start_ns is not None:
        summary["start_time"] = format_time(window.start_ns, tz)
    if window.end_ns is not None:
        summary["end_time"] = format_time(window.end_ns + window.grace_ns, tz)
    if window.start_ns is not None and window.end_ns is not None:
        # AIPerf 0.13 writes end_time with the final scrape's grace; the energy and the gauges of the interpolated
        # mode end at the window's end, so energy ÷ (end_time − start_time) would read low (issue 44): say which.
        summary["energy_window"] = energy_window(window, mode, tz)
    summary["counter_mode"] = mode
    labels = [label_for(k, table) for k in ordered_keys(series, table)]
    scratch = Scratch()
    endpoints: dict[str, Any] = {}
    warnings: list[str] = []
    by_endpoint: dict[str, list[Series]] = {}
    for s in series:
        by_endpoint.setdefault(s.endpoint, []).append(s)
    order = [st.display for st in statuses if st.display in by_endpoint]
    order += [e for e in by_endpoint if e not in order]
    for endpoint in order:
        members = sorted(by_endpoint[endpoint], key=_gpu_sort_key)
        keys = gpu_keys(members)
        gpus: dict[str, Any] = {}
        if window.start_ns is not None and window.end_ns is not None:
            for s in members:
                gpus[keys[s.meta.identity]] = gpu_entry(s, labels, window, mode, scratch)
        endpoints[endpoint] = {"gpus": gpus}
        if mode == "interpolated":
            cadences = [source_cadence(s.endpoint, s.timestamps, s.values, s.ends) for s in members]
            cadence = endpoint_cadence(cadences)
            speaker = members[cadences.index(cadence)]
            endpoints[endpoint]["refresh"] = refresh_summary(cadence, field_periods(speaker.timestamps,
                                                                                    speaker.values, cadence))
            warning = refresh_warning(endpoint, cadence, window)
            if warning:
                warnings.append(warning)
    if warnings:
        summary["refresh_warning"] = "; ".join(warnings)
    data = {"summary": summary, "endpoints": endpoints, "error_summary": error_summary(info, *errors_between)}
    return Block(data, statuses)


def refresh_summary(cadence: Cadence, fields: Mapping[str, float] | None = None) -> dict[str, Any]:
    """An endpoint's DCGM refresh as the scrapes saw it (beside AIPerf's `gpus`), and the fields DCGM refreshes
    on a slower grid of their own (report key → period in s)."""
    out: dict[str, Any] = {"fresh": cadence.fresh, "period_s": cadence.period_s, "refreshes": cadence.refreshes,
                           "scrapes": cadence.scrapes}
    if cadence.at_least:
        out["period_at_least"] = True  # fewer than two new values: the period is at least this
    if fields:
        out["fields"] = dict(fields)
    return out


def refresh_warning(endpoint: str, cadence: Cadence, window: Window) -> str | None:
    """Said when the window spans fewer than two of the endpoint's refreshes."""
    if cadence.fresh or not cadence.period_s or window.start_ns is None or window.end_ns is None:
        return None
    length = (window.end_ns - window.start_ns) / 1e9
    if length >= MIN_REFRESHES_PER_WINDOW * cadence.period_s:
        return None
    every = f"{'at most once in' if cadence.at_least else 'every'} {cadence.period_s:.1f} s"
    return f"the energy rests on too few DCGM refreshes: {endpoint} refreshed {every} and the window is " \
           f"{length:.1f} s; {REFRESH_FIX}"


def _gpu_sort_key(s: Series) -> tuple[int, str, str]:
    meta = s.meta
    index = meta.gpu_index if meta.gpu_index is not None else 1 << 30
    instance = meta.gpu_instance_id or ""
    return (index, meta.hostname or "", f"{len(instance):03d}{instance}")
