"""bench/ab_rebuild.py (issue 29's report-rebuild A/B) keeps working: run against this checkout as its own
baseline on a small log, it times the three sides and prints their medians and ratios."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_rebuild_ab_times_baseline_baseline_with_hash_and_result(tmp_path: Path) -> None:
    log = tmp_path / "gpu_telemetry_export.jsonl"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "ab_rebuild.py"), str(ROOT), "--windows", "1",
                          "--minutes", "2.5", "--gpus", "8", "--log", str(log)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    for side in ("baseline", "baseline+hash", "result"):
        assert re.search(rf"^window 1 {re.escape(side)} +\d+\.\d\d CPU-s", out.stdout, re.M), out.stdout
    assert re.search(r"^result / baseline\+hash \d+\.\d\d .*result / baseline \d+\.\d\d$", out.stdout, re.M)
    assert log.exists()  # a log given is kept for the next sitting
