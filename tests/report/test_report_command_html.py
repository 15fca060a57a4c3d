"""`dcgm-bridge report` rebuilds from the logs and writes the HTML page."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from bridge.cli import main
from bridge.simulator import ManualClock, SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import scrape_synchronously, session_for


def test_report_rebuilds_from_the_logs_and_writes_the_html_page(tmp_path):
    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=2), now_ns=clock) as exporter:
        session = session_for([exporter.url], tmp_path / "run")
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
    page = html.read_text(encoding="utf-8")
    assert page.lower().startswith("<!doctype html>") and "<svg" in page
    assert "<script src" not in page and "<link" not in page  # self-contained: nothing loaded from elsewhere
    assert json.loads((tmp_path / "rebuilt.json").read_text())["telemetry_data"] == \
        json.loads((tmp_path / "run" / "profile_export_aiperf.json").read_text())["telemetry_data"]
