"""`dcgm-bridge report` rebuilds from the logs and writes the HTML page."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from bridge.cli import main
from bridge.simulator import ManualClock, SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import scrape_synchronously, session_for


def _rebuilt_page(tmp_path, exporter, urls, **overrides):
    """A run with one profiling phase recorded into tmp_path/run, rebuilt by `report --html`: the page."""
    session = session_for(urls, tmp_path / "run", **overrides)
    session.configure()
    session.mark_phase("profiling", "profiling", "start", time.time_ns())  # the records' clock
    scrape_synchronously(session, 3)
    session.mark_phase("profiling", "profiling", "end", time.time_ns())
    session.complete()
    html = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", "--jsonl", str(session.records.path), "--events",
                                       str(session.events.path), "-o", str(tmp_path / "rebuilt.json"),
                                       "--html", str(html)])
    assert result.exit_code == 0, result.output
    return html.read_text(encoding="utf-8")


def test_report_rebuilds_from_the_logs_and_writes_the_html_page(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=2), now_ns=ManualClock()) as exporter:
        page = _rebuilt_page(tmp_path, exporter, [exporter.url])
    assert page.lower().startswith("<!doctype html>") and "<svg" in page
    assert "<script src" not in page and "<link" not in page  # self-contained: nothing loaded from elsewhere
    assert json.loads((tmp_path / "rebuilt.json").read_text())["telemetry_data"] == \
        json.loads((tmp_path / "run" / "profile_export_aiperf.json").read_text())["telemetry_data"]


def test_the_html_page_shows_the_run_id_and_every_endpoints_state(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        page = _rebuilt_page(tmp_path, exporter, [exporter.url, "http://127.0.0.1:1/metrics"], run_id="run-42")
    assert '<span>Run</span><b>run-42</b>' in page
    assert f'<span>Endpoint {exporter.url.split("/")[2]}</span><b>up</b>' in page
    assert '<span>Endpoint 127.0.0.1:1</span><b>down: ' in page


def test_an_events_file_holding_two_runs_is_refused(tmp_path):
    events = tmp_path / "events.jsonl"
    log = tmp_path / "log.jsonl"
    log.write_text('{"gpu_uuid": "x"}\n')
    events.write_text('{"type":"configured","time_ns":1,"run_id":"a"}\n{"type":"configured","time_ns":2,"run_id":"b"}\n')
    result = CliRunner().invoke(main, ["report", "--jsonl", str(log), "--events", str(events)])
    assert result.exit_code == 2
    assert f"Error: --events {events} holds 2 runs (a, b): a window would span them" in result.output
