"""`dcgm-bridge profile -- CMD …`: run any benchmark command with GPU telemetry around it, as a
well-behaved wrapper.

The command gets `DCGM_BRIDGE_CONTROL_URL` and `DCGM_BRIDGE_CONTROL_TOKEN` (a new random one per run, sent
as `Authorization: Bearer`) so it can post phase marks; no other local user can. When it exits, the phases come
from its marks, else (AIPerf) from the files AIPerf wrote, else from a `phase_manifest.json` below the
artifact directory, else the whole run is reported. AIPerf is passed `--no-gpu-telemetry` (its own
telemetry flags become the bridge's: sidecar/aiperf.py), and the report is merged into AIPerf's own
`profile_export_aiperf.json` and `.csv`.

Signals. The command runs in its own process group. On a terminal that group is given the terminal
(job control, as a shell does), so a Ctrl-C reaches the benchmark once, from the terminal, and never the
bridge; Ctrl-Z stops both and `fg` resumes both. Without the terminal (a pipe, CI, a background job),
AIPerf is switched to its simple UI (its dashboard needs the terminal) and a SIGINT or SIGTERM to
`profile` is forwarded once per signal received: to AIPerf's main process as SIGINT (the only signal it
handles: its graceful cancel; its children ignore SIGTERM, aiperf/common/bootstrap.py), to any other
command's group as received. After the first one `profile` waits `stop_timeout` seconds, then kills
the group. The report then covers what the benchmark finished.

Exit code: the benchmark's when non-zero; 128 + N when a signal N stopped it; 128 + the signal when it
was cancelled but exited 0 (AIPerf exits 0 after its graceful cancel); 1 when it succeeded but the
report or the record log could not be written; else 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.config import Config
from bridge.sidecar.aiperf import AiperfCommand, AiperfOutputs, find_outputs, is_aiperf, read_result
from bridge.sidecar.children import MARKER_ENV, end_leftovers, set_subreaper, with_parent_death
from bridge.sidecar.finish import ReportTarget, SessionOutputs
from bridge.sidecar.otlp_watch import OtlpLossWatch

if TYPE_CHECKING:
    from bridge.sidecar.session import Session

__all__ = ["ProfileRun", "is_aiperf", "run_profile", "exit_code"]

logger = logging.getLogger(__name__)
DEFAULT_STOP_TIMEOUT = 60.0
_CHILDREN_GRACE_S = 2.0  # what the benchmark left running gets SIGTERM, then SIGKILL after this


@dataclass
class ProfileRun:
    """What happened: the benchmark's return code, how it ended, and what was written."""

    returncode: int = 0  # Popen's: negative when a signal ended it
    received: int | None = None  # the first signal `profile` received and forwarded
    cancelled: bool = False  # the benchmark says so (AIPerf's was_cancelled), or a signal was forwarded
    killed: bool = False  # the bounded wait ran out
    outputs: SessionOutputs | None = None
    aiperf: AiperfOutputs | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        error = self.outputs.error if self.outputs is not None else None
        return exit_code(self.returncode, self.cancelled, self.received, error)


def exit_code(returncode: int, cancelled: bool, received: int | None, report_error: str | None) -> int:
    """The exit-code table (README): never negative, never 0 for a cancelled run."""
    if returncode < 0:
        return 128 - returncode
    if returncode > 0:
        return returncode
    if cancelled:
        return 128 + (received or signal.SIGINT)
    return 1 if report_error else 0


# AIPerf's dashboard UI is full-screen: it cannot share the terminal with the live table. Piped through the
# view, AIPerf picks its plain UI by itself (docs: "User Interface", automatic TTY detection); only an
# explicit --ui-type dashboard asks for the full screen.
_FULL_SCREEN_HINT = ("--live: AIPerf's dashboard UI (--ui-type dashboard) takes the whole screen and cannot share it "
                     "with the live GPU table, so the table is off; use --ui-type simple (its output then scrolls "
                     "above the table)")


