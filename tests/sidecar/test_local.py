"""Local sources (sidecar/local.py): a reader on a thread of its own hands its pages to the pipeline as a
fetched page is handed, and its failures as failed scrapes."""

from __future__ import annotations

import threading
from pathlib import Path

from bridge.errors import FetchError
from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.record_log import LineWriter, read_dicts
from bridge.sidecar.local import LocalSourceLoop
from bridge.sidecar.pipeline import Pipeline, RecordLogSink
from tests.otlp.pages import dcgm_page

NS = 1_000_000_000


class Reader:
    name = "amdsmi://localhost"

    def __init__(self, fail_at: frozenset[int] = frozenset()) -> None:
        self.fail_at = fail_at
        self.calls = 0
        self.read_enough = threading.Event()
        self.closed = False

    def read(self, sample_ns: int) -> bytes:
        self.calls += 1
        if self.calls >= 4:
            self.read_enough.set()
        if self.calls in self.fail_at:
            raise FetchError("empty", "amdsmi: no device answered")
        return dcgm_page(gpus=2, step=self.calls, families=6).encode()

    def close(self) -> None:
        self.closed = True


def _pipeline(tmp_path: Path) -> tuple[Pipeline, LineWriter, LineWriter]:
    writer = LineWriter(tmp_path / "export.jsonl", flush_interval_s=0.0)
    events = LineWriter(tmp_path / "events.jsonl", flush_interval_s=0.0)
    return Pipeline(Normalizer(default_table()), [RecordLogSink(writer)], events, run_id="r",
                    phase=lambda: None), writer, events


def test_a_local_read_is_recorded_at_its_sample_time_and_a_failed_one_is_a_scrape_error(tmp_path: Path) -> None:
    pipeline, writer, events = _pipeline(tmp_path)
    clock = iter(range(10 * NS, 20 * NS, NS // 10))
    loop = LocalSourceLoop(Reader(fail_at=frozenset({2})), 1.0, pipeline.on_page, pipeline.on_failure,
                           now_ns=lambda: next(clock))
    assert loop.tick() and not loop.tick() and loop.tick()
    writer.close()
    events.close()
    records = list(read_dicts(writer.path))
    assert [(d["timestamp_ns"], d["telemetry_source_url"]) for d in records] == \
        [(10 * NS, Reader.name)] * 2 + [(10 * NS + 3 * NS // 10, Reader.name)] * 2
    failures = [d for d in read_dicts(events.path) if d["type"] == "scrape_error"]
    assert [(d["endpoint"], d["kind"], d["time_ns"]) for d in failures] == [(Reader.name, "empty", 10 * NS + NS // 5)]


def test_a_local_source_ticks_on_a_thread_of_its_own_until_stopped(tmp_path: Path) -> None:
    pipeline, writer, events = _pipeline(tmp_path)
    reader = Reader()
    loop = LocalSourceLoop(reader, 0.01, pipeline.on_page, pipeline.on_failure)
    loop.start()
    assert reader.read_enough.wait(30)
    loop.stop(timeout=5)
    assert reader.closed
    writer.close()
    events.close()
    assert len(list(read_dicts(writer.path))) == 2 * loop.reads >= 2 * 4
