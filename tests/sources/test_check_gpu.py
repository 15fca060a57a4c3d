"""scripts/check-gpu.sh --fake: the real-GPU check rehearsed against the fake pynvml passes here."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PERIOD_S = 0.05  # the fake counters' update period in these rehearsals


def _truth(tmp_path: Path, t0: float) -> tuple[dict[str, float], dict[str, float]]:
    """By phase: the energy the fake GPUs really drew (their power curves' closed-form integrals over the phase's
    window, from the curve's zero `t0`), and what their counters' hold may add to our error (each counter shows the
    energy up to one update period old at each edge, so the delta is off by at most that period at the curve's
    highest power, per GPU)."""
    fake = runpy.run_path(str(ROOT / "tests" / "fakes" / "modules" / "pynvml.py"))["FAKE"]
    truth, lag = {}, {}
    for phase in json.loads((tmp_path / "summary.json").read_text())["phases"]:
        a, b = phase["start_ns"] / 1e9 - t0, phase["end_ns"] / 1e9 - t0
        truth[phase["name"]] = sum(g.curve.energy_j(b) - g.curve.energy_j(a) for g in fake.gpus)
        lag[phase["name"]] = sum(PERIOD_S * (max(level[1] for level in g.curve.levels) + g.curve.ripple_w)
                                 for g in fake.gpus)
    return truth, lag


def _rehearsal(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[str, float]:
    """check-gpu.sh --fake with the fake's curve starting at a time this test knows: (its output, that time)."""
    t0 = time.time()
    env = {**(env or os.environ), "DCGM_BRIDGE_FAKE_NVML_ENERGY_PERIOD_S": str(PERIOD_S),
           "DCGM_BRIDGE_FAKE_NVML_T0": str(t0)}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "check-gpu.sh"), *extra, "--fake", "--out", str(tmp_path)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, t0


@pytest.mark.slow
def test_the_fake_rehearsal_measures_the_counter_and_our_energy_is_the_fakes_true_energy(tmp_path: Path) -> None:
    stdout, t0 = _rehearsal(tmp_path, "--phase-s", "4")
    period = re.search(r"update period: ([\d.]+) ms", stdout)
    assert period and abs(float(period.group(1)) - PERIOD_S * 1000) < 5  # the fake's, measured by polling
    rows = json.loads((tmp_path / "summary.json").read_text())["phases"]
    assert [r["name"] for r in rows] == ["idle", "half", "full", "bursty", "quarter", "cool"]
    truth, lag = _truth(tmp_path, t0)
    for row in rows:  # within our stated bound of the truth, plus the counters' hold
        assert abs(row["ours_j"] - truth[row["name"]]) <= row["bound_j"] + lag[row["name"]], (row, truth)
    assert stdout.rstrip().endswith("every phase within our stated bound of NVML's counter: ok")


@pytest.mark.slow
def test_the_rehearsal_runs_without_a_venv_as_on_the_gpu_machines(tmp_path: Path) -> None:
    """`--no-venv`, as the device machines run it: the interpreter as it is (here the project's venv, which
    holds the dependencies), the source tree on PYTHONPATH; then `--analyse` thins the recorded log, and each
    thinned reading is within its bound of the fake's true energy."""
    python = str(Path(sys.executable))
    env = {**os.environ, "PYTHON": python}
    stdout, t0 = _rehearsal(tmp_path, "--no-venv", "--phase-s", "2", env=env)
    assert "probe:" in stdout and (tmp_path / "summary.json").exists()
    analysed = subprocess.run([python, str(ROOT / "scripts" / "check_gpu.py"), "--analyse", str(tmp_path), "--every",
                               "1,3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert analysed.returncode == 0, analysed.stdout + analysed.stderr
    windows = json.loads((tmp_path / "analysis.json").read_text())
    assert len(windows) == 6 * (1 + 3)  # six phases, read every read and every 3rd at each offset
    truth, lag = _truth(tmp_path, t0)
    for w in windows:
        assert abs(w["ours_j"] - truth[w["phase"]]) <= w["bound_j"] + lag[w["phase"]], (w, truth[w["phase"]])
