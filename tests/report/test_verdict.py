"""Issue 27: counter sanity, the fallback to the power integral, the validity verdict and its exit codes,
`dcgm-bridge validate`, and GPUs counted apart from their MIG instances."""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from rich.console import Console

from bridge.cli import main
from bridge.report import build_report, render_console
from bridge.report.cli import report
from bridge.report.telemetry_data import gpus_text
from bridge.report.window import explicit_window
from bridge.samples import GpuRecord
from tests.report.helpers import T0, URL, S, rec, write_events, write_log

WATTS = 300.0


def _run(seconds: float = 20.0, *, before: float = 2.0, after: float = 1.0, every_ns: int = S // 3,
         refresh_s: float = 0.0, watts: Any = None, counter: Any = None, **kw: Any) -> list[GpuRecord]:
    """One GPU scraped every `every_ns` from `before` s ahead of T0 to `after` s past T0 + `seconds`; power
    `watts(t_s)` (300 W by default), the counter its integral from 1 MJ (MJ), both seen at their refresh
    instant floor(t / refresh) when `refresh_s`. `counter(t_s, value)` may replace a value."""
    power = watts or (lambda t: WATTS)
    out = []
    t = T0 - round(before * S)
    while t <= T0 + round((seconds + after) * S):
        s = (t - T0) / S
        seen = math.floor(s / refresh_s) * refresh_s if refresh_s else s
        value = 1.0 + _integral(power, -100.0, seen) * 1e-6
        if counter is not None:
            value = counter(s, value)
        out.append(rec(t, {"nvidia_power_usage": power(seen), "nvidia_energy_consumption": value}, **kw))
        t += every_ns
    return out


def _integral(power: Any, a: float, b: float, steps: int = 2000) -> float:
    if power(0.0) == power(1.0) == power(-50.0):  # constant
        return power(0.0) * (b - a)
    h = (b - a) / steps
    return sum(power(a + (i + 0.5) * h) for i in range(steps)) * h


def _built(records: list[GpuRecord], seconds: float = 20.0, **kw: Any) -> Any:
    return build_report(records, window=explicit_window(T0, T0 + round(seconds * S)), **kw)


def _gpu_verdict(built: Any) -> dict[str, Any]:
    (endpoint,) = built.telemetry_data["measurement"]["gpus"].values()
    (gpu,) = endpoint.values()
    return gpu  # type: ignore[no-any-return]


def test_a_clean_run_is_valid_with_an_uncertainty_beside_the_energy() -> None:
    built = _built(_run())
    assert built.energy.total_energy_j == pytest.approx(WATTS * 20, rel=1e-9)
    verdict = built.telemetry_data["measurement"]
    assert verdict["valid"] is True and verdict["reasons"] == []
    assert list(built.telemetry_data)[-2:] == ["error_summary", "measurement"]
    gpu = _gpu_verdict(built)
    assert gpu["coverage"] == 1.0 and gpu["energy_source"] == "counter" and gpu["counter_power_agree"] is True
    metric = built.telemetry_data["endpoints"]["127.0.0.1:19401"]["gpus"]["gpu_0"]["metrics"]
    assert list(metric["nvidia_energy_consumption"])[:3] == ["unit", "avg", "uncertainty"]


@pytest.mark.parametrize(("bad", "kind"), [(0.0, "glitches"), (-5.0, "rejected"), (1e308, "rejected")])
def test_a_glitched_counter_value_is_dropped_and_counted_not_read_as_a_reset(bad: float, kind: str) -> None:
    """The issue's cases: one scrape reading 0 counted the counter's whole lifetime (1,501,276 J for 1,501 J); a
    negative value gave 7.9 MJ for 2.2 kJ; a 1e308 glitch 2e305 J."""
    records = _run(counter=lambda s, v: bad if 9.9 < s < 10.2 else v)
    built = _built(records)
    assert built.energy.total_energy_j == pytest.approx(WATTS * 20, rel=1e-6)
    gpu = _gpu_verdict(built)
    assert gpu[kind] == 1 and gpu.get("resets") is None
    assert built.telemetry_data["measurement"]["reasons"] == ["counter_glitch"]


def test_a_counter_that_stays_low_and_grows_again_is_a_reset() -> None:
    records = _run(counter=lambda s, v: (s - 10.0) * WATTS * 1e-6 if s >= 10.0 else v)
    built = _built(records)
    assert built.energy.total_energy_j == pytest.approx(WATTS * 20, rel=0.01)
    assert _gpu_verdict(built)["resets"] == 1
    assert "counter_reset" in built.telemetry_data["measurement"]["reasons"]


