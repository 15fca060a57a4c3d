"""The local sources on the command line: `profile`'s item, taking AIPerf's over, refusals with one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.kube.profile import ProfileOptions, resolve
from bridge.kube.validate import ValidationError
from bridge.sidecar.aiperf import parse_command

ROOT = Path(__file__).parents[2]
FAKES = ROOT / "tests" / "fakes" / "modules"


def fake_env() -> dict[str, str]:
    """A child process that imports the fakes as pynvml and amdsmi."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKES), str(ROOT)])}


@pytest.mark.parametrize(("item", "extra"), [("pynvml", r"dcgm-bridge\[nvml\]"), ("amdsmi", r"dcgm-bridge\[amd\]")])
def test_a_missing_library_is_one_line_naming_the_extra_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   item: str, extra: str) -> None:
    monkeypatch.setitem(sys.modules, item, None)
    result = CliRunner().invoke(main, ["profile", "--gpu-telemetry", item, "--artifact-dir", str(tmp_path / "out"),
                                       "--", sys.executable, "-c", "print('benchmark ran')"])
    assert result.exit_code == 2, result.output
    assert "benchmark ran" not in result.output and "Traceback" not in result.output
    (line,) = [ln for ln in result.output.splitlines() if item in ln]
    assert f"--gpu-telemetry {item}: the" in line
    assert re.search(extra, line)


@pytest.mark.slow
def test_profile_reads_the_local_gpus_with_the_fake_library(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "profile", "--gpu-telemetry", "pynvml", "--artifact-dir", str(out),
         "--", sys.executable, "-c", "import time; time.sleep(1.5)"],
        env={**fake_env(), "AIPERF_GPU_COLLECTION_INTERVAL": "0.1"}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (out / "gpu_telemetry_export.jsonl").read_text().splitlines()]
    assert {r["telemetry_source_url"] for r in lines} == {"pynvml://localhost"}
    assert len({r["gpu_uuid"] for r in lines}) == 2 and len(lines) >= 10
    assert all(r["telemetry_data"]["nvidia_power_usage"] > 0 for r in lines)


def test_aiperfs_pynvml_item_is_taken_over_like_its_urls() -> None:
    command = parse_command(["aiperf", "profile", "--model", "m", "--gpu-telemetry", "pynvml", "node2:9400",
                             "--url", "localhost:8000"])
    assert command.telemetry_items == ["pynvml", "node2:9400"]
    assert command.argv == ["aiperf", "profile", "--model", "m", "--url", "localhost:8000", "--no-gpu-telemetry"]


def test_kube_profile_refuses_a_local_source_in_one_line() -> None:
    opts = ProfileOptions(model="m", url="frontend:8000", job_id="bench-1", gpu_telemetry=("pynvml",))
    with pytest.raises(ValidationError) as caught:
        resolve(opts, {})
    (problem,) = caught.value.problems
    assert problem.startswith("--gpu-telemetry pynvml: not on Kubernetes (the sidecar container holds no GPU)")
