"""The OTLP/HTTP sender's client: one kept-alive HTTP/1.1 connection that POSTs a body given in parts.

Why not urllib3 (issue 18; the figures are in bench/NOTES.md): the sidecar sends megabytes of OTLP a second,
and urllib3 spent more than twice the CPU on each such request that one `sendmsg` of the header and the
parts, and a small reader for the answer, spend. The request is all an OTLP exporter needs: POST,
a known Content-Length, no redirects, no proxies (urllib3's PoolManager used none either), no Expect.

The answer is read as RFC 9112 frames it: status line, header fields, then the body by
`Transfer-Encoding: chunked`, else by `Content-Length`, else until the server closes (and no body for
1xx, 204 and 304). A connection is reused until the server says `Connection: close`, answers HTTP/1.0
without keep-alive, or a read fails. A kept-alive connection the server has closed meanwhile is noticed
before the request (readable while idle) and replaced; if the server closes it as the request goes out,
before any byte of an answer, the request is sent once more on a new connection, as browsers and
urllib3 do for an idempotent retry: the receiver never saw the first one.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import urlsplit

from bridge.otlp.points import Chunk
from bridge.views import advance

if TYPE_CHECKING:  # ssl maps Python's OpenSSL (~4.7 MiB of RSS): imported only for an https URL
    import ssl

MAX_HEAD = 64 * 1024  # status line and header fields
MAX_BODY = 4 * 1024 * 1024  # an OTLP answer is a few bytes; an error page is cut here
_NO_BODY = frozenset([204, 304])
_IOV_MAX = 1024  # sendmsg's vector bound (Linux UIO_MAXIOV)
_SEND_STEP_S = 1.0  # the longest a send waits for room before it looks for an early answer


class ConnectFailed(OSError):
    """No connection (refused, unresolvable, TLS handshake) or the connection broke mid-request."""


class TimedOut(OSError):
    """The request did not finish within its time budget."""


class Response(NamedTuple):
    status: int
    headers: dict[str, str]  # lower-case names; a repeated field keeps its last value
    body: bytes


class Http1Connection:
    """POSTs to one URL (http:// or https://) over one kept-alive connection. Not thread-safe: one caller."""

    def __init__(self, url: str, *, timeout_s: float, ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        # An ASCII name as bytes: getaddrinfo then skips the IDNA codec (with unicodedata, kept for the run);
        # typeshed's create_connection says str, getaddrinfo takes both
        self._lookup: str | bytes = self.host.encode("ascii") if self.host.isascii() else self.host
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        name = f"[{self.host}]" if ":" in self.host else self.host
        default = (parts.scheme == "https" and self.port == 443) or (parts.scheme == "http" and self.port == 80)
        self.authority = name if default else f"{name}:{self.port}"
        self.tls = ssl_context if parts.scheme == "https" else None
        if parts.scheme == "https" and self.tls is None:
            import ssl

            self.tls = ssl.create_default_context()
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._buffer = b""  # bytes read past the previous answer (none, from a well-behaved server)

    def post(self, headers: Sequence[tuple[str, str]], parts: Sequence[Chunk]) -> Response:
        """Send one request whose body is `parts` one after the other; raises ConnectFailed or TimedOut."""
        deadline = time.monotonic() + self.timeout_s
        size = sum(map(len, parts))
        head = "".join([f"POST {self.target} HTTP/1.1\r\nHost: {self.authority}\r\n",
                        *(f"{name}: {value}\r\n" for name, value in headers),
                        f"Content-Length: {size}\r\n\r\n"]).encode("latin-1")
        reused = self._sock is not None and self._idle_and_open()
        if not reused:
            self.close()
        while True:
            try:
                return self._exchange(head, parts, deadline)
            except _ClosedBeforeAnswer:
                self.close()
                if not reused:
                    raise ConnectFailed("the receiver closed the connection without an answer") from None
                reused = False  # closed under the request: once more on a new connection

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._buffer = None, b""

    # -- one exchange ---------------------------------------------------------------------------
    def _exchange(self, head: bytes, parts: Sequence[Chunk], deadline: float) -> Response:
        try:
            if self._sock is None:
                self._connect(deadline)
            sent = self._send(head, parts, deadline)
            response, keep = self._read_response(deadline)
            keep = keep and sent
        except (_ClosedBeforeAnswer, ConnectFailed):
            raise
        except TimedOut:
            self.close()
            raise
        except TimeoutError:
            self.close()
            raise TimedOut(f"no answer within {self.timeout_s:g} s") from None
        except (OSError, ValueError) as exc:  # reset, broken pipe, a malformed answer
            self.close()
            raise ConnectFailed(_describe(exc)) from None
        if not keep:
            self.close()
        return response

    def _connect(self, deadline: float) -> None:
        try:
            sock = socket.create_connection((self._lookup, self.port), timeout=_left(deadline))  # type: ignore[arg-type]
        except TimeoutError:
            raise TimedOut(f"no connection to {self.authority} within {self.timeout_s:g} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.authority}: {_describe(exc)}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            except TimeoutError:
                sock.close()
                raise TimedOut(f"no TLS handshake with {self.authority} within {self.timeout_s:g} s") from None
            except OSError as exc:  # ssl.SSLError is one
                sock.close()
                raise ConnectFailed(f"TLS with {self.authority}: {_describe(exc)}") from None
        self._sock, self._buffer = sock, b""

    def _send(self, head: bytes, parts: Sequence[Chunk], deadline: float) -> bool:
        """The request on the wire; False when the receiver closed its side before taking all of it (it may have
        answered first, as a receiver refusing a body too large does: that answer is then read)."""
        sock = self._sock
        assert sock is not None
        try:
            if self.tls is not None:  # no sendmsg under TLS: each part in turn
                for data in (head, *parts):
                    sock.settimeout(_left(deadline))
                    sock.sendall(data)
                return True
            views = [memoryview(data) for data in (head, *parts) if data]
            # A blocking sendmsg: the kernel takes the whole request in one call, with the GIL released
            # throughout (a non-blocking loop would take the GIL back at every buffer's worth and hold up the
            # scrape thread). SO_SNDTIMEO bounds each call; between calls, an answer that came before the end
            # of the body (413 from a receiver that stops reading) ends the send.
            sock.settimeout(None)
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            while views:
                step = max(0.001, min(_SEND_STEP_S, _left(deadline)))  # (a zero timeval would mean no bound)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                                struct.pack("ll", int(step), int(step % 1 * 1_000_000)))
                try:
                    sent = sock.sendmsg(views[:_IOV_MAX])
                except BlockingIOError:  # SO_SNDTIMEO ran out with nothing taken
                    sent = 0
                advance(views, sent)
                if views and poller.poll(0):
                    return False
        except (BrokenPipeError, ConnectionResetError):
            return False  # (no answer waiting: the read finds the close, and the request goes again)
        return True

    def _read_response(self, deadline: float) -> tuple[Response, bool]:
        while True:  # 1xx answers (100 Continue, 103 Early Hints) come before the real one
            head = self._read_head(deadline)
            status, version, headers = _parse_head(head)
            if not 100 <= status < 200:
                break
        connection = headers.get("connection", "").lower()
        keep = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        if status in _NO_BODY:
            return Response(status, headers, b""), keep
        try:
            if "chunked" in headers.get("transfer-encoding", "").lower():
                return Response(status, headers, self._read_chunked(deadline)), keep
            length = headers.get("content-length")
            if length is not None:
                if not length.strip().isdigit():
                    raise ValueError(f"bad Content-Length {length!r}")
                return Response(status, headers, self._read_exactly(int(length), deadline)), keep
        except _Oversized as exc:  # not an OTLP answer: its start is enough for the log; the rest is not read
            return Response(status, headers, exc.start), False
        return Response(status, headers, self._read_to_close(deadline)), False

    def _read_head(self, deadline: float) -> bytes:
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            if len(self._buffer) > MAX_HEAD:
                raise ValueError("an answer's header is over 64 KiB")
            if not self._buffer:  # no byte of an answer yet: a close or a reset here is a stale connection's
                try:
                    data = self._recv(deadline)
                except ConnectionResetError:
                    data = b""
                if not data:
                    raise _ClosedBeforeAnswer
                self._buffer = data
                continue
            self._more(deadline, "an answer's header")
        head, self._buffer = self._buffer[:end], self._buffer[end + 4:]
        return head

    def _read_exactly(self, size: int, deadline: float) -> bytes:
        while len(self._buffer) < min(size, MAX_BODY):
            self._more(deadline, "an answer's body")
        if size > MAX_BODY:  # an answer this big is not OTLP: keep its start, drop the connection
            raise _Oversized(self._buffer[:MAX_BODY])
        body, self._buffer = self._buffer[:size], self._buffer[size:]
        return body

    def _read_line(self, deadline: float) -> bytes:
        while (end := self._buffer.find(b"\r\n")) < 0:
            if len(self._buffer) > MAX_HEAD:
                raise ValueError("a chunk header is over 64 KiB")
            self._more(deadline, "a chunked answer")
        line, self._buffer = self._buffer[:end], self._buffer[end + 2:]
        return line

    def _read_chunked(self, deadline: float) -> bytes:
        body = bytearray()
        while True:
            size_text = self._read_line(deadline).split(b";", 1)[0].strip()
            size = int(size_text, 16)  # ValueError: a malformed answer
            if size == 0:
                while self._read_line(deadline):  # trailer fields, up to the empty line
                    pass
                return bytes(body)
            if len(body) + size > MAX_BODY:
                raise _Oversized(bytes(body))
            body += self._read_exactly(size, deadline)
            if self._read_line(deadline):
                raise ValueError("a chunk without its CRLF")

    def _read_to_close(self, deadline: float) -> bytes:
        body = bytearray(self._buffer)
        self._buffer = b""
        while len(body) < MAX_BODY and (data := self._recv(deadline)):
            body += data
        return bytes(body[:MAX_BODY])

    def _more(self, deadline: float, inside: str) -> None:
        """The next bytes of an answer that has begun onto the buffer; the connection closing is a malformed answer."""
        data = self._recv(deadline)
        if not data:
            raise ValueError(f"the connection closed inside {inside}")
        self._buffer += data

    def _recv(self, deadline: float) -> bytes:
        sock = self._sock
        assert sock is not None
        sock.settimeout(_left(deadline))
        return sock.recv(65536)

    def _idle_and_open(self) -> bool:
        """A kept-alive connection is readable while idle only when the server closed it (or wrote junk)."""
        sock = self._sock
        if sock is None or self._buffer:
            return False
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        if not poller.poll(0):
            return True
        if self.tls is None:
            return False
        import ssl

        # Under TLS 1.3 the server's session tickets arrive after the handshake and make an open connection
        # readable: read without waiting, and only a close or application data means it cannot be reused.
        sock.settimeout(0)
        try:
            sock.recv(1)  # b"": closed; anything else: not the start of an answer to a request not yet sent
        except ssl.SSLWantReadError:
            return True
        except OSError:
            pass
        return False


class _ClosedBeforeAnswer(Exception):
    """The server closed the connection before any byte of its answer (a stale kept-alive connection)."""


class _Oversized(ValueError):
    def __init__(self, start: bytes) -> None:
        super().__init__("an answer over 4 MiB")
        self.start = start


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimedOut("the request's time budget ran out")
    return left


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ValueError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return int(code), version, headers


def _describe(exc: BaseException) -> str:
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return (text or type(exc).__name__)[:300]