def full_screen_conflict(command: Sequence[str]) -> str | None:
    """Why `--live` cannot share the terminal with `command`, or None when it can."""
    if not is_aiperf(command):
        return None
    args = list(command)
    for position, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith(("--ui-type=", "--ui=")) else \
            args[position + 1] if arg in ("--ui-type", "--ui") and position + 1 < len(args) else None
        if value == "dashboard":
            return _FULL_SCREEN_HINT
    return None


def run_profile(config: Config, session: Session | None, command: Sequence[str] | AiperfCommand, *,
                live: bool = False, stop_timeout: float = DEFAULT_STOP_TIMEOUT,
                env: dict[str, str] | None = None, keep_children: bool = False, idle_window_s: float = 0.0
                ) -> ProfileRun:
    """Collect while the command runs (`session` None: telemetry disabled) and write the report. What the
    command leaves running is stopped at the end (sidecar/children.py) unless `keep_children`. `idle_window_s`:
    quiet stretches of that length kept before and after the command (the report's idle baseline)."""
    aiperf = command if isinstance(command, AiperfCommand) else None
    argv = list(command.argv) if isinstance(command, AiperfCommand) else list(command)
    if not argv:
        raise ValueError("no command to run: dcgm-bridge profile [options] -- CMD [ARGS…]")
    run = ProfileRun()
    terminal = _foreground_terminal()
    live = live or config.telemetry.dashboard
    if aiperf is not None and aiperf.ui is None and sys.stdout.isatty() and (terminal is None or live):
        aiperf = aiperf.with_simple_ui()
        argv = aiperf.argv
        why = "the live view shares the screen" if live else "`profile` cannot hand the terminal over here"
        print(f"dcgm-bridge: AIPerf runs with --ui simple: its full-screen dashboard needs the terminal and {why}",
              file=sys.stderr, flush=True)
    child_env = dict(os.environ if env is None else env)
    started_ns = time.time_ns()
    if session is None or not config.enabled:
        _run_child(argv, child_env, run, terminal, aiperf is not None, stop_timeout, keep_children=keep_children)
        return run

    from bridge.sidecar.control import LOOPBACK, ControlServer
    from bridge.sidecar.control_token import TOKEN_ENV, new_token

    session.prepare_artifacts()  # a folder that cannot take the telemetry stops us before the benchmark runs
    if not session.config.phase_manifest:
        # A benchmark that writes phase_manifest.json below the artifact directory, when no marks came.
        session.config = replace(session.config, phase_manifest=str(Path(config.artifact_dir).resolve()))
    # On a workstation only the benchmark (a child) talks to it: loopback, never the LAN.
    # Loopback is not a user boundary: a per-run token, known to the benchmark only, guards the writes.
    token = new_token()
    server = ControlServer(session, LOOPBACK, 0, config.control_allow, metrics_text=session.exposition, token=token,
                           protect_reads=config.control_protect_reads)
    server.start()
    child_env.update({"DCGM_BRIDGE_CONTROL_URL": f"http://{LOOPBACK}:{server.port}", TOKEN_ENV: token,
                      "DCGM_BRIDGE_RUN_ID": session.run_id})
    view: Any = None
    relay: Any = None
    try:
        session.configure()  # (a failure here leaves nothing behind: there is no run to complete)
    except BaseException:
        server.stop()
        raise
    try:
        session.start()
        if live:
            from bridge.sidecar.live import LiveView

            conflict = full_screen_conflict(argv)
            if conflict is not None:
                logger.warning("%s", conflict)
            else:
                view = LiveView(session)
                view.start()
        # With the live view the benchmark's output goes through it, above the table (live.py).
        watch = OtlpLossWatch()  # an OTLP receiver losing data is said during the run, at most once a minute
        forwarder = session.forwarder
        _idle_window(session, "before", idle_window_s)
        relay = _run_child(argv, child_env, run, terminal, aiperf is not None, stop_timeout, view=view,
                           every_second=(lambda: watch.check(forwarder.stats())) if forwarder else None,
                           keep_children=keep_children)
        if run.received is None:  # (a signal asked us to stop: no more waiting)
            _idle_window(session, "after", idle_window_s)
    finally:
        if view is not None:
            if relay is not None:
                relay.join(5)  # the benchmark's last lines before the table's last frame
            view.stop()
        if aiperf is not None:
            _target_aiperf(session, aiperf, run, started_ns)
        # The requests end: the phases' (AIPerf's files, or the marks). A slow exporter's next refresh is awaited
        # unless a signal asked us to stop.
        run.outputs = session.complete(await_refresh=run.received is None)
        server.stop()
    if aiperf is not None and run.aiperf is None and run.outputs is not None:
        _merge_profile_runs(session, aiperf, run, started_ns)
    return run


