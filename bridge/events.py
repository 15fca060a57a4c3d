"""gpu_telemetry_events.jsonl's schema: one frozen record per event kind, one encode/decode pair.

Everything of a run that is not a GPU record goes to the events file, one JSON object per line with a
`type`; the sidecar writes it (record_log.LineWriter.write_event), the report reads it (report/events.py).

    type            record            fields (in the order written)
    configured      `Configured`      time_ns, run_id, endpoints_configured, endpoints_successful, counter_mode,
                                      grace_ns (the final-scrape grace, so `validate` can rebuild the window)
    phase           `PhaseMark`       name, kind, event, time_ns
                                      (posted; or, at the end of a run that posted none, the phases it took
                                      from the benchmark's files, so the file holds the report's window)
    scrape_error    `ScrapeFailure`   endpoint, time_ns, kind, message
                                      (kind `unit`: a value contradicting its name's unit, once per family)
    endpoint_state  `EndpointState`   endpoint, time_ns, state, reason
    refresh         `Refresh`         endpoint, time_ns, period_s, refreshes, scrapes
                                      (the exporter's refresh period as the scrapes see it: when first known,
                                      and when it moves by more than a fifth)
    gpu_shared      `GpuShared`       endpoint, time_ns, gpu_uuid, gpu_instance_id, pods
                                      (a GPU whose series name several pods at once: time-slicing, MPS; when
                                      that changes, `pods` empty when it stops)
    pods            `PodsResolved`    time_ns, selectors, pods (each: namespace, name, node, labels)
                                      (what `--gpu-pod-selector` resolved to: at start, and when the pods change)
    idle_window     `IdleWindow`      which, start_ns, end_ns
                                      (`profile --idle-window`: a quiet stretch before or after the benchmark)
    complete        `Complete`        time_ns, requests_end_ns, collection_complete, endpoints, otlp, record_log

URLs are redacted by the writer. The reader is lenient with files of older versions: a missing optional
field takes the record's default; an event of an unknown type or kind, or a malformed one, is refused
(`ValueError`) and counted by the caller, never fatal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, TypeVar

import orjson

from bridge.samples import (
    COUNTER_MODES,
    ENDPOINT_STATES,
    FAILURE_KINDS,
    PHASE_EVENTS,
    PHASE_KINDS,
    CounterMode,
    EndpointStateKind,
    PhaseMark,
    ScrapeFailure,
)

T = TypeVar("T")
Stats = Mapping[str, object]  # a JSON object of counters (endpoint stats, OTLP stats, record-log status)


@dataclass(frozen=True, slots=True)
class Configured:
    """The endpoints were probed: which are scraped, which answered, and the run's counter mode."""

    time_ns: int
    run_id: str | None = None
    endpoints_configured: tuple[str, ...] = ()
    endpoints_successful: tuple[str, ...] = ()
    counter_mode: CounterMode | None = None  # None in files of versions before the mode was recorded
    grace_ns: int | None = None  # None in files of versions before the grace was recorded


class EndpointState(NamedTuple):
    """An endpoint going up or down during the run."""

    endpoint: str
    time_ns: int
    state: EndpointStateKind
    reason: str = ""


class Refresh(NamedTuple):
    """How often an endpoint's values change (dcgm-exporter's collect interval, -c), as scraped."""

    endpoint: str
    time_ns: int
    period_s: float
    refreshes: int = 0
    scrapes: int = 0


@dataclass(frozen=True, slots=True)
class Complete:
    """The run is over: the requests' end, the collection's stats."""

    time_ns: int
    requests_end_ns: int | None = None
    collection_complete: bool = True
    endpoints: tuple[Stats, ...] = ()
    otlp: Stats | None = None
    record_log: Stats | None = None


class GpuShared(NamedTuple):
    """One GPU's series name several pods at once (NAMESPACE/NAME each), from `time_ns` on; none: no longer."""

    endpoint: str
    time_ns: int
    gpu_uuid: str
    gpu_instance_id: str | None = None
    pods: tuple[str, ...] = ()


class ResolvedPod(NamedTuple):
    """One pod a `--gpu-pod-selector` selected, as the API listed it."""

    namespace: str
    name: str
    node: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class PodsResolved:
    """The pods the run's `--gpu-pod-selector` values select (all of them, each time they change), with their
    labels: `report --gpu-pod-selector` applies a selector to these offline."""

    time_ns: int
    selectors: tuple[str, ...] = ()
    pods: tuple[ResolvedPod, ...] = ()


class IdleWindow(NamedTuple):
    """A quiet stretch `profile --idle-window` kept before (`before`) or after (`after`) the benchmark."""

    which: str
    start_ns: int
    end_ns: int


IDLE_WHICH = ("before", "after")
Event = Configured | PhaseMark | ScrapeFailure | EndpointState | Refresh | GpuShared | PodsResolved | IdleWindow | \
    Complete

