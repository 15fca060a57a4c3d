"""The simulator's sensors against the H200's measured behaviour (bench/RESULTS.md, "A real GPU"; scripts/check-gpu.sh):
the energy counter holds each value for 100 ms, the power gauge is a one-second trailing average (NVML API reference,
nvmlDeviceGetPowerUsage: "On Ampere (except GA100) or newer GPUs, the returned power draw is a one-second average";
measured: 90 % of a load step after 0.96-1.04 s). Each check reads the truth from the model's own integral."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.simulator.config import NS, SimulatorConfig
from bridge.simulator.model import NodeModel
from bridge.simulator.sensors import Sensors

T0 = 1_800_000_000 * NS


def _step(at_ns: int, low: float, high: float):  # type: ignore[no-untyped-def]
    """A load step at `at_ns`: its power and its energy (J since T0)."""
    def power(t: int) -> float:
        return low if t < at_ns else high

    def energy(t: int) -> float:
        before = min(t, at_ns) - T0
        return (low * before + high * max(t - at_ns, 0)) / NS
    return power, energy


def test_the_counter_holds_each_value_for_100_ms_and_shows_the_last_update() -> None:
    sensors = Sensors()
    _, energy = _step(T0 + 5 * NS, 100.0, 700.0)
    for k in range(200):
        t = T0 + 3 * NS + k * 37_000_000  # reads 37 ms apart, across the step
        update = t - (t - T0) % (NS // 10)  # the H200's fixed 100.0 ms grid (phase 0)
        assert sensors.counter_mj(energy, t) == math.floor(1000 * energy(update))
    # Two reads inside one update show the same value; across an update they differ.
    assert sensors.counter_mj(energy, T0 + 4 * NS + 10_000_000) == sensors.counter_mj(energy, T0 + 4 * NS + 90_000_000)
    assert sensors.counter_mj(energy, T0 + 4 * NS + 90_000_000) < sensors.counter_mj(energy, T0 + 4 * NS + 110_000_000)


def test_the_gauge_takes_about_a_second_to_show_a_step() -> None:
    sensors = Sensors()
    power, energy = _step(T0 + 5 * NS, 100.0, 700.0)
    reads = [(t, sensors.gauge_w(energy, power, t)) for t in range(T0 + 4 * NS, T0 + 7 * NS, 10_000_000)]
    ninety = next(t for t, w in reads if w >= 100.0 + 0.9 * 600.0)
    assert 0.9 <= (ninety - (T0 + 5 * NS)) / NS <= 1.05  # measured on the H200: 0.96-1.04 s
    assert all(w == pytest.approx(100.0) for t, w in reads if t < T0 + 5 * NS)
    assert all(w == pytest.approx(700.0) for t, w in reads if t > T0 + 6_100_000_000)
    ideal = Sensors.ideal()
    assert ideal.gauge_w(energy, power, T0 + 5 * NS + 1) == 700.0


@pytest.mark.parametrize("sensors", ["h200", "ideal"])
def test_the_simulators_pages_serve_what_its_sensors_read(sensors: str) -> None:
    model = NodeModel(SimulatorConfig(gpus=2, seed=3, sensors=sensors, boot_ns=T0), lambda: T0)  # type: ignore[arg-type]
    held = Sensors() if sensors == "h200" else Sensors.ideal()
    for gpu in range(2):
        for k in range(40):
            t = T0 + 600 * NS + k * 73_000_000
            values = model.snapshot(t).values[gpu]
            truth_j = model.energy_joules(gpu, T0, t)
            shown_j = values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] / 1000
            assert shown_j == pytest.approx(model.energy_joules(gpu, T0, held.counter_instant(t)), abs=1e-3)
            if sensors == "h200":  # up to one update behind the truth, never ahead
                assert 0 <= truth_j - shown_j <= 0.1 * 1000
                last_update = held.gauge_instant(t)
                average = model.energy_joules(gpu, last_update - NS, last_update)
                assert values["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(average, abs=1e-3)
            else:
                assert shown_j == pytest.approx(truth_j, abs=1e-3)
                assert values["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(model.power_watts(gpu, t), abs=1e-3)


def test_simulate_takes_the_sensors_by_name_and_refuses_others() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(Path(sys.executable).with_name("dcgm-bridge")), "simulate", "--once", "--gpus", "1",
                               "--at", "1800000600.05", *args], capture_output=True, text=True, timeout=60)

    def power(page: str) -> float:
        line = next(line for line in page.splitlines() if line.startswith("DCGM_FI_DEV_POWER_USAGE{"))
        return float(line.split()[-1])

    averaged, ideal = run(), run("--sensors", "ideal")
    assert averaged.returncode == 0 and ideal.returncode == 0
    assert power(averaged.stdout) != power(ideal.stdout)  # the default is the H200's one-second average
    refused = run("--sensors", "fast")
    assert refused.returncode == 2 and "--sensors" in refused.stderr and "Traceback" not in refused.stderr
