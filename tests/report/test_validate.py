"""Issue 43, item 1: `validate` compares everything — every key and value of `telemetry_data`, the energy metrics,
the CSV section and the per-phase files against a rebuild from the record log and the events file, with the
window from the events file's phase marks (or validate's own --start-ns/--end-ns), never from the report.

The truth is the rebuild `report` itself writes from the same files: an honest report and a `report` rebuild of the
marked window pass; each edit below (the issue's cases, and seeded random edits of every kind of leaf and change)
fails with exit 1 and names the key it touched."""

from __future__ import annotations

import math
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from bridge.cli import main
from bridge.report.validate import RELATIVE
from tests.report.helpers import T0, URL, S, rec, write_events, write_log

GRACE_NS = 500_000_000  # not report's default: validate must take the run's from the events file
WARMUP = (T0 - 10 * S, T0 - 1 * S)
PROFILING = (T0, T0 + 6 * S)
ENDPOINT = "127.0.0.1:19401"
GPUS = (("GPU-0000aaaa-bbbb-cccc-dddd-000000000000", 0, lambda t: 300.0 + 50.0 * math.sin(t)),
        ("GPU-1111aaaa-bbbb-cccc-dddd-111111111111", 1, lambda t: 200.0 + 2.0 * t))
# The AIPerf export the report merges into: a concurrency (energy per user), tokens (energy per token) and a
# Metric,Value section in the CSV (the energy rows join it).
AIPERF_JSON = {"schema_version": "1.0", "aiperf_version": "0.13.0", "request_count": {"unit": "requests", "avg": 10},
               "request_latency": {"unit": "ms", "avg": 500.0}, "total_osl": {"unit": "tokens", "avg": 4000},
               "total_isl": {"unit": "tokens", "avg": 1000}, "benchmark_duration": {"unit": "sec", "avg": 6.0},
               "input_config": {"phases": [{"kind": "profiling", "concurrency": 4}]}}
AIPERF_CSV = (b"Metric,avg,min,max,sum,p1,p5,p10,p25,p50,p75,p90,p95,p99,std\r\n"
              b"Request Latency (ms),500.00,,,,,,,,480.00,,,,900.00,\r\n\r\n"
              b"Metric,Value\r\nBenchmark Duration (sec),6.00\r\nRequest Count,10.00\r\n")


def _records() -> Iterator[Any]:
    """Two GPUs scraped every 1/3 s from 12 s before the profiling start to 2 s past its end; the counter (MJ) the
    integral of the power from 1 MJ."""
    for uuid, index, watts in GPUS:
        t = WARMUP[0] - 2 * S
        joules = 1e6
        while t <= PROFILING[1] + 2 * S:
            s = (t - T0) / S
            yield rec(t, {"nvidia_power_usage": watts(s), "nvidia_energy_consumption": joules * 1e-6,
                          "nvidia_gpu_utilization": 50.0 + index, "nvidia_temperature": 60.0 + index},
                      uuid=uuid, index=index)
            joules += watts(s + 1 / 6) * (S // 3) / S
            t += S // 3


def _artifact(directory: Path) -> Path:
    """An honest run: the record log, the events file (two phases), AIPerf's JSON and CSV with the report merged
    in (`report --csv`), and its per-phase files."""
    directory.mkdir(parents=True, exist_ok=True)
    write_log(directory / "gpu_telemetry_export.jsonl", _records())
    write_events(directory / "gpu_telemetry_events.jsonl", [
        {"type": "configured", "time_ns": WARMUP[0] - 3 * S, "run_id": "r1", "endpoints_configured": [URL],
         "endpoints_successful": [URL], "counter_mode": "interpolated", "grace_ns": GRACE_NS},
        {"type": "phase", "name": "warmup", "kind": "warmup", "event": "start", "time_ns": WARMUP[0]},
        {"type": "phase", "name": "warmup", "kind": "warmup", "event": "end", "time_ns": WARMUP[1]},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "start", "time_ns": PROFILING[0]},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "end", "time_ns": PROFILING[1]},
        {"type": "complete", "time_ns": PROFILING[1] + S, "requests_end_ns": PROFILING[1],
         "collection_complete": True},
    ])
    (directory / "profile_export_aiperf.json").write_bytes(orjson.dumps(AIPERF_JSON))
    (directory / "profile_export_aiperf.csv").write_bytes(AIPERF_CSV)
    built = _report(directory)
    assert built.exit_code == 0, built.output
    return directory


