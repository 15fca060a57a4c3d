"""Shared set-up for the sidecar tests: a session on loopback with short timeouts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fields import default_table
from bridge.sidecar.session import Session
from tests.conftest import free_port

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


def resumed_report(url: str, folder: Path, run_id: str) -> dict:
    """A sidecar of run `run_id` restarted in `folder` (its predecessor killed): two scrapes of `url`, complete;
    the report it wrote."""
    import json

    session = session_for([url], folder, run_id=run_id)
    session.configure()
    scrape_synchronously(session, 2)
    outputs = session.complete()
    assert session.disposition == "resume" and outputs.error is None
    return dict(json.loads((folder / "profile_export_aiperf.json").read_text()))



def start_sidecar(log: Path, url: str, artifact_dir: Path, *extra: str, preexec_fn: Callable[[], None] | None = None,
                  **env_extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """`dcgm-bridge sidecar` as a process scraping `url` every 0.05 s (its stderr in `log`), once /readyz is 200:
    the process and its control API's base URL."""
    port = free_port()
    env = {**os.environ, "AIPERF_GPU_COLLECTION_INTERVAL": "0.05", "DCGM_BRIDGE_HEALTH_HOST": "127.0.0.1",
           **env_extra}
    with log.open("wb") as err:  # the child holds its own descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "bridge.cli", "sidecar", "--gpu-telemetry", url, "--artifact-dir",
             str(artifact_dir), "--health-port", str(port), *extra],
            env=env, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=preexec_fn)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                return process, base
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.05)
    stop(process)
    pytest.fail(f"sidecar not ready: {log.read_text()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kill a process the test left running (after a failed assertion)."""
    if process.poll() is None:
        process.kill()
        process.wait()


def wait_records(base: str, count: int, timeout_s: float = 30) -> None:
    """Until the sidecar behind `base` has written `count` records (bounded)."""
    deadline = time.monotonic() + timeout_s
    while httpx.get(base + "/status", timeout=5).json()["records_written"] < count:
        assert time.monotonic() < deadline, "no records"
        time.sleep(0.05)
