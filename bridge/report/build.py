"""The report builder's entry point: record log + phase marks (or manifest, or explicit ns) → `Report`.

Pure: nothing here writes a file or prints; `write.py` and `console.py` take the `Report`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import tzinfo
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# The statistics need numpy (~0.12-0.25 CPU-s to import here), and importing the builder is when to pay for it:
# the sidecar imports this module when it builds the report, not while it collects (issue 48: held for the whole
# run, the report's modules were 17 MiB of its RSS; at the end they fit the shutdown budget, tests/kube).
import numpy  # noqa: F401

from bridge.endpoints import display_key
from bridge.events import IdleWindow
from bridge.fields import FieldTable
from bridge.report.energy import EnergyTotals, energy_totals, has_energy, vendor_series
from bridge.report.events import EndpointState, RunEvents, load_events
from bridge.report.idle import idle_block
from bridge.report.phases import PhaseFile, phase_files
from bridge.report.requests import Attribution, RequestsRead, attribute, requests_block
from bridge.report.roles import PodLabels, gpu_roles, role_kinds, roles_block
from bridge.report.runs import LogRead, read_log
from bridge.report.sanity import CounterCheck, sanitize
from bridge.report.series import Series, SeriesAccumulator
from bridge.report.steady import steady_block
from bridge.report.telemetry_data import (
    EndpointStatus,
    MetricLabel,
    RunInfo,
    build_block,
    identity_keys,
    label_for,
    ordered_keys,
)
from bridge.report.verdict import file_sha256, measurement, window_and_hash
from bridge.report.window import DEFAULT_GRACE_NS, Phase, Window, phases_from_marks, window_from_phases
from bridge.roles import RoleRule
from bridge.samples import COUNTER_MODES, DEFAULT_COUNTER_MODE, CounterMode, GpuRecord, PhaseMark, ScrapeFailure
from bridge.select import describe, duplicate_reason, kept_of, select_series

logger = logging.getLogger(__name__)


@runtime_checkable
class SeriesSource(Protocol):
    """Series already collected: a SeriesAccumulator, or the sidecar's sidecar.spool.LiveSeries."""

    @property
    def records(self) -> int: ...

    def finish(self) -> list[Series]: ...


Records = Path | LogRead | Iterable[GpuRecord] | SeriesSource


@dataclass(frozen=True)
class Report:
    telemetry_data: dict[str, Any]
    energy: EnergyTotals
    phase_files: list[PhaseFile]
    labels: dict[str, MetricLabel]  # report key → display name, unit, kind (for the CSV and the console)
    endpoints: list[EndpointStatus]
    counter_mode: CounterMode
    window: Window  # resolved: no open bound unless there was no data at all
    phases: list[Phase] = field(default_factory=list)
    records: int = 0
    read_errors: list[str] = field(default_factory=list)
    # What the report was built from (one per endpoint and GPU): the HTML page and the demo draw these
    # instead of reading the record log again.
    series: tuple[Series, ...] = field(default=(), repr=False, compare=False)
    amd_energy: EnergyTotals | None = None  # AMD GPUs' (the amd_* family); None without AMD energy or power
    requests: Attribution | None = None  # per-request energy (report/requests.py), when the benchmark's file was read

    def vendor_energy(self) -> list[tuple[str, EnergyTotals]]:
        """The totals to show, one per vendor (`nvidia`, `amd`), NVIDIA's first: NVIDIA's unless the run's GPUs
        are all AMD ones."""
        nvidia = self.amd_energy is None or has_energy(vendor_series(self.series))
        return [*([("nvidia", self.energy)] if nvidia else []),
                *([("amd", self.amd_energy)] if self.amd_energy is not None else [])]

    @property
    def writes_phase_files(self) -> bool:
        """AIPerf writes phases/*/gpu_telemetry.json only when the run has more than one phase."""
        return len(self.phases) > 1


