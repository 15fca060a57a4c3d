"""`--gpu-telemetry` items → endpoint URLs; display keys (credential redaction: redact.py).

AIPerf's rules (`_normalize_dcgm_url` in ai-dynamo/aiperf `src/aiperf/gpu_telemetry/manager.py`) with its
bugs fixed: a query string survives `/metrics` being appended, and userinfo never reaches a display key,
a log line or a file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from bridge.errors import ConfigError
from bridge.redact import netloc_without_userinfo

DEFAULT_ENDPOINTS = ("http://localhost:9400/metrics", "http://localhost:9401/metrics")
LOCAL_COLLECTORS = frozenset(["pynvml", "amdsmi"])


def local_source_url(name: str) -> str:
    """A local source's URL, its endpoint id and key (`pynvml://localhost`, as AIPerf names it)."""
    return f"{name}://localhost"
# What to tell a user whose exporter refreshes slower than we scrape (dcgm-exporter's `-c` / collect-interval,
# env DCGM_EXPORTER_INTERVAL, 30000 ms by default: NVIDIA/dcgm-exporter `pkg/cmd/app.go`; DCGM samples the
# watched fields at that interval).
REFRESH_FIX = ("lower dcgm-exporter's collect interval: `-c 100` (or DCGM_EXPORTER_INTERVAL=100), so that DCGM "
               "refreshes faster than the sidecar scrapes")


class TelemetryItemError(ConfigError):
    """A `--gpu-telemetry` item that is none of the accepted forms."""


@dataclass(frozen=True)
class TelemetryItems:
    """What a list of `--gpu-telemetry` items asked for."""

    urls: list[str] = field(default_factory=list)  # normalised, in the user's order, de-duplicated
    discovery: list[str] = field(default_factory=list)  # k8s://namespace/service[:port]
    metrics_files: list[str] = field(default_factory=list)  # custom-metrics CSVs
    dashboard: bool = False
    local: list[str] = field(default_factory=list)  # pynvml, amdsmi: this machine's GPUs (bridge/sources)


def split_items(values: Iterable[str]) -> list[str]:
    """`--gpu-telemetry a b,c` → [a, b, c]: flag values may hold several items each."""
    return [part for value in values for part in re.split(r"[,\s]+", value.strip()) if part]


def expand_telemetry_args(args: Sequence[str], names: Sequence[str] = ("--gpu-telemetry",)) -> list[str]:
    """AIPerf's `--gpu-telemetry a b c` → click's `--gpu-telemetry a --gpu-telemetry b …`.

    The list ends at the next option or at `--` (what follows `--` is a benchmark's command line and is
    left as it is). `--gpu-telemetry` followed directly by another option (or nothing) means "on, with
    the defaults", as in AIPerf, so it is dropped. `--gpu-telemetry=a,b` passes through unchanged.
    """
    out: list[str] = []
    current: str | None = None
    for position, arg in enumerate(args):
        if arg == "--":
            return out + list(args[position:])
        if current is not None and not arg.startswith("-"):
            out += [current, arg]
            continue
        current = arg if arg in names else None
        if current is None:
            out.append(arg)
    return out


def parse_items(values: Iterable[str]) -> TelemetryItems:
    items = TelemetryItems()
    for item in split_items(values):
        lowered = item.lower()
        if lowered == "dashboard":
            items = TelemetryItems(items.urls, items.discovery, items.metrics_files, dashboard=True,
                                   local=items.local)
        elif lowered in LOCAL_COLLECTORS:
            if lowered not in items.local:
                items.local.append(lowered)
        elif lowered.startswith("k8s://"):
            items.discovery.append(item)
        elif lowered.endswith(".csv"):
            items.metrics_files.append(item)
        elif lowered.startswith("http") or ":" in item:
            url = normalize_url(item)
            if url not in items.urls:
                items.urls.append(url)
        else:
            raise TelemetryItemError(
                f"--gpu-telemetry {item!r} is not a DCGM exporter URL, a custom-metrics .csv, "
                "k8s://namespace/service[:port] or a keyword (pynvml, amdsmi, dashboard). Accepted forms: "
                "http://host:9400/metrics, host:9400, metrics.csv, "
                "k8s://gpu-operator/nvidia-dcgm-exporter:9400, pynvml, amdsmi, dashboard"
            )
    return items


def normalize_url(item: str, flag: str = "--gpu-telemetry") -> str:
    """`host:9400` → `http://host:9400/metrics`; `h:9400?x=1` → `http://h:9400/metrics?x=1`.

    A misspelt scheme is refused rather than guessed at: `htp://h` would become `http://htp://h` and
    `http//h` a host named `http` (`flag` names where the item came from, for the message)."""
    url = _checked_scheme(item, flag)
    parts = urlsplit(url)
    if not parts.hostname:
        hint = f" (did you mean localhost{item}?)" if item.startswith(":") else ""
        raise TelemetryItemError(f"{flag} {item!r}: no host in the URL{hint}; expected http://host:9400/metrics "
                                 "or host:9400")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise TelemetryItemError(f"{flag} {item!r}: {exc}; expected http://host:9400/metrics or host:9400") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics"):
        path += "/metrics"
    return urlunsplit(parts._replace(path=path))


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_BROKEN_HTTP = re.compile(r"^https?(:/?|//)(?!/)", re.I)  # http//h, http:/h, https:h/… (not http:9400: a host)


def _checked_scheme(item: str, flag: str) -> str:
    scheme = _SCHEME.match(item)
    if scheme is not None:
        if scheme.group(1).lower() not in ("http", "https"):
            raise TelemetryItemError(f"{flag} {item!r}: unsupported scheme {scheme.group(1)!r}; "
                                     "expected http:// or https:// (or host:9400)")
        return item
    if _BROKEN_HTTP.match(item) and not re.match(r"^https?:\d", item, re.I):
        raise TelemetryItemError(f"{flag} {item!r}: malformed scheme; expected http://host:9400/metrics "
                                 "or host:9400")
    return f"http://{item}"


def candidate_endpoints(user_urls: Sequence[str], defaults: Sequence[str] = DEFAULT_ENDPOINTS) -> list[str]:
    """Defaults first, then the user's URLs, de-duplicated keeping the first position."""
    out: list[str] = []
    for url in [*map(normalize_url, defaults), *user_urls]:
        if url not in out:
            out.append(url)
    return out


def parse_default_endpoints(value: str) -> list[str]:
    """`AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS`: a JSON list or comma-separated URLs."""
    text = value.strip()
    if text.startswith("["):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TelemetryItemError(
                f"AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS is not a valid JSON list: {exc}"
            ) from None
        if not isinstance(loaded, list) or not all(isinstance(x, str) for x in loaded):
            raise TelemetryItemError("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS must be a JSON list of URL strings")
        return [normalize_url(x) for x in loaded]
    return [normalize_url(x) for x in split_items([text])]


def display_key(url: str) -> str:
    """`http://u:p@h:9400/metrics` → `h:9400`; `http://h:9400/custom/metrics` → `h:9400/custom`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):  # a local source (pynvml://localhost) is its own key
        return url
    path = parts.path
    if path.endswith("/metrics"):
        path = path[: -len("/metrics")]
    return netloc_without_userinfo(parts) + path.rstrip("/")


