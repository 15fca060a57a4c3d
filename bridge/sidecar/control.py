"""The control API on the health port (default 8086).

Who may do what (README "Security on a shared machine"): GET /healthz and /readyz answer anyone (the
kubelet probes the pod IP); /status and /metrics too unless `protect_reads` (Prometheus scrapes /metrics);
POST /phases and /complete need `Authorization: Bearer <token>` when the server has a token (control_token.py:
`profile` makes one per run and hands it to the benchmark; the `sidecar` command reads or makes
DCGM_BRIDGE_CONTROL_TOKEN_FILE), and always come from a client in `control_allow` (loopback by default: the
benchmark shares the pod). Without a token, loopback is the only rule, and every local user (every container
of the pod) can end the run. Connections are bounded (control_server.py: a whole-request deadline, a cap).

Bad requests get a 4xx with a JSON body that says what is wrong (400 a bad value, 401 no or a wrong token, 409
a phase mark out of sequence; sidecar/marks.py checks every value before anything is applied); nothing a
client sends crashes it.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from bridge.digest import same_secret
from bridge.errors import ConfigError, SequenceError
from bridge.sidecar.control_server import BACKLOG as BACKLOG
from bridge.sidecar.control_server import MAX_CONNECTIONS, REQUEST_DEADLINE_S, BoundedServer, RequestHandler
from bridge.sidecar.control_token import TOKEN_ENV
from bridge.sidecar.session import LifecycleError, Session

logger = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
LOOPBACK = "127.0.0.1"  # `profile` on a workstation; the `sidecar` command's default is all addresses (config.py)
_GET = ("/healthz", "/readyz", "/status", "/metrics")
_OPEN_GET = ("/healthz", "/readyz")  # the kubelet's probes: never behind the token
_POST = ("/phases", "/complete")


class ControlServer:
    """Serves the control API for a Session in a background thread."""

    def __init__(self, session: Session, host: str, port: int, allow: list[str],
                 on_complete: Callable[[], None] | None = None,
                 metrics_text: Callable[[], bytes | str] | None = None, *,
                 token: str | None = None, protect_reads: bool = False,
                 request_deadline_s: float = REQUEST_DEADLINE_S, max_connections: int = MAX_CONNECTIONS,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.session = session
        self.allow = [ipaddress.ip_network(net, strict=False) for net in allow]
        self.on_complete = on_complete
        self.metrics_text = metrics_text
        self.token = token
        self.protect_reads = protect_reads and token is not None
        # The socket timeout of each read is the deadline too: a backstop should the reaper be late.
        handler = type("Handler", (_Handler,), {"control": self, "timeout": request_deadline_s})
        try:
            self.httpd = BoundedServer((host, port), handler, request_deadline_s, max_connections, monotonic)
        except OSError as exc:
            raise ConfigError(f"--health-port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                              "stop what uses it or choose another port (DCGM_BRIDGE_HEALTH_PORT)") from None
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_until_stopped, name="control api", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.stop()
        if self._thread.is_alive():
            self._thread.join()
        self.httpd.server_close()
        self.httpd.close_wake()

    def allowed(self, client: str) -> bool:
        try:
            address = ipaddress.ip_address(client.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        return any(address in net for net in self.allow)

    def token_matches(self, authorization: str | None) -> bool:
        scheme, _, given = (authorization or "").strip().partition(" ")
        assert self.token is not None
        return scheme.lower() == "bearer" and same_secret(given.strip().encode(), self.token.encode())


class _Handler(RequestHandler):
    control: ControlServer

    def handle_one_request(self) -> None:
        self.control.httpd.reading(self.connection, True)  # this request's deadline starts now
        super().handle_one_request()

    def _answering(self) -> None:
        self.control.httpd.reading(self.connection, False)

    def _token_refused(self, path: str) -> bool:
        """A 401 (and True) when this request needs the token and does not carry it."""
        if self.control.token is None or self.control.token_matches(self.headers.get("Authorization")):
            return False
        self.close_connection = True
        body = json.dumps({"error": f"{path} needs Authorization: Bearer <token> (the run's control token: "
                           f"${TOKEN_ENV}, or the file DCGM_BRIDGE_CONTROL_TOKEN_FILE names)"}).encode()
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Bearer realm="dcgm-bridge"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return True

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        if isinstance(payload, bytes):
            body = payload
        else:
            body = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": message})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The request reader's own refusals (a bad request line, a header too long) as the API's one JSON line;
        the connection closes, as what follows on it cannot be trusted to be a request."""
        self.close_connection = True
        self._error(code, message or self.responses.get(code, ("refused",))[0])

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        session = self.control.session
        self._answering()
        if self.control.protect_reads and path not in _OPEN_GET and self._token_refused(path):
            return
        if path == "/healthz":
            self._send(200, {"status": "alive"})
        elif path == "/readyz":
            reason = session.not_ready()
            payload: dict[str, Any] = {"ready": reason is None, "state": session.state}
            if reason is not None:
                payload["reason"] = reason
            self._send(200 if reason is None else 503, payload)
        elif path == "/status":
            self._send(200, session.status())
        elif path == "/metrics" and self.control.metrics_text is not None:
            self._send(200, self.control.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
        elif path in _POST:
            self._error(405, f"{path} takes POST")
        else:
            self._error(404, f"no such endpoint {path}; try /healthz, /readyz, /status, POST /phases, /complete")

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path in _GET or path not in _POST:
            self._answering()
            self.close_connection = True  # its body is not read: the rest of the stream is not a request
            if path in _GET:
                self._error(405, f"{path} takes GET")
            else:
                self._error(404, f"no such endpoint {path}")
            return
        if not self.control.allowed(self.client_address[0]):
            self._answering()
            self.close_connection = True
            self._error(403, f"{path} accepts only clients in DCGM_BRIDGE_CONTROL_ALLOW "
                        f"({', '.join(map(str, self.control.allow))})")
            return
        if self._token_refused(path):
            return
        body = self._json_body()
        self._answering()
        if body is None:
            return
        try:
            if path == "/phases":
                mark = self.control.session.mark_phase(body.get("name"), body.get("kind"), body.get("event"),
                                                       body.get("time_ns"))
                self._send(200, {"accepted": mark._asdict()})
            else:
                outputs = self.control.session.complete(body.get("requests_end_ns"), await_refresh=True)
                # A promised output lost (full disk, read-only folder, EMFILE, a name too long) is a failed run:
                # 500 and the reason, as the exit code (README "Exit codes") will say once the sidecar exits.
                answer: dict[str, Any] = {"completed": outputs.error is None, "files": [str(f) for f in outputs.files]}
                if outputs.error is not None:
                    answer["error"] = outputs.error
                self._send(200 if outputs.error is None else 500, answer)
                if self.control.on_complete is not None:
                    self.control.on_complete()
        except SequenceError as exc:  # RFC 9110 §15.5.10: conflicts with the target's current state
            self._error(409, str(exc))
        except LifecycleError as exc:
            self._error(400, str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug must still answer, in one line, and leave the API up
            logger.exception("control API: %s failed", path)
            self._error(500, f"{path} failed inside the sidecar: {exc!r}; see its log")

    def _json_body(self) -> dict[str, Any] | None:
        length_text = self.headers.get("Content-Length")
        if length_text is None and "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return {}  # no body at all (curl -X POST …/complete): as `{}`
        if length_text is None or not length_text.isdigit():
            self.close_connection = True  # the body is not read: the rest of the stream is not a request
            self._error(411, "a JSON body with a Content-Length is required")
            return None
        length = int(length_text)
        if length > MAX_BODY:
            self.close_connection = True
            self._error(413, f"body of {length} bytes is larger than {MAX_BODY}")
            return None
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._error(400, f"body is not valid JSON: {exc}")
            return None
        except RecursionError:
            self._error(400, "body is nested too deeply to be a phase mark")
            return None
        except ValueError as exc:  # a number of more than 4300 digits (Python's int_max_str_digits)
            self._error(400, f"body is not usable JSON: {exc}")
            return None
        if not isinstance(body, dict):
            self._error(400, "body must be a JSON object")
            return None
        return body

    def do_PUT(self) -> None:  # noqa: N802
        self._answering()
        self.close_connection = True
        self._error(405, "use GET for /healthz, /readyz, /status and POST for /phases, /complete")

    do_DELETE = do_PUT
    do_PATCH = do_PUT
