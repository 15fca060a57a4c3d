"""gpu_telemetry_events.jsonl → what the report needs: marks, requests end, endpoints, errors, states.

One JSON object per line with a `type` (configured | phase | scrape_error | endpoint_state | complete).
Unknown types and malformed lines are skipped and counted in `RunEvents.skipped`, never fatal.
URLs in events are already redacted by the writer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from bridge.samples import PhaseMark, ScrapeFailure


class EndpointState(NamedTuple):
    """An endpoint going up or down during the run (`state` is "up" or "down")."""

    endpoint: str
    time_ns: int
    state: str
    reason: str = ""


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
    counter_mode: str | None = None  # the live run's mode (the `configured` event), a default for `report`
    run_ids: list[str] = field(default_factory=list)  # of the `configured` events, in order (one per run)


def events_from_dicts(objects: Iterable[Mapping[str, Any]]) -> RunEvents:
    marks: list[PhaseMark] = []
    errors: list[ScrapeFailure] = []
    states: list[EndpointState] = []
    configured: list[str] | None = None
    successful: list[str] | None = None
    requests_end: int | None = None
    complete: int | None = None
    counter_mode: str | None = None
    run_ids: list[str] = []
    skipped = 0
    for obj in objects:
        try:
            kind = obj.get("type")
            if kind == "phase":
                phase_kind = str(obj["kind"])
                event = str(obj["event"])
                if phase_kind not in ("warmup", "profiling", "cooldown") or event not in ("start", "end"):
                    raise ValueError(f"phase {phase_kind}/{event}")
                marks.append(PhaseMark(str(obj["name"]), phase_kind, event,  # type: ignore[arg-type]
                                       int(obj["time_ns"])))
            elif kind == "configured":
                configured = [str(u) for u in obj.get("endpoints_configured") or []]
                successful = [str(u) for u in obj.get("endpoints_successful") or []]
                counter_mode = str(obj["counter_mode"]) if obj.get("counter_mode") else None
                if obj.get("run_id") and str(obj["run_id"]) not in run_ids:
                    run_ids.append(str(obj["run_id"]))
            elif kind == "scrape_error":
                errors.append(ScrapeFailure(str(obj["endpoint"]), int(obj["time_ns"]), str(obj.get("kind") or "error"),
                                            str(obj.get("message") or "")))
            elif kind == "endpoint_state":
                states.append(EndpointState(str(obj["endpoint"]), int(obj["time_ns"]), str(obj["state"]),
                                            str(obj.get("reason") or "")))
            elif kind == "complete":
                complete = int(obj["time_ns"])
                if obj.get("requests_end_ns") is not None:
                    requests_end = int(obj["requests_end_ns"])
            else:
                skipped += 1
        except (KeyError, TypeError, ValueError):
            skipped += 1
    return RunEvents(marks, requests_end, complete, configured, successful, errors, states, skipped, counter_mode,
                     run_ids)


def load_events(path: Path) -> RunEvents:
    from bridge.record_log import read_dicts

    bad: list[str] = []
    events = events_from_dicts(read_dicts(path, bad))
    return replace(events, skipped=events.skipped + len(bad)) if bad else events