def _report(directory: Path, *flags: str) -> Result:
    return CliRunner().invoke(main, ["report", "--jsonl", str(directory / "gpu_telemetry_export.jsonl"),
                                     "--events", str(directory / "gpu_telemetry_events.jsonl"), "--csv", *flags])


def _validate(directory: Path, *flags: str) -> Result:
    return CliRunner().invoke(main, ["validate", str(directory), *flags])


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _artifact(tmp_path_factory.mktemp("honest") / "run")


@pytest.fixture
def run(honest: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(honest, tmp_path / "run"))


def _json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def _edit_report(directory: Path, edit: Any) -> None:
    path = directory / "profile_export_aiperf.json"
    doc = _json(path)
    edit(doc)
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def _gpus(doc: Any) -> Any:
    return doc["telemetry_data"]["endpoints"][ENDPOINT]["gpus"]


def _not_valid(result: Result, reason: str, *paths: str) -> None:
    assert result.exit_code == 1, result.output
    verdict = result.output.rstrip().splitlines()[-1]
    assert verdict.startswith("measurement NOT valid: ") and reason in verdict, result.output
    for path in paths:
        assert path in result.output, (path, result.output)


# --- the honest run and a rebuild of the marked window ------------------------------------------------------


def test_the_honest_report_and_its_files_are_valid(honest: Path) -> None:
    assert sorted(p.relative_to(honest).as_posix() for p in honest.rglob("gpu_telemetry.json")) == [
        "phases/profiling/gpu_telemetry.json", "phases/warmup/gpu_telemetry.json"]
    assert b"Total GPU Energy (J)," in (honest / "profile_export_aiperf.csv").read_bytes()  # the energy rows
    doc = _json(honest / "profile_export_aiperf.json")
    measurement = doc["telemetry_data"]["measurement"]
    assert measurement["window"] == {"start_ns": PROFILING[0], "end_ns": PROFILING[1], "grace_ns": GRACE_NS}
    assert measurement["events"]["file"] == "gpu_telemetry_events.jsonl"
    assert len(measurement["events"]["sha256"]) == 64 and "nvidia_energy_per_user" in doc
    result = _validate(honest)
    assert result.exit_code == 0, result.output
    assert result.output.count("SHA-256 matches the report's") == 2
    assert "(from the events file's phase marks)" in result.output and "all equal" in result.output
    assert result.output.rstrip().endswith("measurement valid")


def test_a_report_rebuild_of_the_marked_window_is_valid(run: Path) -> None:
    assert _report(run).exit_code == 0
    result = _validate(run)
    assert result.exit_code == 0, result.output


def test_a_report_the_sidecar_wrote_is_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`profile` builds from its live series, with the run's grace; validate rebuilds from the files."""
    from bridge.simulator import SimulatedExporter, SimulatorConfig

    script = tmp_path / "bench.py"
    script.write_text(MARKING_BENCHMARK)
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        monkeypatch.setenv("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS", f"127.0.0.1:{exporter.port}")
        monkeypatch.setenv("AIPERF_GPU_COLLECTION_INTERVAL", "0.05")
        monkeypatch.setenv("AIPERF_GPU_FINAL_SCRAPE_GRACE_NS", "200000000")
        result = CliRunner().invoke(main, ["profile", "--artifact-dir", str(tmp_path / "out"), "--",
                                           sys.executable, str(script)])
    assert result.exit_code == 0, result.output
    monkeypatch.delenv("AIPERF_GPU_FINAL_SCRAPE_GRACE_NS")  # validate takes it from the events file
    validated = _validate(tmp_path / "out")
    # The sidecar's own verdict stands: a loaded machine can rightly leave this short window's coverage low
    # (low_coverage); validate must reach the same verdict from the files, with nothing differing.
    stored = _json(tmp_path / "out" / "profile_export_aiperf.json")["telemetry_data"]["measurement"]
    assert validated.exit_code == (0 if stored["valid"] else 1), (stored["reasons"], validated.output)
    assert "all equal to the rebuild's" in validated.output, validated.output
    assert "grace_ns 200000000 (from the events file's phase marks)" in validated.output
    assert validated.output.count("SHA-256 matches the report's") == 2


