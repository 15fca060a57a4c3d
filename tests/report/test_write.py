"""Writing: the JSON merge, the CSV section, the phase files, the energy metrics."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import orjson
import pytest

from bridge.report import build_report, write_report
from bridge.report.build import Report
from bridge.report.energy import ENERGY_FAMILY, EnergyTotals, energy_metrics
from bridge.report.window import explicit_window
from bridge.report.write import ReportWriteError, format_csv_number
from bridge.samples import PhaseMark
from tests.report.helpers import T0, S, rec

WINDOW = explicit_window(T0, T0 + 10 * S)


def _report(**kwargs: object) -> Report:
    records = [rec(T0 + i * S // 3, {"nvidia_power_usage": 300.0, "nvidia_temperature": 60.0,
                                      "nvidia_energy_consumption": 1.0 + i * 100e-6, "nvidia_xid_errors": 0.0},
                   namespace="bench")
               for i in range(-3, 33)]
    return build_report(records, **({"window": WINDOW} | kwargs))  # type: ignore[arg-type]


def test_merging_keeps_every_other_key_and_its_order(tmp_path: Path) -> None:
    target = tmp_path / "profile_export_aiperf.json"
    target.write_bytes(orjson.dumps({"schema_version": "1.4", "request_count": {"unit": "requests", "avg": 20.0},
                                     "telemetry_data": {"old": True}, "input_config": {"model": "m"}}))
    write_report(_report(), tmp_path, write_csv=False)
    doc = orjson.loads(target.read_bytes())
    assert list(doc)[:4] == ["schema_version", "request_count", "telemetry_data", "input_config"]
    assert doc["input_config"] == {"model": "m"} and "old" not in doc["telemetry_data"]
    assert doc["nvidia_total_gpu_energy"]["unit"] == "J"
    assert doc["nvidia_energy_per_request"]["avg"] == pytest.approx(doc["nvidia_total_gpu_energy"]["avg"] / 20)
    assert [p.name for p in tmp_path.iterdir()] == ["profile_export_aiperf.json"]  # no temp file left


def test_the_json_is_two_space_indented_with_raw_utf8(tmp_path: Path) -> None:
    write_report(_report(), tmp_path, write_csv=False)
    text = (tmp_path / "profile_export_aiperf.json").read_text(encoding="utf-8")
    assert '"unit": "°C"' in text and '\n  "telemetry_data": {\n    "summary"' in text


def test_a_missing_file_is_created_and_a_prefix_names_it(tmp_path: Path) -> None:
    written = write_report(_report(), tmp_path / "out", prefix="foo")
    assert [p.name for p in written] == ["foo.json", "foo.csv"]


def test_a_file_that_is_not_a_json_object_is_never_overwritten(tmp_path: Path) -> None:
    target = tmp_path / "profile_export_aiperf.json"
    target.write_text("[1, 2")
    with pytest.raises(ReportWriteError, match="not valid JSON"):
        write_report(_report(), tmp_path)
    assert target.read_text() == "[1, 2"


def test_the_csv_section_has_aiperfs_header_and_one_row_per_gpu_metric(tmp_path: Path) -> None:
    write_report(_report(), tmp_path)
    text = (tmp_path / "profile_export_aiperf.csv").read_bytes().decode()
    assert text.startswith("Endpoint,")  # a CSV we create has no blank rows at its top
    rows = [[], [], *csv.reader(io.StringIO(text))]
    # AIPerf 0.13's MetricsCsvExporter: the optional columns after the statistics.
    assert rows[2] == ["Endpoint", "GPU_Index", "GPU_Name", "GPU_UUID", "Platform", "Metric", "avg", "min", "max",
                       "sum", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "std", "Hostname",
                       "Namespace"]
    by_metric = {row[5]: row[:5] + row[-2:] + row[5:-2] for row in rows[3:]}
    assert list(by_metric) == ["NVIDIA GPU Power Usage (W)", "NVIDIA Energy Consumption (MJ)",
                               "NVIDIA GPU Temperature (°C)", "NVIDIA XID Errors (code)"]
    assert by_metric["NVIDIA GPU Power Usage (W)"][8:11] == ["300.00", "300.00", "300.00"]
    energy = by_metric["NVIDIA Energy Consumption (MJ)"]
    assert energy[8] == "0.003" and energy[9:] == [""] * 13  # readable, not AIPerf's 0.00


def test_rewriting_the_csv_replaces_the_previous_telemetry_section(tmp_path: Path) -> None:
    target = tmp_path / "profile_export_aiperf.csv"
    target.write_bytes(b"Metric,avg\r\nRequest Latency (ms),12.00\r\n")
    write_report(_report(), tmp_path)
    write_report(_report(), tmp_path)
    text = target.read_bytes().decode()
    # AIPerf with its telemetry on would have written the energy in a Metric,Value section.
    assert text.startswith("Metric,avg\r\nRequest Latency (ms),12.00\r\n\r\nMetric,Value\r\n")
    assert text.count("Metric,Value") == 1 and "\r\n\r\n\r\nEndpoint," in text
    assert text.count("Endpoint,GPU_Index") == 1


def test_rewriting_our_own_csv_keeps_one_section_and_no_blank_rows_at_the_top(tmp_path: Path) -> None:
    write_report(_report(), tmp_path)
    write_report(_report(), tmp_path)
    text = (tmp_path / "profile_export_aiperf.csv").read_bytes().decode()
    assert text.startswith("Endpoint,GPU_Index") and text.count("Endpoint,GPU_Index") == 1


def test_phase_files_are_written_with_sorted_keys_only_for_several_phases(tmp_path: Path) -> None:
    marks = [PhaseMark("warmup", "warmup", "start", T0 - S), PhaseMark("warmup", "warmup", "end", T0),
             PhaseMark("profiling", "profiling", "start", T0), PhaseMark("profiling", "profiling", "end", T0 + 10 * S)]
    written = write_report(_report(window=None, marks=marks), tmp_path, write_csv=False)
    phase_path = tmp_path / "phases" / "warmup" / "gpu_telemetry.json"
    assert phase_path in written
    doc = orjson.loads(phase_path.read_bytes())
    assert list(doc) == ["data", "phase", "schema_version", "warnings"]
    assert list(doc["data"]["summary"]) == sorted(doc["data"]["summary"])
    single = write_report(_report(window=None, marks=marks[2:]), tmp_path / "single", write_csv=False)
    assert not any("phases" in p.parts for p in single)


def test_energy_metrics_use_the_benchmarks_token_and_request_counts() -> None:
    totals = EnergyTotals(2000.0, 100.0, 110.0, 20.0, 1, 0, "dcgm_counter")
    out = energy_metrics(totals, {"total_osl": {"unit": "tokens", "avg": 4000.0},
                                  "total_isl": {"unit": "tokens", "avg": 6000.0},
                                  "request_count": {"unit": "requests", "avg": 10.0},
                                  "request_latency": {"unit": "ms", "avg": 500.0},
                                  "output_token_throughput": {"unit": "tokens/sec", "avg": 200.0}})
    assert out["nvidia_total_gpu_energy"] == {"unit": "J", "avg": 2000.0}
    assert out["nvidia_average_gpu_power"] == {"unit": "W", "avg": 100.0}
    assert out["nvidia_total_gpu_power"] == {"unit": "W", "avg": 110.0}
    assert out["nvidia_output_tokens_per_joule"]["avg"] == 2.0
    assert out["nvidia_energy_per_output_token"] == {"unit": "mJ/token", "avg": 500.0}
    assert out["nvidia_energy_per_total_token"]["avg"] == 200.0
    assert out["nvidia_energy_per_request"] == {"unit": "joules/request", "avg": 200.0}
    assert out["nvidia_energy_delay_product"]["avg"] == 100.0
    assert out["nvidia_output_tps_per_watt"]["avg"] == 2.0


def test_without_an_energy_counter_energy_is_the_integral_of_power() -> None:
    records = [rec(T0 + i * S // 4, {"nvidia_power_usage": 200.0}) for i in range(-2, 44)]
    built = build_report(records, window=WINDOW)
    assert built.energy.total_energy_j == pytest.approx(2000.0)
    assert built.energy.source == "power_integration"
    aiperf = build_report(records, window=WINDOW, counter_mode="aiperf")
    assert aiperf.energy.total_energy_j == pytest.approx(2000.0)


def test_aiperfs_energy_per_user_keeps_its_ratio_with_our_energy(tmp_path: Path) -> None:
    target = tmp_path / "profile_export_aiperf.json"
    target.write_bytes(orjson.dumps({"nvidia_total_gpu_energy": {"unit": "J", "avg": 4000.0},
                                     "nvidia_energy_per_user": {"unit": "joules/user", "avg": 1000.0}}))
    write_report(_report(), tmp_path, write_csv=False)
    doc = orjson.loads(target.read_bytes())
    assert doc["nvidia_energy_per_user"]["avg"] == pytest.approx(doc["nvidia_total_gpu_energy"]["avg"] / 4)


@pytest.mark.parametrize(("value", "text"), [(None, ""), (3, "3"), (2.5, "2.50"), (0.0, "0.00"),
                                             (0.002563, "0.002563"), (12345.678, "12345.68")])
def test_csv_numbers_are_aiperfs_two_decimals_unless_that_would_hide_them(value: object, text: str) -> None:
    assert format_csv_number(value) == text


def test_energy_per_user_is_the_energy_over_aiperfs_profiling_concurrency() -> None:
    totals = EnergyTotals(2000.0, 100.0, 110.0, 20.0, 1, 0, "dcgm_counter")
    config = {"input_config": {"phases": [{"kind": "warmup", "concurrency": 2, "exclude_from_results": True},
                                          {"kind": "profiling", "concurrency": 8}]}}
    out = energy_metrics(totals, {**config, "request_count": {"unit": "requests", "avg": 10.0}})
    assert out["nvidia_energy_per_user"] == {"unit": "joules/user", "avg": 250.0}
    assert list(out) == ["nvidia_total_gpu_power", "nvidia_average_gpu_power", "nvidia_total_gpu_energy",
                         "nvidia_energy_per_request", "nvidia_energy_per_user"]  # AIPerf's analyzer order
    rate_run = {"input_config": {"phases": [{"kind": "profiling", "rate": 5.0}]}}
    assert "nvidia_energy_per_user" not in energy_metrics(totals, rate_run)


AIPERF_DOC = {"schema_version": "1.4", "request_count": {"unit": "requests", "avg": 10.0},
              "request_latency": {"unit": "ms", "avg": 500.0, "p50": 480.0, "p99": 900.0},
              "total_osl": {"unit": "tokens", "avg": 4000.0},
              "input_config": {"phases": [{"kind": "profiling", "concurrency": 4}]},
              "was_cancelled": False, "start_time": "2026-01-01T00:00:00", "end_time": "2026-01-01T00:00:10",
              "benchmark_duration": {"unit": "sec", "avg": 10.0}, "request_throughput": {"unit": "requests/sec",
                                                                                       "avg": 1.0}}


def test_telemetry_data_goes_where_aiperf_puts_it_and_the_energy_family_last(tmp_path: Path) -> None:
    target = tmp_path / "profile_export_aiperf.json"
    doc = dict(AIPERF_DOC)
    doc["http_req_total"] = {"unit": "ms", "avg": 1.0}  # an extra metric, after the declared fields
    target.write_bytes(orjson.dumps(doc))
    write_report(_report(), tmp_path, write_csv=False)
    keys = list(orjson.loads(target.read_bytes()))
    assert keys[: keys.index("telemetry_data") + 2] == ["schema_version", "request_count", "request_latency",
                                                        "total_osl", "telemetry_data", "input_config"]
    energy = [k for k in keys if k.startswith("nvidia_")]
    assert keys[-len(energy):] == energy and energy[:3] == ["nvidia_total_gpu_power", "nvidia_average_gpu_power",
                                                            "nvidia_total_gpu_energy"]
    assert "nvidia_energy_per_user" in energy
    write_report(_report(), tmp_path, write_csv=False)  # a second merge replaces in place
    assert list(orjson.loads(target.read_bytes())) == keys


def test_the_energy_rows_join_aiperfs_single_value_section_in_tag_order(tmp_path: Path) -> None:
    (tmp_path / "profile_export_aiperf.json").write_bytes(orjson.dumps(AIPERF_DOC))
    csv_path = tmp_path / "profile_export_aiperf.csv"
    csv_path.write_bytes(b"Metric,avg,min,max,sum,p1,p5,p10,p25,p50,p75,p90,p95,p99,std\r\n"
                         b"Request Latency (ms),500.00,,,,,,,,480.00,,,,900.00,\r\n\r\n"
                         b"Metric,Value\r\nBenchmark Duration (sec),10.00\r\nRequest Count,10.00\r\n"
                         b"Request Throughput (requests/sec),1.00\r\nTotal Output Sequence Length (tokens),4000.00\r\n")
    write_report(_report(), tmp_path)
    write_report(_report(), tmp_path)
    text = csv_path.read_bytes().decode()
    section = text.split("Metric,Value\r\n")[1].split("\r\n\r\n")[0].split("\r\n")
    names = [row.split(",")[0] for row in section]
    assert names[0] == "Benchmark Duration (sec)" and names[-3:] == [
        "Request Count", "Request Throughput (requests/sec)", "Total Output Sequence Length (tokens)"]
    tag_of = {f"{header} ({unit})": tag for tag, header, unit in ENERGY_FAMILY}
    assert [tag_of[n] for n in names[1:-3]] == sorted(tag_of[n] for n in names[1:-3])  # AIPerf sorts by tag
    assert "Energy per User (joules/user)" in names and names.count("Total GPU Energy (J)") == 1
    assert text.count("Endpoint,GPU_Index") == 1 and text.startswith("Metric,avg,")
