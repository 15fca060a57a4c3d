"""The simulator's `amd` dialect: the same GPUs as its DCGM dialects, under AMD device-metrics-exporter's families
and labels, read back into AIPerf's amd_* keys with the same values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.parse import parse_page
from bridge.report import build_report
from bridge.report.window import Phase
from bridge.report.write import write_report
from bridge.samples import GpuRecord
from bridge.simulator import SimulatorConfig
from bridge.simulator.model import NodeModel
from bridge.simulator.render import PageRenderer

T = 1_780_000_000 * 10**9
# The load and memory are the same GPUs'; power, energy and temperatures follow an MI300X's power (136-139 W idle,
# ROCm/device-metrics-exporter PR #558), not an H100's (bridge/simulator/model.py `_physics`).
PAIRS = {"amd_gfx_activity": "nvidia_gpu_utilization", "amd_umc_activity": "nvidia_memory_utilization",
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


# -- the exporter as it ships (issue 44): amd_ names and the 2026 label set ---------------------------------------
RUN_S = 30
PROFILE = [Phase("profiling", "profiling", 0, T + 5 * 10**9, T + 25 * 10**9)]
BENCHMARK = {"total_osl": {"unit": "tokens", "avg": 120_000.0}, "total_isl": {"unit": "tokens", "avg": 480_000.0},
             "request_count": {"unit": "requests", "avg": 400.0}}


def run(dialect: str, url: str, *, gpus: int = 8, seed: int = 44) -> tuple[NodeModel, list[GpuRecord]]:
    """A scrape a second for RUN_S s of a simulated node in `dialect`, normalised."""
    model = NodeModel(SimulatorConfig(gpus=gpus, seed=seed, dialect=dialect), now_ns=lambda: T)
    renderer, normalizer = PageRenderer(model), Normalizer(default_table())
    out: list[GpuRecord] = []
    for k in range(RUN_S + 1):
        t = T + k * 10**9
        out += normalizer.records(parse_page(renderer.page(t)), source_url=url, timestamp_ns=t)
    return model, out


def truth_j(model: NodeModel) -> float:
    return sum(model.energy_joules(g.index, PROFILE[0].start_ns, PROFILE[0].end_ns) for g in model.gpus)


def test_the_amd_dialects_read_as_the_same_gpus_and_values() -> None:
    bare = {(r.gpu_uuid, r.timestamp_ns): r for r in run("amd", "http://n:5000/metrics", gpus=2)[1]}
    for dialect in ("amd-prefixed", "amd-2026"):
        other = {(r.gpu_uuid, r.timestamp_ns): r for r in run(dialect, "http://n:5000/metrics", gpus=2)[1]}
        assert other.keys() == bare.keys(), dialect  # one GPU, one name: the board serial
        for key, record in other.items():
            assert record.telemetry_data == bare[key].telemetry_data and record.gpu_instance_id is None


def test_the_simulated_mi300x_has_the_captures_magnitudes() -> None:
    model, records = run("amd-2026", "http://n:5000/metrics", gpus=8)
    first = [r for r in records if r.timestamp_ns == T]
    assert len(first) == 8 and {r.gpu_model_name for r in first} == {"102-G30211-00"}  # PR #558's card_model
    assert all(len(r.gpu_uuid) == 12 and r.gpu_uuid.isdigit() for r in first)  # serials as real ones
    # ~2e7 J since boot, as amd-smi shows on MI210/MI300 (ROCm/amdsmi#38), never the 1e9 J of a month at full load
    assert all(1e7 < r.telemetry_data["amd_energy_consumption"] * 1e6 < 5e7 for r in first)
    assert all(136 <= p.idle_w <= 139 for p in model._physics)  # PR #558's idle package power


def test_the_8_gpu_page_with_and_without_the_amd_prefix_gives_the_same_report(tmp_path: Path) -> None:
    docs = []
    for dialect in ("amd", "amd-prefixed"):
        model, records = run(dialect, "http://mi300x:5000/metrics")
        folder = tmp_path / dialect
        folder.mkdir()
        write_report(build_report(records, phases=PROFILE, grace_ns=0), folder, benchmark_json=BENCHMARK)
        docs.append(json.loads((folder / "profile_export_aiperf.json").read_text()))
    bare, prefixed = docs
    assert bare == prefixed
    energy = bare["amd_total_gpu_energy"]
    assert energy["avg"] == pytest.approx(truth_j(model), abs=3 * energy["uncertainty"] + 1.0)
    assert len(bare["telemetry_data"]["endpoints"]["mi300x:5000"]["gpus"]) == 8


def test_a_mixed_nvidia_and_amd_run_reports_each_vendors_energy_and_efficiency(tmp_path: Path) -> None:
    nvidia_model, nvidia = run("current", "http://h100:9400/metrics", gpus=2, seed=1)
    amd_model, amd = run("amd-2026", "http://mi300x:5000/metrics", gpus=2, seed=2)
    write_report(build_report([*nvidia, *amd], phases=PROFILE, grace_ns=0), tmp_path, benchmark_json=BENCHMARK)
    doc = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    for vendor, model in (("nvidia", nvidia_model), ("amd", amd_model)):
        energy = doc[f"{vendor}_total_gpu_energy"]
        assert energy["avg"] == pytest.approx(truth_j(model), abs=3 * energy["uncertainty"] + 1.0), vendor
        assert doc[f"{vendor}_energy_per_output_token"]["avg"] == pytest.approx(energy["avg"] * 1e3 / 120_000)
        assert doc[f"{vendor}_output_tokens_per_joule"]["avg"] == pytest.approx(120_000 / energy["avg"])
        assert doc[f"{vendor}_energy_per_request"]["avg"] == pytest.approx(energy["avg"] / 400)
    measurement = doc["telemetry_data"]["measurement"]
    assert measurement["energy_source"] == measurement["amd_energy_source"] == "dcgm_counter"
