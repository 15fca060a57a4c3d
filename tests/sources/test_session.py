"""A run whose GPUs are read through NVML (the fake), end to end: the session's records, the report's energy
against the power curve's exact integral, and a GPU that disappears mid-run. Injected clocks: nothing sleeps."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fields import default_table
from bridge.sidecar.session import Session
from bridge.sources import NVML_SOURCE
from tests.clock import FakeClock
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu, FakeNvml

T0 = 1_780_000_000 * 10**9  # the run's wall-clock zero (ns); the fake's clock is seconds since it
H100 = "GPU-7e3c0a52-6f1a-4c1b-9d3e-000000000001"
LOST = "GPU-7e3c0a52-6f1a-4c1b-9d3e-000000000002"


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml) -> None:
    module = types.ModuleType("pynvml")
    module.__dict__.update(fake_nvml.module_attributes(fake))
    monkeypatch.setitem(sys.modules, "pynvml", module)


def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], until_s: float,
        step_s: float = 0.2) -> tuple[Session, FakeClock]:
    clocks = FakeClock(T0)
    install(monkeypatch, FakeNvml(clocks.monotonic, gpus))
    config = Config(telemetry=TelemetryItems(local=["pynvml"]), default_endpoints=[], artifact_dir=str(tmp_path),
                    collection_interval=step_s, run_id="nvml-run")
    session = Session(config, default_table(), now_ns=clocks.now_ns, monotonic=clocks.monotonic)
    clocks.now = 0.013
    session.configure()  # opens NVML, the baseline read
    loop = session.loops[NVML_SOURCE]
    while clocks.now < until_s:
        clocks.now = round(clocks.now + step_s, 9)
        assert loop.scrape_now()  # the caller's thread reads while the group's thread does not run
    session.complete(requests_end_ns=clocks.now_ns())
    return session, clocks


def report_energy(session: Session, tmp_path: Path, start_s: float, end_s: float) -> dict[str, float]:
    out = tmp_path / f"report-{start_s}-{end_s}.json"
    result = CliRunner().invoke(main, [
        "report", "--jsonl", str(session.records.path), "--start-ns", str(T0 + round(start_s * 1e9)),
        "--end-ns", str(T0 + round(end_s * 1e9)), "--counter-mode", "interpolated", "--grace-ns", "0",
        "-o", str(out)])
    assert result.exit_code == 0, result.output
    return {k: v["avg"] for k, v in json.loads(out.read_text()).items() if k.startswith("nvidia_total_gpu_")}


@pytest.mark.parametrize(("start_s", "end_s"), [(3.05, 9.95), (11.1, 24.3), (26.0, 39.5), (5.0, 44.0)])
def test_the_reports_energy_is_the_curves_exact_integral_within_a_thousandth(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start_s: float, end_s: float) -> None:
    # a 20 ms energy counter, read every 0.2 s off its grid (the counter lags a read by up to 20 ms)
    gpu = FakeGpu(H100, energy_period_s=0.02)
    session, _ = run(tmp_path, monkeypatch, [gpu], until_s=46.0)
    exact = gpu.curve.energy_j(end_s) - gpu.curve.energy_j(start_s)
    got = report_energy(session, tmp_path, start_s, end_s)
    assert got["nvidia_total_gpu_energy"] == pytest.approx(exact, rel=1e-3)


def test_the_session_writes_pynvml_records_with_the_real_hostname(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "gpu-box-7")
    session, _ = run(tmp_path, monkeypatch, [FakeGpu(H100)], until_s=2.0)
    lines = [json.loads(line) for line in session.records.path.read_text().splitlines()]
    assert len(lines) == 12  # the baseline at 0.013 s, ten reads to 2.013 s, and the final boundary read
    assert {(r["telemetry_source_url"], r["hostname"], r["platform"], r["gpu_uuid"]) for r in lines} == {
        ("pynvml://localhost", "gpu-box-7", "nvidia", H100)}
    report = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert list(report["telemetry_data"]["endpoints"]) == ["pynvml://localhost"]


def test_a_gpu_that_disappears_mid_run_keeps_its_records_and_the_other_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session, _ = run(tmp_path, monkeypatch, [FakeGpu(H100), FakeGpu(LOST, lost_at_s=1.0)], until_s=2.0)
    lines = [json.loads(line) for line in session.records.path.read_text().splitlines()]
    last = {uuid: max(r["timestamp_ns"] for r in lines if r["gpu_uuid"] == uuid) for uuid in (H100, LOST)}
    assert last[LOST] < T0 + 1_000_000_000 <= last[H100]
    assert sum(r["gpu_uuid"] == LOST for r in lines) == 5  # the baseline and the reads before 1.0 s


def test_an_amdsmi_run_reports_aiperfs_amd_energy_family_against_the_exact_integral(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fakes import amdsmi as fake_amdsmi
    from tests.fakes.amdsmi import FakeAmdGpu, FakeAmdSmi

    clocks = FakeClock(T0)
    gpus = [FakeAmdGpu("uuid-0", "SN-0"), FakeAmdGpu("uuid-1", "SN-1", energy_offset_j=7.5e6)]
    module = types.ModuleType("amdsmi")
    module.__dict__.update(fake_amdsmi.module_attributes(FakeAmdSmi(clocks.monotonic, gpus)))
    monkeypatch.setitem(sys.modules, "amdsmi", module)
    config = Config(telemetry=TelemetryItems(local=["amdsmi"]), default_endpoints=[], artifact_dir=str(tmp_path),
                    collection_interval=0.2, run_id="amd-run")
    session = Session(config, default_table(), now_ns=clocks.now_ns, monotonic=clocks.monotonic)
    clocks.now = 0.013
    session.configure()
    session.mark_phase("profiling", "profiling", "start", T0 + 8 * 10**9)
    while clocks.now < 30.0:
        clocks.now = round(clocks.now + 0.2, 9)
        assert session.loops["amdsmi://localhost"].scrape_now()
    session.complete(requests_end_ns=T0 + 28 * 10**9)
    report = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    exact = sum(g.curve.energy_j(28.0) - g.curve.energy_j(8.0) for g in gpus)
    assert report["amd_total_gpu_energy"]["unit"] == "J"
    assert report["amd_total_gpu_energy"]["avg"] == pytest.approx(exact, rel=1e-3)
    assert report["amd_average_gpu_power"]["avg"] == pytest.approx(exact / 20.0, rel=1e-3)
    assert "nvidia_total_gpu_energy" not in report
    assert list(report["telemetry_data"]["endpoints"]) == ["amdsmi://localhost"]
