"""The page plan: the OTLP encoder's fast path, for a page that follows its endpoint's template.

When a page follows the same template (parse/template.py) as the previous page of its endpoint, under
the same run/phase context, everything in its chunk but the point times, start times and values is the
same bytes as last time, at the same places (gauge and sum points have a fixed size). After a clean page
the encoder (encode.py, `EndpointEncoder._compile`) keeps a `PagePlan`: those constant runs of bytes,
taken from the line-loop encoding of that page itself, and the sample position behind each point. The
next page is then a few C-level maps (`struct.pack` over the values) and one join (~5× cheaper); its
series state (last time, start, last value, generation) is written back to the series the next time
the loop runs. A sentinel, a reset or a phase change is handled by the plan or sends the page back
through the loop.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from itertools import compress, repeat
from operator import lt

from bridge import kernel  # the compiled kernel; the struct.pack fill below is the reference and the fallback
from bridge.fields import BLANK_VALUES
from bridge.otlp.points import BufferPool, Chunk, EncodedPage, Lease, PointContext
from bridge.otlp.starttime import Series, SeriesTable, StartTimeMode
from bridge.parse import PageTemplate, TemplatedPage
from bridge.parse.template import pack_ints

_BLANKS = tuple(sorted(BLANK_VALUES))

_PACK_TIME = struct.Struct("<BQB").pack  # 0x19 time 0x21
_PACK_VALUE = struct.Struct("<d").pack
PACK_START = struct.Struct("<BQ").pack  # 0x11 start
_PACK_U64_INTO = struct.Struct("<Q").pack_into
_POINT_TAIL = 18  # 0x19 time 0x21 value
POOL_SIZE = 3  # idle chunk buffers kept an endpoint: a batch a second holds ~3 pages of an endpoint at 3 Hz


class PagePlan:
    """A clean page's encoding with holes for the point bytes (see the module docstring).

    Every point ends the same way: `0x19 time 0x21 value`; what comes before it (framing, the series'
    attribute bytes, and for a sum `0x11 start`) is constant until a counter resets. So `pieces` is
    [constant, time, value] per point plus a closing constant, and a page fills the time and value slots.
    """

    __slots__ = ("template", "ctx", "pieces", "frame", "layout", "start_at", "value_at", "sum_at", "sum_slots",
                 "sum_heads", "series", "sum_series", "starts", "last_sum", "blank_at", "sum_positions", "last_t",
                 "generation", "dirty", "dropped", "points", "buffers", "version")

    def __init__(self, template: PageTemplate, ctx: PointContext, buffers: BufferPool) -> None:
        self.template = template
        self.ctx = ctx
        self.pieces: list[bytes] = []
        # The same chunk as the kernel fills it: the whole of it with placeholder points (`frame`), and where
        # each point goes and which sample it is (`layout`: offset, position pairs, int32). One buffer to copy
        # and patch, not a thousand pieces to chase through a cold cache.
        self.frame = bytearray()
        self.layout = b""
        self.start_at: list[int] = []  # the frame offset of each sum point's start time
        self.value_at: tuple[int, ...] = ()  # sample position of each point, in output order
        self.sum_at: tuple[int, ...] = ()  # sample positions of the sum points
        self.sum_slots: list[int] = []  # their output slots
        self.sum_heads: list[bytes] = []  # their constants without the start time
        self.series: list[Series] = []  # every series with a point, for the write-back
        self.sum_series: list[Series] = []
        self.starts: list[int] = []
        self.last_sum = b""  # their values on the last page, native float64 (as the kernel reads and returns them)
        self.blank_at: tuple[int, ...] = ()  # sample positions holding a sentinel (not sent), in order
        self.sum_positions = b""  # sum_at, as the kernel reads it (int32)
        self.last_t = 0
        self.generation = 0
        self.dirty = False  # series state behind the plan's last page
        self.dropped = 0
        self.points = 0
        # The kernel's chunks: the endpoint's buffers, each lent to its page (EncodedPage.lease) until the
        # forwarder releases it. A returned buffer takes a later page's points in place: the frame is not copied
        # again (unless `version` moved on), and a buffer used a second ago is not the cold, new 100 KB a copy is.
        self.buffers = buffers
        self.version = 0  # the frame's, from the pool (`lay_out`); a counter reset writes a start time into it

    def fill(self, page: TemplatedPage, ts_ns: int, table: SeriesTable, start_mode: StartTimeMode
             ) -> EncodedPage | None:
        """The chunk of a page that follows the plan's template, or None when the page needs the loop."""
        compiled = kernel.running()
        if not compiled and not self.pieces:  # laid out for the kernel (`lay_out`): the loop encodes this page
            return None
        if compiled:
            if kernel.blank_at(page.raw, None, _BLANKS, False) != self.blank_at:
                return None
        else:
            values = page.values
            if BLANK_VALUES.isdisjoint(values):
                if self.blank_at:
                    return None
            elif tuple(compress(range(len(values)), map(BLANK_VALUES.__contains__, values))) != self.blank_at:
                return None
        pieces = self.pieces
        if self.sum_at:
            fell: Sequence[int]
            if compiled:
                self.last_sum, fell = kernel.sums_of(page.raw, self.sum_positions, self.last_sum)
            else:
                sums = list(map(values.__getitem__, self.sum_at))
                last_sum = memoryview(self.last_sum).cast("d")
                fell = [k for k in range(len(sums)) if sums[k] < last_sum[k]] if any(map(lt, sums, last_sum)) else ()
                self.last_sum = array("d", sums).tobytes()
            if start_mode != "unset":
                for k in fell:  # a reset: a new interval after the previous point (starttime.py)
                    self.starts[k] = self.last_t + 1
                    if pieces:
                        pieces[3 * self.sum_slots[k]] = self.sum_heads[k] + PACK_START(0x11, self.starts[k])
                    _PACK_U64_INTO(self.frame, self.start_at[k], self.starts[k])
                    self.version = self.buffers.new_version()
        chunk: Chunk
        lease: Lease | None = None
        if compiled:
            lease = self.buffers.lend(self.frame, self.version)
            chunk = kernel.points_of(self.frame, self.layout, page.raw, ts_ns, lease.buffer)
        else:
            pieces[1::3] = repeat(_PACK_TIME(0x19, ts_ns, 0x21), self.points)
            pieces[2::3] = map(_PACK_VALUE, map(values.__getitem__, self.value_at))
            chunk = b"".join(pieces)
        self.last_t = ts_ns
        self.generation = table.begin_page()
        self.dirty = True
        return EncodedPage(chunk, self.points, 0, len(self.blank_at), 0, self.dropped, lease)

    def lay_out(self, constants: list[bytes]) -> None:
        """`pieces`, `frame`, `layout` and `start_at` from the constants between the points (set `value_at` and
        `sum_slots` first)."""
        # `pieces` are the Python path's; the kernel fills `frame`: with the kernel, the constants are kept once, in
        # the frame (at 64 endpoints the pieces would be another 6 MiB, bench/NOTES.md).
        self.pieces = [] if kernel.running() else [b""] * (3 * len(self.value_at) + 1)
        if self.pieces:
            self.pieces[0::3] = constants
        placeholder = bytes(_POINT_TAIL)
        self.frame = bytearray(placeholder.join(constants))
        offsets: list[int] = []
        offset = 0
        for constant in constants[:-1]:
            offset += len(constant)
            offsets.append(offset)
            offset += _POINT_TAIL
        layout = [0] * (2 * len(offsets))
        layout[0::2] = offsets
        layout[1::2] = self.value_at
        self.layout = pack_ints(layout)
        self.start_at = [offsets[k] - 8 for k in self.sum_slots]  # (each sum's constant ends with 0x11 start)
        self.sum_positions = pack_ints(self.sum_at)
        self.version = self.buffers.new_version()

    def write_back(self) -> None:
        """Series state as the loop would have left it after the plan's last page."""
        if not self.dirty:
            return
        for series in self.series:
            series.last_ts = self.last_t
            series.seen = self.generation
        for series, start, last in zip(self.sum_series, self.starts, memoryview(self.last_sum).cast("d"), strict=True):
            series.start = start
            series.last_value = last
        self.dirty = False