MARKING_BENCHMARK = """
import json, os, time, urllib.request
url = os.environ["DCGM_BRIDGE_CONTROL_URL"]
token = {"Authorization": "Bearer " + os.environ["DCGM_BRIDGE_CONTROL_TOKEN"]}
def post(name, kind, event):
    body = json.dumps({"name": name, "kind": kind, "event": event, "time_ns": time.time_ns()}).encode()
    urllib.request.urlopen(urllib.request.Request(url + "/phases", data=body, headers=token)).read()
def written():
    return json.loads(urllib.request.urlopen(url + "/status").read())["records_written"]
def records(n):
    first = written()
    while written() < first + n:
        time.sleep(0.02)
for name, kind in (("warmup", "warmup"), ("profiling", "profiling")):
    post(name, kind, "start")
    records(12)
    post(name, kind, "end")
"""


def test_a_report_over_a_manifests_window_is_valid_given_that_manifest(run: Path) -> None:
    """`profile -- aiperf` takes the window from AIPerf's phase_manifest.json when no marks were posted."""
    manifest = run / "aiperf" / "phase_manifest.json"
    manifest.parent.mkdir()
    manifest.write_bytes(orjson.dumps({"schema_version": 1, "phases": [
        {"phase_name": "profiling", "phase_kind": "profiling", "phase_index": 0, "profiling_index": 0,
         "start_ns": PROFILING[0] + 2 * S, "end_ns": PROFILING[1]}]}))
    assert _report(run, "--phase-manifest", str(manifest)).exit_code == 0
    given = _validate(run, "--phase-manifest", str(manifest))
    assert given.exit_code == 0, given.output
    assert f"(from {manifest})" in given.output
    _not_valid(_validate(run), "window_differs",
               f"/telemetry_data/measurement/window/start_ns: {PROFILING[0] + 2 * S}, rebuilt: {PROFILING[0]}")


def test_a_report_of_some_pods_gpus_is_valid_given_the_same_pods(run: Path) -> None:
    import dataclasses

    pods = {GPUS[0][0]: ("bench", "llama-0"), GPUS[1][0]: ("other", "train-0")}
    write_log(run / "gpu_telemetry_export.jsonl", (dataclasses.replace(
        r, namespace=pods[r.gpu_uuid][0], pod_name=pods[r.gpu_uuid][1]) for r in _records()))
    built = _report(run, "--gpu-pods", "bench/llama-*")
    assert built.exit_code == 0, built.output
    assert list(_gpus(_json(run / "profile_export_aiperf.json"))) == ["gpu_0"]
    given = _validate(run, "--gpu-pods", "bench/llama-*")
    assert given.exit_code == 0, given.output
    _not_valid(_validate(run), "report_differs", f"/telemetry_data/endpoints/{ENDPOINT}/gpus/gpu_1: absent, rebuilt: ")


def test_the_phases_a_run_took_from_aiperf_are_recorded_as_marks_only_when_marks_say_them_exactly() -> None:
    from bridge.report.window import Phase, phases_from_marks
    from bridge.sidecar.finish import marks_of_phases

    manifest = [Phase("warmup", "warmup", 0, T0 - 9 * S, T0 - S, None),
                Phase("profiling", "profiling", 1, T0, T0 + S, 0)]
    assert phases_from_marks(marks_of_phases(manifest)) == manifest
    cancelled = [Phase("profiling", "profiling", 0, T0, T0 + S, 0, was_cancelled=True)]  # marks have no cancel
    unnumbered = [Phase("profiling", "profiling", 3, T0, T0 + S, 0)]
    unknown_kind = [Phase("decode", "decode", 0, T0, T0 + S, None)]
    assert marks_of_phases(cancelled) == marks_of_phases(unnumbered) == marks_of_phases(unknown_kind) == []
    assert marks_of_phases(None) == []


# --- the cases --------------------------------------------------------------------------------------


def test_the_total_energy_in_kj_is_not_valid(run: Path) -> None:
    def kilojoules(doc: Any) -> None:
        energy = doc["nvidia_total_gpu_energy"]
        energy.update(unit="kJ", avg=energy["avg"] / 1000)

    _edit_report(run, kilojoules)
    _not_valid(_validate(run), "report_differs", '/nvidia_total_gpu_energy/unit: "kJ", rebuilt: "J"',
               "/nvidia_total_gpu_energy/avg: ")


