"""`dcgm-bridge profile -- CMD …`: run any benchmark command with GPU telemetry around it.

The command gets `DCGM_BRIDGE_CONTROL_URL` so it can post phase marks. When it exits, the phases come
from its marks, else from a `phase_manifest.json` below the artifact directory (AIPerf writes one),
else the whole run is reported. AIPerf itself is passed `--no-gpu-telemetry`, so the two do not both
scrape and both write `telemetry_data` (aiperf-compat.md §15).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.config import Config
from bridge.sidecar.finish import run_exit_code

if TYPE_CHECKING:
    from bridge.sidecar.session import Session

logger = logging.getLogger(__name__)


def is_aiperf(command: Sequence[str]) -> bool:
    if not command:
        return False
    program = Path(command[0]).name
    return program == "aiperf" or (program.startswith("python") and list(command[1:3]) == ["-m", "aiperf"])


def with_aiperf_flags(command: Sequence[str]) -> list[str]:
    """AIPerf must not collect GPU telemetry itself (it would scrape too and write telemetry_data)."""
    out = list(command)
    if is_aiperf(out) and "--no-gpu-telemetry" not in out:
        out.append("--no-gpu-telemetry")
    return out


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


def run_profile(config: Config, session: Session | None, command: Sequence[str], *, live: bool = False) -> int:
    """Collect while `command` runs (`session` None: telemetry disabled); returns its exit code."""
    if not command:
        raise ValueError("no command to run: dcgm-bridge profile [options] -- CMD [ARGS…]")
    command = with_aiperf_flags(command)
    if session is None or not config.enabled:
        return run_exit_code(subprocess.call(command), None)

    from bridge.sidecar.control import ControlServer

    session.prepare_artifacts()  # a folder that cannot take the telemetry stops us before the benchmark runs
    if not session.config.phase_manifest:
        # AIPerf writes phase_manifest.json below its artifact directory: look there when no marks came.
        session.config = replace(session.config, phase_manifest=str(Path(config.artifact_dir).resolve()))
    server = ControlServer(session, "127.0.0.1", 0, config.control_allow, metrics_text=session.exposition)
    server.start()
    env = {**os.environ, "DCGM_BRIDGE_CONTROL_URL": f"http://127.0.0.1:{server.port}",
           "DCGM_BRIDGE_RUN_ID": session.run_id}
    view: Any = None
    relay: Any = None
    try:
        session.configure()
        session.start()
        if live or config.telemetry.dashboard:
            from bridge.sidecar.live import LiveView

            conflict = full_screen_conflict(command)
            if conflict is not None:
                logger.warning("%s", conflict)
            else:
                view = LiveView(session)
                view.start()
        # With the live view the benchmark's output goes through it, above the table (live.py).
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE if view else None,
                                   stderr=subprocess.STDOUT if view else None)
        if view is not None and process.stdout is not None:
            relay = view.relay(process.stdout)
        try:
            code = process.wait()
        except KeyboardInterrupt:
            process.send_signal(signal.SIGINT)
            code = process.wait()
    finally:
        if view is not None:
            if relay is not None:
                relay.join(5)  # the benchmark's last lines before the table's last frame
            view.stop()
        session.complete()  # the requests end is the last profiling end mark, or the manifest's
        server.stop()
    return run_exit_code(code, session.outputs)
