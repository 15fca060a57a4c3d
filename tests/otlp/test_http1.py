"""The OTLP/HTTP sender's own HTTP/1.1 client (bridge/otlp/http1.py) against real servers on 127.0.0.1 that
answer the way receivers and proxies do: chunked, to the close, 100 Continue first, closing kept-alive
connections, never answering, over TLS; every case through `HttpSender`, the way the forwarder calls it."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as ms

from bridge.otlp import HttpSender, OtlpConfig
from tests.loopback import LoopbackServer, send

Script = Callable[[socket.socket, bytes], bool]  # (connection, request) -> keep the connection open


class RawServer:
    """Reads each request on a connection (head + Content-Length body) and lets `script` answer it in bytes."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/metrics"
        self.connections = 0
        self.closed = threading.Semaphore(0)  # released as the server closes each connection
        self.requests: list[bytes] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        try:
            self._requests(conn)
        finally:
            self.closed.release()

    def _requests(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                self.requests.append(head + b"\r\n\r\n" + body)
                if not self.script(conn, body):
                    return

    def close(self) -> None:
        self._stop = True
        self.listener.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[[Script], RawServer]]:
    servers: list[RawServer] = []

    def start(script: Script) -> RawServer:
        servers.append(RawServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


PARTIAL = ms.ExportMetricsServiceResponse(
    partial_success=ms.ExportMetricsPartialSuccess(rejected_data_points=7, error_message="out of order")
).SerializeToString()


_SENDERS: list[HttpSender] = []


@pytest.fixture(autouse=True)
def _close_senders() -> Iterator[None]:
    yield
    while _SENDERS:
        _SENDERS.pop().close()


def sender_for(url: str, **settings: object) -> HttpSender:
    """An HttpSender closed after the test (its connection would otherwise be left to the collector)."""
    _SENDERS.append(HttpSender(OtlpConfig(endpoint=url, **settings)))  # type: ignore[arg-type]
    return _SENDERS[-1]


def test_a_chunked_answer_is_read_whole_and_the_connection_kept(raw_server):
    def chunked(conn: socket.socket, _body: bytes) -> bool:
        halves = PARTIAL[:5], PARTIAL[5:]
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"".join(b"%x;ext=1\r\n%s\r\n" % (len(part), part) for part in halves) + b"0\r\nX-T: 1\r\n\r\n")
        return True

    server = raw_server(chunked)
    sender = sender_for(server.url)
    results = [sender.send([b"\x0a\x00"]) for _ in range(3)]
    sender.close()
    assert [(r.ok, r.rejected_points, r.message) for r in results] == [(True, 7, "out of order")] * 3
    assert server.connections == 1