def _merge_profile_runs(session: Session, aiperf: AiperfCommand, run: ProfileRun, started_ns: int) -> None:
    """AIPerf's `--num-profile-runs N`: each `profile_runs/run_NNNN/` JSON (and CSV, phase files) gets the telemetry
    of its own window, rebuilt from this run's record log and events as `dcgm-bridge report` builds it (the window
    from the run's phase manifest, else its JSON's start and end), so `dcgm-bridge compare` reads the folder as
    repeats. The bridge's own report over the whole session stays in its folder."""
    from bridge.report.cli import rebuild
    from bridge.report.window import phase_from_document
    from bridge.report.write import ReportWriteError, write_report
    from bridge.sidecar.aiperf import find_profile_runs

    runs = find_profile_runs(aiperf, Path(session.config.artifact_dir), started_ns)
    merged = []
    for outputs in runs:
        result = read_result(outputs)
        phase = phase_from_document(result.document) if outputs.manifest is None and result.document else None
        try:
            # (the session's log holds its one run: built as `report` and `validate` build it, with no --run-id)
            if outputs.manifest is not None:
                built = rebuild(session.records.path, session.events.path, phase_manifest=outputs.manifest,
                                table=session.table)
            elif phase is not None and phase.start_ns is not None and phase.end_ns is not None:
                built = rebuild(session.records.path, session.events.path, start_ns=phase.start_ns,
                                end_ns=phase.end_ns, table=session.table)
            else:
                run.notes.append(f"{outputs.json_path}: no window in AIPerf's files; that run has no telemetry")
                continue
            write_report(built, outputs.directory, aiperf.prefix, json_path=outputs.json_path)
        except (ReportWriteError, OSError, ValueError) as exc:
            run.notes.append(f"{outputs.json_path}: its telemetry could not be merged ({exc})")
            continue
        merged.append(outputs.directory.name)
    if merged:
        run.notes.append(f"AIPerf's profile runs {', '.join(merged)} each got the telemetry of their own window "
                         f"(in {runs[0].directory.parent})")


def _idle_window(session: Session, which: str, seconds: float) -> None:
    """Keep collecting for `seconds` with nothing running, and record the stretch (events file `idle_window`)."""
    if seconds <= 0:
        return
    from bridge.events import IdleWindow

    logger.info("idle window %s the benchmark: %.1f s", which, seconds)
    start = time.time_ns()
    time.sleep(seconds)
    session.record_idle(IdleWindow(which, start, time.time_ns()))


def _target_aiperf(session: Session, aiperf: AiperfCommand, run: ProfileRun, started_ns: int) -> None:
    """Point the report at AIPerf's own files, with the window they describe."""
    outputs = find_outputs(aiperf, [Path(session.config.artifact_dir)], started_ns)
    if outputs is None:
        run.notes.append(f"AIPerf wrote no {aiperf.json_name} in this run: the report goes to "
                         f"{session.artifact_dir}")
        return
    result = read_result(outputs)
    run.aiperf = outputs
    run.cancelled = run.cancelled or result.was_cancelled
    if result.was_cancelled:
        run.notes.append("AIPerf's profiling phase was cancelled: the report covers it up to the cancel")
    session.report_target = ReportTarget(outputs.directory, aiperf.prefix, result.phases or None)


