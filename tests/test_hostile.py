"""Hostile input: mutated and random pages through the parser, normaliser and OTLP encoder (no exception
escapes, every well-formed line survives, the compiled fast paths equal the line loops); a hostile
control-API client; and a whole run configured with credentials, whose files and log lines are scanned."""

from __future__ import annotations

import gzip
import json
import logging
import math
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fields import BLANK_VALUES, default_table
from bridge.normalize import Normalizer
from bridge.otlp import OtlpConfig, OtlpForwarder
from bridge.otlp.encode import ContextCache, EndpointEncoder
from bridge.parse import PageParser, parse_page
from bridge.samples import ParsedPage
from bridge.sidecar.session import Session
from bridge.simulator import Fault, NodeModel, SimulatedExporter, SimulatorConfig, render_page
from tests.conftest import REAL_PAGES
from tests.loopback import LoopbackServer, send
from tests.test_parse import pages as generated_pages

NS = 1_000_000_000
T0 = 1_750_000_000 * NS
TABLE = default_table()


def _simulated(dialect: str, mig: int = 0) -> bytes:
    model = NodeModel(SimulatorConfig(gpus=2, seed=3, dialect=dialect, mig=mig, pod_labels="empty"), now_ns=lambda: T0)
    return render_page(model, T0)


# Every real page, plus simulated ones for what the captured pages lack (MIG, OpenMetrics, 4.9 names).
CORPUS = [p.read_bytes() for p in REAL_PAGES] + [_simulated("current", mig=2), _simulated("openmetrics"),
                                                 _simulated("dcgm49"), _simulated("dcgm410")]

MUTATIONS = ["delete line", "duplicate line", "swap lines", "insert bytes", "truncate", "flip byte", "bad value",
             "crlf", "new value", "new label"]


def mutate(body: bytes, ops: list[tuple[str, int, bytes]]) -> bytes:
    for op, at, junk in ops:
        lines = body.split(b"\n")
        i = at % max(1, len(lines))
        if op == "delete line":
            del lines[i]
        elif op == "duplicate line":
            lines.insert(i, lines[i])
        elif op == "swap lines":
            j = (at // 7) % len(lines)
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "insert bytes":
            pos = at % (len(body) + 1)
            body = body[:pos] + junk + body[pos:]
            continue
        elif op == "truncate":
            body = body[: at % (len(body) + 1)]
            continue
        elif op == "flip byte" and body:
            pos = at % len(body)
            body = body[:pos] + bytes([body[pos] ^ (1 + at % 255)]) + body[pos + 1:]
            continue
        elif op == "bad value":
            lines[i] = lines[i].rpartition(b" ")[0] + b" " + (junk or b"x")
        elif op == "crlf":
            return b"\r\n".join(lines)
        elif op == "new value":  # what the next scrape looks like: same line, another number
            head, sep, _ = lines[i].rpartition(b" ")
            lines[i] = head + sep + str(at % 1000 + 0.5).encode() if sep else lines[i]
        elif op == "new label":
            lines[i] = lines[i].replace(b'gpu="', b'gpu="1', 1)
        body = b"\n".join(lines)
    return body


ops_strategy = st.lists(st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 10**6), st.binary(max_size=12)),
                        max_size=4)


def readings(page: ParsedPage) -> list[tuple[str, dict[str, str], str, int | None]]:
    return [(s.name, dict(s.labels), repr(s.value), s.timestamp_ms) for s in page.samples]


def line_by_line(body: bytes) -> list[tuple[str, dict[str, str], str, int | None]]:
    """What each line gives alone, read the way the page is (OpenMetrics or not, up to `# EOF`)."""
    text = body.decode("utf-8", errors="replace")
    openmetrics = text.startswith("# EOF") or "\n# EOF" in text
    out = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if openmetrics and line.strip() == "# EOF":
            break
        alone = parse_page(line, openmetrics=openmetrics)
        if len(alone.samples) == 1 and not alone.dropped:
            out += readings(alone)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(CORPUS))), ops_strategy)
