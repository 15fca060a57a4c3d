"""The amdsmi source against a fake of ROCm's amdsmi module (tests/fakes/amdsmi.py): AIPerf's amd_* keys and units."""

from __future__ import annotations

import sys

import pytest

from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.parse import parse_page
from bridge.samples import GpuRecord
from bridge.sources import AMDSMI_SOURCE, SourceError
from bridge.sources.amdsmi import AmdSmiReader, import_amdsmi
from tests.fakes.amdsmi import FakeAmdGpu, FakeAmdSmi
from tests.sources.test_nvml import Clock


def records_of(reader: AmdSmiReader) -> dict[str, GpuRecord]:
    got = Normalizer(default_table()).records(parse_page(reader.read_page(1)), source_url=AMDSMI_SOURCE,
                                              timestamp_ns=1)
    return {r.gpu_uuid: r for r in got}


@pytest.mark.parametrize(("version", "rocm6"), [("26.2.1", False), ("25.3.0", True)], ids=["rocm7", "rocm6"])
def test_every_record_field_is_amdsmis_reading_in_aiperfs_unit(version: str, rocm6: bool) -> None:
    clock = Clock(27.3)
    gpus = [FakeAmdGpu("uuid-a", "SN-A", rocm6=rocm6), FakeAmdGpu("uuid-b", "SN-B", rocm6=rocm6)]
    reader = AmdSmiReader.open(FakeAmdSmi(clock, gpus, version=version), hostname="mi-box")
    got = records_of(reader)
    assert set(got) == {"SN-A", "SN-B"}  # the board serial: what AMD's exporter labels serial_number
    for index, gpu in enumerate(gpus):
        record = got[gpu.serial]
        assert (record.platform, record.hostname, record.gpu_model_name, record.gpu_index, record.device) == (
            "amd", "mi-box", gpu.name, index, f"amd{index}")
        assert record.pci_bus_id == f"0000:{12 + 16 * index:02x}:00.0"
        data = record.telemetry_data
        t = clock.t
        assert data["amd_power"] == round(gpu.curve.power_w(t))  # W, no scaling
        # AIPerf: accumulator × counter_resolution µJ × 1e-12 = MJ
        assert data["amd_energy_consumption"] == pytest.approx(gpu.ticks(t) * gpu.resolution_uj * 1e-12)
        busy = round(gpu.curve.sm_percent(t))
        assert (data["amd_gfx_activity"], data["amd_umc_activity"]) == (busy, busy // 3)
        assert "amd_mm_activity" not in data  # "N/A" on Instinct parts
        assert data["amd_memory_used"] == pytest.approx(gpu.vram_used(t) * 1e-9)  # bytes -> GB
        assert data["amd_temperature"] == 35 + round(gpu.curve.power_w(t) / 20)  # °C, millidegrees before 26.x
        assert data["amd_ecc_uncorrectable"] == 0
        assert data["amd_throttle_status"] == float(gpu.curve.power_w(t) > 640)


def test_a_reading_the_library_does_not_support_is_left_out() -> None:
    gpu = FakeAmdGpu("uuid-a", "SN-A", unsupported=frozenset(["amdsmi_get_energy_count", "amdsmi_get_temp_metric"]))
    data = records_of(AmdSmiReader.open(FakeAmdSmi(Clock(3.0), [gpu]), hostname="h"))["SN-A"].telemetry_data
    assert "amd_energy_consumption" not in data and "amd_temperature" not in data and "amd_power" in data


def test_no_driver_and_no_gpu_are_one_line_each() -> None:
    with pytest.raises(SourceError, match=r"^--gpu-telemetry amdsmi: amdsmi did not start .*amdgpu driver"):
        AmdSmiReader.open(FakeAmdSmi(Clock(), [FakeAmdGpu("u", "s")], driver=False), hostname="h")
    with pytest.raises(SourceError, match="amdsmi sees no AMD GPU on this machine"):
        AmdSmiReader.open(FakeAmdSmi(Clock(), []), hostname="h")


def test_a_missing_amdsmi_module_names_the_extra_and_the_rocm_match(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    with pytest.raises(SourceError, match=r"pip install 'dcgm-bridge\[amd\]' \(the amdsmi version must match the "
                                          r"installed ROCm\)"):
        import_amdsmi()