def build_report(
    records: Records,
    *,
    marks: Sequence[PhaseMark] = (),
    phases: Sequence[Phase] | None = None,
    window: Window | None = None,
    requests_end_ns: int | None = None,
    table: FieldTable | None = None,
    counter_mode: CounterMode = DEFAULT_COUNTER_MODE,
    grace_ns: int = DEFAULT_GRACE_NS,
    endpoints_configured: Sequence[str] | None = None,
    endpoints_successful: Sequence[str] | None = None,
    errors: Sequence[ScrapeFailure] = (),
    endpoint_states: Sequence[EndpointState] = (),
    tz: tzinfo | None = None,
    record_log: Path | LogRead | None = None,
    record_log_run: str | None = None,
    events_file: Path | None = None,
    requests: RequestsRead | None = None,
    role_rules: Sequence[RoleRule] = (),
    pod_labels: PodLabels | None = None,
    idle_windows: Sequence[IdleWindow] = (),
) -> Report:
    """Build the whole report.

    The window comes from, in order: `window` (explicit), `phases` (e.g. AIPerf's manifest), `marks`.
    `requests_end_ns` ends the profiling window when known (else the last profiling end mark); a run with
    no profiling phase reports all data. `endpoints_configured=None` takes the record log's source URLs,
    `endpoints_successful=None` those that produced records. `tz` is for tests (default: local time).
    `record_log` (default: `records` when it is a record log): the file whose SHA-256 the verdict stores, for
    `dcgm-bridge validate` (hashed as it was read when it is a `LogRead`, or the log `records` was read from; else
    read here for it); `record_log_run`, the run the records were taken from when the log holds several.
    """
    if counter_mode not in COUNTER_MODES:
        raise ValueError(f"counter_mode must be one of {', '.join(COUNTER_MODES)}, got {counter_mode!r}")
    from bridge.fields import default_table

    table = table or default_table()
    if isinstance(records, Path):
        records = read_log(records)  # one pass: the series, the unreadable lines and the SHA-256
    read_errors: list[str] = []
    series, count = _series_of(records, read_errors)
    # The selection stage, as live (bridge/select.py): the series of an endpoint that duplicates another's GPUs
    # are left out, whether the live run dropped it (its `duplicate` state) or the log holds both.
    dropped_live = {s.endpoint: kept for s in endpoint_states if s.state == "duplicate"
                    for kept in [kept_of(s.reason)] if kept is not None}
    every_series = series
    series, duplicates = select_series(series, endpoints_configured or (), dropped_live)
    endpoint_states = [*endpoint_states, *_found_here(every_series, duplicates, dropped_live)]
    checks: dict[tuple[str, tuple[str, str | None]], CounterCheck] = {}
    if counter_mode == "interpolated":  # AIPerf's mode keeps AIPerf's values, impossible ones included
        series, checks = sanitize(series)
    run_phases = list(phases) if phases is not None else phases_from_marks(marks)
    if window is None:
        window = window_from_phases(run_phases, requests_end_ns, grace_ns)
    if window.is_open and idle_windows:  # a run with no phases: the benchmark is what lies between its idle windows
        befores = [w.end_ns for w in idle_windows if w.which == "before"]
        afters = [w.start_ns for w in idle_windows if w.which == "after"]
        window = Window(window.start_ns if window.start_ns is not None else max(befores, default=None),
                        window.end_ns if window.end_ns is not None else min(afters, default=None), window.grace_ns)
    first, last = _span(series)
    resolved = window.resolved(first, last)
    info = RunInfo(endpoints_configured, endpoints_successful, errors, endpoint_states)
    block = build_block(series, resolved, table, counter_mode, info, tz=tz)
    if duplicates:  # which endpoint was dropped, and for which it was a duplicate
        block.data["summary"]["duplicate_endpoints"] = [{"endpoint": d, "duplicate_of": k}
                                                         for d, k in duplicates.items()]
    files = phase_files(series, run_phases, resolved, table, counter_mode, info, last_sample_ns=last, tz=tz)
    labels = {k: label_for(k, table) for k in ordered_keys(series, table)}
    energy = energy_totals(series, resolved, counter_mode)
    amd_energy = energy_totals(series, resolved, counter_mode, "amd") if has_energy(vendor_series(series, "amd")) \
        else None
    if resolved.start_ns is not None and resolved.end_ns is not None:  # after error_summary
        block.data["measurement"] = measurement(series, identity_keys(series), resolved, energy, checks, errors,
                                                amd_energy)
        block.data["measurement"].update(window_and_hash(resolved, *_log_hash(records, record_log), record_log_run,
                                                         events_file))
    attribution = None
    gpu_series = vendor_series(series)  # (the GPUs `energy.gpus` holds, in its order)
    placed = gpu_roles(gpu_series, role_rules, pod_labels) if role_rules or pod_labels else {}
    if placed and energy.gpus:
        block.data["roles"] = roles_block(gpu_series, energy.gpus, placed, energy.duration_s,
                                          requests.requests if requests is not None else None)
    idle = idle_block(gpu_series, energy.gpus, idle_windows, resolved) if energy.gpus else None
    if idle is not None:
        block.data["idle"] = idle
    if requests is not None and resolved.start_ns is not None and resolved.end_ns is not None and energy.gpus:
        attribution = attribute(requests.requests, zip(gpu_series, energy.gpus, strict=True),
                                resolved.start_ns, resolved.end_ns, role_kinds(placed))
        block.data["requests"] = requests_block(attribution, requests)
        steady = steady_block(gpu_series, resolved, requests.requests, energy.total_energy_j)
        if steady is not None:
            block.data["steady_state"] = steady
    return Report(
        telemetry_data=block.data,
        energy=energy,
        amd_energy=amd_energy,
        phase_files=files,
        labels=labels,
        endpoints=block.endpoints,
        counter_mode=counter_mode,
        window=resolved,
        phases=run_phases,
        records=count,
        read_errors=read_errors,
        series=tuple(series),
        requests=attribution,
    )


