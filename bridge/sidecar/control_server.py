"""The control API's HTTP server: a select loop with no idle wake-ups, and bounded connections.

A request's headers and body must arrive within `deadline_s` of its start (the accept, or the end of the
previous answer on a kept-alive connection), however slowly they trickle: the loop checks every waiting
connection against its clock (injectable, for tests) and ends a late one with shutdown(2); answering (a
/complete may take half a minute) is not limited. At most `max_connections` are open: a new one closes the
oldest still waiting for its request, so the kubelet's probes are answered even then. When accept fails for
want of descriptors (EMFILE) the loop stops accepting for a doubling pause and frees the oldest waiting
connection, instead of spinning on a listening socket that stays readable.

`RequestHandler` reads requests and writes answers as http.server's BaseHTTPRequestHandler does, for what the
control API uses of it; http.server itself imports http.client, which imports ssl and maps Python's OpenSSL
(~4.7 MiB of the sidecar's RSS, issue 48) for a server that never speaks TLS.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from io import BufferedIOBase
from typing import Any, overload

logger = logging.getLogger("bridge.sidecar.control")  # the control API's messages, under one name as before

BACKLOG = 64  # connections waiting to be accepted (socketserver's default is 5)
REQUEST_DEADLINE_S = 5.0  # a request's headers and body, whole, within this (not per recv: a byte every 4 s)
MAX_CONNECTIONS = 256  # open at once; past it the oldest one still waiting for its request is closed
_ACCEPT_BACKOFF_S = (0.01, 1.0)  # accept failing for want of descriptors: wait this long, doubling, at most
_MAX_LINE = 65536  # the request line and each header line (http.server's limits)
_MAX_HEADER_LINES = 100
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class Headers:
    """A request's header fields by name in any case; of a repeated name, the first (as http.server's)."""

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields

    @overload
    def get(self, name: str) -> str | None: ...
    @overload
    def get(self, name: str, default: str) -> str: ...
    def get(self, name: str, default: str | None = None) -> str | None:
        return self._fields.get(name.lower(), default)


class _HeadRefused(Exception):
    """A request head past the limits: a line longer than 64 KiB, or more than 100 lines."""


def _read_headers(rfile: BufferedIOBase) -> Headers:
    fields: dict[str, str] = {}
    last: str | None = None
    for count in range(1, _MAX_HEADER_LINES + 2):  # as http.client's: the 101st line is refused, even blank
        line = rfile.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise _HeadRefused("Line too long")
        if count > _MAX_HEADER_LINES:
            break
        if line in (b"\r\n", b"\n", b""):
            return Headers(fields)
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if text[:1] in (" ", "\t"):  # an obsolete folded line: the previous field goes on
            if last is not None:
                fields[last] += " " + text.strip()
            continue
        name, colon, value = text.partition(":")
        key = name.lower()
        last = key if colon and name and key not in fields else None
        if last is not None:
            fields[key] = value.strip()
    raise _HeadRefused("Too many headers")


def _version(text: str) -> tuple[int, int] | None:
    """HTTP/1.1 -> (1, 1); None for anything else."""
    major, dot, minor = text.removeprefix("HTTP/").partition(".")
    if not text.startswith("HTTP/") or not dot:
        return None
    if not all(p.isascii() and p.isdigit() and len(p) <= 10 for p in (major, minor)):
        return None
    return int(major), int(minor)


def http_date(now: float) -> str:
    """RFC 9110's IMF-fixdate (`Date:`), whatever the locale."""
    t = time.gmtime(now)
    return (f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


class RequestHandler(socketserver.StreamRequestHandler):
    """HTTP/1.x requests on one kept-alive connection, as BaseHTTPRequestHandler reads them: the same limits and
    refusals through `send_error` (400 a bad request line, 414 a line too long, 431 a head too large, 501 no
    `do_<METHOD>`, 505 HTTP/2 and later), `Connection` and `Expect: 100-continue` honoured, answers built by
    `send_response`, `send_header`, `end_headers`. A request line without a version (HTTP/0.9) is a 400."""

    server_version = "dcgm-bridge"
    protocol_version = "HTTP/1.1"
    responses = {status.value: (status.phrase, status.description) for status in HTTPStatus}
    close_connection = True
    command = path = request_version = requestline = ""
    headers = Headers({})

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            self.handle_one_request()

    def handle_one_request(self) -> None:
        self._head: list[bytes] = []
        self.command = self.path = self.request_version = self.requestline = ""
        try:
            line = self.rfile.readline(_MAX_LINE + 1)
            if len(line) > _MAX_LINE:
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
                return
            if not line:
                self.close_connection = True
                return
            if not self._parse_request(line):
                return
            method = getattr(self, f"do_{self.command}", None)
            if method is None:
                self.send_error(HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({self.command!r})")
                return
            method()
            self.wfile.flush()
        except TimeoutError:
            self.close_connection = True

    def _parse_request(self, line: bytes) -> bool:
        self.close_connection = True
        self.requestline = line.decode("iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if not words:
            return False
        number = _version(words[-1]) if len(words) >= 3 else None
        if len(words) >= 3 and number is None:
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request version ({words[-1]!r})")
            return False
        if number is not None and number >= (2, 0):
            self.send_error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({words[-1][5:]})")
            return False
        if len(words) != 3 or number is None:
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({self.requestline!r})")
            return False
        self.command, path, self.request_version = words
        self.path = "/" + path.lstrip("/") if path.startswith("//") else path
        try:
            self.headers = _read_headers(self.rfile)
        except _HeadRefused as exc:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, str(exc))
            return False
        connection = self.headers.get("Connection", "").lower()
        self.close_connection = connection == "close" or (number < (1, 1) and connection != "keep-alive")
        if number >= (1, 1) and self.headers.get("Expect", "").lower() == "100-continue":
            self.send_response_only(HTTPStatus.CONTINUE)
            self.end_headers()
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """A refusal as plain text; the connection closes (what follows on it cannot be trusted to be a
        request). The control API's handler answers its own way."""
        body = (message or self.responses.get(code, ("refused",))[0]).encode("utf-8", "replace")
        self.send_response(code)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_response(self, code: int, message: str | None = None) -> None:
        self.log_message('"%s" %s -', self.requestline, str(int(code)))
        self.send_response_only(code, message)
        self.send_header("Server", self.server_version)
        self.send_header("Date", http_date(time.time()))

    def send_response_only(self, code: int, message: str | None = None) -> None:
        reason = self.responses.get(code, ("",))[0] if message is None else message
        self._head.append(f"{self.protocol_version} {int(code)} {reason}\r\n".encode("latin-1", "strict"))

    def send_header(self, keyword: str, value: str) -> None:
        self._head.append(f"{keyword}: {value}\r\n".encode("latin-1", "strict"))
        if keyword.lower() == "connection":
            if value.lower() == "close":
                self.close_connection = True
            elif value.lower() == "keep-alive":
                self.close_connection = False

    def end_headers(self) -> None:
        self._head.append(b"\r\n")
        self.wfile.write(b"".join(self._head))
        self._head = []

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        logger.debug("control %s %s", self.client_address[0], format % args)


@dataclass
class _Connection:
    since: float  # when its current request began: the accept, or the end of the previous answer
    reading: bool = True  # waiting for the request's bytes (False: being answered, however long that takes)
    closed: bool = False


class BoundedServer(socketserver.ThreadingTCPServer):
    """socketserver's serve_forever wakes every half second to look for a shutdown request; an idle sidecar
    pays those wake-ups all run long. This loop sleeps until a client connects, a request's deadline passes,
    or `stop` writes to its pipe; it also owns the connection bounds (see the module docstring)."""

    request_queue_size = BACKLOG  # socketserver passes it to listen()
    allow_reuse_address = True  # as http.server's
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[RequestHandler], deadline_s: float,
                 max_connections: int, monotonic: Callable[[], float]) -> None:
        self.deadline_s = deadline_s
        self.max_connections = max_connections
        self.monotonic = monotonic
        self.connections: dict[socket.socket, _Connection] = {}
        self._connections_lock = threading.Lock()
        self._paused_until = 0.0  # accept backs off until then (EMFILE)
        self._backoff = 0.0
        self.accept_failures = 0
        super().__init__(address, handler)

    def server_activate(self) -> None:
        super().server_activate()
        self._stopping = False
        self._wake_read, self._wake_write = os.pipe()

    def serve_until_stopped(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_read, selectors.EVENT_READ)
            listening = False
            while not self._stopping:
                now = self.monotonic()
                accept = now >= self._paused_until
                if accept and not listening:
                    selector.register(self, selectors.EVENT_READ)
                elif listening and not accept:
                    selector.unregister(self)
                listening = accept
                waits = [w for w in (self.reap(now), None if accept else self._paused_until - now) if w is not None]
                for key, _ in selector.select(min(waits) if waits else None):
                    if key.fileobj is self and not self._stopping:
                        self._handle_request_noblock()  # type: ignore[attr-defined]  # (serve_forever's own step)
                    elif key.fileobj == self._wake_read:
                        os.read(self._wake_read, 512)

    def wake(self) -> None:
        """Run the loop once now (a test that moved its clock; `stop`)."""
        os.write(self._wake_write, b"!")

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    def close_wake(self) -> None:
        os.close(self._wake_read)
        os.close(self._wake_write)

    # -- the bounds ----------------------------------------------------------------------------------
    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            request = super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self.accept_failures += 1
                low, high = _ACCEPT_BACKOFF_S
                self._backoff = min(high, max(low, 2 * self._backoff))
                self._paused_until = self.monotonic() + self._backoff
                if self.accept_failures == 1 or self._backoff == high:
                    logger.warning("control API: cannot accept a connection (%s): waiting %.2f s; %d open",
                                   exc.strerror, self._backoff, len(self.connections))
                with self._connections_lock:
                    self._close_oldest_waiting_locked()  # frees a descriptor for the next accept
            raise  # socketserver drops this attempt
        self._backoff = 0.0
        return request

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            if len(self.connections) >= self.max_connections:
                self._close_oldest_waiting_locked()
            self.connections[request] = _Connection(self.monotonic())
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self.connections.pop(request, None)
        super().shutdown_request(request)

    def reading(self, request: Any, reading: bool) -> None:
        """The connection waits for a request, or is being answered. A request's deadline starts when its
        connection was accepted or its previous answer ended, not when a thread got round to reading it (on a
        loaded machine that is later, and the oldest waiting connection would no longer look the oldest)."""
        with self._connections_lock:
            connection = self.connections.get(request)
            if connection is not None:
                if reading != connection.reading:
                    connection.since = self.monotonic()
                connection.reading = reading

    def reap(self, now: float) -> float | None:
        """Close every connection whose request is past its deadline; seconds until the next one's."""
        nearest: float | None = None
        with self._connections_lock:
            for request, connection in self.connections.items():
                if not connection.reading or connection.closed:
                    continue
                left = connection.since + self.deadline_s - now
                if left <= 0:
                    logger.debug("control API: a request not whole within %.1f s: closed", self.deadline_s)
                    _close(request, connection)
                else:
                    nearest = left if nearest is None else min(nearest, left)
        return nearest

    def _close_oldest_waiting_locked(self) -> None:
        waiting = [(c.since, id(r), r) for r, c in self.connections.items() if c.reading and not c.closed]
        if waiting:
            _, _, request = min(waiting)
            _close(request, self.connections[request])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that goes away mid-answer (a scraper that timed out, curl | head) is not an error."""
        import sys

        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError | OSError):
            logger.debug("control client %s went away: %s", client_address[0], error)
            return
        logger.exception("control API: request from %s failed", client_address[0])


def _close(request: socket.socket, connection: _Connection) -> None:
    """End a connection from outside its thread: the thread's read returns and it closes the socket."""
    connection.closed = True
    with contextlib.suppress(OSError):  # already gone
        request.shutdown(socket.SHUT_RDWR)
