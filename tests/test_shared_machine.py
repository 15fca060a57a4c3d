"""Safe on a shared machine (issue 28): one owner per artifact folder, no link below it followed, every
promised output writable at start, credentials only where configured, the record-log reader linear."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bridge.errors import ConfigError
from bridge.fields import default_table
from bridge.sidecar.folder_lock import LOCK_FILE, FolderLock
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.conftest import MOUNT_REMEDY, unavailable
from tests.sidecar.helpers import resumed_report, scrape_synchronously, session_for

_HOLD = """
import sys, time
from pathlib import Path
from bridge.sidecar.folder_lock import FolderLock
lock = FolderLock(Path(sys.argv[1]), sys.argv[2], use_flock=sys.argv[3] == "flock")
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def exporter() -> Iterator[SimulatedExporter]:
    with SimulatedExporter(SimulatorConfig(gpus=1, seed=1)) as sim:
        yield sim


def _holder(folder: Path, run_id: str, kind: str = "flock") -> subprocess.Popen[str]:
    """Another process (another run) holding the folder's lock."""
    process = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder), run_id, kind], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout is not None and process.stdout.readline() == "held\n"
    return process


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    if process.stdout is not None:
        process.stdout.close()


# -- 1. two runs, one folder ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["flock", "lock-file"])
def test_a_second_run_refuses_a_folder_a_live_run_holds_and_names_it(tmp_path: Path, kind: str) -> None:
    holder = _holder(tmp_path, "run-a", kind)
    try:
        with pytest.raises(ConfigError) as refused:
            FolderLock(tmp_path, "run-b", use_flock=kind == "flock").acquire()
        assert f"--artifact-dir {tmp_path} is in use by run run-a (pid {holder.pid})" in str(refused.value)
    finally:
        _kill(holder)


def test_a_second_session_leaves_the_first_runs_live_files_where_they_are(
        exporter: SimulatedExporter, tmp_path: Path) -> None:
    first = session_for([exporter.url], tmp_path, run_id="run-a")
    first.configure()
    scrape_synchronously(first, 2)
    second = session_for([exporter.url], tmp_path, run_id="run-b")
    with pytest.raises(ConfigError, match=r"is in use by run run-a \(pid \d+\)"):
        second.configure()
    assert not (tmp_path / "run-a").exists()
    outputs = first.complete()
    assert outputs.error is None
    assert '"run_id":"run-b"' not in (tmp_path / "gpu_telemetry_export.jsonl").read_text()
    third = session_for([exporter.url], tmp_path, run_id="run-c")  # the folder is free again after complete
    third.configure()
    assert (tmp_path / "run-a" / "gpu_telemetry_export.jsonl").exists()
    third.complete()


@pytest.mark.parametrize("kind", ["flock", "lock-file"])
def test_a_dead_holders_lock_is_taken_over_with_one_line(tmp_path: Path, kind: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    holder = _holder(tmp_path, "run-a", kind)
    _kill(holder)
    lock = FolderLock(tmp_path, "run-b", use_flock=kind == "flock")
    with caplog.at_level(logging.WARNING, "bridge.sidecar.folder_lock"):
        lock.acquire()
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path}: run run-a (pid {holder.pid}) ended without releasing the folder's lock; run run-b takes it over"]
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


