"""The CPU-seconds the JobSet's probe and grace-period sizing assume, measured on the real sidecar.

Under a CFS limit of L cores, C CPU-seconds take C / L wall seconds (25m: 1 CPU-second = 40 s), so
start-up and shutdown are budgeted in CPU time (bridge/kube/jobset.py). This runs `dcgm-bridge
sidecar` against a loopback exporter serving a real page and reads its CPU time from /proc at the
first 200 from /readyz, and from wait4() after SIGTERM (final scrape, report, merge).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.kube.jobset import SIDECAR_SHUTDOWN_CPU_SECONDS, SIDECAR_START_CPU_SECONDS
from tests.conftest import free_port
from tests.loopback import LoopbackServer, send

PAGE = Path(__file__).parents[1] / "data" / "k8s-ai-conformance_kops_l4.txt"
DEADLINE_S = 60.0


@pytest.fixture
def exporter() -> Iterator[str]:
    body = PAGE.read_bytes()
    with LoopbackServer(lambda h: send(h, body, content_type="text/plain; version=0.0.4")) as server:
        yield server.url


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except OSError:
        return 0, b""


def test_the_sidecar_reaches_readyz_and_shuts_down_within_its_cpu_budgets(
        exporter: str, tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    port = free_port()
    log = tmp_path / "sidecar.log"
    env = {**os.environ, "DCGM_BRIDGE_HEALTH_HOST": "127.0.0.1", "AIPERF_GPU_COLLECTION_INTERVAL": "0.05",
           "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": exporter}
    with log.open("wb") as err:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-c", "from bridge.cli import main; main()", "sidecar", "--health-port", str(port),
             "--artifact-dir", str(tmp_path / "out"), "--gpu-telemetry", exporter, "--run-id", "budget"],
            env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while get(f"http://127.0.0.1:{port}/readyz")[0] != 200:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.02)
        to_ready = cpu_seconds(proc.pid)
        while json.loads(get(f"http://127.0.0.1:{port}/status")[1] or b"{}").get("records_written", 0) < 5:
            assert time.monotonic() < deadline, "no records"
            time.sleep(0.02)
        before = cpu_seconds(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    shutdown = usage.ru_utime + usage.ru_stime - before
    record_property("cpu_seconds_to_readyz", round(to_ready, 3))
    record_property("cpu_seconds_shutdown", round(shutdown, 3))
    print(f"sidecar CPU-seconds: {to_ready:.2f} to /readyz, {shutdown:.2f} for the final scrape/report/merge")
    assert proc.returncode == 0
    assert (tmp_path / "out" / "profile_export_aiperf.json").exists()
    assert to_ready <= SIDECAR_START_CPU_SECONDS
    assert shutdown <= SIDECAR_SHUTDOWN_CPU_SECONDS
