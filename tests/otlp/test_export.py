"""The forwarder's queue, batching and retries (fake sender), and both transports against real servers."""

from __future__ import annotations

import gzip
import logging
import queue
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as ms
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as msg

from bridge import kernel
from bridge.otlp import ExportStats, GrpcSender, HttpSender, OtlpConfig, OtlpForwarder, SendResult
from bridge.parse import PageParser
from tests.otlp.pages import dcgm_page

S = 1_000_000_000
CONFIG = OtlpConfig(endpoint="http://127.0.0.1:1/v1/metrics", max_batch_points=10_000, max_queue_points=2_000)


class FakeSender:
    """Answers from a script; records every body it was given."""

    def __init__(self, *answers: SendResult) -> None:
        self.answers = list(answers)
        self.bodies: list[bytes] = []

    def send(self, parts: list[bytes]) -> SendResult:
        self.bodies.append(b"".join(parts))
        return self.answers.pop(0) if self.answers else SendResult(True, status="200")

    def close(self) -> None:
        pass

    def requests(self) -> list[ms.ExportMetricsServiceRequest]:
        return [ms.ExportMetricsServiceRequest.FromString(b) for b in self.bodies]


def forwarder(sender: FakeSender, config: OtlpConfig = CONFIG, **kw) -> tuple[OtlpForwarder, list[float]]:
    sleeps: list[float] = []
    fwd = OtlpForwarder(
        config,
        base_resource={"service.name": "dcgm-exporter"},
        sender=sender,
        sleep=sleeps.append,
        jitter=lambda: 1.0,
        start=False,
        **kw,
    )
    return fwd, sleeps


def submit_pages(
    fwd: OtlpForwarder, n: int, *, endpoint: str = "a:9400", gpus: int = 2, start: int = 0
) -> int:
    parser = PageParser()
    for step in range(start, start + n):
        page = parser.parse(dcgm_page(gpus=gpus, families=10, step=step))
        fwd.submit(endpoint, page, run_id="r", phase="profiling", ts_ns=(step + 1) * S)
    return n * gpus * 10


def test_submit_only_queues_and_several_pages_go_out_as_one_request():
    sender = FakeSender()
    fwd, _ = forwarder(sender)
    points = submit_pages(fwd, 3) + submit_pages(fwd, 2, endpoint="b:9400")
    assert sender.bodies == [] and fwd.stats().queue_depth_points == points
    assert fwd.export_once()
    (request,) = sender.requests()
    assert len(request.resource_metrics) == 5
    stats = fwd.stats()
    assert (stats.sent_points, stats.sent_requests, stats.queue_depth_points) == (points, 1, 0)


def test_a_batch_is_bounded_by_points_and_the_rest_waits_for_the_next_one():
    sender = FakeSender()
    fwd, _ = forwarder(sender, replace(CONFIG, max_batch_points=50))
    submit_pages(fwd, 5)  # 20 points each
    fwd.export_once()
    fwd.export_once()
    assert [len(r.resource_metrics) for r in sender.requests()] == [3, 2]


def test_a_batch_is_bounded_by_bytes_and_an_encoded_page_is_carried_not_lost():
    sender = FakeSender()
    fwd, _ = forwarder(sender, replace(CONFIG, max_batch_bytes=10_000))  # a 20-point page is ~7 kB
    points = submit_pages(fwd, 4)
    while fwd.export_once():
        pass
    assert [len(r.resource_metrics) for r in sender.requests()] == [1, 1, 1, 1]
    assert all(len(body) <= 10_000 for body in sender.bodies)
    assert fwd.stats().sent_points == points and fwd.stats().queue_depth_points == 0


def test_retryable_failures_back_off_exponentially_with_jitter_until_the_receiver_accepts():
    sender = FakeSender(
        SendResult(False, True, "503"),
        SendResult(False, True, "connect"),
        SendResult(False, True, "UNAVAILABLE"),
    )
    sleeps: list[float] = []
    draws = iter([0.0, 1.0, 0.5])
    fwd = OtlpForwarder(
        CONFIG, base_resource={}, sender=sender, sleep=sleeps.append, jitter=lambda: next(draws), start=False
    )
    points = submit_pages(fwd, 1)
    fwd.export_once()
    assert sleeps == [0.25, 1.0, 1.5]  # 0.5·2^n, times 0.5 + 0.5·jitter
    assert len(set(sender.bodies)) == 1 and len(sender.bodies) == 4
    stats = fwd.stats()
    assert (stats.retried_requests, stats.sent_points, stats.dropped_points) == (3, points, 0)


