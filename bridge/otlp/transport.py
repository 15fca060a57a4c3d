"""OTLP transports: the seam the forwarder sends through, and its HTTP and gRPC implementations.

Both send the encoder's bytes as they are and translate every outcome into a SendResult (never an
exception): retryable or not, the receiver's message, its Retry-After / RetryInfo hint, and the
points a partial success rejected. HTTP on a connection of its own (http1.py: one sendmsg per request,
cheaper than urllib3, bench/NOTES.md); grpcio for gRPC, imported only when gRPC is configured. The SDK exporters are
not used: they take SDK `MetricsData`, whose encoding is the per-point object path this package avoids
(bench/bench_otlp.py).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import orjson

from bridge.otlp.config import OtlpConfig, OtlpConfigError
from bridge.otlp.http1 import ConnectFailed, Http1Connection, TimedOut
from bridge.otlp.points import Chunk
from bridge.otlp.wire import request_bytes
from bridge.redact import redact_url, scrub, secret_list, url_secrets

logger = logging.getLogger(__name__)

USER_AGENT = "dcgm-bridge-otlp/0.1"
RETRYABLE_HTTP = frozenset([429, 502, 503, 504])
GRPC_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
_RETRYABLE_GRPC = frozenset(
    ["CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "OUT_OF_RANGE", "UNAVAILABLE",
     "DATA_LOSS"]
)


class SendResult(NamedTuple):
    ok: bool
    retryable: bool = False
    status: str = ""  # "200", "503", "UNAVAILABLE", "connect", "timeout"
    message: str = ""  # the receiver's message, for the log
    retry_after_s: float | None = None
    rejected_points: int = 0  # partial success: points the receiver refused


class Sender(Protocol):
    """The transport seam: tests inject a fake; production is HttpSender or GrpcSender. `send` takes the
    request in parts (framed ResourceMetrics chunks: `wire.request_bytes` of them is the request's bytes), so
    that a batch of megabytes is not copied into one buffer only to be written to a socket."""

    def send(self, parts: Sequence[Chunk]) -> SendResult: ...

    def close(self) -> None: ...


GRPC_MISSING = ("OTLP over gRPC needs grpcio: pip install 'dcgm-bridge[grpc]', "
                "or send OTLP/HTTP (OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)")

def make_sender(config: OtlpConfig) -> Sender:
    return GrpcSender(config) if config.protocol == "grpc" else HttpSender(config)


def secrets_of(config: OtlpConfig) -> tuple[str, ...]:
    """What must never reach a log line or the status: header values, and the endpoint's userinfo and query."""
    found = url_secrets(config.endpoint) + [value for _, value in config.headers]
    for _, value in config.headers:  # "Bearer <token>": the token alone, too
        found += value.split()[1:]
    return secret_list(found)


def _scrubbed(result: SendResult, secrets: tuple[str, ...]) -> SendResult:
    return result._replace(message=scrub(result.message, secrets)) if result.message and secrets else result


class HttpSender:
    """OTLP/HTTP protobuf on one kept-alive connection (http1.py: TLS, optional gzip)."""

    def __init__(self, config: OtlpConfig) -> None:
        self.url = config.endpoint
        self.gzip = config.compression == "gzip"
        headers = {"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT, **dict(config.headers)}
        if self.gzip:
            headers["Content-Encoding"] = "gzip"
        self.headers = list(headers.items())
        tls = None
        if self.url.startswith("https:"):
            import ssl  # Python's OpenSSL, loaded only for https

            tls = ssl.create_default_context(cafile=config.certificate)
            if config.client_certificate:
                tls.load_cert_chain(config.client_certificate, config.client_key)
        self._connection = Http1Connection(self.url, timeout_s=config.timeout_s, ssl_context=tls)
        self._secrets = secrets_of(config)
        self._warned_content_type = False

    def send(self, parts: Sequence[Chunk]) -> SendResult:
        return _scrubbed(self._send(parts), self._secrets)

    def _send(self, parts: Sequence[Chunk]) -> SendResult:
        if self.gzip:
            # Level 1: a third of level 6's CPU for a page that compresses ~10x either way.
            compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
            parts = [b"".join([*map(compressor.compress, parts), compressor.flush()])]
        # The parts go out in one sendmsg under a Content-Length: no copy of the whole batch, not chunked.
        try:
            response = self._connection.post(self.headers, parts)
        except TimedOut as exc:
            return SendResult(False, True, "timeout", str(exc)[:300])
        except ConnectFailed as exc:
            return SendResult(False, True, "connect", str(exc)[:300])
        status, data = response.status, response.body
        if 200 <= status < 300:
            content_type = response.headers.get("content-type", "").lower()
            if not data:  # an empty body is a full success (the OTLP/HTTP spec)
                return SendResult(True, status=str(status))
            if "json" in content_type:
                rejected, message = _partial_success_json(data)
            elif "protobuf" in content_type or not content_type:
                rejected, message = _partial_success(data)
            else:  # an HTML login page, a proxy's answer: likely not the receiver at all
                rejected, message = 0, ""
                self._warn_content_type(status, content_type)
            return SendResult(True, status=str(status), message=message, rejected_points=rejected)
        message = _http_error_message(data, response.headers.get("content-type", ""))
        retry_after = _retry_after(response.headers.get("retry-after"))
        return SendResult(False, status in RETRYABLE_HTTP, str(status), message, retry_after)

    def _warn_content_type(self, status: int, content_type: str) -> None:
        if self._warned_content_type:
            return
        self._warned_content_type = True
        logger.warning("OTLP endpoint %s answered %d with Content-Type %s, not protobuf or JSON: is it an OTLP "
                       "receiver (and not a proxy's or a login page)? The points are counted as sent",
                       redact_url(self.url), status, content_type[:100])

    def close(self) -> None:
        self._connection.close()


class GrpcSender:
    """OTLP/gRPC with grpcio, sending the encoded request bytes as they are (no pb2 round trip)."""

    def __init__(self, config: OtlpConfig) -> None:
        try:
            import grpc
        except ImportError:  # the `grpc` extra: most receivers take OTLP/HTTP, which needs no grpcio
            raise OtlpConfigError(GRPC_MISSING) from None

        self._grpc = grpc
        options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
        if config.insecure:
            self.channel = grpc.insecure_channel(config.endpoint, options=options)
        else:
            def read(path: str | None) -> bytes | None:
                if not path:
                    return None
                with open(path, "rb") as file:
                    return file.read()

            credentials = grpc.ssl_channel_credentials(
                read(config.certificate), read(config.client_key), read(config.client_certificate)
            )
            self.channel = grpc.secure_channel(config.endpoint, credentials, options=options)
        self.export = self.channel.unary_unary(GRPC_METHOD)  # bytes in, bytes out
        self.metadata = tuple(config.headers)
        self.timeout = config.timeout_s
        self.compression = grpc.Compression.Gzip if config.compression == "gzip" else None
        self._secrets = secrets_of(config)
        self._warned_content_type = False

    def send(self, parts: Sequence[Chunk]) -> SendResult:
        return _scrubbed(self._send(parts), self._secrets)

    def _send(self, parts: Sequence[Chunk]) -> SendResult:
        grpc = self._grpc
        try:
            data = self.export(
                request_bytes(parts), timeout=self.timeout, metadata=self.metadata, compression=self.compression
            )
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            name = code.name if code is not None else "UNKNOWN"
            details = exc.details() if callable(getattr(exc, "details", None)) else ""
            retry_after = _grpc_retry_delay(exc)
            return SendResult(False, name in _RETRYABLE_GRPC, name, str(details or ""), retry_after)
        rejected, message = _partial_success(data or b"")
        return SendResult(True, status="OK", message=message, rejected_points=rejected)

    def close(self) -> None:
        self.channel.close()


# -- response decoding (small enough to do without message classes) --------------------------
def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, pos


def _fields(data: bytes) -> dict[int, list[int | bytes]]:
    """Top-level fields of a protobuf message: varints and length-delimited values only."""
    out: dict[int, list[int | bytes]] = {}
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            out.setdefault(number, []).append(value)
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            out.setdefault(number, []).append(data[pos:pos + length])
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError("unsupported wire type")
    return out


def _partial_success(data: bytes) -> tuple[int, str]:
    """ExportMetricsServiceResponse.partial_success{rejected_data_points = 1, error_message = 2}."""
    try:
        partial = _fields(data).get(1)
        if not partial or not isinstance(partial[0], bytes):
            return 0, ""
        fields = _fields(partial[0])
        rejected = fields.get(1, [0])[0]
        message = fields.get(2, [b""])[0]
        return (int(rejected) if isinstance(rejected, int) else 0,
                message.decode("utf-8", "replace") if isinstance(message, bytes) else "")
    except (ValueError, IndexError):
        return 0, ""  # not protobuf (some receivers answer "{}" or text): nothing to report


def _partial_success_json(data: bytes) -> tuple[int, str]:
    """The same in OTLP/JSON: {"partialSuccess": {"rejectedDataPoints": "3" (an int64: a string or a number),
    "errorMessage": "…"}}."""
    try:
        partial = orjson.loads(data).get("partialSuccess") or {}
        rejected = int(partial.get("rejectedDataPoints") or 0)
        return max(0, rejected), str(partial.get("errorMessage") or "")
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        return 0, ""


def _http_error_message(data: bytes, content_type: str) -> str:
    if "protobuf" in content_type:
        try:  # google.rpc.Status{code = 1, message = 2}
            message = _fields(data).get(2, [b""])[0]
            if isinstance(message, bytes) and message:
                return message.decode("utf-8", "replace")
        except (ValueError, IndexError):
            pass
    return data[:500].decode("utf-8", "replace").strip()


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime  # an HTTP-date: rare, and the email package is ~0.8 MiB

    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _grpc_retry_delay(exc: Any) -> float | None:
    """google.rpc.RetryInfo from the `grpc-status-details-bin` trailer, when the server sent one."""
    try:
        for key, value in exc.trailing_metadata() or ():
            if key != "grpc-status-details-bin":
                continue
            for detail in _fields(value).get(3, []):  # Status.details: repeated Any{type_url 1, value 2}
                if not isinstance(detail, bytes):
                    continue
                any_fields = _fields(detail)
                type_url = any_fields.get(1, [b""])[0]
                if isinstance(type_url, bytes) and type_url.endswith(b"google.rpc.RetryInfo"):
                    info = any_fields.get(2, [b""])[0]
                    delay = _fields(info).get(1, [b""])[0] if isinstance(info, bytes) else b""
                    if isinstance(delay, bytes):  # Duration{seconds = 1, nanos = 2}
                        duration = _fields(delay)
                        seconds, nanos = duration.get(1, [0])[0], duration.get(2, [0])[0]
                        if isinstance(seconds, int) and isinstance(nanos, int):
                            return seconds + nanos / 1e9
    except Exception:  # noqa: BLE001 - a malformed trailer just means "no hint"
        return None
    return None
