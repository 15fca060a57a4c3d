"""simulator → sidecar (Session) → OTLP/HTTP → VictoriaMetrics → PromQL, end to end; and the report
rebuilt from the store equals the one built from the record log."""

from __future__ import annotations

import math
import time

import orjson
import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fields import default_table
from bridge.otlp import OtlpForwarder
from bridge.record_log import read_dicts, read_records
from bridge.report import build_report_from_events
from bridge.report.store import records_from_store
from bridge.sidecar.session import Session
from bridge.simulator import Fault, SimulatedExporter, SimulatorConfig
from tests.otlp.conftest import forwarding_session, prom_query, wait_until

pytestmark = pytest.mark.realstack  # VictoriaMetrics

RUN = "e2e-run-1"


def _wait_records(session: Session, count: int) -> None:
    wait_until(lambda: session.records_written >= count, 30.0, f"{count} records")


@pytest.fixture(scope="module")
def run(victoria_metrics, tmp_path_factory):
    """One run with a warmup and a profiling phase and a counter reset in the profiling phase."""
    out = tmp_path_factory.mktemp("e2e")
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=4)) as exporter:
        session = forwarding_session(victoria_metrics, exporter.url, out, RUN, 0.1)
        session.mark_phase("warmup", "warmup", "start", time.time_ns())
        _wait_records(session, 2 * 6)
        boundary = time.time_ns()
        session.mark_phase("warmup", "warmup", "end", boundary)
        session.mark_phase("profiling", "profiling", "start", boundary)
        _wait_records(session, 2 * 14)
        exporter.add_fault(Fault("counter-reset"))
        _wait_records(session, 2 * 24)
        end = time.time_ns()
        session.mark_phase("profiling", "profiling", "end", end)
        outputs = session.complete(requests_end_ns=end)
        model = exporter.model
    victoria_metrics.flush()
    return session, outputs, model, out


def test_every_recorded_sample_is_in_the_store_at_its_millisecond(run, victoria_metrics):
    session, _outputs, _model, out = run
    records = list(read_records(out / "gpu_telemetry_export.jsonl"))
    stored = prom_query(victoria_metrics.base, f'DCGM_FI_DEV_POWER_USAGE{{run_id="{RUN}"}}[10m]', time.time())
    by_uuid: dict[str, set[int]] = {}
    for series in stored:  # one series per (GPU, phase): the phase is a label
        by_uuid.setdefault(series["metric"]["UUID"], set()).update(
            int(round(float(t) * 1000)) for t, v in series["values"] if v != "NaN")
    assert len(by_uuid) == 2 and len(stored) == 2 * 3  # none (baseline), warmup, profiling
    for record in records:
        assert record.timestamp_ns // 1_000_000 in by_uuid[record.gpu_uuid]
    assert sum(len(v) for v in by_uuid.values()) == len(records)
    stats = session.status()["otlp"]
    assert stats["dropped_points"] == 0 and stats["sent_points"] > 0


def test_run_and_phase_are_selectable_and_every_exporter_label_is_kept(run, victoria_metrics):
    at = time.time()
    profiling = prom_query(victoria_metrics.base,
                           f'count_over_time(DCGM_FI_DEV_GPU_TEMP{{run_id="{RUN}",phase="profiling"}}[10m])', at)
    warmup = prom_query(victoria_metrics.base,
                        f'count_over_time(DCGM_FI_DEV_GPU_TEMP{{run_id="{RUN}",phase="warmup"}}[10m])', at)
    assert len(profiling) == 2 and len(warmup) == 2
    assert all(float(r["value"][1]) >= 2 for r in profiling + warmup)
    labels = prom_query(victoria_metrics.base, f'DCGM_FI_DEV_GPU_TEMP{{run_id="{RUN}"}}[10m]', at)[0]["metric"]
    assert {"gpu", "UUID", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION", "run_id", "phase"} <= set(labels)


def test_the_energy_counter_increases_correctly_across_the_reset(run, victoria_metrics):
    _session, _outputs, model, out = run
    records = sorted(read_records(out / "gpu_telemetry_export.jsonl"), key=lambda r: r.timestamp_ns)
    profiling = [r for r in records if r.gpu_index == 0 and r.phase == "profiling"]
    first, last = profiling[0], profiling[-1]
    assert last.telemetry_data["nvidia_energy_consumption"] < first.telemetry_data["nvidia_energy_consumption"]
    span_ms = (last.timestamp_ns - first.timestamp_ns) // 1_000_000 + 1
    selector = f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{run_id="{RUN}",phase="profiling",gpu="0"}}'
    at_s = last.timestamp_ns / 1e9 + 0.0005
    assert float(prom_query(victoria_metrics.base, f"resets({selector}[{span_ms}ms])", at_s)[0]["value"][1]) == 1
    measured_mj = float(prom_query(victoria_metrics.base, f"increase({selector}[{span_ms}ms])", at_s)[0]["value"][1])
    truth_mj = model.energy_joules(0, first.timestamp_ns, last.timestamp_ns) * 1000
    # increase() loses the part of the reset interval before the reset: at most one 0.1 s scrape of ~0.8 s;
    # a naive last - first would be negative.
    assert truth_mj * 0.8 < measured_mj <= truth_mj * 1.001, (measured_mj, truth_mj)


