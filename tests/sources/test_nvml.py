"""The NVML source against a fake of pynvml that follows the library's API, units and timing (tests/fakes/nvml.py)."""

from __future__ import annotations

import logging
import sys

import pytest

from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.parse import parse_page
from bridge.samples import GpuRecord
from bridge.sources import NVML_SOURCE, SourceError
from bridge.sources.nvml import NvmlReader, import_pynvml
from tests.fakes.nvml import FakeGpu, FakeNvml

H100 = "GPU-7e3c0a52-6f1a-4c1b-9d3e-000000000001"
A100 = "GPU-7e3c0a52-6f1a-4c1b-9d3e-000000000002"


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def records_of(reader: NvmlReader, t_ns: int) -> dict[tuple[str, str | None], GpuRecord]:
    page = parse_page(reader.read_page(t_ns))
    got = Normalizer(default_table()).records(page, source_url=NVML_SOURCE, timestamp_ns=t_ns)
    return {r.identity: r for r in got}


def test_every_record_field_is_nvmls_reading_in_aiperfs_unit() -> None:
    clock = Clock(31.25)
    h100 = FakeGpu(H100)
    a100 = FakeGpu(A100, name="NVIDIA A100-SXM4-80GB", ampere_or_newer=False, gpm=False)
    fake = FakeNvml(clock, [h100, a100])
    reader = NvmlReader.open(fake, hostname="bench-box")
    clock.t = 33.5  # the GPM interval runs from open() to this read
    got = records_of(reader, 33_500_000_000)
    assert set(got) == {(H100, None), (A100, None)}
    for index, gpu in enumerate((h100, a100)):
        record = got[(gpu.uuid, None)]
        assert (record.gpu_index, record.gpu_model_name, record.pci_bus_id, record.device, record.hostname,
                record.platform, record.telemetry_source_url) == (
            index, gpu.name, gpu.pci_bus_id, f"nvidia{index}", "bench-box", "nvidia", "pynvml://localhost")
        data = record.telemetry_data
        t = clock.t
        assert data["nvidia_power_usage"] == pytest.approx(FakeNvml.power_mw(gpu, t) / 1000)
        assert data["nvidia_energy_consumption"] == pytest.approx(FakeNvml.energy_mj(gpu, t) * 1e-9)  # mJ -> MJ
        sm = gpu.curve.sm_percent(t)
        assert data["nvidia_gpu_utilization"] == round(sm) and data["nvidia_memory_utilization"] == round(sm) // 2
        used = gpu.memory_used(t)
        assert data["nvidia_memory_used"] == pytest.approx(used * 1e-9)  # bytes -> GB, as AIPerf
        assert data["nvidia_fb_free"] == pytest.approx((gpu.memory_total - used) * 1e-9)
        assert data["nvidia_fb_capacity"] == pytest.approx(gpu.memory_total * 1e-9)
        assert data["nvidia_temperature"] == 30 + round(gpu.curve.power_w(t) / 20)
        assert (data["nvidia_decoder_utilization"], data["nvidia_encoder_utilization"],
                data["nvidia_jpg_utilization"]) == (3, 1, 2)
        assert data["nvidia_power_violation"] == pytest.approx(int(t * 1e8) * 1e-3)  # ns -> µs
        assert (data["nvidia_sm_clock"], data["nvidia_mem_clock"]) == (1980, 2619)
        assert data["nvidia_enforced_power_limit"] == 700
        assert "nvidia_xid_errors" not in data  # NVML has XIDs as events only
    # GPM on the H100: the mean SM activity over the interval since open (31.25 s -> 33.5 s: 62 % then 97 %)
    expected = (h100.curve.sm_busy_s(33.5) - h100.curve.sm_busy_s(31.25)) / 2.25 * 100
    assert got[(H100, None)].telemetry_data["nvidia_sm_utilization"] == pytest.approx(expected)
    # no GPM on the A100: the processes' smUtil summed (AIPerf's fallback)
    assert got[(A100, None)].telemetry_data["nvidia_sm_utilization"] == pytest.approx(
        round(sm * 0.75) + round(sm * 0.25))


