"""The control API's HTTP server: a select loop with no idle wake-ups, and bounded connections.

A request's headers and body must arrive within `deadline_s` of its start (the accept, or the end of the
previous answer on a kept-alive connection), however slowly they trickle: the loop checks every waiting
connection against its clock (injectable, for tests) and ends a late one with shutdown(2); answering (a
/complete may take half a minute) is not limited. At most `max_connections` are open: a new one closes the
oldest still waiting for its request, so the kubelet's probes are answered even then. When accept fails for
want of descriptors (EMFILE) the loop stops accepting for a doubling pause and frees the oldest waiting
connection, instead of spinning on a listening socket that stays readable.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger("bridge.sidecar.control")  # the control API's messages, under one name as before

BACKLOG = 64  # connections waiting to be accepted (socketserver's default is 5)
REQUEST_DEADLINE_S = 5.0  # a request's headers and body, whole, within this (not per recv: a byte every 4 s)
MAX_CONNECTIONS = 256  # open at once; past it the oldest one still waiting for its request is closed
_ACCEPT_BACKOFF_S = (0.01, 1.0)  # accept failing for want of descriptors: wait this long, doubling, at most


@dataclass
class _Connection:
    since: float  # when its current request began: the accept, or the end of the previous answer
    reading: bool = True  # waiting for the request's bytes (False: being answered, however long that takes)
    closed: bool = False


class BoundedServer(ThreadingHTTPServer):
    """socketserver's serve_forever wakes every half second to look for a shutdown request; an idle sidecar
    pays those wake-ups all run long. This loop sleeps until a client connects, a request's deadline passes,
    or `stop` writes to its pipe; it also owns the connection bounds (see the module docstring)."""

    request_queue_size = BACKLOG  # socketserver passes it to listen()

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], deadline_s: float,
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
