"""The scrape path's HTTP client (bridge/fetch.py, libcurl) against real servers on 127.0.0.1.

Each case is a handler that misbehaves one way; the fetcher must name the failure with its kind and a
message a person can act on, and never hold the page's credentials in it.
"""

from __future__ import annotations

import fcntl
import gzip
import socket
import ssl
import struct
import termios
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from bridge.fetch import SETTLE_S, FetchError, FetchSettings, make_fetcher
from tests.loopback import LoopbackServer, Respond, send

PAGE = b'# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 41\n' * 20

def ok(handler: BaseHTTPRequestHandler) -> None:
    send(handler, PAGE)


def fetch_error(url: str, **settings: object) -> FetchError:
    fetcher = make_fetcher(FetchSettings(**settings))  # type: ignore[arg-type]
    try:
        with pytest.raises(FetchError) as info:
            fetcher.fetch(url)
    finally:
        fetcher.close()
    return info.value


def test_a_page_is_fetched_with_its_content_type_and_times() -> None:
    with LoopbackServer(ok) as server:
        fetcher = make_fetcher(FetchSettings())
        before = time.time_ns()
        page = fetcher.fetch(server.url)
        fetcher.close()
    assert page.body == PAGE and page.content_type == "text/plain"
    assert before <= page.start_ns <= page.end_ns <= time.time_ns()


def test_the_connection_is_kept_alive_between_scrapes() -> None:
    with LoopbackServer(ok) as server:
        fetcher = make_fetcher(FetchSettings())
        for _ in range(5):
            fetcher.fetch(server.url)
        fetcher.close()
    assert len(server.requests) == 5 and server.connections == 1


def test_gzip_is_asked_for_and_decoded() -> None:
    def compressed(handler: BaseHTTPRequestHandler) -> None:
        send(handler, gzip.compress(PAGE), headers={"Content-Encoding": "gzip"})

    with LoopbackServer(compressed) as server:
        fetcher = make_fetcher(FetchSettings())
        page = fetcher.fetch(server.url)
        fetcher.close()
    assert page.body == PAGE
    assert "gzip" in server.requests[0]["Accept-Encoding"]


def test_corrupt_gzip_is_an_incomplete_body() -> None:
    def corrupt(handler: BaseHTTPRequestHandler) -> None:
        send(handler, gzip.compress(PAGE)[:40] + b"\x00" * 40, headers={"Content-Encoding": "gzip"})

    with LoopbackServer(corrupt) as server:
        error = fetch_error(server.url)
    assert error.kind == "truncated"


def chunked(handler: BaseHTTPRequestHandler, chunks: Iterator[bytes]) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    try:
        for chunk in chunks:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        handler.wfile.write(b"0\r\n\r\n")
    except OSError:
        pass  # the client hung up, as it should past the limit


