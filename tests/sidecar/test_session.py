"""A session over real HTTP on loopback: every dialect and every fault of the simulator reaches the
record log and the events as it should."""

from __future__ import annotations

import threading

import pytest

from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fetch import FetchError, FetchSettings, make_fetcher
from bridge.fields import default_table
from bridge.record_log import read_dicts, read_records
from bridge.sidecar.session import Session
from bridge.simulator import DIALECT_NAMES, Fault, ManualClock, SimulatedExporter, SimulatorConfig
from bridge.simulator.config import AMD_DIALECTS
from tests.sidecar.helpers import NS, scrape_synchronously, session_for


@pytest.mark.parametrize("dialect", [d for d in DIALECT_NAMES if d not in AMD_DIALECTS])  # amd: tests/sources/
def test_every_dialect_yields_eight_gpus_with_the_report_keys(dialect, tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=8, dialect=dialect, seed=3)) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()  # probe + baseline scrape
        scrape_synchronously(session, 2)
        session.complete()  # final scrape
    records = list(read_records(session.records.path))
    assert len({r.gpu_uuid for r in records}) == 8
    assert len(records) == 8 * 4
    for record in records:
        assert record.gpu_uuid.startswith("GPU-") and record.gpu_model_name
        data = record.telemetry_data
        assert 50 < data["nvidia_power_usage"] < 1000 and data["nvidia_energy_consumption"] > 0
        assert 0 <= data["nvidia_gpu_utilization"] <= 100 and 10 < data["nvidia_temperature"] < 110
        assert data["nvidia_memory_used"] > 0 and data["nvidia_sm_clock"] > 100
        assert record.run_id == "test-run" and record.telemetry_source_url == exporter.url


def test_mig_instances_are_distinct_identities_over_http(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=2, mig=3, seed=1)) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        session.complete()
    records = list(read_records(session.records.path))
    identities = {(r.gpu_uuid, r.gpu_instance_id) for r in records}
    assert len(identities) == 2 * (1 + 3)
    parents = [r for r in records if r.gpu_instance_id is None]
    assert all("nvidia_power_usage" in r.telemetry_data for r in parents)
    assert not any("nvidia_power_usage" in r.telemetry_data for r in records if r.gpu_instance_id)


def test_an_unchanged_body_is_still_recorded(tmp_path):
    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=1, refresh_ms=30_000), now_ns=clock) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        scrape_synchronously(session, 3)  # the same simulated instant: byte-identical bodies
        session.complete()
    records = list(read_records(session.records.path))
    assert len(records) == 5 and len({r.telemetry_data["nvidia_power_usage"] for r in records}) == 1


FAULT_KINDS_SEEN = {
    "http-500": "http_status",
    "empty-body": "empty",
    "truncated": "truncated",
    "json": "content_type",
}


@pytest.mark.parametrize(("fault", "kind"), sorted(FAULT_KINDS_SEEN.items()))
def test_a_failing_scrape_is_an_event_and_the_healthy_endpoint_loses_nothing(fault, kind, tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=1)) as sick, \
            SimulatedExporter(SimulatorConfig(gpus=2, seed=2)) as healthy:
        session = session_for([sick.url, healthy.url], tmp_path)
        session.configure()
        sick.add_fault(Fault(fault))  # type: ignore[arg-type]
        scrape_synchronously(session, 3)
        status = session.status()
        session.complete()
    events = list(read_dicts(session.events.path))
    errors = [e for e in events if e["type"] == "scrape_error"]
    assert len(errors) == 4 and {e["kind"] for e in errors} == {kind}  # 3 scrapes + the final one
    assert all(e["endpoint"] == sick.url for e in errors)
    by_url: dict[str, int] = {}
    for record in read_records(session.records.path):
        by_url[record.telemetry_source_url] = by_url.get(record.telemetry_source_url, 0) + 1
    assert by_url == {sick.url: 2, healthy.url: 2 * 5}
    sick_status = next(e for e in status["endpoints"] if e["url"] == sick.url)
    assert sick_status["state"] == "down" and sick_status["failures"] == {kind: 3}


def test_a_slow_endpoint_times_out_without_holding_up_the_others(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1)) as slow, SimulatedExporter(SimulatorConfig(gpus=1)) as ok:
        session = session_for([slow.url, ok.url], tmp_path, scrape_timeout=0.2)
        session.configure()
        slow.add_fault(Fault("slow", delay_s=1.0))
        scrape_synchronously(session, 1)
        session.complete()
    errors = [e for e in read_dicts(session.events.path) if e["type"] == "scrape_error"]
    assert {e["kind"] for e in errors} == {"timeout"} and all(e["endpoint"] == slow.url for e in errors)
    # The kept-alive connection from configure time was reused: no connect happened, so none timed out.
    assert all("did not answer within" in e["message"] and "connect" not in e["message"] for e in errors)


