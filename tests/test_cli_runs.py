"""Whole `profile` runs as a user makes them, for what issue 33 found around them (item 7)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.report.html import page_run_id
from bridge.simulator import SimulatedExporter, SimulatorConfig

QUIET = {"AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "AIPERF_GPU_COLLECTION_INTERVAL": "0.2",
         "DCGM_BRIDGE_HEALTH_PORT": "0"}


def test_an_archived_runs_html_page_moves_with_its_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        for run_id in ("first", "second"):
            result = CliRunner().invoke(main, ["profile", "--gpu-telemetry", exporter.url, "--artifact-dir",
                                               str(out), "--run-id", run_id, "--html", str(out / "report.html"),
                                               "--", "sleep", "0.5"], env=QUIET)
            assert result.exit_code == 0, result.output
    assert page_run_id((out / "first" / "report.html").read_bytes()[:2048]) == "first"
    assert page_run_id((out / "report.html").read_bytes()[:2048]) == "second"


def _piped_profile(tmp_path: Path, columns: str | None) -> str:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | QUIET
    if columns is not None:
        env["COLUMNS"] = columns
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        result = subprocess.run([sys.executable, "-m", "bridge.cli", "profile", "--gpu-telemetry", exporter.url,
                                 "--artifact-dir", str(tmp_path / (columns or "pipe")), "--", "sleep", "0.5"],
                                capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
def test_piped_profile_prints_the_80_column_layout_unless_columns_says_otherwise(tmp_path: Path) -> None:
    piped = _piped_profile(tmp_path, None)
    tables = piped.split("Files:", 1)[0]  # (the file paths after it are never cut)
    assert max(map(len, tables.splitlines())) <= 80 and "┏" not in piped and "GPU Power Usage (W)" in piped
    wide = _piped_profile(tmp_path, "140")
    assert "┏" in wide and "NVIDIA GPU Power Usage (W)" in wide


def test_the_files_list_names_only_files_that_were_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["profile", "--gpu-telemetry", "127.0.0.1:1", "--artifact-dir", str(out),
                                       "--", "true"], env={**QUIET, "DCGM_BRIDGE_CONNECT_TIMEOUT": "0.3"})
    assert result.exit_code == 0, result.output
    listed = [Path(line.strip()) for line in result.output.split("Files:", 1)[1].splitlines() if line.strip()]
    listed = [p for p in listed if p.is_absolute() or str(p).startswith(str(out))]
    assert listed and all(p.exists() for p in listed), listed
    assert not (out / "gpu_telemetry_export.jsonl").exists()  # no exporter answered: no record was written
