"""Scrapes every multiple of the energy counter's hold (issue 42; found in session 25 with README's `--interval 0.1`).

An H200's counter updates every 100 ms (bench/RESULTS.md, "A real GPU"). Scrapes every 0.1, 0.5 or 1 s each read it
at nearly one phase of its hold, so every reading is about equally old and their deviations show no hold however
old the values are. That age moves both edges alike but where it wraps (the phase crosses an update: one scrape
sees two updates, or none), which puts the edges a whole update apart. A loaded machine drifts the exporter's
latency (tens of ms between a scrape's timestamp and the read), and so the phase, across a run.

A run: a smooth power (a level of 150-650 W, a slow swing of 2-20 W), the simulator's sensors (bridge/simulator/
sensors.py: a 1 s average gauge, the counter held 100 ms on a fixed grid on even seeds, drifting by up to ±0.2 %
with ±2 ms of jitter on odd ones, as tests/report/sensor_runs.py), 75 scrapes `interval_s` ± 2 ms apart whose
reads lag their timestamps by a latency ramping from 0 to L (L uniform in 0-`latency_ms`) plus up to 2 ms, and a
window of 35-45 scrapes from the 20th on. The truth is the power's integral in closed form. Or, in place of the smooth
power, a load shape of issue 42's grid (tests/report/sensor_runs.py `SHAPES`: steps, bursts, square waves, ramps, a
spike at an edge, …), its window drawn first.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from bridge.report import build_report
from bridge.report.window import explicit_window
from bridge.samples import GpuRecord
from bridge.simulator.sensors import Sensors
from bridge.sources import NVML_SOURCE
from tests.report.helpers import MS, URL, S, recs

START = 1_800_000_000 * S
GRACE = 666 * MS
SCRAPES = 75


@dataclass(frozen=True, slots=True)
class AliasedSpec:
    interval_s: float
    seed: int
    latency_ms: float = 40.0  # the latency ramp's largest end
    local: bool = False  # read by the local NVML reader, not scraped from an exporter
    shape: str = "smooth"  # or a load shape of issue 42's grid (tests/report/sensor_runs.py `SHAPES`)


class AliasedRun(NamedTuple):
    records: list[GpuRecord]
    start: int
    end: int
    truth_j: float


class AliasedJudged(NamedTuple):
    spec: AliasedSpec
    valid: bool
    reasons: tuple[str, ...]
    error: float  # |energy − truth|, J
    uncertainty: float
    bound: float
    counter_error: float  # the counter's own energy's, against its own uncertainty
    counter_uncertainty: float
    truth: float


def aliased_run(spec: AliasedSpec) -> AliasedRun:
    if spec.shape != "smooth":
        return _shaped_run(spec)
    rng = random.Random(f"aliased:{spec.interval_s}:{spec.seed}:{spec.latency_ms}:{spec.local}")
    level, swing, period = rng.uniform(150, 650), rng.uniform(2, 20), rng.uniform(20, 60)
    phase = rng.uniform(0, 2 * math.pi)

    def energy_j(t_ns: int) -> float:  # ∫ level + swing·sin(2πt/period + phase) since START, from 1 MJ
        t = (t_ns - START) / S
        return 1e6 + level * t - swing * period / (2 * math.pi) * (math.sin(2 * math.pi * t / period + phase)
                                                                  - math.sin(phase))

    def power_w(t_ns: int) -> float:
        return level + swing * math.sin(2 * math.pi * (t_ns - START) / S / period + phase)

    sensors = _sensors(rng, spec.seed)
    interval = round(spec.interval_s * S)
    latency_end = rng.uniform(0, spec.latency_ms) * MS
    first = START + 2 * S + rng.randrange(0, interval)
    records, scrapes = _scraped(rng, spec, sensors, energy_j, power_w, first, latency_end)
    start = scrapes[20] + rng.randrange(0, interval)
    end = start + round(rng.uniform(35, 45) * interval)
    return AliasedRun(records, start, end, energy_j(end) - energy_j(start))


def _shaped_run(spec: AliasedSpec) -> AliasedRun:
    """A load shape of issue 42's grid (its truth in closed form), the window drawn first (the shapes take it)."""
    from tests.report.sensor_runs import SHAPES

    rng = random.Random(f"aliased:{spec.shape}:{spec.interval_s}:{spec.seed}:{spec.latency_ms}:{spec.local}")
    interval = round(spec.interval_s * S)
    first = START + 2 * S + rng.randrange(0, interval)
    start = first + 20 * interval + rng.randrange(0, interval)
    end = start + round(rng.uniform(35, 45) * interval)
    shape = SHAPES[spec.shape](rng, 0.0, (start - START) / S, (end - START) / S)

    def energy_j(t_ns: int) -> float:
        return 1e6 + shape.energy(-400.0, (t_ns - START) / S)

    sensors = _sensors(rng, spec.seed)
    latency_end = rng.uniform(0, spec.latency_ms) * MS
    records, _ = _scraped(rng, spec, sensors, energy_j, lambda t_ns: shape.power((t_ns - START) / S), first,
                          latency_end)
    return AliasedRun(records, start, end, shape.energy((start - START) / S, (end - START) / S))


def _sensors(rng: random.Random, seed: int) -> Sensors:
    """The H200's: the counter on a fixed 100 ms grid on even seeds, drifting by up to ±0.2 % with ±2 ms of jitter on
    odd ones (as tests/report/sensor_runs.py `sensors_for`)."""
    drifting = seed % 2 == 1
    return Sensors(drift=rng.uniform(-0.002, 0.002) if drifting else 0.0, jitter_s=0.002 if drifting else 0.0,
                   phase_s=rng.uniform(0, 0.1), seed=seed)


def _scraped(rng: random.Random, spec: AliasedSpec, sensors: Sensors, energy_j: Callable[[int], float],
             power_w: Callable[[int], float], first: int, latency_end: float) -> tuple[list[GpuRecord], list[int]]:
    """`SCRAPES` scrapes `interval_s` ± 2 ms apart from `first`, each read `latency_end`·k/`SCRAPES` + up to 2 ms
    after its timestamp: the records and the scrapes' times."""
    interval = round(spec.interval_s * S)
    scrapes = [first + k * interval + rng.randrange(-2 * MS, 2 * MS) for k in range(SCRAPES)]
    reads = [t + round(latency_end * k / SCRAPES) + rng.randrange(0, 2 * MS) for k, t in enumerate(scrapes)]
    counter = [sensors.counter_mj(energy_j, t) * 1e-9 for t in reads]  # mJ → MJ
    gauge = [sensors.gauge_w(energy_j, power_w, t) for t in reads]
    return recs(scrapes, counter, gauge, url=NVML_SOURCE if spec.local else URL), scrapes


def judge_aliased(spec: AliasedSpec) -> AliasedJudged:
    run = aliased_run(spec)
    built = build_report(run.records, window=explicit_window(run.start, run.end, GRACE))
    energy = built.energy
    assert energy.total_energy_j is not None and energy.uncertainty_j is not None
    (gpu,) = energy.gpus
    verdict = built.telemetry_data["measurement"]
    return AliasedJudged(spec, bool(verdict["valid"]), tuple(verdict["reasons"]),
                         abs(energy.total_energy_j - run.truth_j), energy.uncertainty_j,
                         math.inf if energy.bound_j is None else energy.bound_j,
                         abs((gpu.counter_j or math.nan) - run.truth_j), gpu.counter_uncertainty_j or 0.0, run.truth_j)
