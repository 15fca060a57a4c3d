"""`sidecar`/`profile --gpu-pods`: the run's report counts only the GPUs the exporter attributes to matching pods
(report/pods.py, the same rule as `report --gpu-pods`), while the record log keeps every GPU with its pod labels."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from rich.console import Console

from bridge.cli import main
from bridge.config import Config
from bridge.endpoints import TelemetryItems, display_key
from bridge.fields import default_table
from bridge.record_log import read_dicts
from bridge.report.console import render_console
from bridge.sidecar.session import Session
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import scrape_synchronously


def _run(tmp_path: Path, url: str, gpu_pods: tuple[str, ...]) -> Session:
    config = Config(telemetry=TelemetryItems(urls=[url]), default_endpoints=[], artifact_dir=str(tmp_path),
                    collection_interval=0.05, scrape_timeout=1.0, connect_timeout=0.5, run_id="pods-run",
                    shutdown_delay=3.0)
    session = Session(replace(config, gpu_pods=gpu_pods), default_table())
    session.configure()
    scrape_synchronously(session, 4)
    session.complete()
    return session


def _gpu_uuids(session: Session) -> set[str]:
    assert session.outputs is not None and session.outputs.report is not None
    endpoints = session.outputs.report.telemetry_data["endpoints"]
    return {g["gpu_uuid"] for e in endpoints.values() for g in e["gpus"].values()}


def test_the_run_reports_only_the_gpus_of_matching_pods_and_the_log_keeps_every_gpu(tmp_path: Path) -> None:
    # 4 GPUs, 2 per pod: llm-server-0 holds GPUs 0 and 1, llm-server-1 GPUs 2 and 3.
    with SimulatedExporter(SimulatorConfig(gpus=4, seed=41, pod_labels="mapped", gpus_per_pod=2)) as exporter:
        everything = _run(tmp_path / "all", exporter.url, ())
        ours = _run(tmp_path / "ours", exporter.url, ("llm-bench/llm-server-0",))
    logged = {d["gpu_uuid"]: d["pod_name"] for d in read_dicts(ours.records.path)}
    assert len(logged) == 4 and set(logged.values()) == {"llm-server-0", "llm-server-1"}
    wanted = {uuid for uuid, pod in logged.items() if pod == "llm-server-0"}
    assert len(_gpu_uuids(everything)) == 4
    assert _gpu_uuids(ours) == wanted
    assert ours.outputs is not None and ours.outputs.report is not None
    data = ours.outputs.report.telemetry_data
    assert data["pods"]["reasons"] == []
    assert "no_gpu_selected" not in data["measurement"]["reasons"]


def test_a_run_whose_exporter_has_no_pod_labels_reports_no_gpu_and_a_not_valid_verdict(tmp_path: Path) -> None:
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=42)) as exporter:
        session = _run(tmp_path, exporter.url, ("llm-bench/*",))
    assert _gpu_uuids(session) == set()
    assert session.outputs is not None and session.outputs.report is not None
    verdict = session.outputs.report.telemetry_data["measurement"]
    assert verdict["valid"] is False and {"no_gpu_selected", "no_pod_labels"} <= set(verdict["reasons"])
    # every sample was read: the window is not the cause, nor an unreadable exporter (issue 44)
    assert verdict["reasons"] == ["no_gpu_selected", "no_pod_labels"] and "no_data" not in verdict["fixes"]
    records = sum(1 for _ in read_dicts(session.records.path))
    out = io.StringIO()
    render_console(session.outputs.report, Console(file=out, width=200, color_system=None))
    [line] = [ln for ln in out.getvalue().splitlines() if display_key(exporter.url) in ln]
    assert "no sample was read" not in line
    assert f"{records} records read; no GPU of it selected by --gpu-pods: no GPU carries pod labels" in line


@pytest.mark.parametrize("command", ["sidecar", "profile"])
def test_a_bad_gpu_pods_value_stops_the_command_in_one_line_before_anything_runs(tmp_path: Path,
                                                                                command: str) -> None:
    args = [command, "--gpu-pods", "no-slash", "--artifact-dir", str(tmp_path / "out")]
    if command == "profile":
        args += ["--", "true"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "--gpu-pods 'no-slash'" in result.output and result.output.count("\n") == 1
    assert not (tmp_path / "out" / "gpu_telemetry_export.jsonl").exists()


def test_the_runs_report_from_the_pods_it_saw_live_equals_report_gpu_pods_on_its_record_log(tmp_path: Path) -> None:
    # A shared node: one GPU per pod, the benchmark's pods are llm-server-0 and -1.
    with SimulatedExporter(SimulatorConfig(gpus=4, seed=43, pod_labels="mapped")) as exporter:
        session = _run(tmp_path / "run", exporter.url, ("llm-bench/llm-server-[01]",))
    assert session.pod_timelines is not None  # the report took the pods the pages named, not the log's
    assert session.outputs is not None and session.outputs.report is not None
    live = session.outputs.report
    out = tmp_path / "offline.json"
    result = CliRunner().invoke(main, ["report", "--jsonl", str(session.records.path), "--events",
                                       str(session.events.path), "--gpu-pods", "llm-bench/llm-server-[01]",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    offline = orjson.loads(out.read_bytes())["telemetry_data"]
    assert offline["pods"] == live.telemetry_data["pods"]
    assert [g["pods"] for g in offline["pods"]["gpus"]] == [["llm-bench/llm-server-0"], ["llm-bench/llm-server-1"]]
    assert offline["pods"]["not_selected"]["other_pod"] == 2


def _recorded_pods(session: Session) -> None:
    """What a sidecar's --gpu-pod-selector records at start (sidecar/cli.py): the pods, their labels."""
    from bridge.events import PodsResolved, ResolvedPod

    pods = tuple(ResolvedPod("llm-bench", f"llm-server-{n}", "gpu-node-a", {"app": "llm", "shard": str(n)})
                 for n in range(4))
    session.events.write_event(PodsResolved(1, ("llm-bench/app=llm",), pods))