def test_a_gpu_deleted_from_telemetry_data_is_not_valid(run: Path) -> None:
    _edit_report(run, lambda doc: _gpus(doc).pop("gpu_1"))
    _not_valid(_validate(run), "report_differs",
               f"/telemetry_data/endpoints/{ENDPOINT}/gpus/gpu_1: absent, rebuilt: ")


def test_the_total_energy_deleted_is_not_valid(run: Path) -> None:
    _edit_report(run, lambda doc: doc.pop("nvidia_total_gpu_energy"))
    _not_valid(_validate(run), "report_differs", "/nvidia_total_gpu_energy: absent, rebuilt: {")


def test_energy_figures_halved_and_written_as_strings_are_not_valid(run: Path) -> None:
    stored = _json(run / "profile_export_aiperf.json")

    def halved(doc: Any) -> None:
        for tag in ("nvidia_total_gpu_energy", "nvidia_total_gpu_power", "nvidia_energy_per_user"):
            doc[tag]["avg"] = f"{doc[tag]['avg'] / 2:,.0f}"

    _edit_report(run, halved)
    energy = stored["nvidia_total_gpu_energy"]["avg"]
    _not_valid(_validate(run), "report_differs",
               f'/nvidia_total_gpu_energy/avg: "{energy / 2:,.0f}", rebuilt: {orjson.dumps(energy).decode()}',
               "/nvidia_total_gpu_power/avg: \"", "/nvidia_energy_per_user/avg: \"")


def test_a_report_over_another_window_is_valid_only_given_that_window(run: Path) -> None:
    events = (run / "gpu_telemetry_events.jsonl").read_bytes()
    late = [str(PROFILING[0] + 3 * S), str(PROFILING[1])]  # the last 3 s of the 6 s profiling phase
    assert _report(run, "--start-ns", late[0], "--end-ns", late[1]).exit_code == 0
    assert (run / "gpu_telemetry_events.jsonl").read_bytes() == events
    _not_valid(_validate(run), "window_differs",
               f"/telemetry_data/measurement/window/start_ns: {late[0]}, rebuilt: {PROFILING[0]}",
               "/nvidia_total_gpu_energy/avg: ")
    given = _validate(run, "--start-ns", late[0], "--end-ns", late[1])
    assert given.exit_code == 0, given.output
    assert "(from --start-ns/--end-ns)" in given.output
    other = _validate(run, "--start-ns", late[0], "--end-ns", late[1], "--grace-ns", "0")
    _not_valid(other, "window_differs", f"/telemetry_data/measurement/window/grace_ns: {GRACE_NS}, rebuilt: 0")


def test_a_power_value_edited_in_the_csv_is_not_valid(run: Path) -> None:
    path = run / "profile_export_aiperf.csv"
    lines = path.read_bytes().decode().split("\r\n")
    (i, row), *_ = [(i, line) for i, line in enumerate(lines) if ",NVIDIA GPU Power Usage (W)," in line]
    cells = row.split(",")
    stored = cells[6]
    cells[6] = f"{float(stored) * 1.1:.2f}"
    lines[i] = ",".join(cells)
    path.write_bytes("\r\n".join(lines).encode())
    _not_valid(_validate(run), "report_differs",
               f'/profile_export_aiperf.csv/{ENDPOINT}/{GPUS[0][0]}/NVIDIA GPU Power Usage (W)/avg: "{cells[6]}", '
               f'rebuilt: "{stored}"')


def test_an_energy_row_edited_in_aiperfs_section_of_the_csv_is_not_valid(run: Path) -> None:
    path = run / "profile_export_aiperf.csv"
    text = path.read_bytes().decode()
    row = next(line for line in text.split("\r\n") if line.startswith("Total GPU Energy (J),"))
    path.write_bytes(text.replace(row, "Total GPU Energy (J),1.00").encode())
    _not_valid(_validate(run), "report_differs", '/profile_export_aiperf.csv/Metric,Value/Total GPU Energy (J): "1.00"')


def test_an_energy_row_the_rebuild_has_not_is_not_valid(run: Path) -> None:
    path = run / "profile_export_aiperf.csv"
    row = b"Performance per Watt (requests/sec/W),9.00\r\n"  # the JSON has no request throughput: no such row
    path.write_bytes(path.read_bytes().replace(b"Metric,Value\r\n", b"Metric,Value\r\n" + row))
    _not_valid(_validate(run), "report_differs",
               '/profile_export_aiperf.csv/Metric,Value/Performance per Watt (requests/sec/W): "9.00", rebuilt: absent')


