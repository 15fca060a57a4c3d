"""The fault matrix, over real HTTP on loopback: whatever one endpoint, the OTLP receiver or the disk does,
the sidecar stays up, every healthy endpoint's scrapes are all in the record log, and the report names
the failure (error_summary, endpoint state).

tests/sidecar/test_session.py checks the scrape-error events of the simple faults; here each fault runs a whole
session to its report. The SIGTERM case is tests/test_run.py (a subprocess).
"""

from __future__ import annotations

import errno
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import orjson
import pytest

from bridge.config import Config
from bridge.endpoints import TelemetryItems, display_key
from bridge.fields import default_table
from bridge.otlp import OtlpConfig, OtlpForwarder
from bridge.record_log import read_dicts, read_records
from bridge.sidecar.session import Session
from bridge.simulator import Fault, ManualClock, SimulatedExporter, SimulatorConfig
from tests.loopback import LoopbackServer, send

NS = 1_000_000_000
SCRAPES = 3


def session_for(urls: list[str], out: Path, **overrides: Any) -> Session:
    settings: dict[str, Any] = {"collection_interval": 0.05, "scrape_timeout": 0.3, "connect_timeout": 0.3,
                                "run_id": "faults", "shutdown_delay": 5.0, **overrides}
    forwarder = settings.pop("forwarder", None)
    opener = settings.pop("opener", None)
    now_ns = settings.pop("now_ns", time.time_ns)
    config = Config(telemetry=TelemetryItems(urls=urls), default_endpoints=[], artifact_dir=str(out), **settings)
    return Session(config, default_table(), forwarder=forwarder, opener=opener, now_ns=now_ns)


def scrape(session: Session, times: int = SCRAPES) -> None:
    """Synchronous scrapes, one endpoint after the other (for the tests on a manual clock)."""
    for _ in range(times):
        for loop in session.loops.values():
            loop.scrape_now()


def collect(session: Session, times: int = SCRAPES) -> None:
    """The sidecar as it runs: its scrape thread until every endpoint has `times` more outcomes (pages or
    failures); a stalled thread fails the test."""
    def outcomes(url: str) -> int:
        stats = session.loops[url].stats
        return stats.scrapes + sum(stats.failures.values())

    before = {url: outcomes(url) for url in session.loops}
    session.start()
    deadline = time.monotonic() + 60
    while any(outcomes(url) < before[url] + times for url in session.loops):
        assert time.monotonic() < deadline, {url: outcomes(url) - before[url] for url in session.loops}
        time.sleep(0.01)


def records_by_endpoint(session: Session) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in read_records(session.records.path):
        counts[record.telemetry_source_url] = counts.get(record.telemetry_source_url, 0) + 1
    return counts


def errors_of(report: Any, endpoint_url: str) -> dict[str, int]:
    """error_summary of the report for one endpoint: type -> count."""
    key = display_key(endpoint_url)
    out: dict[str, int] = {}
    for entry in report.telemetry_data["error_summary"]:
        if entry["error_details"]["message"].startswith(key):
            kind = entry["error_details"]["type"]
            out[kind] = out.get(kind, 0) + entry["count"]
    return out


def assert_healthy_endpoint_lost_nothing(session: Session, healthy: SimulatedExporter, gpus: int = 2) -> None:
    scrapes = session.loops[healthy.url].stats.scrapes
    assert scrapes >= SCRAPES + 2  # baseline, the scrapes, the final one
    assert records_by_endpoint(session).get(healthy.url) == gpus * scrapes
    report = session.outputs.report  # type: ignore[union-attr]
    assert healthy.url in report.telemetry_data["summary"]["endpoints_successful"]
    assert not errors_of(report, healthy.url)


# -- one endpoint misbehaves; the other is healthy ------------------------------------------------------
SCRAPE_FAULTS: dict[str, tuple[Callable[[SimulatedExporter], None], str, bool]] = {
    # name: (what to do to the sick exporter after the baseline, error type in the report, still up at the end)
    "http-500": (lambda e: e.add_fault(Fault("http-500")), "http_status", False),
    "empty body": (lambda e: e.add_fault(Fault("empty-body")), "empty", False),
    "truncated body": (lambda e: e.add_fault(Fault("truncated")), "truncated", False),
    "100 MB body": (lambda e: e.add_fault(Fault("huge-body", size_bytes=100 * 1024 * 1024)), "too_large", False),
    "JSON content type": (lambda e: e.add_fault(Fault("json")), "content_type", False),
    "slower than the timeout": (lambda e: e.add_fault(Fault("slow", delay_s=2.0)), "timeout", False),
    "dies mid-run": (lambda e: e.stop(), "connect", False),
    "a garbage line": (lambda e: e.add_fault(Fault("garbage-line")), "parse", True),
    'a raw " in a label value': (lambda e: e.add_fault(Fault("unescaped-quote")), "parse", True),
}


