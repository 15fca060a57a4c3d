"""Issue 42's harness reads a run's sensors for all its scrapes at once; each value must be, bit for bit, what one
scalar call per scrape gives (`Sensors.counter_mj` / `gauge_w` over the shape's `energy` / `power`), the reading the
acceptance grid was measured on."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bridge.simulator.sensors import Sensors
from tests.report.helpers import S
from tests.report.sensor_runs import (
    _ORIGIN_S,
    COUNTER_ORIGIN_J,
    GAUGES,
    SHAPES,
    START,
    Piecewise,
    read_sensors,
    sensors_for,
)


def _instants(rng: random.Random, shape: object) -> list[int]:
    """Instants from before the curve's knots to past them: random ones, and each knot's own instant (where the
    piecewise curve changes branch)."""
    times = [START + rng.randrange(-10 * S, 420 * S) for _ in range(300)]
    if isinstance(shape, Piecewise):
        knots = shape.t[(shape.t > -10) & (shape.t < 420)]
        times += [START + round(float(k) * S) for k in rng.sample(list(knots), min(len(knots), 60))]
        times += [START + round(float(shape.t[0]) * S), START + round(float(shape.t[-1]) * S)]
    return sorted(times)


def _bits(values: list[float]) -> list[str]:
    return [float(v).hex() for v in values]


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_harness_reads_each_scrape_bit_for_bit_as_one_sensor_call_per_scrape(name: str) -> None:
    for gauge in GAUGES:
        for counter in ("continuous", "held"):
            for seed in (0, 1):  # (the held counter's grid drifts, with jitter, on odd seeds)
                rng = random.Random(f"{name}:{gauge}:{counter}:{seed}")
                start_s = rng.uniform(0, 40)
                shape = SHAPES[name](rng, rng.choice((0, 0.1, 2, 30)), start_s, start_s + rng.choice((5, 300)))
                sensors = sensors_for(gauge, counter, seed, rng)
                times = _instants(rng, shape)

                def energy_j(t_ns: int) -> float:
                    return COUNTER_ORIGIN_J + shape.energy(_ORIGIN_S, (t_ns - START) / S)  # noqa: B023

                def power_w(t_ns: int) -> float:
                    return shape.power((t_ns - START) / S)  # noqa: B023

                counters, gauges = read_sensors(sensors, shape, np.array(times, dtype=np.int64))
                assert _bits(counters) == _bits([sensors.counter_mj(energy_j, t) * 1e-9 for t in times])
                assert _bits(gauges) == _bits([sensors.gauge_w(energy_j, power_w, t) for t in times])


def test_a_drifting_jittered_grid_shows_each_update_where_the_scalar_sensor_does() -> None:
    """Far from the harness's start too (update numbers past 2^31, negative ones): the hash's 64-bit wrap."""
    from tests.report.sensor_runs import last_updates

    for seed in range(4):
        sensors = Sensors(drift=0.0017 * (seed - 1.5), jitter_s=0.0019, phase_s=0.03 * seed, seed=seed * 7919)
        rng = random.Random(seed)
        times = [rng.randrange(-10**12, 10**12) for _ in range(200)] + [START + rng.randrange(0, 10**12)
                                                                       for _ in range(200)]
        array = np.array(times, dtype=np.int64)
        assert last_updates(sensors, array, 0.1, 0.0).tolist() == [sensors.counter_instant(t) for t in times]
        assert last_updates(sensors, array, 0.1, 0.5).tolist() == [sensors.gauge_instant(t) for t in times]
