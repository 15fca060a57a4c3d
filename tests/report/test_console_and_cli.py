"""The console summary and the `report` command's options and errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from rich.console import Console

from bridge.report import build_report, render_console
from bridge.report.cli import report
from bridge.report.console import format_number, readable_energy
from bridge.report.window import explicit_window
from tests.report.helpers import MS, T0, URL, S, rec, write_events, write_log

URL_B = "http://10.0.0.2:9400/metrics"


def _records() -> list:  # type: ignore[type-arg]
    return [rec(T0 + i * S // 3, {"nvidia_power_usage": 300.0, "nvidia_energy_consumption": 1.0 + i * 100e-6,
                                   "nvidia_xid_errors": 79.0 if i > 5 else 0.0}) for i in range(-3, 33)]


def test_console_lists_reachable_sources_then_one_table_per_gpu_in_readable_units() -> None:
    built = build_report(_records(), window=explicit_window(T0, T0 + 10 * S), endpoints_configured=[URL, URL_B],
                         endpoints_successful=[URL])
    console = Console(record=True, width=140, force_terminal=False)
    render_console(built, console)
    text = console.export_text()
    assert "1/2 telemetry sources reachable" in text
    assert "✔ 127.0.0.1:19401" in text and "✘ 10.0.0.2:9400 (unreachable at configure time)" in text
    assert "127.0.0.1:19401 | GPU 0 | NVIDIA H100 80GB HBM3" in text
    assert "NVIDIA Energy Consumption (kJ)" in text and "3.00" in text  # 3 kJ, not "0.00 MJ"
    assert "NVIDIA XID Errors (code)" in text and "last 79" in text
    # (± the counter's whole mJ at each edge: steady power leaves nothing else, whatever the readings' ages)
    assert "Energy, 1 GPU: total GPU energy 3.00 kJ ± 0.002 J, total average power 300.00 W," in text
    assert text.rstrip().endswith("measurement valid")


def test_at_80_columns_the_tables_stack_short_names_over_their_values_and_nothing_wraps() -> None:
    records = [rec(T0 + i * S // 3, {"nvidia_power_usage": 300.0, "nvidia_ecc_dbe_vol_total": 2.0 + (i > 5)})
               for i in range(-3, 33)]
    built = build_report(records, window=explicit_window(T0, T0 + 10 * S), endpoints_configured=[URL],
                         endpoints_successful=[URL])
    console = Console(record=True, width=80, force_terminal=False)
    render_console(built, console)
    lines = console.export_text().splitlines()
    assert max(map(len, lines)) <= 80
    assert "GPU Power Usage (W)" in lines and "NVIDIA GPU Power Usage (W)" not in lines
    counts = lines[lines.index("ECC Double-Bit Volatile Errors (count)") + 1].split()
    assert counts[0] == "1"  # a count is a whole number, not 1.00
    assert lines[-6:] == ["Energy, 1 GPU:", "  total GPU energy 3.00 kJ ± 0.00 kJ",
                          "  total average power 300.00 W (from the sampled power)",
                          "  over 10.0 s (interpolated counters)",
                          "  summary.end_time adds AIPerf's 0.666 s grace (summary.energy_window)",
                          "measurement valid"]


@pytest.mark.parametrize(("joules", "expected"), [(12.0, (12.0, "J")), (3000.0, (3.0, "kJ")),
                                                  (2.5e6, (2.5, "MJ"))])
def test_energy_is_shown_in_j_kj_or_mj(joules: float, expected: tuple[float, str]) -> None:
    assert readable_energy(joules) == expected


def test_console_numbers_follow_aiperfs_format() -> None:
    assert (format_number(None), format_number(1234.5), format_number(2.5e6)) == ("N/A", "1,234.50", "2.50e+06")


def test_report_from_an_events_file_writes_json_csv_and_prints_tables(tmp_path: Path) -> None:
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", _records())
    events = write_events(tmp_path / "gpu_telemetry_events.jsonl", [
        {"type": "configured", "time_ns": T0 - S, "endpoints_configured": [URL], "endpoints_successful": [URL]},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "start", "time_ns": T0},
        {"type": "complete", "time_ns": T0 + 11 * S, "requests_end_ns": T0 + 10 * S, "collection_complete": True},
    ])
    result = CliRunner().invoke(report, ["--jsonl", str(log), "--events", str(events), "--csv", "--console"])
    assert result.exit_code == 0, result.output
    assert "1/1 telemetry sources reachable" in result.output
    assert (tmp_path / "profile_export_aiperf.csv").exists()
    doc = orjson.loads((tmp_path / "profile_export_aiperf.json").read_bytes())
    assert doc["nvidia_total_gpu_energy"]["avg"] == pytest.approx(3000.0, rel=1e-6)


def test_report_honours_the_grace_from_the_environment(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log.jsonl", _records())
    result = CliRunner().invoke(report, ["--jsonl", str(log), "--start-ns", str(T0), "--end-ns", str(T0 + 5 * S)],
                                env={"AIPERF_GPU_FINAL_SCRAPE_GRACE_NS": str(100 * MS)})
    assert result.exit_code == 0, result.output
    summary = orjson.loads((tmp_path / "profile_export_aiperf.json").read_bytes())["telemetry_data"]["summary"]
    assert summary["end_time"].endswith(".511830")  # 5 s + 100 ms after .411830


@pytest.mark.parametrize(("args", "message"), [
    ([], "give the window"),
    (["--start-ns", "5"], "--start-ns and --end-ns go together"),
    (["--start-ns", "5", "--end-ns", "1"], "ends before it starts"),
])
def test_report_explains_a_missing_or_bad_window(tmp_path: Path, args: list[str], message: str) -> None:
    log = write_log(tmp_path / "log.jsonl", _records())
    result = CliRunner().invoke(report, ["--jsonl", str(log), *args])
    assert result.exit_code != 0 and message in result.output


def test_report_says_when_no_manifest_is_found(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log.jsonl", _records())
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(report, ["--jsonl", str(log), "--phase-manifest", str(tmp_path / "empty")])
    assert result.exit_code != 0 and "no phase_manifest.json at or below" in result.output


def test_report_maps_custom_metrics_from_a_metrics_csv(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log.jsonl", [rec(T0 + i * S, {"nvidia_my_clock": 1500.0}) for i in range(3)])
    custom = tmp_path / "custom.csv"
    custom.write_text("DCGM_FI_DEV_MY_CLOCK, gauge, My clock (in MHz)\n")
    result = CliRunner().invoke(report, ["--jsonl", str(log), "--start-ns", str(T0), "--end-ns", str(T0 + 2 * S),
                                         "--metrics-csv", str(custom), "--csv"])
    assert result.exit_code == 0, result.output
    assert "My Clock (MHz)" in (tmp_path / "profile_export_aiperf.csv").read_text()


def test_importing_the_package_loads_neither_numpy_nor_rich() -> None:
    code = "import sys, bridge.report, bridge.report.cli; print('numpy' in sys.modules, 'rich' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_report_defaults_to_the_live_runs_counter_mode_from_the_events(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log.jsonl", _records())
    events = write_events(tmp_path / "events.jsonl", [
        {"type": "configured", "time_ns": T0 - S, "endpoints_configured": [URL], "endpoints_successful": [URL],
         "counter_mode": "aiperf"},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "start", "time_ns": T0},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "end", "time_ns": T0 + 5 * S},
    ])
    result = CliRunner().invoke(report, ["--jsonl", str(log), "--events", str(events)])
    assert result.exit_code == 0, result.output
    doc = orjson.loads((tmp_path / "profile_export_aiperf.json").read_bytes())
    assert doc["telemetry_data"]["summary"]["counter_mode"] == "aiperf"


def test_the_package_surface_is_pinned_and_every_name_resolves() -> None:
    import bridge.report as package

    assert package.__all__ == [
        "DEFAULT_GRACE_NS", "EndpointState", "Phase", "Report", "ReportWriteError", "RunEvents",
        "SeriesAccumulator", "Window", "WindowError", "build_report", "build_report_from_events", "load_events",
        "load_manifest", "render_console", "write_report",
    ]
    assert all(getattr(package, name) is not None for name in package.__all__)