_TYPES: dict[type, str] = {Configured: "configured", PhaseMark: "phase", ScrapeFailure: "scrape_error",
                           EndpointState: "endpoint_state", Refresh: "refresh", GpuShared: "gpu_shared",
                           PodsResolved: "pods", IdleWindow: "idle_window", Complete: "complete"}


def event_to_line(event: Event) -> bytes:
    """One line of the events file."""
    body = event._asdict() if isinstance(event, tuple) else {f.name: getattr(event, f.name) for f in fields(event)}
    if isinstance(event, PodsResolved):
        body["pods"] = [{**pod._asdict(), "labels": dict(pod.labels)} for pod in event.pods]
    return orjson.dumps({"type": _TYPES[type(event)], **body}) + b"\n"


def event_from_dict(obj: Mapping[str, Any]) -> Event:
    """One decoded line of the events file; `ValueError` for an unknown type or a malformed event."""
    kind = obj.get("type")
    try:
        if kind == "phase":
            return PhaseMark(str(obj["name"]), _one_of(obj["kind"], PHASE_KINDS), _one_of(obj["event"], PHASE_EVENTS),
                             _ns(obj["time_ns"]))
        if kind == "scrape_error":
            return ScrapeFailure(str(obj["endpoint"]), _ns(obj["time_ns"]), _one_of(obj.get("kind"), FAILURE_KINDS),
                                 str(obj.get("message") or ""))
        if kind == "endpoint_state":
            return EndpointState(str(obj["endpoint"]), _ns(obj["time_ns"]), _one_of(obj["state"], ENDPOINT_STATES),
                                 str(obj.get("reason") or ""))
        if kind == "refresh":
            return Refresh(str(obj["endpoint"]), _ns(obj["time_ns"]), float(obj["period_s"]),
                           int(obj.get("refreshes") or 0), int(obj.get("scrapes") or 0))
        if kind == "configured":
            mode = obj.get("counter_mode")  # one `report` does not know is left to its own default
            return Configured(_ns(obj["time_ns"]), _optional_str(obj.get("run_id")),
                              _strings(obj.get("endpoints_configured")), _strings(obj.get("endpoints_successful")),
                              next((m for m in COUNTER_MODES if m == mode), None), _grace(obj.get("grace_ns")))
        if kind == "gpu_shared":
            instance = obj.get("gpu_instance_id")
            return GpuShared(str(obj["endpoint"]), _ns(obj["time_ns"]), str(obj["gpu_uuid"]),
                             None if instance is None else str(instance), _strings(obj.get("pods")))
        if kind == "pods":
            return PodsResolved(_ns(obj["time_ns"]), _strings(obj.get("selectors")),
                                tuple(_pod(p) for p in obj.get("pods") or ()))
        if kind == "idle_window":
            first, last = _ns(obj["start_ns"]), _ns(obj["end_ns"])
            if last <= first:
                raise ValueError(f"idle window ends at {last}, not after its start {first}")
            return IdleWindow(_one_of(obj["which"], IDLE_WHICH), first, last)
        if kind == "complete":
            end = obj.get("requests_end_ns")
            return Complete(_ns(obj["time_ns"]), _ns(end) if end is not None else None,
                            bool(obj.get("collection_complete", True)), tuple(obj.get("endpoints") or ()),
                            obj.get("otlp"), obj.get("record_log"))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed {kind} event: {exc!r}") from None
    raise ValueError(f"unknown event type {kind!r}")


def _ns(value: object) -> int:
    """A time in ns: an integer of 64 bits (the report's arrays hold int64). A time of 2^64 (a float to orjson) or
    NaN is a malformed event, not an OverflowError later (`report` names such a line: report/events.py)."""
    if isinstance(value, str):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ValueError(f"time {value!r} is not a number of ns")
    if not -2**63 <= value < 2**63:
        raise ValueError(f"time {value!r} is beyond 64 bits")
    return int(value)


def _one_of(value: object, allowed: Sequence[T]) -> T:
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of {', '.join(map(str, allowed))}")
    return next(a for a in allowed if a == value)


def _strings(value: object) -> tuple[str, ...]:
    if not value:
        return ()
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected a list, got {value!r}")
    return tuple(str(v) for v in value)


def _grace(value: object) -> int | None:
    """A recorded grace, or None (left to the reader's default) when it is not an integer number of ns from 0 to
    60 s (`report --grace-ns`'s range)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 60_000_000_000:
        return value
    return None


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _pod(obj: Any) -> ResolvedPod:
    """One pod of a `pods` event; a TypeError for anything but strings where strings belong (the file is input)."""
    labels = obj["labels"] or {}
    values = (obj["namespace"], obj["name"], obj.get("node") or "")
    if not all(isinstance(v, str) for v in values) or not isinstance(labels, dict) or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise TypeError(f"a pod of strings and a label map of strings, got {obj!r}"[:200])
    return ResolvedPod(*values, labels)
