"""`report --gpu-pods`: exactly the GPUs that served the benchmark's pods, each for the part of the window it
served them, from hand-made records on a fixed clock (T0, one scrape a second)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.events import GpuShared
from bridge.pods import parse_pod_patterns
from bridge.report.build import build_report
from bridge.report.pods import (
    GPU_SHARED,
    NO_GPU_SELECTED,
    NO_MATCHING_POD,
    NO_POD_LABELS,
    Timelines,
    pods_of_records,
    report_for_pods,
    select_gpus,
    timelines_of_records,
    with_shared,
)
from bridge.report.window import Phase, explicit_window
from bridge.samples import GpuRecord
from tests.report.helpers import T0, S, rec, write_log

WINDOW = (T0, T0 + 10 * S)
BENCH = parse_pod_patterns(["bench/llama-*"])
# (uuid, index, MJ per second of its energy counter)
GPUS = [("GPU-a", 0, 0.0004), ("GPU-b", 1, 0.0003), ("GPU-c", 2, 0.0005), ("GPU-d", 3, 0.0002)]
OWNER: dict[str, tuple[str, str] | None] = {
    "GPU-a": ("bench", "llama-0"), "GPU-b": ("bench", "llama-1"), "GPU-c": ("other", "train-0"), "GPU-d": None,
}


def scrapes(owner_at: Any, gpus: list[tuple[str, int, float]] = GPUS, *, instance: dict[str, str] | None = None,
            ) -> list[GpuRecord]:
    """A record per GPU per second from T0 - 2 s to T0 + 12 s; `owner_at(uuid, second)` names its pod."""
    out = []
    for second in range(-2, 13):
        for uuid, index, rate in gpus:
            owner = owner_at(uuid, second)
            pod = {"namespace": owner[0], "pod_name": owner[1]} if owner else {}
            out.append(rec(T0 + second * S, {"nvidia_energy_consumption": 5.0 + rate * (second + 2),
                                             "nvidia_power_usage": rate * 1e6},
                           uuid=uuid.split("/")[0], index=index, gi=(instance or {}).get(uuid), **pod))
    return out


def selection_of(records: list[GpuRecord], patterns: Any = BENCH) -> Any:
    built = build_report(records, window=explicit_window(*WINDOW))
    return report_for_pods(built, timelines_of_records(records), patterns, window=explicit_window(*WINDOW))


def test_a_shared_node_reports_exactly_the_two_gpus_of_the_benchmarks_pods_and_their_energy_sum() -> None:
    report, selection = selection_of(scrapes(lambda uuid, _: OWNER[uuid]))
    gpus = report.telemetry_data["endpoints"]["127.0.0.1:19401"]["gpus"]
    assert sorted(g["gpu_uuid"] for g in gpus.values()) == ["GPU-a", "GPU-b"]
    assert report.energy.total_energy_j == pytest.approx((400 + 300) * 10)  # J over the 10 s window
    assert [g.energy_j for g in selection.selected] == [pytest.approx(4000), pytest.approx(3000)]
    assert (selection.other_pod, selection.unattributed, selection.not_selected) == (1, 1, 2)
    assert selection.reasons == ()
    assert selection.warning is None
    assert report.telemetry_data["pods"]["pods_by_phase"] == {
        "window": {"bench/llama-0": ["GPU-a"], "bench/llama-1": ["GPU-b"]}}
    assert selection.summary_line().endswith("2 scraped but not selected (0 shared with other pods, "
                                             "1 in other pods, 1 unattributed)")


def test_an_endpoint_without_pod_labels_gives_the_warning_with_the_fix_and_no_gpu() -> None:
    report, selection = selection_of(scrapes(lambda uuid, _: None))
    assert report.telemetry_data["endpoints"] == {}
    assert selection.selected == ()
    assert selection.reasons == (NO_GPU_SELECTED, NO_POD_LABELS)
    assert selection.energy_j is None and report.energy.total_energy_j is None
    warning = selection.warning or ""
    assert "no GPU carries pod labels" in warning
    for fix in ("nvidia.com/gpu", "DRA", "DCGM_EXPORTER_KUBERNETES=true", "pod-resources"):
        assert fix in warning


def test_labelled_gpus_none_of_them_matching_give_no_matching_pod_and_no_gpu() -> None:
    _, selection = selection_of(scrapes(lambda uuid, _: OWNER[uuid]), parse_pod_patterns(["bench/mistral-*"]))
    assert selection.reasons == (NO_GPU_SELECTED, NO_MATCHING_POD)
    assert "bench/mistral-*" in (selection.warning or "")


def test_a_gpu_handed_to_another_pod_and_back_moves_out_and_in_at_those_scrapes() -> None:
    def owner(uuid: str, second: int) -> tuple[str, str] | None:
        if 4 <= second < 7:
            return ("other", "train-0")  # handed away at the scrape of T0 + 4 s, back at T0 + 7 s
        return ("bench", "llama-0" if second < 4 else "llama-0-restarted")

    report, selection = selection_of(scrapes(owner, GPUS[:1]))
    (gpu,) = selection.selected
    assert [(s.start_ns - T0, s.end_ns - T0) for s in gpu.spans] == [(0, 4 * S), (7 * S, 10 * S)]
    assert [s.pods for s in gpu.spans] == [("bench/llama-0",), ("bench/llama-0-restarted",)]
    assert gpu.energy_j == pytest.approx(400 * 7)
    assert report.energy.total_energy_j == pytest.approx(400 * 7)


def test_the_aiperf_counter_mode_freezes_a_gpus_pod_at_its_first_record() -> None:
    records = scrapes(lambda _, s: ("bench", "llama-0") if s < 4 else ("other", "train-0"), GPUS[:1])
    built = build_report(records, window=explicit_window(*WINDOW), counter_mode="aiperf")
    selection = select_gpus(built.series, timelines_of_records(records), BENCH, built.window, "aiperf")
    (gpu,) = selection.selected
    assert [(s.start_ns - T0, s.end_ns - T0, s.pods) for s in gpu.spans] == [(0, 10 * S, ("bench/llama-0",))]


def test_a_pod_restarted_under_a_new_matching_name_keeps_its_gpu_for_the_whole_window() -> None:
    _, selection = selection_of(scrapes(lambda _, s: ("bench", "llama-0" if s < 5 else "llama-0-b"), GPUS[:1]))
    (gpu,) = selection.selected
    assert [(s.start_ns - T0, s.end_ns - T0) for s in gpu.spans] == [(0, 5 * S), (5 * S, 10 * S)]
    assert gpu.pods == ("bench/llama-0", "bench/llama-0-b")
    assert gpu.energy_j == pytest.approx(4000)


def test_a_gpu_whose_mig_sibling_serves_another_pod_is_reported_apart_as_shared() -> None:
    mig = [("GPU-m/1", 0, 0.0004), ("GPU-m/2", 0, 0.0004)]
    owners = {"GPU-m/1": ("bench", "llama-0"), "GPU-m/2": ("other", "train-0")}
    _, selection = selection_of(scrapes(lambda uuid, _: owners[uuid], mig, instance={"GPU-m/1": "1", "GPU-m/2": "2"}))
    assert selection.selected == ()
    (shared,) = selection.shared
    assert (shared.series.meta.gpu_instance_id, shared.pods, shared.reason) == (
        "1", ("bench/llama-0", "other/train-0"), GPU_SHARED)
    assert GPU_SHARED in selection.reasons and NO_GPU_SELECTED in selection.reasons


def test_the_pods_are_listed_per_phase_with_the_gpus_that_served_them_in_it() -> None:
    records = scrapes(lambda uuid, s: ("bench", "llama-0" if s < 5 else "llama-9") if uuid == "GPU-a" else None,
                      GPUS[:2])
    phases = [Phase("first", "profiling", 0, T0, T0 + 5 * S), Phase("second", "profiling", 1, T0 + 5 * S, T0 + 10 * S)]
    built = build_report(records, window=explicit_window(*WINDOW), phases=phases)
    selection = select_gpus(built.series, timelines_of_records(records), BENCH, built.window, "interpolated", phases)
    assert selection.pods_by_phase == {"first": {"bench/llama-0": ("GPU-a",)},
                                       "second": {"bench/llama-9": ("GPU-a",)}}


def _report_cli(log: Path, tmp_path: Path, *pods: str) -> tuple[Any, dict[str, Any]]:
    out = tmp_path / "profile_export_aiperf.json"
    args = ["report", "--jsonl", str(log), "--start-ns", str(WINDOW[0]), "--end-ns", str(WINDOW[1]), "-o", str(out)]
    for pod in pods:
        args += ["--gpu-pods", pod]
    result = CliRunner().invoke(main, args)
    return result, orjson.loads(out.read_bytes()) if out.exists() else {}


def test_report_gpu_pods_on_the_record_log_gives_the_same_numbers(tmp_path: Path) -> None:
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", scrapes(lambda uuid, _: OWNER[uuid]))
    result, doc = _report_cli(log, tmp_path, "bench/llama-0", "bench/llama-1")
    assert result.exit_code == 0, result.output
    assert doc["nvidia_total_gpu_energy"]["avg"] == pytest.approx(7000)  # J
    assert sorted(doc["telemetry_data"]["pods"]["pods_by_phase"]["window"]) == ["bench/llama-0", "bench/llama-1"]
    assert "pods: 2 GPUs served pods matching bench/llama-0, bench/llama-1; 2 scraped but not selected" in result.output
    assert "pods: window: bench/llama-0 (GPU-a); bench/llama-1 (GPU-b)" in result.output


def test_report_gpu_pods_without_labels_warns_and_writes_a_report_with_no_gpu(tmp_path: Path) -> None:
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", scrapes(lambda uuid, _: None))
    result, doc = _report_cli(log, tmp_path, "bench/llama-*")
    assert result.exit_code == 0, result.output
    assert "warning: no GPU carries pod labels" in result.output
    assert doc["telemetry_data"]["endpoints"] == {}
    assert doc["telemetry_data"]["pods"]["reasons"] == [NO_GPU_SELECTED, NO_POD_LABELS]


@pytest.mark.parametrize(("value", "message"), [
    ("llama-*", "Error: --gpu-pods 'llama-*': expected NAMESPACE/GLOB, e.g. --gpu-pods bench/llama-*"),
    ("Bench/llama-*", "Error: --gpu-pods 'Bench/llama-*': 'Bench' is not a namespace name"),
    ("/llama-*", "Error: --gpu-pods '/llama-*': '' is not a namespace name"),
    ("bench/", "Error: --gpu-pods 'bench/': '' is not a pod-name glob"),
    ("bench/app=llama", "a label selector goes to --gpu-pod-selector"),
])
def test_a_bad_gpu_pods_value_is_one_line_and_exit_2(tmp_path: Path, value: str, message: str) -> None:
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", scrapes(lambda uuid, _: None, GPUS[:1]))
    result, _ = _report_cli(log, tmp_path, value)
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_gpu_pods_with_a_promql_store_is_refused_in_one_line() -> None:
    result = CliRunner().invoke(main, ["report", "--prometheus", "http://127.0.0.1:9/", "--run-id", "r",
                                       "--start-ns", str(WINDOW[0]), "--end-ns", str(WINDOW[1]),
                                       "--gpu-pods", "bench/llama-*"])
    assert result.exit_code == 2
    assert result.output.strip() == ("Error: --gpu-pods needs --jsonl: records read back from a PromQL store carry "
                                     "no pod labels")


def _changes_only(records: list[GpuRecord]) -> Timelines:
    """The pods the live run keeps (the sidecar's `PodTimelineSink`): page by page, changes and the latest only."""
    kept = Timelines()
    for t_ns in sorted({r.timestamp_ns for r in records}):
        page = [r for r in records if r.timestamp_ns == t_ns]
        for key, pods in pods_of_records("127.0.0.1:19401", page).items():
            kept.add(key, t_ns, pods)
    return kept


MIG = [("GPU-m/1", 0, 0.0004), ("GPU-m/2", 0, 0.0004)]


@pytest.mark.parametrize("owner, gpus, instance", [
    (lambda uuid, _: OWNER[uuid], GPUS, None),
    (lambda uuid, _: None, GPUS, None),
    (lambda _, s: ("other", "train-0") if 4 <= s < 7 else ("bench", "llama-0" if s < 4 else "llama-0-b"), GPUS, None),
    (lambda _, s: ("bench", "llama-0") if s < 11 else ("other", "x"), GPUS[:1], None),
    (lambda uuid, _: {"GPU-m/1": ("bench", "llama-0"), "GPU-m/2": ("other", "train-0")}[uuid], MIG,
     {"GPU-m/1": "1", "GPU-m/2": "2"}),
    (lambda uuid, s: ("bench", "llama-0") if uuid == "GPU-m/1" else (("other", "t") if 3 <= s < 5 else None), MIG,
     {"GPU-m/1": "1", "GPU-m/2": "2"}),
])
def test_the_changes_the_live_run_keeps_select_what_every_scrape_of_the_log_selects(owner: Any, gpus: Any,
                                                                                     instance: Any) -> None:
    records = scrapes(owner, gpus, instance=instance)
    built = build_report(records, window=explicit_window(*WINDOW))
    every = select_gpus(built.series, timelines_of_records(records), BENCH, built.window, "interpolated")
    live = select_gpus(built.series, _changes_only(records).timelines(), BENCH, built.window, "interpolated")
    assert live.to_dict() == every.to_dict()
    assert sum(len(t) for t in _changes_only(records).timelines().values()) <= 4 * len(gpus)


def test_a_gpu_time_sliced_with_another_pod_is_apart_while_the_events_say_so_and_counted_after() -> None:
    # The log names the benchmark's pod only (one pod per GPU and scrape); the events say GPU-a also served
    # other/job-0 from T0 + 2 s until T0 + 6 s: the board is shared, so it is not counted at all in this window...
    records = scrapes(lambda uuid, _: OWNER[uuid], GPUS[:1])
    said = [GpuShared("http://127.0.0.1:19401/metrics", T0 + 2 * S, "GPU-a", None, ("bench/llama-0", "other/job-0")),
            GpuShared("http://127.0.0.1:19401/metrics", T0 + 6 * S, "GPU-a", None, ())]
    built = build_report(records, window=explicit_window(*WINDOW))
    every = select_gpus(built.series, with_shared(timelines_of_records(records), said), BENCH, built.window,
                        "interpolated")
    assert every.selected == () and [(g.sharing, g.pods) for g in every.shared] == [
        ("time_slicing_or_mps", ("bench/llama-0", "other/job-0"))]
    # ...the changes the live run keeps give the same...
    live = select_gpus(built.series, with_shared(_changes_only(records).timelines(), said), BENCH, built.window,
                       "interpolated")
    assert live.to_dict() == every.to_dict()
    # ...and in a window after the sharing ended, the GPU is the benchmark's again.
    later = explicit_window(T0 + 7 * S, T0 + 10 * S)
    after = select_gpus(build_report(records, window=later).series, with_shared(timelines_of_records(records), said),
                        BENCH, later, "interpolated")
    assert [g.series.meta.gpu_uuid for g in after.selected] == ["GPU-a"] and after.shared == ()


def test_report_gpu_pods_on_a_log_of_two_runs_selects_in_the_run_it_reports(tmp_path: Path) -> None:
    from dataclasses import replace

    ours = [replace(r, run_id="run-2") for r in scrapes(lambda uuid, _: OWNER[uuid])]
    earlier = [replace(r, run_id="run-1", timestamp_ns=r.timestamp_ns - 3600 * S) for r in scrapes(lambda u, _: None)]
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", earlier + ours)
    result, doc = _report_cli(log, tmp_path, "bench/llama-0", "bench/llama-1")
    assert result.exit_code == 0, result.output
    assert "reporting run run-2" in result.output
    assert doc["nvidia_total_gpu_energy"]["avg"] == pytest.approx(7000)  # J: the same two GPUs as in one run