# -- the child -----------------------------------------------------------------------------------------
def _foreground_terminal() -> int | None:
    """stdin's terminal when this process group owns it (so it can hand it to the child), else None."""
    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    except (OSError, ValueError, AttributeError):
        pass
    return None


@contextlib.contextmanager
def _no_sigttou() -> Iterator[None]:
    """tcsetpgrp from a background group raises SIGTTOU (which would stop us): ignored meanwhile."""
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTTOU, previous)


def _give_terminal(fd: int | None, pgrp: int) -> None:
    if fd is None:
        return
    with _no_sigttou(), contextlib.suppress(OSError):
        os.tcsetpgrp(fd, pgrp)


def _run_child(argv: list[str], env: dict[str, str], run: ProfileRun, terminal: int | None, aiperf: bool,
               stop_timeout: float, view: Any = None, every_second: Callable[[], object] | None = None,
               keep_children: bool = False) -> threading.Thread | None:
    """Start the command in its own process group, forward signals once each, wait (bounded once asked
    to stop), record its return code in `run`, and stop what it left running (unless `keep_children`).
    With a live view, the command's output is relayed through it; the relay thread is returned (to be
    joined before the view's last frame)."""
    marker = secrets.token_hex(8)
    env = {**env, MARKER_ENV: marker}
    set_subreaper(True)  # a process that leaves the group with setsid comes to us, not to init
    try:
        process = subprocess.Popen(with_parent_death(argv), env=env, process_group=0,
                                   stdout=subprocess.PIPE if view else None,
                                   stderr=subprocess.STDOUT if view else None)
    except BaseException:
        set_subreaper(False)
        raise
    relay = view.relay(process.stdout) if view is not None and process.stdout is not None else None
    pgid = process.pid
    _give_terminal(terminal, pgid)
    deadline: list[float] = []
    next_second = time.monotonic() + 1.0

    def forward(signum: int, _frame: object) -> None:
        if run.received is None:
            run.received = signum
            run.cancelled = True
            deadline.append(time.monotonic() + stop_timeout)
            logger.warning("signal %d: stopping the benchmark (waiting up to %.0f s for it to finish its files)",
                           signum, stop_timeout)
        with contextlib.suppress(ProcessLookupError):
            if aiperf:  # AIPerf's main process handles SIGINT only; its children ignore both
                os.kill(process.pid, signal.SIGINT)
            else:
                os.killpg(pgid, signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, forward) for sig in handled}
    try:
        while True:
            try:
                pid, status = os.waitpid(process.pid, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:
                status, pid = 0, process.pid
            if pid == process.pid and os.WIFSTOPPED(status):
                _follow_stop(terminal, pgid)
                continue
            if pid == process.pid:
                run.returncode = os.waitstatus_to_exitcode(status)
                process.returncode = run.returncode
                break
            if deadline and time.monotonic() > deadline[0] and not run.killed:
                logger.error("the benchmark did not stop within %.0f s: killing its process group", stop_timeout)
                run.killed = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            if every_second is not None and time.monotonic() >= next_second:
                next_second = time.monotonic() + 1.0
                every_second()
            time.sleep(0.05)
    finally:
        _give_terminal(terminal, os.getpgrp())
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not keep_children:  # the benchmark's own children (AIPerf's services), a daemon it started, …
            left = end_leftovers(pgid, marker, 0.0 if run.received is not None else _CHILDREN_GRACE_S)
            if left:
                logger.warning("the benchmark left %d process(es) running: stopped them (--keep-children keeps them)",
                               left)
        set_subreaper(False)
    return relay


def _follow_stop(terminal: int | None, pgid: int) -> None:
    """Ctrl-Z stopped the benchmark: take the terminal back and stop too; on `fg`, give it back and resume."""
    _give_terminal(terminal, os.getpgrp())
    os.kill(os.getpid(), signal.SIGSTOP)
    _give_terminal(terminal, pgid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)