def test_a_dip_at_the_trailing_edge_with_nothing_after_it_is_held_uncertain() -> None:
    records = _run(after=0.4, counter=lambda s, v: 0.0 if s > 20.2 else v)
    built = _built(records)
    gpu = _gpu_verdict(built)
    assert gpu["held"] == 1 and gpu.get("resets") is None
    assert built.energy.total_energy_j == pytest.approx(WATTS * 20, rel=1e-3)


def test_a_5_s_run_on_a_30_s_refresh_is_not_valid_and_its_power_is_the_sampled_power() -> None:
    """The issue's first setup: dcgm-exporter's default 30 s refresh, a 5 s run; the counter's increase spans a
    whole refresh, so counter / 5 s was a made-up power (1,722 W for GPUs drawing 510 W)."""
    watts = lambda t: 255.0 + 40.0 * math.sin(t / 9.0)  # noqa: E731
    records = _run(5.0, before=40.0, after=0.5, refresh_s=30.0, watts=watts)
    built = _built(records, 5.0)
    verdict = built.telemetry_data["measurement"]
    assert verdict["valid"] is False and "too_few_refreshes" in verdict["reasons"]
    assert _gpu_verdict(built)["energy_source"] == "power_integral" and verdict["power_from_samples"] is True
    sampled = [r.telemetry_data["nvidia_power_usage"] for r in records if T0 <= r.timestamp_ns <= T0 + 5 * S]
    assert built.energy.average_power_w == pytest.approx(sum(sampled) / len(sampled), rel=0.05)
    console = Console(record=True, width=500, force_terminal=False)
    render_console(built, console)
    text = console.export_text()
    assert "(from the sampled power)" in text
    assert text.rstrip().splitlines()[-1].startswith("measurement NOT valid: too_few_refreshes — ")


def test_phase_marks_20_hours_off_the_clock_are_outside_the_sampled_span() -> None:
    built = build_report(_run(), window=explicit_window(T0 - 20 * 3600 * S, T0 + 20 * S))
    assert "window_outside_samples" in built.telemetry_data["measurement"]["reasons"]


def test_a_counter_that_disagrees_with_the_power_gauge_is_said_and_the_counter_is_used() -> None:
    records = _run(counter=lambda s, v: 1.0 + (v - 1.0) * 2)  # a counter of twice the energy the gauge shows
    built = _built(records)
    gpu = _gpu_verdict(built)
    assert gpu["counter_power_agree"] is False and gpu["energy_used"] == "counter"
    assert abs(gpu["counter_j"] - gpu["power_integral_j"]) > gpu["disagreement_limit_j"]
    assert built.energy.total_energy_j == pytest.approx(2 * WATTS * 20, rel=1e-6)
    assert built.telemetry_data["measurement"]["reasons"] == ["counter_power_disagree"]


def test_a_gap_in_the_samples_is_not_valid() -> None:
    records = [r for r in _run() if not T0 + 5 * S < r.timestamp_ns < T0 + 9 * S]
    reasons = _built(records).telemetry_data["measurement"]["reasons"]
    assert "sample_gap" in reasons and "low_coverage" in reasons


def test_gpus_and_mig_instances_are_counted_apart() -> None:
    ids = [("a", ("GPU-1", None)), ("a", ("GPU-1", "1")), ("a", ("GPU-1", "2")), ("a", ("GPU-2", "1")),
           ("a", ("GPU-2", "2"))]
    assert gpus_text(ids) == "2 GPUs (4 MIG instances)"
    assert gpus_text(ids[:1]) == "1 GPU"
    assert gpus_text([("a", ("GPU-1", "1"))]) == "1 GPU (1 MIG instance)"


# --- the CLI: exit codes, --require-valid, validate --------------------------------------------------------


def _artifact(tmp_path: Path, records: list[GpuRecord], seconds: float = 20.0, *, gz: bool = False) -> Path:
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", records)
    if gz:
        gz_path = tmp_path / "gpu_telemetry_export.jsonl.gz"
        gz_path.write_bytes(gzip.compress(log.read_bytes()))
        log.unlink()
    write_events(tmp_path / "gpu_telemetry_events.jsonl", [
        {"type": "configured", "time_ns": T0 - 3 * S, "run_id": "r1", "endpoints_configured": [URL],
         "endpoints_successful": [URL], "counter_mode": "interpolated"},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "start", "time_ns": T0},
        {"type": "complete", "time_ns": T0 + round((seconds + 1) * S), "requests_end_ns": T0 + round(seconds * S),
         "collection_complete": True},
    ])
    return tmp_path


