"""gpu_telemetry_events.jsonl → what the report needs: marks, requests end, endpoints, errors, states.

The events are decoded by bridge/events.py (the file's schema). Unknown types and malformed lines are
skipped and counted in `RunEvents.skipped`, never fatal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bridge.events import Complete, Configured, EndpointState, GpuShared, PodsResolved, Refresh, event_from_dict
from bridge.samples import CounterMode, PhaseMark, ScrapeFailure

__all__ = ["EndpointState", "RunEvents", "events_from_dicts", "load_events"]


@dataclass(frozen=True)
class RunEvents:
    marks: list[PhaseMark] = field(default_factory=list)
    requests_end_ns: int | None = None
    complete_ns: int | None = None
    endpoints_configured: list[str] | None = None
    endpoints_successful: list[str] | None = None
    errors: list[ScrapeFailure] = field(default_factory=list)
    states: list[EndpointState] = field(default_factory=list)
    skipped: int = 0
    counter_mode: CounterMode | None = None  # the live run's mode (the `configured` event), a default for `report`
    grace_ns: int | None = None  # the live run's final-scrape grace (the `configured` event), a default for `report`
    run_ids: list[str] = field(default_factory=list)  # of the `configured` events, in order (one per run)
    refreshes: list[Refresh] = field(default_factory=list)  # the exporters' refresh periods as the run saw them
    pods: list[PodsResolved] = field(default_factory=list)  # what the run's --gpu-pod-selector resolved to
    shared: list[GpuShared] = field(default_factory=list)  # GPUs whose series named several pods at once


def events_from_dicts(objects: Iterable[Mapping[str, Any]]) -> RunEvents:
    marks: list[PhaseMark] = []
    errors: list[ScrapeFailure] = []
    states: list[EndpointState] = []
    configured: Configured | None = None
    complete: Complete | None = None
    run_ids: list[str] = []
    refreshes: list[Refresh] = []
    pods: list[PodsResolved] = []
    shared: list[GpuShared] = []
    skipped = 0
    lists: dict[type, list[Any]] = {PhaseMark: marks, ScrapeFailure: errors, EndpointState: states,
                                    Refresh: refreshes, PodsResolved: pods, GpuShared: shared}
    for obj in objects:
        try:
            event = event_from_dict(obj)
        except ValueError:
            skipped += 1
            continue
        if type(event) in lists:
            lists[type(event)].append(event)
        elif isinstance(event, Configured):
            configured = event
            if event.run_id and event.run_id not in run_ids:
                run_ids.append(event.run_id)
        elif isinstance(event, Complete):
            complete = event
    return RunEvents(
        marks,
        requests_end_ns=complete.requests_end_ns if complete else None,
        complete_ns=complete.time_ns if complete else None,
        endpoints_configured=list(configured.endpoints_configured) if configured else None,
        endpoints_successful=list(configured.endpoints_successful) if configured else None,
        errors=errors, states=states, skipped=skipped,
        counter_mode=configured.counter_mode if configured else None,
        grace_ns=configured.grace_ns if configured else None, run_ids=run_ids, refreshes=refreshes,
        pods=pods, shared=shared,
    )


def load_events(path: Path) -> RunEvents:
    from bridge.record_log import read_dicts

    bad: list[str] = []
    events = events_from_dicts(read_dicts(path, bad))
    return replace(events, skipped=events.skipped + len(bad)) if bad else events
