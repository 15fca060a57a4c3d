"""AMD GPUs' totals everywhere the NVIDIA ones are: AIPerf's `amd_*` family in the JSON, the console's energy line,
the HTML's cards and phase table, the per-phase files' per-GPU energy and the verdict, with the same uncertainty;
in a mixed run each vendor's own total, never one summed into the other. Records built by hand from constant
power (so every figure is known exactly)."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from bridge.cli import main
from bridge.report import build_report
from bridge.report.build import Report
from bridge.report.console import render_console
from bridge.report.html import render_html
from bridge.report.window import Phase
from bridge.report.write import write_report
from bridge.samples import GpuRecord
from tests.report.helpers import T0, S, rec, write_events, write_log

NVIDIA_W, AMD_W = 300.0, 500.0
AMD_URL = "http://mi300x:5000/metrics"
PHASES = [Phase("warmup", "warmup", 0, T0, T0 + 20 * S), Phase("profiling", "profiling", 1, T0 + 20 * S, T0 + 50 * S)]


def amd(t_ns: int, watts: float, energy_mj: float, index: int = 0) -> GpuRecord:
    """An AMD GPU's record as the device-metrics-exporter dialect and the amdsmi source write it (MJ, W)."""
    return dataclasses.replace(
        rec(t_ns, {"amd_power": watts, "amd_energy_consumption": energy_mj, "amd_gfx_activity": 80.0},
            uuid=f"69225100123{index}", index=index, url=AMD_URL, model="AMD Instinct MI300X"),
        platform="amd", device=f"amd{index}")


def nvidia(t_ns: int, watts: float, energy_mj: float) -> GpuRecord:
    return rec(t_ns, {"nvidia_power_usage": watts, "nvidia_energy_consumption": energy_mj})


def run_records(*, with_nvidia: bool, amd_glitch_at_s: int | None = None) -> list[GpuRecord]:
    """One scrape a second over 60 s from T0: an AMD GPU at 500 W (and an NVIDIA one at 300 W)."""
    out = []
    for k in range(61):
        t = T0 + k * S
        out.append(amd(t, AMD_W, 0.0 if k == amd_glitch_at_s else 2.0 + AMD_W * k * 1e-6))
        if with_nvidia:
            out.append(nvidia(t, NVIDIA_W, 5.0 + NVIDIA_W * k * 1e-6))
    return out


def build(records: list[GpuRecord]) -> Report:
    return build_report(records, phases=PHASES, requests_end_ns=T0 + 50 * S, grace_ns=0)


def phase_rows(page: str) -> list[dict[str, str]]:
    """The HTML phase table's rows: each <tr>'s data-* attributes, by name."""
    return [dict(re.findall(r'data-([\w-]+)="([^"]*)"', tr)) for tr in re.findall(r"<tr data-[^>]*>", page)]


def console_text(report: Report, width: int = 200) -> str:
    out = io.StringIO()
    render_console(report, Console(file=out, width=width, color_system=None))
    return out.getvalue()


def test_an_amd_run_writes_aiperfs_amd_family_with_its_uncertainty_and_no_nvidia_key(tmp_path: Path) -> None:
    write_report(build(run_records(with_nvidia=False)), tmp_path)
    doc = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert doc["amd_total_gpu_energy"]["avg"] == pytest.approx(AMD_W * 30)  # the profiling phase, 30 s
    assert doc["amd_average_gpu_power"]["avg"] == pytest.approx(AMD_W)
    assert doc["amd_total_gpu_power"]["avg"] == pytest.approx(AMD_W)
    assert doc["amd_total_gpu_energy"]["uncertainty"] >= 0 and "bound" in doc["amd_total_gpu_energy"]
    assert not [k for k in doc if k.startswith("nvidia_")]
    measurement = doc["telemetry_data"]["measurement"]
    assert measurement["valid"] and measurement["amd_energy_source"] == "dcgm_counter"
    assert "energy_source" not in measurement  # no NVIDIA GPU: nothing said of NVIDIA energy
    gpu = measurement["gpus"]["mi300x:5000"]
    (entry,) = gpu.values()
    assert entry["energy_source"] == "counter" and "uncertainty_j" in entry and entry["counter_power_agree"]


def test_the_console_prints_the_amd_energy_line_and_the_verdict() -> None:
    text = console_text(build(run_records(with_nvidia=False)))
    line = next(ln for ln in text.splitlines() if "energy," in ln)
    assert re.match(r"AMD energy, 1 GPU: total GPU energy 15\.00 kJ ± [\d.]+ \w?J, total average power 500\.00 W",
                    line), line
    assert "NVIDIA" not in text.replace("NVIDIA H100", "")
    assert text.rstrip().endswith("measurement valid")


def test_a_mixed_run_shows_each_vendors_total_never_their_sum(tmp_path: Path) -> None:
    report = build(run_records(with_nvidia=True))
    lines = [ln for ln in console_text(report).splitlines() if " energy, " in ln]
    assert [ln.split(":")[0] for ln in lines] == ["NVIDIA energy, 1 GPU", "AMD energy, 1 GPU"]
    assert "total GPU energy 9.00 kJ" in lines[0] and "total average power 300.00 W" in lines[0]
    assert "total GPU energy 15.00 kJ" in lines[1] and "total average power 500.00 W" in lines[1]
    write_report(report, tmp_path)
    doc = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert doc["nvidia_total_gpu_energy"]["avg"] == pytest.approx(NVIDIA_W * 30)
    assert doc["amd_total_gpu_energy"]["avg"] == pytest.approx(AMD_W * 30)
    energy_keys = [k for k in doc if k.endswith("_total_gpu_energy")]
    assert energy_keys == ["amd_total_gpu_energy", "nvidia_total_gpu_energy"]  # AIPerf's order: platforms sorted
    measurement = doc["telemetry_data"]["measurement"]
    assert measurement["energy_source"] == measurement["amd_energy_source"] == "dcgm_counter"


