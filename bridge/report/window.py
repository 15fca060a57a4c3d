"""The profiling window and the run's phases, from phase marks, AIPerf's phase_manifest.json or explicit ns.

A window is `[start_ns, end_ns]`, inclusive at both ends, plus `grace_ns` of trailing grace. `end_ns` is
the requests end (or the profiling end when the requests end is unknown). How the grace is used depends
on the counter mode (see DECISIONS.md "The window"): `interpolated` uses it only so the final scrape can bracket
the end of a counter; `aiperf` widens the whole window to `[start, end + grace]`, as AIPerf does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from bridge.errors import ReportError
from bridge.samples import PhaseKind, PhaseMark

DEFAULT_GRACE_NS = 666_000_000  # AIPERF_GPU_FINAL_SCRAPE_GRACE_NS
MANIFEST_FILE = "phase_manifest.json"


class WindowError(ReportError, ValueError):
    """The phase marks, manifest or explicit bounds do not describe a usable window."""


@dataclass(frozen=True, slots=True)
class Window:
    """`start_ns`/`end_ns` None means "all data": resolved to the data's first and last sample."""

    start_ns: int | None
    end_ns: int | None
    grace_ns: int = DEFAULT_GRACE_NS

    @property
    def is_open(self) -> bool:
        return self.start_ns is None or self.end_ns is None

    def resolved(self, first_ns: int | None, last_ns: int | None) -> Window:
        """Open bounds replaced by the data span (a run with no profiling phase reports all data)."""
        start = self.start_ns if self.start_ns is not None else first_ns
        end = self.end_ns if self.end_ns is not None else last_ns
        return replace(self, start_ns=start, end_ns=end)


@dataclass(frozen=True, slots=True)
class Phase:
    """One benchmark phase as AIPerf's manifest describes it (start/end are wall-clock ns)."""

    name: str
    kind: str  # warmup | profiling | cooldown
    index: int
    start_ns: int | None
    end_ns: int | None
    profiling_index: int | None = None
    was_cancelled: bool = False


def explicit_window(start_ns: int, end_ns: int, grace_ns: int = DEFAULT_GRACE_NS) -> Window:
    if end_ns < start_ns:
        raise WindowError(f"the window ends before it starts: end {end_ns} < start {start_ns}")
    if grace_ns < 0:
        raise WindowError(f"the grace must not be negative: {grace_ns}")
    return Window(start_ns, end_ns, grace_ns)


def phases_from_marks(marks: Iterable[PhaseMark]) -> list[Phase]:
    """Pair start/end marks by phase name; a phase with no end mark was cancelled (end unknown)."""
    starts: dict[str, PhaseMark] = {}
    ends: dict[str, int] = {}
    for mark in marks:
        if mark.event == "start":
            starts.setdefault(mark.name, mark)
        else:
            ends[mark.name] = mark.time_ns
    ordered = sorted(starts.values(), key=lambda m: m.time_ns)
    phases: list[Phase] = []
    profiling = 0
    for index, mark in enumerate(ordered):
        kind: PhaseKind = mark.kind
        profiling_index = None
        if kind == "profiling":
            profiling_index = profiling
            profiling += 1
        end = ends.get(mark.name)
        phases.append(Phase(mark.name, kind, index, mark.time_ns, end, profiling_index, end is None))
    return phases


def window_from_phases(phases: Sequence[Phase], requests_end_ns: int | None = None,
                       grace_ns: int = DEFAULT_GRACE_NS) -> Window:
    """[first profiling start, requests end (else last profiling end)]; no profiling phase → all data."""
    profiling = [p for p in phases if p.kind == "profiling" and p.start_ns is not None]
    if not profiling:
        return Window(None, None, grace_ns)
    start = min(p.start_ns for p in profiling if p.start_ns is not None)
    ends = [p.end_ns for p in profiling if p.end_ns is not None]
    end = requests_end_ns if requests_end_ns is not None else (max(ends) if ends else None)
    if end is not None and end < start:
        raise WindowError(f"the requests end ({end}) is before the profiling start ({start})")
    return Window(start, end, grace_ns)


