"""The fault matrix, over real HTTP on loopback: whatever one endpoint, the OTLP receiver or the disk does,
the sidecar stays up, every tick of every healthy endpoint is scraped and in the record log, and the report
names the failure (error_summary, endpoint state). A promised output that cannot be written (a read-only or
full volume, no file descriptor left, a name too long) fails the run: /readyz 503 while it lasts, POST
/complete 500 `completed: false`, exit 1.

tests/sidecar/test_session.py checks the scrape-error events of the simple faults; here each fault runs a whole
session to its report. The SIGTERM case is tests/sidecar/test_profile.py (a subprocess).
"""

from __future__ import annotations

import contextlib
import errno
import json
import resource
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import httpx
import orjson
import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from bridge.cli import main
from bridge.config import Config, resolve
from bridge.endpoints import TelemetryItems, display_key
from bridge.errors import ConfigError
from bridge.fields import default_table
from bridge.otlp import OtlpConfig, OtlpForwarder
from bridge.record_log import read_dicts, read_records
from bridge.sidecar.control import ControlServer
from bridge.sidecar.finish import ReportTarget, run_exit_code
from bridge.sidecar.session import Session
from bridge.simulator import Fault, ManualClock, SimulatedExporter, SimulatorConfig
from tests.conftest import failing_ext4, tmpfs
from tests.loopback import LoopbackServer, send
from tests.sidecar.helpers import start_sidecar, stop, wait_records

NS = 1_000_000_000
SCRAPES = 3