def test_the_html_has_each_vendors_cards_and_phase_rows() -> None:
    page = render_html(build(run_records(with_nvidia=True)))
    cards = dict(re.findall(r'<div class="card"><span>([^<]+)</span><b>(?:<code>)?([^<]+)', page))
    assert cards["NVIDIA energy (profiling)"].startswith("9.00 kJ ± ")
    assert cards["AMD energy (profiling)"].startswith("15.00 kJ ± ")
    assert cards["AMD total average power, 1 GPU"] == "500 W"
    assert "Energy (profiling)" not in cards
    rows = phase_rows(page)
    assert {(r["phase"], r["vendor"]): float(r["energy-j"]) for r in rows} == pytest.approx({
        ("warmup", "NVIDIA"): NVIDIA_W * 20, ("warmup", "AMD"): AMD_W * 20,
        ("profiling", "NVIDIA"): NVIDIA_W * 30, ("profiling", "AMD"): AMD_W * 30})


def test_an_nvidia_only_page_keeps_its_unnamed_cards_and_rows() -> None:
    records = [r for r in run_records(with_nvidia=True) if r.platform == "nvidia"]
    page = render_html(build(records))
    cards = dict(re.findall(r'<div class="card"><span>([^<]+)</span><b>(?:<code>)?([^<]+)', page))
    assert cards["Energy (profiling)"].startswith("9.00 kJ ± ")  # 300 W for the profiling phase's 30 s
    assert cards["Total average power, 1 GPU"] == "300 W"
    rows = phase_rows(page)
    assert {r["phase"]: float(r["energy-j"]) for r in rows} == pytest.approx({"warmup": NVIDIA_W * 20,
                                                                             "profiling": NVIDIA_W * 30})
    assert "data-vendor" not in page and not [k for k in cards if "NVIDIA" in k or "AMD" in k]


def test_the_phase_files_give_amd_per_gpu_energy_the_same_bound_and_uncertainty_as_nvidia(tmp_path: Path) -> None:
    write_report(build(run_records(with_nvidia=True)), tmp_path)
    doc = json.loads((tmp_path / "phases" / "warmup" / "gpu_telemetry.json").read_text())
    endpoints = doc["data"]["endpoints"]
    (amd_gpu,) = endpoints["mi300x:5000"]["gpus"].values()
    (nvidia_gpu,) = endpoints["127.0.0.1:19401"]["gpus"].values()
    amd_energy = amd_gpu["metrics"]["amd_energy_consumption"]
    nvidia_energy = nvidia_gpu["metrics"]["nvidia_energy_consumption"]
    assert amd_energy["avg"] == pytest.approx(AMD_W * 20 * 1e-6)
    assert set(amd_energy) == set(nvidia_energy) >= {"unit", "avg", "bound", "uncertainty"}


def test_an_amd_counter_glitch_is_dropped_counted_and_named_by_the_verdict() -> None:
    report = build(run_records(with_nvidia=False, amd_glitch_at_s=35))
    assert report.amd_energy is not None
    assert report.amd_energy.total_energy_j == pytest.approx(AMD_W * 30)  # the 0 read is not a reset
    measurement = report.telemetry_data["measurement"]
    assert measurement["reasons"] == ["counter_glitch"]
    assert "measurement NOT valid: counter_glitch" in console_text(report)


def test_validate_rechecks_the_amd_family_against_the_record_log(tmp_path: Path) -> None:
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", run_records(with_nvidia=True))
    events = write_events(tmp_path / "gpu_telemetry_events.jsonl", [
        {"type": "configured", "time_ns": T0 - 3 * S, "run_id": "r1", "counter_mode": "interpolated"},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "start", "time_ns": T0 + 20 * S},
        {"type": "complete", "time_ns": T0 + 60 * S, "requests_end_ns": T0 + 50 * S, "collection_complete": True}])
    built = CliRunner().invoke(main, ["report", "--jsonl", str(log), "--events", str(events)])
    assert built.exit_code == 0, built.output
    assert CliRunner().invoke(main, ["validate", str(tmp_path)]).exit_code == 0
    path = tmp_path / "profile_export_aiperf.json"
    doc = json.loads(path.read_text())
    energy = doc["amd_total_gpu_energy"]
    path.write_text(json.dumps({**doc, "amd_total_gpu_energy": {**energy, "avg": energy["avg"] * (1 + 1e-6)}}))
    result = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert result.exit_code == 1 and "/amd_total_gpu_energy/avg" in result.output  # a millionth off: found


def test_aiperf_mode_gives_the_amd_family_by_aiperfs_own_rule() -> None:
    report = build_report(run_records(with_nvidia=True), phases=PHASES, requests_end_ns=T0 + 50 * S, grace_ns=0,
                          counter_mode="aiperf")
    assert report.amd_energy is not None and report.amd_energy.source == "dcgm_counter"
    # AIPerf's delta runs from its reference scrape, the one before the window: 31 s of each GPU's constant power
    assert report.amd_energy.total_energy_j == pytest.approx(AMD_W * 31)
    assert report.energy.total_energy_j == pytest.approx(NVIDIA_W * 31)
