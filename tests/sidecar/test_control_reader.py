"""The control API's request reader (bridge/sidecar/control_server.py: RequestHandler) reads a request as
http.server's BaseHTTPRequestHandler does, which it replaces so that the sidecar never imports http.client and
ssl (issue 48). The truth is the standard library: the same raw requests to a server of each, with the same
routes, get the same status, the same echoed header and the same decision to keep the connection or close it."""

from __future__ import annotations

import email.utils
import html
import re
import socket
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bridge.sidecar.control_server import RequestHandler, http_date


class _Echo:
    """The routes both servers answer: GET echoes the X-Echo header, POST its body (Content-Length)."""

    protocol_version = "HTTP/1.1"
    headers: Any
    rfile: Any
    wfile: Any

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer((self.headers.get("X-Echo") or "-").encode("latin-1"))

    def do_POST(self) -> None:  # noqa: N802
        self._answer(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def _answer(self, body: bytes) -> None:
        self.send_response(200)  # type: ignore[attr-defined]
        self.send_header("Content-Length", str(len(body)))  # type: ignore[attr-defined]
        self.end_headers()  # type: ignore[attr-defined]
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Ours(_Echo, RequestHandler):
    pass


class _Stdlib(_Echo, BaseHTTPRequestHandler):
    pass


class _OurServer(socketserver.ThreadingTCPServer):
    daemon_threads = True


def _serve(server: socketserver.TCPServer) -> Iterator[int]:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def ours() -> Iterator[int]:
    yield from _serve(_OurServer(("127.0.0.1", 0), _Ours))


@pytest.fixture(scope="module")
def stdlib() -> Iterator[int]:
    yield from _serve(ThreadingHTTPServer(("127.0.0.1", 0), _Stdlib))


def _read_answer(sock: socket.socket, buffer: bytes) -> tuple[str, bytes, bytes] | None:
    """(status code, body, what follows) of the next final answer (1xx skipped); None when the server closed."""
    while True:
        while b"\r\n\r\n" not in buffer:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            buffer += data
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = lines[0].split()[1].decode()
        if status.startswith("1"):
            continue
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
        length = int(fields.get(b"content-length", b"0"))
        while len(buffer) < length:
            data = sock.recv(65536)
            assert data, "the answer's body was cut short"
            buffer += data
        return status, buffer[:length], buffer[length:]


def exchange(port: int, request: bytes) -> tuple[str | None, bytes, bool]:
    """Send `request`, read its answer, then a second request on the same connection: (status, body, whether the
    connection was kept for the second one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        first = _read_answer(sock, b"")
        if first is None:
            return None, b"", False
        status, body, rest = first
        try:
            sock.sendall(b"GET / HTTP/1.1\r\nX-Echo: again\r\nConnection: close\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return status, body, False
        second = _read_answer(sock, rest)
        return status, body, second is not None and second[1] == b"again"


def _headers(count: int) -> bytes:
    return b"".join(b"X-%d: v\r\n" % i for i in range(count))


# A refused request is sent as far as the reader reads it: a server that closes with bytes unread resets the
# connection, and the client may lose the answer (either server, by chance).
REQUESTS = {
    "a GET on HTTP/1.1": b"GET / HTTP/1.1\r\nX-Echo: a\r\n\r\n",
    "HTTP/1.0 closes": b"GET / HTTP/1.0\r\nX-Echo: a\r\n\r\n",
    "HTTP/1.0 with keep-alive": b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    "HTTP/1.1 with Connection: close": b"GET / HTTP/1.1\r\nConnection: Close\r\n\r\n",
    "four words ending in a version": b"GET / x HTTP/1.1\r\n",
    "an unknown method": b"BREW / HTTP/1.1\r\n\r\n",
    "a request line over 64 KiB": b"GET /" + b"a" * (65537 - 5),
    "a header line over 64 KiB": b"GET / HTTP/1.1\r\nX: " + b"a" * (65537 - 3),
    "99 header lines": b"GET / HTTP/1.1\r\n" + _headers(99) + b"\r\n",
    "100 header lines": b"GET / HTTP/1.1\r\n" + _headers(100) + b"\r\n",
    "a name in another case": b"GET / HTTP/1.1\r\nx-ECHO: v\r\n\r\n",
    "a repeated name: the first": b"GET / HTTP/1.1\r\nX-Echo: first\r\nx-echo: second\r\n\r\n",
    "a line without a colon": b"GET / HTTP/1.1\r\nnonsense\r\n\r\n",
    "bare LF line ends": b"GET / HTTP/1.1\nX-Echo: lf\n\n",
    "a path that starts //": b"GET //x HTTP/1.1\r\n\r\n",
    "a POST with a body": b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    "Expect: 100-continue": b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
    "a blank request line": b"\r\n",
}


def _refusal(body: bytes) -> bytes:
    """The message of http.server's HTML error page (ours sends the message alone)."""
    found = re.search(rb"<p>Message: (.*)\.</p>", body)
    return html.unescape(found.group(1).decode()).encode() if found else body


@pytest.mark.parametrize("request_bytes", REQUESTS.values(), ids=REQUESTS.keys())
def test_a_request_is_read_as_http_servers_reader_reads_it(ours: int, stdlib: int, request_bytes: bytes):
    status, body, kept = exchange(stdlib, request_bytes)
    assert exchange(ours, request_bytes) == (status, _refusal(body), kept)


# Refused before their version is known: http.server then answers as to HTTP/0.9, its page without a status
# line or header; ours with both (the status and message its page names).
BAD_VERSIONS = {
    "HTTP/2.0": b"GET / HTTP/2.0\r\n",
    "a version that is no number": b"GET / HTTP/1.x\r\n",
    "a superscript digit": "GET / HTTP/1.\u00b9\r\n".encode(),
    "not HTTP": b"GET / FTP/1.1\r\n",
    "four words": b"GET / HTTP/1.1 extra\r\n",
}


@pytest.mark.parametrize("request_bytes", BAD_VERSIONS.values(), ids=BAD_VERSIONS.keys())
def test_a_bad_version_gets_the_status_and_message_http_server_names_in_its_page(ours: int, stdlib: int,
                                                                                  request_bytes: bytes):
    with socket.create_connection(("127.0.0.1", stdlib), timeout=10) as sock:
        sock.sendall(request_bytes)
        page = b"".join(iter(lambda: sock.recv(65536), b""))
    code = re.search(rb"<p>Error code: (\d+)</p>", page)
    assert code is not None and not page.startswith(b"HTTP/"), page[:200]
    assert exchange(ours, request_bytes) == (code.group(1).decode(), _refusal(page), False)


def test_a_request_line_without_a_version_is_refused_where_http_server_answered_http_0_9(ours: int):
    assert exchange(ours, b"GET /\r\n\r\n")[0] == "400"


def test_the_date_header_is_rfc_9110s_whatever_the_day():
    for now in (0.0, 951_782_400.0, 1_767_225_599.0, 4_102_444_800.5):  # 1970, a leap day, a year's last second
        assert http_date(now) == email.utils.formatdate(now, usegmt=True)