@pytest.mark.parametrize("fault", list(SCRAPE_FAULTS))
def test_a_failing_endpoint_is_named_in_the_report_and_the_healthy_one_loses_no_scrape(fault, tmp_path):
    inject, kind, up_at_end = SCRAPE_FAULTS[fault]
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=1)) as sick, \
            SimulatedExporter(SimulatorConfig(gpus=2, seed=2)) as healthy:
        session = session_for([sick.url, healthy.url], tmp_path)
        session.configure()
        inject(sick)
        collect(session)
        outputs = session.complete()
    report = outputs.report
    assert (tmp_path / "profile_export_aiperf.json").exists()
    assert_healthy_endpoint_lost_nothing(session, healthy)
    errors = errors_of(report, sick.url)
    assert errors.get(kind, 0) >= 1, report.telemetry_data["error_summary"]
    assert (sick.url in report.telemetry_data["summary"]["endpoints_successful"]) == up_at_end
    if not up_at_end:
        assert errors.get("endpoint_down") == 1  # went down once, stayed down
    assert orjson.loads((tmp_path / "profile_export_aiperf.json").read_bytes())["telemetry_data"]["error_summary"]


def test_an_endpoint_down_at_start_is_named_and_never_stops_the_others(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=1)) as sick, \
            SimulatedExporter(SimulatorConfig(gpus=2, seed=2)) as healthy:
        sick.stop()
        session = session_for([sick.url, healthy.url], tmp_path)
        probes = session.configure()
        assert [p.reachable for p in probes] == [False, True]
        collect(session)
        outputs = session.complete()
    assert_healthy_endpoint_lost_nothing(session, healthy)
    summary = outputs.report.telemetry_data["summary"]
    assert sick.url in summary["endpoints_configured"] and sick.url not in summary["endpoints_successful"]
    assert errors_of(outputs.report, sick.url).get("connect", 0) >= SCRAPES


def test_a_page_of_garbage_bytes_is_a_parse_error_in_the_report(tmp_path):
    page = b"\x00\xff\xfe<html>not metrics</html>\n{\"json\": 1}\n\xc3\x28 \x1b[31m\n"
    with LoopbackServer(lambda h: send(h, page, content_type="text/plain; version=0.0.4")) as garbage, \
            SimulatedExporter(SimulatorConfig(gpus=2, seed=2)) as healthy:
        session = session_for([garbage.url, healthy.url], tmp_path)
        session.configure()
        collect(session)
        outputs = session.complete()
    assert_healthy_endpoint_lost_nothing(session, healthy)
    assert records_by_endpoint(session).get(garbage.url) is None
    messages = [e["error_details"]["message"] for e in outputs.report.telemetry_data["error_summary"]
                if e["error_details"]["type"] == "parse"]
    assert messages and "no sample could be read" in messages[0]


def test_an_exporter_that_restarts_is_named_down_then_up_and_its_counter_reset_is_not_lost(tmp_path):
    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=1), now_ns=clock) as sick, \
            SimulatedExporter(SimulatorConfig(gpus=2, seed=2), now_ns=clock) as healthy:
        session = session_for([sick.url, healthy.url], tmp_path, now_ns=clock)
        session.configure()
        for _ in range(3):
            clock.advance(NS)
            scrape(session, 1)
        sick.restart(down_for_ns=5 * NS)
        clock.advance(NS)
        scrape(session, 2)  # refused while it is down
        clock.advance(5 * NS)
        sick.poll()  # listening again, its counters restarted from zero (a driver reload, a new pod)
        sick.model.reset_counters(clock(), None)
        for _ in range(3):
            clock.advance(NS)
            scrape(session, 1)
        outputs = session.complete()
    report = outputs.report
    assert_healthy_endpoint_lost_nothing(session, healthy)
    errors = errors_of(report, sick.url)
    assert errors.get("connect") == 2 and errors.get("endpoint_down") == 1
    assert sick.url in report.telemetry_data["summary"]["endpoints_successful"]  # back up by the end
    energy = [r.telemetry_data["nvidia_energy_consumption"] for r in read_records(session.records.path)
              if r.telemetry_source_url == sick.url and r.gpu_index == 0]
    assert energy[-1] < energy[0]  # the counter restarted below where it began
    gpu0 = report.telemetry_data["endpoints"][display_key(sick.url)]["gpus"]["gpu_0"]
    assert gpu0["metrics"]["nvidia_energy_consumption"]["avg"] > 0  # the energy before and after the reset
    states = [e["state"] for e in read_dicts(session.events.path) if e["type"] == "endpoint_state"]
    assert states == ["down", "up"]


