"""Report builder: recorded scrapes → the numbers a benchmark publishes (AIPerf-compatible, more correct).

    record log ──▶ series (per endpoint × GPU identity) ──▶ window ──▶ stats (gauges, counters, codes)
        ──▶ telemetry_data + energy + phase files ──▶ write (JSON merge, CSV) / console

Public surface (the sidecar and the `report` command use only these):

    build_report(records, *, marks, phases, window, requests_end_ns, table, counter_mode, grace_ns,
                 endpoints_configured, endpoints_successful, errors, endpoint_states, tz) -> Report
    build_report_from_events(records, events, **overrides) -> Report
    write_report(report, artifact_dir, prefix=None, benchmark_json=None, *, json_path=None,
                 write_csv=True) -> list[Path]
    render_console(report, console=None) -> None
    SeriesAccumulator, Window, Phase, load_events, load_manifest, DEFAULT_GRACE_NS

Importing this package is light: numpy and rich load on first use of a builder, writer or console.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from bridge.report.window import DEFAULT_GRACE_NS, Phase, Window, WindowError, load_manifest

if TYPE_CHECKING:
    from bridge.report.build import Report, build_report, build_report_from_events
    from bridge.report.console import render_console
    from bridge.report.events import EndpointState, RunEvents, load_events
    from bridge.report.series import SeriesAccumulator
    from bridge.report.write import ReportWriteError, write_report

_LAZY = {
    "Report": "bridge.report.build",
    "build_report": "bridge.report.build",
    "build_report_from_events": "bridge.report.build",
    "render_console": "bridge.report.console",
    "EndpointState": "bridge.report.events",
    "RunEvents": "bridge.report.events",
    "load_events": "bridge.report.events",
    "SeriesAccumulator": "bridge.report.series",
    "ReportWriteError": "bridge.report.write",
    "write_report": "bridge.report.write",
}

__all__ = [
    "DEFAULT_GRACE_NS",
    "EndpointState",
    "Phase",
    "Report",
    "ReportWriteError",
    "RunEvents",
    "SeriesAccumulator",
    "Window",
    "WindowError",
    "build_report",
    "build_report_from_events",
    "load_events",
    "load_manifest",
    "render_console",
    "write_report",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bridge.report' has no attribute {name!r}")
    return getattr(import_module(module), name)
