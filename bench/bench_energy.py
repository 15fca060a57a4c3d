"""Energy in the window against the simulator's ground truth, fresh values and a slow DCGM refresh (issue 15).

For each refresh period (dcgm-exporter's `-c`: 0 = fresh, 1 s, 10 s, 30 s = its default) and window (20, 60,
300 s): 8 seeded runs at 3 Hz ± 20 ms, the window at a random phase of DCGM's refresh grid, scraped from two
refreshes before the window until the first scrape after the final one that sees a newer refresh (what the
sidecar's final_refresh_wait does). Three readings of the same records, side by side:
- `scrape-timed`: the counter read at our scrape times (the interpolated rule before issue 15);
- `refresh-timed`: the report (bridge/report/refresh.py), with the bound it gives;
- `aiperf`: AIPerf 0.13's counter rule.
Printed: the largest and mean |error| of each, whether the bound covered every run's error, and the expected
error the report states (`uncertainty`): its median over the median |error| and how many runs it covered. Then
the cost:
the report of one 1-hour GPU at 3 Hz with a 30 s refresh against the same with fresh values (a ratio).

    .venv/bin/python bench/bench_energy.py
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bridge.report import build_report  # noqa: E402
from bridge.report.window import explicit_window  # noqa: E402
from bridge.samples import GpuRecord  # noqa: E402
from bridge.simulator.config import SimulatorConfig  # noqa: E402
from bridge.simulator.model import NodeModel  # noqa: E402

S, MS = 1_000_000_000, 1_000_000
T0 = 1_800_000_000 * S
SEEDS = 8


def record(t: int, energy_mj: float, power_w: float) -> GpuRecord:
    return GpuRecord(gpu_index=0, gpu_uuid="GPU-bench", gpu_model_name="NVIDIA H100 80GB HBM3", pci_bus_id=None,
                     device="nvidia0", hostname="bench", namespace=None, pod_name=None, platform="nvidia",
                     timestamp_ns=t, telemetry_source_url="http://127.0.0.1:9400/metrics",
                     telemetry_data={"nvidia_energy_consumption": energy_mj * 1e-9, "nvidia_power_usage": power_w},
                     gpu_instance_id=None, gpu_instance_profile=None)


def run(refresh_s: float, window_s: float, seed: int) -> tuple[list[GpuRecord], int, int, float]:
    refresh = round(refresh_s * S)
    rng = random.Random(f"bench:{seed}:{refresh_s}:{window_s}")
    model = NodeModel(SimulatorConfig(gpus=1, seed=seed, refresh_ms=round(refresh_s * 1000), boot_ns=T0 - 86_400 * S))
    start = T0 + rng.randrange(0, 40 * S)
    end = start + round(window_s * S)
    t, final, out = start - max(2 * refresh, 2 * S) - rng.randrange(0, S), None, []
    while True:
        out.append(record(t, model.counter_mj(0, t), round(model.power_watts(0, model.sample_time_ns(t)), 3)))
        if final is None and t >= end:
            final = t
        elif final is not None and (model.sample_time_ns(t) > model.sample_time_ns(final) or t > final + 40 * S):
            break
        t += 333 * MS + rng.randrange(-20 * MS, 20 * MS)
    return out, start, end, model.energy_joules(0, start, end)


def scrape_timed(records: list[GpuRecord], start: int, end: int) -> float:
    import numpy as np

    from bridge.report.stats import counter_delta_interpolated

    ts = np.array([r.timestamp_ns for r in records], dtype=np.int64)
    values = np.array([r.telemetry_data["nvidia_energy_consumption"] for r in records])
    delta = counter_delta_interpolated(ts, values, start, end, 666 * MS)
    return 0.0 if delta is None else delta.delta * 1e6


def accuracy() -> None:
    print(f"   {'refresh':>8} {'window':>7} | {'scrape-timed max/mean':>22} | {'refresh-timed max/mean':>23} | "
          f"{'bound covers':>12} | {'uncertainty/err, covers':>23} | {'aiperf max':>10}")
    for refresh_s in (0, 1, 10, 30):
        for window_s in (20, 60, 300):
            old, new, aiperf, covered = [], [], [], True
            errors, stated = [], []
            for seed in range(SEEDS):
                records, start, end, truth = run(refresh_s, window_s, seed)
                window = explicit_window(start, end)
                built = build_report(records, window=window)
                energy, bound = built.energy.total_energy_j or 0.0, built.energy.bound_j or 0.0
                covered = covered and abs(energy - truth) <= bound
                errors.append(abs(energy - truth))
                stated.append(built.energy.uncertainty_j or 0.0)
                new.append(abs(energy / truth - 1))
                old.append(abs(scrape_timed(records, start, end) / truth - 1))
                theirs = build_report(records, window=window, counter_mode="aiperf").energy.total_energy_j or 0.0
                aiperf.append(abs(theirs / truth - 1))
            print(f"   {refresh_s:>6} s {window_s:>5} s | {max(old):>10.3%} {statistics.mean(old):>10.3%} | "
                  f"{max(new):>11.3%} {statistics.mean(new):>10.3%} | {'yes' if covered else 'NO':>12} | "
                  f"{statistics.median(stated) / statistics.median(errors):>10.1f}x "
                  f"{sum(e <= u for e, u in zip(errors, stated, strict=True)):>6}/{SEEDS:<5} | {max(aiperf):>10.2%}")


def cost() -> None:
    """One GPU, one hour at 3 Hz: the report's time with a 30 s refresh over the same with fresh values."""
    timings = {}
    for refresh_s in (0, 30):
        records, start, end, _ = run(refresh_s, 3600, 0)
        best = float("inf")
        for _ in range(3):
            began = time.process_time()
            build_report(records, window=explicit_window(start, end))
            best = min(best, time.process_time() - began)
        timings[refresh_s] = best
    print(f"   report of 1 GPU-hour: fresh {timings[0] * 1e3:.0f} ms, 30 s refresh {timings[30] * 1e3:.0f} ms "
          f"({timings[30] / timings[0]:.2f}x)")


if __name__ == "__main__":
    accuracy()
    cost()
