"""One series (metric name and label set) twice on one page (issue 27 item 8): an exporter bug, or two collectors.

The default keeps the first, as Prometheus does, and counts the pages whose duplicates differ (the report's
error_summary and verdict say how many, reason `duplicate_series`); AIPerf's compat mode keeps its last-wins
values. Identical duplicates are no error. Both the compiled kernel and the pure-Python path follow the plan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import kernel
from bridge.fetch import FetchedPage
from bridge.fields import default_table
from bridge.normalize import Normalizer, duplicate_rule
from bridge.parse import parse_page
from bridge.record_log import read_dicts
from bridge.report.build import build_report_from_events
from bridge.report.window import explicit_window
from bridge.samples import GpuRecord
from tests.sidecar.test_pipeline import Recorder

S = 1_000_000_000
URL = "http://a:9400/metrics"
LABELS = 'gpu="0",UUID="GPU-00000000-0000-0000-0000-000000000000",modelName="H100",Hostname="n"'


def page(power: float, again: float, energy_mj: int = 1_000_000) -> bytes:
    return (f"DCGM_FI_DEV_POWER_USAGE{{{LABELS}}} {power}\n"
            f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{LABELS}}} {energy_mj}\n"
            f"DCGM_FI_DEV_POWER_USAGE{{{LABELS}}} {again}\n").encode()


@contextlib.contextmanager
def on(path: str) -> Iterator[None]:
    if path == "python":
        with kernel.python_path():
            yield
    else:
        if not kernel.COMPILED:
            pytest.skip("the kernel is not built here (no C compiler)")
        yield


def normalise(normalizer: Normalizer, body: bytes, path: str) -> list[GpuRecord]:
    parsed = parse_page(body)
    with on(path):
        compiled = normalizer.compiled(parsed, source_url=URL, timestamp_ns=1)
        assert (compiled is not None) == (path == "compiled")  # the path under test is the one taken
        return compiled.records() if compiled is not None else normalizer.records(parsed, source_url=URL,
                                                                                  timestamp_ns=1)


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_the_default_keeps_the_first_and_counts_the_page_whose_duplicates_differ(path: str) -> None:
    normalizer = Normalizer(default_table())
    (gpu,) = normalise(normalizer, page(300.0, 250.0), path)
    assert gpu.telemetry_data["nvidia_power_usage"] == 300.0
    (found,) = normalizer.take_duplicates()
    assert (found.source_url, found.differing, found.name) == (URL, 1, "DCGM_FI_DEV_POWER_USAGE")
    normalise(normalizer, page(310.0, 260.0), path)
    assert len(normalizer.take_duplicates()) == 1  # one per page


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_compat_mode_keeps_aiperfs_last_value_and_still_counts(path: str) -> None:
    normalizer = Normalizer(default_table(), keep=duplicate_rule("aiperf"))
    (gpu,) = normalise(normalizer, page(300.0, 250.0), path)
    assert gpu.telemetry_data["nvidia_power_usage"] == 250.0  # AIPerf's dict: the last line wins
    assert [d.differing for d in normalizer.take_duplicates()] == [1]


@pytest.mark.parametrize("path", ["compiled", "python"])
@pytest.mark.parametrize("mode", ["interpolated", "aiperf"])
def test_identical_duplicates_are_no_error(path: str, mode: str) -> None:
    normalizer = Normalizer(default_table(), keep=duplicate_rule(mode))  # type: ignore[arg-type]
    (gpu,) = normalise(normalizer, page(300.0, 300.0), path)
    assert gpu.telemetry_data["nvidia_power_usage"] == 300.0
    assert normalizer.take_duplicates() == []


def test_only_the_default_mode_keeps_the_first() -> None:
    assert (duplicate_rule("interpolated"), duplicate_rule("aiperf")) == ("first", "last")


def test_the_sidecar_counts_differing_pages_in_the_events_error_summary_and_verdict(tmp_path: Path) -> None:
    """Ten pages at 1 s, three of them with a differing duplicate: three `duplicate_series` events, counted once
    in error_summary and as the verdict's reason; the scrapes still count as good (their pages were used)."""
    from bridge.record_log import LineWriter
    from bridge.sidecar.pipeline import Pipeline

    events = LineWriter(tmp_path / "events.jsonl", flush_interval_s=0.0)
    recorder = Recorder()
    pipe = Pipeline(Normalizer(default_table()), [recorder], events, run_id="r",  # type: ignore[list-item]
                    phase=lambda: "profiling")
    for t in range(10):
        again = 250.0 if t in (2, 5, 7) else 300.0
        pipe.on_page(URL, FetchedPage(page(300.0, again, 1_000_000 + 300_000 * t), t * S, t * S + 1000,
                                      "text/plain"))
    events.close()
    assert [e["time_ns"] for e in read_dicts(events.path) if e.get("kind") == "duplicate_series"] == [2 * S, 5 * S,
                                                                                                     7 * S]
    records = [r for p in recorder.pages for r in p.records]
    assert {r.telemetry_data["nvidia_power_usage"] for r in records} == {300.0}
    report = build_report_from_events(records, events.path, window=explicit_window(1 * S, 8 * S, 0))
    (error,) = report.telemetry_data["error_summary"]
    assert error["error_details"]["type"] == "duplicate_series" and error["count"] == 3
    verdict = report.telemetry_data["measurement"]
    assert verdict["valid"] is False and verdict["reasons"] == ["duplicate_series"]
    assert verdict["duplicate_series_pages"] == 3 and "collectors" in verdict["fixes"]["duplicate_series"]


@pytest.mark.parametrize(("mode", "kept"), [("interpolated", 300.0), ("aiperf", 250.0)])
def test_a_page_without_a_template_follows_the_same_rule(mode: str, kept: float) -> None:
    """Samples with timestamps make a page no template can repeat (parse/lines.py): the looped rules, the same
    choice and count."""
    body = page(300.0, 250.0).replace(b" 300.0\n", b" 300.0 1800000000000\n")
    parsed = parse_page(body)
    assert not hasattr(parsed, "template")
    normalizer = Normalizer(default_table(), keep=duplicate_rule(mode))  # type: ignore[arg-type]
    (gpu,) = normalizer.records(parsed, source_url=URL, timestamp_ns=1)
    assert gpu.telemetry_data["nvidia_power_usage"] == kept
    assert [d.differing for d in normalizer.take_duplicates()] == [1]