def test_the_backoff_is_capped_and_retry_after_is_honoured():
    sender = FakeSender(
        *[SendResult(False, True, "503")] * 8, SendResult(False, True, "429", retry_after_s=7.0)
    )
    fwd, sleeps = forwarder(sender, replace(CONFIG, retry_max_backoff_s=4.0))
    submit_pages(fwd, 1)
    fwd.export_once()
    assert max(sleeps[:8]) == 4.0 and sleeps[-1] == 7.0


def test_a_rejected_batch_is_dropped_counted_and_logged_with_the_receivers_message_rate_limited(caplog):
    clock = [0.0]
    sender = FakeSender(*[SendResult(False, False, "400", "out of order sample")] * 3)
    fwd = OtlpForwarder(
        CONFIG,
        base_resource={},
        sender=sender,
        clock=lambda: clock[0],
        sleep=lambda _: None,
        start=False,
        log_interval_s=30.0,
    )
    with caplog.at_level(logging.WARNING, logger="bridge.otlp.export"):
        for step in range(3):
            points = submit_pages(fwd, 1, start=step)
            fwd.export_once()
            clock[0] += 20.0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2  # t=0 and t=40; the one at t=20 is counted in the second
    assert "out of order sample" in warnings[0] and "1 more rejections not logged" in warnings[1]
    stats = fwd.stats()
    assert (stats.rejected_points, stats.failed_requests, stats.sent_points) == (3 * points, 3, 0)
    assert stats.last_error and "400" in stats.last_error


def test_a_partial_success_counts_the_rejected_points():
    sender = FakeSender(SendResult(True, status="200", message="2 bad", rejected_points=2))
    fwd, _ = forwarder(sender)
    points = submit_pages(fwd, 1)
    fwd.export_once()
    assert (fwd.stats().sent_points, fwd.stats().rejected_points) == (points - 2, 2)


def test_when_the_queue_is_full_the_oldest_pages_are_dropped_and_counted():
    sender = FakeSender()
    fwd, _ = forwarder(sender, replace(CONFIG, max_queue_points=100))
    submit_pages(fwd, 8)  # 8 × 20 points, room for 5
    stats = fwd.stats()
    assert (stats.dropped_pages, stats.dropped_points, stats.queue_depth_points) == (3, 60, 100)
    fwd.export_once()
    times = sorted(
        {
            p.time_unix_nano
            for rm in sender.requests()[0].resource_metrics
            for m in rm.scope_metrics[0].metrics
            for p in m.gauge.data_points
        }
    )
    assert times == [4 * S, 5 * S, 6 * S, 7 * S, 8 * S]


def test_a_batch_in_retry_is_given_up_only_when_newer_pages_push_it_out_of_the_queue():
    submitted = threading.Event()

    class Outage(FakeSender):
        def send(self, parts: list[bytes]) -> SendResult:
            self.bodies.append(b"".join(parts))
            if len(self.bodies) == 2:
                submit_pages(fwd, 6, start=10)  # arrives during the outage: exceeds the bound of 100
                submitted.set()
            return SendResult(False, True, "503") if len(self.bodies) < 4 else SendResult(True)

    sender = Outage()
    fwd, _ = forwarder(sender, replace(CONFIG, max_queue_points=100))
    submit_pages(fwd, 2)
    fwd.export_once()  # retried until the bound pushed it out
    assert submitted.is_set()
    stats = fwd.stats()
    assert stats.dropped_points == 40 + 20  # the in-flight batch, then the oldest queued page
    while fwd.export_once():
        pass
    assert fwd.stats().sent_points == 100 and fwd.stats().queue_depth_points == 0


def test_submit_never_raises_into_the_scrape_loop_even_with_a_broken_sender():
    class Broken(FakeSender):
        def send(self, parts: list[bytes]) -> SendResult:
            raise RuntimeError("bug")

    fwd, sleeps = forwarder(Broken(), replace(CONFIG, max_queue_points=20))
    fwd.submit("a:9400", None, run_id="r", phase="p", ts_ns=1)  # type: ignore[arg-type]
    submit_pages(fwd, 1)
    stats = fwd.close(timeout_s=0.2)
    assert stats.queue_depth_points == 0 and stats.dropped_points == 20


