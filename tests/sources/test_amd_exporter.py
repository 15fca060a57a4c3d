"""AMD device-metrics-exporter pages (tests/data/amd_*.prom) read into AIPerf's amd_* keys, by hand from the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge.fields import default_table, dialect_summary
from bridge.normalize import Normalizer
from bridge.parse import PageParser, parse_page
from bridge.samples import GpuRecord

DATA = Path(__file__).parents[1] / "data"
LINE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


def page_values(name: str) -> dict[tuple[str, str], float]:
    """(family, gpu_id) → value, read from the page's text with a regular expression (the test's own reader)."""
    out = {}
    for line in (DATA / name).read_text().splitlines():
        match = LINE.match(line)
        if match and 'gpu_id="' in match.group(2):
            gpu_id = re.search(r'gpu_id="(\d+)"', match.group(2)).group(1)  # type: ignore[union-attr]
            out[(match.group(1), gpu_id)] = float(match.group(3))
    return out


def records(name: str, *, compiled: bool) -> list[GpuRecord]:
    return records_of((DATA / name).read_bytes(), compiled=compiled)


def records_of(body: bytes, *, compiled: bool) -> list[GpuRecord]:
    normalizer = Normalizer(default_table())
    if compiled:  # the kernel's path: a templated page compiled into record lines
        parser = PageParser()
        parser.parse(body)
        done = normalizer.compiled(parser.parse(body), source_url="http://mi300x:5000/metrics", timestamp_ns=7)
        assert done is not None
        return done.records()
    return normalizer.records(parse_page(body), source_url="http://mi300x:5000/metrics", timestamp_ns=7)


@pytest.mark.parametrize("compiled", [False, True], ids=["records", "compiled"])
def test_an_unpartitioned_mi300x_page_gives_aiperfs_amd_keys_in_its_units(compiled: bool) -> None:
    values = page_values("amd_mi300x_spx.prom")
    got = {r.gpu_index: r for r in records("amd_mi300x_spx.prom", compiled=compiled)}
    assert sorted(got) == [0, 1]
    for index, record in got.items():
        gpu = str(index)
        assert record.platform == "amd" and record.hostname == "mi300x-node-a"
        assert record.gpu_model_name == "AMD Instinct MI300X" and record.device == f"amd{gpu}"
        assert record.gpu_uuid == ("692251001234", "692251001235")[index] and record.gpu_instance_id is None
        data = record.telemetry_data
        assert data["amd_power"] == values[("gpu_package_power", gpu)]
        assert data["amd_power_usage"] == values[("gpu_power_usage", gpu)]
        # "Accumulated energy consumed by the GPU in uJ": uJ x 1e-12 = MJ, AIPerf's unit for amd_energy_consumption
        assert data["amd_energy_consumption"] == pytest.approx(values[("gpu_energy_consumed", gpu)] * 1e-12)
        assert data["amd_gfx_activity"] == values[("gpu_gfx_activity", gpu)]
        assert data["amd_umc_activity"] == values[("gpu_umc_activity", gpu)]
        assert data["amd_memory_used"] == pytest.approx(values[("gpu_used_vram", gpu)] / 1000)  # MB -> GB
        assert data["amd_memory_total"] == pytest.approx(values[("gpu_total_vram", gpu)] / 1000)
        assert data["amd_temperature"] == values[("gpu_junction_temperature", gpu)]
        assert data["amd_ecc_uncorrectable"] == values[("gpu_ecc_uncorrect_total", gpu)]


@pytest.mark.parametrize("compiled", [False, True], ids=["records", "compiled"])
def test_a_cpx_package_counts_its_power_and_energy_once_on_the_package_from_partition_0(compiled: bool) -> None:
    values = page_values("amd_mi300x_cpx.prom")
    got = records("amd_mi300x_cpx.prom", compiled=compiled)
    packages = [r for r in got if r.gpu_instance_id is None]
    partitions = [r for r in got if r.gpu_instance_id is not None]
    assert len(packages) == 2 and len(partitions) == 16
    power = {r.gpu_uuid: r.telemetry_data["amd_power"] for r in packages}
    # partition 0 is gpu_id 0 on the first package and gpu_id 8 on the second (listed after gpu_id 10-15)
    assert power == {"692251002001": values[("gpu_package_power", "0")],
                     "692251002002": values[("gpu_package_power", "8")]}
    assert sum(r.telemetry_data.get("amd_energy_consumption", 0.0) for r in got) == pytest.approx(
        (values[("gpu_energy_consumed", "0")] + values[("gpu_energy_consumed", "8")]) * 1e-12)
    for record in partitions:
        assert not {"amd_power", "amd_energy_consumption", "amd_temperature"} & set(record.telemetry_data)
        assert record.gpu_instance_profile == "cpx"
        assert record.telemetry_data["amd_memory_used"] == pytest.approx(
            values[("gpu_used_vram", str(record.gpu_index))] / 1000)


def test_parse_names_the_amd_dialect() -> None:
    summary = dialect_summary(["gpu_package_power", "gpu_energy_consumed"], default_table())
    assert summary.mapped["gpu_energy_consumed"] == ("amd", "amd_energy_consumption")
    assert any("AMD device-metrics-exporter" in line for line in summary.lines())


# The label sets real exporters were seen publishing (tests/data/README.md says where), with values of our own.
ROCM7_LABELS = ('card_model="102-G30211-0C",card_series="AMD Instinct MI300X OAM",card_vendor="AMD",'
                'cluster_name="c1",container="",driver_version="6.14.14",gpu_compute_partition_type="spx",'
                'gpu_id="{gpu}",gpu_memory_partition_type="nps1",gpu_partition_id="NA",'
                'gpu_uuid="b1ff74a1-0000-1000-807e-00000000000{gpu}",hostname="mi300x-b",job_id="",job_partition="",'
                'job_user="",namespace="",pod="",serial_number="69240700100{gpu}",vbios_version="022.040.003.042.000001"')


@pytest.mark.parametrize("compiled", [False, True], ids=["records", "compiled"])
def test_rocm7s_label_set_names_the_gpu_by_its_card_series_and_na_is_no_partition(compiled: bool) -> None:
    lines = [f"{family}{{{ROCM7_LABELS.format(gpu=gpu)}}} {value + gpu}"
             for family, value in (("gpu_package_power", 700.0), ("gpu_energy_consumed", 3.5e13),
                                   ("gpu_gfx_activity", 40.0)) for gpu in (0, 1)]
    got = {r.gpu_index: r for r in records_of(("\n".join(lines) + "\n").encode(), compiled=compiled)}
    assert sorted(got) == [0, 1]
    for gpu, record in got.items():
        assert record.gpu_model_name == "AMD Instinct MI300X OAM"  # not the part number in card_model
        assert record.gpu_uuid == f"69240700100{gpu}" and record.gpu_instance_id is None  # SPX: "NA", no partition
        assert record.telemetry_data["amd_power"] == 700.0 + gpu
        assert record.telemetry_data["amd_energy_consumption"] == pytest.approx((3.5e13 + gpu) * 1e-12)
        assert record.telemetry_data["amd_gfx_activity"] == 40.0 + gpu


def test_a_workstation_gpu_with_blank_model_and_serial_is_one_unpartitioned_gpu_keyed_by_host_and_index() -> None:
    labels = ('card_model="",container="",gpu_compute_partition_type="none",gpu_id="0",gpu_memory_partition_type='
              '"none",gpu_partition_id="0",hostname="apu-box",job_id="",job_partition="",job_user="",namespace="",'
              'pod="",serial_number=""')
    (record,) = records_of(f"gpu_average_package_power{{{labels}}} 0\n".encode(), compiled=False)
    assert (record.gpu_uuid, record.gpu_model_name, record.gpu_instance_id) == ("unknown:apu-box:0", None, None)
    assert record.telemetry_data == {"amd_power": 0.0}  # a 0 W reading is a reading (blank labels are absent)


def test_the_first_exporters_upper_case_labels_without_gpu_id_give_no_gpu() -> None:
    # The open-sourced exporter's own sample page (tools/metricutil) labels GPUs GPU_UUID and SERIAL_NUMBER only:
    # without a GPU index nothing says which GPU a line is, so no record is made (the console then says the
    # endpoint answered without a sample).
    body = b'gpu_average_package_power{GPU_UUID="0a0b0c0d-4200-4242-0000-000000000001",SERIAL_NUMBER="1"} 40\n'
    assert records_of(body, compiled=False) == []
