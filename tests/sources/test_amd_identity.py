"""AMD identity (issue 44, DESIGN.md "AMD identity"): a GPU is keyed by its board serial, so a local amdsmi and AMD's
exporter on the same node name it alike and de-duplication matches them; the report shows the device UUID where
the source has one (as AIPerf 0.13's amdsmi collector shows amdsmi_get_gpu_device_uuid), the serial beside it."""

from __future__ import annotations

from pathlib import Path

from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.parse import parse_page
from bridge.report import build_report
from bridge.report.window import explicit_window
from bridge.samples import GpuRecord
from bridge.select import Deduplicator
from bridge.sources import AMDSMI_SOURCE
from bridge.sources.amdsmi import AmdSmiReader
from tests.fakes.amdsmi import FakeAmdGpu, FakeAmdSmi
from tests.sources.test_nvml import Clock

DATA = Path(__file__).parents[1] / "data" / "amd"
S = 10**9
ROCM7 = "device-metrics-exporter_pr236_mi300x-oam_rocm7_gfx-activity.txt"  # gpu_uuid and serial_number both
SERIAL, DEVICE_UUID = "692407004236", "a8ff74a1-0000-1000-807e-843c9b9a1d73"  # that line's labels


def exporter_records(body: bytes, url: str, times: range) -> list[GpuRecord]:
    normalizer = Normalizer(default_table())
    return [r for t in times for r in normalizer.records(parse_page(body), source_url=url, timestamp_ns=t * S)]


def gpu_entries(records: list[GpuRecord]) -> list[dict]:
    built = build_report(records, window=explicit_window(2 * S, 8 * S, 0))
    return [g for e in built.telemetry_data["endpoints"].values() for g in e["gpus"].values()]


def test_the_exporters_gpu_is_shown_by_its_device_uuid_with_its_serial_beside() -> None:
    records = exporter_records((DATA / ROCM7).read_bytes(), "http://mi300x:5000/metrics", range(11))
    assert {r.gpu_uuid for r in records} == {SERIAL}  # the key
    [gpu] = gpu_entries(records)
    assert (gpu["gpu_uuid"], gpu["serial_number"]) == (DEVICE_UUID, SERIAL)


def test_a_page_without_gpu_uuid_shows_the_serial_and_a_vf_without_serial_its_uuid() -> None:
    line = (DATA / ROCM7).read_text().splitlines()[-1].replace(f'gpu_uuid="{DEVICE_UUID}",', "")
    [gpu] = gpu_entries(exporter_records(line.encode(), "http://mi300x:5000/metrics", range(11)))
    assert (gpu["gpu_uuid"], gpu["serial_number"]) == (SERIAL, SERIAL)
    vf = (DATA / "device-metrics-exporter_issue171_mi300x-vf_edge-temperature.txt").read_bytes()
    [gpu] = gpu_entries(exporter_records(vf, "http://vf:5000/metrics", range(11)))
    assert gpu["gpu_uuid"] == "17ff74b5-0000-1000-805c-37b0fbe69430" and "serial_number" not in gpu


def test_amdsmi_shows_the_device_uuid_and_dedups_with_the_exporter_by_serial() -> None:
    reader = AmdSmiReader.open(FakeAmdSmi(Clock(3.0), [FakeAmdGpu("uuid-of-device-0", SERIAL)]), hostname="h")
    normalizer = Normalizer(default_table())
    local = [r for t in range(11)
             for r in normalizer.records(parse_page(reader.read_page(t)), source_url=AMDSMI_SOURCE,
                                         timestamp_ns=t * S)]
    [gpu] = gpu_entries(local)
    assert (gpu["gpu_uuid"], gpu["serial_number"]) == ("uuid-of-device-0", SERIAL)
    remote = exporter_records((DATA / ROCM7).read_bytes(), "http://mi300x:5000/metrics", range(1))
    dedup = Deduplicator(["http://mi300x:5000/metrics", AMDSMI_SOURCE])
    dedup.observe("mi300x:5000", [r.identity for r in remote])
    dropped = dedup.observe("amdsmi-local", [r.identity for r in local[:1]])
    assert dropped == {"amdsmi-local": "mi300x:5000"}  # one GPU, one count: the local reader is its duplicate


def test_a_cpx_partition_is_keyed_as_a_partition_of_its_package() -> None:
    kaiwo = (DATA / "kaiwo_mi300x_gfx-activity_via-prometheus.txt").read_bytes()
    records = exporter_records(kaiwo, "http://prometheus:9090", range(11))
    built = build_report(records, window=explicit_window(2 * S, 8 * S, 0))
    keys = sorted(built.telemetry_data["endpoints"]["prometheus:9090"]["gpus"])
    assert keys == ["gpu_0", "gpu_2", "gpu_47_partition0"]  # the CPX line: gpu_id 47, partition 0
