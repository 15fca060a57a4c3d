"""The sidecar's first half over real HTTP on loopback: every dialect and every fault of the simulator,
the scrape loop's tick and boundary rules, the control API, and the `parse` command."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fetch import FetchedPage, FetchError, FetchSettings, make_fetcher
from bridge.fields import default_table
from bridge.lifecycle import Session
from bridge.record_log import read_dicts, read_records
from bridge.scrape import ScrapeLoop
from bridge.simulator import DIALECT_NAMES, Fault, ManualClock, SimulatedExporter, SimulatorConfig
from tests.conftest import REAL_PAGES

NS = 1_000_000_000


def session_for(urls: list[str], tmp_path: Path, **overrides) -> Session:
    settings = {"collection_interval": 0.05, "scrape_timeout": 1.0, "connect_timeout": 0.5, "run_id": "test-run",
                "shutdown_delay": 3.0, **overrides}
    config = Config(telemetry=TelemetryItems(urls=urls), default_endpoints=[], artifact_dir=str(tmp_path),
                    **settings)
    return Session(config, default_table())


def scrape_synchronously(session: Session, times: int) -> None:
    for loop in session.loops.values():
        for _ in range(times):
            loop.scrape_now()


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
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


# -- the loop's rules, with a scripted fetcher and a fake clock ---------------------------------------
class ScriptedFetcher:
    """Each fetch makes the loop's clock jump by `cost` (a slow scrape, without waiting for it)."""

    def __init__(self, offset: list[float], cost: float, stop_after: int, loop_ref: list[ScrapeLoop]):
        self.offset, self.cost, self.stop_after, self.loop_ref = offset, cost, stop_after, loop_ref
        self.calls = 0

    def fetch(self, url: str) -> FetchedPage:
        self.calls += 1
        self.offset[0] += self.cost
        if self.calls >= self.stop_after:
            threading.Thread(target=self.loop_ref[0].stop).start()
        return FetchedPage(b"m 1\n", self.calls, self.calls, "text/plain")

    def close(self) -> None:
        pass


def test_ticks_that_pass_during_a_slow_scrape_are_missed_not_queued():
    offset = [0.0]
    ref: list[ScrapeLoop] = []
    fetcher = ScriptedFetcher(offset, cost=0.35, stop_after=5, loop_ref=ref)  # each scrape spans 3.5 ticks
    loop = ScrapeLoop("http://x/metrics", fetcher, 0.1, lambda u, p: None, lambda u, e, t: None,
                      monotonic=lambda: time.monotonic() + offset[0])
    ref.append(loop)
    loop.start()
    loop.group._thread.join(10)  # type: ignore[union-attr]
    assert fetcher.calls == 5
    # Three ticks pass during each slow scrape (more if the machine is slow): missed, never queued.
    assert loop.stats.missed_ticks >= 5 * 3
    assert loop.stats.scrapes == 5


def test_a_scrape_in_flight_that_started_after_the_boundary_serves_it():
    release = threading.Event()
    started = threading.Event()

    class Blocking:
        def fetch(self, url: str) -> FetchedPage:
            started.set()
            release.wait(5)
            return FetchedPage(b"m 1\n", 0, 0, "text/plain")

        def close(self) -> None:
            pass

    now = [1000]
    loop = ScrapeLoop("http://x/metrics", Blocking(), 60.0, lambda u, p: None, lambda u, e, t: None,
                      now_ns=lambda: now[0])
    loop.start()
    assert started.wait(5)  # the first tick's scrape is in flight, started at t=1000
    boundary = loop.request_boundary(999)
    assert not boundary.done.is_set()
    release.set()
    assert boundary.done.wait(5) and boundary.error is None
    loop.stop(5)
    assert loop.stats.scrapes == 1  # no extra scrape was needed