@pytest.mark.parametrize("kind", ["flock", "lock-file"])
def test_a_restarted_sidecar_of_the_same_run_takes_its_lock_back(tmp_path: Path, kind: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    holder = _holder(tmp_path, "run-a", kind)
    _kill(holder)
    with caplog.at_level(logging.WARNING, "bridge.sidecar.folder_lock"):
        FolderLock(tmp_path, "run-a", use_flock=kind == "flock").acquire()
    assert "run run-a restarted; it takes back the folder's lock" in caplog.text


def test_a_lock_file_of_another_hosts_process_is_not_taken_over(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text('{"pid": 1, "run_id": "run-a", "host": "elsewhere"}\n')
    with pytest.raises(ConfigError, match="in use by run run-a \\(pid 1 on elsewhere\\)"):
        FolderLock(tmp_path, "run-b", use_flock=False).acquire()


def test_profile_into_a_held_folder_exits_2_before_the_benchmark_runs(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "run-a")
    try:
        marker = tmp_path / "benchmark-ran"
        result = subprocess.run(
            [sys.executable, "-m", "bridge.cli", "profile", "--artifact-dir", str(tmp_path), "--run-id", "run-b",
             "--gpu-telemetry", "http://127.0.0.1:9/metrics", "--", "touch", str(marker)],
            env={**os.environ, "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]"}, capture_output=True, text=True,
            timeout=60)
    finally:
        _kill(holder)
    assert result.returncode == 2, result.stderr
    assert f"is in use by run run-a (pid {holder.pid})" in result.stderr
    assert "Traceback" not in result.stderr and not marker.exists()


# -- 2. no link below the artifact folder is followed ------------------------------------------------------
@pytest.mark.parametrize("name", ["gpu_telemetry_export.jsonl", "gpu_telemetry_events.jsonl",
                                  "profile_export_aiperf.json", "profile_export_aiperf.csv", "phases"])
def test_a_link_planted_under_an_output_name_stops_the_run_naming_it(
        exporter: SimulatedExporter, tmp_path: Path, name: str) -> None:
    folder, outside = tmp_path / "out", tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    (folder / name).symlink_to(outside / "target")  # dangling: the sidecar would have created it
    session = session_for([exporter.url], folder, run_id="run-a")
    with pytest.raises(ConfigError, match=f"{folder / name} is a symbolic link: remove it"):
        session.configure()
    assert list(outside.iterdir()) == []
    other = FolderLock(folder, "run-b")
    other.acquire()  # the refused run let go of the folder
    other.release()


def test_a_planted_spool_link_is_never_written_through(exporter: SimulatedExporter, tmp_path: Path) -> None:
    folder, outside = tmp_path / "out", tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    (folder / ".dcgm-bridge-spool-run-a").symlink_to(outside, target_is_directory=True)
    session = session_for([exporter.url], folder, run_id="run-a")
    session.configure()
    assert session.live_series is not None and session.live_series.spool_dir.parent == folder
    assert not session.live_series.spool_dir.is_symlink() and session.live_series.spool_dir.stat().st_mode & 0o077 == 0
    scrape_synchronously(session, 3)
    assert session.complete().error is None
    assert list(outside.iterdir()) == []


def test_a_report_link_planted_during_the_run_is_not_merged_and_is_named(
        exporter: SimulatedExporter, tmp_path: Path) -> None:
    folder = tmp_path / "out"
    foreign = tmp_path / "someone-elses.json"
    foreign.write_text('{"secret": "theirs"}')
    session = session_for([exporter.url], folder, run_id="run-a")
    session.configure()
    scrape_synchronously(session, 2)
    (folder / "profile_export_aiperf.json").symlink_to(foreign)
    outputs = session.complete()
    assert outputs.error is not None and f"{folder / 'profile_export_aiperf.json'} is a symbolic link" in outputs.error
    assert foreign.read_text() == '{"secret": "theirs"}'
    assert (folder / "profile_export_aiperf.json").is_symlink()


def test_a_link_planted_as_the_record_log_mid_run_is_refused_not_followed(tmp_path: Path) -> None:
    from bridge.record_log import LineWriter

    outside = tmp_path / "victim"
    (tmp_path / "log.jsonl").symlink_to(outside)
    writer = LineWriter(tmp_path / "log.jsonl", flush_interval_s=0.0)
    writer.write_lines([b"{}\n"])
    assert not writer.flush() and writer.last_error is not None and "log.jsonl" in writer.last_error
    assert not outside.exists()
    writer.close()


# -- 3. every promised output is checked writable at start -------------------------------------------------
def test_readyz_turns_503_the_moment_the_record_log_cannot_be_written(exporter: SimulatedExporter,
                                                                       tmp_path: Path) -> None:
    from bridge.config import Config
    from bridge.endpoints import TelemetryItems
    from bridge.sidecar.session import Session

    def refuse(path: Path):  # the disk refuses every write (EACCES), while the folder itself stays writable
        raise PermissionError(13, "Permission denied", str(path))

    config = Config(telemetry=TelemetryItems(urls=[exporter.url]), default_endpoints=[], artifact_dir=str(tmp_path),
                    run_id="run-a", collection_interval=0.05, flush_interval=0.0)
    session = Session(config, default_table(), opener=refuse)
    session.configure()
    reason = session.not_ready()
    assert reason is not None and reason.startswith(f"cannot write {tmp_path}/gpu_telemetry_") \
        and reason.endswith(": Permission denied")
    session.complete()


@contextmanager
def read_only_file(path: Path) -> Iterator[Path]:
    """`path` bind-mounted read-only over itself: a file no one may write (root included, which ignores file
    modes), in a folder that stays writable, as another user's file is; where mounting is not permitted,
    `unavailable` (CI, which runs as root, fails)."""
    path.write_bytes(b"")
    for argv in (["mount", "--bind", str(path), str(path)], ["mount", "-o", "remount,bind,ro", str(path)]):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["umount", str(path)], capture_output=True)
            unavailable(f"cannot bind-mount a read-only file here ({' '.join(argv[:3])}): {done.stderr.strip()}",
                        MOUNT_REMEDY)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.mark.root
def test_a_record_log_that_cannot_be_written_stops_profile_before_the_benchmark(tmp_path: Path) -> None:
    marker = tmp_path / "benchmark-ran"
    with read_only_file(tmp_path / "gpu_telemetry_export.jsonl") as log:
        result = subprocess.run(
            [sys.executable, "-m", "bridge.cli", "profile", "--artifact-dir", str(tmp_path), "--run-id", "run-b",
             "--gpu-telemetry", "http://127.0.0.1:9/metrics", "--", "touch", str(marker)],
            env={**os.environ, "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]"}, capture_output=True, text=True,
            timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"cannot write {log} (Read-only file system)" in result.stderr
    assert "Traceback" not in result.stderr and not marker.exists()


# -- 4. credentials go only where they were configured -----------------------------------------------------
_PAGE = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",modelName="X",Hostname="h"} 40\n'


class _Listener:
    """A real HTTP listener on 127.0.0.1:`port` that answers every GET with a one-GPU page and keeps the
    Authorization header of each request (None when there was none)."""

    def __init__(self, port: int) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen: list[str | None] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                seen.append(self.headers.get("Authorization"))
                self.send_response(200)
                self.send_header("Content-Length", str(len(_PAGE)))
                self.end_headers()
                self.wfile.write(_PAGE)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.server.server_address[1])
        import threading

        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def default_ports() -> Iterator[list[_Listener]]:
    """Listeners on the built-in default ports 9400 and 9401, as any local process (or another container of
    the pod) could open them."""
    listeners: list[_Listener] = []
    try:
        for port in (9400, 9401):
            try:
                listeners.append(_Listener(port))
            except OSError as exc:
                pytest.skip(f"loopback port {port} is taken ({exc.strerror}): cannot stand in for a stranger there")
        yield listeners
    finally:
        for listener in listeners:
            listener.close()


@pytest.mark.parametrize("how", ["token", "basic"])
def test_the_exporter_credentials_never_reach_the_builtin_localhost_defaults(
        default_ports: list[_Listener], tmp_path: Path, how: str) -> None:
    from bridge.config import resolve
    from bridge.sidecar.session import Session

    named = _Listener(0)
    try:
        secret = tmp_path / "secret"
        secret.write_text("s3cret\n")
        env = {"DCGM_BRIDGE_BEARER_TOKEN": "s3cret"} if how == "token" else \
            {"DCGM_BRIDGE_BASIC_AUTH_USER": "me", "DCGM_BRIDGE_BASIC_AUTH_PASSWORD_FILE": str(secret)}
        config = resolve({"gpu_telemetry": (f"http://127.0.0.1:{named.port}/metrics",), "run_id": "run-a",
                          "artifact_dir": str(tmp_path / "out")}, env=env)
        session = Session(config, default_table())
        session.configure()
        session.complete()
    finally:
        named.close()
    expected = "Bearer s3cret" if how == "token" else "Basic bWU6czNjcmV0"
    assert named.seen and set(named.seen) == {expected}
    for listener in default_ports:
        assert listener.seen and set(listener.seen) == {None}, listener.port


def test_defaults_the_user_named_get_the_credentials(default_ports: list[_Listener], tmp_path: Path) -> None:
    from bridge.config import resolve
    from bridge.sidecar.session import Session

    config = resolve({"run_id": "run-a", "artifact_dir": str(tmp_path)},
                     env={"DCGM_BRIDGE_BEARER_TOKEN": "s3cret",
                          "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": '["http://localhost:9400/metrics"]'})
    session = Session(config, default_table())
    session.configure()
    session.complete()
    assert set(default_ports[0].seen) == {"Bearer s3cret"} and default_ports[1].seen == []


# -- 9. the record-log reader is linear and holds at most one line ------------------------------------------
_RECORD = (b'{"gpu_index":0,"gpu_uuid":"GPU-1","timestamp_ns":1700000000000000000,'
           b'"telemetry_source_url":"http://h:9400/metrics","telemetry_data":{"gpu_power_usage":100.0}}\n')


def _log_with_a_long_line(path: Path, junk: int) -> Path:
    import gzip

    body = _RECORD + b"\0" * junk + b"\n" + _RECORD.replace(b"1700000000000000000", b"1700000001000000000")
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(body, 1))
    else:
        path.write_bytes(body)
    return path


