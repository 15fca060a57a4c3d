"""gpu_telemetry_events.jsonl → what the report needs: marks, requests end, endpoints, errors, states.

The events are decoded by bridge/events.py (the file's schema). Unknown types and malformed lines are
skipped and counted in `RunEvents.skipped`, never fatal.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from bridge.errors import ReportInputError
from bridge.events import (
    Complete,
    Configured,
    EndpointState,
    GpuShared,
    IdleWindow,
    PodsResolved,
    Refresh,
    event_from_dict,
)
from bridge.samples import CounterMode, PhaseMark, ScrapeFailure

__all__ = ["BadNumber", "EndpointState", "RunEvents", "events_from_dicts", "load_events", "number_problem"]


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
    idle: list[IdleWindow] = field(default_factory=list)  # `profile --idle-window`'s quiet stretches


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
    idle: list[IdleWindow] = []
    skipped = 0
    lists: dict[type, list[Any]] = {PhaseMark: marks, ScrapeFailure: errors, EndpointState: states,
                                    Refresh: refreshes, PodsResolved: pods, GpuShared: shared, IdleWindow: idle}
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
        pods=pods, shared=shared, idle=idle,
    )


def load_events(path: Path, *, strict: bool = False) -> RunEvents:
    """The events file read. A malformed line or event is skipped and counted; with `strict` (`report`), a line
    holding a number no event can (beyond 64 bits, NaN, an exponent past a double's) stops the read with a
    ReportInputError naming the file and the line: such a line was edited or damaged, and a window built around it
    would be wrong, not short."""
    from bridge.record_log import read_dicts

    if strict:
        damaged = first_bad_number_line(path)
        if damaged is not None:
            number, problem = damaged
            raise ReportInputError(f"--events {path} line {number}: {problem}; the file was edited or damaged: "
                                   "correct or remove that line")
    bad: list[str] = []
    events = events_from_dicts(read_dicts(path, bad))
    return replace(events, skipped=events.skipped + len(bad)) if bad else events


class BadNumber(NamedTuple):
    """A number no event or phase can hold: `literal` as the JSON text writes it, `message` what is wrong with it."""

    literal: str
    message: str


class _BadNumberError(ValueError):
    def __init__(self, literal: str, message: str) -> None:
        super().__init__(message)
        self.found = BadNumber(literal, message)


_INT64 = 2**63
# What a bad number can look like in JSON text: NaN/Infinity (which orjson refuses outright), 19 digits or more
# (past 2^63), a two-digit exponent. Only lines that match are parsed again, by the checking parser.
_SUSPECT = re.compile(rb"NaN|Infinity|\d{19}|[eE][+-]?\d{2}")


def _whole(literal: str) -> int:
    value = int(literal) if len(literal) <= 40 else _INT64
    if not -_INT64 <= value < _INT64:
        raise _BadNumberError(literal, f"{literal[:40]}{'…' if len(literal) > 40 else ''} is beyond 64 bits")
    return value


def _real(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value) or abs(value) >= _INT64:
        raise _BadNumberError(literal, f"{literal[:40]} is beyond any time, count or value the file holds")
    return value


def _constant(name: str) -> float:
    raise _BadNumberError(name, f"{name} is not a number")


def number_problem(text: bytes | str) -> BadNumber | None:
    """The first number of a JSON text no event or phase can hold (an integer beyond 64 bits, NaN or Infinity, a
    magnitude of 2^63 or more), or None, also for text that is not JSON at all (another rule's)."""
    if not _SUSPECT.search(text if isinstance(text, bytes) else text.encode()):
        return None
    try:
        json.loads(text, parse_int=_whole, parse_float=_real, parse_constant=_constant)
    except _BadNumberError as exc:
        return exc.found
    except ValueError:
        return None
    return None


def first_bad_number_line(path: Path) -> tuple[int, str] | None:
    """(line number, problem) of the first line of a JSONL file holding a bad number (`number_problem`), or None."""
    from bridge.record_log import line_batches

    number = 0
    for batch in line_batches(path):
        if not _SUSPECT.search(batch):
            number += batch.count(b"\n")
            continue
        for line in batch.split(b"\n")[:-1]:
            number += 1
            problem = number_problem(line)
            if problem is not None:
                return number, problem.message
    return None