# -- the one scrape thread, running, over real HTTP ----------------------------------------------------
def wait_until(predicate, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_slow_endpoint_never_holds_up_the_others_on_the_scrape_thread(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1)) as slow, SimulatedExporter(SimulatorConfig(gpus=1)) as ok:
        session = session_for([slow.url, ok.url], tmp_path, collection_interval=0.05, scrape_timeout=5.0)
        session.configure()
        slow.add_fault(Fault("slow", delay_s=1.0))
        session.start()
        slow_loop, ok_loop = session.loops[slow.url], session.loops[ok.url]
        assert len({id(slow_loop.group), id(ok_loop.group)}) == 1  # one thread scrapes both
        wait_until(lambda: ok_loop.stats.scrapes >= 1 + 20, "20 scrapes of the healthy endpoint")
        slow_done = slow_loop.stats.scrapes + sum(slow_loop.stats.failures.values())
        session.complete()  # waits for the slow scrape in flight: its missed ticks are reckoned when it ends
    # 20 healthy scrapes took ~1 s; the slow endpoint finished at most a couple of its 1-second scrapes,
    # and the ticks that came while one was in flight were missed, not queued.
    assert slow_done <= 1 + 3 and slow_loop.stats.missed_ticks >= 5
    records = list(read_records(session.records.path))
    assert sum(r.telemetry_source_url == ok.url for r in records) >= 21


def test_a_phase_mark_between_ticks_scrapes_every_endpoint_at_once(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1)) as first, SimulatedExporter(SimulatorConfig(gpus=1)) as second:
        session = session_for([first.url, second.url], tmp_path, collection_interval=300.0)
        session.configure()  # the baseline scrape
        session.start()  # tick 0; the next tick is 5 minutes away
        loops = list(session.loops.values())
        wait_until(lambda: all(loop.stats.scrapes == 2 for loop in loops), "tick 0 on both endpoints")
        boundaries = [loop.request_boundary(time.time_ns()) for loop in loops]
        assert all(b.done.wait(10) and b.error is None for b in boundaries)
        assert [loop.stats.scrapes for loop in loops] == [3, 3]
        session.complete()


