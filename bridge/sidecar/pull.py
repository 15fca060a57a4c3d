"""The sidecar's pull endpoint: the latest relabelled samples plus `dcgm_bridge_*` health, as text.

For a Prometheus that scrapes pods instead of receiving OTLP. A pure function: the caller (the
sidecar's HTTP server) passes the latest page of each endpoint and its own counters and serves the
bytes as `text/plain; version=0.0.4; charset=utf-8`.

What changes from the exporter's page, on purpose:
- `run_id` and `phase` labels on every sample (`phase="none"` outside a phase), plus the static
  labels, and `dcgm_endpoint="host:port"` naming the exporter the sample came from (several
  endpoints' series could otherwise collide: one sidecar scrapes many exporters). An exporter label
  with one of these names is kept as `exported_<name>`, Prometheus' rule for clashing target labels.
- DCGM blank sentinels (values and label values) are left out, as dcgm-exporter itself does today.
- The relabel rules apply, as for OTLP (bridge/relabel.py).
- Families of several endpoints are merged under one HELP/TYPE (the format allows a family once).
- An OpenMetrics `x_created` sample is left out (a start time, not a value: parse/family.py), and a
  counter's `x_total` is typed `counter` under its own name, as prometheus_client writes text 0.0.4.
No sample timestamps by default, so Prometheus' own staleness handling works as for any target.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.fields import BLANK_VALUES, is_blank_label
from bridge.health import LAST_REFRESH, LAST_REFRESH_HELP, REFRESH_PERIOD, REFRESH_PERIOD_HELP
from bridge.parse import AnyPage, family_of
from bridge.relabel import NO_RELABEL, RelabelConfig, relabel

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class LatestPage:
    endpoint: str  # display key, host:port
    page: AnyPage
    run_id: str
    phase: str  # "none" outside a phase
    ts_ns: int = 0  # scrape start; written only with timestamps=True


@dataclass(frozen=True)
class EndpointHealth:
    endpoint: str
    scrapes: int = 0
    last_duration_s: float | None = None
    errors: Mapping[str, int] = field(default_factory=dict)  # ScrapeFailure.kind -> count
    refresh_period_s: float | None = None  # how often the exporter's values change (health.RefreshWatch)
    last_refresh_ns: int | None = None  # when a scrape first saw its latest values


@dataclass(frozen=True)
class BridgeHealth:
    endpoints: Sequence[EndpointHealth] = ()
    records_written: int = 0
    otlp: Mapping[str, Any] | None = None  # ExportStats.as_dict(); None when OTLP export is off


def render_exposition(
    latest: Iterable[LatestPage],
    health: BridgeHealth,
    *,
    relabel_config: RelabelConfig = NO_RELABEL,
    static_labels: Mapping[str, str] | None = None,
    endpoint_label: str | None = "dcgm_endpoint",
    timestamps: bool = False,
) -> bytes:
    """Prometheus text 0.0.4 of every endpoint's latest page followed by the bridge's own metrics."""
    families: dict[str, _Family] = {}
    for item in latest:
        extra = {"run_id": item.run_id, "phase": item.phase or "none", **(static_labels or {})}
        if endpoint_label:
            extra[endpoint_label] = item.endpoint
        suffix = f" {item.ts_ns // 1_000_000}" if timestamps else ""
        types, helps = item.page.types, item.page.helps
        for name, labels, value, _ in item.page.samples:
            if value in BLANK_VALUES:
                continue
            result = relabel(relabel_config, name, labels)
            if result is None:
                continue
            out_name, out_labels = result
            family = family_of(out_name, types)
            if family.suffix == "_created":
                continue  # OpenMetrics metadata (a start time): text 0.0.4 has no place for it
            family_name, type_ = family.name, family.type
            if family.suffix and type_ not in ("histogram", "summary"):
                # text 0.0.4 names a family after its sample (`x_total` of counter `x`, as prometheus_client)
                family_name, type_ = out_name, type_ if (type_, family.suffix) == ("counter", "_total") else "untyped"
            fam = families.get(family_name)
            if fam is None:
                fam = families[family_name] = _Family(type_, helps.get(family.name, ""))
            fam.lines.append(f"{out_name}{_labels(out_labels, extra)} {_value(value)}{suffix}")
    out: list[str] = []
    for name, fam in families.items():
        if fam.help:
            out.append(f"# HELP {name} {_escape_help(fam.help)}")
        out.append(f"# TYPE {name} {fam.type}")
        out += fam.lines
    out += _health_lines(health)
    return ("\n".join(out) + "\n").encode()


class _Family:
    __slots__ = ("type", "help", "lines")

    def __init__(self, type_: str, help_text: str) -> None:
        self.type = type_ if type_ in ("gauge", "counter", "histogram", "summary", "untyped") else "untyped"
        self.help = help_text
        self.lines: list[str] = []


def _labels(labels: Mapping[str, str], extra: Mapping[str, str]) -> str:
    parts = [
        f'{"exported_" + k if k in extra else k}="{_escape(v)}"'
        for k, v in labels.items()
        if not is_blank_label(v)
    ]
    parts += [f'{k}="{_escape(v)}"' for k, v in extra.items()]
    return "{" + ",".join(parts) + "}"


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _health_lines(health: BridgeHealth) -> list[str]:
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> None:
        rows = [f"{name}{labels} {_value(float(v))}" for labels, v in samples]
        if rows:
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *rows])

    eps = health.endpoints

    def per_endpoint(e: EndpointHealth, **more: str) -> str:
        return _labels({}, {"endpoint": e.endpoint, **more})

    family("dcgm_bridge_scrapes_total", "counter", "Scrapes attempted per DCGM endpoint.",
           [(per_endpoint(e), e.scrapes) for e in eps])
    family("dcgm_bridge_scrape_duration_seconds", "gauge", "Duration of the last scrape per DCGM endpoint.",
           [(per_endpoint(e), e.last_duration_s) for e in eps if e.last_duration_s is not None])
    family("dcgm_bridge_scrape_errors_total", "counter", "Failed scrapes per DCGM endpoint and failure kind.",
           [(per_endpoint(e, kind=k), n) for e in eps for k, n in sorted(e.errors.items())])
    family(REFRESH_PERIOD, "gauge", REFRESH_PERIOD_HELP,
           [(per_endpoint(e), e.refresh_period_s) for e in eps if e.refresh_period_s is not None])
    family(LAST_REFRESH, "gauge", LAST_REFRESH_HELP,
           [(per_endpoint(e), e.last_refresh_ns / 1e9) for e in eps if e.last_refresh_ns is not None])
    family("dcgm_bridge_records_written_total", "counter", "GPU records written to the record log.",
           [("", health.records_written)])
    otlp = health.otlp
    if otlp is not None:
        family("dcgm_bridge_otlp_queue_depth_points", "gauge", "OTLP points waiting or in flight.",
               [("", otlp.get("queue_depth_points", 0))])
        for key, help_text in (
            ("sent_points", "OTLP points accepted by the receiver."),
            ("sent_requests", "OTLP export requests accepted by the receiver."),
            ("retried_requests", "OTLP export attempts that failed retryably and were retried."),
            ("dropped_points", "OTLP points dropped because the queue was full."),
            ("rejected_points", "OTLP points the receiver rejected."),
        ):
            family(f"dcgm_bridge_otlp_{key}_total", "counter", help_text, [("", otlp.get(key, 0))])
    return lines