def test_a_csv_no_writer_wrote_is_a_difference_not_a_traceback(run: Path) -> None:
    path = run / "profile_export_aiperf.csv"
    path.write_bytes(path.read_bytes() + b'"' + b"x" * 200_000 + b'"\r\n')
    result = _validate(run)
    _not_valid(result, "report_differs", "/profile_export_aiperf.csv: unreadable as CSV (field larger than")
    assert "Traceback" not in result.output


def test_a_row_written_twice_in_the_csv_is_not_valid(run: Path) -> None:
    """A reader may take either copy: one that differs must not hide behind an honest one."""
    path = run / "profile_export_aiperf.csv"
    lines = path.read_bytes().decode().split("\r\n")
    energy = next(i for i, line in enumerate(lines) if line.startswith("Total GPU Energy (J),"))
    power = next(i for i, line in enumerate(lines) if ",NVIDIA GPU Power Usage (W)," in line)
    lines.insert(power, lines[power].replace(",NVIDIA GPU Power Usage (W),", ",NVIDIA GPU Power Usage (W),1"))
    lines.insert(energy, "Total GPU Energy (J),1.00")
    path.write_bytes("\r\n".join(lines).encode())
    _not_valid(_validate(run), "report_differs",
               f"/profile_export_aiperf.csv/{ENDPOINT}/{GPUS[0][0]}/NVIDIA GPU Power Usage (W) (again): a row",
               '/profile_export_aiperf.csv/Metric,Value/Total GPU Energy (J) (again): ')


def test_a_second_report_of_the_same_record_log_is_checked_too(run: Path) -> None:
    """An honest copy beside the report must not vouch for an edited one (`report -o` into AIPerf's folder)."""
    aiperf = run / "artifacts" / "model-concurrency4"
    aiperf.mkdir(parents=True)
    assert _report(run, "-o", str(aiperf / "profile_export_aiperf.json")).exit_code == 0
    assert _validate(run).exit_code == 0
    _edit_report(aiperf, lambda doc: doc["nvidia_total_gpu_energy"].update(unit="kJ"))
    _not_valid(_validate(run), "report_differs",
               '/artifacts/model-concurrency4/profile_export_aiperf.json/nvidia_total_gpu_energy/unit: "kJ"')


def test_an_extra_energy_metric_is_not_valid(run: Path) -> None:
    _edit_report(run, lambda doc: doc.update(nvidia_total_gpu_energy_kj={"unit": "kJ", "avg": 3.0}))
    _not_valid(_validate(run), "report_differs", "/nvidia_total_gpu_energy_kj: {")


def test_a_phase_file_or_csv_that_is_a_link_is_named_not_read(run: Path, tmp_path: Path) -> None:
    """A neighbour's link in a shared folder: root's validate must not read another user's file into its output."""
    secret = tmp_path / "secret.json"
    secret.write_bytes(b'{"data": {"password": "hunter2"}}')
    phase = run / "phases" / "warmup" / "gpu_telemetry.json"
    phase.unlink()
    phase.symlink_to(secret)
    csv_path = run / "profile_export_aiperf.csv"
    csv_path.unlink()
    csv_path.symlink_to(secret)
    result = _validate(run)
    _not_valid(result, "report_differs", "/phases/warmup/gpu_telemetry.json: unreadable (", "is a symbolic link",
               "/profile_export_aiperf.csv: unreadable (")
    assert "hunter2" not in result.output


def test_a_changed_events_file_is_not_valid(run: Path) -> None:
    path = run / "gpu_telemetry_events.jsonl"
    path.write_bytes(path.read_bytes() + b'{"type":"scrape_error","endpoint":"x","time_ns":1,"kind":"timeout"}\n')
    _not_valid(_validate(run), "hash_mismatch")


def test_a_phase_file_deleted_is_not_valid(run: Path) -> None:
    (run / "phases" / "warmup" / "gpu_telemetry.json").unlink()
    _not_valid(_validate(run), "report_differs", "/phases/warmup/gpu_telemetry.json: absent")