def session_for(urls: list[str], out: Path, **overrides: Any) -> Session:
    settings: dict[str, Any] = {"collection_interval": 0.1, "scrape_timeout": 0.3, "connect_timeout": 0.3,
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


def scrape_times(session: Session, url: str, gpus: int = 2) -> list[int]:
    """The sorted start times of the endpoint's recorded scrapes, each recorded whole (one record per GPU)."""
    times = [r.timestamp_ns for r in read_records(session.records.path) if r.telemetry_source_url == url]
    scrapes = sorted(set(times))
    assert len(times) == gpus * len(scrapes)
    return scrapes


def assert_healthy_endpoint_lost_nothing(session: Session, healthy: SimulatedExporter, gpus: int = 2) -> None:
    """Every tick of the healthy endpoint began a scrape, and every scrape that brought a page was recorded whole: the
    loop counts a tick it could not start (its thread held up past the next tick, or the previous scrape still in
    flight) as missed, never queues one. (Timing the records against a grid of ticks failed once a busy machine
    started one 81 ms into a 100 ms interval: late, not lost.)"""
    scrapes = scrape_times(session, healthy.url, gpus)
    stats = session.health.of(healthy.url)
    assert len(scrapes) > SCRAPES
    assert stats.missed_ticks == 0, f"{stats.missed_ticks} ticks missed; scrapes at {scrapes}"
    assert len(scrapes) == stats.scrapes, (len(scrapes), stats.scrapes)
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


def run_beside_a_healthy_one(page: bytes, tmp_path: Path) -> tuple[str, str | None, Any]:
    """A run of an endpoint serving `page` beside a healthy simulator: the endpoint's state and last error before
    the run ends, and the run's outputs (the healthy endpoint lost nothing)."""
    with LoopbackServer(lambda h: send(h, page, content_type="text/plain; version=0.0.4")) as served, \
            SimulatedExporter(SimulatorConfig(gpus=2, seed=2)) as healthy:
        session = session_for([served.url, healthy.url], tmp_path)
        session.configure()
        collect(session)
        stats = session.health.of(served.url)
        state, error = stats.state, stats.last_error
        outputs = session.complete()
    assert_healthy_endpoint_lost_nothing(session, healthy)
    return state, error, outputs


def test_an_exporter_that_declares_its_families_but_serves_no_sample_is_unreadable_as_seeing_no_gpu(tmp_path):
    # The L4 page's own HELP/TYPE lines without its samples: dcgm-exporter on a node whose GPUs it may not watch
    # (GKE time-sharing, NVIDIA/dcgm-exporter issue 222) serves exactly this.
    real = (Path(__file__).parent / "data" / "k8s-ai-conformance_kops_l4.txt").read_text().splitlines()
    page = "".join(f"{line}\n" for line in real if line.startswith(("# HELP", "# TYPE"))).encode()
    state, error, outputs = run_beside_a_healthy_one(page, tmp_path)
    assert state == "unreadable" and error is not None and "sees no GPU" in error and "issue 222" in error
    messages = [e["error_details"]["message"] for e in outputs.report.telemetry_data["error_summary"]
                if e["error_details"]["type"] == "parse"]
    assert messages and "declares 23 families" in messages[0]


def test_an_endpoint_serving_no_gpu_family_is_unreadable_naming_the_families_it_saw(tmp_path):
    page = b"# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{cpu=\"0\"} 12\nprocess_open_fds 9\n"
    state, error, _ = run_beside_a_healthy_one(page, tmp_path)
    assert state == "unreadable" and error is not None
    assert "none of them GPU telemetry" in error and "node_cpu_seconds_total, process_open_fds" in error


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
    # Synchronous scrapes, not ticks: the baseline, the eight above and the final one, each recorded whole.
    assert records_by_endpoint(session)[healthy.url] == 2 * session.loops[healthy.url].stats.scrapes == 2 * (1 + 8 + 1)
    errors = errors_of(report, sick.url)
    assert errors.get("connect") == 2 and errors.get("endpoint_down") == 1
    assert sick.url in report.telemetry_data["summary"]["endpoints_successful"]  # back up by the end
    energy = [r.telemetry_data["nvidia_energy_consumption"] for r in read_records(session.records.path)
              if r.telemetry_source_url == sick.url and r.gpu_index == 0]
    assert energy[-1] < energy[0]  # the counter restarted below where it began
    gpu0 = report.telemetry_data["endpoints"][display_key(sick.url)]["gpus"]["gpu_0"]
    # The energy really drawn over the window, from the simulator's ground truth (which ignores resets). The 7 s
    # between the last scrape before the outage and the first after the reset is bridged at the neighbouring
    # intervals' rate (DESIGN.md "Counters"): -2.4 % here, a seeded run on a manual clock. Counting only the
    # post-reset value (PromQL's increase()) would lose that gap, about half of it; AIPerf's rule gives ~0.
    energy_mj = gpu0["metrics"]["nvidia_energy_consumption"]["avg"]
    truth_mj = sick.model.energy_joules(0, report.window.start_ns, report.window.end_ns) / 1e6
    assert energy_mj == pytest.approx(truth_mj, rel=0.05)
    states = [e["state"] for e in read_dicts(session.events.path) if e["type"] == "endpoint_state"]
    assert states == ["down", "up"]


# -- the OTLP receiver misbehaves -----------------------------------------------------------------------
class ScriptedReceiver:
    """An OTLP/HTTP receiver on loopback whose answer the test changes while the run goes on."""

    def __init__(self, port: int = 0) -> None:
        self.mode = "ok"  # ok | 400 | 429 | slow
        self.requests: list[str] = []
        self.bodies: list[bytes] = []  # the requests answered 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                mode = receiver.mode
                receiver.requests.append(mode)
                if mode == "ok":
                    receiver.bodies.append(body)
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

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

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


def point_times(bodies: list[bytes]) -> set[int]:
    """The sample times of the exporter's data points in these OTLP/HTTP request bodies (not of the sidecar's
    own `dcgm_bridge_*` metrics, such as the refresh gauge, which go out in items of their own)."""
    request = ExportMetricsServiceRequest()
    times: set[int] = set()
    for body in bodies:
        request.ParseFromString(body)
        for resource_metrics in request.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    if metric.name.startswith("dcgm_bridge_"):
                        continue
                    points = metric.sum.data_points if metric.HasField("sum") else metric.gauge.data_points
                    times.update(point.time_unix_nano for point in points)
    return times


def test_a_receiver_down_past_the_queue_bound_drops_the_oldest_pages_counted(receiver, tmp_path):
    port = receiver.server.server_address[1]
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        receiver.close()  # nothing listens: connection refused
        # A page is 80 points (2 GPUs), a few more as encoded: a bound of 2.5 pages holds two, never three.
        session, forwarder = otlp_session(tmp_path, exporter, receiver.url, max_queue_points=200)
        scrape(session, 6)
        # The batch in flight is given up at its next attempt (a retry backoff at most): then the bound holds.
        wait_until(lambda: forwarder.stats().dropped_points >= 4 * 80 and forwarder.stats().queue_depth_points <= 200)
        back = ScriptedReceiver(port)  # the receiver is back: what the bound kept is delivered
        try:
            wait_until(lambda: forwarder.stats().queue_depth_points == 0 and forwarder.stats().sent_points > 0)
            delivered = point_times(back.bodies)
        finally:
            back.close()
        session.complete()
    scrape_times = sorted({r.timestamp_ns for r in read_records(session.records.path)})
    assert len(scrape_times) == 1 + 6 + 1  # the baseline, the six, the final scrape (delivered after `back`)
    # The newest pages, the bound's worth (the batch in flight goes whole: one page fewer when it held two), and
    # never an older page in place of a newer one.
    kept = scrape_times[1:7]
    assert 1 <= len(delivered) <= 2 and delivered == set(kept[-len(delivered):])
    assert records_by_endpoint(session)[exporter.url] == 2 * session.loops[exporter.url].stats.scrapes
    complete = [e for e in read_dicts(session.events.path) if e["type"] == "complete"][0]
    assert complete["otlp"]["dropped_points"] >= (7 - len(delivered)) * 80  # the bound, not a timer, decided


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


@pytest.mark.root
def test_a_folder_made_read_only_mid_run_fails_the_run_with_the_reason_and_the_report_still_has_every_scrape(
        tmp_path, caplog):
    with failing_ext4(tmp_path / "vol") as (volume, fail), SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        session = session_for([exporter.url], volume, flush_interval=0.0)
        session.configure()
        fail()  # the folder itself: the open files, the spool, any new or temporary file
        scrape(session)
        assert "Read-only file system" in session.status()["record_log"]["error"]
        assert session.not_ready() == f"cannot write {volume}: Read-only file system"
        outputs = session.complete()
        assert not (volume / "profile_export_aiperf.json").exists()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(m.startswith(f"the report was not written: cannot write {volume}/profile_export_aiperf.json: "
                            "Read-only file system") for m in errors), errors
    assert not any(r.exc_info for r in caplog.records)  # one line each, no traceback
    assert run_exit_code(0, outputs) == 1
    assert "gpu_telemetry_export.jsonl" in outputs.error and "Read-only file system" in outputs.error
    # The report came from the live series held in memory, which needed neither the record log nor the spool.
    assert outputs.report.records == session.records_written == 2 * session.loops[exporter.url].stats.scrapes


@pytest.mark.slow
def test_sigterm_while_every_endpoint_hangs_at_start_up_ends_within_one_probe_timeout(tmp_path: Path) -> None:
    """Issue 16 item 6: probes run at once, and a hanging endpoint gets no final scrape: not 2 × 5 s + 5 s."""
    import signal
    import subprocess
    import sys
    import threading

    from tests.conftest import free_port, wait_until
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
            # Inside the probes' 5 s timeout: every endpoint holds its probe.
            wait_until(lambda: all(server.requests for server in (a, b, c)), 10.0, "the three probes")
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
    assert took < 10, f"SIGTERM took {took:.1f} s"  # what is left of the probes' 5 s, and the files; before: 13.5 s
    assert (tmp_path / "gpu_telemetry_events.jsonl").exists()


# -- the sidecar as a process, its volume read-only, full, out of descriptors ----------------------------------
def wait_readyz(base: str, status: int) -> dict[str, Any]:
    """/readyz's answer once it has `status` (it tries the folder at most once a second)."""
    deadline = time.monotonic() + 10
    while (answer := httpx.get(base + "/readyz", timeout=5)).status_code != status:
        assert time.monotonic() < deadline, answer.json()
        time.sleep(0.05)
    return dict(answer.json())


def assert_failed_run(process: Any, log: Path, reason: str, answer: httpx.Response | None = None) -> None:
    """The run failed as README "Exit codes" says: exit 1, POST /complete 500 with `completed: false` and the
    reason, the reason in the log on single lines, no traceback."""
    if answer is not None:
        assert answer.status_code == 500 and answer.json()["completed"] is False, answer.text
        assert reason in answer.json()["error"]
    assert process.wait(60) == 1
    text = log.read_text()
    assert "Traceback" not in text
    assert "the report was not written: " in text and reason in text, text
    assert any(line.startswith("Error: ") and reason in line for line in text.splitlines()), text


@pytest.mark.root
def test_a_volume_that_turns_read_only_mid_run_is_not_ready_and_fails_the_run(tmp_path):
    log = tmp_path / "sidecar.log"
    with failing_ext4(tmp_path / "vol") as (volume, fail), SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        process, base = start_sidecar(log, exporter.url, volume / "out")
        try:
            wait_records(base, 4)
            fail()
            assert wait_readyz(base, 503) == {"ready": False, "state": "collecting",
                                              "reason": f"cannot write {volume / 'out'}: Read-only file system"}
            assert_failed_run(process, log, "Read-only file system", httpx.post(base + "/complete", timeout=60))
        finally:
            stop(process)
    assert "gpu_telemetry_export.jsonl" in log.read_text()  # its lines lost: named


@pytest.mark.root
def test_a_read_only_mount_over_the_folder_is_not_ready_until_it_goes_and_a_run_that_lost_nothing_exits_0(
        tmp_path):
    log = tmp_path / "sidecar.log"
    out = tmp_path / "out"
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        process, base = start_sidecar(log, exporter.url, out)
        try:
            wait_records(base, 4)
            for _ in range(2):
                with tmpfs(out, "ro,size=1m"):  # new files in the folder: EROFS (the open ones live on beneath)
                    assert wait_readyz(base, 503)["reason"] == f"cannot write {out}: Read-only file system"
                assert wait_readyz(base, 200) == {"ready": True, "state": "collecting"}  # writable again
            answer = httpx.post(base + "/complete", timeout=60)
            assert answer.status_code == 200 and answer.json()["completed"] is True and "error" not in answer.json()
            assert process.wait(60) == 0
        finally:
            stop(process)
    assert (out / "profile_export_aiperf.json").exists()


@pytest.mark.root
def test_a_full_volume_is_not_ready_and_fails_the_run(tmp_path):
    log = tmp_path / "sidecar.log"
    with tmpfs(tmp_path / "vol", "size=64k") as volume, SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        process, base = start_sidecar(log, exporter.url, volume / "out", DCGM_BRIDGE_FLUSH_INTERVAL="0")
        try:
            wait_records(base, 2)
            with contextlib.suppress(OSError), (volume / "filler").open("wb") as filler:  # until ENOSPC (the
                while True:  # records themselves fill 64 KB in about a second)
                    filler.write(b"\0" * 4096)
                    filler.flush()
            assert wait_readyz(base, 503)["reason"] == f"cannot write {volume / 'out'}: No space left on device"
            assert_failed_run(process, log, "No space left on device", httpx.post(base + "/complete", timeout=60))
        finally:
            stop(process)


@pytest.mark.slow
def test_a_sidecar_out_of_file_descriptors_is_not_ready_and_exits_1(tmp_path):
    log = tmp_path / "sidecar.log"
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        process, base = start_sidecar(log, exporter.url, tmp_path / "out")
        try:
            wait_records(base, 4)
            with httpx.Client() as client:  # one connection, opened before the limit: /readyz still answers
                client.get(base + "/healthz", timeout=5)
                # No new descriptor from now on (a new one takes the lowest free number, which must be below
                # the limit: 0-2 are taken); those open stay usable, this connection's included.
                resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (3, 3))
                deadline = time.monotonic() + 10
                while (answer := client.get(base + "/readyz", timeout=5)).status_code != 503:
                    assert time.monotonic() < deadline, answer.json()
                    time.sleep(0.05)
            assert answer.json()["reason"] == f"cannot write {tmp_path / 'out'}: Too many open files"
            process.send_signal(signal.SIGTERM)
            assert_failed_run(process, log, "Too many open files")
        finally:
            stop(process)


