"""`report --prometheus URL --run-id ID`: rebuild the records of a run from a PromQL store.

The store holds the forwarded samples (OTLP into VictoriaMetrics, or Prometheus scraping the pull
endpoint) with `run_id`/`phase` labels; each (endpoint, timestamp) group is one scrape, which the same
normaliser turns into the same GpuRecords the record log holds — at the store's millisecond precision.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType

from bridge.fields import FieldTable
from bridge.normalize import Normalizer
from bridge.report.promql import QueryClient, fetch_run_samples
from bridge.samples import GpuRecord, ParsedPage


def records_from_store(client: QueryClient | str, run_id: str, start_ns: int, end_ns: int, table: FieldTable,
                       *, strip_suffix: str | None = None, extra_matchers: str = "") -> Iterator[GpuRecord]:
    normalizer = Normalizer(table)
    for group in fetch_run_samples(client, run_id, start_ns, end_ns, strip_suffix=strip_suffix,
                                   extra_matchers=extra_matchers):
        endpoint = group.endpoint or "unknown"
        page = ParsedPage(group.samples, MappingProxyType({}), MappingProxyType({}), [])
        phase = next((s.labels.get("phase") for s in group.samples if s.labels.get("phase")), None)
        yield from normalizer.records(page, source_url=f"http://{endpoint}/metrics",
                                      timestamp_ns=group.timestamp_ns, run_id=run_id,
                                      phase=None if phase == "none" else phase)
