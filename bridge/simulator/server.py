"""A real HTTP server on loopback that serves the simulated pages and misbehaves on a script.

    with SimulatedExporter(SimulatorConfig(gpus=8), now_ns=clock) as exporter:
        httpx.get(exporter.url)                      # /metrics, as dcgm-exporter serves it
        exporter.add_fault(Fault("http-500", requests=(3, 4)))
        exporter.model.energy_joules(0, t0, t1)      # ground truth

Threads: one serving loop (ThreadingHTTPServer, a thread per connection, HTTP/1.1 keep-alive as Go's
server does) and a watcher that applies time-window restarts. With a manual clock, call `poll()` after
moving it instead of waiting for the watcher.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, cast

from bridge.simulator.config import Fault, SimulatorConfig
from bridge.simulator.model import NodeModel
from bridge.simulator.render import PageMods, PageRenderer, padded_page

logger = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"
INDEX = b"<html><head><title>GPU Exporter</title></head><body><h1>GPU Exporter</h1>" \
        b"<p><a href='./metrics'>Metrics</a></p></body></html>"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # listen again on the same port right after a simulated restart

    def __init__(self, address: tuple[str, int], exporter: SimulatedExporter) -> None:
        self.exporter = exporter
        self.open_connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self.open_connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self.open_connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Cut every accepted connection, as a dying process does."""
        with self._connections_lock:
            connections = list(self.open_connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as Go's net/http: headers and body go out as separate writes
    server_version = "dcgm-bridge-simulator"
    sys_version = ""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        exporter = cast(_Server, self.server).exporter
        if path == "/metrics":
            exporter._serve_metrics(self)
        elif path == "/health":
            self.reply(200, b"OK", TEXT)
        elif path == "/":
            self.reply(200, INDEX, "text/html; charset=utf-8")
        else:
            self.reply(404, b"404 page not found\n", TEXT)

    def reply(self, status: int, body: bytes, content_type: str, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("simulator %s: %s", self.address_string(), format % args)


class SimulatedExporter:
    """A simulated dcgm-exporter on 127.0.0.1. Start/stop it, or use it as a context manager."""

    def __init__(self, config: SimulatorConfig | None = None, *, now_ns: Callable[[], int] = time.time_ns,
                 host: str = "127.0.0.1", watch_interval_s: float = 0.05) -> None:
        self.config = config or SimulatorConfig()
        self.now_ns = now_ns
        self.model = NodeModel(self.config, now_ns)
        self.renderer = PageRenderer(self.model)
        self._host = host
        self._port = self.config.port
        self._watch_interval_s = watch_interval_s
        self._lock = threading.RLock()
        self._faults: list[Fault] = []
        self._fired: set[int] = set()  # positions in _faults of request-triggered events already applied
        self._requests = 0
        self._httpd: _Server | None = None
        self._down_until_ns: int | None = None
        self._running = False
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        self.set_faults(self.config.faults)

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> SimulatedExporter:
        with self._lock:
            if self._running:
                return self
            self._listen()
            self._running = True
            self._closing.clear()
            self._watcher = threading.Thread(target=self._watch, name="simulator-watch", daemon=True)
            self._watcher.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._running = False
            self._closing.set()  # wakes slow responses and the watcher
            self._go_down(None)
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None

    def __enter__(self) -> SimulatedExporter:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def url(self) -> str:
        return self.base_url + "/metrics"

    @property
    def requests(self) -> int:
        """/metrics requests received so far (the numbers Fault.requests counts)."""
        return self._requests

    @property
    def listening(self) -> bool:
        return self._httpd is not None

    # --- faults ----------------------------------------------------------------------------------

    def add_fault(self, fault: Fault) -> None:
        """Script a fault. Time-triggered events (counter-reset, xid) go into the model right away."""
        with self._lock:
            if fault.kind in ("counter-reset", "xid") and fault.requests is None:
                self._apply_event(fault, fault.from_ns if fault.from_ns is not None else self.now_ns())
            else:
                self._faults.append(fault)

    def set_faults(self, faults: Iterable[Fault]) -> None:
        with self._lock:
            self._faults, self._fired = [], set()
            for fault in faults:
                self.add_fault(fault)

    def clear_faults(self) -> None:
        """Forget scripted faults. Events already applied (resets, XIDs) stay in the model's history."""
        self.set_faults(())

    def restart(self, down_for_ns: int) -> None:
        """Stop listening now; listen again on the same port once the clock has moved by `down_for_ns`."""
        self._go_down(self.now_ns() + down_for_ns)

    def poll(self) -> None:
        """Apply time-window restarts for the clock's current time (the watcher calls this too)."""
        t = self.now_ns()
        with self._lock:
            if not self._running:
                return
            windows = [f.down_window() for f in self._faults if f.kind == "restart" and f.requests is None]
            down_until = max((end for start, end in windows if start <= t < end), default=None)
            if down_until is not None:
                if self._httpd is not None or (self._down_until_ns or 0) < down_until:
                    self._go_down(down_until)
            elif self._httpd is None and t >= (self._down_until_ns or 0):
                try:
                    self._listen()
                except OSError as exc:  # someone took the port meanwhile: try again on the next poll
                    logger.warning("simulator cannot listen again on port %d: %s", self._port, exc)

    # --- internals -------------------------------------------------------------------------------

    def _listen(self) -> None:
        httpd = _Server((self._host, self._port), self)
        self._port = httpd.server_address[1]
        self._httpd, self._down_until_ns = httpd, None
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02},
                         name=f"simulator-{self._port}", daemon=True).start()

    def _go_down(self, until_ns: int | None) -> None:
        with self._lock:
            httpd, self._httpd = self._httpd, None
            self._down_until_ns = until_ns
            if httpd is not None:
                httpd.shutdown()
                httpd.server_close()  # from here connecting is refused
                httpd.drop_connections()

    def _watch(self) -> None:
        while not self._closing.wait(self._watch_interval_s):
            self.poll()

    def _apply_event(self, fault: Fault, at_ns: int) -> None:
        if fault.kind == "counter-reset":
            self.model.reset_counters(at_ns, fault.gpu)
        else:
            self.model.inject_xid(fault.target_gpu, fault.xid, at_ns)

    def _serve_metrics(self, handler: _Handler) -> None:
        t = self.now_ns()
        with self._lock:
            self._requests += 1
            active: dict[str, Fault] = {}
            for position, fault in enumerate(self._faults):
                if not fault.matches(self._requests, t):
                    continue
                if fault.kind in ("counter-reset", "xid"):
                    if position not in self._fired:
                        self._fired.add(position)
                        self._apply_event(fault, self.model.sample_time_ns(t))
                else:
                    active.setdefault(fault.kind, fault)
        if "restart" in active:  # the process dies mid-request: no response, port closed
            handler.close_connection = True
            self._go_down(t + active["restart"].duration_ns)
            return
        if "slow" in active and self._closing.wait(active["slow"].delay_s):
            handler.close_connection = True
            return
        if "http-500" in active:
            handler.reply(500, b"failed to collect metrics: simulated DCGM error\n", TEXT)
        elif "empty-body" in active:
            handler.reply(200, b"", TEXT)
        elif "json" in active:
            body = json.dumps({"status": "error", "error": "simulated: not a metrics endpoint"}).encode()
            handler.reply(200, body, "application/json")
        else:
            self._serve_page(handler, t, active)

    def _serve_page(self, handler: _Handler, t: int, active: dict[str, Fault]) -> None:
        mods = PageMods(
            sentinels_gpu=active["sentinels"].target_gpu if "sentinels" in active else None,
            quote_gpu=active["unescaped-quote"].target_gpu if "unescaped-quote" in active else None,
            garbage="garbage-line" in active,
        )
        page = self.renderer.page(t, mods)
        content_type = self.renderer.layout.spec.content_type
        try:
            if "truncated" in active:  # promise the whole page, send half, hang up
                handler.close_connection = True
                handler.reply(200, page[: len(page) // 2], content_type, length=len(page))
            elif "huge-body" in active:
                length, chunks = padded_page(page, active["huge-body"].size_bytes, self.renderer.layout)
                handler.reply(200, b"", content_type, length=length)
                for chunk in chunks:
                    handler.wfile.write(chunk)
            else:
                handler.reply(200, page, content_type)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up; so do we
            handler.close_connection = True