def test_an_answer_without_a_length_ends_at_the_close_and_the_next_request_reconnects(raw_server):
    def to_close(conn: socket.socket, _body: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\n\r\nbusy, try later")
        return False

    server = raw_server(to_close)
    sender = sender_for(server.url)
    results = [sender.send([b"x" * 1000]) for _ in range(2)]
    sender.close()
    assert [(r.ok, r.retryable, r.status, r.message, r.retry_after_s) for r in results] == [
        (False, True, "503", "busy, try later", 3.0)] * 2
    assert server.connections == 2


def test_interim_answers_before_the_real_one_are_skipped(raw_server):
    def interim(conn: socket.socket, _body: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
                     b"HTTP/1.1 400 Bad Request\r\nContent-Length: 8\r\n\r\nbad data")
        return True

    result = sender_for(raw_server(interim).url).send([b"\x0a\x00"])
    assert (result.ok, result.retryable, result.status, result.message) == (False, False, "400", "bad data")


def test_a_kept_alive_connection_the_receiver_closed_while_idle_is_replaced(raw_server):
    """A receiver's idle timeout closes the connection between two exports: the next one goes on a new one."""

    def answer_then_close_soon(conn: socket.socket, _body: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")  # says keep-alive, then closes
        return False

    server = raw_server(answer_then_close_soon)
    sender = sender_for(server.url)
    first = sender.send([b"a"])
    assert server.closed.acquire(timeout=10)  # the server has closed the connection: its FIN is on its way
    second = sender.send([b"b"])
    sender.close()
    assert first.ok and second.ok
    assert server.connections == 2 and [request[-1:] for request in server.requests] == [b"a", b"b"]


def test_a_request_the_receiver_drops_unanswered_is_sent_once_more_only_on_a_reused_connection(raw_server):
    """A kept-alive connection can close as the request goes out: the receiver never saw it, so it goes once
    more on a new connection. A new connection closed without an answer is a failed, retryable attempt."""
    answers = iter([True, False, True])  # answer, drop unanswered, answer

    def flaky(conn: socket.socket, _body: bytes) -> bool:
        if next(answers):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            return True
        return False

    server = raw_server(flaky)
    sender = sender_for(server.url)
    assert sender.send([b"1"]).ok
    assert sender.send([b"2"]).ok  # dropped on the kept connection, then sent again
    assert server.connections == 2 and len(server.requests) == 3

    dropper = raw_server(lambda conn, body: False)
    result = sender_for(dropper.url).send([b"3"])
    assert (result.ok, result.retryable, result.status) == (False, True, "connect")
    assert dropper.connections == 1 and "without an answer" in result.message


@pytest.mark.parametrize("then", ["closes", "stops reading"])
def test_an_answer_before_the_whole_body_is_read_as_the_answer(then: str):
    """A receiver refusing a body too large answers at its head without reading the rest (the Collector's
    max_request_body_size), then closes or just stops reading: either way its 413 is the result, not a retry
    or a timeout."""
    listener = socket.create_server(("127.0.0.1", 0))
    connections = []

    def refuse() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections.append(conn)
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            conn.sendall(b"HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Length: 13\r\n\r\n"
                         b"body too big\n")
            if then == "closes":
                conn.close()

    threading.Thread(target=refuse, daemon=True).start()
    sender = sender_for(f"http://127.0.0.1:{listener.getsockname()[1]}/v1/metrics", timeout_s=5)
    result = sender.send([b"x" * (16 << 20)])  # (waiting for the rest of the body to go out: a "timeout")
    listener.close()
    for conn in connections:
        conn.close()
    assert (result.ok, result.retryable, result.status, result.message) == (False, False, "413", "body too big")


def test_a_receiver_that_never_answers_is_a_timeout_within_the_budget(raw_server):
    """The receiver holds the request unanswered until the test ends (at most 30 s), then closes: the result is
    the sender's own timeout, not that close ("connect", without an answer)."""
    done = threading.Event()
    server = raw_server(lambda conn, body: (done.wait(30), False)[1])
    result = sender_for(server.url, timeout_s=0.5).send([b"x"])
    done.set()
    assert (result.ok, result.retryable, result.status) == (False, True, "timeout")


def test_an_oversized_error_page_gives_its_start_and_a_new_connection_next(raw_server):
    def huge(conn: socket.socket, _body: bytes) -> bool:
        page = b"<html>proxy error " + b"x" * (6 * 1024 * 1024)
        conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: %d\r\n\r\n" % len(page))
        with contextlib.suppress(OSError):  # the client stops reading: it needs the page's start only
            conn.sendall(page)
        return False

    server = raw_server(huge)
    sender = sender_for(server.url)
    result = sender.send([b"x"])
    assert (result.ok, result.retryable, result.status) == (False, True, "502")
    assert result.message.startswith("<html>proxy error")


def test_a_malformed_answer_is_a_failed_retryable_attempt(raw_server):
    server = raw_server(lambda conn, body: (conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n"), False)[1])
    result = sender_for(server.url).send([b"x"])
    assert (result.ok, result.retryable, result.status) == (False, True, "connect")
    assert "not an HTTP/1.x answer" in result.message


def test_tls_with_the_receivers_ca_and_an_unknown_certificate_refused(certificate: tuple[Path, Path]):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    def receive(handler: BaseHTTPRequestHandler) -> None:
        handler.rfile.read(int(handler.headers["Content-Length"]))
        send(handler, b"", content_type="application/x-protobuf")

    with LoopbackServer(receive, tls=context) as server:
        url = server.url.replace("/metrics", "/v1/metrics")
        trusted = sender_for(url, certificate=str(certificate[0]))
        results = [trusted.send([b"\x0a\x00" * 50_000, b"\x0a\x00"]) for _ in range(2)]
        trusted.close()
        unknown = sender_for(url).send([b"\x0a\x00"])
    assert [r.ok for r in results] == [True, True] and server.connections == 1
    assert server.requests[0]["Content-Length"] == str(100_002)
    assert (unknown.ok, unknown.status) == (False, "connect") and "certificate" in unknown.message.lower()
