"""The H200's 73 ms reads (tests/data/h200_check_gpu/73ms) served as dcgm-exporter at `-c R` would have served them
(tests/report/h200_replay.py), each phase's energy against NVML's own counter delta: per refresh, how many phase
windows the stated uncertainty and the bound cover, how many are valid, and the median uncertainty over the median
error. The table goes to bench/RESULTS.md's "A real GPU" section.

    .venv/bin/python bench/h200_replay.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bridge.record_log import read_records  # noqa: E402
from tests.report.h200_replay import replay  # noqa: E402

DATA = ROOT / "tests" / "data" / "h200_check_gpu" / "73ms"


def main() -> int:
    summary = json.loads((DATA / "summary.json").read_text())
    reads = list(read_records(DATA / "gpu_telemetry_export.jsonl.gz"))
    print("| `-c` (refresh) | phase windows | covered by `uncertainty` | by `bound` | valid | median uncertainty / "
          "median error |")
    print("| --- | --- | --- | --- | --- | --- |")
    for refresh_s in (0.1, 0.25, 0.5, 1, 2):
        rows = [r for offset in range(8) for r in replay(reads, summary["phases"], refresh_s, offset)]
        covered = sum(r.error_j <= r.uncertainty_j + r.allowance_j for r in rows)
        bounded = sum(r.error_j <= r.bound_j + r.allowance_j for r in rows)
        ratio = (statistics.median(r.uncertainty_j for r in rows)
                 / statistics.median(max(r.error_j, 1e-5 * r.truth_j) for r in rows))
        print(f"| {round(refresh_s * 1000)} ms | {len(rows)} | {covered} | {bounded} | {sum(r.valid for r in rows)} "
              f"| {ratio:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