@pytest.mark.parametrize("name", ["gpu_telemetry_export.jsonl", "gpu_telemetry_export.jsonl.gz"])
def test_an_endless_line_is_skipped_counted_and_never_held_whole(tmp_path: Path, name: str) -> None:
    import tracemalloc

    from bridge.record_log import read_records

    path = _log_with_a_long_line(tmp_path / name, 24 << 20)
    errors: list[str] = []
    tracemalloc.start()
    try:
        records = list(read_records(path, errors))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [r.timestamp_ns for r in records] == [1700000000000000000, 1700000001000000000]
    assert errors == [f"{path}: the line at byte {len(_RECORD)} has 25,165,824 bytes (over 1,048,576): no record; "
                      "skipped"]
    assert peak < 4 << 20, f"{peak:,} bytes held for a {24 << 20:,}-byte line"  # (it was the line, twice)


def test_a_line_just_under_the_bound_is_still_read(tmp_path: Path) -> None:
    from bridge.record_log import MAX_LINE_BYTES, read_dicts

    padded = _RECORD[:-2] + b', "pad": "' + b"x" * (MAX_LINE_BYTES - len(_RECORD) - 20) + b'"}\n'
    assert len(padded) <= MAX_LINE_BYTES
    path = tmp_path / "log.jsonl"
    path.write_bytes(_RECORD + padded + _RECORD)
    errors: list[str] = []
    assert len(list(read_dicts(path, errors))) == 3 and errors == []