# -- the OTLP receiver misbehaves -----------------------------------------------------------------------
class ScriptedReceiver:
    """An OTLP/HTTP receiver on loopback whose answer the test changes while the run goes on."""

    def __init__(self) -> None:
        self.mode = "ok"  # ok | 400 | 429 | slow
        self.requests: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                mode = receiver.mode
                receiver.requests.append(mode)
                if mode == "slow":
                    time.sleep(0.5)  # the receiver's slowness, not a synchronisation
                status = {"ok": 200, "400": 400, "429": 429, "slow": 200}[mode]
                body = b"bad data point" if status == 400 else b""
                try:
                    self.send_response(status)
                    if status == 429:
                        self.send_header("Retry-After", "0.05")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on a slow answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[ScriptedReceiver]:
    server = ScriptedReceiver()
    yield server
    server.close()


def wait_until(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)  # bounded polling of another thread's progress


def points_of(session: Session, exporter: SimulatedExporter) -> int:
    """Points the run had to deliver: every sample of every scrape, one staleness marker per series at the end
    (the run is over: its series end), and the bridge's own refresh gauges."""
    per_page = len([line for line in exporter.renderer.page(exporter.now_ns()).splitlines()
                    if line and not line.startswith(b"#")])
    return per_page * (session.loops[exporter.url].stats.scrapes + 1) + session.self_metric_points


def otlp_session(tmp_path: Path, exporter: SimulatedExporter, endpoint: str, **otlp: Any) -> tuple[Session, Any]:
    settings = {"export_interval_s": 0.02, "retry_initial_backoff_s": 0.02, "retry_max_backoff_s": 0.1,
                "timeout_s": 0.2, **otlp}
    forwarder = OtlpForwarder(OtlpConfig(endpoint=endpoint, **settings), base_resource={"service.name": "t"})
    session = session_for([exporter.url], tmp_path, forwarder=forwarder)
    session.configure()
    return session, forwarder


