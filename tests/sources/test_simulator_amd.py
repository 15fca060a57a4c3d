"""The simulator's `amd` dialect: the same GPUs as its DCGM dialects, under AMD device-metrics-exporter's families
and labels, read back into AIPerf's amd_* keys with the same values."""

from __future__ import annotations

import pytest

from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.parse import parse_page
from bridge.simulator import SimulatorConfig
from bridge.simulator.model import NodeModel
from bridge.simulator.render import PageRenderer

T = 1_780_000_000 * 10**9
PAIRS = {"amd_power": "nvidia_power_usage", "amd_energy_consumption": "nvidia_energy_consumption",
         "amd_temperature": "nvidia_temperature", "amd_memory_temperature": "nvidia_memory_temp",
         "amd_gfx_activity": "nvidia_gpu_utilization", "amd_umc_activity": "nvidia_memory_utilization",
         "amd_memory_used": "nvidia_memory_used"}


def records(dialect: str) -> dict[int | None, dict[str, float]]:
    model = NodeModel(SimulatorConfig(gpus=3, seed=7, dialect=dialect, boot_ns=T - 86_400 * 10**9),
                      now_ns=lambda: T)
    page = parse_page(PageRenderer(model).page(T + 5 * 10**9))
    got = Normalizer(default_table()).records(page, source_url="http://sim/metrics", timestamp_ns=T)
    if dialect == "amd":
        assert {r.platform for r in got} == {"amd"} and all(r.gpu_model_name for r in got)
    return {r.gpu_index: r.telemetry_data for r in got}


def test_the_amd_dialect_carries_the_same_gpus_values_as_dcgms() -> None:
    amd, dcgm = records("amd"), records("legacy")
    assert sorted(amd) == sorted(dcgm) == [0, 1, 2]
    for index in amd:
        for amd_key, nvidia_key in PAIRS.items():
            assert amd[index][amd_key] == pytest.approx(dcgm[index][nvidia_key], rel=1e-6), amd_key


def test_the_amd_dialect_refuses_mig() -> None:
    with pytest.raises(ValueError, match="the amd dialect has no MIG"):
        SimulatorConfig(dialect="amd", mig=2)
