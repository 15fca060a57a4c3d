"""Whole `profile` runs as a user makes them, for what issue 33 found around them (item 7)."""

from __future__ import annotations

from pathlib import Path

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
