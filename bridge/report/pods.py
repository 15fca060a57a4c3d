"""`report --gpu-pods`: only the GPUs that served the benchmark's pods, each for the part of the window it served them.

The record log keeps every GPU with the pod the exporter attributed it to at each scrape (bridge/pods.py reads
the labels), so the selection is made per sample:

- A scrape's attribution holds until the GPU's next scrape (sample and hold). A GPU is *in* from the first
  scrape that shows a matching pod and *out* at the first later scrape that shows another pod or none; a
  GPU's first scrape holds back to the window's start and its last one up to the window's end. So a pod
  restarted under another matching name keeps its GPU, and a GPU handed to another pod leaves at that scrape.
  Because attribution holds, a timeline needs only the scrapes where a GPU's pods change and its last one:
  the live run keeps just those (`Timelines`), and gives the same selection as every scrape of the log.
- Each span is cut out of the window as a phase is (`Window(start, end, grace)` through the same counter
  functions), so its edges are interpolated as phase edges are.
- A GPU whose UUID, in one scrape, serves a matching pod and another pod too (MIG instances, time-slicing,
  MPS) is not counted: its energy is the whole board's. It is listed apart with reason
  `gpu_shared_with_other_pods`, and how it is shared (`mig`, or `time_slicing_or_mps` when one GPU's series
  named several pods at once). The record log keeps one pod per GPU and scrape; the others come from the events
  file's `gpu_shared` events (`with_shared`), which the sidecar writes from the pages.
- In the `aiperf` counter mode a GPU's pod is frozen at its first record, as AIPerf keeps it.
- `report --gpu-pod-selector NAMESPACE/SELECTOR` selects the pods the run recorded (the events file's `pods`
  events: every pod the run's selectors resolved to, with its labels) that the selector picks, as
  `--gpu-pods NAMESPACE/NAME` would (`patterns_of_selectors`): the selector applied offline, as the API applied it.
- Nothing selected is reported as such (reason `no_gpu_selected`, with `no_pod_labels` or `no_matching_pod`
  telling which fix applies), never by falling back to every GPU.

The reasons are data (`PodSelection.reasons`) for the run's validity verdict; this module builds no verdict.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.discovery import PodSelector, selector_matches
from bridge.endpoints import display_key
from bridge.events import GpuShared, PodsResolved
from bridge.pods import FIX, PodPattern, PodRef, attribution, shared_board
from bridge.record_log import read_dicts
from bridge.report.energy import energy_totals
from bridge.report.series import Series
from bridge.report.window import Phase, Window, phase_window
from bridge.samples import CounterMode, GpuRecord

if TYPE_CHECKING:
    from bridge.report.build import Report
    from bridge.report.telemetry_data import EndpointStatus

NO_GPU_SELECTED = "no_gpu_selected"
NO_POD_LABELS = "no_pod_labels"
NO_MATCHING_POD = "no_matching_pod"
GPU_SHARED = "gpu_shared_with_other_pods"


GpuKey = tuple[str, str, str | None]  # (endpoint display key, GPU UUID, MIG instance)
# one GPU's scrapes in time order: (time, the pods its records at that time name; None for an unattributed one)
Timeline = list[tuple[int, frozenset[PodRef | None]]]


@dataclass(frozen=True, slots=True)
class Span:
    """A stretch of the window a GPU served the same matching pods, and those pods."""

    start_ns: int
    end_ns: int
    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ServedGpu:
    series: Series
    spans: tuple[Span, ...]
    energy_j: float | None  # over its spans; None without an energy counter or power samples

    @property
    def pods(self) -> tuple[str, ...]:
        return tuple(sorted({p for span in self.spans for p in span.pods}))


@dataclass(frozen=True, slots=True)
class SharedGpu:
    series: Series
    pods: tuple[str, ...]  # every pod seen on the board while it served a matching one
    reason: str = GPU_SHARED
    sharing: str = "mig"  # or "time_slicing_or_mps": several pods on the GPU (instance) itself


@dataclass(frozen=True, slots=True)
class PodSelection:
    patterns: tuple[PodPattern, ...]
    selected: tuple[ServedGpu, ...]
    shared: tuple[SharedGpu, ...]
    other_pod: int  # GPUs scraped that served only other pods in the window
    unattributed: int  # GPUs scraped that no pod held in the window
    reasons: tuple[str, ...]
    pods_by_phase: Mapping[str, Mapping[str, tuple[str, ...]]]  # phase → pod → GPU UUIDs

    @property
    def not_selected(self) -> int:
        return len(self.shared) + self.other_pod + self.unattributed

    @property
    def energy_j(self) -> float | None:
        energies = [g.energy_j for g in self.selected if g.energy_j is not None]
        return sum(energies) if energies else None

    @property
    def warning(self) -> str | None:
        wanted = ", ".join(map(str, self.patterns))
        if NO_POD_LABELS in self.reasons:
            return f"no GPU carries pod labels (namespace/pod), so none can be matched to {wanted}: {FIX}"
        if NO_MATCHING_POD in self.reasons:
            return f"no GPU is attributed to a pod matching {wanted}; check the pattern, and that {FIX}"
        return None

    def summary_line(self) -> str:
        """The one line that counts every GPU scraped but not selected."""
        return (f"{len(self.selected)} GPUs served pods matching {', '.join(map(str, self.patterns))}; "
                f"{self.not_selected} scraped but not selected ({len(self.shared)} shared with other pods, "
                f"{self.other_pod} in other pods, {self.unattributed} unattributed)")

    def to_dict(self) -> dict[str, Any]:
        return {
            "patterns": [str(p) for p in self.patterns],
            "gpus": [{"endpoint": g.series.endpoint, "gpu_uuid": g.series.meta.gpu_uuid,
                      "gpu_instance_id": g.series.meta.gpu_instance_id, "pods": list(g.pods), "energy_j": g.energy_j,
                      "spans": [{"start_ns": s.start_ns, "end_ns": s.end_ns, "pods": list(s.pods)} for s in g.spans]}
                     for g in self.selected],
            "shared": [{"endpoint": g.series.endpoint, "gpu_uuid": g.series.meta.gpu_uuid,
                        "gpu_instance_id": g.series.meta.gpu_instance_id, "pods": list(g.pods), "reason": g.reason,
                        "sharing": g.sharing}
                       for g in self.shared],
            "pods_by_phase": {phase: {pod: list(gpus) for pod, gpus in pods.items()}
                              for phase, pods in self.pods_by_phase.items()},
            "not_selected": {"total": self.not_selected, "shared": len(self.shared), "other_pod": self.other_pod,
                             "unattributed": self.unattributed},
            "energy_j": self.energy_j,
            "reasons": list(self.reasons),
        }


def patterns_of_selectors(resolved: Iterable[PodsResolved], selectors: Sequence[PodSelector]) -> tuple[PodPattern, ...]:
    """The recorded pods each selector picks (by its namespace and labels), as exact `--gpu-pods` patterns."""
    picked = {(pod.namespace, pod.name) for event in resolved for pod in event.pods for sel in selectors
              if pod.namespace == sel.namespace and selector_matches(sel.selector, pod.labels)}
    return tuple(PodPattern(namespace, name) for namespace, name in sorted(picked))


# -- the pods each GPU served, per scrape ---------------------------------------------------------------

def timelines_of_records(records: Iterable[GpuRecord]) -> dict[GpuKey, Timeline]:
    return _timelines((display_key(r.telemetry_source_url), r.gpu_uuid, r.gpu_instance_id, r.timestamp_ns,
                       r.namespace, r.pod_name) for r in records)


def timelines_of_log(path: Path) -> dict[GpuKey, Timeline]:
    """The same from a record log (ours or AIPerf's); lines the report cannot read are skipped here too."""
    return _timelines(_row_of(obj) for obj in read_dicts(path) if isinstance(obj.get("timestamp_ns"), int))


def _row_of(obj: Mapping[str, Any]) -> tuple[str, str, str | None, int, Any, Any]:
    url = str(obj.get("telemetry_source_url") or obj.get("dcgm_url") or "")
    uuid = str(obj.get("gpu_uuid") or f"unknown:{obj.get('hostname') or ''}:{obj.get('gpu_index')}")
    return (display_key(url), uuid, obj.get("gpu_instance_id"), obj["timestamp_ns"], obj.get("namespace"),
            obj.get("pod_name"))


def _timelines(rows: Iterable[tuple[str, str, str | None, int, Any, Any]]) -> dict[GpuKey, Timeline]:
    seen: dict[GpuKey, dict[int, set[PodRef | None]]] = {}
    for endpoint, uuid, instance, t_ns, namespace, pod in rows:
        seen.setdefault((endpoint, uuid, instance), {}).setdefault(t_ns, set()).add(_ref(namespace, pod))
    return {key: [(t, frozenset(pods)) for t, pods in sorted(times.items())] for key, times in seen.items()}


def _ref(namespace: Any, pod: Any) -> PodRef | None:
    return PodRef(namespace, pod) if isinstance(namespace, str) and isinstance(pod, str) and namespace and pod \
        else None


def pods_of_records(endpoint: str, records: Iterable[GpuRecord]) -> dict[GpuKey, frozenset[PodRef | None]]:
    """The pods each GPU of one page of `endpoint` (its display key) is attributed to."""
    pods: dict[GpuKey, set[PodRef | None]] = {}
    for r in records:
        pods.setdefault((endpoint, r.gpu_uuid, r.gpu_instance_id), set()).add(_ref(r.namespace, r.pod_name))
    return {key: frozenset(refs) for key, refs in pods.items()}


def with_shared(timelines: Mapping[GpuKey, Timeline], shared: Iterable[GpuShared]) -> dict[GpuKey, Timeline]:
    """`timelines` with the pods the events file says a GPU's series named at once (`gpu_shared`: time-slicing,
    MPS), of which the record log keeps one per scrape: from each such event to its GPU's next, all of them."""
    changes: dict[GpuKey, Timeline] = {}
    for event in shared:
        pods = frozenset(_ref(*name.split("/", 1)) for name in event.pods if "/" in name)
        changes.setdefault((display_key(event.endpoint), event.gpu_uuid, event.gpu_instance_id), []).append(
            (event.time_ns, pods))
    out = dict(timelines)
    for key, said in changes.items():
        timeline = timelines.get(key)
        if not timeline:
            continue
        said.sort(key=lambda change: change[0])
        times = sorted({t for t, _ in timeline} | {t for t, _ in said})
        out[key] = [(t, _held(timeline, t) | _said_at(said, t)) for t in times]
    return out


def _said_at(said: Timeline, t_ns: int) -> frozenset[PodRef | None]:
    at = bisect_right(said, t_ns, key=lambda entry: entry[0]) - 1
    return said[at][1] if at >= 0 else frozenset()


class Timelines:
    """Each GPU's pods as its scrapes come (the live run), kept as the scrapes where they change plus each GPU's
    latest: memory that grows with reassignments, not with scrapes. `add` takes a GPU's scrapes in time order."""

    def __init__(self) -> None:
        self._changes: dict[GpuKey, Timeline] = {}
        self._latest: dict[GpuKey, int] = {}

    def add(self, key: GpuKey, t_ns: int, pods: frozenset[PodRef | None]) -> None:
        changes = self._changes.setdefault(key, [])
        if not changes or changes[-1][1] != pods:
            changes.append((t_ns, pods))
        self._latest[key] = t_ns

    def timelines(self) -> dict[GpuKey, Timeline]:
        out: dict[GpuKey, Timeline] = {}
        for key, changes in self._changes.items():
            latest, last = self._latest[key], changes[-1]
            out[key] = changes + [(latest, last[1])] if latest != last[0] else list(changes)
        return out


# -- the selection -------------------------------------------------------------------------------------

def served_spans(timeline: Timeline, patterns: Sequence[PodPattern], window: Window) -> tuple[Span, ...]:
    """The stretches of `window` this GPU served a matching pod (sample and hold, see the module docstring)."""
    start, end = window.start_ns, window.end_ns
    if start is None or end is None or not timeline:
        return ()
    spans: list[Span] = []
    opened: int | None = None
    pods: set[str] = set()
    for position, (t_ns, refs) in enumerate(timeline):
        matching = {str(r) for r in refs if attribution(patterns, r) == "selected"}
        if opened is not None and matching != pods:  # handed to another pod, or its pod restarted: a new span
            spans.append(Span(opened, t_ns, tuple(sorted(pods))))
            opened = None
        if matching and opened is None:
            opened, pods = (start if position == 0 else t_ns), matching
    if opened is not None:
        spans.append(Span(opened, end, tuple(sorted(pods))))
    cut = [Span(max(s.start_ns, start), min(s.end_ns, end), s.pods) for s in spans]
    return tuple(s for s in cut if s.start_ns < s.end_ns)


def select_gpus(series: Sequence[Series], timelines: Mapping[GpuKey, Timeline], patterns: Sequence[PodPattern],
                window: Window, mode: CounterMode, phases: Sequence[Phase] = ()) -> PodSelection:
    """Which of the report's series served matching pods in `window`, for how long, and what that cost."""
    boards = _board_pods(timelines, patterns, window)
    selected: list[ServedGpu] = []
    shared: list[SharedGpu] = []
    other = unattributed = 0
    labelled = False
    for s in series:
        timeline = timelines.get((s.endpoint, s.meta.gpu_uuid, s.meta.gpu_instance_id), [])
        if mode == "aiperf":  # AIPerf keeps a GPU's pod as its first record named it (the GpuMetadata it caches)
            timeline = timeline[:1]
        in_window = _during(timeline, window)
        labelled = labelled or any(r is not None for refs in in_window for r in refs)
        spans = served_spans(timeline, patterns, window)
        if not spans:
            if any(r is not None for refs in in_window for r in refs):
                other += 1
            else:
                unattributed += 1
            continue
        board = boards.get((s.endpoint, s.meta.gpu_uuid))
        if board:
            several = any(len({r for r in refs if r is not None}) > 1 for refs in in_window)
            shared.append(SharedGpu(s, tuple(sorted(str(r) for r in board if r is not None)),
                                    sharing="time_slicing_or_mps" if several else "mig"))
            continue
        selected.append(ServedGpu(s, spans, _energy(s, spans, window.grace_ns, mode)))
    reasons: list[str] = []
    if not selected:
        reasons += [NO_GPU_SELECTED, NO_MATCHING_POD if labelled else NO_POD_LABELS]
    if shared:
        reasons.append(GPU_SHARED)
    return PodSelection(tuple(patterns), tuple(selected), tuple(shared), other, unattributed, tuple(reasons),
                        _pods_by_phase(selected, phases, window))


def _inside(t_ns: int, window: Window) -> bool:
    return window.start_ns is not None and window.end_ns is not None and window.start_ns <= t_ns <= window.end_ns


def _held(timeline: Timeline, t_ns: int) -> frozenset[PodRef | None]:
    """The pods a GPU's scrapes attribute it to at `t_ns`: its latest scrape then, or its first one (held back)."""
    at = bisect_right(timeline, t_ns, key=lambda entry: entry[0]) - 1
    return timeline[max(at, 0)][1]


def _during(timeline: Timeline, window: Window) -> list[frozenset[PodRef | None]]:
    """The pods a GPU was attributed to during `window`: held at its start, then at each scrape in it."""
    if window.start_ns is None or not timeline:
        return [refs for _, refs in timeline[-1:]]
    return [_held(timeline, window.start_ns), *(refs for t, refs in timeline if _inside(t, window))]


def _board_pods(timelines: Mapping[GpuKey, Timeline], patterns: Sequence[PodPattern],
                window: Window) -> dict[tuple[str, str], set[PodRef | None]]:
    """Per board (endpoint, UUID): the pods on it at the moments in the window (its start, and each scrape of one
    of its GPUs in it) where it served a matching pod and another pod too."""
    boards: dict[tuple[str, str], list[Timeline]] = {}
    for (endpoint, uuid, _), timeline in timelines.items():
        if timeline:  # (what a board holds changes only where one of its GPUs' pods change)
            changes = [entry for n, entry in enumerate(timeline) if n == 0 or timeline[n - 1][1] != entry[1]]
            boards.setdefault((endpoint, uuid), []).append(changes)
    out: dict[tuple[str, str], set[PodRef | None]] = {}
    if window.start_ns is None:
        return out
    for board, gpus in boards.items():
        moments = {window.start_ns, *(t for timeline in gpus for t, _ in timeline if _inside(t, window))}
        for t_ns in moments:
            on_board = {r for timeline in gpus for r in _held(timeline, t_ns)}
            if shared_board(patterns, on_board):
                out.setdefault(board, set()).update(on_board)
    return out


def _energy(s: Series, spans: Sequence[Span], grace_ns: int, mode: CounterMode) -> float | None:
    parts = [energy_totals([s], Window(span.start_ns, span.end_ns, grace_ns), mode).total_energy_j for span in spans]
    known = [p for p in parts if p is not None]
    return sum(known) if known else None


def _pods_by_phase(selected: Sequence[ServedGpu], phases: Sequence[Phase],
                   window: Window) -> dict[str, dict[str, tuple[str, ...]]]:
    """Phase → pod → the GPU UUIDs that served it in that phase (the whole window as "window" without phases)."""
    cuts = [(p.name, phase_window(p, window, phases)) for p in phases] or [("window", window)]
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for name, cut in cuts:
        if cut.start_ns is None or cut.end_ns is None:
            continue
        pods: dict[str, set[str]] = {}
        for gpu in selected:
            for span in gpu.spans:
                if span.start_ns < cut.end_ns and cut.start_ns < span.end_ns:
                    for pod in span.pods:
                        pods.setdefault(pod, set()).add(gpu.series.meta.gpu_uuid)
        out[name] = {pod: tuple(sorted(gpus)) for pod, gpus in sorted(pods.items())}
    return out


# -- the report of the selected GPUs ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Chosen:
    """The selected series, as a SeriesSource the builder takes."""

    series: tuple[Series, ...]
    records: int

    def finish(self) -> list[Series]:
        return list(self.series)


def report_for_pods(built: Report, timelines: Mapping[GpuKey, Timeline], patterns: Sequence[PodPattern],
                    **build_kwargs: Any) -> tuple[Report, PodSelection]:
    """`built` (a report of every GPU) rebuilt with the selected GPUs only, its energy over their spans, and the
    selection under `telemetry_data["pods"]`. `build_kwargs` are what `built` was built with."""
    from bridge.report.build import build_report

    selection = select_gpus(built.series, timelines, patterns, built.window, built.counter_mode, built.phases)
    chosen = tuple(g.series for g in selection.selected)
    kwargs = {**build_kwargs, "window": built.window, "phases": built.phases, "counter_mode": built.counter_mode}
    kwargs.pop("marks", None)
    report = build_report(_Chosen(chosen, sum(len(s) for s in chosen)), **kwargs)
    energy = selection.energy_j
    duration = report.energy.duration_s
    totals = replace(report.energy, total_energy_j=energy,
                     average_power_w=energy / duration if energy is not None and duration > 0 else None)
    data = {**report.telemetry_data, "pods": selection.to_dict()}
    if "measurement" in data and selection.reasons:  # the selection's reasons join the run's verdict
        from bridge.report.verdict import with_reasons

        verdict = data["measurement"]
        if not chosen and any(s.endpoint for s in built.series):  # samples were read: only the selection is empty
            verdict = {**verdict, "reasons": [r for r in verdict.get("reasons", ()) if r != "no_data"],
                       "fixes": {k: v for k, v in verdict.get("fixes", {}).items() if k != "no_data"}}
        data["measurement"] = with_reasons(verdict, selection.reasons)
    return replace(report, telemetry_data=data, energy=totals, records=built.records, read_errors=built.read_errors,
                   endpoints=_endpoints_read(built, chosen, selection.reasons)), selection


def _endpoints_read(built: Report, chosen: Sequence[Series], reasons: Sequence[str]) -> list[EndpointStatus]:
    """The endpoints as read (every GPU's samples), each whose GPUs were all left out by the selection saying so:
    its samples were read, the selection took none of them."""
    taken = {s.endpoint for s in chosen}
    records: dict[str, int] = {}
    for s in built.series:
        records[s.endpoint] = records.get(s.endpoint, 0) + len(s)
    why = "no GPU carries pod labels" if NO_POD_LABELS in reasons else "none attributed to a matching pod"
    return [replace(status, reason=f"{records[status.display]} records read; no GPU of it selected by --gpu-pods: "
                                   f"{why}")
            if status.up_at_end and status.display in records and status.display not in taken else status
            for status in built.endpoints]