@pytest.fixture(params=["libcurl", "callback"])
def body_limit(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Who stops a body over the limit: libcurl itself (8.20+), or the counting write callback (older)."""
    if request.param == "callback":
        monkeypatch.setattr("bridge.fetch._CURL_LIMITS_BODIES", 1 << 32)
    return str(request.param)


@pytest.mark.parametrize("declared", [True, False], ids=["Content-Length", "chunked"])
def test_a_body_over_the_limit_is_refused_whether_declared_or_streamed(declared: bool, body_limit: str) -> None:
    big = PAGE * 100  # ~170 KB

    def respond(handler: BaseHTTPRequestHandler) -> None:
        if declared:
            send(handler, big)
        else:
            chunked(handler, iter([big[i:i + 8192] for i in range(0, len(big), 8192)]))

    with LoopbackServer(respond) as server:
        error = fetch_error(server.url, max_body_bytes=64 * 1024)
    assert error.kind == "too_large"
    assert "65,536-byte limit" in error.message and "DCGM_BRIDGE_MAX_BODY_BYTES" in error.message


def test_a_gzip_bomb_is_measured_decoded(body_limit: str) -> None:
    def bomb(handler: BaseHTTPRequestHandler) -> None:
        send(handler, gzip.compress(b"#" * 4_000_000), headers={"Content-Encoding": "gzip"})

    with LoopbackServer(bomb) as server:
        error = fetch_error(server.url, max_body_bytes=1024 * 1024)
    assert error.kind == "too_large"


def test_an_exporter_that_never_answers_is_a_timeout() -> None:
    release = threading.Event()

    def silent(handler: BaseHTTPRequestHandler) -> None:
        release.wait(5)

    with LoopbackServer(silent) as server:
        error = fetch_error(server.url, read_timeout=0.2)
        release.set()
    assert error.kind == "timeout" and "did not answer within 0.2 s" in error.message


def test_an_exporter_that_stalls_mid_body_is_a_timeout_that_says_so() -> None:
    release = threading.Event()

    def stall(handler: BaseHTTPRequestHandler) -> None:
        def chunks() -> Iterator[bytes]:
            yield PAGE
            handler.wfile.flush()
            release.wait(5)
            yield PAGE

        chunked(handler, chunks())

    with LoopbackServer(stall) as server:
        error = fetch_error(server.url, read_timeout=0.3)
        release.set()
    assert error.kind == "timeout" and "stalled mid-body" in error.message


def test_a_connection_cut_mid_body_is_truncated() -> None:
    def cut(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(PAGE) * 2))
        handler.end_headers()
        handler.wfile.write(PAGE)
        handler.close_connection = True

    with LoopbackServer(cut) as server:
        error = fetch_error(server.url)
    assert error.kind == "truncated" and "incomplete body" in error.message


def test_status_json_and_empty_answers_are_named() -> None:
    answers: list[Respond] = [
        lambda h: send(h, b"oops", status=503),
        lambda h: send(h, b'{"a": 1}', content_type="application/json"),
        lambda h: send(h, b"  \n"),
    ]
    kinds = []
    for respond in answers:
        with LoopbackServer(respond) as server:
            kinds.append(fetch_error(server.url).kind)
    assert kinds == ["http_status", "content_type", "empty"]


def test_a_redirect_is_not_followed() -> None:
    def moved(handler: BaseHTTPRequestHandler) -> None:
        send(handler, b"", status=302, headers={"Location": "http://127.0.0.1:1/elsewhere"})

    with LoopbackServer(moved) as server:
        error = fetch_error(server.url)
    assert error.kind == "http_status" and "HTTP 302" in error.message


def test_a_refused_connection_names_the_endpoint_but_not_its_credentials() -> None:
    with LoopbackServer(ok) as server:
        port = server.httpd.server_address[1]
    error = fetch_error(f"http://alice:s3cretpw@127.0.0.1:{port}/metrics?token=t0psecret")
    assert error.kind == "connect" and f"127.0.0.1:{port}" in error.message
    assert "s3cretpw" not in error.message and "t0psecret" not in error.message and "alice" not in error.message


def test_a_proxy_in_the_environment_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:1")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:1")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with LoopbackServer(ok) as server:
        fetcher = make_fetcher(FetchSettings())
        assert fetcher.fetch(server.url).body == PAGE
        fetcher.close()


@pytest.mark.slow
def test_endpoints_are_fetched_from_several_threads_at_once() -> None:
    with LoopbackServer(ok) as first, LoopbackServer(ok) as second:
        fetcher = make_fetcher(FetchSettings())
        bodies: list[bytes] = []

        def scrape(url: str) -> None:
            for _ in range(20):
                bodies.append(fetcher.fetch(url).body)

        threads = [threading.Thread(target=scrape, args=(url,)) for url in (first.url, second.url, first.url)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        fetcher.close()
    assert bodies == [PAGE] * 60


def tls_server(certificate: tuple[Path, Path]) -> LoopbackServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    return LoopbackServer(ok, tls=context)


def test_tls_with_the_exporters_ca(certificate: tuple[Path, Path]) -> None:
    with tls_server(certificate) as server:
        fetcher = make_fetcher(FetchSettings(ca_file=str(certificate[0])))
        assert fetcher.fetch(server.url).body == PAGE
        fetcher.close()


def test_tls_with_an_unknown_certificate_is_refused_unless_verification_is_off(certificate: tuple[Path, Path]) -> None:
    with tls_server(certificate) as server:
        error = fetch_error(server.url)
        fetcher = make_fetcher(FetchSettings(insecure_skip_verify=True))
        body = fetcher.fetch(server.url).body
        fetcher.close()
    assert error.kind == "connect" and "certificate" in error.message.lower()
    assert body == PAGE


def _wait_until_received(sock: socket.socket) -> None:
    """Until the peer's kernel has the bytes written to `sock` (its send queue is empty: every byte acknowledged),
    so the client's socket is readable; on a loaded machine loopback delivery may lag the write."""
    deadline = time.monotonic() + 10
    while struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]:
        assert time.monotonic() < deadline, "the client never read the answer"
        time.sleep(0.001)


