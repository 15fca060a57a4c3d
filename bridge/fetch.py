"""Fetch one /metrics page: the seam the scrape loop calls.

The production client is libcurl through pycurl, chosen by measurement against urllib3 and httpx
(bench/bench_http.py, numbers in bench/RESULTS.md). httpx stays the tests' client (a test dependency); the
OTLP sends have their own transport (bridge/otlp/transport.py, bridge/otlp/http1.py).

Every failure is a FetchError with a kind (connect, timeout, http_status, content_type, too_large,
truncated, empty) and a message that never holds credentials.
"""

from __future__ import annotations

import base64
import math
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from bridge.errors import FetchError as FetchError
from bridge.redact import redact_url, scrub, secret_list, url_secrets


@dataclass(frozen=True, slots=True)
class FetchedPage:
    body: bytes
    start_ns: int  # wall clock when the request started: the sample time (DESIGN.md)
    end_ns: int  # wall clock when the body had been read (at most SETTLE_S after it arrived)
    content_type: str


class Fetcher(Protocol):
    def fetch(self, url: str) -> FetchedPage: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class FetchSettings:
    connect_timeout: float = 2.0
    read_timeout: float = 5.0
    max_body_bytes: int = 16 * 1024 * 1024
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    no_credentials: frozenset[str] = frozenset()  # URLs the token and basic-auth pair are never sent to


def auth_headers(url: str, settings: FetchSettings) -> tuple[str, dict[str, str]]:
    """The URL without userinfo, and the headers that carry the credentials instead."""
    parts = urlsplit(url)
    headers: dict[str, str] = {}
    user, password = parts.username, parts.password
    if url in settings.no_credentials:  # a built-in default the user did not name (config.py)
        settings = FetchSettings()
    if user is None and settings.basic_auth:
        user, password = settings.basic_auth
    if user is not None:
        raw = f"{unquote(user)}:{unquote(password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
    elif settings.bearer_token:
        headers["Authorization"] = f"Bearer {settings.bearer_token}"
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return bare, headers


class CurlFetcher:
    """libcurl (pycurl), one easy handle per endpoint: each keeps its connection alive. `fetch` is thread-safe
    (one lock per handle); `transfers()` drives every endpoint's GETs at once from one thread (libcurl's multi
    interface), which is how the scrape loop uses it."""

    def __init__(self, settings: FetchSettings, now_ns: Callable[[], int] = time.time_ns) -> None:
        import pycurl  # lazy: keep `import bridge` light

        self._pycurl = pycurl
        self.settings = settings
        self._now_ns = now_ns
        self._transfers: dict[str, _Transfer] = {}
        self._lock = threading.Lock()

    def transfer(self, url: str) -> _Transfer:
        transfer = self._transfers.get(url)
        if transfer is None:
            with self._lock:
                transfer = self._transfers.get(url)
                if transfer is None:
                    transfer = self._transfers[url] = _Transfer(self._pycurl, url, self.settings)
        return transfer

    def fetch(self, url: str) -> FetchedPage:
        transfer = self.transfer(url)
        with transfer.lock:
            if transfer.closed:
                raise transfer.closed_error()
            transfer.begin(self._now_ns())
            try:
                transfer.curl.perform()
            except self._pycurl.error as exc:
                raise transfer.error(int(exc.args[0]), str(exc.args[1]) if len(exc.args) > 1 else "") from None
            return transfer.page(self._now_ns())

    def transfers(self, *, settle_s: float | None = None,
                  sleep: Callable[[float], None] = time.sleep) -> CurlTransfers:
        """`settle_s` (default SETTLE_S) and `sleep`: see `CurlTransfers.settle`."""
        return CurlTransfers(self, settle_s=SETTLE_S if settle_s is None else settle_s, sleep=sleep)

    def close(self) -> None:
        with self._lock:
            transfers, self._transfers = list(self._transfers.values()), {}
        for transfer in transfers:
            with transfer.lock:
                transfer.closed = True
                transfer.curl.close()


Outcome = tuple[str, "FetchedPage | FetchError"]


class Transfers(Protocol):
    """GETs in flight together, driven by one thread: `begin` starts one, `wait` returns those that ended."""

    def begin(self, url: str) -> None: ...

    @property
    def active(self) -> bool:
        """Some GET is still in flight."""
        ...

    def wait(self, timeout_s: float, wake_fd: int) -> list[Outcome]:
        """The outcomes of the GETs that ended; waits up to `timeout_s` for one, or until `wake_fd` is readable."""
        ...

    def cancel(self) -> None: ...


