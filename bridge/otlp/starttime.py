"""Per-series state of one endpoint: counter start times, resets, last timestamp and staleness.

A series is one (family name, exporter label mapping) of one endpoint. The key deliberately leaves
out `run_id` and `phase` (they are added to the data point afterwards), so a counter keeps its start
time across phase boundaries and `rate()` sees one continuous series per GPU.

Start time of a cumulative series (the old collector-contrib `initialPointAdjuster`, what its
`metricstarttime` processor calls `true_reset_point`):
- first sight: start = the point's own time (a zero-length first interval);
- a value lower than the previous one is a reset: start = previous point's time + 1 ns;
- otherwise the start is kept. Staleness markers keep the start too.
`StartTimeMode "unset"` leaves start at 0, as the spec's Prometheus mapping does without `_created`.

Staleness: a series seen on the previous page of its endpoint and missing now (GPU gone, exporter
restarted with fewer fields, a sentinel value) gets one NoRecordedValue point; `SeriesTable.vanished`
returns those series exactly once until they come back.

The table is keyed by `id(labels)`: the parser hands out the same read-only label Mapping for the
same series scrape after scrape, and looking a series up by value (hashing its labels) would cost
every point of a page what the lookup is for. Each entry holds its labels (`Series.labels`), so the
id cannot be reused by another object while the entry exists, and an entry leaves the table with
the reference; the `is` check in `SeriesTable.get` (and encode.py's loop) refuses any other mapping.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal

StartTimeMode = Literal["first_seen", "unset"]
# How a series' points travel: as is, not at all (relabel drop), under another name (relabel rename),
# or as another series (an alias: a second label mapping with the same attributes once empty labels
# are dropped, e.g. `pod=""` and no pod label; sending both would duplicate points, which
# Prometheus rejects with the whole request).
ROUTE_SEND, ROUTE_DROP, ROUTE_RENAMED, ROUTE_ALIAS = range(4)


class Series:
    """Mutable state of one series; encode.py fills the encoding fields (`prefix`, `ctx`, ...)."""

    __slots__ = (
        "name", "labels", "route", "out_name", "out_labels", "canonical", "ctx", "prefix", "kind", "last_ts",
        "start", "last_value", "seen", "stale_gen",
    )

    def __init__(
        self, name: str, labels: Mapping[str, str], out: tuple[str, Mapping[str, str]] | None = None
    ) -> None:
        self.name = name
        self.labels = labels  # as the parser handed it out (the key)
        # After relabelling: None = a rule dropped the series (never encoded, never stale).
        self.out_name = out[0] if out is not None else name
        self.out_labels = out[1] if out is not None else labels
        self.route = ROUTE_DROP if out is None else ROUTE_SEND if self.out_name == name else ROUTE_RENAMED
        self.canonical: Series = self
        self.ctx: object = None  # the PointContext the prefix was built for
        self.prefix = b""  # field tag + length + attribute bytes of a data point
        self.kind = -1  # the point kind the prefix's length was built for (a page's TYPE line can change it)
        self.last_ts = 0  # ns of the last point sent; later points must be newer
        self.start = 0  # ns; cumulative series only
        self.last_value = 0.0
        self.seen = 0  # page generation it was last seen in (0 = never)
        self.stale_gen = 0  # page generation of its last staleness marker

    def start_for(self, value: float, ts_ns: int, mode: StartTimeMode = "first_seen") -> int:
        """The start time of a cumulative point at `ts_ns`; call once per point, in time order,
        before `last_ts` is moved to `ts_ns`."""
        if mode == "unset":
            self.last_value = value
            return 0
        if self.start == 0:
            self.start = ts_ns
        elif value < self.last_value:  # a reset (driver reload, GPU reset): new interval after the last point
            self.start = self.last_ts + 1
        self.last_value = value
        return self.start


class SeriesTable:
    """All series of one endpoint: family name -> {id(labels): Series}, plus the page generation."""

    def __init__(self) -> None:
        self.families: dict[str, dict[int, Series]] = {}
        self.identities: dict[object, Series] = {}  # what the receiver sees (name + attributes) -> series
        self.generation = 0
        self.size = 0

    def begin_page(self) -> int:
        self.generation += 1
        return self.generation

    def family(self, name: str) -> dict[int, Series]:
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = {}
        return fam

    def get(self, fam: dict[int, Series], labels: Mapping[str, str]) -> Series | None:
        series = fam.get(id(labels))
        return series if series is not None and series.labels is labels else None

    def add(self, fam: dict[int, Series], series: Series, identity: object = None) -> Series:
        """Register a new series; one whose `identity` is already taken becomes an alias of that one."""
        if id(series.labels) not in fam:
            self.size += 1
        fam[id(series.labels)] = series
        if identity is not None and series.route != ROUTE_DROP:
            canonical = self.identities.get(identity)
            if canonical is None:
                self.identities[identity] = series
            elif canonical is not series:
                series.route, series.canonical = ROUTE_ALIAS, canonical.canonical
        return series

    def vanished(self) -> Iterator[Series]:
        """Series seen before this page but not in it, not yet marked stale: mark them and yield them."""
        gen = self.generation
        for fam in self.families.values():
            for series in fam.values():
                if series.seen != gen and series.seen > series.stale_gen and series.route < ROUTE_ALIAS:
                    series.stale_gen = gen
                    yield series

    def evict_stale(self, keep: int) -> int:
        """Forget series not seen in this page once the table holds more than `keep` of them.

        Keeps memory bounded when an exporter's label sets churn (pod labels of short-lived pods). A
        forgotten counter that comes back starts a new interval, as after a reset.
        """
        if self.size <= keep:
            return 0
        gen = self.generation
        removed = 0
        for name in list(self.families):
            fam = self.families[name]
            for key in [k for k, s in fam.items() if s.seen != gen]:
                del fam[key]
                removed += 1
            if not fam:
                del self.families[name]
        self.size -= removed
        live = {s for fam in self.families.values() for s in fam.values()}  # (a Series hashes by identity)
        self.identities = {k: s for k, s in self.identities.items() if s in live}
        return removed
