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
    try:
        session.configure()
        session.start()
        if live or config.telemetry.dashboard:
            from bridge.sidecar.live import LiveView

            view = LiveView(session)
            view.start()
        process = subprocess.Popen(command, env=env)
        try:
            code = process.wait()
        except KeyboardInterrupt:
            process.send_signal(signal.SIGINT)
            code = process.wait()
    finally:
        if view is not None:
            view.stop()
        session.complete()  # the requests end is the last profiling end mark, or the manifest's
        server.stop()
    return run_exit_code(code, session.outputs)
