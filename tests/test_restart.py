"""A sidecar killed inside its run (kill -9: an OOM kill; the kubelet restarts a native sidecar, and `kube
profile` keeps the run id) and started again on the same folder carries the run on: one report over both
processes' records, right against the simulator's ground truth; dead processes' spools are removed
(issue 16, item 1). Real processes, real HTTP on loopback."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from bridge.simulator import SimulatedExporter, SimulatorConfig
from bridge.simulator.model import NodeModel
from tests.ahead import waited
from tests.conftest import simulated_exporter_process
from tests.sidecar.helpers import start_sidecar, stop


def _post(base: str, path: str, body: dict) -> dict:
    return dict(httpx.post(base + path, json=body, timeout=60).json())


CONFIG = SimulatorConfig(gpus=2, seed=5)


def _killed_and_restarted(tmp_path: Path) -> tuple[Path, list[str], int, int]:
    """A run whose sidecar is killed after ~4 s and restarted on the same folder for ~4 s more, against a simulated
    exporter in its own process: (the folder, both sidecars' logs, the profiling window's start and end)."""
    out, logs = tmp_path / "out", (tmp_path / "first.log", tmp_path / "second.log")
    out.mkdir()
    for stale in ("job-1", "an-old-run"):  # spools of processes that died (a killed one's rows, never read again)
        (out / f".dcgm-bridge-spool-{stale}").mkdir()
        (out / f".dcgm-bridge-spool-{stale}" / "0.rows").write_bytes(b"\x00" * 4096)
    processes: list[subprocess.Popen[bytes]] = []
    with simulated_exporter_process(CONFIG) as address:
        try:
            first, base = start_sidecar(logs[0], address, out, "--run-id", "job-1")
            processes.append(first)
            start = time.time_ns()
            _post(base, "/phases", {"name": "profiling", "kind": "profiling", "event": "start", "time_ns": start})
            time.sleep(4)
            deadline = time.monotonic() + 20  # (rows reach the spool a few seconds' worth at a time)
            while not any(out.glob(".dcgm-bridge-spool-job-1-*/*.rows")) and time.monotonic() < deadline:
                time.sleep(0.1)
            first.send_signal(signal.SIGKILL)
            first.wait()
            time.sleep(1)  # the kubelet's restart: no scrape meanwhile
            second, base = start_sidecar(logs[1], address, out, "--run-id", "job-1")
            processes.append(second)
            assert not list(out.glob(".dcgm-bridge-spool-*"))  # the dead spools are gone, and nothing spooled yet
            time.sleep(4)
            end = time.time_ns()
            _post(base, "/phases", {"name": "profiling", "kind": "profiling", "event": "end", "time_ns": end})
            assert _post(base, "/complete", {"requests_end_ns": end})["completed"] is True
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
        finally:
            for process in processes:  # (left running only where an assertion above failed)
                stop(process)
    return out, [log.read_text() for log in logs], start, end


# ~10 s of real seconds (two sidecars' runs), a few CPU-s: started ahead (tests/ahead.py)
WAITS_AHEAD = {"test_a_sidecar_killed_and_restarted_inside_its_run_reports_the_whole_run": [_killed_and_restarted]}


@pytest.mark.slow
def test_a_sidecar_killed_and_restarted_inside_its_run_reports_the_whole_run(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    out, (first_log, second_log), start, end = waited(_killed_and_restarted, tmp_path_factory).result()
    model = NodeModel(CONFIG)  # the served GPUs' physics
    truth = sum(model.energy_joules(gpu, start, end) for gpu in range(2))
    removed = "the live report's spool of a process that did not finish"
    assert first_log.count(removed) == 2  # the two left before the run
    # The killed process had spooled rows (waited for above): the restarted one removed that spool too.
    assert "carries on" in second_log and second_log.count(removed) == 1 and ".dcgm-bridge-spool-job-1" in second_log
    report = json.loads((out / "profile_export_aiperf.json").read_text())
    gpus = next(iter(report["telemetry_data"]["endpoints"].values()))["gpus"]
    records = [json.loads(line) for line in (out / "gpu_telemetry_export.jsonl").read_text().splitlines()]
    in_window = [r for r in records if start <= r["timestamp_ns"] <= end and r["gpu_index"] == 0]
    assert gpus["gpu_0"]["metrics"]["nvidia_power_usage"]["count"] == len(in_window)  # both processes' scrapes
    energy = sum(g["metrics"]["nvidia_energy_consumption"]["avg"] for g in gpus.values()) * 1e6
    assert energy == pytest.approx(truth, rel=0.005)  # across the 1 s without a scrape, too
    assert report["nvidia_total_gpu_energy"]["avg"] == pytest.approx(energy)
    assert not list(out.glob(".dcgm-bridge-spool-*"))


def _status(base: str) -> dict:
    return dict(httpx.get(base + "/status", timeout=5).json())


@pytest.mark.slow
def test_records_reach_the_log_within_the_flush_interval_while_every_endpoint_is_down(tmp_path: Path) -> None:
    """Issue 16 item 6: no new record comes while every endpoint is down, yet what was buffered reaches the file
    within `flush_interval` (here 4 s), so a kill -9 then loses nothing (it waited for the next record)."""
    out = tmp_path / "out"
    exporter = SimulatedExporter(SimulatorConfig(gpus=2, seed=6))
    exporter.start()
    try:
        process, base = start_sidecar(tmp_path / "sidecar.log", exporter.url, out, DCGM_BRIDGE_FLUSH_INTERVAL="4")
        time.sleep(1.2)
    finally:
        exporter.stop()  # every endpoint down from now on
    try:
        deadline = time.monotonic() + 10
        while _status(base)["endpoints"][0]["state"] != "down":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        written = _status(base)["records_written"]
        log = out / "gpu_telemetry_export.jsonl"
        deadline = time.monotonic() + 4.5  # the flush interval, and some
        while not (log.exists() and log.read_bytes().count(b"\n") >= written) and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        stop(process)
    lines = (out / "gpu_telemetry_export.jsonl").read_bytes().splitlines()
    assert written > 0 and len(lines) == written


@pytest.mark.slow
def test_a_sigterm_as_a_completed_sidecar_exits_leaves_it_exiting_0(tmp_path: Path) -> None:
    """The kubelet sends SIGTERM as the pod ends, which may be while a sidecar that completed on POST /complete
    is exiting: once the interpreter has dropped its Python handler, the default action ended a finished run
    with -15. Signals are sent until the process is gone, so one lands in every stage of its exit."""
    out = tmp_path / "out"
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=7)) as exporter:
        process, base = start_sidecar(tmp_path / "sidecar.log", exporter.url, out)
        try:
            time.sleep(1)
            assert _post(base, "/complete", {})["completed"] is True
            while process.poll() is None:
                process.send_signal(signal.SIGTERM)
                time.sleep(0.002)
            code = process.wait(30)
        finally:
            stop(process)
    assert code == 0, (tmp_path / "sidecar.log").read_text()[-2000:]
    assert (out / "profile_export_aiperf.json").exists()
