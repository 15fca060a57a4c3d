"""Protobuf wire format for OTLP metrics, written by hand: field tags, varints, framing.

Field numbers are opentelemetry-proto's (metrics/v1, common/v1, collector/metrics/v1); tests decode
every byte with the generated classes. Tags are `field << 3 | wire type` (0 varint, 1 64-bit,
2 length-delimited).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping

from bridge import __version__

SCOPE_NAME = "dcgm-bridge"

# Field tags (field number << 3 | wire type); wire types: 1 = 64-bit, 2 = length-delimited, 0 = varint.
T_REQ_RESOURCE_METRICS = 0x0A  # ExportMetricsServiceRequest.resource_metrics = 1
T_RM_RESOURCE, T_RM_SCOPE_METRICS = 0x0A, 0x12  # ResourceMetrics.resource = 1, scope_metrics = 2
T_RESOURCE_ATTR = 0x0A  # Resource.attributes = 1
T_SM_SCOPE, T_SM_METRICS = 0x0A, 0x12  # ScopeMetrics.scope = 1, metrics = 2
T_M_NAME, T_M_DESC, T_M_UNIT = 0x0A, 0x12, 0x1A  # Metric.name = 1, description = 2, unit = 3
T_M_GAUGE, T_M_SUM, T_M_HIST, T_M_SUMMARY, T_M_META = 0x2A, 0x3A, 0x4A, 0x5A, 0x62  # 5, 7, 9, 11, 12
T_DATA_POINTS = 0x0A  # Gauge/Sum/Histogram/Summary.data_points = 1
SUM_MONOTONIC = b"\x18\x01"  # Sum.is_monotonic = 3: true
T_NDP_ATTR = 0x3A  # NumberDataPoint.attributes = 7
T_START, T_TIME, T_DOUBLE = 0x11, 0x19, 0x21  # start_time_unix_nano = 2, time_unix_nano = 3, as_double = 4
NDP_FLAGS_NO_VALUE = b"\x40\x01"  # NumberDataPoint.flags = 8: DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
PACK_GAUGE = struct.Struct("<BQBd").pack
PACK_SUM = struct.Struct("<BQBQBd").pack
GAUGE_FIXED, SUM_FIXED = 18, 27  # bytes after the attributes in a gauge / sum point

def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field_bytes(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (tag already includes wire type 2)."""
    return bytes((tag,)) + varint(len(payload)) + payload


def key_value(key: str, value: str) -> bytes:
    """KeyValue{key = 1, value = 2: AnyValue{string_value = 1}}."""
    return field_bytes(0x0A, key.encode()) + field_bytes(0x12, field_bytes(0x0A, value.encode()))


def attributes(tag: int, items: Iterable[tuple[str, str]]) -> bytes:
    return b"".join(field_bytes(tag, key_value(k, v)) for k, v in items)


def resource_bytes(attrs: Mapping[str, str]) -> bytes:
    """The framed `ResourceMetrics.resource` field."""
    return field_bytes(T_RM_RESOURCE, attributes(T_RESOURCE_ATTR, attrs.items()))


def scope_bytes(name: str = SCOPE_NAME, version: str = __version__) -> bytes:
    """The framed `ScopeMetrics.scope` field: InstrumentationScope{name = 1, version = 2}."""
    return field_bytes(T_SM_SCOPE, field_bytes(0x0A, name.encode()) + field_bytes(0x12, version.encode()))


def request_bytes(chunks: Iterable[bytes | bytearray]) -> bytes:
    """ExportMetricsServiceRequest from framed ResourceMetrics chunks (EncodedPage.chunk)."""
    return b"".join(chunks)


CUMULATIVE = b"\x10\x02"  # Sum/Histogram.aggregation_temporality = 2: AGGREGATION_TEMPORALITY_CUMULATIVE


class Group:
    __slots__ = ("kind", "t", "count", "sum", "buckets")

    def __init__(self, kind: int, t: int) -> None:
        self.kind = kind
        self.t = t
        self.count: float | None = None
        self.sum: float | None = None
        self.buckets: list[tuple[float, float]] = []


def histogram_point(group: Group, start: int) -> bytes:
    """HistogramDataPoint without attributes: le bounds without +Inf, de-cumulated counts."""
    count = group.count or 0.0
    buckets = sorted(b for b in group.buckets if not math.isnan(b[0]))
    bounds = [b for b, _ in buckets if not math.isinf(b)]
    counts: list[int] = []
    previous = 0.0
    for bound, cumulative in buckets:
        if math.isinf(bound):
            break
        counts.append(max(0, int(cumulative - previous)))
        previous = cumulative
    counts.append(max(0, int(count - previous)))  # the +Inf bucket
    # start = 2, time = 3 (fixed64); count = 4 (fixed64); sum = 5 (double)
    body = struct.pack("<BQBQBQ", T_START, start, T_TIME, group.t, 0x21, int(count))
    if group.sum is not None:
        body += struct.pack("<Bd", 0x29, group.sum)
    body += field_bytes(0x32, struct.pack(f"<{len(counts)}Q", *counts))  # bucket_counts = 6, packed
    if bounds:
        body += field_bytes(0x3A, struct.pack(f"<{len(bounds)}d", *bounds))  # explicit_bounds = 7, packed
    return body


def summary_point(group: Group, start: int) -> bytes:
    """SummaryDataPoint without attributes; no _sum → 0 (the spec)."""
    body = struct.pack("<BQBQBQBd", T_START, start, T_TIME, group.t, 0x21, int(group.count or 0),
                       0x29, group.sum or 0.0)
    for quantile, value in sorted(group.buckets):  # quantile_values = 6: ValueAtQuantile{quantile 1, value 2}
        body += field_bytes(0x32, struct.pack("<BdBd", 0x09, quantile, 0x11, value))
    return body
