"""ParsedPage → OTLP protobuf wire bytes, written directly (no message objects on the hot path).

Every family of a page is forwarded (DECISIONS.md "OTLP forwarding" has the table):
- gauge, unknown, untyped, no TYPE → Gauge (untyped also gets `metadata["prometheus.type"]`);
- counter → cumulative monotonic Sum with a start time (starttime.py), except the code-valued
  `…XID_ERRORS` and the windowed `DCGM_EXP_*_COUNT` (they go down: windowed counts, NVIDIA/dcgm-exporter
  `internal/pkg/collector/expcollector.go`) → Gauge;
- info, stateset → cumulative non-monotonic Sum; histogram, summary → Histogram, Summary;
  gaugehistogram → not forwarded (the spec drops it).
Names are written exactly as the exporter wrote them, unit "" unless `units="ucum"`; HELP becomes
the description. Data-point attributes are the exporter's labels (empty and DCGM sentinel values
dropped, relabelled), then `run_id`, `phase` and the static attributes; an exporter label with one of
those names is kept as `exported_<name>` (Prometheus' rule for clashing target labels).
Sentinel values are not sent; a series that vanishes gets one NoRecordedValue point.

Why bytes by hand: a data point is `attributes + start + time + value`; the attribute bytes of a
series never change between scrapes, so each series caches `tag + length + attributes` and a point
costs one `struct.pack` of its times and value (bench/bench_otlp.py compares it with the SDK's path).
An ExportMetricsServiceRequest is a repeated field 1, so encoded ResourceMetrics chunks of several
pages concatenate into one request. tests/otlp decode everything with opentelemetry-proto.

Faster still: a page that follows its endpoint's template is filled into the previous page's plan
(plan.py); `_compile` below builds that plan from the loop's own encoding of a clean page.
"""

from __future__ import annotations

import re
import struct
from array import array
from collections.abc import Mapping

from bridge.digest import blake2b
from bridge.fields import BLANK_VALUES, is_blank_label
from bridge.otlp.plan import PACK_START, POOL_SIZE, PagePlan
from bridge.otlp.points import BufferPool
from bridge.otlp.points import ContextCache as ContextCache
from bridge.otlp.points import EncodedPage as EncodedPage
from bridge.otlp.points import PointContext as PointContext
from bridge.otlp.semconv import UNITS as SEMCONV_UNITS
from bridge.otlp.starttime import ROUTE_ALIAS, ROUTE_DROP, ROUTE_RENAMED, Series, SeriesTable, StartTimeMode
from bridge.otlp.wire import (
    CUMULATIVE,
    GAUGE_FIXED,
    NDP_FLAGS_NO_VALUE,
    PACK_GAUGE,
    PACK_SUM,
    SUM_FIXED,
    SUM_MONOTONIC,
    T_DATA_POINTS,
    T_M_DESC,
    T_M_GAUGE,
    T_M_HIST,
    T_M_META,
    T_M_NAME,
    T_M_SUM,
    T_M_SUMMARY,
    T_M_UNIT,
    T_NDP_ATTR,
    T_REQ_RESOURCE_METRICS,
    T_RM_SCOPE_METRICS,
    T_SM_METRICS,
    T_START,
    T_TIME,
    Group,
    attributes,
    field_bytes,
    histogram_point,
    key_value,
    resource_bytes,
    scope_bytes,
    summary_point,
    varint,
)
from bridge.parse import AnyPage, TemplatedPage, family_of
from bridge.relabel import NO_RELABEL, RelabelConfig, relabel

# Family kinds: the scalar ones (a kind <= SUM) are points of their own.
GAUGE, MONOTONIC_SUM, SUM, HISTOGRAM, SUMMARY, SKIP = range(6)
_SCALAR = (GAUGE, MONOTONIC_SUM, SUM)
# A point's time is a fixed64 of nanoseconds (opentelemetry-proto metrics.proto, `time_unix_nano`): a sample's own
# millisecond timestamp past it (year 2554; the text format allows any int64) cannot be sent, like a point out of
# order. The struct packing would otherwise raise and lose the whole batch.
MAX_TIME_NS = 2**64 - 1