def test_the_report_reader_and_a_restarted_sidecar_skip_an_endless_line(exporter: SimulatedExporter,
                                                                        tmp_path: Path) -> None:
    """The restart path: a sidecar restarted inside its run reads its record log (and events) back for the
    report; a record log holding an endless line gives the report every other record."""

    from bridge.report.series import SeriesAccumulator

    first = session_for([exporter.url], tmp_path, run_id="run-a")
    first.configure()
    scrape_synchronously(first, 2)
    first.records.close()
    first.events.close()
    first.folder_lock.release()  # killed
    log = tmp_path / "gpu_telemetry_export.jsonl"
    before, start = log.read_bytes().count(b"\n"), log.stat().st_size
    with log.open("ab") as f:
        f.write(b"7" * (3 << 20) + b"\n")  # digits: what the kernel's scan would read as one number token
    report = resumed_report(exporter.url, tmp_path, "run-a")
    gpus = next(iter(report["telemetry_data"]["endpoints"].values()))["gpus"]
    assert gpus["gpu_0"]["metrics"]["nvidia_power_usage"]["count"] >= before + 2
    for kernel in (True, False):
        accumulator = SeriesAccumulator()
        accumulator.use_kernel = kernel
        errors: list[str] = []
        accumulator.add_path(log, errors)
        assert errors == [f"{log}: the line at byte {start:,} has 3,145,728 bytes (over 1,048,576): no record; "
                          "skipped"], kernel


# -- 10. smaller holes ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_stale_done_marker_neither_ends_a_new_run_nor_stays(exporter: SimulatedExporter, tmp_path: Path) -> None:
    import httpx

    from tests.sidecar.helpers import start_sidecar

    done = tmp_path / "done"
    done.write_text("run-old 0\n")  # an earlier run's, left on the volume
    process, base = start_sidecar(tmp_path / "log", exporter.url, tmp_path / "out", "--run-id", "run-new",
                                  DCGM_BRIDGE_DONE_FILE=str(done))
    try:
        assert not done.exists()  # removed at start
        done.write_text("0\n")  # a marker without a run id appears meanwhile: ignored and removed too
        deadline = time.monotonic() + 10
        while done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not done.exists()
        assert process.poll() is None and httpx.get(base + "/readyz", timeout=5).json()["state"] == "collecting"
        done.write_text("run-new 0\n")
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log = (tmp_path / "log").read_text()
    assert f"{done} is not run run-new's (it names 'run-old'): removed and ignored" in log
    assert f"{done} is not run run-new's (it names '0'): removed and ignored" in log


