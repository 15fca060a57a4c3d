"""The telemetry_data block: GPU keys, summary, endpoints and errors, window sources."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bridge.report import build_report, build_report_from_events
from bridge.report.build import Report
from bridge.report.series import SeriesAccumulator
from bridge.report.telemetry_data import format_time
from bridge.report.window import explicit_window
from bridge.samples import PhaseMark, ScrapeFailure
from tests.report.helpers import MS, T0, URL, S, rec, write_events, write_log

URL_B = "http://10.0.0.2:9400/metrics"
WINDOW = explicit_window(T0, T0 + 10 * S)


def _power(t: int, watts: float = 300.0) -> dict[str, float]:
    return {"nvidia_power_usage": watts, "nvidia_energy_consumption": 1.0 + (t - T0) / S * 300e-6}


def _gpus(built: Report, endpoint: str = "127.0.0.1:19401") -> dict[str, Any]:
    gpus: dict[str, Any] = built.telemetry_data["endpoints"][endpoint]["gpus"]
    return gpus


def test_mig_instances_get_their_own_keys_next_to_the_parent_gpu() -> None:
    records = []
    for t in range(T0, T0 + 10 * S, S):
        records.append(rec(t, _power(t)))
        for gi in ("1", "2"):
            records.append(rec(t, {"nvidia_gpu_utilization": 50.0}, gi=gi, profile="3g.40gb"))
    gpus = _gpus(build_report(records, window=WINDOW))
    assert list(gpus) == ["gpu_0", "gpu_0_mig1", "gpu_0_mig2"]
    mig = gpus["gpu_0_mig1"]
    assert mig["gpu_instance_id"] == "1" and mig["gpu_instance_profile"] == "3g.40gb"
    assert list(mig["metrics"]) == ["nvidia_gpu_utilization"]  # device-level fields stay on the parent
    assert "nvidia_power_usage" in gpus["gpu_0"]["metrics"]


def test_gpus_of_several_hosts_behind_one_url_never_overwrite_each_other() -> None:
    records = [rec(t, _power(t, w), uuid=f"GPU-{host}", host=host)
               for t in range(T0, T0 + 10 * S, S) for host, w in (("node-a", 100.0), ("node-b", 200.0))]
    gpus = _gpus(build_report(records, window=WINDOW))
    assert list(gpus) == ["gpu_0@node-a", "gpu_0@node-b"]
    assert gpus["gpu_0@node-b"]["metrics"]["nvidia_power_usage"]["avg"] == 200.0


def test_two_uuids_on_one_index_and_one_host_are_told_apart_by_uuid() -> None:
    records = [rec(T0 + S, _power(T0), uuid=u) for u in ("GPU-a", "GPU-b")]
    assert list(_gpus(build_report(records, window=WINDOW))) == ["gpu_0@GPU-a", "gpu_0@GPU-b"]


def test_one_gpu_per_index_keeps_aiperfs_plain_key() -> None:
    records = [rec(T0 + S, _power(T0), uuid=f"GPU-{i}", index=i) for i in (1, 0)]
    assert list(_gpus(build_report(records, window=WINDOW))) == ["gpu_0", "gpu_1"]


def test_summary_times_are_naive_local_with_microseconds_and_the_end_includes_the_grace() -> None:
    built = build_report([rec(T0 + S, _power(T0))], window=explicit_window(T0 + 123, T0 + 5 * S, 666 * MS),
                         tz=UTC)
    summary = built.telemetry_data["summary"]
    assert summary["start_time"] == "2026-12-02T08:48:18.411830"  # 123 ns below a µs are truncated
    assert summary["end_time"] == "2026-12-02T08:48:24.077830"
    assert summary["counter_mode"] == "interpolated"


def test_format_time_defaults_to_naive_local_time() -> None:
    ns = 1_796_201_298_411_830_000
    assert format_time(ns) == datetime.fromtimestamp(ns // S).replace(microsecond=411830).isoformat()


def test_a_run_with_no_profiling_phase_reports_all_data() -> None:
    marks = [PhaseMark("warmup", "warmup", "start", T0), PhaseMark("warmup", "warmup", "end", T0 + S)]
    records = [rec(T0 + i * S, _power(T0 + i * S, 100.0 + i)) for i in range(-3, 20)]
    built = build_report(records, marks=marks, tz=UTC)
    power = _gpus(built)["gpu_0"]["metrics"]["nvidia_power_usage"]
    assert power["count"] == 23 and power["min"] == 97.0 and power["max"] == 119.0
    assert built.window.start_ns == T0 - 3 * S and built.window.end_ns == T0 + 19 * S


def test_the_window_comes_from_profiling_marks_and_the_requests_end() -> None:
    marks = [PhaseMark("warmup", "warmup", "start", T0 - 2 * S), PhaseMark("warmup", "warmup", "end", T0),
             PhaseMark("profiling", "profiling", "start", T0), PhaseMark("profiling", "profiling", "end", T0 + 9 * S)]
    records = [rec(T0 + i * S, _power(T0 + i * S)) for i in range(-3, 12)]
    built = build_report(records, marks=marks, requests_end_ns=T0 + 5 * S)
    assert (built.window.start_ns, built.window.end_ns) == (T0, T0 + 5 * S)
    assert _gpus(built)["gpu_0"]["metrics"]["nvidia_power_usage"]["count"] == 6
    assert built.writes_phase_files and [p.relpath for p in built.phase_files] == [
        "phases/warmup/gpu_telemetry.json", "phases/profiling/gpu_telemetry.json"]


def test_gauges_exclude_the_grace_but_aiperf_mode_includes_it() -> None:
    records = [rec(T0 + i * S // 2, _power(T0, 100.0)) for i in range(0, 21)] + [rec(T0 + 10 * S + 500 * MS,
                                                                                     _power(T0, 900.0))]
    ours = _gpus(build_report(records, window=WINDOW))["gpu_0"]["metrics"]["nvidia_power_usage"]
    aiperf = _gpus(build_report(records, window=WINDOW, counter_mode="aiperf"))["gpu_0"]["metrics"][
        "nvidia_power_usage"]
    assert ours["max"] == 100.0 and aiperf["max"] == 900.0


def test_an_endpoint_unreachable_at_configure_is_listed_but_not_successful() -> None:
    built = build_report([rec(T0 + S, _power(T0))], window=WINDOW, endpoints_configured=[URL, URL_B],
                         endpoints_successful=[URL])
    summary = built.telemetry_data["summary"]
    assert summary["endpoints_configured"] == [URL, URL_B] and summary["endpoints_successful"] == [URL]
    assert list(built.telemetry_data["endpoints"]) == ["127.0.0.1:19401"]
    down = built.endpoints[1]
    assert (down.display, down.up_at_end, down.reason) == ("10.0.0.2:9400", False, "unreachable at configure time")


def test_the_only_endpoint_unreachable_gives_an_empty_endpoints_block() -> None:
    built = build_report([], window=WINDOW, endpoints_configured=[URL_B], endpoints_successful=[])
    assert built.telemetry_data["endpoints"] == {}
    assert built.telemetry_data["summary"]["endpoints_successful"] == []


def test_an_endpoint_dying_mid_run_is_not_successful_and_shows_in_the_error_summary(tmp_path: Path) -> None:
    records = [rec(t, _power(t)) for t in range(T0, T0 + 10 * S, S)]
    records += [rec(t, _power(t), url=URL_B, uuid="GPU-b") for t in range(T0, T0 + 4 * S, S)]
    events = write_events(tmp_path / "gpu_telemetry_events.jsonl", [
        {"type": "configured", "time_ns": T0 - 5 * S, "endpoints_configured": [URL, URL_B],
         "endpoints_successful": [URL, URL_B]},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "start", "time_ns": T0},
        {"type": "scrape_error", "endpoint": URL_B, "time_ns": T0 + 4 * S, "kind": "connect", "message": "refused"},
        {"type": "scrape_error", "endpoint": URL_B, "time_ns": T0 + 5 * S, "kind": "connect", "message": "refused"},
        {"type": "endpoint_state", "endpoint": URL_B, "time_ns": T0 + 5 * S, "state": "down", "reason": "refused"},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "end", "time_ns": T0 + 9 * S},
        {"type": "complete", "time_ns": T0 + 10 * S, "requests_end_ns": T0 + 9 * S, "collection_complete": True},
        {"type": "something_new"},
    ])
    built = build_report_from_events(write_log(tmp_path / "log.jsonl", records), events)
    data = built.telemetry_data
    assert data["summary"]["endpoints_successful"] == [URL]
    assert data["endpoints"]["10.0.0.2:9400"]["gpus"]["gpu_0"]["metrics"]["nvidia_power_usage"]["count"] == 4
    assert data["error_summary"] == [
        {"error_details": {"type": "connect", "message": "10.0.0.2:9400: refused"}, "count": 2},
        {"error_details": {"type": "endpoint_down", "message": "10.0.0.2:9400: refused"}, "count": 1},
    ]
    assert built.window.end_ns == T0 + 9 * S  # the requests end, not the phase end


def test_an_endpoint_back_up_before_the_end_counts_as_successful() -> None:
    from bridge.report.events import EndpointState

    states = [EndpointState(URL, T0 + S, "down", "timeout"), EndpointState(URL, T0 + 2 * S, "up")]
    built = build_report([rec(T0, _power(T0))], window=WINDOW, endpoint_states=states,
                         errors=[ScrapeFailure(URL, T0 + S, "timeout", "read timed out")])
    assert built.telemetry_data["summary"]["endpoints_successful"] == [URL]


def test_credentials_never_reach_the_summary_or_the_endpoint_keys() -> None:
    secret = "http://user:pw@127.0.0.1:19401/metrics"
    built = build_report([rec(T0 + S, _power(T0), url=secret)], window=WINDOW, endpoints_configured=[secret])
    assert "pw" not in str(built.telemetry_data)
    assert list(built.telemetry_data["endpoints"]) == ["127.0.0.1:19401"]


def test_out_of_order_records_are_sorted_and_unchanged_values_are_still_samples() -> None:
    times = [T0 + i * S for i in range(10)]
    records = [rec(t, {"nvidia_power_usage": 250.0}) for t in reversed(times)]
    power = _gpus(build_report(records, window=WINDOW))["gpu_0"]["metrics"]["nvidia_power_usage"]
    assert power["count"] == 10


def test_metadata_missing_from_the_first_record_is_filled_from_later_ones() -> None:
    first = rec(T0, _power(T0), host=None)
    later = rec(T0 + S, _power(T0 + S), pod_name="vllm-0", namespace="bench")
    gpu = _gpus(build_report([first, later], window=WINDOW))["gpu_0"]
    assert (gpu["hostname"], gpu["namespace"], gpu["pod_name"]) == ("node-a", "bench", "vllm-0")
    assert list(gpu) == ["gpu_index", "gpu_name", "gpu_uuid", "platform", "hostname", "namespace", "pod_name",
                         "metrics"]


def test_legacy_aiperf_keys_are_read_as_the_current_ones() -> None:
    records = [rec(T0 + i * S, {"gpu_power_usage": 123.0, "xid_errors": 0.0}) for i in range(3)]
    metrics = _gpus(build_report(records, window=WINDOW))["gpu_0"]["metrics"]
    assert list(metrics) == ["nvidia_power_usage", "nvidia_xid_errors"]


def test_a_gpu_with_no_sample_in_the_window_keeps_an_empty_metrics_block() -> None:
    gpu = _gpus(build_report([rec(T0 - 60 * S, _power(T0))], window=WINDOW))["gpu_0"]
    assert gpu["metrics"] == {}


def test_the_accumulator_can_be_fed_live_and_reused() -> None:
    acc = SeriesAccumulator()
    for i in range(5):
        acc.add(rec(T0 + i * S, _power(T0 + i * S)))
    first = build_report(acc, window=WINDOW)
    acc.add(rec(T0 + 5 * S, _power(T0 + 5 * S)))
    second = build_report(acc, window=WINDOW)
    assert (first.records, second.records) == (5, 6)


def test_an_unknown_counter_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="counter_mode"):
        build_report([], window=WINDOW, counter_mode="promql")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["interpolated", "aiperf"])
def test_the_energy_window_stands_beside_aiperfs_end_time_which_adds_the_grace(mode: str) -> None:
    # A 3 s run at 300 W with AIPerf's 0.666 s grace (AIPERF_GPU_FINAL_SCRAPE_GRACE_NS): end_time - start_time is
    # 3.666 s, so energy ÷ it reads 18 % low; energy_window says what the energy covers (issue 44).
    records = [rec(T0 + k * S // 10, {"nvidia_power_usage": 300.0, "nvidia_energy_consumption": 1.0 + 300e-6 * k / 10})
               for k in range(-10, 50)]
    built = build_report(records, window=explicit_window(T0, T0 + 3 * S, 666 * MS), counter_mode=mode)
    summary = built.telemetry_data["summary"]
    window = summary["energy_window"]

    def seconds(text: str) -> float:
        return datetime.fromisoformat(text).timestamp()

    assert seconds(summary["end_time"]) - seconds(summary["start_time"]) == pytest.approx(3.666, abs=1e-6)
    covered = 3.666 if mode == "aiperf" else 3.0
    assert window["start_time"] == summary["start_time"] and window["grace_s"] == pytest.approx(0.666)
    assert seconds(window["end_time"]) - seconds(window["start_time"]) == pytest.approx(covered, abs=1e-6)
    assert window["duration_s"] == pytest.approx(covered) and window["end_time_includes_grace"] == (mode == "aiperf")
    assert built.energy.total_energy_j / window["duration_s"] == pytest.approx(300.0, rel=0.01)  # not 245 W
