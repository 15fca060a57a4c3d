"""scripts/check-gpu.sh --fake: the real-GPU check rehearsed against the fake pynvml passes here."""

from __future__ import annotations

import os
import re
import subprocess
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
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[:1] in (["idle"], ["half"], ["full"])]
    assert [r[0] for r in rows] == ["idle", "half", "full"]
    for row in rows:
        ours, bound, nvml, length = float(row[2]), float(row[3]), float(row[4]), float(row[1])
        # within our stated bound, plus the counter's lag at the edges (two 50 ms periods of the mean power)
        assert abs(ours - nvml) <= bound + 2 * 0.05 * nvml / length
    assert result.stdout.rstrip().endswith("every phase within our stated bound of NVML's counter: ok")