def _report(directory: Path, *extra: str) -> Any:
    log = next(directory.glob("gpu_telemetry_export.jsonl*"))
    return CliRunner().invoke(report, ["--jsonl", str(log), "--events", str(directory / "gpu_telemetry_events.jsonl"),
                                       *extra])


def test_a_not_valid_verdict_keeps_exit_0_and_require_valid_makes_it_1(tmp_path: Path) -> None:
    directory = _artifact(tmp_path, [r for r in _run() if not T0 + 5 * S < r.timestamp_ns < T0 + 9 * S])
    plain = _report(directory)
    assert plain.exit_code == 0, plain.output
    assert "measurement NOT valid: low_coverage, sample_gap — " in plain.output
    required = _report(directory, "--require-valid")
    assert required.exit_code == 1
    assert (directory / "profile_export_aiperf.json").exists()  # written all the same


def test_require_valid_on_a_valid_run_exits_0(tmp_path: Path) -> None:
    result = _report(_artifact(tmp_path, _run()), "--require-valid")
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith("measurement valid")
    assert "1 GPU, counter mode interpolated" in result.output


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_validate_rechecks_a_finished_run(tmp_path: Path, gz: bool) -> None:
    directory = _artifact(tmp_path, _run(), gz=gz)
    assert _report(directory).exit_code == 0
    stored = orjson.loads((directory / "profile_export_aiperf.json").read_bytes())
    assert len(stored["telemetry_data"]["measurement"]["record_log"]["sha256"]) == 64
    result = CliRunner().invoke(main, ["validate", str(directory)])
    assert result.exit_code == 0, result.output
    assert "SHA-256 matches" in result.output and "all equal" in result.output
    assert result.output.rstrip().endswith("measurement valid")


def test_validate_finds_a_report_merged_into_aiperfs_folder(tmp_path: Path) -> None:
    directory = _artifact(tmp_path, _run())
    aiperf = tmp_path / "artifacts" / "model-openai-chat-concurrency1"
    aiperf.mkdir(parents=True)
    assert _report(directory, "-o", str(aiperf / "profile_export_aiperf.json")).exit_code == 0
    result = CliRunner().invoke(main, ["validate", str(directory)])
    assert result.exit_code == 0, result.output
    assert f"report: {aiperf / 'profile_export_aiperf.json'}" in result.output


def test_validate_says_when_the_record_log_changed_or_the_report_has_no_hash(tmp_path: Path) -> None:
    directory = _artifact(tmp_path, _run())
    assert _report(directory).exit_code == 0
    log = directory / "gpu_telemetry_export.jsonl"
    log.write_bytes(log.read_bytes().replace(b'"nvidia_power_usage":300.0', b'"nvidia_power_usage":301.0', 1))
    changed = CliRunner().invoke(main, ["validate", str(directory)])
    assert changed.exit_code == 1 and "hash_mismatch" in changed.output
    path = directory / "profile_export_aiperf.json"
    doc = orjson.loads(path.read_bytes())
    del doc["telemetry_data"]["measurement"]["record_log"]
    path.write_bytes(orjson.dumps(doc))
    unhashed = CliRunner().invoke(main, ["validate", str(directory)])
    assert unhashed.exit_code == 1 and "no_hash" in unhashed.output


def test_validate_finds_a_number_that_differs_from_the_record_logs(tmp_path: Path) -> None:
    directory = _artifact(tmp_path, _run())
    assert _report(directory).exit_code == 0
    path = directory / "profile_export_aiperf.json"
    doc = orjson.loads(path.read_bytes())
    doc["nvidia_total_gpu_energy"]["avg"] *= 1 + 1e-6
    path.write_bytes(orjson.dumps(doc))
    result = CliRunner().invoke(main, ["validate", str(directory)])
    assert result.exit_code == 1 and "report_differs" in result.output
    assert "/nvidia_total_gpu_energy/avg" in result.output


def test_validate_exits_2_on_a_folder_without_a_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert result.exit_code == 2
    assert "no gpu_telemetry_events.jsonl" in result.output


def test_a_mig_page_is_counted_as_one_gpu_with_its_instances(tmp_path: Path) -> None:
    records = [r for gi in (None, "1", "2", "3") for r in _run(gi=gi)]
    result = _report(_artifact(tmp_path, records))
    assert result.exit_code == 0, result.output
    assert "1 GPU (3 MIG instances), counter mode" in result.output



