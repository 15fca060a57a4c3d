"""Per-phase files `phases/<phase>/gpu_telemetry.json`, in AIPerf's shape (sorted keys, schema_version 1).

Unlike AIPerf (per-phase exports in AIPerf 0.13.0, ai-dynamo/aiperf `src/aiperf/records/records_manager.py`),
a phase file uses the same window rule as `telemetry_data`: with one profiling phase its file *is* the main window, so
the two never disagree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

from bridge.fields import FieldTable
from bridge.report.series import Series
from bridge.report.telemetry_data import RunInfo, build_block
from bridge.report.window import Phase, Window, phase_window
from bridge.samples import CounterMode

PHASE_FILE = "gpu_telemetry.json"
PHASE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class PhaseFile:
    phase: Phase
    window: Window
    relpath: str  # phases/<name>/gpu_telemetry.json
    document: dict[str, Any]


def safe_name(name: str) -> str:
    """A phase name as one path component (no separators, no dot-dot)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip(".") or "phase"
    return cleaned


def phase_files(series: Sequence[Series], phases: Sequence[Phase], main: Window, table: FieldTable,
                mode: CounterMode, info: RunInfo, *, last_sample_ns: int | None,
                tz: tzinfo | None = None) -> list[PhaseFile]:
    """One document per phase with a known start; written by the caller only when there are 2+ phases."""
    out: list[PhaseFile] = []
    used: set[str] = set()
    for phase in phases:
        if phase.start_ns is None:
            continue
        warnings: list[str] = []
        window = phase_window(phase, main, phases)
        if window.end_ns is None:
            warnings.append(f"phase {phase.name!r} has no end: its window ends at the last sample")
            window = window.resolved(None, max(last_sample_ns or phase.start_ns, phase.start_ns))
        block = build_block(series, window, table, mode, info, tz=tz,
                            errors_between=(window.start_ns, (window.end_ns or 0) + window.grace_ns))
        document = {
            "data": block.data,
            "phase": {
                "end_ns": phase.end_ns,
                "phase_index": phase.index,
                "phase_kind": phase.kind,
                "phase_name": phase.name,
                "profiling_index": phase.profiling_index,
                "start_ns": phase.start_ns,
                "was_cancelled": phase.was_cancelled,
            },
            "schema_version": PHASE_SCHEMA_VERSION,
            "warnings": warnings,
        }
        name = safe_name(phase.name)
        while name in used:
            name += f"_{phase.index}"
        used.add(name)
        out.append(PhaseFile(phase, window, f"phases/{name}/{PHASE_FILE}", document))
    return out