@pytest.mark.parametrize("phase,problem", [
    ({"phase_name": "p" * 300, "start_ns": 1, "end_ns": 2}, "phase name 'pppp"),
    ({"phase_name": "backwards", "start_ns": 2, "end_ns": 1}, "phase 'backwards' ends at"),
])
def test_a_bad_manifest_phase_is_refused_before_anything_is_written(
        exporter: SimulatedExporter, tmp_path: Path, caplog: pytest.LogCaptureFixture, phase: dict, problem: str
        ) -> None:
    import json

    session = session_for([exporter.url], tmp_path, run_id="run-a")
    session.configure()
    scrape_synchronously(session, 3)
    now = time.time_ns()
    phase = {**phase, "phase_kind": "profiling", "phase_index": 0,
             "start_ns": now - 10**9 + phase["start_ns"], "end_ns": now - 10**9 + phase["end_ns"]}
    (tmp_path / "phase_manifest.json").write_text(json.dumps({"schema_version": 1, "phases": [phase]}))
    session.config = __import__("dataclasses").replace(session.config, phase_manifest=str(tmp_path))
    with caplog.at_level(logging.WARNING, "bridge.sidecar.finish"):
        outputs = session.complete()
    assert outputs.error is None
    assert "the benchmark's phases are not used (" + problem in caplog.text
    assert "the report covers the whole run" in caplog.text
    assert json.loads((tmp_path / "profile_export_aiperf.json").read_text())["telemetry_data"]["endpoints"]
    assert not (tmp_path / "phases").exists()


class _BlockingSender:
    """A receiver that never answers while the run ends (the OTLP seam, as a hung collector behaves)."""

    def __init__(self) -> None:
        import threading

        self.entered = threading.Event()
        self.release = threading.Event()

    def send(self, parts: list[bytes]):
        from bridge.otlp import SendResult

        self.entered.set()
        self.release.wait(30)
        return SendResult(True, status="200")

    def close(self) -> None:
        self.release.set()


@pytest.mark.slow
def test_otlp_points_still_in_flight_at_exit_count_as_dropped() -> None:
    from bridge.otlp import OtlpConfig, OtlpForwarder
    from tests.otlp.test_export import submit_pages

    sender = _BlockingSender()
    forwarder = OtlpForwarder(OtlpConfig(endpoint="http://127.0.0.1:1/v1/metrics", export_interval_s=0.01),
                              base_resource={}, sender=sender)
    points = submit_pages(forwarder, 2)
    assert sender.entered.wait(10)
    stats = forwarder.close(0.2)
    assert (stats.dropped_points, stats.sent_points) == (points, 0)
    sender.release.set()
    time.sleep(0.2)  # the late answer changes nothing
    assert (forwarder.stats().dropped_points, forwarder.stats().sent_points) == (points, 0)


@pytest.mark.parametrize("content_type,body,rejected,warned", [
    ("text/html; charset=utf-8", b"<html>please log in</html>", 0, True),
    ("application/json", b'{"partialSuccess": {"rejectedDataPoints": "3", "errorMessage": "too old"}}', 3, False),
    ("application/json", b'{"partialSuccess": {"rejectedDataPoints": 4}}', 4, False),
    ("application/x-protobuf", b"", 0, False),
    ("text/plain", b"", 0, False),  # an empty 200 body is a valid answer, whatever its type
])
def test_an_otlp_200_is_read_by_its_content_type(caplog: pytest.LogCaptureFixture, content_type: str, body: bytes,
                                                 rejected: int, warned: bool) -> None:
    from bridge.otlp import HttpSender, OtlpConfig
    from tests.loopback import LoopbackServer, send

    def answer(handler) -> None:
        handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        send(handler, body, content_type=content_type)

    with LoopbackServer(answer) as receiver, caplog.at_level(logging.WARNING, "bridge.otlp.transport"):
        sender = HttpSender(OtlpConfig(endpoint=f"http://u:pw@127.0.0.1:{receiver.port}/v1/metrics"))
        results = [sender.send([b""]) for _ in range(2)]
        sender.close()
    assert [(r.ok, r.rejected_points) for r in results] == [(True, rejected)] * 2
    warnings = [r.getMessage() for r in caplog.records]
    if warned:
        (line,) = warnings  # once, however many answers
        assert f"127.0.0.1:{receiver.port}" in line and "text/html" in line and "pw" not in line
    else:
        assert warnings == []