def test_a_mutated_real_page_raises_nothing_and_keeps_every_well_formed_line(index, ops):
    body = mutate(CORPUS[index], ops)
    page = parse_page(body)
    assert readings(page) == line_by_line(body)
    for record in Normalizer(TABLE).records(page, source_url="http://h:9400/metrics", timestamp_ns=T0):
        for value in record.telemetry_data.values():
            assert math.isfinite(value) and value not in BLANK_VALUES
    ctx = ContextCache().get("run", "phase")
    EndpointEncoder({"service.name": "t"}).encode(page, ctx, T0)


def _normalised(page: ParsedPage, normalizer: Normalizer) -> list[Any]:
    return normalizer.records(page, source_url="http://h:9400/metrics", timestamp_ns=T0, run_id="r", phase="p")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(CORPUS))), st.lists(ops_strategy, min_size=1, max_size=5), st.data())
@pytest.mark.slow
def test_pages_that_repeat_the_last_structure_read_exactly_as_the_line_loop_reads_them(index, variants, data):
    """The parser's template, the normaliser's plans and the encoder's page plans are pure speed: a sequence
    of scrapes (the page, its mutations, the page again) gives what a fresh line-by-line pass gives."""
    original = CORPUS[index]
    sequence = [original] + [mutate(original, ops) for ops in variants] + [original, original]
    sequence += [data.draw(st.sampled_from(sequence)) for _ in range(3)]
    fast_parser, fast_normalizer = PageParser(), Normalizer(TABLE)
    fast_encoder, slow_encoder = EndpointEncoder({"service.name": "t"}), EndpointEncoder({"service.name": "t"})
    slow_encoder.use_plans = False
    contexts = ContextCache()
    for step, body in enumerate(sequence):
        fast = fast_parser.parse(body)
        slow = parse_page(body)
        assert readings(fast) == readings(slow)
        assert (dict(fast.types), dict(fast.helps), fast.dropped) == (dict(slow.types), dict(slow.helps), slow.dropped)
        assert _normalised(fast, fast_normalizer) == _normalised(slow, Normalizer(TABLE))
        ctx = contexts.get("run", "warmup" if step < 4 else "profiling")
        t = T0 + step * NS
        assert fast_encoder.encode(fast, ctx, t) == slow_encoder.encode(slow, ctx, t)


@settings(max_examples=100, deadline=None)
@given(generated_pages(), st.sampled_from(["", 'gpu="0",UUID="GPU-a",', 'gpu="1",GPU_I_ID="2",UUID="GPU-a",']))
def test_random_pages_never_break_the_normaliser(text, gpu_labels):
    text = text.replace("{", "{" + gpu_labels, 1) if gpu_labels else text
    page = parse_page(text.encode())
    for record in Normalizer(TABLE).records(page, source_url="http://h/metrics", timestamp_ns=T0):
        assert all(math.isfinite(v) and v not in BLANK_VALUES for v in record.telemetry_data.values())


# -- the control API ------------------------------------------------------------------------------------
@pytest.fixture
def control(tmp_path):
    from bridge.sidecar.control import ControlServer

    config = Config(telemetry=TelemetryItems(urls=[]), default_endpoints=[], artifact_dir=str(tmp_path), run_id="c")
    session = Session(config, TABLE)
    session.configure()
    server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"])
    server.start()
    yield server
    server.stop()
    session.complete()


def post(path: str, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)


NOW_AT_IMPORT = time.time_ns()
DAY = 86_400 * NS


def mark_body(**fields: Any) -> bytes:
    return json.dumps({"name": "p", "kind": "warmup", "event": "start", "time_ns": NOW_AT_IMPORT, **fields}).encode()