def test_an_endpoint_marked_stale_sends_one_marker_per_series():
    sender = FakeSender()
    fwd, _ = forwarder(sender)
    submit_pages(fwd, 1)
    fwd.mark_stale("a:9400", run_id="r", phase="profiling", ts_ns=5 * S)
    fwd.export_once()
    assert fwd.stats().stale_markers == 20


def test_the_export_thread_sends_on_its_interval_and_close_flushes():
    sender = FakeSender()
    fwd = OtlpForwarder(replace(CONFIG, export_interval_s=0.05), base_resource={}, sender=sender)
    points = submit_pages(fwd, 2)
    assert fwd.flush(timeout_s=10)
    points += submit_pages(fwd, 1, start=5)
    stats = fwd.close(timeout_s=10)
    assert stats.sent_points == points and stats.queue_depth_points == 0
    fwd.submit(
        "a:9400", PageParser().parse(dcgm_page()), run_id="r", phase="p", ts_ns=S
    )  # after close: ignored
    assert fwd.stats().queue_depth_points == 0


def test_stats_are_a_frozen_snapshot_ready_for_status_json():
    stats = ExportStats(sent_points=3)
    assert stats.as_dict()["sent_points"] == 3
    with pytest.raises(AttributeError):
        stats.sent_points = 4  # type: ignore[misc]


# -- transports against real servers on loopback ----------------------------------------------
class _Receiver(BaseHTTPRequestHandler):
    answers: queue.Queue[tuple[int, dict[str, str], bytes]]
    got: list[tuple[dict[str, str], bytes]]

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.got.append((dict(self.headers), body))
        status, headers, payload = self.answers.get_nowait() if not self.answers.empty() else (200, {}, b"")
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_receiver() -> Iterator[type[_Receiver]]:
    handler = type("Handler", (_Receiver,), {"answers": queue.Queue(), "got": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}/v1/metrics"  # type: ignore[attr-defined]
    yield handler
    server.shutdown()
    server.server_close()


def test_http_sender_posts_protobuf_with_headers_and_gzip(http_receiver):
    config = OtlpConfig(endpoint=http_receiver.url, compression="gzip", headers=(("x-scope-orgid", "t1"),))
    sender = HttpSender(config)
    assert sender.send([b"\x0a\x00"]).ok
    headers, body = http_receiver.got[0]
    assert headers["Content-Type"] == "application/x-protobuf" and headers["Content-Encoding"] == "gzip"
    assert headers["x-scope-orgid"] == "t1" and gzip.decompress(body) == b"\x0a\x00"
    sender.close()


def test_http_sender_writes_a_request_in_parts_as_one_body_under_its_content_length(http_receiver):
    """A batch's chunks go out one after the other, never joined into one buffer: the receiver reads one body
    of the declared length (not chunked), plain and gzip."""
    parts = [bytes([k]) * (100_000 + k) for k in range(5)]
    for compression in ("none", "gzip"):
        sender = HttpSender(OtlpConfig(endpoint=http_receiver.url, compression=compression))
        assert sender.send(parts).ok
        headers, body = http_receiver.got[-1]
        assert "Transfer-Encoding" not in headers and int(headers["Content-Length"]) == len(body)
        assert (gzip.decompress(body) if compression == "gzip" else body) == b"".join(parts)
        sender.close()


def test_http_sender_maps_statuses_to_retryable_or_not_with_message_and_retry_after(http_receiver):
    partial = ms.ExportMetricsServiceResponse(
        partial_success=ms.ExportMetricsPartialSuccess(rejected_data_points=3, error_message="too old")
    ).SerializeToString()
    for answer in [
        (503, {"Retry-After": "2"}, b""),
        (429, {}, b""),
        (400, {}, b"duplicate sample for timestamp"),
        (200, {"Content-Type": "application/x-protobuf"}, partial),
        (200, {}, b"{}"),
    ]:
        http_receiver.answers.put(answer)
    sender = HttpSender(OtlpConfig(endpoint=http_receiver.url))
    results = [sender.send([b""]) for _ in range(5)]
    assert [(r.ok, r.retryable, r.status) for r in results] == [
        (False, True, "503"),
        (False, True, "429"),
        (False, False, "400"),
        (True, False, "200"),
        (True, False, "200"),
    ]
    assert results[0].retry_after_s == 2.0
    assert results[2].message == "duplicate sample for timestamp"
    assert (results[3].rejected_points, results[3].message) == (3, "too old")


def test_http_sender_reports_a_refused_connection_as_retryable():
    from tests.conftest import free_port

    result = HttpSender(OtlpConfig(endpoint=f"http://127.0.0.1:{free_port()}/v1/metrics", timeout_s=2)).send(
        b""
    )
    assert (result.ok, result.retryable, result.status) == (False, True, "connect")


class _Servicer(msg.MetricsServiceServicer):
    def __init__(self, fail: list[grpc.StatusCode]) -> None:
        self.fail = fail
        self.requests: list[ms.ExportMetricsServiceRequest] = []

    def Export(self, request, context):  # noqa: N802 - the generated servicer's naming
        if self.fail:
            context.abort(self.fail.pop(0), "injected")
        self.requests.append(request)
        return ms.ExportMetricsServiceResponse()


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[_Servicer, int]]:
    servicer = _Servicer([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INVALID_ARGUMENT])
    server = grpc.server(futures.ThreadPoolExecutor(2))
    msg.add_MetricsServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(None)


