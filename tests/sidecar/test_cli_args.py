"""`--gpu-telemetry A B C` on every command (issue 12 item 2): the list ends at the next option or `--`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.endpoints import expand_telemetry_args

QUIET = {"AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "AIPERF_GPU_SHUTDOWN_DELAY": "1",
         "AIPERF_GPU_REACHABILITY_TIMEOUT": "1", "DCGM_BRIDGE_CONNECT_TIMEOUT": "0.2"}


def test_the_items_end_at_the_next_option_and_what_follows_the_double_dash_is_left_alone() -> None:
    args = ["--gpu-telemetry", "a", "b,c", "--artifact-dir", "d", "--", "cmd", "--gpu-telemetry", "x", "y"]
    assert expand_telemetry_args(args) == ["--gpu-telemetry", "a", "--gpu-telemetry", "b,c", "--artifact-dir", "d",
                                           "--", "cmd", "--gpu-telemetry", "x", "y"]


@pytest.mark.parametrize("command", [["sidecar"], ["profile"]])
def test_a_mistyped_flag_after_the_items_is_an_error_that_names_it(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--gpu-telemetry", "h1:9400", "h2:9400", "--artfact-dir", "d",
                                       "--", "true"], env=QUIET)
    assert result.exit_code == 2
    assert "No such option '--artfact-dir'. Did you mean '--artifact-dir'?" in result.output


def test_profile_with_several_items_runs_the_command_after_the_double_dash_into_the_artifact_dir(
        tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [
        "profile", "--gpu-telemetry", "127.0.0.1:1", "127.0.0.1:2", "--artifact-dir", str(out), "--",
        sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"], env=QUIET)
    assert result.exit_code == 0, result.output
    assert marker.exists()
    events = (out / "gpu_telemetry_events.jsonl").read_text()
    assert "http://127.0.0.1:1/metrics" in events and "http://127.0.0.1:2/metrics" in events