_NO_SUFFIX_CODES = re.compile(r"(XID_ERRORS|^DCGM_EXP_.*_COUNT)$", re.IGNORECASE)
_HELP_UNIT = re.compile(r"\(in ([^)]+)\)")
# dcgm-exporter's HELP units (default-counters.csv "(in X)") → UCUM.
UCUM = {
    "C": "Cel", "W": "W", "mJ": "mJ", "J": "J", "MHz": "MHz", "%": "%", "MiB": "MiBy", "MB": "MBy",
    "B": "By", "bytes": "By", "ns": "ns", "us": "us", "ms": "ms", "s": "s", "MB/s": "MBy/s",
}
# DCGM 4.7 names (dcgm-exporter 4.9+) carry their unit in the name (NVIDIA/go-dcgm dcgm_fields.h): it wins
# over the HELP text, which 4.9 pages still word as before. Longest suffix first.
UCUM_BY_NAME_SUFFIX = (("_BYTES_PER_SECOND", "By/s"), ("_JOULES_TOTAL", "J"), ("_HERTZ", "Hz"), ("_RATIO", "1"),
                       ("_WATTS", "W"), ("_CELSIUS", "Cel"), ("_BYTES", "By"))



class _Hole(bytearray):
    """A point's placeholder while a plan is compiled (`_compile`): as long as the point's tail, so the framing
    measures it as the point, and knowing which sample and series fill it."""

    def __init__(self, size: int, slot: tuple[int, int, Series]) -> None:
        super().__init__(size)
        self.slot = slot  # (sample position, kind, series)


class _Family:
    """One metric of the page being encoded."""

    __slots__ = ("name", "kind", "series", "points", "family")

    def __init__(self, name: str, kind: int, series: dict[int, Series], family: str | None = None) -> None:
        self.name = name
        self.kind = kind
        self.series = series
        self.points: list[bytes] = []
        self.family = family or name  # the TYPE/HELP name (`x` for `x_bucket`)


def family_kind(name: str, types: Mapping[str, str]) -> tuple[int, str]:
    """(kind, family name) of a sample name (parse.family_of): `X_bucket` of a histogram X belongs to X."""
    family, declared, suffix = family_of(name, types)
    if suffix == "_created":
        return SKIP, family  # OpenMetrics metadata of its family (a start time), not a sample
    if declared == "counter":
        return (GAUGE if _NO_SUFFIX_CODES.search(name) else MONOTONIC_SUM), family
    if declared in ("info", "stateset"):
        return SUM, family
    if declared == "histogram":
        return HISTOGRAM, family
    if declared == "summary":
        return SUMMARY, family
    if declared == "gaugehistogram":
        return SKIP, family
    return GAUGE, family  # gauge, unknown, untyped, none


