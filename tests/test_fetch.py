"""The scrape path's HTTP client (bridge/fetch.py, libcurl) against real servers on 127.0.0.1.

Each case is a handler that misbehaves one way; the fetcher must name the failure with its kind and a
message a person can act on, and never hold the page's credentials in it.
"""

from __future__ import annotations

import gzip
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from bridge.fetch import FetchError, FetchSettings, make_fetcher
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


class _CountingMulti:
    """A libcurl multi handle that counts its drives (`perform`)."""

    def __init__(self, multi: object) -> None:
        self._multi = multi
        self.performs = 0

    def perform(self) -> tuple[int, int]:
        self.performs += 1
        return self._multi.perform()  # type: ignore[attr-defined, no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._multi, name)


def test_the_scrape_thread_drives_libcurl_once_per_wake_up_and_once_more_for_new_gets() -> None:
    """Each drive looks at every transfer in flight, so a wait drives libcurl after its poll, and before it only
    when GETs were added since the last drive: over ticks of three GETs, drives <= waits + ticks (two per wait
    before, one ahead of every poll)."""
    import os

    def slow(handler: BaseHTTPRequestHandler) -> None:
        # (the GETs end after a poll or two, not within the drive that starts them, and further apart than the
        # settle: each is its own wake-up)
        time.sleep(0.02 + 0.02 * int(handler.path.rpartition("=")[2]))
        send(handler, PAGE)

    with LoopbackServer(slow) as server:
        fetcher = make_fetcher(FetchSettings())
        transfers = fetcher.transfers()
        counting = transfers._multi = _CountingMulti(transfers._multi)  # type: ignore[assignment]
        wake_read, wake_write = os.pipe()
        waits = ticks = pages = 0
        try:
            for _ in range(5):
                ticks += 1
                for n in range(3):
                    transfers.begin(f"{server.url}?n={n}")
                ended = 0
                while ended < 3:
                    waits += 1
                    got = transfers.wait(2.0, wake_read)
                    ended += len(got)
                    pages += sum(not isinstance(outcome, FetchError) for _, outcome in got)
        finally:
            transfers.cancel()
            fetcher.close()
            os.close(wake_read)
            os.close(wake_write)
    assert pages == 15
    assert waits > ticks  # (each tick took more than one wait: the count below says something)
    assert counting.performs <= waits + ticks


def test_answers_that_arrive_within_the_settle_are_read_by_one_drive() -> None:
    """When a poll finds an answer, the thread waits `settle_s` (SETTLE_S, 2 ms) before it drives libcurl: the
    tick's other answers that arrive meanwhile are read by the same drive (one wake-up, not one per answer), and
    each page's end time is when it was read: after its bytes were sent, at most the settle (and a scheduler's
    slack) later. Timed here with answers 30 ms apart and a settle of 200 ms, then none; a GET alone is read
    at once, and a request is sent at once (the settle waits for answers, not for a connect to be used)."""
    import os

    from bridge.fetch import SETTLE_S

    assert 0 < SETTLE_S <= 0.005
    sent: dict[str, int] = {}
    arrived: dict[str, int] = {}  # when each request reached the server

    def apart(handler: BaseHTTPRequestHandler) -> None:
        arrived[handler.path] = time.time_ns()
        barrier.wait(5)
        time.sleep(0.03 * int(handler.path.rpartition("=")[2]))
        sent[handler.path] = time.time_ns()
        send(handler, PAGE)

    reads_by_settle = {}
    with LoopbackServer(apart) as server:
        fetcher = make_fetcher(FetchSettings())
        transfers = fetcher.transfers()
        wake_read, wake_write = os.pipe()
        try:
            for tick, (settle, gets) in enumerate([(0.2, 3), (0.2, 3), (0.0, 3), (0.2, 1)]):
                transfers.settle_s = settle
                barrier = threading.Barrier(gets)  # (the tick's answers leave from one moment)
                paths = [f"/metrics?t={tick}&n={n}" for n in range(gets)]
                began = time.time_ns()
                for path in paths:
                    transfers.begin(server.url.rsplit("/", 1)[0] + path)
                got: list = []
                reads = 0  # waits that returned pages
                while len(got) < gets:
                    ended = transfers.wait(2.0, wake_read)
                    reads += bool(ended)
                    got += ended
                reads_by_settle[settle, gets] = reads
                # (the first tick connects: a socket ready to send its request is not kept waiting)
                assert max(arrived[path] for path in paths) - began < 100_000_000
                for url, page in got:
                    assert not isinstance(page, FetchError)
                    late = page.end_ns - sent[url[url.index("/metrics"):]]
                    # (`sent` is taken before the write; one GET alone is read at once)
                    assert 0 < late < (settle if gets > 1 else 0) * 1e9 + 50_000_000
        finally:
            transfers.cancel()
            fetcher.close()
            os.close(wake_read)
            os.close(wake_write)
    assert reads_by_settle == {(0.2, 3): 1, (0.0, 3): 3, (0.2, 1): 1}
