"""Safe on a shared machine (issue 28), the control API: writers authenticate with the run's token (item 5),
and connections are bounded (item 6): a whole-request deadline, a cap that closes the oldest waiting one,
/healthz at the cap, an accept loop that backs off when descriptors run out."""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.errors import ConfigError
from bridge.fields import default_table
from bridge.sidecar.control import ControlServer
from bridge.sidecar.control_token import sidecar_token, token_from_file
from bridge.sidecar.session import Session
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import start_sidecar

NS = 1_000_000_000


def _session(tmp_path: Path) -> Session:
    config = Config(telemetry=TelemetryItems(urls=[]), default_endpoints=[], artifact_dir=str(tmp_path), run_id="c")
    session = Session(config, default_table())
    session.configure()
    return session


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[ControlServer]:
    session = _session(tmp_path)
    server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"], token="the-token")
    server.start()
    yield server
    server.stop()
    session.complete()


# -- 5. the control API authenticates writers --------------------------------------------------------------
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "the-token"},
                                     {"Authorization": "Basic the-token"}])
def test_a_post_without_the_runs_token_is_401_and_changes_nothing(guarded: ControlServer,
                                                                   headers: dict[str, str]) -> None:
    base = f"http://127.0.0.1:{guarded.port}"
    mark = {"name": "p", "kind": "profiling", "event": "start", "time_ns": time.time_ns()}
    for path, body in (("/phases", mark), ("/complete", {})):
        answer = httpx.post(base + path, json=body, headers=headers, timeout=5)
        assert answer.status_code == 401 and answer.headers["WWW-Authenticate"].startswith("Bearer")
        assert "needs Authorization: Bearer <token>" in answer.json()["error"]
    assert guarded.session.state == "configured" and guarded.session.marks == []


def test_a_post_with_the_token_is_accepted_and_reads_stay_open(guarded: ControlServer) -> None:
    base = f"http://127.0.0.1:{guarded.port}"
    mark = {"name": "p", "kind": "profiling", "event": "start", "time_ns": time.time_ns()}
    answer = httpx.post(base + "/phases", json=mark, headers={"Authorization": "Bearer the-token"}, timeout=5)
    assert answer.status_code == 200
    assert httpx.get(base + "/status", timeout=5).json()["marks"][0]["name"] == "p"
    assert httpx.get(base + "/healthz", timeout=5).status_code == 200


def test_protected_reads_need_the_token_but_the_probes_never_do(tmp_path: Path) -> None:
    session = _session(tmp_path)
    server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"], metrics_text=lambda: b"x 1\n", token="t",
                           protect_reads=True)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert [httpx.get(base + p, timeout=5).status_code for p in ("/status", "/metrics")] == [401, 401]
        assert [httpx.get(base + p, timeout=5).status_code for p in ("/healthz", "/readyz")] == [200, 200]
        assert httpx.get(base + "/status", headers={"Authorization": "Bearer t"}, timeout=5).status_code == 200
    finally:
        server.stop()
        session.complete()


def test_the_sidecar_makes_its_token_file_once_and_reads_it_after(tmp_path: Path) -> None:
    path = tmp_path / "control-token"
    made = token_from_file(path)
    assert len(made) >= 40 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token_from_file(path) == made  # a restarted sidecar, or the benchmark, reads the same one
    path.write_text("given\n")
    assert token_from_file(path) == "given"


def test_a_link_planted_as_the_token_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "control-token").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="is not a regular file"):
        token_from_file(tmp_path / "control-token")
    assert not (tmp_path / "elsewhere").exists()


def test_without_a_token_file_the_sidecar_warns_once_and_keeps_the_loopback_rule(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "bridge.sidecar.control"):
        assert sidecar_token(Config()) is None
    (line,) = caplog.messages
    assert "no DCGM_BRIDGE_CONTROL_TOKEN_FILE" in line and "127.0.0.1/8" in line