@pytest.mark.parametrize("mode", ["429", "slow"])
def test_a_receiver_that_throttles_or_stalls_is_retried_and_delivery_resumes(mode, receiver, tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        session, forwarder = otlp_session(tmp_path, exporter, receiver.url)
        receiver.mode = mode
        scrape(session)
        wait_until(lambda: forwarder.stats().retried_requests >= 2)
        receiver.mode = "ok"
        scrape(session)
        outputs = session.complete()
    stats = session.status()["otlp"]
    assert outputs.report is not None
    assert stats["dropped_points"] == 0 and stats["rejected_points"] == 0 and stats["queue_depth_points"] == 0
    assert stats["sent_points"] == points_of(session, exporter)  # every point of every scrape
    assert records_by_endpoint(session)[exporter.url] == 2 * session.loops[exporter.url].stats.scrapes


def test_a_receiver_that_rejects_points_has_them_counted_and_scraping_goes_on(receiver, tmp_path, caplog):
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        session, forwarder = otlp_session(tmp_path, exporter, receiver.url)
        receiver.mode = "400"
        scrape(session)
        wait_until(lambda: forwarder.stats().rejected_points > 0 and forwarder.stats().queue_depth_points == 0)
        receiver.mode = "ok"
        scrape(session)
        session.complete()
    stats = session.status()["otlp"]
    assert stats["rejected_points"] > 0 and stats["sent_points"] > 0 and stats["dropped_points"] == 0
    assert stats["rejected_points"] + stats["sent_points"] == points_of(session, exporter)
    assert records_by_endpoint(session)[exporter.url] == 2 * session.loops[exporter.url].stats.scrapes
    assert any("rejected" in r.getMessage() and "bad data point" in r.getMessage() for r in caplog.records)


def test_a_receiver_down_past_the_queue_bound_drops_the_oldest_pages_counted(receiver, tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        receiver.close()  # nothing listens: connection refused
        session, forwarder = otlp_session(tmp_path, exporter, receiver.url, max_queue_points=2 * 80)
        scrape(session, 6)
        wait_until(lambda: forwarder.stats().retried_requests >= 1)
        stats = forwarder.stats()
        assert stats.dropped_points >= 2 * 80 and stats.queue_depth_points <= 2 * 80
        session.complete()
    assert records_by_endpoint(session)[exporter.url] == 2 * session.loops[exporter.url].stats.scrapes
    complete = [e for e in read_dicts(session.events.path) if e["type"] == "complete"][0]
    assert complete["otlp"]["dropped_points"] >= 2 * 80  # the bound, not a timer, decided what was lost


# -- the artifacts directory refuses writes ------------------------------------------------------------
class FullDisk:
    """An opener whose files take part of a write and then fail with ENOSPC, while `full` is set."""

    def __init__(self) -> None:
        self.full = False

    def __call__(self, path: Path) -> IO[bytes]:
        raw = open(path, "ab", buffering=0)  # noqa: SIM115 - returned to the writer
        disk = self

        class Filling:
            def write(self, data: bytes | memoryview) -> int:
                if disk.full:
                    if len(data) > 10:
                        return raw.write(bytes(data)[: len(data) // 2])  # part of it lands, as on a real disk
                    raise OSError(errno.ENOSPC, "No space left on device")
                return raw.write(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(raw, name)

        return Filling()  # type: ignore[return-value]


def refuse(path: Path) -> IO[bytes]:
    raise PermissionError(errno.EACCES, "Permission denied", str(path))


def test_a_full_disk_never_leaves_half_a_line_and_every_record_lands_once_there_is_room(tmp_path, caplog):
    disk = FullDisk()
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        session = session_for([exporter.url], tmp_path, opener=disk, flush_interval=0.0)
        session.configure()
        disk.full = True
        scrape(session)
        status = session.status()["record_log"]
        disk.full = False
        outputs = session.complete()
    assert "No space left on device" in status["error"]
    assert any("No space left on device" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    raw = session.records.path.read_bytes()
    assert raw.endswith(b"\n") and all(orjson.loads(line) for line in raw.splitlines())  # whole lines only
    assert len(raw.splitlines()) == session.records_written  # nothing lost, nothing twice
    assert outputs.report.records == session.records_written


def test_an_unwritable_artifacts_dir_is_a_clear_error_and_the_report_still_has_every_scrape(tmp_path, caplog):
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        session = session_for([exporter.url], tmp_path, opener=refuse, flush_interval=0.0)
        session.configure()
        scrape(session)
        assert "Permission denied" in session.status()["record_log"]["error"]
        outputs = session.complete()
    assert not session.records.path.exists()
    assert any("Permission denied" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    # The report came from the live series, which did not need the record log.
    assert outputs.report.records == session.records_written == 2 * session.loops[exporter.url].stats.scrapes
    assert (tmp_path / "profile_export_aiperf.json").exists()


def test_sigterm_while_every_endpoint_hangs_at_start_up_ends_within_one_probe_timeout(tmp_path: Path) -> None:
    """Issue 16 item 6: probes run at once, and a hanging endpoint gets no final scrape: not 2 × 5 s + 5 s."""
    import signal
    import subprocess
    import sys
    import threading

    from tests.conftest import free_port
    from tests.loopback import LoopbackServer

    release = threading.Event()
    with LoopbackServer(lambda _h: release.wait(60)) as a, LoopbackServer(lambda _h: release.wait(60)) as b, \
            LoopbackServer(lambda _h: release.wait(60)) as c:
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "bridge.cli", "sidecar", "--gpu-telemetry", a.url, b.url, c.url,
             "--artifact-dir", str(tmp_path), "--health-port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1.5)  # inside the probes' 5 s timeout
            asked = time.monotonic()  # /status answers while the probes hang (it takes no lock they hold)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=3) as response:
                assert json.loads(response.read())["state"] == "created"
            assert time.monotonic() - asked < 1.0
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=60)
            took = time.monotonic() - sent
        finally:
            release.set()
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0, err
    assert took < 5.5, f"SIGTERM took {took:.1f} s"  # the probes' remaining 3.5 s, then the files
    assert (tmp_path / "gpu_telemetry_events.jsonl").exists()
