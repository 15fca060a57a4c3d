"""Windows and phases from marks, AIPerf's manifest and explicit ns; events-file parsing."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bridge.report import build_report
from bridge.report.events import load_events
from bridge.report.window import (
    Window,
    WindowError,
    explicit_window,
    load_manifest,
    phase_window,
    phases_from_marks,
    window_from_marks,
)
from bridge.samples import PhaseMark
from tests.report import run1
from tests.report.helpers import T0, S, rec, write_events

MARKS = [PhaseMark("warmup", "warmup", "start", T0 - 2 * S), PhaseMark("warmup", "warmup", "end", T0),
         PhaseMark("profiling", "profiling", "start", T0), PhaseMark("profiling", "profiling", "end", T0 + 9 * S)]


def test_the_window_runs_from_profiling_start_to_the_requests_end_with_default_grace() -> None:
    assert window_from_marks(MARKS, requests_end_ns=T0 + 8 * S) == Window(T0, T0 + 8 * S, 666_000_000)


def test_without_a_requests_end_the_profiling_end_closes_the_window() -> None:
    assert window_from_marks(MARKS) == Window(T0, T0 + 9 * S, 666_000_000)


def test_no_profiling_phase_means_an_open_window_over_all_data() -> None:
    window = window_from_marks(MARKS[:2])
    assert window.is_open and window.resolved(1, 2) == Window(1, 2, 666_000_000)


def test_phases_are_numbered_in_start_order_and_a_missing_end_marks_a_cancelled_phase() -> None:
    phases = phases_from_marks([*reversed(MARKS[:3])])
    assert [(p.name, p.index, p.profiling_index, p.was_cancelled) for p in phases] == [
        ("warmup", 0, None, False), ("profiling", 1, 0, True)]


def test_a_single_profiling_phase_uses_exactly_the_main_window() -> None:
    phases = phases_from_marks(MARKS)
    main = Window(T0, T0 + 8 * S)
    assert phase_window(phases[1], main, phases) is main
    assert phase_window(phases[0], main, phases) == Window(T0 - 2 * S, T0)


def test_a_cancelled_phase_file_ends_at_the_last_sample_and_says_so() -> None:
    records = [rec(T0 + i * S, {"nvidia_power_usage": 100.0}) for i in range(-2, 5)]
    built = build_report(records, marks=MARKS[:3], tz=None)
    profiling = built.phase_files[1]
    assert profiling.window.end_ns == T0 + 4 * S
    assert built.window.end_ns == T0 + 4 * S  # the main window too
    assert profiling.document["warnings"] == []  # it is the main window, resolved once
    warmup = built.phase_files[0]
    assert warmup.window == Window(T0 - 2 * S, T0)


@pytest.mark.parametrize(("start", "end", "grace"), [(5, 1, 0), (1, 5, -1)])
def test_explicit_bounds_are_validated(start: int, end: int, grace: int) -> None:
    with pytest.raises(WindowError):
        explicit_window(start, end, grace)


def test_aiperfs_manifest_gives_its_phases_in_index_order(tmp_path: Path) -> None:
    doc = run1.manifest()
    doc["phases"].reverse()
    (tmp_path / "phase_manifest.json").write_bytes(orjson.dumps(doc))
    phases = load_manifest(tmp_path)
    assert [(p.name, p.kind, p.start_ns, p.end_ns) for p in phases] == [
        ("warmup", "warmup", run1.WARMUP_START, run1.T0), ("profiling", "profiling", run1.T0, run1.REQUESTS_END)]


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"phases": [1]}', b'{"phases": [{"start_ns": "x"}]}'])
def test_a_broken_manifest_is_a_clear_error(tmp_path: Path, body: bytes) -> None:
    (tmp_path / "phase_manifest.json").write_bytes(body)
    with pytest.raises(WindowError, match="phase_manifest.json"):
        load_manifest(tmp_path / "phase_manifest.json")


def test_the_events_file_gives_marks_requests_end_endpoints_errors_and_states(tmp_path: Path) -> None:
    path = write_events(tmp_path / "gpu_telemetry_events.jsonl", [
        {"type": "configured", "time_ns": 1, "endpoints_configured": ["http://a/metrics"],
         "endpoints_successful": []},
        {"type": "phase", "name": "p", "kind": "profiling", "event": "start", "time_ns": 2},
        {"type": "phase", "name": "p", "kind": "bogus", "event": "start", "time_ns": 2},
        {"type": "scrape_error", "endpoint": "http://a/metrics", "time_ns": 3, "kind": "timeout", "message": "m"},
        {"type": "endpoint_state", "endpoint": "http://a/metrics", "time_ns": 4, "state": "up", "reason": ""},
        {"type": "complete", "time_ns": 5, "requests_end_ns": None, "collection_complete": True},
    ])
    with path.open("ab") as f:
        f.write(b"garbage\n")
    events = load_events(path)
    assert events.marks == [PhaseMark("p", "profiling", "start", 2)]
    assert (events.requests_end_ns, events.complete_ns) == (None, 5)
    assert events.endpoints_configured == ["http://a/metrics"] and events.endpoints_successful == []
    assert len(events.errors) == 1 and events.states[0].state == "up"
    assert events.skipped == 2
