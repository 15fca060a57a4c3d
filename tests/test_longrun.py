"""A one-hour run on a fast clock: the report the sidecar writes at completion (from its live series) equals
the report `dcgm-bridge report` rebuilds from the gzip record log and the events. The hour has a warmup and
a profiling phase, a counter reset, an XID and a one-minute exporter outage. (RSS over such a run is a
bench figure: bench/bench_longrun.py.)"""

from __future__ import annotations

import threading

import orjson
import pytest

from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fields import default_table
from bridge.record_log import read_records
from bridge.report import build_report_from_events
from bridge.report.write import write_report
from bridge.sidecar.session import Session
from bridge.simulator import Fault, ManualClock, SimulatedExporter, SimulatorConfig

NS = 1_000_000_000
MINUTE = 60 * NS


@pytest.mark.slow
def test_an_hour_on_a_fast_clock_reports_exactly_what_the_record_log_rebuilds(tmp_path):
    clock = ManualClock()
    start = clock()
    out = tmp_path / "run"
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=11), now_ns=clock) as exporter:
        config = Config(telemetry=TelemetryItems(urls=[exporter.url]), default_endpoints=[], artifact_dir=str(out),
                        run_id="hour", record_log_gzip=True, scrape_timeout=1.0, connect_timeout=0.5)
        session = Session(config, default_table(), now_ns=clock, monotonic=lambda: clock() / NS)
        session.configure()
        (loop,) = session.loops.values()
        exporter.add_fault(Fault("counter-reset", from_ns=start + 30 * MINUTE))
        exporter.add_fault(Fault("xid", from_ns=start + 40 * MINUTE, gpu=1, xid=48))
        exporter.add_fault(Fault("restart", from_ns=start + 45 * MINUTE, until_ns=start + 46 * MINUTE))
        marks = {5 * 60: ("warmup", "warmup", "start"), 10 * 60: ("warmup", "warmup", "end"),
                 10 * 60 + 1: ("profiling", "profiling", "start"), 55 * 60: ("profiling", "profiling", "end")}
        for second in range(1, 3600 + 1):  # one scrape a simulated second
            clock.advance(NS)
            if second in marks:
                name, kind, event = marks[second]
                session.mark_phase(name, kind, event, clock())
                for thread in threading.enumerate():  # its boundary scrape, done before the next tick
                    if thread.name.startswith("boundary"):
                        thread.join(10)
            exporter.poll()
            loop.scrape_now()
        requests_end = start + 55 * 60 * NS
        live = session.complete(requests_end_ns=requests_end).report
    assert session.records.path.name.endswith(".jsonl.gz")
    rebuilt = build_report_from_events(session.records.path, session.events.path, table=session.table,
                                       counter_mode=config.counter_mode, grace_ns=config.final_scrape_grace_ns)
    assert live.records == rebuilt.records == sum(1 for _ in read_records(session.records.path)) > 2 * 3400
    assert live.telemetry_data == rebuilt.telemetry_data
    assert live.phase_files == rebuilt.phase_files
    assert live.energy == rebuilt.energy
    errors = {e["error_details"]["type"] for e in live.telemetry_data["error_summary"]}
    assert {"connect", "endpoint_down"} <= errors
    written = orjson.loads((out / "profile_export_aiperf.json").read_bytes())["telemetry_data"]
    again = tmp_path / "again"
    write_report(rebuilt, again)
    assert orjson.loads((again / "profile_export_aiperf.json").read_bytes())["telemetry_data"] == written
