"""The README is tested: every `dcgm-bridge …` line of its code blocks (and of the guides it links, in
docs/) runs, and `make demo` works.

Each command runs as the user would type it, in a scratch folder, in the README's order (the `report`
line reads what the `sidecar` line wrote). Only what cannot exist here is swapped: the example hosts
become simulated exporters on loopback, the benchmark becomes `python -c pass`, the demo runs 2 s, and
Kubernetes commands get `--dry-run`. A subcommand that goes missing or a flag that changes fails here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from bridge.simulator import SimulatorConfig
from tests.ahead import waited
from tests.conftest import free_port, simulated_exporter_process, wait_until

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The user's pages: the README and the guides it links (their command lines are tested the same way).
PAGES = [README, ROOT / "docs" / "kubernetes.md"]
BIN = Path(sys.executable).parent
# The required flags a `kube profile … --gpu-telemetry k8s://…` line leaves out (the "…").
KUBE_PROFILE_REQUIRED = ["--model", "m", "--url", "frontend:8000", "--sidecar-image", "registry.example.com/b:1"]
LONG_RUNNING = {"sidecar", "simulate"}
# The README's sidecar runs until each endpoint has been scraped this often (at AIPERF_GPU_COLLECTION_INTERVAL's
# 0.1 s): what `validate`, the line after the `report` that reads it, needs to find the measurement valid.
SIDECAR_SCRAPES = 40


def readme_commands(text: str) -> list[list[str]]:
    """Every `dcgm-bridge` command line in a fenced code block, continuations joined, comments dropped."""
    commands = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("dcgm-bridge "):
                commands.append(shlex.split(line, comments=True))
    return commands


def test_the_readme_shows_every_everyday_command() -> None:
    commands = [c for page in PAGES for c in readme_commands(page.read_text("utf-8"))]
    shown = {" ".join(c[1:3]) if c[1] == "kube" else c[1] for c in commands}
    assert {"parse", "sidecar", "report", "profile", "simulate", "demo", "kube profile"} <= shown


def test_the_extractor_joins_continuations_and_drops_comments() -> None:
    text = "x\n```sh\ndcgm-bridge a \\\n   --b c   # why\nkubectl get x\n```\n`dcgm-bridge inline` \n"
    assert readme_commands(text) == [["dcgm-bridge", "a", "--b", "c"]]


class Exporters:
    """The README's example hosts, each a simulated exporter in its own process (node1, node2), or a closed port
    (OTLP)."""

    def __init__(self, stack: ExitStack) -> None:
        self.addresses = [stack.enter_context(simulated_exporter_process(SimulatorConfig(gpus=2, seed=i)))
                          for i in range(2)]
        self.closed = free_port()

    def adapt(self, argv: list[str]) -> list[str]:
        host = {f"node{i + 1}": address for i, address in enumerate(self.addresses)}
        out = []
        for arg in argv:
            arg = re.sub(r"\bnode([12]):9400", lambda m: host[f"node{m.group(1)}"], arg)
            arg = re.sub(r"(victoria:8428|otel-collector:4317)", f"127.0.0.1:{self.closed}", arg)
            out.append(arg)
        command = out[1]
        if command == "profile":
            out = [*out[: out.index("--") + 1], sys.executable, "-c", "pass"]
        elif command == "demo":
            out[out.index("--duration") + 1] = "2"
        elif command == "simulate":
            out[out.index("--port") + 1] = str(free_port())
        elif command == "kube" and out[2] in ("profile", "estimate"):
            if "…" in out:
                i = out.index("…")
                out[i: i + 1] = KUBE_PROFILE_REQUIRED
            out = [a for a in out if a != "--wait"] + ["--dry-run"] * (out[2] == "profile")
        return [str(BIN / "dcgm-bridge"), *out[1:]]


def _env() -> dict[str, str]:
    # No default endpoints (another test's simulator may listen on :9400), an ephemeral control port
    # (8086 may be taken), quick scrapes and a short shutdown.
    # `pynvml` and `amdsmi` are the fakes (tests/fakes/modules): no GPU here.
    return {**os.environ, "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "DCGM_BRIDGE_HEALTH_PORT": "0",
            "AIPERF_GPU_COLLECTION_INTERVAL": "0.1", "AIPERF_GPU_SHUTDOWN_DELAY": "2", "COLUMNS": "80",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "fakes" / "modules"), str(ROOT)])}


def _run_until_ready(argv: list[str], cwd: Path, ready: str, log: Path) -> subprocess.CompletedProcess[str]:
    """Start a long-running command, wait for `ready` in its output, then SIGTERM it (how it is stopped)."""
    with log.open("w") as sink:
        process = subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=sink, stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: ready in log.read_text() or process.poll() is not None, 30.0, f"{ready!r} in {log}")
        if process.poll() is None and argv[1] == "sidecar":
            port = re.search(r"control API on port (\d+)", log.read_text())
            assert port, log.read_text()
            _wait_ready(int(port.group(1)), process)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
    return subprocess.CompletedProcess(argv, process.returncode, log.read_text(), "")


def _status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as response:
        status: dict[str, Any] = json.loads(response.read())
    return status


def _wait_ready(port: int, process: subprocess.Popen[str]) -> None:
    """Until the sidecar is ready and every endpoint has been scraped SIDECAR_SCRAPES times (a run `validate`
    judges valid: a window of a few scrapes is too short to hold its coverage and its counter-power check), or
    fail with its last answer; a sidecar that exits meanwhile ends the wait (the caller reports it)."""

    def scraped() -> bool:
        if process.poll() is not None:
            return True
        endpoints = _status(port)["endpoints"]
        return bool(endpoints) and all(e["scrapes"] >= SIDECAR_SCRAPES for e in endpoints)

    wait_until(scraped, 60.0, f"the sidecar on port {port} to scrape every endpoint {SIDECAR_SCRAPES} times",
               ignore=(OSError, ValueError))


def _readme_ran(tmp_path: Path) -> list[str]:
    """Every command line of the pages, in their order, in `tmp_path`: how each that failed failed."""
    failures = []
    lines = [line for page in PAGES for line in readme_commands(page.read_text("utf-8"))]
    with ExitStack() as stack:
        exporters = Exporters(stack)
        for number, line in enumerate(lines):
            argv = exporters.adapt(line)
            if argv[1] in LONG_RUNNING:
                ready = "control API on port" if argv[1] == "sidecar" else "simulated dcgm-exporter"
                result = _run_until_ready(argv, tmp_path, ready, tmp_path / f"command-{number}.log")
            else:
                result = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
            output = result.stdout + result.stderr
            refused = result.returncode == 2 and "--dry-run cannot expand" in output
            if refused and any(a.startswith("k8s://") for a in argv):
                continue  # a k8s:// item needs a cluster to expand (none here): --dry-run refuses in one line
            if result.returncode != 0 or "Traceback" in output:
                failures.append(f"{shlex.join(line)}\n  ran as {shlex.join(argv[1:])}\n  exit {result.returncode}: "
                                f"{output.strip()[-600:]}")
    return failures


def _make_demo(tmp_path: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`make demo` as the README's first command, short: the target's command, without its install step (the venv
    running these tests is the one it would install into)."""
    venv = Path(sys.prefix)
    out = tmp_path / "demo"
    argv = ["make", "-s", "-C", str(ROOT), "-o", f"{venv}/.runtime", "demo", f"VENV={venv}", f"DEMO_OUT={out}",
            "DEMO_DURATION=2"]
    return out, subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env())


# The commands' sidecars, demos and profiles wait on real seconds (~27 s, a few CPU-s): started ahead
# (tests/ahead.py), they run beside the rest of the suite.
WAITS_AHEAD = {"test_every_command_line_in_the_readme_runs": [_readme_ran],
               "test_make_demo_prints_the_report_and_the_file_list": [_make_demo]}


@pytest.mark.slow
def test_every_command_line_in_the_readme_runs(tmp_path_factory: pytest.TempPathFactory) -> None:
    failures = waited(_readme_ran, tmp_path_factory).result()
    assert not failures, "README commands that fail:\n" + "\n".join(failures)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.slow
def test_make_demo_prints_the_report_and_the_file_list(tmp_path_factory: pytest.TempPathFactory) -> None:
    out, result = waited(_make_demo, tmp_path_factory).result()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Energy" in result.stdout and f"Artifacts in {out}" in result.stdout.replace("\n", "")
    for name in ("gpu_telemetry_export.jsonl", "profile_export_aiperf.json", "gpu_telemetry.html"):
        assert (out / name).exists()
