"""A real HTTP server on 127.0.0.1 whose every request is answered by a function: the misbehaving
exporters and receivers of the fetch, fault, budget and hostile-input tests."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Respond = Callable[[BaseHTTPRequestHandler], None]


class LoopbackServer:
    """Answers every GET and POST with `respond`; counts connections and records each request's headers."""

    def __init__(self, respond: Respond, tls: ssl.SSLContext | None = None) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with server.lock:
                    server.connections += 1

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                with server.lock:
                    server.requests.append(dict(self.headers))
                respond(self)

            do_POST = do_GET  # noqa: N815 - the stdlib's name

            def log_message(self, *args: object) -> None:
                pass

        self.lock = threading.Lock()
        self.connections = 0
        self.requests: list[dict[str, str]] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/metrics"
        # (serve_forever looks for shutdown every poll_interval: its 0.5 s default made each server's exit take that)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> LoopbackServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send(handler: BaseHTTPRequestHandler, body: bytes, *, status: int = 200, content_type: str = "text/plain",
         headers: dict[str, str] | None = None) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)
