"""`report` never destroys good data (issue 12 item 4): inputs with no usable record in the window are
refused with the reason (exit 2) and an existing report is left as it was."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.simulator import ManualClock, SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import scrape_synchronously, session_for


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=2), now_ns=clock) as exporter:
        session = session_for([exporter.url], folder)
        session.configure()
        session.mark_phase("profiling", "profiling", "start", time.time_ns())  # the records' clock
        scrape_synchronously(session, 3)
        session.mark_phase("profiling", "profiling", "end", time.time_ns())
        session.complete()
    return folder


def _refused(args: list[str], good: Path) -> str:
    before = good.read_bytes()
    result = CliRunner().invoke(main, ["report", *args, "-o", str(good)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert good.read_bytes() == before  # the good report is untouched
    return result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--jsonl", "{empty}", "--events", "{events}"], "Error: --jsonl {empty} is empty: no records to report"),
    (["--jsonl", "{text}", "--events", "{events}"],
     "Error: --jsonl {text} is not a record log: no line of it is a JSON object"),
    (["--jsonl", "{events}", "--events", "{events}"],
     "Error: --jsonl {events} is an events file (gpu_telemetry_events.jsonl); give it as --events"),
    (["--jsonl", "{log}", "--start-ns", "1796234392", "--end-ns", "1796234399"],
     "Error: --start-ns 1796234392 looks like seconds, not wall-clock nanoseconds"),
    (["--jsonl", "{log}", "--start-ns", "1796234392000", "--end-ns", "1796234399000"],
     "Error: --start-ns 1796234392000 looks like milliseconds"),
    (["--jsonl", "{log}", "--start-ns", "2796234392000000000", "--end-ns", "2796234399000000000"],
     "records of {log} falls in the window 2058-08-10 19:46:32 UTC – 2058-08-10 19:46:39 UTC; check --start-ns"),
])
def test_a_report_with_no_record_in_the_window_is_refused_and_writes_nothing(
        run: Path, tmp_path: Path, args: list[str], message: str) -> None:
    names = {"empty": tmp_path / "empty.jsonl", "text": tmp_path / "page.txt", "events":
             run / "gpu_telemetry_events.jsonl", "log": run / "gpu_telemetry_export.jsonl"}
    names["empty"].write_bytes(b"")
    names["text"].write_text("DCGM_FI_DEV_GPU_TEMP 42\n")
    good = tmp_path / "profile_export_aiperf.json"
    good.write_bytes((run / "profile_export_aiperf.json").read_bytes())
    output = _refused([a.format(**names) for a in args], good)
    assert message.format(**names) in output
    gpus = json.loads(good.read_text())["telemetry_data"]["endpoints"].popitem()[1]["gpus"]
    assert all(gpu["metrics"] for gpu in gpus.values())
