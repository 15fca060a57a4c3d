"""Fetch one /metrics page: the seam the scrape loop calls.

The production client is urllib3, chosen by measurement (performance.md, bench/bench_http.py):
~0.44 ms of CPU per 76 KB GET against ~2.5 ms for httpx.AsyncClient, whose cost alone would exceed
the sidecar's 25m budget at 24 scrapes/s. httpx stays for probes, the control plane and tests.

Every failure is a FetchError with a kind (connect, timeout, http_status, content_type, too_large,
truncated, empty) and a message that never holds credentials.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from bridge.endpoints import redact_url


class FetchError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class FetchedPage:
    body: bytes
    start_ns: int  # wall clock when the request started: the sample time (DESIGN.md)
    end_ns: int  # wall clock when the body was complete
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


class LogScrubber(logging.Filter):
    """Replaces known secrets in a third-party logger's records: urllib3 logs each request line (query string
    included) at DEBUG. Installed on the loggers by the clients that know the secrets."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        super().__init__()
        self.secrets = tuple(sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True))

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            text = record.getMessage()
            if any(secret in text for secret in self.secrets):
                for secret in self.secrets:
                    text = text.replace(secret, "<redacted>")
                record.msg, record.args = text, None
        return True

    def install(self, *names: str) -> LogScrubber:
        for name in names:
            logging.getLogger(name).addFilter(self)
        return self

    def remove(self, *names: str) -> None:
        for name in names:
            logging.getLogger(name).removeFilter(self)


URLLIB3_LOGGERS = ("urllib3.connectionpool", "urllib3.connection", "urllib3.util.retry", "urllib3.poolmanager")


def url_secrets(url: str) -> list[str]:
    parts = urlsplit(url)
    found = [unquote(v) for v in (parts.username, parts.password) if v]
    if parts.query:
        found += [parts.query, unquote(parts.query)] + [unquote(v) for v in parts.query.replace(";", "&").split("&")]
    return found


def auth_headers(url: str, settings: FetchSettings) -> tuple[str, dict[str, str]]:
    """The URL without userinfo, and the headers that carry the credentials instead."""
    parts = urlsplit(url)
    headers: dict[str, str] = {}
    user, password = parts.username, parts.password
    if user is None and settings.basic_auth:
        user, password = settings.basic_auth
    if user is not None:
        raw = f"{unquote(user)}:{unquote(password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
    elif settings.bearer_token:
        headers["Authorization"] = f"Bearer {settings.bearer_token}"
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return bare, headers


class Urllib3Fetcher:
    """One connection pool for every endpoint of the sidecar; thread-safe."""

    def __init__(self, settings: FetchSettings, now_ns: Callable[[], int] = time.time_ns) -> None:
        import urllib3  # lazy: keep `import bridge` light

        self._urllib3 = urllib3
        self.settings = settings
        self._now_ns = now_ns
        kwargs: dict[str, Any] = {"maxsize": 2, "retries": False}
        if settings.ca_file:
            kwargs["ca_certs"] = settings.ca_file
        if settings.insecure_skip_verify:
            kwargs["cert_reqs"] = "CERT_NONE"
        self._pool = urllib3.PoolManager(num_pools=64, **kwargs)
        self._timeout = urllib3.Timeout(connect=settings.connect_timeout, read=settings.read_timeout)
        self._requests: dict[str, tuple[str, Mapping[str, str]]] = {}
        secrets = [settings.bearer_token or ""] + list(settings.basic_auth or ())
        self._scrubber = LogScrubber(tuple(secrets)).install(*URLLIB3_LOGGERS)

    def fetch(self, url: str) -> FetchedPage:
        urllib3 = self._urllib3
        target = self._requests.get(url)
        if target is None:
            bare, headers = auth_headers(url, self.settings)
            target = self._requests[url] = (bare, {"Accept-Encoding": "gzip", **headers})
            secrets = self._scrubber.secrets + tuple(url_secrets(url)) + tuple(headers.values())
            self._scrubber.secrets = tuple(sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True))
        start_ns = self._now_ns()
        try:
            response = self._pool.request("GET", target[0], headers=target[1], timeout=self._timeout,
                                          preload_content=False, redirect=False)
        except urllib3.exceptions.NewConnectionError as exc:
            # Checked first: urllib3's NewConnectionError subclasses ConnectTimeoutError.
            raise FetchError("connect", f"cannot connect to {redact_url(url)}: {_reason(exc)}") from None
        except urllib3.exceptions.ConnectTimeoutError:
            raise FetchError("timeout", f"connect to {redact_url(url)} timed out") from None
        except urllib3.exceptions.ReadTimeoutError:
            raise FetchError("timeout", f"{redact_url(url)} did not answer within "
                             f"{self.settings.read_timeout:g} s") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise FetchError("connect", f"cannot connect to {redact_url(url)}: {_reason(exc)}") from None
        try:
            return self._read(url, response, start_ns)
        finally:
            response.release_conn()

    def _read(self, url: str, response: object, start_ns: int) -> FetchedPage:
        urllib3 = self._urllib3
        assert isinstance(response, urllib3.BaseHTTPResponse)
        status = response.status
        content_type = response.headers.get("Content-Type", "")
        if status != 200:
            response.drain_conn()
            raise FetchError("http_status", f"{redact_url(url)} answered HTTP {status}")
        if content_type.lower().startswith("application/json"):
            response.drain_conn()
            raise FetchError("content_type", f"{redact_url(url)} answered JSON ({content_type}): it is not a "
                             "dcgm-exporter /metrics endpoint; check the URL and port")
        limit = self.settings.max_body_bytes
        declared = response.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise FetchError("too_large", f"{redact_url(url)} sent {int(declared):,} bytes, more than the "
                             f"{limit:,}-byte limit (DCGM_BRIDGE_MAX_BODY_BYTES)")
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.stream(256 * 1024, decode_content=True):
                size += len(chunk)
                if size > limit:
                    raise FetchError("too_large", f"{redact_url(url)} sent more than the {limit:,}-byte limit "
                                     "(DCGM_BRIDGE_MAX_BODY_BYTES)")
                chunks.append(chunk)
        except urllib3.exceptions.ReadTimeoutError:
            raise FetchError("timeout", f"{redact_url(url)} stalled mid-body for more than "
                             f"{self.settings.read_timeout:g} s") from None
        except (urllib3.exceptions.ProtocolError, urllib3.exceptions.DecodeError) as exc:
            raise FetchError("truncated", f"{redact_url(url)} sent an incomplete body: {_reason(exc)}") from None
        body = b"".join(chunks)
        if not body.strip():
            raise FetchError("empty", f"{redact_url(url)} answered 200 with an empty body (exporter reloading?)")
        return FetchedPage(body, start_ns, self._now_ns(), content_type)

    def close(self) -> None:
        self._pool.clear()
        self._scrubber.remove(*URLLIB3_LOGGERS)


def _reason(exc: BaseException) -> str:
    # urllib3 wraps the cause several times; the innermost reason is what a person can act on.
    reason = getattr(exc, "reason", None)
    while reason is not None and getattr(reason, "reason", None) is not None:
        reason = reason.reason
    text = str(reason or exc)
    return text.split(": ", 1)[-1] if "Failed to establish" in text else text


def make_fetcher(settings: FetchSettings, now_ns: Callable[[], int] = time.time_ns) -> Fetcher:
    """The production fetcher. A hand-written socket client measured ~4x cheaper per GET, but the project
    keeps a maintained HTTP library on the scrape path (issue #2): urllib3 is the cheapest one measured."""
    return Urllib3Fetcher(settings, now_ns=now_ns)
