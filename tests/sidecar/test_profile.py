"""End to end: `dcgm-bridge profile -- CMD` with a benchmark that posts phase marks, and the sidecar as a
real process that completes on POST /complete, on SIGTERM, and on a done-marker file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.record_log import read_dicts, read_records
from bridge.sidecar.aiperf import is_aiperf, parse_command
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import start_sidecar, wait_records

BENCHMARK = """
import json, os, sys, time, urllib.request
url = os.environ["DCGM_BRIDGE_CONTROL_URL"]
def post(kind, event, t):
    body = json.dumps({"name": kind, "kind": kind, "event": event, "time_ns": t}).encode()
    token = {"Authorization": "Bearer " + os.environ["DCGM_BRIDGE_CONTROL_TOKEN"]}
    urllib.request.urlopen(urllib.request.Request(url + "/phases", data=body, headers=token)).read()
post("warmup", "start", time.time_ns())
status = json.loads(urllib.request.urlopen(url + "/status").read())
while json.loads(urllib.request.urlopen(url + "/status").read())["records_written"] < status["records_written"] + 4:
    time.sleep(0.02)
t = time.time_ns()
post("warmup", "end", t)
post("profiling", "start", t)
status = json.loads(urllib.request.urlopen(url + "/status").read())
while json.loads(urllib.request.urlopen(url + "/status").read())["records_written"] < status["records_written"] + 8:
    time.sleep(0.02)
post("profiling", "end", time.time_ns())
sys.exit(7)
"""


def _env(monkeypatch, exporter):
    monkeypatch.setenv("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS", f"127.0.0.1:{exporter.port}")
    monkeypatch.setenv("AIPERF_GPU_COLLECTION_INTERVAL", "0.05")


def test_profile_runs_a_benchmark_that_posts_marks_and_reports_its_phases(tmp_path, monkeypatch):
    script = tmp_path / "bench.py"
    script.write_text(BENCHMARK)
    out = tmp_path / "out"
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        _env(monkeypatch, exporter)
        result = CliRunner().invoke(main, ["profile", "--artifact-dir", str(out), "--run-id", "r-42", "--html",
                                           str(out / "report.html"), "--", sys.executable, str(script)])
    assert result.exit_code == 7, result.output  # the benchmark's own exit code
    assert (out / "report.html").read_text().startswith("<!") and "Files:" in result.output
    assert "GPU 0" in result.output  # the console tables
    report = orjson.loads((out / "profile_export_aiperf.json").read_bytes())
    telemetry = report["telemetry_data"]
    gpus = telemetry["endpoints"][f"127.0.0.1:{exporter.port}"]["gpus"]
    assert len(gpus) == 2 and all(g["metrics"]["nvidia_power_usage"]["count"] >= 2 for g in gpus.values())
    assert {p.name for p in (out / "phases").iterdir()} == {"warmup", "profiling"}
    marks = [e for e in read_dicts(out / "gpu_telemetry_events.jsonl") if e["type"] == "phase"]
    assert [(m["name"], m["event"]) for m in marks] == [("warmup", "start"), ("warmup", "end"),
                                                        ("profiling", "start"), ("profiling", "end")]
    assert {r.run_id for r in read_records(out / "gpu_telemetry_export.jsonl")} == {"r-42"}


def test_profile_without_marks_takes_the_phases_from_a_phase_manifest(tmp_path, monkeypatch):
    out = tmp_path / "out"
    nested = out / "model-concurrency1"
    script = tmp_path / "bench.py"
    # A benchmark that, like AIPerf, posts nothing and writes phase_manifest.json in a sub-folder.
    script.write_text(f"""
import json, os, time, urllib.request
url = os.environ["DCGM_BRIDGE_CONTROL_URL"]
start = time.time_ns()
def written():
    return json.loads(urllib.request.urlopen(url + "/status").read())["records_written"]
first = written()
while written() < first + 6:
    time.sleep(0.02)
end = time.time_ns()
os.makedirs({str(nested)!r}, exist_ok=True)
json.dump({{"schema_version": 1, "phases": [{{"phase_index": 0, "phase_kind": "profiling",
    "phase_name": "profiling", "profiling_index": 0, "start_ns": start, "end_ns": end,
    "was_cancelled": False}}]}}, open(os.path.join({str(nested)!r}, "phase_manifest.json"), "w"))