def test_validate_refuses_half_a_window_and_a_missing_manifest_with_exit_2(run: Path) -> None:
    half = _validate(run, "--start-ns", str(T0))
    assert half.exit_code == 2 and "--start-ns and --end-ns go together" in half.output
    backwards = _validate(run, "--start-ns", str(T0), "--end-ns", str(T0 - 1))
    assert backwards.exit_code == 2 and "before --start-ns" in backwards.output
    empty = run / "empty"
    empty.mkdir()
    missing = _validate(run, "--phase-manifest", str(empty))
    assert missing.exit_code == 2 and "no phase_manifest.json" in missing.output and "Traceback" not in missing.output


# --- seeded random edits ------------------------------------------------------------------------------------

# (seed, kind): each seed picks the leaf or key and the new value; every kind of leaf (number, string, boolean,
# unit, null) and of change (value, type, key deleted or added, GPU deleted, CSV cell, window) is here.
EDITS = [
    (43001, "number"), (43002, "number"), (43003, "number"), (43004, "number_as_string"),
    (43005, "number_as_string"), (43006, "string"), (43007, "string"), (43008, "string"),
    (43009, "unit"), (43010, "unit"), (43011, "unit"), (43012, "flag"), (43013, "flag"),
    (43014, "key_deleted"), (43015, "key_deleted"), (43016, "key_deleted"), (43017, "key_added"),
    (43018, "key_added"), (43019, "gpu_deleted"), (43020, "gpu_deleted"), (43021, "gpu_deleted"),
    (43022, "csv_cell"), (43023, "csv_cell"), (43024, "window"), (43025, "window"), (43026, "number"),
]
# Checked apart (the hashes against the files, the window against the marks): not random targets.
_APART = ("/telemetry_data/measurement/window", "/telemetry_data/measurement/record_log/sha256",
          "/telemetry_data/measurement/events/sha256")


def _documents(directory: Path) -> dict[str, Path]:
    """JSON pointer prefix → file: the report and each phase file (their paths as validate names them)."""
    out = {"": directory / "profile_export_aiperf.json"}
    for path in sorted(directory.glob("phases/*/gpu_telemetry.json")):
        out[f"/{path.relative_to(directory).as_posix()}"] = path
    return out


