"""A slow DCGM refresh, live: the sidecar tells the exporter's cadence (/status, /metrics, events), waits at the
end for the refresh after the window, and the report times the energy at DCGM's refresh (issue 15)."""

from __future__ import annotations

import time

import orjson
import pytest
from rich.console import Console

from bridge.record_log import read_records
from bridge.report import build_report, render_console
from bridge.report.html import render_html
from bridge.report.window import explicit_window
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import session_for

REFRESH_MS = 400  # eight 50 ms scrapes per refresh


def _run(tmp_path, *, await_refresh: bool, seconds: float = 2.6):
    exporter = SimulatedExporter(SimulatorConfig(gpus=2, refresh_ms=REFRESH_MS, seed=3))
    exporter.start()
    session = session_for([exporter.url], tmp_path, final_refresh_wait=5.0)
    session.configure()
    session.start()
    start = time.time_ns()
    session.mark_phase("profiling", "profiling", "start", start)
    time.sleep(seconds)
    status = session.status()
    metrics = session.exposition().decode()
    end = time.time_ns()
    session.mark_phase("profiling", "profiling", "end", end)
    outputs = session.complete(end, await_refresh=await_refresh)
    exporter.stop()
    return exporter, session, outputs, status, metrics, start, end


@pytest.mark.slow
def test_the_sidecar_tells_the_exporters_refresh_and_waits_for_the_one_after_the_window(tmp_path):
    exporter, session, outputs, status, metrics, start, end = _run(tmp_path, await_refresh=True)
    endpoint = status["endpoints"][0]
    assert endpoint["refresh_period_s"] == pytest.approx(REFRESH_MS / 1000, rel=0.2)
    assert endpoint["refreshes"] >= 5 and endpoint["last_refresh_ns"] is not None
    assert "dcgm_bridge_exporter_refresh_period_seconds{endpoint=" in metrics
    assert "dcgm_bridge_exporter_last_refresh_timestamp_seconds{endpoint=" in metrics
    # The run went on until a refresh newer than the one the final scrape saw had been recorded.
    records = [r for r in read_records(session.records.path) if r.gpu_index == 0]
    after = [r for r in records if r.timestamp_ns > end]
    assert len({r.telemetry_data["nvidia_energy_consumption"] for r in after}) >= 2
    # The completion event carries the cadence too.
    events = [orjson.loads(line) for line in session.events.path.read_bytes().splitlines()]
    complete = next(e for e in events if "collection_complete" in e)
    assert "refresh_period_s" in orjson.dumps(complete).decode()
    report = outputs.report
    assert report is not None
    block = report.telemetry_data["endpoints"][next(iter(report.telemetry_data["endpoints"]))]
    assert block["refresh"]["fresh"] is False
    assert block["refresh"]["period_s"] == pytest.approx(REFRESH_MS / 1000, rel=0.05)
    truth = sum(exporter.model.energy_joules(g, start, end) for g in range(2))
    assert report.energy.total_energy_j is not None and report.energy.bound_j is not None
    assert abs(report.energy.total_energy_j - truth) <= report.energy.bound_j
    assert abs(report.energy.total_energy_j / truth - 1) < 0.01
    gpu = block["gpus"]["gpu_0"]["metrics"]
    assert gpu["nvidia_energy_consumption"]["bound"] > 0
    assert gpu["nvidia_power_usage"]["refreshes"] >= 5  # what the gauge statistics rest on


@pytest.mark.slow
def test_a_window_shorter_than_two_refreshes_is_flagged_in_the_json_the_console_and_the_html(tmp_path):
    exporter, session, outputs, *_ = _run(tmp_path, await_refresh=False, seconds=1.5)
    records = list(read_records(session.records.path))
    first = records[len(records) // 2].timestamp_ns
    built = build_report(records, window=explicit_window(first, first + 500_000_000))
    warning = built.telemetry_data["summary"]["refresh_warning"]
    assert "too few DCGM refreshes" in warning and "-c 100" in warning and "DCGM_EXPORTER_INTERVAL" in warning
    console = Console(record=True, width=200, force_terminal=False)
    render_console(built, console)
    text = console.export_text()
    assert "too few DCGM refreshes" in text
    assert "(DCGM refresh every 0.4 s)" in text  # beside the endpoint, in the sources list
    assert "too few DCGM refreshes" in render_html(built)
    # A window of many refreshes is not flagged.
    whole = build_report(records, window=explicit_window(records[0].timestamp_ns, records[-1].timestamp_ns))
    assert "refresh_warning" not in whole.telemetry_data["summary"]


def test_sigterm_style_completion_does_not_wait(tmp_path):
    began = time.monotonic()
    *_, end = _run(tmp_path, await_refresh=False, seconds=0.5)
    assert time.monotonic() - began < 0.5 + 3.0


@pytest.mark.slow
def test_the_refresh_period_is_an_event_and_a_warning(tmp_path, caplog):
    from bridge.report.events import load_events

    with caplog.at_level("WARNING"):
        _, session, *_ = _run(tmp_path, await_refresh=False, seconds=1.6)
    run = load_events(session.events.path)
    assert run.skipped == 0 and len(run.refreshes) >= 1
    assert run.refreshes[0].period_s == pytest.approx(REFRESH_MS / 1000, rel=0.2)
    assert any("rests on too few refreshes" in r.getMessage() and "-c 100" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_the_html_draws_a_slow_refresh_as_held_steps(tmp_path):
    """A chart line of a 400 ms refresh scraped every 50 ms: one step per refresh (a value and its hold), not a
    point per scrape."""
    import json
    import re

    _, session, outputs, *_ = _run(tmp_path, await_refresh=False, seconds=1.6)
    html = render_html(outputs.report)
    found = re.search(r'<script type="application/json" id="chart-data">(.*?)</script>', html, re.S)
    assert found is not None
    data = json.loads(found.group(1).replace("<\\/", "</"))
    line = data["c0"]["lines"][0]
    records = [r for r in read_records(session.records.path) if r.gpu_index == 0]
    # A refresh is told by the energy counter, which moves at every one; the power can repeat a value across two
    # refreshes (an idle stretch of the simulated load), so counting its changes can undercount them.
    values = [r.telemetry_data["nvidia_energy_consumption"] for r in records]
    refreshes = 1 + sum(1 for a, b in zip(values, values[1:], strict=False) if a != b)
    assert len(line["t"]) <= 2 * refreshes + 1 < len(records)
    assert all(a == b for a, b in zip(line["v"][0::2], line["v"][1::2], strict=False))  # held flat to the next
