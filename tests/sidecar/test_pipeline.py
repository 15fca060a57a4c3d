"""The per-page pipeline (sidecar/pipeline.py): every sink takes every page, and what pages and failures say
about their endpoints reaches the events file as typed events."""

from __future__ import annotations

from pathlib import Path

from bridge.errors import FetchError
from bridge.fetch import FetchedPage
from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.record_log import LineWriter, read_dicts
from bridge.sidecar.pipeline import LatestRecords, Page, Pipeline
from tests.otlp.pages import dcgm_page

NS = 1_000_000_000
URL_A, URL_B = "http://user:pw@a:9400/metrics", "http://b:9400/metrics"


class Recorder:
    def __init__(self) -> None:
        self.pages: list[Page] = []

    def take(self, page: Page) -> None:
        self.pages.append(page)


def pipeline(tmp_path: Path, *sinks: object) -> tuple[Pipeline, LineWriter]:
    events = LineWriter(tmp_path / "events.jsonl", flush_interval_s=0.0)
    return Pipeline(Normalizer(default_table()), list(sinks), events, run_id="r",  # type: ignore[arg-type]
                    phase=lambda: "profiling"), events


def fetched(t: int, node: int = 0) -> FetchedPage:
    """A page of 2 GPUs; another `node`'s are other GPUs (the same GPUs at two URLs are one source: select.py)."""
    page = dcgm_page(gpus=2).replace("-1343419b1a1c", f"-{node:012x}" if node else "-1343419b1a1c")
    return FetchedPage(page.encode(), t * NS, t * NS + 1000, "text/plain")


def test_every_sink_takes_every_page_in_the_order_handed_over(tmp_path: Path) -> None:
    recorder, latest = Recorder(), LatestRecords()
    pipe, _ = pipeline(tmp_path, recorder, latest)
    pages = [pipe.on_page(URL_A, fetched(1)), pipe.on_page(URL_B, fetched(1, node=2))]
    assert [p.display for p in recorder.pages] == ["a:9400", "b:9400"]
    assert pages[0].endpoint == "http://REDACTED@a:9400/metrics" and pages[0].phase == "profiling"
    assert {display for display, _ in latest.latest} == {"a:9400", "b:9400"}


def test_a_failure_marks_its_endpoint_down_once_and_the_next_page_brings_it_up(tmp_path: Path) -> None:
    pipe, events = pipeline(tmp_path, Recorder())
    pipe.on_failure(URL_A, FetchError("timeout", "slow"), 1 * NS)
    pipe.on_failure(URL_A, FetchError("timeout", "slow"), 2 * NS)
    pipe.on_page(URL_A, fetched(3))
    events.close()
    got = [(e["type"], e.get("kind") or e.get("state")) for e in read_dicts(events.path)]
    assert got == [("scrape_error", "timeout"), ("endpoint_state", "down"), ("scrape_error", "timeout"),
                   ("endpoint_state", "up")]