class _Tick:
    """A tick of `gets` GETs on a server whose first answer leaves once every request of the tick has arrived,
    and whose other answers wait for `release` (set by the settle, or by the test)."""

    def __init__(self, gets: int) -> None:
        self.gets = gets
        self.arrived = self.written = 0
        self.all_arrived = threading.Event()
        self.release = threading.Event()
        self.changed = threading.Condition()

    def respond(self, handler: BaseHTTPRequestHandler, n: int) -> None:
        with self.changed:
            self.arrived += 1
            if self.arrived == self.gets:
                self.all_arrived.set()
        assert (self.all_arrived if n == 0 else self.release).wait(10)
        send(handler, PAGE)
        _wait_until_received(handler.connection)
        with self.changed:
            self.written += 1
            self.changed.notify_all()

    def settle(self, seconds: float) -> None:
        """The transfers' settle: the tick's other answers are written, and received by the client's kernel,
        meanwhile."""
        self.release.set()
        with self.changed:
            assert self.changed.wait_for(lambda: self.written == self.gets, timeout=10)


@pytest.mark.parametrize(("settle_s", "gets"), [(SETTLE_S, 3), (0.0, 3), (SETTLE_S, 1)])
def test_answers_that_arrive_within_the_settle_are_read_by_one_wait(settle_s: float, gets: int) -> None:
    """When a poll finds an answer while other GETs are in flight, the transfers settle (`settle_s`, SETTLE_S) before
    they drive libcurl: the tick's answers that arrive meanwhile come out of the same wait. Without a settle the
    first answer comes out alone, and a GET alone is never settled. The first answer leaves only once every
    request has reached the server, so a settle that held a request back would stall the tick. Two ticks: new
    connections, then kept-alive ones. (The settle's wait is this test's hook: no wall-clock window.)"""
    import os

    ticks: list[_Tick] = []
    settles: list[float] = []

    def respond(handler: BaseHTTPRequestHandler) -> None:
        ticks[-1].respond(handler, int(handler.path.rpartition("=")[2]))

    def settle(seconds: float) -> None:
        settles.append(seconds)
        ticks[-1].settle(seconds)

    with LoopbackServer(respond) as server:
        fetcher = make_fetcher(FetchSettings())
        transfers = fetcher.transfers(settle_s=settle_s, sleep=settle)
        wake_read, wake_write = os.pipe()
        try:
            for tick in range(2):
                ticks.append(_Tick(gets))
                for n in range(gets):
                    transfers.begin(f"{server.url}?t={tick}&n={n}")
                batches: list[list[str]] = []
                while sum(map(len, batches)) < gets:
                    ended = transfers.wait(2.0, wake_read)
                    assert all(not isinstance(page, FetchError) for _, page in ended)
                    if ended:
                        batches.append([url.rpartition("=")[2] for url, _ in ended])
                        ticks[-1].release.set()  # (without a settle, the others are let go by the test)
                if settle_s and gets > 1:
                    assert [sorted(batch) for batch in batches] == [["0", "1", "2"]]
                else:
                    assert batches[0] == ["0"]
        finally:
            transfers.cancel()
            fetcher.close()
            os.close(wake_read)
            os.close(wake_write)
    # (libcurl may need a second drive to read an answer on a kept-alive connection: a second settle then)
    assert set(settles) == ({settle_s} if settle_s and gets > 1 else set())
