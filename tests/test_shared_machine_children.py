"""Safe on a shared machine (issue 28 item 10): the benchmark's processes end with the run. What it leaves in
its group, or starts with setsid, is stopped when `profile` ends (`--keep-children` keeps it); a `profile`
killed with SIGKILL takes the benchmark with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux's")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _profile(tmp_path: Path, script: str, *extra: str) -> int:
    """`profile --no-gpu-telemetry … -- sh -c SCRIPT`: the pid the script wrote to `pid`."""
    result = CliRunner().invoke(main, ["profile", "--no-gpu-telemetry", *extra, "--", "sh", "-c", script])
    assert result.exit_code == 0, result.output
    return int((tmp_path / "pid").read_text())


@pytest.mark.parametrize("how", ["in its group", "with setsid"])
def test_what_the_benchmark_leaves_running_is_stopped_at_the_end(tmp_path: Path, how: str) -> None:
    start = "sleep 60" if how == "in its group" else "setsid sleep 60"
    pid = _profile(tmp_path, f"{start} & echo $! > {tmp_path}/pid; exit 0")
    try:
        assert _gone_within(pid, 5)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_keep_children_leaves_them_running(tmp_path: Path) -> None:
    pid = _profile(tmp_path, f"sleep 60 & echo $! > {tmp_path}/pid; exit 0", "--keep-children")
    try:
        assert _alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
        with __import__("contextlib").suppress(ChildProcessError):
            os.waitpid(pid, 0)


def test_a_profile_killed_with_sigkill_takes_the_benchmark_with_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "profile", "--artifact-dir", str(tmp_path / "out"),
         "--gpu-telemetry", "http://127.0.0.1:9/metrics", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"],
        env={**os.environ, "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        benchmark = int(pidfile.read_text())
        assert _alive(benchmark)
        wrapper.send_signal(signal.SIGKILL)
        wrapper.wait(10)
        assert _gone_within(benchmark, 5)
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