class EndpointEncoder:
    """Encodes the pages of one endpoint and holds its series state. Not thread-safe: one caller."""

    def __init__(
        self,
        resource: Mapping[str, str],
        *,
        relabel_config: RelabelConfig = NO_RELABEL,
        units: str = "none",
        start_time: StartTimeMode = "first_seen",
        buffers: BufferPool | None = None,
    ) -> None:
        self.table = SeriesTable()
        self.relabel = relabel_config
        self.units = units
        self.start_mode: StartTimeMode = start_time
        self._head = resource_bytes(resource) + bytes((T_RM_SCOPE_METRICS,))
        self._scope = scope_bytes()
        self._meta: dict[tuple[str, int, str], bytes] = {}  # Metric name, description, unit, metadata
        self._labels: dict[tuple[frozenset[tuple[str, str]], frozenset[str]], bytes] = {}  # (labels, ctx keys) -> bytes
        self._complex: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}
        self._heads: dict[str, bytes] = {}  # name -> its last Metric head
        self._kinds: dict[str, int] = {}  # as last seen: a vanished family keeps its type
        self._kind_of: dict[tuple[str, str | None], tuple[int, str]] = {}  # (name, TYPE) -> (kind, family)
        self._plan: PagePlan | None = None
        # Its plans' chunk buffers (plan.py), lent to the pages they fill: its own, or the forwarder's shared pool.
        self.buffers = buffers if buffers is not None else BufferPool(POOL_SIZE)
        self.use_plans = True  # False: every page through the loop (tests compare the two)

    def encode(self, page: AnyPage, ctx: PointContext, ts_ns: int) -> EncodedPage:
        """One page scraped at `ts_ns` (samples without their own timestamp get it).

        A page its plan fills may come in a buffer of `buffers`, lent to it: call `release()` on the result once
        its chunk is sent or dropped (points.py). Until then no later page is written into that buffer."""
        templated = page if isinstance(page, TemplatedPage) else None
        plan = self._plan
        if plan is not None:
            if templated is not None and plan.template is templated.template and plan.ctx is ctx \
                    and ts_ns > plan.last_t:
                fast = plan.fill(templated, ts_ns, self.table, self.start_mode)
                if fast is not None:
                    return fast
            plan.write_back()
            self._plan = None
        encoded = self._encode_loop(page, ctx, ts_ns)
        if (templated is not None and self.use_plans and encoded.chunk and not encoded.stale
                and not encoded.out_of_order):
            self._plan = self._compile(templated, ctx, ts_ns)
            if self._plan is not None:
                # The plan's frame holds its series' prefixes: kept twice they were ~6 MiB at 64 endpoints. The
                # loop builds a series' prefix again when a page leaves the plan (`_encode_loop`).
                for series in self._plan.series:
                    series.prefix = b""
        return encoded

    def _encode_loop(self, page: AnyPage, ctx: PointContext, ts_ns: int) -> EncodedPage:
        table = self.table
        gen = table.begin_page()
        types = page.types
        families: dict[str, _Family] = {}
        complex_samples: list[tuple[int, str, Mapping[str, str], float, int]] = []
        blank_values = BLANK_VALUES
        pack_gauge, pack_sum, mode = PACK_GAUGE, PACK_SUM, self.start_mode
        blank = out_of_order = dropped = ended = 0
        prev_name: str | None = None
        kind = skip = SKIP
        last_scalar = SUM  # (locals: the loop below compares them per point)
        smap: dict[int, Series] = {}
        out: list[bytes] = []
        append = out.append
        target: list[bytes] | None
        # The hot loop: per point a dict lookup, a few attribute reads, one struct.pack, two appends.
        for name, labels, value, ts_ms in page.samples:
            if name != prev_name:
                prev_name = name
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = self._new_family(name, types)
                kind, smap, out = fam.kind, fam.series, fam.points
                append = out.append
            if value in blank_values:
                blank += 1
                continue
            if kind > last_scalar:  # histogram, summary, skip
                if kind != skip:
                    t = ts_ns if ts_ms is None else ts_ms * 1_000_000
                    complex_samples.append((kind, name, labels, value, t))
                continue
            series = smap.get(id(labels))  # (by id: each entry holds its labels, starttime.py says why)
            if series is None or series.labels is not labels:
                series = self._new_series(smap, name, labels)
            target = None
            if series.route:  # not ROUTE_SEND
                if series.route == ROUTE_ALIAS:
                    series = series.canonical
                if series.route == ROUTE_DROP:
                    dropped += 1
                    continue
                if series.route == ROUTE_RENAMED:
                    target = self._family_of(families, series.out_name, kind).points
            series.seen = gen  # present on the page (even if its point is not sent): not stale
            t = ts_ns if ts_ms is None else ts_ms * 1_000_000
            if t <= series.last_ts or t > MAX_TIME_NS:
                out_of_order += 1
                continue
            if series.ctx is not ctx:  # first point, or a new phase / run: new attributes
                old = series.ctx
                if isinstance(old, PointContext) and series.last_ts and old.items != ctx.items:
                    # The series under the old run_id/phase ends here: one staleness marker for it.
                    self._marker(series, old, t, kind, out if target is None else target)
                    ended += 1
                self._build_prefix(series, ctx, kind)
            elif not series.prefix or series.kind != kind:  # a plan held it, or the family's TYPE changed
                self._build_prefix(series, ctx, kind)
            if kind:  # a Sum: start time, time, value
                packed = pack_sum(0x11, series.start_for(value, t, mode), 0x19, t, 0x21, value)
            else:  # a Gauge: time (0x19), value (0x21)
                packed = pack_gauge(0x19, t, 0x21, value)
            series.last_ts = t
            if target is None:
                append(series.prefix)
                append(packed)
            else:
                target.append(series.prefix)
                target.append(packed)
        stale = self._stale_points(families, ctx, ts_ns) + ended
        points = 0
        pieces: list[bytes] = []  # joined once: no copy of the points per nesting level
        size = 0
        for fam in families.values():
            if fam.points:
                points += len(fam.points) >> 1
                size += self._metric_pieces(fam, page, pieces)
        if complex_samples:
            extra, n_extra = self._complex_metrics(complex_samples, ctx, page, gen)
            for metric in extra:
                pieces.append(metric)
                size += len(metric)
            points += n_extra
        table.evict_stale(keep=max(4096, 4 * len(page.samples)))
        if len(self._labels) > max(4096, 4 * table.size):
            self._labels.clear()
        if not pieces:
            return EncodedPage(b"", 0, 0, blank, out_of_order, dropped)
        chunk = b"".join(self._framed(pieces, size))
        return EncodedPage(chunk, points, stale, blank, out_of_order, dropped)

    def _framed(self, pieces: list[bytes], size: int) -> list[bytes]:
        """ResourceMetrics framing around the metrics' pieces (`size`: their total length)."""
        scope_len = len(self._scope) + size
        body_len = len(self._head) + len(varint(scope_len)) + scope_len
        head = bytes((T_REQ_RESOURCE_METRICS,)) + varint(body_len) + self._head
        return [head, varint(scope_len), self._scope, *pieces]

    def _compile(self, page: TemplatedPage, ctx: PointContext, ts_ns: int) -> PagePlan | None:
        """The plan of a page the loop has just encoded cleanly: its own bytes with holes for the points.

        Walks the page as the loop did (same families, routes and order), with placeholder points of the
        same size, through the same framing code; the runs between placeholders are the constants.
        """
        template = page.template
        plan = PagePlan(template, ctx, self.buffers)
        families: dict[str, _Family] = {}
        blanks: list[int] = []
        prev_name: str | None = None
        kind = SKIP
        smap: dict[int, Series] = {}
        out: list[bytes] = []
        for position, (name, labels, value) in enumerate(zip(template.names, template.labels, page.values,
                                                            strict=True)):
            if name != prev_name:
                prev_name = name
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = self._new_family(name, page.types)
                kind, smap, out = fam.kind, fam.series, fam.points
            if value in BLANK_VALUES:
                blanks.append(position)
                continue
            if kind > SUM:  # histogram, summary, skip
                if kind != SKIP:
                    return None  # histograms and summaries take the loop
                continue
            series = smap.get(id(labels))
            if series is None or series.labels is not labels:
                return None
            target = out
            if series.route:
                if series.route == ROUTE_ALIAS:
                    series = series.canonical
                if series.route == ROUTE_DROP:
                    plan.dropped += 1
                    continue
                if series.route == ROUTE_RENAMED:
                    target = self._family_of(families, series.out_name, kind).points
            if series.ctx is not ctx or series.last_ts != ts_ns or series.kind != kind:
                return None
            target.append(series.prefix)
            target.append(_Hole(SUM_FIXED if kind else GAUGE_FIXED, (position, kind, series)))  # type: ignore[arg-type]
        pieces: list[bytes] = []
        size = 0
        for fam in families.values():
            if fam.points:
                size += self._metric_pieces(fam, page, pieces)
        constants: list[bytes] = []
        slots: list[tuple[int, int, Series]] = []
        run = bytearray()
        for piece in self._framed(pieces, size):
            if not isinstance(piece, _Hole):
                run += piece
            else:
                slot = piece.slot
                if slot[1]:  # a sum: its start time is part of the constant before the time
                    run += PACK_START(0x11, slot[2].start)
                constants.append(bytes(run))
                run = bytearray()
                slots.append(slot)
        constants.append(bytes(run))
        start_len = len(PACK_START(0x11, 0))
        plan.value_at = tuple(slot[0] for slot in slots)
        plan.sum_slots = [k for k, slot in enumerate(slots) if slot[1]]
        plan.sum_at = tuple(slots[k][0] for k in plan.sum_slots)
        plan.sum_heads = [constants[k][:-start_len] for k in plan.sum_slots]
        plan.series = [slot[2] for slot in slots]
        plan.sum_series = [slots[k][2] for k in plan.sum_slots]
        plan.starts = [series.start for series in plan.sum_series]
        plan.last_sum = array("d", [series.last_value for series in plan.sum_series]).tobytes()
        plan.blank_at = tuple(blanks)
        plan.lay_out(constants)
        plan.last_t = ts_ns
        plan.generation = self.table.generation
        plan.points = len(slots)
        return plan

    # -- once per series (and again at a phase boundary) ----------------------------------------
    def _new_series(self, smap: dict[int, Series], name: str, labels: Mapping[str, str]) -> Series:
        series = Series(name, labels, relabel(self.relabel, name, labels))
        return self.table.add(smap, series, _identity(series.out_name, series.out_labels))

    def _build_prefix(self, series: Series, ctx: PointContext, kind: int) -> None:
        attrs = self._label_bytes(series.out_labels, ctx) + ctx.attr_bytes
        fixed = GAUGE_FIXED if kind == GAUGE else SUM_FIXED
        series.prefix = bytes((T_DATA_POINTS,)) + varint(len(attrs) + fixed) + attrs
        series.ctx = ctx
        series.kind = kind

    def _label_bytes(self, labels: Mapping[str, str], ctx: PointContext, tag: int = T_NDP_ATTR) -> bytes:
        """Attribute bytes of exporter labels; cached per label set (by value), which every family of a GPU shares."""
        key = (frozenset(labels.items()), ctx.keys)
        cached = self._labels.get(key) if tag == T_NDP_ATTR else None
        if cached is not None:
            return cached
        data = attributes(tag, _attribute_items(labels, ctx.keys))
        if tag == T_NDP_ATTR:
            self._labels[key] = data
        return data

    def _new_family(self, name: str, types: Mapping[str, str]) -> _Family:
        declared = types.get(name)
        key = (name, declared)
        found = self._kind_of.get(key)
        if found is None:
            if len(self._kind_of) > 4096:
                self._kind_of.clear()
            found = self._kind_of[key] = family_kind(name, types)
        self._kinds[name] = found[0]
        return _Family(name, found[0], self.table.family(name), found[1])

    def _family_of(
        self, families: dict[str, _Family], name: str, kind: int, family: str | None = None
    ) -> _Family:
        fam = families.get(name)
        if fam is None:
            fam = families[name] = _Family(name, kind, self.table.family(name), family)
        return fam

    # -- staleness ------------------------------------------------------------------------------
    def _stale_points(self, families: dict[str, _Family], ctx: PointContext, ts_ns: int) -> int:
        count = 0
        for series in self.table.vanished():
            if ts_ns <= series.last_ts:
                continue
            fam = self._family_of(families, series.out_name, self._kinds.get(series.name, GAUGE))
            # Under the attributes of its last point: a marker under the new phase would mark nothing. Stores keep
            # one sample per series and millisecond (Prometheus, VictoriaMetrics: the later one wins), so a marker
            # in the millisecond of the last point (a completion right after the final scrape) would replace that
            # point: it goes in the next millisecond then.
            last_ctx = series.ctx if isinstance(series.ctx, PointContext) else ctx
            at = max(ts_ns, (series.last_ts // 1_000_000 + 1) * 1_000_000)
            self._marker(series, last_ctx, at, fam.kind, fam.points)
            series.last_ts = at
            count += 1
        return count

    def _marker(self, series: Series, ctx: PointContext, ts_ns: int, kind: int, out: list[bytes]) -> None:
        """A NumberDataPoint with the NoRecordedValue flag and no value (Prometheus: a StaleNaN)."""
        body = self._label_bytes(series.out_labels, ctx) + ctx.attr_bytes
        if kind != GAUGE:
            body += struct.pack("<BQ", T_START, series.start)
        body += struct.pack("<BQ", T_TIME, ts_ns) + NDP_FLAGS_NO_VALUE
        out.append(bytes((T_DATA_POINTS,)) + varint(len(body)))
        out.append(body)

    # -- metric framing -------------------------------------------------------------------------
    def _metric_head(self, name: str, kind: int, page: AnyPage, family: str) -> bytes:
        if family not in page.types and name in self._heads:
            return self._heads[name]  # only staleness markers left: describe it as when it was there
        help_text = page.helps.get(family, "")
        key = (name, kind, help_text)
        head = self._meta.get(key)
        if head is None:
            head = field_bytes(T_M_NAME, name.encode())
            if help_text:
                head += field_bytes(T_M_DESC, help_text.encode())
            unit = self._unit(family, help_text)
            if unit:
                head += field_bytes(T_M_UNIT, unit.encode())
            if page.types.get(family, "unknown") in ("unknown", "untyped"):
                # The spec keeps the Prometheus type of an unknown-typed family in the metadata.
                head += field_bytes(T_M_META, key_value("prometheus.type", "unknown"))
            if len(self._meta) > 4096:
                self._meta.clear()
                self._heads.clear()
            self._meta[key] = head
        self._heads[name] = head
        return head

    def _unit(self, family: str, help_text: str) -> str:
        if family in SEMCONV_UNITS:  # `--otlp-names semconv`: the conventions' units, whatever `units` says
            return SEMCONV_UNITS[family]
        if self.units != "ucum":
            return ""
        for suffix, unit in UCUM_BY_NAME_SUFFIX:  # a DCGM 4.7 name says its unit (dcgm_fields.h)
            if family.endswith(suffix):
                return unit
        match = _HELP_UNIT.search(help_text)
        return UCUM.get(match.group(1).strip(), "") if match else ""

    def _metric_pieces(self, fam: _Family, page: AnyPage, pieces: list[bytes]) -> int:
        """Append a framed Metric as pieces (its data points by reference); return its framed size."""
        kind = fam.kind
        data_len = sum(map(len, fam.points))
        if kind == GAUGE:
            tag, trailer = T_M_GAUGE, b""
        elif kind == MONOTONIC_SUM:
            tag, trailer = T_M_SUM, CUMULATIVE + SUM_MONOTONIC
        elif kind == SUM:
            tag, trailer = T_M_SUM, CUMULATIVE
        elif kind == HISTOGRAM:
            tag, trailer = T_M_HIST, CUMULATIVE
        else:
            tag, trailer = T_M_SUMMARY, b""
        data_len += len(trailer)
        head = self._metric_head(fam.name, kind, page, fam.family) + bytes((tag,)) + varint(data_len)
        metric_len = len(head) + data_len
        framing = bytes((T_SM_METRICS,)) + varint(metric_len) + head
        pieces.append(framing)
        pieces += fam.points
        if trailer:
            pieces.append(trailer)
        return len(framing) + data_len

    def _metric(self, fam: _Family, page: AnyPage) -> bytes:
        pieces: list[bytes] = []
        self._metric_pieces(fam, page, pieces)
        return b"".join(pieces)

    # -- histograms and summaries: the spec's mapping; dcgm-exporter writes none, so a slow path ----
    def _complex_metrics(
        self,
        samples: list[tuple[int, str, Mapping[str, str], float, int]],
        ctx: PointContext,
        page: AnyPage,
        gen: int,
    ) -> tuple[list[bytes], int]:
        groups: dict[tuple[str, tuple[tuple[str, str], ...]], Group] = {}
        for kind, name, labels, value, t in samples:
            family = family_kind(name, page.types)[1]
            rest = tuple((k, v) for k, v in labels.items() if k not in ("le", "quantile"))
            group = groups.get((family, rest))
            if group is None:
                group = groups[(family, rest)] = Group(kind, t)
            suffix = name[len(family):]
            if suffix == "_count":
                group.count = value
            elif suffix == "_sum":
                group.sum = value
            else:
                bound = labels.get("le" if kind == HISTOGRAM else "quantile")
                try:
                    group.buckets.append((float(bound or "nan"), value))
                except ValueError:
                    continue
        families: dict[str, _Family] = {}
        for (family, rest), group in groups.items():
            series = self._complex.get((family, rest))
            if series is None:
                if len(self._complex) > 10_000:  # label churn: forget, as SeriesTable.evict_stale does
                    self._complex.clear()
                labels = dict(rest)
                series = Series(family, labels, relabel(self.relabel, family, labels))
                self._complex[(family, rest)] = series
            if group.count is None or not series.last_ts < group.t <= MAX_TIME_NS or series.route == ROUTE_DROP:
                continue  # the spec: no _count, no point
            series.last_ts, series.seen = group.t, gen
            start = series.start_for(group.count, group.t, self.start_mode)
            body = histogram_point(group, start) if group.kind == HISTOGRAM else summary_point(group, start)
            tag = 0x4A if group.kind == HISTOGRAM else T_NDP_ATTR  # HistogramDataPoint.attributes = 9
            attrs = self._label_bytes(series.out_labels, ctx, tag) + attributes(tag, ctx.items)
            fam = self._family_of(families, series.out_name, group.kind, family)
            fam.points.append(field_bytes(T_DATA_POINTS, attrs + body))
        metrics = [self._metric(f, page) for f in families.values()]
        return metrics, sum(len(f.points) for f in families.values())


def _identity(name: str, labels: Mapping[str, str]) -> bytes:
    """What the receiver sees of a series (its name and attributes, in any order) as a 128-bit digest: 16 bytes a
    series rather than a frozenset of pairs (a third of the encoder's memory at 512 GPUs, bench/NOTES.md)."""
    return blake2b(repr((name, sorted(_attribute_items(labels, frozenset())))).encode(),
                           digest_size=16).digest()


def _attribute_items(labels: Mapping[str, str], reserved: frozenset[str]) -> list[tuple[str, str]]:
    return [
        (f"exported_{key}" if key in reserved else key, value)
        for key, value in labels.items()
        if not is_blank_label(value)
    ]
