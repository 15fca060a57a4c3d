"""The selection stage (bridge/select.py): one GPU, one count, whichever endpoints serve it."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from bridge.fetch import FetchedPage
from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.parse import parse_page
from bridge.pods import parse_pod_patterns
from bridge.record_log import LineWriter, read_dicts
from bridge.report import build_report
from bridge.select import Deduplicator, duplicates_of, preference_order, select_pods, select_series
from bridge.sidecar.pipeline import Pipeline, RecordLogSink
from bridge.sources.runner import CONTENT_TYPE
from tests.otlp.pages import dcgm_page

NS = 1_000_000_000
A = {("GPU-a", None), ("GPU-b", None)}
B = {("GPU-c", None), ("GPU-d", None)}


def test_a_given_url_beats_a_default_that_serves_the_same_gpus() -> None:
    preference = preference_order(["http://node:9400/metrics"], ["http://localhost:9400/metrics"])
    assert duplicates_of({"localhost:9400": A, "node:9400": A}, preference) == {"localhost:9400": "node:9400"}


def test_among_given_urls_the_first_in_the_users_order_wins() -> None:
    served = {"svc:9400": A, "10.0.0.7:9400": A}
    assert duplicates_of(served, ["http://svc:9400/metrics", "http://10.0.0.7:9400/metrics"]) == \
        {"10.0.0.7:9400": "svc:9400"}
    assert duplicates_of(served, ["http://10.0.0.7:9400/metrics", "http://svc:9400/metrics"]) == \
        {"svc:9400": "10.0.0.7:9400"}


def test_endpoints_of_different_gpus_or_only_some_shared_are_all_kept() -> None:
    assert duplicates_of({"a:1": A, "b:1": B}, []) == {}
    assert duplicates_of({"a:1": A, "b:1": {("GPU-a", None), ("GPU-c", None)}}, []) == {}


def test_an_endpoint_serving_a_subset_of_anothers_gpus_is_the_duplicate_whatever_the_order() -> None:
    assert duplicates_of({"given:1": {("GPU-a", None)}, "default:1": A}, ["given:1", "default:1"]) == \
        {"given:1": "default:1"}


def test_mig_instances_are_identities_and_gpus_without_a_uuid_identify_nothing() -> None:
    mig = {("GPU-a", "1"), ("GPU-a", "2")}
    assert duplicates_of({"a:1": mig, "b:1": {("GPU-a", "1")}}, []) == {"b:1": "a:1"}
    unknown = {("unknown:host:0", None)}
    assert duplicates_of({"a:1": unknown, "b:1": unknown}, []) == {}


def test_a_preferred_endpoint_seen_later_drops_the_one_seen_first_once() -> None:
    dedup = Deduplicator(["http://given:9400/metrics", "http://localhost:9400/metrics"])
    assert dedup.observe("localhost:9400", A) == {}
    assert dedup.observe("localhost:9400", A) == {}
    assert dedup.observe("given:9400", A) == {"localhost:9400": "given:9400"}
    assert dedup.observe("given:9400", A) == {}
    assert dedup.dropped == {"localhost:9400": "given:9400"}


class _Meta(NamedTuple):
    identity: tuple[str, str | None]


class _Series(NamedTuple):
    endpoint: str
    meta: _Meta


def test_what_the_live_run_decided_stands_and_the_rule_decides_among_the_rest() -> None:
    series = [_Series(e, _Meta(i)) for e in ("a:1", "b:1", "c:1") for i in sorted(A)]
    kept, dropped = select_series(series, ["a:1", "b:1", "c:1"], {"http://a:1/metrics": "b:1"})
    assert dropped == {"a:1": "b:1", "c:1": "b:1"}
    assert {s.endpoint for s in kept} == {"b:1"}


def test_a_local_reader_and_an_exporter_of_the_same_gpus_are_one_source_live_and_in_the_report(
        tmp_path: Path) -> None:
    """An exporter (default) recorded first, then a local reader the user named: from then on the exporter is
    dropped (said once, its source retired, its pages go nowhere), and the report counts 2 GPUs, not 4."""
    exporter, local = "http://localhost:9400/metrics", "pynvml://localhost"
    writer = LineWriter(tmp_path / "export.jsonl", flush_interval_s=0.0)
    events = LineWriter(tmp_path / "events.jsonl", flush_interval_s=0.0)
    retired: list[str] = []
    pipeline = Pipeline(Normalizer(default_table()), [RecordLogSink(writer)], events, run_id="r",
                        phase=lambda: None, preference=preference_order([local], [exporter]),
                        on_duplicate=retired.append)
    for step in range(4):
        page = dcgm_page(gpus=2, step=step, families=8).encode()
        pipeline.on_page(exporter, FetchedPage(page, (10 + step) * NS, (10 + step) * NS + 1000, CONTENT_TYPE))
        if step >= 1:
            pipeline.on_page(local, FetchedPage(page, (10 + step) * NS + 5000, (10 + step) * NS + 6000, CONTENT_TYPE))
    writer.close()
    events.close()
    assert retired == [exporter]
    sources = [d["telemetry_source_url"] for d in read_dicts(writer.path)]
    assert sources.count(exporter) == 2 * 2 and sources.count(local) == 3 * 2  # the exporter's 2nd page on: none
    states = [d for d in read_dicts(events.path) if d["type"] == "endpoint_state"]
    assert [(s["endpoint"], s["state"], s["reason"]) for s in states] == \
        [(exporter, "duplicate", "duplicate of pynvml://localhost")]
    report = build_report(writer.path, endpoints_configured=[local, exporter])
    assert list(report.telemetry_data["endpoints"]) == ["pynvml://localhost"]
    assert len(report.telemetry_data["endpoints"]["pynvml://localhost"]["gpus"]) == 2
    assert report.telemetry_data["summary"]["duplicate_endpoints"] == \
        [{"endpoint": "localhost:9400", "duplicate_of": "pynvml://localhost"}]


# -- pod selection of a live page (issue 31) ------------------------------------------------------------------

_SHARED_NODE = """\
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",namespace="bench",pod="llm-0",container="vllm"} 100
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b",namespace="bench",pod="llm-1",container="vllm"} 110
DCGM_FI_DEV_POWER_USAGE{gpu="2",UUID="GPU-c",namespace="train",pod="job-0",container="torch"} 120
DCGM_FI_DEV_POWER_USAGE{gpu="3",UUID="GPU-d",namespace="",pod="",container=""} 130
DCGM_FI_DEV_POWER_USAGE{gpu="4",UUID="GPU-e",GPU_I_ID="1",namespace="bench",pod="llm-2"} 140
DCGM_FI_DEV_POWER_USAGE{gpu="4",UUID="GPU-e",GPU_I_ID="2",namespace="train",pod="job-1"} 140
DCGM_FI_DEV_POWER_USAGE{gpu="5",UUID="GPU-f",GPU_I_ID="1",namespace="bench",pod="llm-3"} 150
DCGM_FI_DEV_POWER_USAGE{gpu="5",UUID="GPU-f",GPU_I_ID="2"} 150
dcgm_exporter_up{namespace="bench",pod="llm-0"} 1
"""


def test_a_shared_node_forwards_the_gpus_of_matching_pods_only_and_never_a_board_shared_with_another_pod() -> None:
    chosen = select_pods(parse_page(_SHARED_NODE), parse_pod_patterns(["bench/llm-*"]))
    kept = [(s.labels["UUID"], s.labels.get("GPU_I_ID")) for s in chosen.page.samples]
    # GPU-e's instance 1 serves llm-2 but its board serves job-1 too: not the benchmark's; GPU-f's other instance
    # is unattributed, which shares nothing. A series without a UUID names no GPU and is not forwarded.
    assert kept == [("GPU-a", None), ("GPU-b", None), ("GPU-f", "1")]
    assert (chosen.gpus, chosen.labelled, chosen.selected) == (8, 6, 3)


def test_a_page_without_pod_labels_selects_nothing_and_says_none_is_labelled() -> None:
    page = parse_page('DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 40\n'
                      'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",pod=""} 41\n')
    chosen = select_pods(page, parse_pod_patterns(["bench/*"]))
    assert (chosen.page.samples, chosen.gpus, chosen.labelled, chosen.selected) == ([], 2, 0, 0)
