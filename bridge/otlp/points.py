"""What an encoded page carries besides the exporter's samples, and what encoding it yields.

`PointContext` (run_id, phase, static attributes; one object per pair, from a `ContextCache`) and
`EncodedPage` (the framed chunk and its counts): shared by the line loop (encode.py) and the page plan
(plan.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from bridge.otlp.wire import T_NDP_ATTR, attributes

Chunk = bytes | bytearray  # an encoded page or request part; a bytearray is a plan's buffer (plan.py)


@dataclass(frozen=True, eq=False)
class PointContext:
    """What every data point of a page carries besides the exporter's labels.

    Build one per (run_id, phase) and reuse it (`ContextCache`): series rebuild their cached
    attribute bytes only when the context object changes, i.e. at a phase boundary.
    """

    run_id: str
    phase: str
    static: tuple[tuple[str, str], ...] = ()
    items: tuple[tuple[str, str], ...] = field(init=False, repr=False)
    attr_bytes: bytes = field(init=False, repr=False)  # as NumberDataPoint.attributes fields
    keys: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        items = (("run_id", self.run_id), ("phase", self.phase), *self.static)
        object.__setattr__(self, "items", items)
        object.__setattr__(self, "attr_bytes", attributes(T_NDP_ATTR, items))
        object.__setattr__(self, "keys", frozenset(k for k, _ in items))


class ContextCache:
    """One PointContext per (run_id, phase), so identity comparisons stay cheap."""

    def __init__(self, static: Mapping[str, str] | None = None) -> None:
        self.static = tuple((static or {}).items())
        self._cache: dict[tuple[str, str], PointContext] = {}

    def get(self, run_id: str, phase: str) -> PointContext:
        ctx = self._cache.get((run_id, phase))
        if ctx is None:
            if len(self._cache) > 256:
                self._cache.clear()
            ctx = self._cache[(run_id, phase)] = PointContext(run_id, phase, self.static)
        return ctx


class EncodedPage(NamedTuple):
    chunk: Chunk  # a framed ResourceMetrics (field 1 of the request); b"" when there is nothing to send
    points: int  # data points, staleness markers included
    stale: int  # NoRecordedValue markers among them
    blank: int  # sentinel values not sent
    out_of_order: int  # points not newer than the series' last one (or a duplicate series), or with a time past
    # what OTLP's uint64 nanoseconds hold: not sent
    dropped: int  # points of series a relabel rule dropped