def test_a_phase_mark_after_completion_scrapes_nothing(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        session.start()
        session.complete()
        loop = session.loops[exporter.url]
        scrapes = loop.stats.scrapes
        late = loop.request_boundary(time.time_ns())
    assert late.done.is_set() and late.error == "collection has stopped" and loop.stats.scrapes == scrapes


# -- control API --------------------------------------------------------------------------------------
@pytest.fixture
def control(tmp_path):
    from bridge.control import ControlServer

    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        session.start()
        server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"])
        server.start()
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
            yield session, client
        session.complete()
        server.stop()


def test_probes_status_and_phase_marks_through_the_control_api(control):
    session, client = control
    assert client.get("/healthz").json() == {"status": "alive"}
    assert client.get("/readyz").status_code == 200
    mark = {"name": "profiling", "kind": "profiling", "event": "start", "time_ns": 1_700_000_000_000_000_000}
    response = client.post("/phases", json=mark)
    assert response.status_code == 200 and response.json()["accepted"] == mark
    status = client.get("/status").json()
    assert status["state"] == "collecting" and status["phase"] == "profiling" and status["marks"] == [mark]
    completed = client.post("/complete", json={"requests_end_ns": 1_700_000_001_000_000_000})
    assert completed.status_code == 200 and completed.json()["completed"]
    assert any(f.endswith("profile_export_aiperf.json") for f in completed.json()["files"])


@pytest.mark.parametrize(("method", "path", "body", "status", "message"), [
    ("POST", "/phases", b"{not json", 400, "not valid JSON"),
    ("POST", "/phases", b"[1]", 400, "JSON object"),
    ("POST", "/phases", json.dumps({"name": "x", "kind": "training", "event": "start", "time_ns": 1}).encode(),
     400, "kind must be one of"),
    ("POST", "/phases", json.dumps({"name": "x", "kind": "warmup", "event": "begin", "time_ns": 1}).encode(),
     400, "event must be"),
    ("POST", "/phases", json.dumps({"name": "x", "kind": "warmup", "event": "start"}).encode(), 400, "time_ns"),
    ("POST", "/complete", json.dumps({"requests_end_ns": "soon"}).encode(), 400, "requests_end_ns"),
    ("POST", "/phases", b"x" * (65 * 1024), 413, "larger than"),
    ("GET", "/phases", None, 405, "takes POST"),
    ("POST", "/status", b"{}", 405, "takes GET"),
    ("DELETE", "/status", None, 405, "use GET"),
    ("GET", "/nope", None, 404, "no such endpoint"),
])
def test_bad_control_requests_get_a_4xx_that_says_what_is_wrong(control, method, path, body, status, message):
    _session, client = control
    response = client.request(method, path, content=body)
    assert response.status_code == status and message in response.json()["error"]


def test_posts_from_outside_the_allowed_networks_are_refused(tmp_path):
    from bridge.control import ControlServer

    session = session_for([], tmp_path)
    server = ControlServer(session, "127.0.0.1", 0, ["10.0.0.0/8"])
    server.start()
    try:
        response = httpx.post(f"http://127.0.0.1:{server.port}/complete", json={})
        assert response.status_code == 403 and "DCGM_BRIDGE_CONTROL_ALLOW" in response.json()["error"]
        assert httpx.get(f"http://127.0.0.1:{server.port}/healthz").status_code == 200
    finally:
        server.stop()


# -- parse command ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", REAL_PAGES, ids=lambda p: p.name)
def test_parse_json_shows_samples_dropped_lines_and_gpus(path):
    result = CliRunner().invoke(main, ["parse", str(path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out) == {"samples", "dropped", "gpus"} and out["samples"]
    assert all(set(s) == {"name", "labels", "value", "timestamp_ms"} for s in out["samples"])
    assert len(out["gpus"]) == (2 if "mig" in path.name else 1)


def test_parse_json_keeps_sentinels_and_encodes_non_finite_values(tmp_path):
    page = tmp_path / "p.txt"
    page.write_text('a{gpu="0",UUID="GPU-1"} NaN\nb{gpu="0",UUID="GPU-1"} +Inf\n'
                    'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 9223372036854775794\nbroken line here\n')
    out = json.loads(CliRunner().invoke(main, ["parse", str(page), "--json"]).output)
    assert [s["value"] for s in out["samples"]] == [None, "+Inf", 9.223372036854776e18]
    assert out["dropped"][0]["line"] == 4 and out["gpus"] == []


def test_parse_reads_a_url(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=3)) as exporter:
        result = CliRunner().invoke(main, ["parse", f"127.0.0.1:{exporter.port}"])
    assert result.exit_code == 0 and "3 GPUs" in result.output


def test_parse_of_a_missing_file_says_so():
    result = CliRunner().invoke(main, ["parse", "/nonexistent/page.txt"])
    assert result.exit_code != 0 and "no such file" in result.output


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


def test_the_live_view_shows_every_gpu_with_its_energy_so_far(tmp_path):
    from rich.console import Console

    from bridge.live import live_table

    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=2, mig=1), now_ns=clock) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        clock.advance(10 * NS)
        scrape_synchronously(session, 1)
        console = Console(record=True, width=200)
        console.print(live_table(session))
        session.complete()
    text = console.export_text()
    assert text.count("NVIDIA H100") == 4  # two GPUs and their MIG instances
    assert "mig" in text and " kJ" in text and "phase -" in text


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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
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


def test_report_rebuilds_from_the_logs_and_writes_the_html_page(tmp_path):
    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=2), now_ns=clock) as exporter:
        session = session_for([exporter.url], tmp_path / "run")
        session.configure()
        session.mark_phase("profiling", "profiling", "start", clock())
        scrape_synchronously(session, 3)
        session.mark_phase("profiling", "profiling", "end", clock() + 1)
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


def test_the_sidecar_command_does_not_import_the_simulator_or_the_kube_code():
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from bridge.cli import main; "
            "CliRunner().invoke(main, ['sidecar', '--help']); "
            "heavy = ('bridge.kube', 'bridge.simulator', 'bridge.report'); "
            "print(sorted(m for m in sys.modules if m.startswith(heavy)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert CliRunner().invoke(main, ["kube", "--help"]).exit_code == 0
