"""Issue 29's report-rebuild figure in one sitting: a baseline checkout against this one, windows alternated.

    .venv/bin/python bench/ab_rebuild.py BASELINE_CHECKOUT [--windows 5] [--log PATH] [--minutes 60] [--gpus 64]

Three sides, each in a fresh process as bench_report's child (`report --jsonl` over the 1-hour, 64-GPU log of
bench_report; CPU-s of the command, imports before the clock), alternated window by window:

- `baseline`: the checkout given (issue 29's baseline is c70bab1; build its kernel first: `make -C DIR venv`);
- `baseline+hash`: the same, its reader also feeding every byte it reads to SHA-256 — the hash of the record log
  that issue 27 made the report store (for `dcgm-bridge validate`), which c70bab1 predates;
- `result`: this checkout.

`result / baseline+hash` is what issue 29's own changes cost; `result / baseline` adds issue 27's hash. Not part
of `make bench` (it needs a second checkout).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_report  # noqa: E402
from _procs import ROOT  # noqa: E402

# Run before bench_report's child on the `baseline+hash` side: the baseline's raw reader (c70bab1's
# `bridge.record_log._raw_chunks(path)`) wrapped so that every chunk also goes through SHA-256, as the result's
# reader does (`line_batches(..., digest)`).
WITH_HASH = """
import hashlib
import bridge.record_log as _log
_read = _log._raw_chunks
def _hashed(path, *rest):
    digest = hashlib.sha256()
    for chunk in _read(path, *rest):
        digest.update(chunk)
        yield chunk
_log._raw_chunks = _hashed
"""


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("baseline", type=Path, help="a checkout of the baseline commit, its kernel built")
    args.add_argument("--windows", type=int, default=5)
    args.add_argument("--minutes", type=float, default=60.0, help="of the generated log (bench_report's 60)")
    args.add_argument("--gpus", type=int, default=64)
    args.add_argument("--log", type=Path, help="a log bench_report generated (kept; made in a temporary folder "
                                               "and removed at the end when not given)")
    opts = args.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ab-rebuild-"))
    log = opts.log or work / "gpu_telemetry_export.jsonl"
    window_file = log.with_name(log.name + ".window")
    if not log.exists() or not window_file.exists():
        _, start, end = bench_report.generate(log, opts.minutes, opts.gpus)
        window_file.write_text(f"{start} {end}\n")
    start, end = (int(x) for x in window_file.read_text().split())
    sides = {"baseline": (opts.baseline.resolve(), ""), "baseline+hash": (opts.baseline.resolve(), WITH_HASH),
             "result": (ROOT, "")}
    got: dict[str, list[float]] = {side: [] for side in sides}
    try:
        for window in range(opts.windows):
            for side, (root, prelude) in sides.items():
                timed = bench_report.child("rebuild", log, start, end, work / "out", root=root, prelude=prelude)
                cpu_s = timed["cpu_s"]
                got[side].append(cpu_s)
                print(f"window {window + 1} {side:14} {cpu_s:5.2f} CPU-s (load {os.getloadavg()[0]:.2f})",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # (the log too, unless --log put it elsewhere)
    medians = {side: statistics.median(values) for side, values in got.items()}
    print("medians: " + ", ".join(f"{side} {m:.2f}" for side, m in medians.items()))
    print(f"result / baseline+hash {medians['result'] / medians['baseline+hash']:.2f} (issue 29's changes; "
          f"target <= 1.10);  result / baseline {medians['result'] / medians['baseline']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