def _nodes(node: Any, path: str) -> Iterator[tuple[str, Any, Any, Any]]:
    """(pointer, parent, key, value) of every node below `node` that validate compares (the report's own AIPerf
    keys are AIPerf's)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if path == "" and "telemetry_data" in node and key != "telemetry_data" and not key.startswith("nvidia_"):
            continue
        pointer = f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"
        if any(pointer.startswith(apart) for apart in _APART):
            continue
        yield pointer, node, key, value
        yield from _nodes(value, pointer)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _changed_number(rng: random.Random, value: float) -> float:
    if value == 0:
        return rng.choice([1e-3, 1.0, 250.0])
    factor = rng.choice([1 + 1e-6, 1 - 1e-4, 1.01, 0.5, 2.0, 1000.0, -1.0])
    assert abs(value * factor - value) > RELATIVE * abs(value)
    return value * factor


def _apply(kind: str, rng: random.Random, directory: Path) -> list[str]:
    """Make the edit; the text validate must print (the key's path and the stored value)."""
    if kind == "window":
        start = PROFILING[0] + rng.randrange(1, 30) * S // 10
        end = PROFILING[1] - rng.randrange(0, 20) * S // 10
        assert _report(directory, "--start-ns", str(start), "--end-ns", str(end)).exit_code == 0
        return ["window_differs", f"/telemetry_data/measurement/window/start_ns: {start}, rebuilt: {PROFILING[0]}"]
    if kind == "csv_cell":
        path = directory / "profile_export_aiperf.csv"
        lines = path.read_bytes().decode().split("\r\n")
        header = next(i for i, line in enumerate(lines) if line.startswith("Endpoint,GPU_Index,"))
        titles = lines[header].split(",")
        i = rng.choice([i for i in range(header + 1, len(lines)) if lines[i]])
        cells = lines[i].split(",")
        column = rng.randrange(6, 6 + 14)
        stored = cells[column]
        while cells[column] == stored:  # a change the cell's two decimals show
            cells[column] = f"{_changed_number(rng, float(stored or 0)):.2f}"
        lines[i] = ",".join(cells)
        path.write_bytes("\r\n".join(lines).encode())
        return [f"/profile_export_aiperf.csv/{cells[0]}/{cells[3]}/{cells[5]}/{titles[column]}: \"{cells[column]}\""]
    prefix, path = rng.choice(sorted(_documents(directory).items()))
    doc = _json(path)
    nodes = list(_nodes(doc, ""))
    if kind == "gpu_deleted":
        gpus = [n for n in nodes if n[0].count("/") in (4, 5) and "/gpus/" in n[0] and isinstance(n[3], dict)
                and n[0].rsplit("/", 1)[1] in ("gpu_0", "gpu_1")]
        pointer, parent, key, _ = rng.choice(gpus)
        del parent[key]
        shown = [f"{prefix}{pointer}: absent, rebuilt: "]
    elif kind == "key_deleted":
        pointer, parent, key, _ = rng.choice([n for n in nodes if isinstance(n[1], dict) and n[0] != "/telemetry_data"])
        del parent[key]
        shown = [f"{prefix}{pointer}: absent, rebuilt: "]
    elif kind == "key_added":
        pointer, _, _, node = rng.choice([n for n in nodes if isinstance(n[3], dict)])
        key = f"extra_{rng.randrange(1000)}"
        node[key] = rng.choice([0, 1.5, "x", None, [], {"avg": 1.0}])
        shown = [f"{prefix}{pointer}/{key}: ", "(an extra key)"]
    else:
        if kind in ("number", "number_as_string"):
            leaves = [n for n in nodes if _is_number(n[3])]
        elif kind == "unit":
            leaves = [n for n in nodes if n[2] == "unit" and isinstance(n[3], str)]
        elif kind == "string":
            leaves = [n for n in nodes if isinstance(n[3], str) and n[2] != "unit"]
        else:  # flag: a boolean or a null
            leaves = [n for n in nodes if isinstance(n[3], bool) or n[3] is None]
        pointer, parent, key, value = rng.choice(leaves)
        if kind == "number":
            parent[key] = _changed_number(rng, value)
        elif kind == "number_as_string":
            parent[key] = rng.choice([str(value), f"{value:,}", f"{value:.2f}"])
        elif kind == "unit":
            parent[key] = rng.choice([u for u in ("J", "kJ", "W", "mW", "%", "MiB", "C") if u != value])
        elif kind == "string":
            parent[key] = rng.choice([v for v in (value + "x", value.upper(), value.lower(), "", " " + value)
                                      if v != value])
        else:
            parent[key] = rng.choice([0, "false", "null"]) if value is None else not value
        assert parent[key] != value or type(parent[key]) is not type(value)
        shown = [f"{prefix}{pointer}: {orjson.dumps(parent[key]).decode()[:60]}"]
    if prefix:
        path.write_bytes(orjson.dumps(doc))
    else:
        path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return shown


@pytest.mark.parametrize(("seed", "kind"), EDITS, ids=[f"{seed}-{kind}" for seed, kind in EDITS])
def test_a_seeded_random_edit_is_not_valid_and_named(run: Path, seed: int, kind: str) -> None:
    shown = _apply(kind, random.Random(seed), run)
    result = _validate(run)
    reason = "window_differs" if kind == "window" else "report_differs"
    _not_valid(result, reason, *shown)


def test_the_seeded_edits_cover_every_kind() -> None:
    assert {kind for _, kind in EDITS} == {"number", "number_as_string", "string", "unit", "flag", "key_deleted",
                                           "key_added", "gpu_deleted", "csv_cell", "window"}
    assert len(EDITS) >= 20 and len({seed for seed, _ in EDITS}) == len(EDITS)


def test_a_report_written_in_another_time_zone_is_valid_in_this_one(run: Path) -> None:
    """AIPerf writes the summary's times as naive local time: a report written on a machine in India (UTC+05:30) is
    validated on a CI runner in UTC; the zone is read from the stored start against the marked window, and a start
    time moved by a second is still a difference."""
    import os
    import time
    from datetime import UTC, datetime

    before = os.environ.get("TZ")

    def zone(name: str | None) -> None:
        if name is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = name
        time.tzset()

    try:
        zone("Asia/Kolkata")
        assert _report(run).exit_code == 0
        zone("UTC")
        summary = _json(run / "profile_export_aiperf.json")["telemetry_data"]["summary"]
        written = datetime.fromisoformat(summary["start_time"])
        utc = datetime.fromtimestamp(PROFILING[0] // S, UTC).replace(tzinfo=None)
        assert round((written - utc).total_seconds()) == 5 * 3600 + 1800  # the zone took effect
        result = _validate(run)
        assert result.exit_code == 0, result.output

        def a_second_later(doc: Any) -> None:
            stamp = datetime.fromisoformat(doc["telemetry_data"]["summary"]["start_time"])
            doc["telemetry_data"]["summary"]["start_time"] = stamp.replace(second=(stamp.second + 1) % 60).isoformat()

        _edit_report(run, a_second_later)
        _not_valid(_validate(run), "report_differs", "/telemetry_data/summary/start_time")
    finally:
        zone(before)


# --- a folder of runs: `profile --repeat`'s run_NNNN/, AIPerf's --num-profile-runs profile_runs/run_NNNN/ ----------


def test_each_repeat_below_the_folder_is_validated_and_an_edited_one_is_named(honest: Path, tmp_path: Path) -> None:
    """`profile --repeat 2` writes each repeat as a run of its own in run_NNNN/ and nothing at the top."""
    out = tmp_path / "out"
    for k in (1, 2):
        shutil.copytree(honest, out / f"run_{k:04d}")
    result = _validate(out)
    assert result.exit_code == 0, result.output
    assert "run_0001: measurement valid\n" in result.output and "run_0002: measurement valid\n" in result.output
    assert result.output.rstrip().endswith("measurement valid (2 runs)")
    _edit_report(out / "run_0002", lambda doc: doc["nvidia_total_gpu_energy"].update(unit="kJ"))
    edited = _validate(out)
    _not_valid(edited, "report_differs", "run_0001: measurement valid\n",
               "run_0002: measurement NOT valid: report_differs", '/nvidia_total_gpu_energy/unit: "kJ"')
    assert edited.output.rstrip().endswith("in run_0002")


def _local_time(ns: int) -> str:
    """As AIPerf writes start_time and end_time: this machine's local time, naive, to the µs."""
    from datetime import datetime

    return datetime.fromtimestamp(ns // S).replace(microsecond=ns // 1000 % 1_000_000).isoformat()


def _profile_runs(directory: Path) -> Path:
    """AIPerf's `--num-profile-runs 2` under `profile`: the bridge's report over the whole session at the top, and
    each run's JSON merged with the report of its own window: run 1's from its phase manifest, run 2's from its
    JSON's start_time and end_time (as sidecar/profile.py `_merge_profile_runs` builds them)."""
    halves = ((PROFILING[0], PROFILING[0] + 3 * S), (PROFILING[0] + 3 * S, PROFILING[1]))
    for k, (start, end) in enumerate(halves, 1):
        folder = directory / "profile_runs" / f"run_{k:04d}"
        folder.mkdir(parents=True)
        json_path = folder / "profile_export_aiperf.json"
        json_path.write_bytes(orjson.dumps({**AIPERF_JSON, "start_time": _local_time(start),
                                            "end_time": _local_time(end)}))
        if k == 1:
            (folder / "phase_manifest.json").write_bytes(orjson.dumps({"schema_version": 1, "phases": [
                {"phase_name": "profiling", "phase_kind": "profiling", "phase_index": 0, "profiling_index": 0,
                 "start_ns": start, "end_ns": end}]}))
            window = ["--phase-manifest", str(folder / "phase_manifest.json")]
        else:
            window = ["--start-ns", str(start), "--end-ns", str(end)]
        assert _report(directory, *window, "-o", str(json_path)).exit_code == 0
    return directory


def test_each_of_aiperfs_profile_runs_is_validated_over_its_own_window(run: Path) -> None:
    folder = _profile_runs(run)
    result = _validate(folder)
    assert result.exit_code == 0, result.output
    assert "profile_runs/run_0001: measurement valid\n" in result.output
    assert "profile_runs/run_0002: measurement valid\n" in result.output
    assert result.output.rstrip().endswith("measurement valid (the top report and 2 runs)")
    _edit_report(folder / "profile_runs" / "run_0002", lambda doc: doc["nvidia_total_gpu_energy"].update(avg=1.0))
    edited = _validate(folder)
    _not_valid(edited, "report_differs", "profile_runs/run_0001: measurement valid\n",
               "profile_runs/run_0002: measurement NOT valid: report_differs",
               "(from its JSON's start_time and end_time)", "/nvidia_total_gpu_energy/avg: 1.0")
    assert edited.output.rstrip().endswith("in profile_runs/run_0002")
