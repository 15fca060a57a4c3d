"""A sidecar killed inside its run (kill -9: an OOM kill; the kubelet restarts a native sidecar, and `kube
profile` keeps the run id) and started again on the same folder carries the run on: one report over both
processes' records, right against the simulator's ground truth; dead processes' spools are removed
(issue 16, item 1). Real processes, real HTTP on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.conftest import free_port


def _sidecar(url: str, out: Path, log: Path, **env: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    with log.open("ab") as stderr:  # (the child has its own descriptor)
        process = subprocess.Popen([sys.executable, "-m", "bridge.cli", "sidecar", "--gpu-telemetry", url,
                                    "--artifact-dir", str(out), "--health-port", str(port), "--run-id", "job-1"],
                                   stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, **env})
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return process, port
        except OSError:
            pass
        assert time.monotonic() < deadline and process.poll() is None, log.read_text()
        time.sleep(0.1)


def _post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return dict(json.loads(answer.read()))


def test_a_sidecar_killed_and_restarted_inside_its_run_reports_the_whole_run(tmp_path: Path) -> None:
    out, log = tmp_path / "out", tmp_path / "sidecar.log"
    out.mkdir()
    for stale in ("job-1", "an-old-run"):  # spools of processes that died (a killed one's rows, never read again)
        (out / f".dcgm-bridge-spool-{stale}").mkdir()
        (out / f".dcgm-bridge-spool-{stale}" / "0.rows").write_bytes(b"\x00" * 4096)
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=5)) as exporter:
        first, port = _sidecar(exporter.url, out, log)
        start = time.time_ns()
        _post(port, "/phases", {"name": "profiling", "kind": "profiling", "event": "start", "time_ns": start})
        time.sleep(4)
        first.send_signal(signal.SIGKILL)
        first.wait()
        time.sleep(1)  # the kubelet's restart: no scrape meanwhile
        second, port = _sidecar(exporter.url, out, log)
        assert not list(out.glob(".dcgm-bridge-spool-*"))  # the dead spools are gone, and nothing spooled yet
        time.sleep(4)
        end = time.time_ns()
        _post(port, "/phases", {"name": "profiling", "kind": "profiling", "event": "end", "time_ns": end})
        assert _post(port, "/complete", {"requests_end_ns": end})["completed"] is True
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
        truth = sum(exporter.model.energy_joules(gpu, start, end) for gpu in range(2))
    text = log.read_text()
    assert "carries on" in text and text.count("the live report's spool of a process that did not finish") == 2
    report = json.loads((out / "profile_export_aiperf.json").read_text())
    gpus = next(iter(report["telemetry_data"]["endpoints"].values()))["gpus"]
    records = [json.loads(line) for line in (out / "gpu_telemetry_export.jsonl").read_text().splitlines()]
    in_window = [r for r in records if start <= r["timestamp_ns"] <= end and r["gpu_index"] == 0]
    assert gpus["gpu_0"]["metrics"]["nvidia_power_usage"]["count"] == len(in_window)  # both processes' scrapes
    energy = sum(g["metrics"]["nvidia_energy_consumption"]["avg"] for g in gpus.values()) * 1e6
    assert energy == pytest.approx(truth, rel=0.005)  # across the 1 s without a scrape, too
    assert report["nvidia_total_gpu_energy"]["avg"] == pytest.approx(energy)
    assert not list(out.glob(".dcgm-bridge-spool-*"))


def _status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as answer:
        return dict(json.loads(answer.read()))


def test_records_reach_the_log_within_the_flush_interval_while_every_endpoint_is_down(tmp_path: Path) -> None:
    """Issue 16 item 6: no new record comes while every endpoint is down, yet what was buffered reaches the file
    within `flush_interval` (here 4 s), so a kill -9 then loses nothing (it waited for the next record)."""
    out, log = tmp_path / "out", tmp_path / "sidecar.log"
    exporter = SimulatedExporter(SimulatorConfig(gpus=2, seed=6))
    exporter.start()
    try:
        process, port = _sidecar(exporter.url, out, log, DCGM_BRIDGE_FLUSH_INTERVAL="4")
        time.sleep(1.2)
    finally:
        exporter.stop()  # every endpoint down from now on
    try:
        deadline = time.monotonic() + 10
        while _status(port)["endpoints"][0]["state"] != "down":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        written = _status(port)["records_written"]
        time.sleep(4.5)  # the flush interval, and some
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
    lines = (out / "gpu_telemetry_export.jsonl").read_bytes().splitlines()
    assert written > 0 and len(lines) == written