def test_another_local_client_cannot_end_a_sidecars_run(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    with SimulatedExporter(SimulatorConfig(gpus=1, seed=2)) as exporter:
        process, base = start_sidecar(tmp_path / "log", exporter.url, tmp_path / "out",
                                      DCGM_BRIDGE_CONTROL_TOKEN_FILE=str(token_file))
        try:
            assert httpx.post(base + "/complete", timeout=5).status_code == 401
            assert httpx.get(base + "/readyz", timeout=5).json()["state"] == "collecting"
            token = token_file.read_text().strip()
            done = httpx.post(base + "/complete", headers={"Authorization": f"Bearer {token}"}, timeout=60)
            assert done.status_code == 200 and done.json()["completed"] is True
            assert process.wait(30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


PROFILE_CHILD = """
import os, sys, urllib.error, urllib.request
url = os.environ["DCGM_BRIDGE_CONTROL_URL"] + "/complete"
try:
    urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=5)
    sys.exit(3)  # ended the run without the token
except urllib.error.HTTPError as exc:
    if exc.code != 401:
        sys.exit(4)
token = {"Authorization": "Bearer " + os.environ["DCGM_BRIDGE_CONTROL_TOKEN"]}
status = urllib.request.urlopen(urllib.request.Request(url.replace("/complete", "/status"), headers=token)).read()
sys.exit(0 if b'"state": "collecting"' in status else 5)
"""


def test_profile_hands_only_its_benchmark_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "child.py"
    script.write_text(PROFILE_CHILD)
    monkeypatch.setenv("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS", "[]")
    monkeypatch.delenv("DCGM_BRIDGE_CONTROL_TOKEN", raising=False)
    with SimulatedExporter(SimulatorConfig(gpus=1, seed=3)) as exporter:
        result = CliRunner().invoke(main, ["profile", "--gpu-telemetry", exporter.url, "--artifact-dir",
                                           str(tmp_path / "out"), "--", sys.executable, str(script)])
    assert result.exit_code == 0, result.output
    assert "DCGM_BRIDGE_CONTROL_TOKEN" not in os.environ


# -- 6. bounded connections ---------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _closed(sock: socket.socket, within: float = 5.0) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(65536) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _still_open(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(65536) != b""
    except TimeoutError:
        return True


def test_a_client_trickling_a_byte_at_a_time_is_closed_at_the_whole_request_deadline(tmp_path: Path) -> None:
    session = _session(tmp_path)
    clock = _Clock()
    server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"], monotonic=clock, request_deadline_s=5.0)
    server.start()
    slow = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        for second, byte in enumerate(b"GET /healthz HTTP/1.1\r\n"[:6]):
            slow.sendall(bytes([byte]))  # a byte every "second", each well within any per-read timeout
            clock.now = 1000.0 + 0.8 * second
            server.httpd.wake()
            assert _still_open(slow)
        clock.now = 1005.1  # the request began at 1000: its deadline has passed, though bytes still come
        slow.sendall(b"h")
        server.httpd.wake()
        assert _closed(slow)
        assert httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5).status_code == 200
    finally:
        slow.close()
        server.stop()
        session.complete()


def test_at_the_cap_the_oldest_waiting_connection_makes_room_and_healthz_answers(tmp_path: Path) -> None:
    session = _session(tmp_path)
    clock = _Clock()
    server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"], monotonic=clock, max_connections=4)
    server.start()
    waiting = []
    try:
        for n in range(4):
            clock.now = 1000.0 + n * 0.1
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /sta")  # half a request: held open, waiting
            waiting.append(sock)
            deadline = time.monotonic() + 5
            while len(server.httpd.connections) < n + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        clock.now = 1001.0
        with httpx.Client(timeout=5) as first, httpx.Client(timeout=5) as second:  # each keeps its connection
            assert first.get(f"http://127.0.0.1:{server.port}/healthz").status_code == 200
            assert second.get(f"http://127.0.0.1:{server.port}/readyz").status_code == 200
            assert _closed(waiting[0], 2) and _closed(waiting[1], 2)  # the two oldest made room for the probes
            assert [_still_open(sock) for sock in waiting[2:]] == [True, True]
        assert len(server.httpd.connections) <= 4
    finally:
        for sock in waiting:
            sock.close()
        server.stop()
        session.complete()


_EMFILE_SERVER = """
import resource, sys, time
from pathlib import Path
from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fields import default_table
from bridge.sidecar.control import ControlServer
from bridge.sidecar.session import Session
config = Config(telemetry=TelemetryItems(urls=[]), default_endpoints=[], artifact_dir=sys.argv[1], run_id="e")
session = Session(config, default_table())
server = ControlServer(session, "127.0.0.1", 0, [])
server.start()
import os
used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 4, used + 4))
print(server.port, flush=True)
time.sleep(60)
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_out_of_descriptors_the_accept_loop_backs_off_instead_of_spinning(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", _EMFILE_SERVER, str(tmp_path)], stdout=subprocess.PIPE,
                               text=True)
    clients = []
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        for _ in range(12):  # more than the descriptors left: the rest wait in the backlog, accept fails
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        before = _cpu_seconds(process.pid)
        time.sleep(2.0)
        spent = _cpu_seconds(process.pid) - before
        assert spent < 0.5, f"{spent:.2f} CPU-s in 2 s: the accept loop spins"
        assert process.poll() is None
    finally:
        for sock in clients:
            sock.close()
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.parametrize("legacy", [False, True])
def test_kube_profile_shares_the_token_through_a_memory_volume_only_the_two_containers_mount(legacy: bool) -> None:
    from dataclasses import replace

    from bridge.kube.jobset import CONTROL_PLANE, SIDECAR, build_jobset
    from tests.kube.test_jobset import container, make_spec, pod

    spec = make_spec()
    spec = replace(spec, telemetry=replace(spec.telemetry, legacy_sidecar=legacy))
    jobset = build_jobset(spec)
    (volume,) = [v for v in pod(jobset)["volumes"] if v["name"] == "control-token"]
    assert volume["emptyDir"]["medium"] == "Memory" and "secret" not in volume
    for name in (SIDECAR, CONTROL_PLANE):
        spec_of = container(jobset, name)
        assert spec_of is not None
        assert {"name": "control-token", "mountPath": "/run/dcgm-bridge"} in spec_of["volumeMounts"]
        assert {"name": "DCGM_BRIDGE_CONTROL_TOKEN_FILE", "value": "/run/dcgm-bridge/control-token"} in spec_of["env"]


def test_the_readmes_curl_recipe_posts_a_mark_with_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import shutil

    if shutil.which("curl") is None:
        pytest.skip("no curl on PATH to run the README's recipe with")
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if "Authorization: Bearer" in b]
    monkeypatch.setenv("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS", "[]")
    with SimulatedExporter(SimulatorConfig(gpus=1, seed=4)) as exporter:
        result = CliRunner().invoke(main, ["profile", "--gpu-telemetry", exporter.url, "--artifact-dir",
                                           str(tmp_path / "out"), "--", "sh", "-c", block])
    assert result.exit_code == 0, result.output
    events = (tmp_path / "out" / "gpu_telemetry_events.jsonl").read_text()
    assert '"name":"profiling"' in events and '"event":"start"' in events