def test_grpc_sender_sends_the_encoded_bytes_and_maps_status_codes(grpc_receiver):
    servicer, port = grpc_receiver
    sender = GrpcSender(
        OtlpConfig(endpoint=f"127.0.0.1:{port}", protocol="grpc", insecure=True, compression="gzip")
    )
    sender_fwd = OtlpForwarder(CONFIG, base_resource={}, sender=sender, sleep=lambda _: None, start=False)
    first = sender.send([b""])
    second = sender.send([b""])
    assert (first.retryable, first.status) == (True, "UNAVAILABLE")
    assert (second.retryable, second.status) == (False, "INVALID_ARGUMENT")
    points = submit_pages(sender_fwd, 2)
    sender_fwd.export_once()
    (request,) = servicer.requests
    assert (
        sum(
            len(m.gauge.data_points) + len(m.sum.data_points)
            for rm in request.resource_metrics
            for m in rm.scope_metrics[0].metrics
        )
        == points
    )
    sender_fwd.close()


def _times(body: bytes) -> list[int]:
    """Every point's time in a request, in order."""
    request = ms.ExportMetricsServiceRequest.FromString(body)
    return [p.time_unix_nano for rm in request.resource_metrics for m in rm.scope_metrics[0].metrics
            for p in (m.gauge.data_points or m.sum.data_points)]


def _one_template(fwd: OtlpForwarder, parser: PageParser, steps: range) -> None:
    """Pages of one endpoint from one parser: after the second, each is filled by its plan into a pool buffer."""
    for step in steps:
        fwd.submit("a:9400", parser.parse(dcgm_page(gpus=2, families=10, step=step)), run_id="r", phase="profiling",
                   ts_ns=(step + 1) * S)


needs_kernel = pytest.mark.skipif(not kernel.COMPILED, reason="pool buffers are the compiled kernel's (not built here)")


def test_a_steady_endpoints_pages_each_send_their_own_bytes_and_give_their_buffers_back(http_receiver):
    """Page after page of one template, one page a batch and the next one carried (it holds its buffer over the
    batch boundary), one batch retried, all through the HTTP sender: every request carries its own pages' times
    (a buffer written again while held would send a later page's), the retry the same bytes, and once a batch
    is done no buffer is lent but the carried page's."""
    from bridge.otlp import HttpSender

    config = replace(CONFIG, endpoint=http_receiver.url, max_batch_bytes=8_000)  # a page is ~7.5 kB
    fwd, _ = forwarder(HttpSender(config), config)  # type: ignore[arg-type]
    http_receiver.answers.put((503, {"Retry-After": "0"}, b""))
    parser = PageParser()
    for step in range(0, 16, 2):
        _one_template(fwd, parser, range(step, step + 2))
        assert fwd.export_once()
        assert fwd.buffers_lent() <= 1  # the carried page's, if the kernel filled it
    while fwd.export_once():
        pass
    assert fwd.buffers_lent() == 0
    sent = [_times(body) for _, body in http_receiver.got]
    assert len(sent) == 17 and sent[0] == sent[1]  # 16 one-page batches, the first twice
    assert [request[0] for request in sent[1:]] == [(step + 1) * S for step in range(16)]
    assert all(len(set(request)) == 1 for request in sent)  # each page its own time, in all its points
    fwd.close()


