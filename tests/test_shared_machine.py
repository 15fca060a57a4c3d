"""Safe on a shared machine (issue 28): one owner per artifact folder, no link below it followed, every
promised output writable at start, credentials only where configured, the record-log reader linear."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.errors import ConfigError
from bridge.sidecar.folder_lock import LOCK_FILE, FolderLock
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import scrape_synchronously, session_for

_HOLD = """
import sys, time
from pathlib import Path
from bridge.sidecar.folder_lock import FolderLock
lock = FolderLock(Path(sys.argv[1]), sys.argv[2], use_flock=sys.argv[3] == "flock")
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def exporter() -> Iterator[SimulatedExporter]:
    with SimulatedExporter(SimulatorConfig(gpus=1, seed=1)) as sim:
        yield sim


def _holder(folder: Path, run_id: str, kind: str = "flock") -> subprocess.Popen[str]:
    """Another process (another run) holding the folder's lock."""
    process = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder), run_id, kind], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout is not None and process.stdout.readline() == "held\n"
    return process


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    if process.stdout is not None:
        process.stdout.close()


# -- 1. two runs, one folder ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["flock", "lock-file"])
def test_a_second_run_refuses_a_folder_a_live_run_holds_and_names_it(tmp_path: Path, kind: str) -> None:
    holder = _holder(tmp_path, "run-a", kind)
    try:
        with pytest.raises(ConfigError) as refused:
            FolderLock(tmp_path, "run-b", use_flock=kind == "flock").acquire()
        assert f"--artifact-dir {tmp_path} is in use by run run-a (pid {holder.pid})" in str(refused.value)
    finally:
        _kill(holder)


def test_a_second_session_leaves_the_first_runs_live_files_where_they_are(
        exporter: SimulatedExporter, tmp_path: Path) -> None:
    first = session_for([exporter.url], tmp_path, run_id="run-a")
    first.configure()
    scrape_synchronously(first, 2)
    second = session_for([exporter.url], tmp_path, run_id="run-b")
    with pytest.raises(ConfigError, match=r"is in use by run run-a \(pid \d+\)"):
        second.configure()
    assert not (tmp_path / "run-a").exists()
    outputs = first.complete()
    assert outputs.error is None
    assert '"run_id":"run-b"' not in (tmp_path / "gpu_telemetry_export.jsonl").read_text()
    third = session_for([exporter.url], tmp_path, run_id="run-c")  # the folder is free again after complete
    third.configure()
    assert (tmp_path / "run-a" / "gpu_telemetry_export.jsonl").exists()
    third.complete()


@pytest.mark.parametrize("kind", ["flock", "lock-file"])
def test_a_dead_holders_lock_is_taken_over_with_one_line(tmp_path: Path, kind: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    holder = _holder(tmp_path, "run-a", kind)
    _kill(holder)
    lock = FolderLock(tmp_path, "run-b", use_flock=kind == "flock")
    with caplog.at_level(logging.WARNING, "bridge.sidecar.folder_lock"):
        lock.acquire()
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path}: run run-a (pid {holder.pid}) ended without releasing the folder's lock; run run-b takes it over"]
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


@pytest.mark.parametrize("kind", ["flock", "lock-file"])
def test_a_restarted_sidecar_of_the_same_run_takes_its_lock_back(tmp_path: Path, kind: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    holder = _holder(tmp_path, "run-a", kind)
    _kill(holder)
    with caplog.at_level(logging.WARNING, "bridge.sidecar.folder_lock"):
        FolderLock(tmp_path, "run-a", use_flock=kind == "flock").acquire()
    assert "run run-a restarted; it takes back the folder's lock" in caplog.text


def test_a_lock_file_of_another_hosts_process_is_not_taken_over(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text('{"pid": 1, "run_id": "run-a", "host": "elsewhere"}\n')
    with pytest.raises(ConfigError, match="in use by run run-a \\(pid 1 on elsewhere\\)"):
        FolderLock(tmp_path, "run-b", use_flock=False).acquire()


def test_profile_into_a_held_folder_exits_2_before_the_benchmark_runs(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "run-a")
    try:
        marker = tmp_path / "benchmark-ran"
        result = subprocess.run(
            [sys.executable, "-m", "bridge.cli", "profile", "--artifact-dir", str(tmp_path), "--run-id", "run-b",
             "--gpu-telemetry", "http://127.0.0.1:9/metrics", "--", "touch", str(marker)],
            env={**os.environ, "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]"}, capture_output=True, text=True,
            timeout=60)
    finally:
        _kill(holder)
    assert result.returncode == 2, result.stderr
    assert f"is in use by run run-a (pid {holder.pid})" in result.stderr
    assert "Traceback" not in result.stderr and not marker.exists()