def window_from_marks(marks: Iterable[PhaseMark], requests_end_ns: int | None = None,
                      grace_ns: int = DEFAULT_GRACE_NS) -> Window:
    return window_from_phases(phases_from_marks(marks), requests_end_ns, grace_ns)


def phase_window(phase: Phase, main: Window, phases: Sequence[Phase]) -> Window:
    """A phase's own window; with a single profiling phase, exactly the main window (never two rules)."""
    profiling = [p for p in phases if p.kind == "profiling"]
    if phase.kind == "profiling" and len(profiling) == 1:
        return main
    return Window(phase.start_ns, phase.end_ns, main.grace_ns)


def find_manifest(path: Path) -> Path:
    """The manifest itself, or the first phase_manifest.json below a directory (AIPerf may nest it)."""
    if path.is_file():
        return path
    if path.is_dir():
        found = sorted(path.rglob(MANIFEST_FILE), key=lambda p: (len(p.parts), str(p)))
        if found:
            return found[0]
    raise WindowError(f"no {MANIFEST_FILE} at or below {path}")


def load_manifest(path: Path) -> list[Phase]:
    """Phases of AIPerf's phase_manifest.json (AIPerf 0.13.0 writes it in its artifact directory,
    `schema_version` 1), in phase_index order."""
    from bridge.report.events import number_problem

    manifest = find_manifest(path)
    try:
        text = manifest.read_bytes()
    except OSError as exc:
        raise WindowError(f"{manifest}: cannot read the phase manifest ({exc.strerror or exc})") from None
    bad = number_problem(text)  # beyond 64 bits, NaN, a huge exponent: named with its line, never a traceback
    if bad is not None:
        # The literal as a JSON value (after `:`, `[` or `,`), not the same letters inside a string such as a name.
        at = re.search(rb"(?<=[:\[,\s])" + re.escape(bad.literal.encode()) + rb"(?=[\s,\]}])", text)
        line = text[:at.start() if at else 0].count(b"\n") + 1
        raise WindowError(f"{manifest} line {line}: {bad.message}; the phase manifest was edited or damaged: "
                          "correct it")
    try:
        doc: Any = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise WindowError(f"{manifest}: cannot read the phase manifest ({exc})") from None
    raw = doc.get("phases") if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        raise WindowError(f"{manifest}: no 'phases' list")
    phases: list[Phase] = []
    for position, item in enumerate(raw):
        if not isinstance(item, dict):
            raise WindowError(f"{manifest}: phase {position} is not an object")
        try:
            phases.append(Phase(
                name=str(item.get("phase_name") or item.get("phase_kind") or f"phase_{position}"),
                kind=str(item.get("phase_kind") or "profiling"),
                index=int(item.get("phase_index", position)),
                start_ns=_opt_int(item.get("start_ns")),
                end_ns=_opt_int(item.get("end_ns")),
                profiling_index=_opt_int(item.get("profiling_index")),
                was_cancelled=bool(item.get("was_cancelled", False)),
            ))
        except (TypeError, ValueError) as exc:
            raise WindowError(f"{manifest}: phase {position}: {exc}") from None
    return sorted(phases, key=lambda p: p.index)


def _opt_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"not an integer: {value!r}")
    number = int(value)
    if not -2**63 <= number < 2**63:  # (a string of digits; a JSON number is checked with its line above)
        raise ValueError(f"{str(value)[:40]} is beyond 64 bits")
    return number


def phase_from_document(document: Mapping[str, Any]) -> Phase | None:
    """The profiling window of a run with one phase: the JSON's start_time and end_time (the requests end,
    or the moment of the cancel), naive local time with µs precision."""
    start, end = _local_ns(document.get("start_time")), _local_ns(document.get("end_time"))
    if start is None:
        return None
    return Phase("profiling", "profiling", 0, start, end, 0, bool(document.get("was_cancelled")))


def _local_ns(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:  # AIPerf writes datetime.fromtimestamp(): this machine's local time
        return (int(time.mktime(moment.timetuple())) * 1_000_000 + moment.microsecond) * 1000
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000