@pytest.mark.root
def test_a_demo_whose_volume_turns_read_only_exits_1_with_the_reason(tmp_path):
    with failing_ext4(tmp_path / "vol") as (volume, fail):
        timer = threading.Timer(1.0, fail)  # mid-run: the demo collects for 2 s
        timer.start()
        result = CliRunner().invoke(main, ["demo", "--out", str(volume / "demo"), "--duration", "2", "--gpus", "1"])
        timer.join()
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert errors and all("Read-only file system" in line for line in errors), result.output


def test_a_file_name_too_long_fails_the_run_and_post_complete_says_why(tmp_path):
    # The report goes where the benchmark wrote its files (`profile -- aiperf`: found at the end of the run); a
    # folder name over NAME_MAX (255 bytes) there is the kernel's ENAMETOOLONG at the last step.
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        session.report_target = ReportTarget(tmp_path / ("d" * 256))
        server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"])
        server.start()
        try:
            scrape(session)
            answer = httpx.post(f"http://127.0.0.1:{server.port}/complete", timeout=60)
        finally:
            server.stop()
    assert answer.status_code == 500
    assert answer.json() == {"completed": False, "files": answer.json()["files"],
                             "error": f"the report was not written: {tmp_path / ('d' * 256)}/"
                                      "profile_export_aiperf.json: File name too long"}
    assert run_exit_code(0, session.outputs) == 1


@pytest.mark.parametrize(("size", "refused"), [(200, False), (201, True), (250, True)])
def test_an_export_prefix_that_would_make_names_too_long_is_refused_at_start_naming_the_flag(size, refused):
    if not refused:
        assert resolve({"profile_export_prefix": "p" * size}, env={}).profile_export_prefix == "p" * size
        return
    with pytest.raises(ConfigError) as caught:
        resolve({"profile_export_prefix": "p" * size}, env={})
    assert str(caught.value) == (f"invalid configuration:\n  --profile-export-prefix: a prefix of {size} bytes "
                                 "makes file names over the 255 bytes a file system allows; use at most 200")