def test_power_is_the_trailing_second_on_ampere_and_instantaneous_on_ga100() -> None:
    clock = Clock(9.6)  # 0.4 s before the step from 90 W to 420 W
    newer, ga100 = FakeGpu(H100, curve=FakeGpu(H100).curve), FakeGpu(A100, ampere_or_newer=False)
    reader = NvmlReader.open(FakeNvml(clock, [newer, ga100]), hostname="h")
    clock.t = 10.5
    got = records_of(reader, 1)
    curve = newer.curve
    assert got[(H100, None)].telemetry_data["nvidia_power_usage"] == pytest.approx(
        curve.energy_j(10.5) - curve.energy_j(9.5), abs=1e-3)
    assert got[(A100, None)].telemetry_data["nvidia_power_usage"] == pytest.approx(curve.power_w(10.5), abs=1e-3)


def test_the_energy_counter_holds_between_its_updates() -> None:
    clock = Clock(12.0)
    gpu = FakeGpu(H100, energy_period_s=0.25)
    reader = NvmlReader.open(FakeNvml(clock, [gpu]), hostname="h")
    values = []
    for t in (12.01, 12.1, 12.24, 12.26):
        clock.t = t
        values.append(records_of(reader, 1)[(H100, None)].telemetry_data["nvidia_energy_consumption"])
    assert values[0] == values[1] == values[2] < values[3]


def test_mig_instances_carry_memory_and_the_parent_carries_power_and_energy() -> None:
    clock = Clock(20.0)
    gpu = FakeGpu(A100, name="NVIDIA A100-SXM4-40GB", mig_profiles=("3g.20gb", "1g.5gb"))
    reader = NvmlReader.open(FakeNvml(clock, [gpu]), hostname="h")
    got = records_of(reader, 1)
    assert set(got) == {(A100, None), (A100, "7"), (A100, "8")}
    assert "nvidia_power_usage" in got[(A100, None)].telemetry_data
    assert "nvidia_energy_consumption" in got[(A100, None)].telemetry_data
    for instance, profile, slot in (("7", "3g.20gb", 0), ("8", "1g.5gb", 1)):
        record = got[(A100, instance)]
        assert record.gpu_instance_profile == profile
        assert record.telemetry_data["nvidia_memory_used"] == pytest.approx(((slot + 1) << 28) * 1e-9)
        assert "nvidia_power_usage" not in record.telemetry_data


def test_a_reading_the_gpu_does_not_support_is_left_out_and_not_asked_again() -> None:
    clock = Clock(5.0)
    fake = FakeNvml(clock, [FakeGpu(H100, unsupported=frozenset(["nvmlDeviceGetJpgUtilization",
                                                                  "nvmlDeviceGetTotalEnergyConsumption"]))])
    reader = NvmlReader.open(fake, hostname="h")
    first = records_of(reader, 1)[(H100, None)].telemetry_data
    calls = fake.calls
    second = records_of(reader, 2)[(H100, None)].telemetry_data
    assert "nvidia_jpg_utilization" not in first and "nvidia_energy_consumption" not in first
    assert "nvidia_power_usage" in first and set(first) == set(second)
    assert fake.calls - calls < calls  # the unsupported two were not called again


def test_a_gpu_lost_mid_run_leaves_the_page_and_the_others_go_on(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(1.0)
    reader = NvmlReader.open(FakeNvml(clock, [FakeGpu(H100, lost_at_s=3.0), FakeGpu(A100)]), hostname="h")
    seen = []
    with caplog.at_level(logging.WARNING):
        for t in (1.5, 2.5, 3.5, 4.5):
            clock.t = t
            seen.append(sorted(uuid for uuid, _ in records_of(reader, int(t * 1e9))))
    assert seen == [[H100, A100], [H100, A100], [A100], [A100]]
    assert reader.lost == {H100}
    assert sum("is lost" in r.getMessage() for r in caplog.records) == 1  # said once


def test_no_driver_is_one_line_naming_it() -> None:
    with pytest.raises(SourceError, match=r"^--gpu-telemetry pynvml: NVML did not start \(NVML Shared Library "
                                          r"Not Found\): is the NVIDIA driver"):
        NvmlReader.open(FakeNvml(Clock(), [FakeGpu(H100)], library=False), hostname="h")


def test_no_gpu_is_one_line_and_nvml_is_shut_down_again() -> None:
    fake = FakeNvml(Clock(), [])
    with pytest.raises(SourceError, match="NVML sees no NVIDIA GPU on this machine"):
        NvmlReader.open(fake, hostname="h")
    assert fake.initialized == 0


def test_a_missing_pynvml_module_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(SourceError, match=r"nvidia-ml-py\) is not installed; pip install 'dcgm-bridge\[nvml\]'"):
        import_pynvml()
