"""`report --counter-mode aiperf` over run 1's record log reproduces AIPerf 0.13.0's own numbers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from bridge.report import build_report
from bridge.report.cli import report
from bridge.report.window import explicit_window
from tests.report import run1
from tests.report.helpers import write_log

KEY = "127.0.0.1:19401"


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """AIPerf wrote run 1 on a UTC machine; its naive local times are UTC ones."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _metrics(doc: dict[str, Any]) -> dict[str, Any]:
    gpu = doc["telemetry_data"]["endpoints"][KEY]["gpus"]["gpu_0"]
    metrics: dict[str, Any] = gpu["metrics"]
    return metrics


def _assert_run1_numbers(metrics: dict[str, Any]) -> None:
    power = metrics["nvidia_power_usage"]
    assert list(power) == list(run1.EXPECTED_POWER)
    for stat, expected in run1.EXPECTED_POWER.items():
        if stat == "std":  # the 11 readings are solved from the stats: the std fits to 2e-11
            assert power[stat] == pytest.approx(expected, rel=1e-10)
        else:
            assert power[stat] == expected, stat
    assert metrics["nvidia_energy_consumption"] == {"unit": "MJ", "avg": 0.002562999999999871}
    temperature = metrics["nvidia_temperature"]
    assert (temperature["unit"], temperature["avg"], temperature["p1"], temperature["count"], temperature["sum"]) == \
        ("°C", 102.72727272727273, 100.0, 11, 1130.0)
    assert metrics["nvidia_xid_errors"] == {"unit": "count", "avg": 0.0}
    assert metrics["nvidia_power_violation"] == {"unit": "us", "avg": 11.0}
    assert "nvidia_gpu_utilization" not in metrics  # only the configure-time scrape had it: no data in window


def test_report_in_aiperf_mode_reproduces_run_1_from_explicit_ns(tmp_path: Path, utc: None) -> None:
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", run1.records())
    result = CliRunner().invoke(report, ["--jsonl", str(log), "--start-ns", str(run1.T0),
                                         "--end-ns", str(run1.REQUESTS_END), "--counter-mode", "aiperf"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads((tmp_path / "profile_export_aiperf.json").read_bytes())
    _assert_run1_numbers(_metrics(doc))
    summary = doc["telemetry_data"]["summary"]
    assert {k: summary[k] for k in run1.EXPECTED_SUMMARY} == run1.EXPECTED_SUMMARY
    assert summary["counter_mode"] == "aiperf"
    gpu = doc["telemetry_data"]["endpoints"][KEY]["gpus"]["gpu_0"]
    assert list(gpu) == ["gpu_index", "gpu_name", "gpu_uuid", "platform", "hostname", "metrics"]
    assert doc["telemetry_data"]["error_summary"] == []
    # AIPerf's three keys, in its order; the verdict (issue 27) comes after them.
    assert list(doc["telemetry_data"]) == ["summary", "endpoints", "error_summary", "measurement"]


def test_report_reads_aiperfs_manifest_nested_below_the_directory_given(tmp_path: Path, utc: None) -> None:
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", run1.records())
    nested = tmp_path / "artifacts" / "model-openai-chat-concurrency1"
    nested.mkdir(parents=True)
    (nested / "phase_manifest.json").write_bytes(orjson.dumps(run1.manifest()))
    result = CliRunner().invoke(report, ["--jsonl", str(log), "--phase-manifest", str(tmp_path / "artifacts"),
                                         "--counter-mode", "aiperf", "-o", str(tmp_path / "out.json")])
    assert result.exit_code == 0, result.output
    doc = orjson.loads((tmp_path / "out.json").read_bytes())
    _assert_run1_numbers(_metrics(doc))
    assert doc["telemetry_data"]["summary"]["end_time"] == "2026-12-02T08:48:21.362437"


def test_the_profiling_phase_file_agrees_with_telemetry_data_unlike_aiperfs(tmp_path: Path, utc: None) -> None:
    # AIPerf's own profiling phase file saw 9 samples and 0.002097 MJ for the same phase (§7); ours must
    # use the same window as telemetry_data.
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", run1.records())
    (tmp_path / "phase_manifest.json").write_bytes(orjson.dumps(run1.manifest()))
    result = CliRunner().invoke(report, ["--jsonl", str(log), "--phase-manifest", str(tmp_path / "phase_manifest.json"),
                                         "--counter-mode", "aiperf"])
    assert result.exit_code == 0, result.output
    main = orjson.loads((tmp_path / "profile_export_aiperf.json").read_bytes())["telemetry_data"]
    phase = orjson.loads((tmp_path / "phases" / "profiling" / "gpu_telemetry.json").read_bytes())
    main.pop("measurement")  # the run's verdict (issue 27): in the run's report, not in its phase files
    assert phase["data"] == main
    assert phase["schema_version"] == 1 and phase["warnings"] == []
    assert phase["phase"] == {"end_ns": run1.REQUESTS_END, "phase_index": 1, "phase_kind": "profiling",
                              "phase_name": "profiling", "profiling_index": 0, "start_ns": run1.T0,
                              "was_cancelled": False}
    assert (tmp_path / "phases" / "warmup" / "gpu_telemetry.json").exists()


def test_interpolated_mode_counts_energy_over_exactly_the_window_not_aiperfs_wider_span() -> None:
    window = explicit_window(run1.T0, run1.REQUESTS_END)
    aiperf = build_report(run1.records(), window=window, counter_mode="aiperf", tz=UTC)
    ours = build_report(run1.records(), window=window, tz=UTC)
    gpu = ours.telemetry_data["endpoints"][KEY]["gpus"]["gpu_0"]["metrics"]
    # AIPerf's delta spans [-162.8 ms, +2302.8 ms] for a 2284.6 ms window: ours is smaller.
    assert gpu["nvidia_energy_consumption"]["avg"] < 0.002563
    assert gpu["nvidia_power_usage"]["count"] == 9  # gauges use [start, end]: no cooldown samples
    assert gpu["nvidia_xid_errors"] == {"unit": "code", "last": 0, "max": 0}
    assert aiperf.energy.total_energy_j == pytest.approx(2563.0)
    assert aiperf.energy.average_power_w == pytest.approx(2563.0 / 2.284607)
