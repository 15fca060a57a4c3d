"""sidecar/aiperf.py without AIPerf: its command line, where its files are, the window they describe."""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

import orjson

from bridge.sidecar.aiperf import find_outputs, parse_command, phase_from_document, prefix_base, read_result


def _write(path: Path, doc: object, age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(doc))
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_aiperfs_prefix_is_resolved_as_aiperf_does():
    assert prefix_base("foo") == "foo" and prefix_base("foo_raw.jsonl") == "foo"
    assert prefix_base("/abs/dir/run1.json") == "run1" and prefix_base("bar_server_metrics.parquet") == "bar"


def test_without_its_artifact_dir_the_newest_folder_written_during_the_run_is_aiperfs(tmp_path):
    started = time.time_ns()
    _write(tmp_path / "out" / "old-run" / "profile_export_aiperf.json", {}, age_s=3600)
    fresh = _write(tmp_path / "artifacts" / "m-openai-chat-concurrency4" / "profile_export_aiperf.json", {})
    found = find_outputs(parse_command(["aiperf", "profile"]), [tmp_path / "out"], started, cwd=tmp_path)
    assert found is not None and found.json_path == fresh and found.manifest is None
    stale_only = find_outputs(parse_command(["aiperf", "profile"]), [tmp_path / "out"], started, cwd=tmp_path / "out")
    assert stale_only is None  # an earlier run's files are never merged into


def test_its_artifact_dir_and_prefix_name_the_files(tmp_path):
    started = time.time_ns()
    _write(tmp_path / "a" / "run1.json", {})
    _write(tmp_path / "a" / "phase_manifest.json", {"phases": []})
    found = find_outputs(parse_command(["aiperf", "profile", "--artifact-dir", "a", "--profile-export-prefix",
                                        "run1"]), [], started, cwd=tmp_path)
    assert found is not None and found.csv_path == tmp_path / "a" / "run1.csv"
    assert found.manifest == tmp_path / "a" / "phase_manifest.json"


def test_a_single_phase_window_and_a_cancel_come_from_aiperfs_json(tmp_path):
    start_ns, end_ns = 1_796_234_460_735_148_000, 1_796_234_464_960_580_000
    doc = {"was_cancelled": True, "start_time": datetime.fromtimestamp(start_ns / 1e9).isoformat(),
           "end_time": datetime.fromtimestamp(end_ns / 1e9).isoformat()}
    phase = phase_from_document(doc)
    assert phase is not None and phase.kind == "profiling" and phase.was_cancelled
    assert phase.start_ns == start_ns and phase.end_ns == end_ns
    started = time.time_ns()
    _write(tmp_path / "profile_export_aiperf.json", doc)
    found = find_outputs(parse_command(["aiperf", "profile", "--artifact-dir", str(tmp_path)]), [], started)
    assert found is not None
    result = read_result(found)
    assert result.was_cancelled and [p.start_ns for p in result.phases] == [start_ns]
