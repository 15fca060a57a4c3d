"""The OTLP queue's byte budget (issue 34): what waiting pages hold bounds the queue, not their point count."""

from __future__ import annotations

from dataclasses import replace

from bridge.otlp import OtlpConfig, SendResult
from bridge.otlp.export import held_bytes
from bridge.parse import PageParser, TemplatedPage
from bridge.samples import ParsedPage
from tests.otlp.pages import dcgm_page
from tests.otlp.test_export import FakeSender, forwarder

S = 1_000_000_000
CONFIG = OtlpConfig(endpoint="http://127.0.0.1:1/v1/metrics", max_batch_points=10_000)


def pages(n: int, *, start: int = 0) -> list[TemplatedPage]:
    """`n` successive pages of one exporter (2 GPUs × 10 families), as the scrape loop hands them over (the
    first, read line by line, holds its samples too)."""
    parser = PageParser()
    out = []
    for step in range(start, start + n):
        page = parser.parse(dcgm_page(gpus=2, families=10, step=step))
        assert isinstance(page, TemplatedPage)
        out.append(page)
    return out


def submit(fwd, batch, *, start: int = 0) -> None:
    for step, page in enumerate(batch, start):
        fwd.submit("a:9400", page, run_id="r", phase="profiling", ts_ns=(step + 1) * S)


def sent_times(sender: FakeSender) -> list[int]:
    return sorted({p.time_unix_nano for request in sender.requests() for rm in request.resource_metrics
                   for m in rm.scope_metrics[0].metrics for p in m.gauge.data_points})


def test_pages_past_the_byte_budget_drop_the_oldest_and_are_counted():
    batch = pages(8)
    sizes = [held_bytes(page, 20) for page in batch]
    budget = sum(sizes[-5:])  # room for the newest five
    sender = FakeSender()
    fwd, _ = forwarder(sender, replace(CONFIG, max_queue_bytes=budget))
    submit(fwd, batch)
    stats = fwd.stats()
    assert (stats.dropped_pages, stats.dropped_points) == (3, 60)
    assert stats.queue_depth_bytes == budget and stats.queue_depth_points == 100
    fwd.export_once()
    assert sent_times(sender) == [4 * S, 5 * S, 6 * S, 7 * S, 8 * S]
    assert fwd.stats().queue_depth_bytes == 0


def test_the_budget_counts_what_a_page_holds_so_pages_read_line_by_line_fit_fewer():
    templated = pages(3)[-1]  # matched the template: its values only
    alone = held_bytes(templated, 20)
    parsed = ParsedPage(list(templated.samples), templated.types, templated.helps, [])  # 20 Sample tuples
    assert held_bytes(parsed, 20) > 2 * alone
    assert held_bytes(templated, 20) > held_bytes(parsed, 20)  # its samples, once built, count too
    budget = 4 * held_bytes(parsed, 20)
    fwd, _ = forwarder(FakeSender(), replace(CONFIG, max_queue_bytes=budget))
    for step in range(10):
        fwd.submit("a:9400", parsed, run_id="r", phase="p", ts_ns=(step + 1) * S)
    assert fwd.stats().queue_depth_pages == 4 and fwd.stats().dropped_pages == 6
    fwd2, _ = forwarder(FakeSender(), replace(CONFIG, max_queue_bytes=budget))
    submit(fwd2, pages(11)[1:])  # ten templated pages of the same points
    assert fwd2.stats().dropped_pages == 0 and fwd2.stats().queue_depth_pages == 10


def test_a_batch_held_in_retry_counts_against_the_budget_and_goes_first():
    batch = pages(9)[1:]  # all matched the template: the same size each
    budget = sum(held_bytes(page, 20) for page in batch[:5])

    class Outage(FakeSender):
        def send(self, parts):
            self.bodies.append(b"".join(parts))
            if len(self.bodies) == 2:
                submit(fwd, batch[2:], start=2)  # six more pages arrive during the outage: over the budget
            if len(self.bodies) < 4:
                return SendResult(False, True, "503")
            return super().send(parts)

    sender = Outage()
    fwd, _ = forwarder(sender, replace(CONFIG, max_queue_bytes=budget))
    submit(fwd, batch[:2])
    assert fwd.stats().queue_depth_bytes == sum(held_bytes(page, 20) for page in batch[:2])
    fwd.export_once()  # retried until the newer pages pushed it out of the budget
    stats = fwd.stats()
    assert stats.dropped_points == 40 + 20  # the two pages in flight, then the oldest waiting one
    while fwd.export_once():
        pass
    assert fwd.stats().sent_points == 100 and fwd.stats().queue_depth_bytes == 0


def test_a_point_bound_still_applies_beside_the_byte_budget_when_set():
    fwd, _ = forwarder(FakeSender(), replace(CONFIG, max_queue_points=60))
    submit(fwd, pages(5))
    stats = fwd.stats()
    assert (stats.dropped_pages, stats.queue_depth_points) == (2, 60)


def test_by_default_the_queue_has_no_point_bound_and_a_16_mib_budget():
    config = OtlpConfig(endpoint="http://127.0.0.1:1/v1/metrics")
    assert config.max_queue_points is None and config.max_queue_bytes == 16 * 2**20
    fwd, _ = forwarder(FakeSender(), config)
    submit(fwd, pages(2000))  # 40,000 points, under a megabyte of values
    assert fwd.stats().dropped_points == 0 and fwd.stats().queue_depth_points == 40_000