def test_a_body_over_the_limit_is_refused_with_a_clear_error(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        exporter.add_fault(Fault("huge-body", size_bytes=3 * 1024 * 1024))
        fetcher = make_fetcher(FetchSettings(max_body_bytes=1024 * 1024))
        with pytest.raises(FetchError) as info:
            fetcher.fetch(exporter.url)
    assert info.value.kind == "too_large" and "DCGM_BRIDGE_MAX_BODY_BYTES" in info.value.message


@pytest.mark.parametrize(("fault", "gpus_left"), [("garbage-line", 4), ("unescaped-quote", 3), ("sentinels", 4)])
def test_bad_lines_cost_only_themselves(fault, gpus_left, tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=4, seed=5)) as exporter:
        exporter.add_fault(Fault(fault))  # type: ignore[arg-type]
        session = session_for([exporter.url], tmp_path)
        session.configure()
        session.complete()
    records = list(read_records(session.records.path))
    # A raw `"` breaks every line of the GPU whose pod label holds it; only those lines are lost.
    assert len({r.gpu_uuid for r in records}) == gpus_left and len(records) == 2 * gpus_left
    sentinels = {9223372036854775794.0, 2147483632.0, 140737488355328.0}
    for record in records:
        assert not sentinels & set(record.telemetry_data.values())  # no sentinel became a value
        assert record.telemetry_data.get("nvidia_memory_temp", 0) < 200
        assert record.telemetry_data["nvidia_temperature"] < 200


def test_an_endpoint_down_at_start_is_scraped_when_it_comes_up(tmp_path):
    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=1), now_ns=clock) as exporter:
        exporter.restart(down_for_ns=10 * NS)
        session = session_for([exporter.url], tmp_path)
        probes = session.configure()
        assert not probes[0].reachable
        clock.advance(11 * NS)
        exporter.poll()
        scrape_synchronously(session, 1)
        session.complete()
    events = list(read_dicts(session.events.path))
    configured = next(e for e in events if e["type"] == "configured")
    assert configured["endpoints_configured"] == [exporter.url] and configured["endpoints_successful"] == []
    assert len(list(read_records(session.records.path))) == 2


def test_credentials_never_reach_the_record_log_or_the_events(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        secret_url = exporter.url.replace("http://", "http://alice:s3cret@") + "?token=t0psecret"
        session = session_for([secret_url], tmp_path)
        session.configure()
        exporter.add_fault(Fault("http-500"))
        scrape_synchronously(session, 1)
        session.complete()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            assert "s3cret" not in text and "t0psecret" not in text and "alice" not in text, path

def test_an_xid_and_a_counter_reset_reach_the_record_log(tmp_path):
    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=2), now_ns=clock) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        clock.advance(NS)
        exporter.add_fault(Fault("xid", gpu=1, xid=79))
        exporter.add_fault(Fault("counter-reset"))
        clock.advance(NS)
        scrape_synchronously(session, 1)
        session.complete()
    records = list(read_records(session.records.path))
    before, after = [r for r in records if r.gpu_index == 1][0], [r for r in records if r.gpu_index == 1][-1]
    assert "nvidia_xid_errors" not in before.telemetry_data  # absent until the first XID, never 0
    assert after.telemetry_data["nvidia_xid_errors"] == 79.0
    assert after.telemetry_data["nvidia_energy_consumption"] < before.telemetry_data["nvidia_energy_consumption"]


@pytest.fixture
def header_recorder():
    """A one-page exporter on loopback that records the Authorization header of every request."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            body = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 40\n'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_userinfo_becomes_basic_auth_and_never_reaches_the_request_line(header_recorder):
    address, seen = header_recorder
    make_fetcher(FetchSettings()).fetch(f"http://alice:s3cret@{address}/metrics")
    assert seen == ["Basic YWxpY2U6czNjcmV0"]


def test_a_bearer_token_from_a_file_is_sent(header_recorder, tmp_path):
    address, seen = header_recorder
    (tmp_path / "token").write_text("t0ken\n")
    config = Config(telemetry=TelemetryItems(urls=[f"http://{address}/metrics"]), default_endpoints=[],
                    artifact_dir=str(tmp_path / "out"), bearer_token_file=str(tmp_path / "token"))
    session = Session(config, default_table())
    session.configure()
    session.complete()
    assert seen and set(seen) == {"Bearer t0ken"}


def test_a_page_with_no_sample_in_it_is_not_up(tmp_path):
    """An HTML page answered 200 (the wrong port, a proxy's error page): /status must not say `up`."""
    from tests.loopback import LoopbackServer, send

    with LoopbackServer(lambda h: send(h, b"<html><body>Bad gateway</body></html>", content_type="text/html")) \
            as server, SimulatedExporter(SimulatorConfig(gpus=1)) as good:
        session = session_for([server.url, good.url], tmp_path)
        session.configure()
        scrape_synchronously(session, 2)
        status = {e["display"]: e for e in session.status()["endpoints"]}
        session.complete()
    bad = status[f"127.0.0.1:{server.port}"]
    assert bad["state"] == "down" and "answered an HTML page (text/html)" in bad["last_error"]
    assert next(e for k, e in status.items() if k != f"127.0.0.1:{server.port}")["state"] == "up"