def event_kwargs(events: Path | RunEvents) -> dict[str, Any]:
    """What `build_report` takes from the events file: marks, requests end, endpoints, errors and states."""
    run = events if isinstance(events, RunEvents) else load_events(events)
    return {
        "marks": run.marks,
        "requests_end_ns": run.requests_end_ns,
        "endpoints_configured": run.endpoints_configured,
        "endpoints_successful": run.endpoints_successful,
        "errors": run.errors,
        "endpoint_states": run.states,
        "pod_labels": pod_labels_of(run),
        "idle_windows": run.idle,
    }


def pod_labels_of(run: RunEvents) -> PodLabels | None:
    """The labels of the pods the run's `--gpu-pod-selector` resolved (the latest seen of each), by (namespace,
    name); None when it recorded none."""
    labels = {(p.namespace, p.name): p.labels for event in run.pods for p in event.pods}
    return labels or None


def build_report_from_events(records: Records, events: Path | RunEvents, **kwargs: Any) -> Report:
    """`build_report` with marks, requests end, endpoints, errors and states read from the events file (whose
    SHA-256 the verdict stores when it is given as a file)."""
    if isinstance(events, Path):
        kwargs.setdefault("events_file", events)
    return build_report(records, **{**event_kwargs(events), **kwargs})


def _series_of(records: LogRead | Iterable[GpuRecord] | SeriesSource, read_errors: list[str]
               ) -> tuple[list[Series], int]:
    if isinstance(records, LogRead):
        read_errors.extend(records.errors)
    if isinstance(records, SeriesSource):
        return records.finish(), records.records
    acc = SeriesAccumulator().add_all(records)
    return acc.finish(), acc.records


def _log_hash(records: object, record_log: Path | LogRead | None) -> tuple[str | None, str | None]:
    """The record log's file name and SHA-256 (None when there is no log, or it cannot be read): from the pass
    that read it when the report was built from it, else by reading it now."""
    if record_log is None and isinstance(records, LogRead):
        record_log = records
    if isinstance(record_log, Path) and isinstance(records, LogRead) and records.path == record_log:
        record_log = records
    if isinstance(record_log, LogRead):
        return record_log.path.name, record_log.sha256
    if record_log is None:
        return None, None
    return record_log.name, file_sha256(record_log)


def _found_here(series: Sequence[Series], duplicates: dict[str, str], dropped_live: dict[str, str]
                ) -> list[EndpointState]:
    """The duplicates the rule found in the log (not decided by the live run: a log that holds both), each said
    in one log line and as the endpoint's state, so its status reads `duplicate of …` as a live run's would."""
    live = {display_key(e) for e in dropped_live}
    urls = {s.endpoint: s.source_url for s in series}
    first = _span(series)[0] or 0
    out = []
    for dropped, kept in duplicates.items():
        if dropped not in live and dropped in urls:
            logger.warning("%s", describe(dropped, kept))
            out.append(EndpointState(urls[dropped], first, "duplicate", duplicate_reason(kept)))
    return out


def _span(series: Sequence[Series]) -> tuple[int | None, int | None]:
    firsts = [int(s.timestamps[0]) for s in series if len(s)]
    lasts = [int(s.timestamps[-1]) for s in series if len(s)]
    return (min(firsts) if firsts else None, max(lasts) if lasts else None)