def raw_request(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and b'"}' in chunks[-1]:
                    break
        except TimeoutError:
            pass
    return b"".join(chunks)


@pytest.mark.parametrize(("request_bytes", "status", "message"), [
    (b"POST /phases HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", b"413", b"larger than"),
    (b"POST /phases HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", b"411",
     b"Content-Length"),
    (post("/phases", b"\xff\xfe{"), b"400", b"not valid JSON"),
    (post("/phases", b"null"), b"400", b"JSON object"),
    (post("/phases", b'{"name": "p", "kind": "benchmark", "event": "start", "time_ns": 5}'), b"400",
     b"kind must be one of"),
    (post("/phases", b'{"name": "p", "kind": "warmup", "event": "start", "time_ns": -5}'), b"400", b"time_ns"),
    (post("/phases", b'{"name": ["p"], "kind": "warmup", "event": "start", "time_ns": 5}'), b"400", b"name"),
    (post("/complete", b'{"requests_end_ns": true}'), b"400", b"requests_end_ns"),
    # Item 5 of issue 16: every value checked before anything is applied.
    (post("/phases", mark_body(time_ns=2**64)), b"400", b"more than a day after now"),
    (post("/phases", mark_body(time_ns=2**63)), b"400", b"more than a day after now"),
    (post("/phases", mark_body(time_ns=10**4000)), b"400", b"more than a day after now"),
    (post("/phases", mark_body(time_ns=NOW_AT_IMPORT + 2 * DAY)), b"400", b"more than a day after now"),
    (post("/phases", mark_body(time_ns=10**18 - 1)), b"400", b"looks like a time before 2001"),
    (post("/phases", mark_body(time_ns=1_796_234_392_000)), b"400", b"looks like milliseconds"),
    (post("/phases", mark_body(time_ns=1.7e18)), b"400", b"must be an integer"),
    (post("/phases", mark_body(time_ns="1700000000000000000")), b"400", b"must be an integer"),
    (post("/phases", b'{"name": "p", "kind": "warmup", "event": "start", "time_ns": 1' + b"0" * 5000 + b"}"),
     b"400", b"not usable JSON"),
    (post("/phases", mark_body(name="p" * 65)), b"400", b"not a usable phase name"),
    (post("/phases", mark_body(name="x" * 300)), b"400", b"not a usable phase name"),
    (post("/phases", mark_body(name="../../victim")), b"400", b"not a usable phase name"),
    (post("/phases", mark_body(name="a/b")), b"400", b"not a usable phase name"),
    (post("/phases", mark_body(name="..")), b"400", b"not a usable phase name"),
    (post("/phases", mark_body(name=".hidden")), b"400", b"not a usable phase name"),
    (post("/phases", mark_body(name="warm up")), b"400", b"not a usable phase name"),
    (post("/phases", mark_body(event="end")), b"409", b"was never started"),
    (post("/complete", b'{"requests_end_ns": 18446744073709551616}'), b"400", b"more than a day after now"),
    (post("/complete", b'{"requests_end_ns": 1700000000}'), b"400", b"looks like seconds"),
    (b"PATCH /complete HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", b"405", b"use GET"),
    (b"GET /complete HTTP/1.1\r\nHost: x\r\n\r\n", b"405", b"takes POST"),
    (b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", b"404", b"no such endpoint"),
    (b"GET / HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", b"431", b"Line too long"),
])
def test_a_hostile_control_request_gets_a_4xx_that_says_why_and_the_api_stays_up(control, request_bytes, status,
                                                                                  message):
    answer = raw_request(control.port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 " + status) and message in answer, answer[:300]
    body = answer.partition(b"\r\n\r\n")[2]
    assert b"\n" not in body and list(json.loads(body)) == ["error"]  # one clear line, no traceback
    assert httpx.get(f"http://127.0.0.1:{control.port}/healthz", timeout=5).status_code == 200
    assert control.session.marks == [] and control.session.phase is None and control.session.state == "configured"


def test_a_refused_mark_leaves_no_trace_in_the_records_the_events_or_the_status(tmp_path):
    """Issue 16 item 5: `time_ns` >= 2**64 used to raise inside the handler (no answer) after the records had
    taken the phase and before the events file had it. Marks out of sequence are refused the same way."""
    from bridge.record_log import read_dicts
    from bridge.sidecar.control import ControlServer
    from tests.sidecar.helpers import session_for

    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        session = session_for([exporter.url], tmp_path, collection_interval=0.02)
        session.configure()
        session.start()
        server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"])
        server.start()
        now = time.time_ns()
        sent = [  # (body, expected status): the 2xx ones are the run's only marks
            ({"name": "bad", "kind": "profiling", "event": "start", "time_ns": 2**64}, 400),
            ({"name": "w", "kind": "warmup", "event": "start", "time_ns": now}, 200),
            ({"name": "w", "kind": "warmup", "event": "end", "time_ns": now - 1}, 409),  # before its start
            ({"name": "w", "kind": "profiling", "event": "end", "time_ns": now + 1}, 409),  # another kind
            ({"name": "w", "kind": "warmup", "event": "end", "time_ns": now + 1}, 200),
            ({"name": "w", "kind": "warmup", "event": "end", "time_ns": now + 2}, 409),  # already ended
            ({"name": "w", "kind": "warmup", "event": "start", "time_ns": now + 2}, 409),  # a name starts once
            ({"name": "p1", "kind": "profiling", "event": "start", "time_ns": now + 3}, 200),
            ({"name": "p2", "kind": "profiling", "event": "start", "time_ns": now + 4}, 409),  # p1 is open
            ({"name": "p2", "kind": "profiling", "event": "end", "time_ns": now + 4}, 409),  # never started
            ({"name": "cool", "kind": "cooldown", "event": "start", "time_ns": 2**63 - 1}, 400),
        ]
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
                for body, status in sent:
                    response = client.post("/phases", json=body)
                    assert response.status_code == status, (body, response.text)
                    assert status == 200 or set(response.json()) == {"error"}
                    time.sleep(0.05)  # scrapes in between: a half-applied phase would reach the records
                early = client.post("/complete", json={"requests_end_ns": now + 2})  # before p1's start
                assert early.status_code == 409 and "before the profiling start" in early.json()["error"]
                status_marks = client.get("/status").json()["marks"]
                assert client.post("/phases", json={"name": "p1", "kind": "profiling", "event": "end",
                                                    "time_ns": now + 5}).status_code == 200
                done = client.post("/complete", json={"requests_end_ns": now + 5})
                assert done.status_code == 200 and done.json()["completed"]
                late = client.post("/phases", json={"name": "x", "kind": "warmup", "event": "start",
                                                    "time_ns": time.time_ns()})
                assert late.status_code == 409 and "already complete" in late.json()["error"]
        finally:
            server.stop()
            session.complete()
    accepted = [body for body, status in sent if status == 200]
    assert status_marks == accepted
    in_events = [{k: e[k] for k in ("name", "kind", "event", "time_ns")}
                 for e in read_dicts(session.events.path) if e["type"] == "phase"]
    assert in_events == [m._asdict() for m in session.marks] == [
        *accepted, {"name": "p1", "kind": "profiling", "event": "end", "time_ns": now + 5}]
    phases_in_records = {r.get("phase") for r in read_dicts(session.records.path)}
    assert phases_in_records <= {None, "w", "p1"} and "p1" in phases_in_records


def test_a_sidecar_restarted_inside_its_run_takes_the_end_of_the_phase_its_predecessor_saw_start(tmp_path):
    from bridge.errors import SequenceError
    from tests.sidecar.helpers import session_for

    now = time.time_ns()
    first = session_for([], tmp_path)
    first.configure()
    first.mark_phase("p", "profiling", "start", now)
    first.events.close()  # then killed: no completion
    first.folder_lock.release()  # (the kernel drops a dead process's flock)
    second = session_for([], tmp_path)
    second.configure()
    assert second.disposition == "resume" and second.phase == "p"
    with pytest.raises(SequenceError, match="'p' is still open"):
        second.mark_phase("q", "profiling", "start", now + 1)
    second.mark_phase("p", "profiling", "end", now + 2)
    assert second.phase is None
    from bridge.report.events import load_events

    second.events.close()
    assert [(m.name, m.event) for m in load_events(second.events.path).marks] == [("p", "start"), ("p", "end")]


def test_deeply_nested_json_gets_a_400(control):
    answer = raw_request(control.port, post("/phases", b"[" * 50_000))
    assert answer.startswith(b"HTTP/1.1 400") and b"nested too deeply" in answer


def test_a_client_that_never_finishes_its_body_does_not_stop_the_others(control):
    with socket.create_connection(("127.0.0.1", control.port), timeout=5) as stalled:
        stalled.sendall(b"POST /phases HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"na")
        for _ in range(3):
            assert httpx.get(f"http://127.0.0.1:{control.port}/readyz", timeout=5).status_code == 200


def test_the_control_api_listens_only_on_the_configured_address(control):
    host, port = control.httpd.server_address[:2]
    assert host == "127.0.0.1"
    with pytest.raises(OSError):  # 127.0.0.2 is this machine too, but not where it was told to listen
        socket.create_connection(("127.0.0.2", port), timeout=2).close()


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) with a socket listening on `port`."""
    from pathlib import Path

    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return {row[1].split(":")[0] for row in rows if row[3] == "0A" and int(row[1].split(":")[1], 16) == port}


def test_the_sidecar_command_listens_on_all_addresses_by_default(tmp_path):
    """Inside a pod the kubelet's probes and Prometheus come to the pod IP: the `sidecar` command's default
    (no DCGM_BRIDGE_HEALTH_HOST, no flag) is every address, in a real process."""
    import os
    import re
    import signal
    import subprocess
    import sys

    from tests.conftest import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DCGM_BRIDGE_HEALTH_HOST"}
    env["AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS"] = "[]"
    log = tmp_path / "sidecar.log"
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter, log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "bridge.cli", "sidecar", "--gpu-telemetry", exporter.url,
                                    "--artifact-dir", str(tmp_path / "out"), "--health-port", str(port)],
                                   env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while "control API on port" not in log.read_text() and time.monotonic() < deadline:
                assert process.poll() is None, log.read_text()
                time.sleep(0.05)
            assert re.search(rf"control API on port {port} \(address 0\.0\.0\.0\)", log.read_text())
            assert _listening(port) == {"00000000"}  # INADDR_ANY, not one interface
            # 127.0.0.2 reaches this machine but is no address the process was given: only "all" answers there.
            assert httpx.get(f"http://127.0.0.2:{port}/healthz", timeout=5).json() == {"status": "alive"}
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


PROFILE_CHILD = """
import os, socket, sys, urllib.parse, urllib.request
url = urllib.parse.urlsplit(os.environ["DCGM_BRIDGE_CONTROL_URL"])
assert url.hostname == "127.0.0.1", url
urllib.request.urlopen(f"http://127.0.0.1:{url.port}/healthz", timeout=5).read()
try:
    socket.create_connection(("127.0.0.2", url.port), timeout=2).close()
except OSError:
    sys.exit(0)
sys.exit(3)  # reachable on an address other than loopback's own
"""


def test_profile_listens_on_loopback_only(tmp_path, monkeypatch):
    """`profile` runs on a workstation: its control API is for the benchmark it starts, never the LAN."""
    import sys

    from click.testing import CliRunner

    from bridge.cli import main

    script = tmp_path / "child.py"
    script.write_text(PROFILE_CHILD)
    monkeypatch.delenv("DCGM_BRIDGE_HEALTH_HOST", raising=False)
    monkeypatch.setenv("DCGM_BRIDGE_HEALTH_HOST", "0.0.0.0")  # the sidecar's setting does not widen `profile`
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        monkeypatch.setenv("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS", f"127.0.0.1:{exporter.port}")
        result = CliRunner().invoke(main, ["profile", "--artifact-dir", str(tmp_path / "out"), "--",
                                           sys.executable, str(script)])
    assert result.exit_code == 0, result.output


def test_a_connection_that_sends_nothing_is_closed_after_the_request_deadline(tmp_path):
    from bridge.sidecar.control import REQUEST_DEADLINE_S, ControlServer

    session = Session(Config(telemetry=TelemetryItems(urls=[]), default_endpoints=[], artifact_dir=str(tmp_path),
                             run_id="t"), TABLE)
    default = ControlServer(session, "127.0.0.1", 0, [])
    default.httpd.server_close()
    assert default.httpd.deadline_s == REQUEST_DEADLINE_S == 5
    server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"], request_deadline_s=0.5)
    server.start()
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
    try:
        idle[1].sendall(b"GET /hea")  # half a request line
        idle[2].sendall(b"POST /phases HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")  # half a body
        started = time.monotonic()
        for sock in idle:
            assert sock.recv(65536) == b""  # the server closed it
        assert time.monotonic() - started < 4
        assert httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5).status_code == 200
    finally:
        for sock in idle:
            sock.close()
        server.stop()


def test_sixty_clients_can_wait_to_be_accepted(tmp_path):
    """The listen backlog is 64 (socketserver's default is 5: the 7th connection of a burst waits for a SYN
    retransmit, a second or more, which a probe with a 1 s timeout reports as a failure)."""
    from bridge.sidecar.control import BACKLOG, ControlServer

    session = Session(Config(telemetry=TelemetryItems(urls=[]), default_endpoints=[], artifact_dir=str(tmp_path),
                             run_id="b"), TABLE)
    server = ControlServer(session, "127.0.0.1", 0, [])  # not serving: nothing is accepted
    waiting = []
    try:
        for _ in range(BACKLOG - 4):
            waiting.append(socket.create_connection(("127.0.0.1", server.port), timeout=0.5))
    finally:
        for sock in waiting:
            sock.close()
        server.httpd.server_close()
    assert len(waiting) == BACKLOG - 4 == 60


# -- credentials -------------------------------------------------------------------------------------------
SECRETS = ["s3cret-pw-alice", "t0p-secret-query", "bearer-s3cret-tok", "otlp-pw-s3cret", "otlp-q-s3cret",
           "otlp-hdr-s3cret", "s3ssion-qv4l", "b4re-qv4l", "fr4g-qv4l"]  # the last three under no token-like name


def echo_and_reject(handler: BaseHTTPRequestHandler) -> None:
    """A hostile OTLP receiver: rejects everything with 400 and echoes the request line and headers back."""
    handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    send(handler, f"rejected {handler.requestline} {dict(handler.headers)}".encode(), status=400)


def test_no_credential_reaches_any_file_or_log_line_of_a_run(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with LoopbackServer(echo_and_reject) as receiver, \
            SimulatedExporter(SimulatorConfig(gpus=2, seed=1)) as with_userinfo, \
            SimulatedExporter(SimulatorConfig(gpus=2, seed=2)) as with_token:
        urls = [with_userinfo.url.replace("http://", "http://alice:s3cret-pw-alice@") + "?token=t0p-secret-query",
                with_token.url + "?session=s3ssion-qv4l&b4re-qv4l#fr4g-qv4l"]
        otlp = OtlpConfig(endpoint=f"http://bob:otlp-pw-s3cret@127.0.0.1:{receiver.port}/v1/metrics"
                                   "?apikey=otlp-q-s3cret",
                          headers=(("authorization", "Bearer otlp-hdr-s3cret"),), export_interval_s=0.02,
                          timeout_s=1.0)
        forwarder = OtlpForwarder(otlp, base_resource={"service.name": "t"}, log_interval_s=0.0)
        config = Config(telemetry=TelemetryItems(urls=urls), default_endpoints=[], artifact_dir=str(tmp_path),
                        run_id="creds", bearer_token="bearer-s3cret-tok", collection_interval=0.05,
                        scrape_timeout=0.5, record_log_gzip=True)
        session = Session(config, TABLE, forwarder=forwarder)
        session.configure()
        with_userinfo.add_fault(Fault("http-500", requests=(3, 3)))
        with_token.add_fault(Fault("garbage-line"))
        for _ in range(3):
            for loop in session.loops.values():
                loop.scrape_now()
        forwarder.flush(10.0)
        status = json.dumps(session.status())
        session.complete()
    assert forwarder.stats().rejected_points > 0  # the receiver did echo the credentials back
    assert "session=REDACTED&REDACTED#REDACTED" in status  # the parameter names are kept, every value replaced
    assert (tmp_path / "profile_export_aiperf.json").is_file()  # the report was written, and is scanned
    texts = {"status": status}
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            texts[str(path)] = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", "replace")
    for record in caplog.records:
        if record.name.startswith("bridge.simulator"):
            continue  # the exporter's side logging the requests it received, not the sidecar's output
        key = f"log {record.name}"
        texts[key] = texts.get(key, "") + record.getMessage() + (record.exc_text or "")
    assert any(name.startswith("log bridge.otlp") for name in texts)  # the logged rejections were scanned
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, (secret, where)
