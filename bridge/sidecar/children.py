"""The benchmark's processes end with the run (`profile`).

- The benchmark is started through a tiny exec helper (`with_parent_death`) that asks the kernel for
  SIGKILL when `profile` dies (prctl PR_SET_PDEATHSIG) and then execs the command: a `profile` killed
  with SIGKILL (the OOM killer, kill -9) takes the benchmark with it. The helper is a separate program
  because the setting must be made in the child between fork and exec, and `preexec_fn` is unsafe in a
  threaded process (the scrape and export threads run by then).
- `profile` is a child subreaper (prctl PR_SET_CHILD_SUBREAPER) while the benchmark runs, so a process
  that left the benchmark's group with setsid is re-parented to `profile` rather than to init; every
  process of the run carries the run's marker variable, by which `profile` finds those it adopted.
- At the end of the run, `end_leftovers` stops what is left: the benchmark's process group and the
  adopted processes carrying the marker; SIGTERM, then SIGKILL after a grace period (`--keep-children`
  opts out).

Linux only (/proc, prctl); elsewhere the helper is not used and only the process group is stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)

MARKER_ENV = "DCGM_BRIDGE_PROFILE_ID"  # set on the benchmark: every process of the run inherits it
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# The helper: argv = [python, -I, -S, -c, this, parent pid, CMD, ARGS...]. -I -S: no site, no PYTHON* variables.
_EXEC_HELPER = """
import ctypes, os, sys
ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
if os.getppid() != int(sys.argv[1]):
    sys.exit(137)  # profile died before the setting took: as if killed with it
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    print(f"dcgm-bridge: cannot run {sys.argv[2]!r}: {exc.strerror}", file=sys.stderr)
    sys.exit(127)
"""


def linux() -> bool:
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self")


def with_parent_death(argv: list[str]) -> list[str]:
    """`argv` run through the exec helper (unchanged off Linux)."""
    if not linux():
        return argv
    return [sys.executable, "-I", "-S", "-c", _EXEC_HELPER, str(os.getpid()), *argv]


def set_subreaper(on: bool) -> None:
    if not linux():
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def end_leftovers(pgid: int, marker: str, grace_s: float, *, monotonic: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> int:
    """Stop the processes of the run still alive: the benchmark's group `pgid` and this process's children
    carrying `MARKER_ENV=marker`. SIGTERM, then SIGKILL after `grace_s`; the ones re-parented here are reaped.
    Returns how many there were."""
    found = _leftovers(pgid, marker)
    if not found:
        return 0
    count = len(found)
    _signal_all(pgid, found, signal.SIGTERM)
    deadline = monotonic() + grace_s
    while found and monotonic() < deadline:
        sleep(0.02)
        found = _leftovers(pgid, marker) & found
    if found:
        _signal_all(pgid, found, signal.SIGKILL)
        deadline = monotonic() + 2.0
        while _leftovers(pgid, marker) & found and monotonic() < deadline:
            sleep(0.01)
    return count


def _leftovers(pgid: int, marker: str) -> set[int]:
    """Live (not zombie) processes of group `pgid`, and this process's children with the marker; zombies
    that are this process's children are reaped on the way."""
    if not linux():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return set()
        return {-pgid}
    me, out = os.getpid(), set()
    for pid, state, ppid, group in _processes():
        if ppid == me and state == "Z" and (group == pgid or _has_marker(pid, marker)):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            continue
        if state == "Z":
            continue
        if group == pgid or (ppid == me and _has_marker(pid, marker)):
            out.add(pid)
    return out


def _processes() -> Iterable[tuple[int, str, int, int]]:
    """(pid, state, parent pid, process group) of every process visible in /proc."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        yield int(name), fields[0].decode(), int(fields[1]), int(fields[2])


def _has_marker(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARKER_ENV}={marker}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _signal_all(pgid: int, pids: set[int], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
    for pid in pids:
        if pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
