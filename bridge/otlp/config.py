"""OTLP export settings: flag > `OTEL_EXPORTER_OTLP_[METRICS_]*` environment > default, resolved once.

Environment variables (OpenTelemetry spec "OTLP Exporter configuration"); the `METRICS_` form wins
over the generic one, a CLI flag over both:

| setting | variables | default |
|---|---|---|
| endpoint | `..._METRICS_ENDPOINT` (used as is), `..._ENDPOINT` (HTTP: + `/v1/metrics`) | none: export off |
| protocol | `..._PROTOCOL`: `http/protobuf`, `grpc` (`http/json` is refused) | `http/protobuf` |
| headers | `..._HEADERS`: `k=v,k2=v2`, percent-decoded | none |
| timeout | `..._TIMEOUT`: milliseconds | 10000 |
| compression | `..._COMPRESSION`: `gzip`, `none` | `none` |
| TLS | `..._CERTIFICATE`, `..._CLIENT_CERTIFICATE`, `..._CLIENT_KEY` (file paths); `..._INSECURE` (gRPC) | |

An endpoint flag is taken as the full metrics URL, except that a URL without a path gets
`/v1/metrics` (HTTP). For gRPC, `http://` means plaintext, `https://` TLS, and a bare `host:port`
follows `..._INSECURE` (default false: TLS, as the spec says).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from bridge.errors import ConfigError
from bridge.headers import header_pairs
from bridge.otlp.starttime import StartTimeMode

Protocol = Literal["http/protobuf", "grpc"]
Compression = Literal["none", "gzip"]
Units = Literal["none", "ucum"]
Names = Literal["exporter", "semconv"]
_PREFIX = "OTEL_EXPORTER_OTLP_"


class OtlpConfigError(ConfigError):
    """Invalid OTLP settings; the message lists every problem, sorted."""


@dataclass(frozen=True)
class OtlpConfig:
    endpoint: str  # HTTP: full URL of the metrics path; gRPC: host:port
    protocol: Protocol = "http/protobuf"
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # values can be tokens: never logged
    timeout_s: float = 10.0
    compression: Compression = "none"
    insecure: bool = True  # gRPC: plaintext
    certificate: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    # Batching and queueing (ours, not the spec's).
    export_interval_s: float = 1.0
    max_batch_points: int = 8192
    max_batch_bytes: int = 3_500_000  # below gRPC servers' usual 4 MiB receive limit
    # Pages waiting (and the batch in flight), by what they hold of their own (export.held_bytes); beyond it the
    # oldest page is dropped. 16 MiB: ~30 s of 64 endpoints x 8 GPUs at 3 Hz (bench/NOTES.md, "OTLP queue").
    max_queue_bytes: int = 16 * 2**20
    max_queue_points: int | None = None  # an additional bound in points (--otlp-max-queue-points), off by default
    retry_initial_backoff_s: float = 0.5
    retry_max_backoff_s: float = 10.0
    # Mapping.
    units: Units = "none"  # "ucum": units from the HELP text; changes names in Prometheus (adds _watts...)
    names: Names = "exporter"  # "semconv": GPU metrics as OpenTelemetry's hw.* (bridge/otlp/semconv.py)
    start_time: StartTimeMode = "first_seen"

    @property
    def header_names(self) -> list[str]:
        return [k for k, _ in self.headers]


def resolve_config(
    env: Mapping[str, str],
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: str | Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    compression: str | None = None,
    insecure: bool | None = None,
    certificate: str | None = None,
    client_certificate: str | None = None,
    client_key: str | None = None,
    export_interval_s: float | None = None,
    max_queue_points: int | None = None,
    max_batch_points: int | None = None,
    units: str | None = None,
    start_time: str | None = None,
    names: str | None = None,
) -> OtlpConfig | None:
    """The export settings, or None when no endpoint is configured anywhere (export off).

    Keyword arguments are the CLI flags (None: not given). Raises OtlpConfigError.
    """
    problems: list[str] = []

    def pick(flag: str | None, name: str) -> str | None:
        if flag is not None:
            return flag
        for var in (f"{_PREFIX}METRICS_{name}", f"{_PREFIX}{name}"):
            value = env.get(var, "").strip()
            if value:
                return value
        return None

    proto = (pick(protocol, "PROTOCOL") or "http/protobuf").lower()
    if proto not in ("http/protobuf", "grpc"):
        problems.append(f"OTLP protocol {proto!r} is not supported: use http/protobuf or grpc")
        proto = "http/protobuf"

    url = _resolve_endpoint(endpoint, env, proto)
    if url is None:
        if problems:
            raise OtlpConfigError("\n".join(sorted(problems)))
        return None

    insecure_text = None if insecure is not None else pick(None, "INSECURE")
    grpc_insecure = insecure if insecure is not None else (insecure_text or "false").lower() == "true"
    if proto == "grpc":
        url, grpc_insecure = _grpc_target(url, grpc_insecure, problems)
    elif not url.lower().startswith(("http://", "https://")):
        problems.append(f"OTLP endpoint {url!r}: an HTTP endpoint needs http:// or https://")

    pairs = header_pairs(headers if headers is not None else pick(None, "HEADERS"), problems)

    timeout = timeout_s
    if timeout is None:
        raw = pick(None, "TIMEOUT")
        if raw is not None:
            try:
                timeout = float(raw) / 1000.0  # the spec's unit is milliseconds
            except ValueError:
                problems.append(f"{_PREFIX}TIMEOUT={raw!r} is not a number of milliseconds")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        problems.append(f"OTLP timeout must be positive, got {timeout}")

    comp = (pick(compression, "COMPRESSION") or "none").lower()
    if comp not in ("none", "gzip"):
        problems.append(f"OTLP compression {comp!r} is not supported: use gzip or none")

    unit_mode = units or "none"
    if unit_mode not in ("none", "ucum"):
        problems.append(f"OTLP units {unit_mode!r}: use none or ucum")
    name_mode = names or "exporter"
    if name_mode not in ("exporter", "semconv"):
        problems.append(f"OTLP names {name_mode!r}: use exporter or semconv")
    start_mode = start_time or "first_seen"
    if start_mode not in ("first_seen", "unset"):
        problems.append(f"OTLP start time {start_mode!r}: use first_seen or unset")
    for label, number in (("export interval", export_interval_s), ("queue size", max_queue_points),
                          ("batch size", max_batch_points)):
        if number is not None and not number > 0:
            problems.append(f"OTLP {label} must be positive, got {number}")
    if problems:
        raise OtlpConfigError("\n".join(sorted(problems)))

    defaults = OtlpConfig(endpoint="")
    return OtlpConfig(
        endpoint=url,
        protocol="grpc" if proto == "grpc" else "http/protobuf",
        headers=pairs,
        timeout_s=timeout if timeout is not None else defaults.timeout_s,
        compression="gzip" if comp == "gzip" else "none",
        insecure=grpc_insecure,
        certificate=pick(certificate, "CERTIFICATE"),
        client_certificate=pick(client_certificate, "CLIENT_CERTIFICATE"),
        client_key=pick(client_key, "CLIENT_KEY"),
        export_interval_s=export_interval_s or defaults.export_interval_s,
        max_queue_points=max_queue_points,
        max_batch_points=max_batch_points or defaults.max_batch_points,
        units="ucum" if unit_mode == "ucum" else "none",
        names="semconv" if name_mode == "semconv" else "exporter",
        start_time="unset" if start_mode == "unset" else "first_seen",
    )


def _resolve_endpoint(flag: str | None, env: Mapping[str, str], proto: str) -> str | None:
    if flag:
        return _with_metrics_path(flag.strip(), proto) if proto != "grpc" else flag.strip()
    specific = env.get(f"{_PREFIX}METRICS_ENDPOINT", "").strip()
    if specific:
        return specific  # the spec: used as is
    generic = env.get(f"{_PREFIX}ENDPOINT", "").strip()
    if not generic:
        return None
    if proto == "grpc":
        return generic
    return generic.rstrip("/") + "/v1/metrics"  # the spec: base URL + signal path


def _with_metrics_path(url: str, proto: str) -> str:
    if "://" not in url:
        url = f"http://{url}"
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        return url.rstrip("/") + "/v1/metrics"
    return url


def _grpc_target(url: str, insecure: bool, problems: list[str]) -> tuple[str, bool]:
    if "://" in url:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f"OTLP gRPC endpoint {url!r}: expected host:port or http(s)://host:port")
            return url, insecure
        return parts.netloc, parts.scheme == "http"
    return url, insecure

