"""scripts/check-gpu.sh --fake: the real-GPU check rehearsed against the fake pynvml passes here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_the_fake_rehearsal_measures_the_counter_and_agrees_with_nvml_per_phase(tmp_path: Path) -> None:
    env = {**os.environ, "DCGM_BRIDGE_FAKE_NVML_ENERGY_PERIOD_S": "0.05"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "check-gpu.sh"), "--fake", "--phase-s", "4", "--out",
                             str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    period = re.search(r"update period: ([\d.]+) ms", result.stdout)
    assert period and abs(float(period.group(1)) - 50) < 5  # the fake's 50 ms, measured by polling
    phases = ["idle", "half", "full", "bursty", "quarter", "cool"]
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[:1] and line.split()[0] in phases]
    assert [r[0] for r in rows] == phases
    for row in rows:
        ours, bound, nvml, length = float(row[2]), float(row[4]), float(row[5]), float(row[1])
        # within our stated bound, plus the counter's lag at the edges (two 50 ms periods of the mean power)
        assert abs(ours - nvml) <= bound + 2 * 0.05 * nvml / length
    assert result.stdout.rstrip().endswith("every phase within our stated bound of NVML's counter: ok")


@pytest.mark.slow
def test_the_rehearsal_runs_without_a_venv_as_on_the_gpu_machines(tmp_path: Path) -> None:
    """`--no-venv`, as the device machines run it: the interpreter as it is (here the project's venv, which
    holds the dependencies), the source tree on PYTHONPATH; then `--analyse` thins the recorded log."""
    python = str(Path(sys.executable))
    env = {**os.environ, "PYTHON": python, "DCGM_BRIDGE_FAKE_NVML_ENERGY_PERIOD_S": "0.05"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "check-gpu.sh"), "--no-venv", "--fake", "--phase-s", "2",
                             "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "probe:" in result.stdout and (tmp_path / "summary.json").exists()
    analysed = subprocess.run([python, str(ROOT / "scripts" / "check_gpu.py"), "--analyse", str(tmp_path), "--every",
                               "1,3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert analysed.returncode == 0, analysed.stdout + analysed.stderr
    windows = json.loads((tmp_path / "analysis.json").read_text())
    assert len(windows) == 6 * (1 + 3)  # six phases, read every read and every 3rd at each offset
    assert all(w["bound_covered"] for w in windows)