""")
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        _env(monkeypatch, exporter)
        result = CliRunner().invoke(main, ["profile", "--artifact-dir", str(out), "--", sys.executable, str(script)])
    assert result.exit_code == 0, result.output
    manifest = orjson.loads((nested / "phase_manifest.json").read_bytes())["phases"][0]
    summary = orjson.loads((out / "profile_export_aiperf.json").read_bytes())["telemetry_data"]["summary"]
    from datetime import datetime

    start = datetime.fromisoformat(summary["start_time"])
    assert start == datetime.fromtimestamp(manifest["start_ns"] / 1e9).replace(microsecond=start.microsecond)


def test_aiperf_is_told_not_to_collect_gpu_telemetry_itself():
    assert is_aiperf(["/usr/bin/aiperf", "profile"]) and is_aiperf(["python3", "-m", "aiperf", "profile"])
    assert not is_aiperf(["python3", "bench.py"])
    assert parse_command(["aiperf", "profile", "-m", "x"]).argv == ["aiperf", "profile", "-m", "x",
                                                                    "--no-gpu-telemetry"]


def test_aiperfs_gpu_telemetry_flags_and_output_names_are_read_and_taken_over():
    parsed = parse_command(["aiperf", "profile", "--gpu-telemetry", "h1:9400", "h2:9400,h3:9400", "-m", "x",
                            "--no-gpu-telemetry", "--artifact-dir=out/a", "--profile-export-file", "/x/run1.json",
                            "--ui", "dashboard"])
    assert parsed.telemetry_items == ["h1:9400", "h2:9400", "h3:9400"] and parsed.had_no_gpu_telemetry
    assert parsed.argv == ["aiperf", "profile", "-m", "x", "--artifact-dir=out/a", "--profile-export-file",
                           "/x/run1.json", "--ui", "dashboard", "--no-gpu-telemetry"]
    assert (parsed.artifact_dir, parsed.json_name, parsed.csv_name, parsed.ui) == (
        Path("out/a"), "run1.json", "run1.csv", "dashboard")


@pytest.mark.parametrize(("returncode", "cancelled", "received", "error", "code"), [
    (0, False, None, None, 0), (3, True, 2, "x", 3), (-2, True, None, None, 130), (-9, False, None, None, 137),
    (0, True, None, None, 130), (0, True, 15, None, 143), (0, False, None, "disk full", 1)])
def test_the_exit_code_table(returncode, cancelled, received, error, code):
    from bridge.sidecar.profile import exit_code

    assert exit_code(returncode, cancelled, received, error) == code


# -- the sidecar as a process --------------------------------------------------------------------------
def _start_sidecar(tmp_path: Path, exporter: SimulatedExporter, *extra: str,
                   **env_extra: str) -> tuple[subprocess.Popen, str]:
    return start_sidecar(tmp_path / "sidecar.log", exporter.url, tmp_path / "out", *extra, **env_extra)


@pytest.mark.parametrize("how", ["sigterm", "post-complete", "done-file"])
@pytest.mark.slow
def test_the_sidecar_process_completes_and_writes_its_report(tmp_path, how):
    done_file = tmp_path / "done"
    extra = ["--config", str(tmp_path / "c.yaml"), "--run-id", "run-d"]
    (tmp_path / "c.yaml").write_text(f"gpu_telemetry:\n  done_file: {done_file}\n  shutdown_delay: 5\n")
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        process, base = _start_sidecar(tmp_path, exporter, *extra)
        try:
            wait_records(base, 6)
            if how == "sigterm":
                process.send_signal(signal.SIGTERM)
            elif how == "post-complete":
                assert httpx.post(base + "/complete", json={}, timeout=30).json()["completed"]
            else:
                done_file.write_text("run-d 0\n")  # the run id first (kube profile's control plane writes it)
            assert process.wait(60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    out = tmp_path / "out"
    events = list(read_dicts(out / "gpu_telemetry_events.jsonl"))
    assert events[-1]["type"] == "complete" and events[-1]["collection_complete"] is True
    assert json.loads((out / "profile_export_aiperf.json").read_text())["telemetry_data"]["endpoints"]


def test_a_native_sidecar_stays_up_after_complete_until_sigterm(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        process, base = _start_sidecar(tmp_path, exporter, DCGM_BRIDGE_EXIT_ON_COMPLETE="false")
        try:
            wait_records(base, 2)
            assert httpx.post(base + "/complete", json={}, timeout=30).json()["completed"]
            # Still serving (the kubelet would restart an exited native sidecar): complete, not ready.
            assert httpx.get(base + "/healthz", timeout=5).status_code == 200
            assert httpx.get(base + "/status", timeout=5).json()["state"] == "completed"
            assert process.poll() is None
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    completes = [e for e in read_dicts(tmp_path / "out" / "gpu_telemetry_events.jsonl") if e["type"] == "complete"]
    assert len(completes) == 1  # complete is idempotent


# -- signals with any benchmark ----------------------------------------------------------------------------
TRAPPING = """
import signal, sys, time, pathlib
got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
pathlib.Path(sys.argv[1]).write_text("ready")
while not got:
    time.sleep(0.02)
pathlib.Path(sys.argv[2]).write_text(str(len(got)))
sys.exit(0)  # it finished its files and exits 0 after being asked to stop
"""


def test_a_signal_to_profile_is_forwarded_once_and_a_cancelled_run_never_exits_0(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(TRAPPING)
    ready, seen = tmp_path / "ready", tmp_path / "seen"
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        env = {**os.environ, "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "AIPERF_GPU_COLLECTION_INTERVAL": "0.05"}
        process = subprocess.Popen([sys.executable, "-m", "bridge.cli", "profile", "--gpu-telemetry", exporter.url,
                                    "--artifact-dir", str(tmp_path / "out"), "--", sys.executable, str(script),
                                    str(ready), str(seen)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                assert process.poll() is None and time.monotonic() < deadline, process.communicate()
                time.sleep(0.05)
            time.sleep(0.3)  # a few scrapes
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 143, err.decode()[-2000:]  # 128 + SIGTERM, though the benchmark exited 0
    assert seen.read_text() == "1"  # exactly once
    assert orjson.loads((tmp_path / "out" / "profile_export_aiperf.json").read_bytes())["telemetry_data"]["endpoints"]
    assert b"Files:" in out and b"exit 143 (cancelled)" in err


def test_without_the_terminal_to_hand_over_aiperf_is_switched_to_its_simple_ui(tmp_path, monkeypatch, capsys):
    from bridge.config import Config
    from bridge.sidecar import profile as profile_module
    from bridge.sidecar.aiperf import AiperfCommand

    seen = tmp_path / "argv"
    fake = AiperfCommand([sys.executable, "-c", f"import sys; open({str(seen)!r}, 'w').write(' '.join(sys.argv[1:]))",
                          "--no-gpu-telemetry"])
    monkeypatch.setattr(profile_module, "_foreground_terminal", lambda: None)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    run = profile_module.run_profile(Config(enabled=False), None, fake)
    assert run.exit_code == 0 and seen.read_text() == "--no-gpu-telemetry --ui simple"
    assert "AIPerf runs with --ui simple" in capsys.readouterr().err