SKEWED_BENCHMARK = """
import json, os, time, urllib.request
url = os.environ["DCGM_BRIDGE_CONTROL_URL"]
def post(event, t):
    body = json.dumps({"name": "profiling", "kind": "profiling", "event": event, "time_ns": t}).encode()
    token = {"Authorization": "Bearer " + os.environ["DCGM_BRIDGE_CONTROL_TOKEN"]}  # profile's per-run token
    urllib.request.urlopen(urllib.request.Request(url + "/phases", data=body, headers=token)).read()
def written():
    return json.loads(urllib.request.urlopen(url + "/status").read())["records_written"]
first = written()
while written() < first + 6:
    time.sleep(0.02)
post("start", time.time_ns() - 20 * 3600 * 10**9)  # a benchmark whose clock is 20 h off
post("end", time.time_ns())
"""


@pytest.mark.parametrize(("flags", "code"), [((), 0), (("--require-valid",), 1)], ids=["plain", "require-valid"])
def test_profile_exits_1_on_a_not_valid_verdict_only_with_require_valid(tmp_path: Path, monkeypatch: Any,
                                                                        flags: tuple[str, ...], code: int) -> None:
    import sys

    from bridge.simulator import SimulatedExporter, SimulatorConfig

    script = tmp_path / "bench.py"
    script.write_text(SKEWED_BENCHMARK)
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        monkeypatch.setenv("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS", f"127.0.0.1:{exporter.port}")
        monkeypatch.setenv("AIPERF_GPU_COLLECTION_INTERVAL", "0.05")
        result = CliRunner().invoke(main, ["profile", "--artifact-dir", str(tmp_path / "out"), *flags, "--",
                                           sys.executable, str(script)])
    assert result.exit_code == code, result.output
    (verdict,) = [line for line in result.output.splitlines() if line.startswith("measurement NOT valid: ")]
    assert "window_outside_samples" in verdict


def test_a_record_log_of_two_runs_reports_the_newest_and_says_so(tmp_path: Path) -> None:
    import dataclasses

    older = [dataclasses.replace(r, run_id="r0") for r in _run(20.0, watts=lambda t: 100.0)]
    newer = [dataclasses.replace(r, run_id="r1") for r in _run(20.0)]
    directory = _artifact(tmp_path, older + newer)
    result = _report(directory)
    assert result.exit_code == 0, result.output
    assert "holds 2 runs (r0, r1): reporting run r1 (the newest; --run-id picks another)" in result.output
    assert "1 GPU, counter mode" in result.output
    doc = orjson.loads((directory / "profile_export_aiperf.json").read_bytes())
    gpu = doc["telemetry_data"]["endpoints"]["127.0.0.1:19401"]["gpus"]["gpu_0"]["metrics"]
    assert gpu["nvidia_power_usage"]["avg"] == WATTS
    picked = _report(directory, "--run-id", "r0")
    doc = orjson.loads((directory / "profile_export_aiperf.json").read_bytes())
    assert picked.exit_code == 0 and "reporting run r0 (--run-id)" in picked.output
    assert doc["telemetry_data"]["endpoints"]["127.0.0.1:19401"]["gpus"]["gpu_0"]["metrics"][
        "nvidia_power_usage"]["avg"] == 100.0
    unknown = CliRunner().invoke(main, ["report", "--jsonl", str(directory / "gpu_telemetry_export.jsonl"), "--events",
                                        str(directory / "gpu_telemetry_events.jsonl"), "--run-id", "r9"])
    assert unknown.exit_code == 2 and "--run-id r9: not in" in unknown.output
    validated = CliRunner().invoke(main, ["validate", "--run-id", "r0", str(directory)])
    assert validated.exit_code == 0, validated.output  # run r0, given as `report` was given it
    newest = CliRunner().invoke(main, ["validate", str(directory)])  # the report cannot say which run it holds
    assert newest.exit_code == 1 and "report_differs" in newest.output
    assert "/gpu_0/metrics/nvidia_power_usage/avg: 100.0, rebuilt: 300.0" in newest.output


def test_a_long_counter_whose_every_step_is_implausible_is_checked_in_linear_time() -> None:
    """A counter that climbs faster than its power gauge allows at every one of 40,000 scrapes (an hour at 3 Hz of
    a broken exporter, hostile input) is checked value by value; that walk once re-measured the whole series per
    value (quadratic: minutes at this size). A bound of seconds tells the two apart with room for a loaded CI."""
    import time

    import numpy as np

    from bridge.report.sanity import check_counter

    n = 40_000
    ts = (np.arange(n, dtype=np.int64) * 333_000_000) + 10**18
    counter_mj = np.arange(n, dtype=np.float64) * 0.01  # 10 kJ a scrape: 30 kW
    power_w = np.full(n, 300.0)
    started = time.process_time()
    check = check_counter(ts, counter_mj, power_w)
    assert time.process_time() - started < 20
    assert check.rejected == n - 1 and check.glitches == 0
