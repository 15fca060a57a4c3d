"""A run's raw samples back from a PromQL store (VictoriaMetrics, Prometheus, Mimir), as `Sample`s.

The report-from-the-store path (`dcgm-bridge report --prometheus URL --run-id ID ...`) rebuilds
telemetry from what the sidecar forwarded. This module only fetches: every series with
`run_id="<ID>"` between two times, as raw samples (a range selector in an instant query returns the
stored points, not an evaluation grid), grouped per endpoint and scrape time the way the sidecar
wrote them (every sample of one scrape carries the scrape's start time).

Long runs are fetched in windows (`chunk_s`) so no single answer grows past a store's limits; points
on a window boundary are de-duplicated. Stores keep milliseconds, so `timestamp_ns` is a multiple of
1e6. Names come back as stored: a Prometheus OTLP receiver appends `_total` to counters
(DECISIONS.md "PromQL names per backend"); `strip_suffix="_total"` undoes that for names that did not have it.
VictoriaMetrics hides the last 30 s from queries unless started with `-search.latencyOffset=0s`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from bridge.samples import Sample

# Where the endpoint (host:port) lands, per store: VictoriaMetrics keeps resource attributes as labels
# (dotted, or sanitised with -opentelemetry.usePrometheusNaming); Prometheus makes it `instance`; the
# pull endpoint writes `dcgm_endpoint`.
ENDPOINT_LABELS = ("service.instance.id", "service_instance_id", "dcgm_endpoint", "instance")


class ScrapeSamples(NamedTuple):
    endpoint: str | None
    timestamp_ns: int
    samples: list[Sample]


class QueryClient(Protocol):
    """What is used of prometheus_api_client.PrometheusConnect (tests inject a fake)."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...


def connect(url: str, *, headers: Mapping[str, str] | None = None, verify_tls: bool = True) -> QueryClient:
    from prometheus_api_client import PrometheusConnect  # lazily: pulls in requests and dateparser

    client: QueryClient = PrometheusConnect(url=url, headers=dict(headers or {}), disable_ssl=not verify_tls)
    return client


def run_selector(run_id: str, extra_matchers: str = "") -> str:
    escaped = run_id.replace("\\", "\\\\").replace('"', '\\"')
    extra = f",{extra_matchers}" if extra_matchers else ""
    return f'{{run_id="{escaped}"{extra}}}'


def fetch_run_samples(
    client: QueryClient | str,
    run_id: str,
    start_ns: int,
    end_ns: int,
    *,
    chunk_s: float = 3600.0,
    extra_matchers: str = "",
    endpoint_labels: Iterable[str] = ENDPOINT_LABELS,
    strip_suffix: str | None = None,
) -> list[ScrapeSamples]:
    """Every stored sample of `run_id` with start_ns <= t <= end_ns, per (endpoint, time), in time order."""
    if isinstance(client, str):
        client = connect(client)
    if end_ns < start_ns:
        return []
    selector = run_selector(run_id, extra_matchers)
    endpoint_keys = tuple(endpoint_labels)
    start_ms, end_ms = start_ns // 1_000_000, -(-end_ns // 1_000_000)
    step_ms = max(1, int(chunk_s * 1000))
    seen: set[tuple[int, int]] = set()
    series_ids: dict[tuple[tuple[str, str], ...], int] = {}
    series_info: list[tuple[str, Mapping[str, str], str | None]] = []
    groups: dict[tuple[str | None, int], list[Sample]] = {}
    window_end = end_ms
    while True:
        window_start = max(start_ms, window_end - step_ms)
        # (t - range, t]: one extra millisecond reaches a point exactly at window_start.
        query = f"{selector}[{window_end - window_start + 1}ms]"
        for result in client.custom_query(query, params={"time": f"{window_end / 1000:.3f}"}) or []:
            metric = result.get("metric", {})
            key = tuple(sorted(metric.items()))
            index = series_ids.get(key)
            if index is None:
                index = series_ids[key] = len(series_info)
                series_info.append(_series(metric, endpoint_keys, strip_suffix))
            name, labels, endpoint = series_info[index]
            for ts, text in result.get("values", []):
                ts_ms = round(float(ts) * 1000)
                if not start_ms <= ts_ms <= end_ms or (index, ts_ms) in seen:
                    continue
                seen.add((index, ts_ms))
                value = float(text)
                if math.isnan(value):
                    continue  # a staleness marker or a NaN: no sample
                groups.setdefault((endpoint, ts_ms), []).append(Sample(name, labels, value, ts_ms))
        if window_start <= start_ms:
            break
        window_end = window_start - 1
    return [
        ScrapeSamples(endpoint, ts_ms * 1_000_000, samples)
        for (endpoint, ts_ms), samples in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0] or ""))
    ]


def _series(
    metric: Mapping[str, str], endpoint_keys: tuple[str, ...], strip_suffix: str | None
) -> tuple[str, Mapping[str, str], str | None]:
    name = metric.get("__name__", "")
    if strip_suffix and name.endswith(strip_suffix):
        name = name[: -len(strip_suffix)]
    labels = MappingProxyType({k: v for k, v in metric.items() if k != "__name__"})
    endpoint = next((metric[k] for k in endpoint_keys if metric.get(k)), None)
    return name, labels, endpoint
