"""Issue 42, a case found in session 25: scrapes every multiple of a counter held 100 ms (README's `--interval 0.1`;
0.5 or 1 s likewise), with the reads' latency drifting (a loaded machine: each value read up to tens of ms after
its scrape's timestamp).

Readings at one phase of the hold all show about the same age, so their deviations show no hold; where that phase
wraps between the edges (one scrape sees two updates, or none) the edges lie a whole update apart. The runs are
tests/report/aliased.py's (a smooth power, the simulator's H200 sensors, half the seeds on a drifting update grid,
75 scrapes, a window of 35-45 of them, the latency ramping from 0 to L, L uniform in 0-`--latency-ms`). Prints how
many windows were valid and covered by their uncertainty, valid and not covered, and NOT valid (by reason), and the
counter's own error against its stated uncertainty. A measurement, not a test: nothing here is asserted.

    .venv/bin/python bench/aliased_hold.py [--runs 200] [--interval 0.1] [--latency-ms 40] [--local]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.report.aliased import AliasedSpec, judge_aliased  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.1, help="the scrape interval (s)")
    parser.add_argument("--latency-ms", type=float, default=40.0, help="the latency ramp's largest end (0: none)")
    parser.add_argument("--local", action="store_true", help="read by the local NVML reader, not an exporter")
    parser.add_argument("--first-seed", type=int, default=1000, help="(tests/report/test_aliased_scrapes.py: 0-39)")
    args = parser.parse_args()
    results = [judge_aliased(AliasedSpec(args.interval, seed, args.latency_ms, args.local))
               for seed in range(args.first_seed, args.first_seed + args.runs)]
    valid = [r for r in results if r.valid]
    reasons = Counter(reason for r in results if not r.valid for reason in r.reasons)
    print(f"{args.runs} windows: {sum(r.error <= r.uncertainty for r in valid)} valid and covered, "
          f"{sum(r.error > r.uncertainty for r in valid)} valid and NOT covered, {args.runs - len(valid)} NOT valid "
          f"{dict(reasons)}")
    ratios = sorted(r.counter_error / max(r.counter_uncertainty, 1e-9) for r in results)
    outside = [r for r in results if r.counter_error > r.counter_uncertainty]
    print(f"the counter's own error over its stated uncertainty: median {ratios[len(ratios) // 2]:.2f}, "
          f"q95 {ratios[int(0.95 * len(ratios))]:.2f}, max {ratios[-1]:.2f}; outside it in {len(outside)} windows, "
          f"of them {sum(r.valid for r in outside)} valid, errors up to "
          f"{max((r.counter_error for r in outside), default=0):.1f} J")


if __name__ == "__main__":
    main()