def test_the_report_from_the_store_equals_the_report_from_the_record_log(run, victoria_metrics):
    session, _outputs, _model, out = run
    events = out / "gpu_telemetry_events.jsonl"
    from_log = build_report_from_events(
        [_at_ms(r) for r in read_records(out / "gpu_telemetry_export.jsonl")], events, table=session.table)
    marks = [e for e in read_dicts(events) if e["type"] == "phase"]
    start, end = min(m["time_ns"] for m in marks), max(m["time_ns"] for m in marks)
    stored = list(records_from_store(victoria_metrics.base, RUN, start - 10**9, end + 2 * 10**9, session.table))
    from_store = build_report_from_events(stored, events, table=session.table)
    _assert_same_numbers(from_store.telemetry_data["endpoints"], from_log.telemetry_data["endpoints"])


def test_report_prometheus_command_rebuilds_telemetry_data(run, victoria_metrics, tmp_path):
    session, _outputs, _model, out = run
    target = tmp_path / "profile_export_aiperf.json"
    result = CliRunner().invoke(main, ["report", "--prometheus", victoria_metrics.base, "--run-id", RUN,
                                       "--events", str(out / "gpu_telemetry_events.jsonl"), "-o", str(target)])
    assert result.exit_code == 0, result.output
    rebuilt = orjson.loads(target.read_bytes())["telemetry_data"]["endpoints"]
    events = out / "gpu_telemetry_events.jsonl"
    from_log = build_report_from_events(
        [_at_ms(r) for r in read_records(out / "gpu_telemetry_export.jsonl")], events, table=session.table)
    _assert_same_numbers(rebuilt, orjson.loads(orjson.dumps(from_log.telemetry_data["endpoints"])))


def _at_ms(record):
    """The record as a store keeps it: its time in ms, and no scrape end (a sample has one time)."""
    from dataclasses import replace

    return replace(record, timestamp_ns=record.timestamp_ns // 1_000_000 * 1_000_000, scrape_end_ns=None)


def _assert_same_numbers(a, b, path="endpoints"):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _assert_same_numbers(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), (path, a, b)
    else:
        assert a == b, (path, a, b)


@pytest.mark.slow  # 200 scrapes of outage and the recovery
def test_a_receiver_outage_mid_run_loses_no_record_and_no_point_inside_the_queue_bound(tmp_path):
    from bridge.otlp import OtlpConfig
    from tests.conftest import require_binary
    from tests.otlp.conftest import VictoriaMetrics

    vm = VictoriaMetrics(require_binary("victoria-metrics"), tmp_path / "vm" / "data")
    (tmp_path / "vm").mkdir(exist_ok=True)
    vm.start()
    run_id = "outage-run"
    try:
        with SimulatedExporter(SimulatorConfig(gpus=2, seed=9)) as exporter:
            otlp = OtlpConfig(endpoint=vm.otlp_url, export_interval_s=0.05, retry_initial_backoff_s=0.05,
                              retry_max_backoff_s=0.3)
            forwarder = OtlpForwarder(otlp, base_resource={"service.name": "dcgm-exporter"})
            config = Config(telemetry=TelemetryItems(urls=[exporter.url]), default_endpoints=[],
                            artifact_dir=str(tmp_path / "out"), collection_interval=0.05, run_id=run_id,
                            shutdown_delay=20.0)
            session = Session(config, default_table(), forwarder=forwarder)
            session.configure()
            session.start()
            _wait_records(session, 2 * 5)
            vm.stop()
            during = session.records_written
            wait_until(lambda: forwarder.stats().retried_requests >= 3, 30.0, "three failed exports")
            # The 10 s outage, counted in scrapes (200 at 20 Hz) rather than slept: scraping goes
            # on while the receiver is down, and the queue holds what it could not send.
            wait_until(lambda: session.records_written >= during + 2 * 200, 60.0, "10 s of scrapes")
            assert forwarder.stats().queue_depth_points > 0
            vm.start()
            _wait_records(session, session.records_written + 2 * 5)
            session.complete()
        stats = session.status()["otlp"]
        assert stats["dropped_points"] == 0 and stats["rejected_points"] == 0
        vm.flush()
        records = [r for r in read_records(tmp_path / "out" / "gpu_telemetry_export.jsonl") if r.gpu_index == 0]
        stored = prom_query(vm.base, f'DCGM_FI_DEV_POWER_USAGE{{run_id="{run_id}",gpu="0"}}[10m]', time.time())
        times = {int(round(float(t) * 1000)) for s in stored for t, v in s["values"] if v != "NaN"}
        assert {r.timestamp_ns // 1_000_000 for r in records} == times
        assert len(records) == session.loops[exporter.url].stats.scrapes  # every scrape is in the record log
    finally:
        vm.stop()
