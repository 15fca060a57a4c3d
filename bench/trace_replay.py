"""A raw GPU trace replayed as each source would have served it (tests/report/trace_replay.py, issue 47): per source
and refresh and window length, how many windows at random edges the stated uncertainty and the bound cover against
the counter reference, how many are valid, the median uncertainty over the median error, and the median errors
against both references. The table goes to bench/RESULTS.md's "A real GPU" section.

    .venv/bin/python bench/trace_replay.py                      the H200's 73 ms log (tests/data/h200_check_gpu/73ms)
    .venv/bin/python bench/trace_replay.py CORPUS_DIR [--gpu 0]  a `scripts/check-gpu.sh --record` corpus
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.report.trace_replay import (  # noqa: E402
    LENGTHS_S,
    SOURCES,
    from_corpus,
    from_record_log,
    judge,
    power_reference,
    summarise,
    table,
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("corpus", nargs="?")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--windows", type=int, default=10, help="per source and window length")
    args = parser.parse_args()
    if args.corpus:
        trace = from_corpus(Path(args.corpus), args.gpu)
    else:
        trace = from_record_log(ROOT / "tests" / "data" / "h200_check_gpu" / "73ms" / "gpu_telemetry_export.jsonl.gz",
                                "h200-73ms")
    lengths = [n for n in LENGTHS_S if n + 4 < trace.span_s]
    print(f"{trace.name}: {len(trace.reads)} reads over {trace.span_s:.1f} s; windows of {lengths} s, "
          f"{args.windows} each at random edges (seed 47), AIPerf's grace")
    print(table(summarise(judge(trace, SOURCES, lengths, args.windows)), power_reference(trace)[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