def _report(session: Session, out: Path, *flags: str) -> dict:
    result = CliRunner().invoke(main, ["report", "--jsonl", str(session.records.path), "--events",
                                       str(session.events.path), *flags, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return dict(orjson.loads(out.read_bytes())["telemetry_data"])


def test_report_applies_a_pod_selector_offline_to_the_pods_the_run_recorded(tmp_path: Path) -> None:
    with SimulatedExporter(SimulatorConfig(gpus=4, seed=44, pod_labels="mapped")) as exporter:
        config = Config(telemetry=TelemetryItems(urls=[exporter.url]), default_endpoints=[],
                        artifact_dir=str(tmp_path / "run"), collection_interval=0.05, scrape_timeout=1.0,
                        connect_timeout=0.5, run_id="pods-selector", shutdown_delay=3.0)
        session = Session(config, default_table())
        session.prepare_artifacts()
        _recorded_pods(session)
        session.configure()
        scrape_synchronously(session, 4)
        session.complete()
    by_selector = _report(session, tmp_path / "a.json", "--gpu-pod-selector", "llm-bench/shard in (0, 1)")
    by_glob = _report(session, tmp_path / "b.json", "--gpu-pods", "llm-bench/llm-server-[01]")
    assert by_selector["pods"]["patterns"] == ["llm-bench/llm-server-0", "llm-bench/llm-server-1"]
    assert by_selector["pods"]["gpus"] == by_glob["pods"]["gpus"]
    assert [g["pods"] for g in by_selector["pods"]["gpus"]] == [["llm-bench/llm-server-0"], ["llm-bench/llm-server-1"]]
    none = _report(session, tmp_path / "c.json", "--gpu-pod-selector", "llm-bench/app=mistral")
    assert none["pods"]["gpus"] == [] and "no_gpu_selected" in none["measurement"]["reasons"]


def test_report_with_a_pod_selector_but_no_recorded_pods_says_what_to_give_in_one_line(tmp_path: Path) -> None:
    with SimulatedExporter(SimulatorConfig(gpus=1, seed=45, pod_labels="mapped")) as exporter:
        session = _run(tmp_path, exporter.url, ())
    result = CliRunner().invoke(main, ["report", "--jsonl", str(session.records.path), "--events",
                                       str(session.events.path), "--gpu-pod-selector", "llm-bench/app=llm"])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "records no pods" in result.output and "--gpu-pods" in result.output


def test_pods_the_watch_finds_join_the_selection_and_their_new_exporter_is_scraped_from_then_on(
        tmp_path: Path) -> None:
    from bridge.events import PodsResolved, ResolvedPod

    with SimulatedExporter(SimulatorConfig(gpus=2, seed=46, pod_labels="mapped")) as first, \
            SimulatedExporter(SimulatorConfig(gpus=1, seed=47, pod_labels="mapped", namespace="other")) as second:
        config = Config(telemetry=TelemetryItems(urls=[first.url]), default_endpoints=[],
                        artifact_dir=str(tmp_path), collection_interval=0.05, scrape_timeout=1.0, connect_timeout=0.5,
                        run_id="pods-follow", shutdown_delay=3.0, gpu_pods=("llm-bench/llm-server-0",))
        session = Session(config, default_table())
        session.configure()
        scrape_synchronously(session, 2)
        assert b"llm-server-1" not in session.exposition()
        moved = PodsResolved(7, ("llm-bench/app=llm",), (ResolvedPod("llm-bench", "llm-server-1", "b", {}),))
        added = session.follow_pods([first.url, second.url], ["llm-bench/llm-server-0", "llm-bench/llm-server-1"],
                                    moved)
        scrape_synchronously(session, 2)
        assert b'pod="llm-server-1"' in session.exposition()  # forwarded live from now on
        session.complete()
    assert added == [second.url]
    logged = {(d["namespace"], d["pod_name"]) for d in read_dicts(session.records.path)}
    assert logged == {("llm-bench", "llm-server-0"), ("llm-bench", "llm-server-1"), ("other", "llm-server-0")}
    recorded = [d for d in read_dicts(session.events.path) if d["type"] == "pods"]
    assert [(d["time_ns"], [p["name"] for p in d["pods"]]) for d in recorded] == [(7, ["llm-server-1"])]
    assert session.outputs is not None and session.outputs.report is not None
    pods = session.outputs.report.telemetry_data["pods"]
    assert [g["pods"] for g in pods["gpus"]] == [["llm-bench/llm-server-0"], ["llm-bench/llm-server-1"]]
    assert pods["not_selected"]["other_pod"] == 1  # the new exporter's GPU serves another namespace's pod
