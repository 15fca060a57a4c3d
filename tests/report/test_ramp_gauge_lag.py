"""The energy's clock (refresh.py `_measured_period`) on a ramp read through a one-second average gauge (issue 42).
The clock times DCGM's refreshes by the energy drawn over the power read at them. A trailing average reads P'·A/2 low
on a slope (nvmlDeviceGetPowerUsage on Ampere and newer averages the last second: NVML API reference; measured on an
H200, bench/RESULTS.md "A real GPU"), so every duration along a ramp reads long alike, the fitted period with them,
and the grid turned about its pivot mistimes the window's edges. No standard error shows a bias every interval
shares: the clock carries the lag's share, whether the reading is such an average or not.

Truth: power flat, then a straight ramp between the window's edges, then flat (the acceptance grid's ramp), its
integral in closed form; the counter held 100 ms and the gauge a one-second average updated every 100 ms (the
simulator's sensor model, bridge/simulator/sensors.py), served as of DCGM's last refresh; scrapes every 333 ms ± 20 ms.
"""

from __future__ import annotations

import random

from bridge.report import build_report
from bridge.report.window import explicit_window
from bridge.simulator.sensors import Sensors
from tests.report.helpers import MS, S, served

BASE = 1_800_000_000 * S


class Ramp:
    def __init__(self, a_s: float, b_s: float, p0: float, p1: float) -> None:
        self.a, self.b, self.p0, self.p1 = a_s, b_s, p0, p1

    def power_w(self, t_ns: int) -> float:
        t = (t_ns - BASE) / S
        x = min(max((t - self.a) / (self.b - self.a), 0.0), 1.0)
        return self.p0 + (self.p1 - self.p0) * x

    def energy_j(self, t_ns: int) -> float:
        t = (t_ns - BASE) / S
        ramp = min(max(t - self.a, 0.0), self.b - self.a)
        slope = (self.p1 - self.p0) / (self.b - self.a)
        return 1e6 + self.p0 * t + slope * ramp * ramp / 2 + (self.p1 - self.p0) * max(t - self.b, 0.0)


def judged(seed: int, refresh_s: float) -> tuple[float, float, float]:
    """(error, uncertainty, bound) of a 20 s window over a ramp between 80 and 700 W."""
    rng = random.Random(f"ramp-lag:{seed}:{refresh_s}")
    a = rng.uniform(8, 12)
    b = a + 20 * rng.uniform(0.9, 1.1)
    ramp = Ramp(a, b, rng.uniform(80, 700), rng.uniform(80, 700))
    phase = rng.uniform(0, 0.1)
    counter = Sensors(counter_update_s=0.1, phase_s=phase)
    gauge = Sensors(gauge_update_s=0.1, average_s=1.0, phase_s=phase)
    log = served(rng, refresh_s, BASE, BASE + round((b + 8) * S), lambda at: {
        "nvidia_energy_consumption": counter.counter_mj(ramp.energy_j, at) * 1e-9,
        "nvidia_power_usage": gauge.gauge_w(ramp.energy_j, ramp.power_w, at)})
    start, end = BASE + round(a * S), BASE + round(b * S)
    energy = build_report(log, window=explicit_window(start, end, 666 * MS)).energy
    assert energy.total_energy_j is not None and energy.uncertainty_j is not None and energy.bound_j is not None
    return abs(energy.total_energy_j - (ramp.energy_j(end) - ramp.energy_j(start))), energy.uncertainty_j, \
        energy.bound_j


# Fixed before the first run: 30 windows at each refresh period.
SEEDS = range(30)


def test_a_ramp_through_an_averaged_gauge_is_inside_the_uncertainty() -> None:
    for refresh_s in (0.5, 1.0, 2.0):
        found = [judged(seed, refresh_s) for seed in SEEDS]
        assert all(error <= bound for error, _, bound in found), refresh_s
        covered = sum(error <= stated for error, stated, _ in found) / len(found)
        assert covered >= 0.95, (refresh_s, covered)
