"""What an encoded page carries besides the exporter's samples, and what encoding it yields.

`PointContext` (run_id, phase, static attributes; one object per pair, from a `ContextCache`) and
`EncodedPage` (the framed chunk and its counts): shared by the line loop (encode.py) and the page plan
(plan.py).

A page the compiled kernel fills comes in a buffer of its endpoint's `BufferPool` (one per EndpointEncoder),
and the page carries it as a `Lease`: whoever holds the page (the forwarder, export.py) releases the lease
once nothing will read the chunk again (its batch sent, given up, or dropped), and only then may the pool
lend the buffer to a later page, which then needs no fresh copy of the plan's frame. Prometheus' scrape loop
does the same with its buffers (prometheus/prometheus scrape/scrape.go: `sl.buffers.Get` before a scrape,
`Put` after its append). A lease never released costs only a new buffer for a later page; a chunk is never
written while its page holds it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

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


class BufferPool:
    """The chunk buffers that no page holds: at most `keep` (and, with `keep_bytes`, at most that many bytes of
    them), each with the version of the frame it holds (a plan takes a new version for each frame it writes, so no
    two frames share one, even when plans of several endpoints share the pool).

    An encoder of its own has a pool of its own; the forwarder's encoders share one bounded in bytes (issue 48):
    a buffer is needed only while its page's batch is sent, so the idle ones are bounded by a batch's bytes, not
    by `keep` a endpoint (3 × 120 KB × 64 endpoints was 23 MiB of idle buffers).

    Thread-safe: pages are filled on the export thread, and `close()` may release carried pages on another.
    """

    def __init__(self, keep: int, keep_bytes: int | None = None) -> None:
        self.keep = keep
        self.keep_bytes = keep_bytes
        self._free: list[tuple[bytearray, int]] = []
        self._free_bytes = 0
        self._lent = 0
        self._versions = 0
        self._lock = threading.Lock()

    def new_version(self) -> int:
        """A frame version that no buffer of this pool holds yet."""
        self._versions += 1
        return self._versions

    def lend(self, frame: bytearray, version: int) -> Lease:
        """A buffer holding `frame` at `version` (copied in unless the buffer already holds it), lent until its
        lease is released: a returned buffer of a page already sent, else a new one."""
        with self._lock:
            self._lent += 1
            reused = self._free.pop() if self._free else None  # the last returned: the one warmest in cache
            if reused is not None:
                self._free_bytes -= len(reused[0])
        if reused is None:
            return Lease(bytearray(frame), version, self)
        buffer, held = reused
        if held != version:  # another plan's frame (of another size, maybe), or this one's before a counter reset
            buffer[:] = frame
        return Lease(buffer, version, self)

    def _give_back(self, buffer: bytearray, version: int) -> None:
        with self._lock:
            self._lent -= 1
            if len(self._free) < self.keep and (self.keep_bytes is None
                                                or self._free_bytes + len(buffer) <= self.keep_bytes):
                self._free.append((buffer, version))
                self._free_bytes += len(buffer)

    @property
    def free(self) -> int:
        """Buffers waiting for a page (never more than `keep`)."""
        return len(self._free)

    @property
    def lent(self) -> int:
        """Buffers lent to pages whose leases are not released yet."""
        return self._lent


class Lease:
    """A pool's buffer lent to the one page that carries it, until `release()`.

    Release it once nothing will read the page's chunk again; releasing twice is harmless (the second does
    nothing), and a lease object is never lent again, so a stale one cannot hand back another page's buffer.
    """

    __slots__ = ("buffer", "version", "_pool")

    def __init__(self, buffer: bytearray, version: int, pool: BufferPool) -> None:
        self.buffer = buffer
        self.version = version
        self._pool: BufferPool | None = pool

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._give_back(self.buffer, self.version)


@dataclass(frozen=True, slots=True)
class EncodedPage:
    """One page's encoding; two are equal when they encode the same (whichever buffer holds the chunk)."""

    chunk: Chunk  # a framed ResourceMetrics (field 1 of the request); b"" when there is nothing to send
    points: int  # data points, staleness markers included
    stale: int  # NoRecordedValue markers among them
    blank: int  # sentinel values not sent
    out_of_order: int  # points not newer than the series' last one (or a duplicate series), or with a time past
    # what OTLP's uint64 nanoseconds hold: not sent
    dropped: int  # points of series a relabel rule dropped
    lease: Lease | None = field(default=None, compare=False)  # the pool buffer `chunk` is in (a plan's page)

    def release(self) -> None:
        """Give the chunk's buffer back to its plan's pool (see the module docstring): call once the chunk is
        sent or dropped, never while it may still be read."""
        if self.lease is not None:
            self.lease.release()
