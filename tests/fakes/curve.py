"""A known GPU power curve and its exact energy integral (what the fakes of NVML and amdsmi measure).

Load levels (start s, W, SM %) held piecewise constant, plus a sine ripple of `ripple_w` watts with period
`ripple_s`: P(t) = level(t) + ripple_w·sin(2πt/ripple_s). Its integral is exact in closed form, so a test
compares our energy to E(b) − E(a), not to another estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_LEVELS = ((0.0, 90.0, 0.0), (10.0, 420.0, 62.0), (25.0, 655.0, 97.0), (40.0, 240.0, 30.0))


@dataclass(frozen=True)
class PowerCurve:
    levels: tuple[tuple[float, float, float], ...] = DEFAULT_LEVELS
    ripple_w: float = 25.0
    ripple_s: float = 1.7

    def _level(self, t: float) -> tuple[float, float, float]:
        current = self.levels[0]
        for level in self.levels:
            if level[0] <= t:
                current = level
        return current

    def power_w(self, t: float) -> float:
        return self._level(t)[1] + self.ripple_w * math.sin(2 * math.pi * t / self.ripple_s)

    def sm_percent(self, t: float) -> float:
        return self._level(t)[2]

    def energy_j(self, t: float) -> float:
        """∫₀ᵗ P: the levels' rectangles plus the ripple's closed form."""
        return self._piecewise(t, 1) + self.ripple_w * self.ripple_s / (2 * math.pi) * (
            1 - math.cos(2 * math.pi * t / self.ripple_s))

    def sm_busy_s(self, t: float) -> float:
        """∫₀ᵗ SM % / 100: what GPM's SM utilisation averages over an interval."""
        return self._piecewise(t, 2) / 100

    def _piecewise(self, t: float, column: int) -> float:
        total = 0.0
        for i, level in enumerate(self.levels):
            start = level[0]
            end = self.levels[i + 1][0] if i + 1 < len(self.levels) else math.inf
            if t <= start:
                break
            total += (min(t, end) - start) * level[column]
        return total
