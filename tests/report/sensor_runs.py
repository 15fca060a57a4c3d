"""Runs of one GPU as real sensors and dcgm-exporter serve them, with the truth beside them (issue 42's harness).

A run: a load shape (the truth: power and its integral in closed form), the sensors (bridge/simulator/sensors.py:
the H200's 1 s average gauge or the instant one; a counter held for 100 ms on a fixed or a drifting grid, or a
continuous one), dcgm-exporter's refresh (`-c`: each served value DCGM's latest sample, up to one refresh old), and
scrapes at AIPerf's 333 ms ± 20 ms from a warm-up to the first scrape after the window that sees a newer refresh
(the sidecar's final wait), with boundary scrapes at the window's edges on even seeds (as phase marks ask for).
Fresh values (a refresh of 0) come from the local NVML reader, the only source that reads the sensors when asked.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from bridge.report import build_report
from bridge.report.window import explicit_window
from bridge.samples import GpuRecord
from bridge.simulator.sensors import Sensors
from bridge.sources import NVML_SOURCE
from tests.report.helpers import MS, URL, S, rec

START = 1_800_000_000 * S
GRACE = 666 * MS
COUNTER_ORIGIN_J = 1e6  # the counter's reading at t = -400 s (it counts from boot, long before)
_ORIGIN_S = -400.0


class Shape(Protocol):
    def power(self, t: float) -> float: ...  # W at t seconds after START

    def energy(self, t0: float, t1: float) -> float: ...  # J over [t0, t1], seconds after START


class Piecewise:
    """Power linear between knots (seconds after START, W), flat outside them; its integral exact."""

    def __init__(self, knots: list[tuple[float, float]]) -> None:
        knots = sorted(knots)
        self.t = np.array([k[0] for k in knots], dtype=np.float64)
        self.p = np.array([k[1] for k in knots], dtype=np.float64)
        self.cum = np.concatenate(([0.0], np.cumsum(np.diff(self.t) * (self.p[1:] + self.p[:-1]) / 2)))

    def power(self, t: float) -> float:
        return float(np.interp(t, self.t, self.p))

    def _cumulative(self, t: float) -> float:
        if t <= self.t[0]:
            return -(self.t[0] - t) * float(self.p[0])
        if t >= self.t[-1]:
            return float(self.cum[-1]) + (t - self.t[-1]) * float(self.p[-1])
        i = int(np.searchsorted(self.t, t, side="right")) - 1
        return float(self.cum[i]) + (t - float(self.t[i])) * (float(self.p[i]) + self.power(t)) / 2

    def energy(self, t0: float, t1: float) -> float:
        return self._cumulative(t1) - self._cumulative(t0)


def _edges(knots: list[tuple[float, float]], at: float, low: float, high: float, rise: float = 0.02) -> None:
    """A step from `low` to `high` at `at` that takes `rise` seconds (a GPU's power moves in tens of ms)."""
    knots.extend([(at, low), (at + rise, high)])


def _square(rng: random.Random, period: float, t0: float, t1: float) -> Piecewise:
    low, high = rng.uniform(80, 150), rng.uniform(400, 700)
    knots: list[tuple[float, float]] = []
    t = t0 - rng.uniform(0, period)
    while t < t1:
        _edges(knots, t, low, high)
        _edges(knots, t + period / 2, high, low)
        t += period
    return Piecewise(knots)


def _bursts(rng: random.Random, t0: float, t1: float) -> Piecewise:
    idle = rng.uniform(60, 100)
    knots: list[tuple[float, float]] = [(t0, idle)]
    t = t0 + rng.uniform(0, 3)
    while t < t1:
        high, length = rng.uniform(400, 700), rng.uniform(1, 3)
        _edges(knots, t, idle, high)
        _edges(knots, t + length, high, idle)
        t += length + rng.uniform(1, 5)
    return Piecewise(knots)


def _jittered(rng: random.Random, level: float, share: float, t0: float, t1: float, every: float = 0.1) -> Piecewise:
    """A level with ± `share` of it at random every `every` s: steady power as a GPU draws it."""
    n = math.ceil((t1 - t0) / every) + 1
    return Piecewise([(t0 + k * every, level * (1 + rng.uniform(-share, share))) for k in range(n)])


class SettlingSteps:
    """Load steps every 3-40 s that settle exponentially (τ 0.2-5 s), as a server's power does when a benchmark's
    concurrency changes; the integral in closed form."""

    def __init__(self, rng: random.Random) -> None:
        self.base = rng.uniform(80, 200)
        self.steps: list[tuple[float, float, float]] = []  # (at s, amplitude W, τ s)
        level, t = 0.0, -400.0
        while t < 800:
            target = rng.uniform(0, 500)
            self.steps.append((t, target - level, rng.uniform(0.2, 5.0)))
            level, t = target, t + rng.uniform(3, 40)

    def power(self, t: float) -> float:
        return self.base + sum(a * (1 - math.exp(-(t - at) / tau)) for at, a, tau in self.steps if t > at)

    def energy(self, t0: float, t1: float) -> float:
        def cumulative(t: float) -> float:
            return self.base * t + sum(a * ((t - at) - tau * (1 - math.exp(-(t - at) / tau)))
                                       for at, a, tau in self.steps if t > at)
        return cumulative(t1) - cumulative(t0)


class Sinusoids:
    """300 W ± 120 W over 7 s ± 40 W over 1.3 s: swings a slow refresh cannot follow."""

    def power(self, t: float) -> float:
        return 300.0 + 120.0 * math.sin(2 * math.pi * t / 7.0) + 40.0 * math.sin(2 * math.pi * t / 1.3)

    def energy(self, t0: float, t1: float) -> float:
        def antiderivative(t: float) -> float:
            return (300.0 * t - 120.0 * 7.0 / (2 * math.pi) * math.cos(2 * math.pi * t / 7.0)
                    - 40.0 * 1.3 / (2 * math.pi) * math.cos(2 * math.pi * t / 1.3))
        return antiderivative(t1) - antiderivative(t0)


class SimulatorLoad:
    """The simulator's own GPU (bridge/simulator/model.py): minutes-long swells and a 5-20 s ripple."""

    def __init__(self, seed: int) -> None:
        from bridge.simulator.config import SimulatorConfig
        from bridge.simulator.model import NodeModel

        self.model = NodeModel(SimulatorConfig(gpus=1, seed=seed, boot_ns=START - 86_400 * S))

    def power(self, t: float) -> float:
        return self.model.power_watts(0, START + round(t * S))

    def energy(self, t0: float, t1: float) -> float:
        return self.model.energy_joules(0, START + round(t0 * S), START + round(t1 * S))


# The load shapes of issue 42's acceptance. Each takes (rng, refresh s, window start s, window end s).
SHAPES: dict[str, Callable[[random.Random, float, float, float], Shape]] = {
    "model": lambda rng, r, a, b: SimulatorLoad(rng.randrange(1 << 30)),
    "steps": lambda rng, r, a, b: SettlingSteps(rng),
    "sinusoids": lambda rng, r, a, b: Sinusoids(),
    "steady": lambda rng, r, a, b: _jittered(rng, rng.uniform(150, 650), 0.01, _ORIGIN_S, b + 60),
    "idle": lambda rng, r, a, b: _jittered(rng, rng.uniform(55, 95), 0.01, _ORIGIN_S, b + 60),
    # At the power limit the controller holds the board within a few % of it (700 W: an H200's limit).
    "cap": lambda rng, r, a, b: _jittered(rng, 700.0, 0.015, _ORIGIN_S, b + 60),
    "square": lambda rng, r, a, b: _square(rng, max(r, 1 / 3) * rng.uniform(0.7, 1.4), _ORIGIN_S, b + 60),
    "ramp": lambda rng, r, a, b: Piecewise([(a, rng.uniform(80, 700)), (b, rng.uniform(80, 700))]),
    "bursts": lambda rng, r, a, b: _bursts(rng, _ORIGIN_S, b + 60),
    "spike": lambda rng, r, a, b: _spike(rng, a, b),
}
STEADY_SHAPES = ("steady", "idle", "cap")


def _spike(rng: random.Random, start: float, end: float) -> Piecewise:
    """Idle, then a 2 s burst that starts within 0.5 s of the window's start or end."""
    idle, high = rng.uniform(60, 100), rng.uniform(400, 700)
    at = rng.choice((start, end)) + rng.uniform(-0.5, 0.5)
    knots = [(_ORIGIN_S, idle)]
    _edges(knots, at, idle, high)
    _edges(knots, at + 2, high, idle)
    return Piecewise(knots)


# Sensor variants: (gauge, counter). The 100 ms counter lies on a fixed grid on even seeds and drifts on odd ones.
GAUGES = {"instant": 0.0, "average": 1.0}
COUNTERS = ("continuous", "held")


def sensors_for(gauge: str, counter: str, seed: int, rng: random.Random) -> Sensors:
    """The drifting grid: the H200's update periods measured 100.0-100.2 ms (bench/RESULTS.md, "A real GPU"): a period
    up to 0.2 % off, each update up to 2 ms early or late."""
    held = counter == "held"
    drifting = held and seed % 2 == 1
    return Sensors(counter_update_s=0.1 if held else 0.0, gauge_update_s=0.1, average_s=GAUGES[gauge],
                   drift=rng.uniform(-0.002, 0.002) if drifting else 0.0, jitter_s=0.002 if drifting else 0.0,
                   phase_s=rng.uniform(0, 0.1), seed=seed)


class Run(NamedTuple):
    records: list[GpuRecord]
    start: int
    end: int
    truth_j: float


@dataclass(frozen=True, slots=True)
class RunSpec:
    shape: str
    refresh_s: float
    window_s: float  # nominal: each run's is within ±10 % of it
    gauge: str = "average"
    counter: str = "held"
    seed: int = 0
    boundary: bool | None = None  # boundary scrapes at the edges (None: on even seeds)


def make_run(spec: RunSpec) -> Run:
    rng = random.Random(f"42:{spec.shape}:{spec.refresh_s}:{spec.window_s}:{spec.gauge}:{spec.counter}:{spec.seed}")
    start_s = rng.uniform(0, 40)
    end_s = start_s + spec.window_s * rng.uniform(0.9, 1.1)  # (a benchmark's length is no round number)
    shape = SHAPES[spec.shape](rng, spec.refresh_s, start_s, end_s)
    sensors = sensors_for(spec.gauge, spec.counter, spec.seed, rng)
    refresh = round(spec.refresh_s * S)
    refresh_phase = rng.randrange(0, max(refresh, 1))
    # Fresh values are what a local reader reads (NVML: the sensors at the read); anything slower is dcgm-exporter's.
    url = NVML_SOURCE if not refresh else URL

    def energy_j(t_ns: int) -> float:
        return COUNTER_ORIGIN_J + shape.energy(_ORIGIN_S, (t_ns - START) / S)

    def power_w(t_ns: int) -> float:
        return shape.power((t_ns - START) / S)

    def sampled(t: int) -> int:  # the DCGM refresh instant a scrape at t sees
        return t - (t - refresh_phase) % refresh if refresh else t

    start, end = START + round(start_s * S), START + round(end_s * S)
    boundary = spec.seed % 2 == 0 if spec.boundary is None else spec.boundary
    records: list[GpuRecord] = []
    t = start - max(2 * refresh, 2 * S) - rng.randrange(0, S)
    final: int | None = None
    marks = [start, end] if boundary else []
    while True:
        if marks and t >= marks[0]:
            t = marks.pop(0)
        at = sampled(t)
        records.append(rec(t, {"nvidia_energy_consumption": sensors.counter_mj(energy_j, at) * 1e-9,
                               "nvidia_power_usage": sensors.gauge_w(energy_j, power_w, at)}, url=url))
        if final is None and t >= end:
            final = t
        elif final is not None and (sampled(t) > sampled(final) or t > final + 40 * S) and t >= end + GRACE:
            break
        t += 333 * MS + rng.randrange(-20 * MS, 20 * MS)
    return Run(records, start, end, shape.energy(start_s, end_s))


class Judged(NamedTuple):
    spec: RunSpec
    error: float  # |energy − truth|, J
    uncertainty: float
    bound: float
    energy: float
    truth: float
    valid: bool
    reasons: tuple[str, ...]
    refreshes: int | None  # DCGM refreshes in the window (None: fresh values)


def judge(spec: RunSpec) -> Judged:
    run = make_run(spec)
    built = build_report(run.records, window=explicit_window(run.start, run.end, GRACE))
    energy = built.energy
    assert energy.total_energy_j is not None and energy.uncertainty_j is not None
    verdict = built.telemetry_data["measurement"]
    (gpu,) = energy.gpus
    bound = math.inf if energy.bound_j is None else energy.bound_j  # (none: the counter could not bound it)
    return Judged(spec, abs(energy.total_energy_j - run.truth_j), energy.uncertainty_j, bound,
                  energy.total_energy_j, run.truth_j, bool(verdict["valid"]), tuple(verdict["reasons"]), gpu.refreshes)


def loose(group: Sequence[Judged]) -> float | None:
    """How loose the valid windows' uncertainty is: the median of uncertainty / energy over the median of error /
    energy, an error under 10 ppm of the energy counting as 10 ppm and an uncertainty under 0.05 % of the energy as no
    looser than its error (no user can act on less). None without a valid window."""
    valid = [j for j in group if j.valid]
    if not valid:
        return None
    errors = [max(j.error, 1e-5 * j.truth) / j.truth for j in valid]
    stated = [(j.uncertainty if j.uncertainty >= 5e-4 * j.truth else min(j.uncertainty, e * j.truth)) / j.truth
              for j, e in zip(valid, errors, strict=True)]
    return float(np.median(stated) / np.median(errors))


# Issue 42's grid: a group is one load shape × refresh period × sensor variant, judged over every window length × seed.
REFRESHES = (0, 0.1, 0.5, 1, 2, 10, 30)
WINDOWS = (5, 20, 60, 120, 300)
SENSORS = (("instant", "continuous"), ("instant", "held"), ("average", "continuous"), ("average", "held"))
GroupKey = tuple[str, float, str, str]  # (shape, refresh s, gauge, counter)


def grid_specs(seeds: Iterable[int], shapes: Iterable[str] = SHAPES, refreshes: Iterable[float] = REFRESHES,
               sensors: Iterable[tuple[str, str]] = SENSORS) -> list[RunSpec]:
    """Every run of the grid, group by group (shape, refresh, sensors), each group's windows × seeds together."""
    seeds, sensors = list(seeds), list(sensors)
    return [RunSpec(shape, refresh_s, window_s, gauge, counter, seed) for shape in shapes for refresh_s in refreshes
            for gauge, counter in sensors for window_s in WINDOWS for seed in seeds]


def judge_groups(specs: Sequence[RunSpec]) -> dict[GroupKey, list[Judged]]:
    """Judge the runs on two processes (this machine's cores) and gather them by group, in the specs' order."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:
        judged = pool.map(judge, specs, chunksize=8)
    groups: dict[GroupKey, list[Judged]] = {}
    for j in judged:
        groups.setdefault((j.spec.shape, j.spec.refresh_s, j.spec.gauge, j.spec.counter), []).append(j)
    return groups
