"""One run, one record (issue 12 items 3 and 5): a new run moves an earlier run's files into a subfolder
named after it; the same run carries on or leaves its finished files alone; an artifact directory that
cannot be written stops `profile` before the benchmark."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.errors import ConfigError
from bridge.sidecar.finish import manifest_phases
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.conftest import tmpfs
from tests.sidecar.helpers import resumed_report, scrape_synchronously, session_for

QUIET = {"AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "AIPERF_GPU_SHUTDOWN_DELAY": "1"}


@pytest.fixture
def exporter() -> Iterator[SimulatedExporter]:
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=1)) as sim:
        yield sim


def _run(url: str, folder: Path, run_id: str) -> None:
    session = session_for([url], folder, run_id=run_id)
    session.configure()
    scrape_synchronously(session, 2)
    session.complete()


def _run_ids(path: Path) -> set[str]:
    return {json.loads(line).get("run_id") for line in path.read_text().splitlines()}


def test_a_new_run_moves_the_earlier_runs_files_into_a_folder_named_after_it(
        exporter: SimulatedExporter, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _run(exporter.url, tmp_path, "run-a")
    with caplog.at_level(logging.WARNING, "bridge.sidecar.artifacts"):
        _run(exporter.url, tmp_path, "run-b")
    assert f"{tmp_path} held the files of an earlier run (run-a): moved 4 of them into {tmp_path / 'run-a'}/" \
        in caplog.text
    assert _run_ids(tmp_path / "gpu_telemetry_export.jsonl") == {"run-b"}
    assert _run_ids(tmp_path / "run-a" / "gpu_telemetry_export.jsonl") == {"run-a"}
    events = (tmp_path / "gpu_telemetry_events.jsonl").read_text()
    assert events.count('"type":"configured"') == 1 and "run-a" not in events
    earlier = json.loads((tmp_path / "run-a" / "profile_export_aiperf.json").read_text())
    assert earlier["telemetry_data"]["endpoints"]


def test_an_earlier_run_whose_folder_exists_gets_a_numbered_one(exporter: SimulatedExporter, tmp_path: Path) -> None:
    for run_id in ("run-a", "run-b", "run-a", "run-b"):
        _run(exporter.url, tmp_path, run_id)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["run-a", "run-a-2", "run-b"]
    assert _run_ids(tmp_path / "run-a-2" / "gpu_telemetry_export.jsonl") == {"run-a"}


def test_the_same_run_restarted_before_it_completed_carries_on(exporter: SimulatedExporter, tmp_path: Path) -> None:
    first = session_for([exporter.url], tmp_path, run_id="run-a")
    first.configure()
    scrape_synchronously(first, 2)
    first.records.close()
    first.events.close()  # killed: no complete event
    first.folder_lock.release()  # (the kernel drops a dead process's flock)
    _run(exporter.url, tmp_path, "run-a")
    assert not (tmp_path / "run-a").exists()
    events = (tmp_path / "gpu_telemetry_events.jsonl").read_text()
    assert events.count('"type":"configured"') == 2
    lines = (tmp_path / "gpu_telemetry_export.jsonl").read_text().splitlines()
    report = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert report["telemetry_data"]["endpoints"] and len(lines) >= 2 * 2 * 2


def test_the_same_run_restarted_after_it_completed_leaves_the_finished_files_alone(
        exporter: SimulatedExporter, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _run(exporter.url, tmp_path, "run-a")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    again = session_for([exporter.url], tmp_path, run_id="run-a")
    with caplog.at_level(logging.WARNING, "bridge.sidecar.artifacts"):
        again.configure()
        again.start()
        again.complete()
    assert "run run-a already completed in" in caplog.text and "left as they are" in caplog.text
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert again.state == "completed" and not again.ready


def test_a_phase_manifest_older_than_the_run_is_not_used(exporter: SimulatedExporter, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    old = tmp_path / "aiperf" / "phase_manifest.json"
    old.parent.mkdir()
    old.write_text(json.dumps({"phases": [{"phase": "profiling", "start_ns": 1, "end_ns": 2}]}))
    os.utime(old, (1_000_000, 1_000_000))
    session = session_for([exporter.url], tmp_path, run_id="run-a", phase_manifest=str(tmp_path))
    session.configure()
    with caplog.at_level(logging.INFO, "bridge.sidecar.finish"):  # info: the normal case
        assert manifest_phases(session) is None
    session.complete()
    assert "no phase_manifest.json written during this run at or below" in caplog.text


def test_a_folder_that_cannot_be_written_stops_the_session_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    session = session_for([], tmp_path / "a-file" / "out")
    with pytest.raises(ConfigError, match=r"--artifact-dir .*a-file/out: cannot write there \(Not a directory\); "
                                          "give a folder this user can write"):
        session.prepare_artifacts()


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "ro", "ro,size=1m") as mount:
        yield mount


def test_profile_into_a_read_only_folder_stops_before_the_benchmark_runs(read_only_dir: Path,
                                                                         tmp_path: Path) -> None:
    marker = tmp_path / "benchmark-ran"
    result = CliRunner().invoke(main, ["profile", "--gpu-telemetry", "127.0.0.1:1", "--artifact-dir",
                                       str(read_only_dir / "out"), "--", sys.executable, "-c",
                                       f"open({str(marker)!r}, 'w')"], env=QUIET)
    assert result.exit_code == 2, result.output
    assert f"Error: --artifact-dir {read_only_dir / 'out'}: cannot write there (Read-only file system)" \
        in result.output
    assert "Traceback" not in result.output
    assert not marker.exists()


def test_the_same_run_restarted_before_it_recorded_anything_reports_what_the_new_process_collects(
        exporter: SimulatedExporter, tmp_path: Path) -> None:
    """Killed before its first record (no record log yet): nothing came before, so the new process's spool has
    the whole run (it used to look for the missing log: FileNotFoundError, no report)."""
    first = session_for(["http://127.0.0.1:9/metrics"], tmp_path, run_id="run-a")  # nothing answers there
    first.configure()
    first.events.close()  # killed: no complete event, no record log
    first.folder_lock.release()
    assert not (tmp_path / "gpu_telemetry_export.jsonl").exists()
    report = resumed_report(exporter.url, tmp_path, "run-a")
    assert len(next(iter(report["telemetry_data"]["endpoints"].values()))["gpus"]) == 2