class _Watching(FakeSender):
    """Answers from a script, and notes how many buffers were lent while each request was sent."""

    def __init__(self, *answers: SendResult) -> None:
        super().__init__(*answers)
        self.fwd: OtlpForwarder | None = None
        self.lent: list[int] = []

    def send(self, parts: list[bytes]) -> SendResult:
        assert self.fwd is not None
        self.lent.append(self.fwd.buffers_lent())
        return super().send(parts)


@needs_kernel
@pytest.mark.parametrize("ending", ["sent", "rejected", "pushed out by newer pages", "given up at close"])
def test_a_batch_gives_its_pages_buffers_back_however_it_ends(ending: str) -> None:
    """Sent, rejected, given up while retrying because newer pages pushed it out of the queue, or given up when
    close() ran out of time: afterwards no buffer is lent (while it was being sent, its pages held theirs)."""
    retry = SendResult(False, True, "503")
    answers = {"sent": [], "rejected": [SendResult(False, False, "400")] * 4, "pushed out by newer pages": [retry] * 3,
               "given up at close": [retry] * 10_000}[ending]
    sender = _Watching(*answers)
    config = replace(CONFIG, max_queue_points=100, retry_initial_backoff_s=0.01, retry_max_backoff_s=0.01)
    parser = PageParser()
    if ending == "given up at close":  # close() sends what is queued, retrying until its time is up
        sender.fwd = fwd = OtlpForwarder(config, base_resource={}, sender=sender, start=False,
                                         sleep=lambda _: time.sleep(0.01))  # a few retries in 0.2 s, not thousands
        _one_template(fwd, parser, range(4))
        stats = fwd.close(timeout_s=0.2)
        assert stats.dropped_points == 80 and stats.sent_points == 0 and len(sender.bodies) >= 2
    else:
        sender.fwd = fwd = forwarder(sender, config)[0]
        _one_template(fwd, parser, range(4))
        if ending == "pushed out by newer pages":
            sender.answers.insert(1, retry)
            real_send = sender.send

            def send_then_push(parts: list[bytes]) -> SendResult:
                if len(sender.bodies) == 1:
                    _one_template(fwd, parser, range(4, 10))  # arrives during the outage: over the bound of 100
                return real_send(parts)

            sender.send = send_then_push  # type: ignore[method-assign]
        while fwd.export_once():
            pass
        fwd.close()
    assert max(sender.lent) >= 2  # the plan's pages held their buffers while sent
    assert fwd.buffers_lent() == 0


@needs_kernel
def test_pages_carried_to_a_next_batch_give_their_buffers_back_when_close_drops_them() -> None:
    sender = _Watching()
    sender.fwd = fwd = forwarder(sender, replace(CONFIG, max_batch_bytes=8_000))[0]  # one ~7.5 kB page a batch
    _one_template(fwd, PageParser(), range(4))
    fwd.export_once()
    fwd.export_once()  # the third page, filled by its plan, is carried
    assert fwd.buffers_lent() == 1
    sender.answers = [SendResult(False, True, "503")] * 100
    stats = fwd.close(timeout_s=0)
    assert (stats.dropped_pages, stats.dropped_points, fwd.buffers_lent()) == (2, 40, 0)


def test_close_does_not_wait_for_a_receiver_that_cannot_be_reached_and_counts_the_queue_as_dropped():
    """Issue 33: an unreachable receiver stalled the end of a run for the whole close timeout. Its last attempt
    could not connect, so close gives the queue up at once, counted; a receiver that answers is still waited for."""
    from tests.conftest import free_port

    config = replace(CONFIG, endpoint=f"http://127.0.0.1:{free_port()}/v1/metrics", export_interval_s=0.05,
                     timeout_s=2)
    fwd = OtlpForwarder(config, base_resource={}, sleep=lambda _s: None)
    points = submit_pages(fwd, 2)
    deadline = time.monotonic() + 20
    while fwd.stats().retried_requests == 0 and time.monotonic() < deadline:  # an attempt could not connect
        time.sleep(0.01)
    assert fwd.stats().retried_requests > 0
    started = time.monotonic()
    stats = fwd.close(timeout_s=60)
    assert time.monotonic() - started < 10  # not the 60 s timeout
    assert stats.sent_points == 0 and stats.dropped_points == points and stats.queue_depth_points == 0
