"""Issue 42, a case found in session 25: scrapes every 100 ms of a counter held 100 ms, with the scrape's latency
drifting (a loaded machine: the exporter serves each value up to tens of ms after the scrape's timestamp).

Readings 100 ms apart against a 100 ms hold all see nearly one phase of it, and a latency that drifts across the
window moves the two edges' ages apart without any reading's neighbours showing it. Each run: a smooth power (a
level of 150-650 W, a slow swing of 2-20 W), a 1 s average gauge, the counter held on a fixed 100 ms grid (mJ),
~40 scrapes over a 3.5-4.5 s window, the latency ramping from 0 to L (L uniform in 0-40 ms, `--latency-ms`) with
±2 ms of jitter. Prints how many windows were valid and covered by their uncertainty, valid and not covered, and
NOT valid (by reason), and the counter's own error against its stated uncertainty. A measurement, not a test:
nothing here is asserted.

    .venv/bin/python bench/aliased_hold.py [--runs 200] [--latency-ms 40]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bridge.report import build_report  # noqa: E402
from bridge.report.window import explicit_window  # noqa: E402
from tests.report.helpers import MS, URL, S, recs  # noqa: E402

HOLD = 100 * MS  # the H200's counter update period (bench/RESULTS.md "A real GPU")
GRACE = 666 * MS
START = 1_800_000_000 * S


def one_run(seed: int, latency_ms: float = 40.0) -> tuple[bool, bool, tuple[str, ...], float, float]:
    """(valid, covered, reasons, the counter's error over its stated uncertainty, the error in J)."""
    rng = random.Random(f"aliased-hold:{seed}")
    level, swing, period = rng.uniform(150, 650), rng.uniform(2, 20), rng.uniform(20, 60)
    phase, grid = rng.uniform(0, 2 * math.pi), rng.randrange(0, HOLD)

    def energy_j(t_ns: int) -> float:  # the truth since START: ∫ level + swing·sin(2πt/period + phase)
        t = (t_ns - START) / S
        return 1e6 + level * t - swing * period / (2 * math.pi) * (math.sin(2 * math.pi * t / period + phase)
                                                                  - math.sin(phase))

    latency_end = rng.uniform(0, latency_ms) * MS
    first = START + 2 * S + rng.randrange(0, HOLD)
    scrapes = [first + k * HOLD + rng.randrange(-2 * MS, 2 * MS) for k in range(75)]
    served = [t + round(latency_end * k / len(scrapes)) + rng.randrange(0, 2 * MS) for k, t in enumerate(scrapes)]
    counter = [math.floor(1000 * energy_j(s - (s - grid) % HOLD)) * 1e-9 for s in served]  # held, in MJ
    gauge = [round(energy_j(s) - energy_j(s - S), 3) for s in served]  # the trailing second's average, W
    start = scrapes[20] + rng.randrange(0, HOLD)
    end = start + round(rng.uniform(3.5, 4.5) * S)
    built = build_report(recs(scrapes, counter, gauge, url=URL), window=explicit_window(start, end, GRACE))
    energy = built.energy
    assert energy.total_energy_j is not None and energy.uncertainty_j is not None
    (gpu,) = energy.gpus
    truth = energy_j(end) - energy_j(start)
    verdict = built.telemetry_data["measurement"]
    error = abs(energy.total_energy_j - truth)
    counter_error = abs((gpu.counter_j or math.nan) - truth)
    return (bool(verdict["valid"]), error <= energy.uncertainty_j, tuple(verdict["reasons"]),
            counter_error / max(gpu.counter_uncertainty_j or 0.0, 1e-9), counter_error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--latency-ms", type=float, default=40.0, help="the latency ramp's largest end (0: none)")
    args = parser.parse_args()
    results = [one_run(seed, args.latency_ms) for seed in range(args.runs)]
    valid = [r for r in results if r[0]]
    reasons = Counter(reason for r in results if not r[0] for reason in r[2])
    print(f"{args.runs} windows: {sum(r[1] for r in valid)} valid and covered, {sum(not r[1] for r in valid)} valid "
          f"and NOT covered, {args.runs - len(valid)} NOT valid {dict(reasons)}")
    ratios = sorted(r[3] for r in results)
    outside = [r for r in results if r[3] > 1]
    print(f"the counter's own error over its stated uncertainty: median {ratios[len(ratios) // 2]:.2f}, "
          f"q95 {ratios[int(0.95 * len(ratios))]:.2f}, max {ratios[-1]:.2f}; outside it in {len(outside)} windows, "
          f"of them {sum(r[0] for r in outside)} valid, errors up to {max((r[4] for r in outside), default=0):.1f} J")


if __name__ == "__main__":
    main()
