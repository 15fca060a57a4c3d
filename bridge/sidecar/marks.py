"""Phase marks and the requests end as a client sends them: checked in full before anything is applied.

A POST body reaches the session only through these checks, so a refused request changes nothing: no
record carries its phase, the events file does not hold it, `/status` does not show it. The rules
(DECISIONS.md, "Control API input"):

- a time (`time_ns`, `requests_end_ns`) is an integer of wall-clock nanoseconds (`time.time_ns()`), from
  2001-09-09 (1e18 ns) to a day after now: a time in s, ms or µs, a float, a bool or one past 2**63 (the
  events file's 64-bit integers) is a 400 that names the unit it looks like;
- a phase name is one path component (it names `phases/<name>/`): 1-64 letters, digits, '.', '_', '-',
  starting with a letter or digit, never `..`;
- the sequence makes sense, else a 409: a name starts once per run; an end closes an open phase of the
  same kind, not before its start; one profiling phase is open at a time; the requests end is not before
  the first profiling start; nothing after completion.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from bridge.config import is_path_component
from bridge.errors import LifecycleError, SequenceError
from bridge.samples import PHASE_EVENTS, PHASE_KINDS, PhaseMark

logger = logging.getLogger(__name__)

MAX_NAME = 64
EARLIEST_NS = 10**18  # 2001-09-09T01:46:40Z: anything smaller is a time in another unit (or no time)
DAY_NS = 86_400 * 1_000_000_000


def checked_mark(name: Any, kind: Any, event: Any, time_ns: Any, now_ns: int, started_ns: int | None) -> PhaseMark:
    """The mark a POST body describes, or a LifecycleError (a 400) saying what is wrong with it."""
    if kind not in PHASE_KINDS:
        raise LifecycleError(f"kind must be one of {', '.join(PHASE_KINDS)}, got {kind!r}")
    if event not in PHASE_EVENTS:
        raise LifecycleError(f"event must be 'start' or 'end', got {event!r}")
    if not name or not isinstance(name, str):
        raise LifecycleError("name must be a non-empty string")
    if not is_path_component(name, MAX_NAME):
        raise LifecycleError(f"name {name[:MAX_NAME]!r}{'…' if len(name) > MAX_NAME else ''} is not a usable phase "
                             f"name: use 1-{MAX_NAME} letters, digits, '.', '_' or '-', starting with a letter or "
                             "digit (it names the folder phases/<name>/)")
    checked_time("time_ns", time_ns, now_ns)
    if started_ns is not None and time_ns < started_ns - DAY_NS:
        logger.warning("phase mark at %d is more than a day before the run started (%d): is the benchmark's "
                       "clock right?", time_ns, started_ns)
    return PhaseMark(name, kind, event, time_ns)


def checked_time(field: str, value: Any, now_ns: int) -> int:
    """`value` as wall-clock ns in [2001-09-09, now + 1 day], or a LifecycleError naming `field`."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise LifecycleError(f"{field} must be an integer: wall-clock nanoseconds (time.time_ns(), now about "
                             f"{now_ns}), got {type(value).__name__}")
    if value < EARLIEST_NS:
        unit = ("not a time" if value <= 0 else "seconds" if value < 10**11 else "milliseconds" if value < 10**14
                else "microseconds" if value < 10**17 else "a time before 2001")
        raise LifecycleError(f"{field} {value} looks like {unit}; send wall-clock nanoseconds "
                             f"(time.time_ns(), now about {now_ns})")
    if value > now_ns + DAY_NS:
        shown = value if value < 10**30 else f"of {value.bit_length()} bits"
        raise LifecycleError(f"{field} {shown} is more than a day after now ({now_ns}): send wall-clock "
                             "nanoseconds from a clock that is right")
    return value


def check_sequence(marks: Sequence[PhaseMark], mark: PhaseMark) -> None:
    """A SequenceError (a 409) when `mark` does not follow `marks`, the run's marks so far."""
    opened = open_phases(marks)
    if mark.event == "start":
        earlier = next((m for m in marks if m.name == mark.name), None)
        if earlier is not None:
            raise SequenceError(f"phase {mark.name!r} was already started in this run (at {earlier.time_ns}); "
                                "give each phase its own name (its files go to phases/<name>/)")
        profiling = [m.name for m in opened.values() if m.kind == "profiling"]
        if mark.kind == "profiling" and profiling:
            raise SequenceError(f"profiling phase {profiling[0]!r} is still open: end it before starting "
                                f"{mark.name!r} (one profiling phase at a time)")
        return
    start = opened.get(mark.name)
    if start is None:
        ended = any(m.name == mark.name for m in marks)
        raise SequenceError(f"phase {mark.name!r} " + ("has already ended" if ended else "was never started")
                            + ": an end closes an open phase")
    if start.kind != mark.kind:
        raise SequenceError(f"phase {mark.name!r} started as {start.kind}, not {mark.kind}")
    if mark.time_ns < start.time_ns:
        raise SequenceError(f"phase {mark.name!r} would end at {mark.time_ns}, before its start at {start.time_ns}")


def checked_requests_end(value: Any, now_ns: int, marks: Sequence[PhaseMark]) -> int | None:
    """The requests end of a POST /complete body (None: not given), checked like a mark's time and against
    the first profiling start (the report's window would end before it begins)."""
    if value is None:
        return None
    end = checked_time("requests_end_ns", value, now_ns)
    starts = [m.time_ns for m in marks if m.kind == "profiling" and m.event == "start"]
    if starts and end < min(starts):
        raise SequenceError(f"requests_end_ns {end} is before the profiling start at {min(starts)}")
    return end


def phase_problems(phases: Iterable[Any]) -> list[str]:
    """What makes a benchmark's phases (report.window.Phase: a manifest's, AIPerf's files') unusable, by the
    rules of a posted mark: a name that is no path component, an end before the start. Checked before the
    report is built, so a bad phase never fails half-way through writing it."""
    problems = []
    for phase in phases:
        name = str(phase.name)
        if not is_path_component(name, MAX_NAME):
            problems.append(f"phase name {name[:MAX_NAME]!r}{'…' if len(name) > MAX_NAME else ''} is not usable "
                            f"(1-{MAX_NAME} letters, digits, '.', '_' or '-')")
        elif phase.start_ns is not None and phase.end_ns is not None and phase.end_ns < phase.start_ns:
            problems.append(f"phase {name!r} ends at {phase.end_ns}, before its start at {phase.start_ns}")
    return problems


def open_phases(marks: Iterable[PhaseMark]) -> dict[str, PhaseMark]:
    """Name → start mark of the phases started and not yet ended, in start order."""
    opened: dict[str, PhaseMark] = {}
    for mark in marks:
        if mark.event == "start":
            opened[mark.name] = mark
        else:
            opened.pop(mark.name, None)
    return opened


def phase_after(phase: str | None, mark: PhaseMark) -> str | None:
    """The phase records are labelled with after `mark`: the phase it starts; after an end, none if it
    ended the labelled phase (else the label stays)."""
    if mark.event == "start":
        return mark.name
    return None if phase == mark.name else phase