class BlockingTransfers:
    """`Transfers` over any Fetcher: each GET runs to its end inside `begin` (tests' scripted fetchers)."""

    def __init__(self, fetcher: Fetcher) -> None:
        self.fetcher = fetcher
        self._ended: list[Outcome] = []

    def begin(self, url: str) -> None:
        try:
            self._ended.append((url, self.fetcher.fetch(url)))
        except FetchError as exc:
            self._ended.append((url, exc))

    active = False

    def wait(self, timeout_s: float, wake_fd: int) -> list[Outcome]:
        if not self._ended:
            _poll({wake_fd: select.POLLIN}, timeout_s)
        ended, self._ended = self._ended, []
        return ended

    def cancel(self) -> None:
        self._ended = []


# When a poll finds an answer's bytes, the scrape thread waits this long before it drives libcurl, so one drive
# reads the tick's other answers that arrive meanwhile: one wake-up a tick instead of one per answer (measured
# in bench/NOTES.md). A page's `end_ns` is when the thread read its last bytes, so at most this much after they
# arrived; the sample time is the GET's start (DESIGN.md).
SETTLE_S = 0.002


class CurlTransfers:
    """Every endpoint's GET in flight at once on one libcurl multi handle, driven by the scrape thread."""

    def __init__(self, fetcher: CurlFetcher, *, settle_s: float = SETTLE_S,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        pycurl = fetcher._pycurl
        self._fetcher = fetcher
        self._pycurl = pycurl
        self._multi = pycurl.CurlMulti()
        self._active: dict[int, _Transfer] = {}  # id(curl handle) -> its transfer
        self._refused: list[Outcome] = []
        # A GET was added since libcurl was last driven. Each drive (`perform`) looks at every transfer in flight,
        # so a wait drives libcurl before its poll only when there is something to start (else it was driven at
        # the end of the last wait): one drive per wake-up, as a bare libcurl loop does, not two.
        self._added = False
        # One poll object for the thread's life: kept-alive connections keep their sockets from tick to tick, so
        # a wait changes what is registered only when libcurl's sockets or the events it wants change.
        self._poller = select.poll()
        self._watched: dict[int, int] = {}  # fd -> events registered
        self.settle_s = settle_s
        self._sleep = sleep

    def begin(self, url: str) -> None:
        transfer = self._fetcher.transfer(url)
        transfer.lock.acquire()  # held until the GET ends: a probe of this endpoint waits for it
        if transfer.closed:
            transfer.lock.release()
            self._refused.append((url, transfer.closed_error()))
            return
        transfer.begin(self._fetcher._now_ns())
        self._active[id(transfer.curl)] = transfer
        self._multi.add_handle(transfer.curl)
        self._added = True

    @property
    def active(self) -> bool:
        return bool(self._active)

    def wait(self, timeout_s: float, wake_fd: int) -> list[Outcome]:
        if self._added or self._refused:  # (else libcurl was driven at the last wait's end)
            self._added = False
            ended = self._drive()
            if ended:
                return ended
        wanted = {wake_fd: _POLLIN}
        if self._active:
            reads, writes, errors = self._multi.fdset()
            for fd in reads:
                wanted[fd] = _POLLIN | _POLLPRI
            for fd in writes:
                wanted[fd] = wanted.get(fd, _POLLPRI) | _POLLOUT
            for fd in errors:
                wanted.setdefault(fd, _POLLPRI)
            curl_timeout_ms = self._multi.timeout()
            if curl_timeout_ms >= 0:
                timeout_s = min(timeout_s, curl_timeout_ms / 1000)
            elif len(wanted) == 1:
                timeout_s = min(timeout_s, 0.01)  # libcurl has no socket to watch yet: look again soon
        watched, poller = self._watched, self._poller
        if wanted != watched:
            for fd in [fd for fd in watched if fd not in wanted]:
                poller.unregister(fd)  # (a socket libcurl closed: a new one may take its number)
                del watched[fd]
            for fd, events in wanted.items():
                if watched.get(fd) != events:
                    poller.register(fd, events)  # (registers, or modifies what is watched)
                    watched[fd] = events
        ready = poller.poll(max(0, math.ceil(timeout_s * 1000)))
        if self._worth_settling(ready, wake_fd):
            self.settle()
        return self._drive()

    def _worth_settling(self, ready: list[tuple[int, int]], wake_fd: int) -> bool:
        """The poll found answers' bytes only, while other GETs are in flight whose answers may be on their way.
        Not with one GET in flight (nothing to wait for), not for a wake-up (a boundary, the stop), and never when
        a socket is ready to write (a connect that completed: a request to send is not kept waiting)."""
        if not ready or self.settle_s <= 0 or len(self._active) < 2:
            return False
        return all(fd != wake_fd and not events & _POLLOUT for fd, events in ready)

    def settle(self) -> None:
        """Wait `settle_s` before driving libcurl, so that one drive reads the tick's other answers (SETTLE_S)."""
        self._sleep(self.settle_s)

    def _drive(self) -> list[Outcome]:
        pycurl, multi = self._pycurl, self._multi
        while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        ended, self._refused = self._refused, []
        while True:
            queued, succeeded, failed = multi.info_read()
            for curl in succeeded:
                transfer = self._end(curl)
                try:
                    ended.append((transfer.url, transfer.page(self._fetcher._now_ns())))
                except FetchError as exc:
                    ended.append((transfer.url, exc))
            for curl, code, message in failed:
                transfer = self._end(curl)
                ended.append((transfer.url, transfer.error(int(code), str(message))))
            if not queued:
                return ended

    def _end(self, curl: Any) -> _Transfer:
        transfer = self._active.pop(id(curl))
        self._multi.remove_handle(curl)
        transfer.lock.release()
        return transfer

    def cancel(self) -> None:
        for transfer in list(self._active.values()):
            self._end(transfer.curl)
        self._multi.close()


_POLLIN, _POLLOUT, _POLLPRI = select.POLLIN, select.POLLOUT, select.POLLPRI


def _poll(wanted: dict[int, int], timeout_s: float) -> None:
    poller = select.poll()
    for fd, events in wanted.items():
        poller.register(fd, events)
    poller.poll(max(0, math.ceil(timeout_s * 1000)))


# libcurl's error codes, by what they mean for a scrape (https://curl.se/libcurl/c/libcurl-errors.html); any
# other (refused, DNS, TLS, nothing answered) is a connect error.
_TRUNCATED_ERRORS = {18, 56, 61, 92}  # partial file, receive error, bad content encoding, HTTP/2 stream
_TIMEOUT = 28
_CURL_LIMITS_BODIES = 0x081400  # 8.20.0: CURLOPT_MAXFILESIZE_LARGE also stops a body that outgrows it
_FILE_TOO_LARGE = 63
_WRITE_ABORTED = 23


# TLS failures name the settings that fix them (the same for the sidecar and `dcgm-bridge parse`).
_VERIFY_HINT = ("; if the exporter's certificate is signed by a private CA, set DCGM_BRIDGE_CA_FILE (ca_file) to "
                "that CA's PEM file, or DCGM_BRIDGE_INSECURE_SKIP_VERIFY=true to skip verification "
                "(not for production)")
_TLS_HINTS = {60: _VERIFY_HINT, 51: _VERIFY_HINT, 83: _VERIFY_HINT,
              77: "; DCGM_BRIDGE_CA_FILE (ca_file) must be a readable PEM file of CA certificates",
              35: "; the TLS handshake failed: is the exporter serving https on this port (and http:// meant)?"}


class _Transfer:
    """One endpoint's libcurl handle and the state of its current request."""

    def __init__(self, pycurl: Any, url: str, settings: FetchSettings) -> None:
        self.lock = threading.Lock()
        self.url = url
        self.redacted = redact_url(url)
        self.settings = settings
        self.chunks: list[bytes] = []  # the body as libcurl hands it over (one list for the handle's life)
        self._size = 0  # counted by `_write` only
        self.start_ns = 0
        self.closed = False
        bare, headers = auth_headers(url, settings)
        curl = self.curl = pycurl.Curl()
        curl.setopt(pycurl.URL, bare)
        curl.setopt(pycurl.HTTPHEADER, [f"{name}: {value}" for name, value in headers.items()])
        curl.setopt(pycurl.ACCEPT_ENCODING, "gzip")  # and decoded by libcurl
        curl.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        curl.setopt(pycurl.FOLLOWLOCATION, 0)
        curl.setopt(pycurl.PROXY, "")  # never an *_proxy variable's proxy: exporters are in-cluster
        curl.setopt(pycurl.NOSIGNAL, 1)  # required with threads
        curl.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, int(settings.connect_timeout * 1000)))
        # The scrape timeout is the whole scrape's budget, connect included (Prometheus' scrape_timeout): a
        # trickling exporter cannot hold a scrape past it the way a per-read timeout lets it.
        curl.setopt(pycurl.TIMEOUT_MS, max(1, int(settings.read_timeout * 1000)))
        curl.setopt(pycurl.MAXFILESIZE_LARGE, settings.max_body_bytes)  # a declared Content-Length over it
        curl.setopt(pycurl.BUFFERSIZE, 256 * 1024)
        # libcurl 8.20+ enforces the body limit itself, also mid-body and after gzip decoding
        # (https://curl.se/libcurl/c/CURLOPT_MAXFILESIZE_LARGE.html): the chunks go straight to the list, with
        # no Python call per 16 KB. An older libcurl gets the counting callback.
        enforced = pycurl.version_info()[2] >= _CURL_LIMITS_BODIES
        curl.setopt(pycurl.WRITEFUNCTION, self.chunks.append if enforced else self._write)
        if settings.ca_file:
            curl.setopt(pycurl.CAINFO, settings.ca_file)
        if settings.insecure_skip_verify:
            curl.setopt(pycurl.SSL_VERIFYPEER, 0)
            curl.setopt(pycurl.SSL_VERIFYHOST, 0)
        self._pycurl = pycurl

    def _write(self, chunk: bytes) -> int | None:
        self._size += len(chunk)
        if self._size > self.settings.max_body_bytes:
            return 0  # libcurl aborts the transfer (error 23); error() reports it as too_large
        self.chunks.append(chunk)
        return None

    @property
    def size(self) -> int:
        """Body bytes received so far in this GET."""
        return max(self._size, sum(map(len, self.chunks)))

    def begin(self, start_ns: int) -> None:
        self.chunks.clear()
        self._size, self.start_ns = 0, start_ns

    def closed_error(self) -> FetchError:
        return FetchError("connect", f"{self.redacted} was not scraped: the fetcher is closed")

    def page(self, end_ns: int) -> FetchedPage:
        """The page of a GET that ended without a transport error, or what is wrong with it."""
        pycurl, curl = self._pycurl, self.curl
        body = b"".join(self.chunks)
        self.chunks.clear()
        status = curl.getinfo(pycurl.RESPONSE_CODE)
        content_type = curl.getinfo(pycurl.CONTENT_TYPE) or ""
        if status != 200:
            raise FetchError("http_status", f"{self.redacted} answered HTTP {status}")
        if content_type.lower().startswith("application/json"):
            raise FetchError("content_type", f"{self.redacted} answered JSON ({content_type}): it is not a "
                             "dcgm-exporter /metrics endpoint; check the URL and port")
        if content_type.lower().startswith(("text/html", "application/xhtml")):  # a web UI, a login page, a proxy
            raise FetchError("content_type", f"{self.redacted} answered an HTML page ({content_type}): it is not a "
                             "dcgm-exporter /metrics endpoint; check the URL, port and path")
        if not body or body.isspace():  # (strip() would copy the page)
            raise FetchError("empty", f"{self.redacted} answered 200 with an empty body (exporter reloading?)")
        return FetchedPage(body, self.start_ns, end_ns, content_type)

    def error(self, code: int, text: str) -> FetchError:
        size = self.size
        self.chunks.clear()
        where, limit = self.redacted, self.settings.max_body_bytes
        reason = scrub(text, secret_list(url_secrets(self.url)))  # libcurl's message names host and port only
        if code == _FILE_TOO_LARGE or code == _WRITE_ABORTED and size > limit:
            return FetchError("too_large", f"{where} sent more than the {limit:,}-byte limit "
                              "(DCGM_BRIDGE_MAX_BODY_BYTES)")
        if code == _TIMEOUT:
            # No connect time is a connect that did not finish, unless no connect was needed: a kept-alive
            # connection was reused (NUM_CONNECTS 0), and then it is the exporter that did not answer.
            reused = self.curl.getinfo(self._pycurl.NUM_CONNECTS) == 0
            if not reused and not self.curl.getinfo(self._pycurl.CONNECT_TIME):
                return FetchError("timeout", f"connect to {where} timed out")
            if size:
                return FetchError("timeout", f"{where} stalled mid-body: the scrape took more than "
                                  f"{self.settings.read_timeout:g} s")
            return FetchError("timeout", f"{where} did not answer within {self.settings.read_timeout:g} s")
        if code in _TRUNCATED_ERRORS and (size or code != 56):
            return FetchError("truncated", f"{where} sent an incomplete body: {reason}")
        return FetchError("connect", f"cannot connect to {where}: {reason}{_TLS_HINTS.get(code, '')}")


def make_fetcher(settings: FetchSettings, now_ns: Callable[[], int] = time.time_ns) -> CurlFetcher:
    """The production fetcher: libcurl, the cheapest maintained client measured (bench/bench_http.py)."""
    return CurlFetcher(settings, now_ns=now_ns)


def transfers_of(fetcher: Fetcher) -> Transfers:
    """How the scrape loop drives a fetcher: libcurl's multi interface, or one blocking GET at a time."""
    if isinstance(fetcher, CurlFetcher):
        return fetcher.transfers()
    return BlockingTransfers(fetcher)
