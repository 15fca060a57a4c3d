"""The running sidecar holds only the modules its loop needs (issue 48: its fixed RSS is imports and libraries).

`dcgm-bridge sidecar` as a process, scraping a simulated exporter and forwarding over OTLP/HTTP to a real
VictoriaMetrics; once it has recorded and forwarded, the modules it has loaded are read from inside it (a
thread the test starts in it answers when asked) and none may be on the deny-list. Then the run ends as a pod's
does (SIGTERM) and its report is written: what the deny-list keeps out of the loop still loads when needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.conftest import free_port, require_binary
from tests.otlp.conftest import VictoriaMetrics
from tests.sidecar.helpers import stop

# Each a module the scrape / record / forward loop never needs, and why it must not be loaded for it.
DENIED = {
    "_hashlib": "maps Python's OpenSSL beside the one libcurl's wheel bundles (~3.6 MiB RSS); bridge/digest.py",
    "hashlib": "loads _hashlib", "hmac": "loads _hashlib", "secrets": "loads hmac",
    "_ssl": "Python's OpenSSL again, with libssl (~4.7 MiB with ssl): only an https OTLP URL needs it",
    "ssl": "loads _ssl", "http.client": "imports ssl (http.server imports it: control_server.py reads requests itself)",
    "email": "~0.8 MiB; only a Retry-After that carries a date needs email.utils",
    "numpy": "the report's, imported when the report is built (~17 MiB with the builder and writers)",
    "bridge.report.build": "the report builder: at the run's end",
    "bridge.report.write": "the report writers: at the run's end",
    "bridge.report.energy": "the report's energy: at the run's end",
    "encodings.idna": "the IDNA codec for an ASCII host name (socket.getfqdn at bind, getaddrinfo of a str)",
    "unicodedata": "loaded by the IDNA codec",
    "grpc": "OTLP/gRPC's, and this run forwards over OTLP/HTTP",
    "bridge.simulator": "another command's", "bridge.kube": "another command's",
}
NEEDED = ("pycurl", "bridge.scrape", "bridge.otlp.export", "bridge.sidecar.control")  # the answer is real

# Runs the sidecar's own entry; a daemon thread writes sys.modules to ANSWER once ASK exists.
ENTRY = """
import os, runpy, sys, threading, time
ask, answer = sys.argv[1], sys.argv[2]
def answer_when_asked():
    while not os.path.exists(ask):
        time.sleep(0.02)
    with open(answer + ".part", "w") as out:
        out.write("\\n".join(sorted(sys.modules)))
    os.rename(answer + ".part", answer)
threading.Thread(target=answer_when_asked, daemon=True).start()
sys.argv = ["dcgm-bridge", *sys.argv[3:]]
runpy.run_module("bridge.cli", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    server = VictoriaMetrics(require_binary("victoria-metrics"), tmp_path_factory.mktemp("vm") / "data")
    server.start()
    yield server
    server.stop()


def until(check, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.05)


def test_the_running_sidecar_has_loaded_no_module_its_loop_does_not_need(tmp_path: Path, store: VictoriaMetrics):
    ask, answer, out = tmp_path / "ask", tmp_path / "modules", tmp_path / "artifacts"
    port = free_port()
    env = {**os.environ, "AIPERF_GPU_COLLECTION_INTERVAL": "0.05", "DCGM_BRIDGE_HEALTH_HOST": "127.0.0.1",
           "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "AIPERF_GPU_SHUTDOWN_DELAY": "1"}
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=1)) as sim, (tmp_path / "sidecar.log").open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-c", ENTRY, str(ask), str(answer), "sidecar", "--gpu-telemetry", sim.url,
             "--artifact-dir", str(out), "--health-port", str(port), "--otlp-endpoint", store.otlp_url],
            env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            def recorded_and_forwarded() -> bool:
                assert process.poll() is None, (tmp_path / "sidecar.log").read_text()
                try:
                    status = httpx.get(f"http://127.0.0.1:{port}/status", timeout=2).json()
                except httpx.TransportError:
                    return False
                return bool(status["records_written"] >= 6 and status["otlp"]["sent_points"] > 0)

            until(recorded_and_forwarded, "records and OTLP points")
            ask.touch()
            until(answer.exists, "answer from inside the sidecar", 30)
            loaded = set(answer.read_text().split())
            process.send_signal(signal.SIGTERM)  # as the kubelet ends the pod
            assert process.wait(120) == 0, (tmp_path / "sidecar.log").read_text()
        finally:
            stop(process)
    assert set(NEEDED) <= loaded
    present = {name: why for name, why in DENIED.items() if any(m == name or m.startswith(name + ".") for m in loaded)}
    assert not present, f"loaded by the running sidecar: {present}"
    report = json.loads((out / "profile_export_aiperf.json").read_text())
    assert report["telemetry_data"]["summary"]["endpoints_successful"] == [sim.url]
