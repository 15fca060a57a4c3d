"""How a GPU's sensors serve its power: the sensor model the simulator, the demo and the accuracy tests share.

The truth is a power curve and its integral. What an exporter serves is neither, but what the sensors made of them
(measured on an H200, driver 580.159.04, by scripts/check-gpu.sh: bench/RESULTS.md, "A real GPU"):

- the energy counter (`nvmlDeviceGetTotalEnergyConsumption`, DCGM field 156) updates every 100 ms and holds its
  value in between: a read returns the energy at the last update (a fixed 100.0 ms grid fits 99.8 % of the
  measured steps; `drift` and `jitter_s` model a grid that wanders against it);
- the power gauge (`nvmlDeviceGetPowerUsage`, DCGM field 155) is a one-second trailing average on Ampere and newer
  but GA100 (NVML API reference; measured: 90 % of a load step after 0.96-1.04 s), itself updated every ~100 ms;
  the instant field (NVML 186 / DCGM 157 `POWER_USAGE_INSTANT`) follows a step within ~0.15 s: `average_s=0`;
- dcgm-exporter serves DCGM's latest sample of each field, taken every `-c` ms (its collect interval): a served
  value is up to one refresh old (bridge/simulator/model.py `sample_time_ns`), on top of the sensor's own hold.

Everything here is a pure function of the truth and the sensor's settings: the same time gives the same reading.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

NS = 1_000_000_000

# Cumulative energy in joules since some origin, at a time in ns (monotone): the truth the sensors read.
EnergyAt = Callable[[int], float]


@dataclass(frozen=True, slots=True)
class Sensors:
    """One GPU's sensors. The defaults are the H200's (module doc); `Sensors.ideal()` reads the truth directly."""

    counter_update_s: float = 0.1  # 0: the counter is read at the instant asked (an ideal counter)
    gauge_update_s: float = 0.1
    average_s: float = 1.0  # the gauge's trailing average; 0: the instant power
    drift: float = 0.0  # the update grid's period is update_s × (1 + drift)
    jitter_s: float = 0.0  # each update lands up to this far either side of its grid instant
    phase_s: float = 0.0  # where the update grids lie (the gauge's is offset by half a period)
    seed: int = 0  # the jitter's

    @classmethod
    def ideal(cls) -> Sensors:
        """A counter and a gauge that read the truth at the instant asked."""
        return cls(counter_update_s=0.0, gauge_update_s=0.0, average_s=0.0)

    def __post_init__(self) -> None:
        if min(self.counter_update_s, self.gauge_update_s, self.average_s, self.jitter_s) < 0:
            raise ValueError("sensor periods and jitter must be >= 0")
        if self.jitter_s * 2 >= max(self.counter_update_s, self.gauge_update_s, 1e-9) and self.jitter_s:
            raise ValueError("an update's jitter must stay under half its period")

    def counter_instant(self, t_ns: int) -> int:
        """The instant whose energy the counter shows at `t_ns`: its last update at or before it."""
        return self._last_update(t_ns, self.counter_update_s, 0.0)

    def gauge_instant(self, t_ns: int) -> int:
        return self._last_update(t_ns, self.gauge_update_s, 0.5)

    def counter_mj(self, energy_j: EnergyAt, t_ns: int) -> int:
        """The counter's reading at `t_ns` in whole mJ, as NVML and DCGM count it."""
        return math.floor(1000 * energy_j(self.counter_instant(t_ns)))

    def gauge_w(self, energy_j: EnergyAt, power_w: Callable[[int], float], t_ns: int) -> float:
        """The gauge's reading at `t_ns` in W, to the mW NVML reports: the trailing average over `average_s` up to
        its last update (the energy drawn over that span, divided by it), or the instant power there."""
        at = self.gauge_instant(t_ns)
        if not self.average_s:
            return round(power_w(at), 3)
        span = round(self.average_s * NS)
        return round((energy_j(at) - energy_j(at - span)) / self.average_s, 3)

    def _last_update(self, t_ns: int, update_s: float, offset: float) -> int:
        if not update_s:
            return t_ns
        period = update_s * (1 + self.drift) * NS
        origin = (self.phase_s + offset * update_s) * NS
        k = math.floor((t_ns - origin) / period)
        for j in (k + 1, k, k - 1, k - 2):  # jitter moves an update by less than half a period
            at = round(origin + j * period + self._jitter(j, update_s))
            if at <= t_ns:
                return at
        return t_ns  # (unreachable: update k−2 lies more than a period before t)

    def _jitter(self, k: int, update_s: float) -> float:
        if not self.jitter_s:
            return 0.0
        # A hash of (seed, k) to [−1, 1): deterministic, no state (Knuth's multiplicative hash, 64 bits).
        mixed = ((k * 0x9E3779B97F4A7C15) ^ (self.seed * 0xBF58476D1CE4E5B9)) & 0xFFFFFFFFFFFFFFFF
        mixed = (mixed ^ (mixed >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        return ((mixed >> 11) / 2**53 * 2 - 1) * self.jitter_s * NS
