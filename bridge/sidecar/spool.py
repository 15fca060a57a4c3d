"""The live report's series: every record the run writes, spooled per series to disk as it is written.

The sidecar's report is built from these series and the events file — the same inputs `dcgm-bridge
report` reads afterwards — so the two agree (tests/test_longrun.py compares them). The records do not
come back from the JSONL log, though: re-reading a long run's log costs several times the shutdown budget
under a 25m limit (0.75 CPU-s: 30 s × 25m; bench/bench_report.py). `LiveSeries` takes each record as it is
written, appends its values as one row to its series' spool file (raw float64/int64, nothing kept in
memory beyond 8-64 KB per series, so RSS stays flat over hours), and at the end hands `build_report` the
series as memory-mapped arrays. When the spool cannot be written (disk full) and its in-memory fallback
outgrows its bound, the report falls back to the record log.

Open files stay bounded whatever the series count: a flush opens one spool file and closes it, and the
maps `finish` hands out hold no file descriptor (`_map_file`), so a 64-GPU × 7-MIG run (512 series, 1024
spool files) builds its report under `ulimit -n 256`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import shutil
import threading
import weakref
from array import array
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.endpoints import display_key
from bridge.report.series import END_COLUMN, SeriesRows, with_end
from bridge.samples import GpuRecord

if TYPE_CHECKING:
    from bridge.normalize import CompiledRecords, PlanEntry
    from bridge.report.series import Series

logger = logging.getLogger(__name__)

# A series' rows are spooled when they reach its threshold. Each spool write costs ~70 us of the scrape thread
# however small (an open, an append and a close, two files), so after its first (staggered) spool a series holds
# its share of _SPOOL_MEMORY before the next: 16 KiB a series at 64 series (4 writes a second at 8 x 8 GPUs and
# 3 Hz), never less than _FLUSH_BYTES (~4 s of one GPU at 3 Hz: past 128 series the memory grows with them) nor
# more than 8 times it. (Halved in issue 48: at 64 x 8 GPUs the rows held were ~5 MiB of a 100 MiB budget, for
# ~2 millicores of writes saved.)
_SPOOL_MEMORY = 1024 * 1024
_FLUSH_BYTES = 8 * 1024
# Series fill at the same pace, so one threshold would spool all of them in the same scrape (512 MIG series:
# ~1,000 file writes in one page's processing, tens of ms of the scrape thread). Each series' first threshold
# is staggered by up to this many eighths of it, and every later one is the same: the series keep the phases
# they were given, and their writes stay spread over that many scrapes.
_FLUSH_STAGGER = 8
# An endpoint's pages held before they go to their series: ~4 s of 8 GPUs at 3 Hz, well under a series' flush
# threshold, so the series' staggered flushes stay spread over scrapes (a page over it goes out at once).
_BLOCK_BYTES = 64 * 1024
_MAX_UNSPOOLED_BYTES = 64 * 1024 * 1024  # held in memory while the spool cannot be written; past it: give up


def flush_bytes(series: int) -> int:
    """A series' spool threshold when the run has `series` series (see _SPOOL_MEMORY)."""
    return max(_FLUSH_BYTES, min(8 * _FLUSH_BYTES, _SPOOL_MEMORY // max(1, series)))


class _Spooled:
    """One series (endpoint × GPU identity): its rows (report/series.py's SeriesRows, holding only those not
    yet spooled) and how many float64 values its .rows file holds."""

    __slots__ = ("number", "rows", "rows_out", "filled_from", "flush_at")

    def __init__(self, number: int, record: GpuRecord) -> None:
        self.number = number
        self.rows = SeriesRows(record)
        self.rows_out = 0
        self.flush_at = _FLUSH_BYTES + (number % _FLUSH_STAGGER) * _FLUSH_BYTES // _FLUSH_STAGGER  # then flush_bytes
        self.filled_from: int | None = None  # the plan whose metadata the missing fields were last filled from


class _PlanBlock:
    """An endpoint's latest pages of one kernel plan (its key): their rows one after the other (each page's the
    same width), their times and ends (none where the pages carry none), and each record's series, entry and row
    width in page order."""

    __slots__ = ("plan", "targets", "rows", "ts", "ends")

    def __init__(self, plan: int, targets: list[tuple[_Spooled, PlanEntry, int]]) -> None:
        self.plan = plan
        self.targets = targets
        self.rows = bytearray()
        self.ts: array[int] = array("q")
        self.ends: array[float] = array("d")


class LiveSeries:
    """Records → per-series spool files → `build_report`'s series (its `records` and `finish()`).
    Thread-safe (one lock)."""

    def __init__(self, spool_dir: Path) -> None:
        self.spool_dir = spool_dir
        self._series: dict[tuple[str, str, str | None], _Spooled] = {}
        self._blocks: dict[str, _PlanBlock] = {}  # endpoint -> its latest pages of one plan, not handed out yet
        self._lock = threading.Lock()
        self.records = 0
        self.complete = True  # False once a record could not be kept: the report re-reads the log
        self.error: str | None = None
        self._unspooled = 0
        self._ended_keys: dict[tuple[str, ...], tuple[str, ...]] = {}  # an entry's keys -> with END_COLUMN (one tuple)

    def add(self, records: Sequence[GpuRecord], endpoint: str | None = None) -> None:
        """Records of one scrape (`endpoint`: their display key, when the caller knows it)."""
        if not self.complete or not records:
            return
        with self._lock:
            self._hand_out_all()  # (finish sorts each series by time; its blocks of keys stay whole)
            for record in records:
                self._add(record, endpoint or display_key(record.telemetry_source_url))
            self.records += len(records)

    def add_compiled(self, compiled: CompiledRecords, endpoint: str) -> None:
        """The records of one scrape as the kernel wrote them (bridge/normalize.py `CompiledRecords`): the page's
        rows are appended as one block to its endpoint's pages of the same plan (its key: the same entries
        page after page), which are handed out to their series every `_BLOCK_BYTES` (`_hand_out`): a page costs
        one copy, not a call per record. A record is built only for a series' first (its metadata)."""
        if not self.complete or not compiled.entries:
            return
        with self._lock:
            block = self._blocks.get(endpoint)
            if block is None or block.plan != compiled.plan:
                if block is not None:
                    self._hand_out(block)
                block = self._blocks[endpoint] = _PlanBlock(compiled.plan, self._targets_of(compiled, endpoint))
            block.rows += compiled.rows
            block.ts.append(compiled.timestamp_ns)
            if compiled.scrape_end_ns is not None:  # (a plan's pages all carry one or none: it is in the plan's key)
                block.ends.append(compiled.scrape_end_ns)
            if len(block.rows) >= _BLOCK_BYTES:
                self._hand_out(block)
            self.records += len(compiled.entries)

    def _hand_out(self, block: _PlanBlock) -> None:
        """A plan's pages to their series: each series takes its column of the block's rows in one piece."""
        pages = len(block.ts)
        if not pages:
            return
        view = memoryview(block.rows)
        stride = len(block.rows) // pages
        offset = 0
        for spooled, entry, width in block.targets:
            if not self.complete:  # a failed spool gave up (`_give_up`): the report re-reads the log
                break
            rows = spooled.rows
            column = view[offset: offset + width] if pages == 1 else \
                b"".join([view[at: at + width] for at in range(offset, len(view), stride)])
            offset += width
            keys = entry.keys
            if block.ends:  # each page's end, one more column of every row (report/series.py `END_COLUMN`)
                column = _with_ends(column, width, block.ends)
                keys = self._ended_keys.setdefault(keys, (*keys, END_COLUMN))
            rows.add_rows(block.ts, keys, column)
            if rows.missing and spooled.filled_from != block.plan:  # (a plan's entries keep their metadata)
                spooled.filled_from = block.plan
                rows.fill(partial(getattr, entry.meta))
            if rows.used >= spooled.flush_at:
                self._spool(spooled)
        view.release()
        block.rows = bytearray()
        block.ts = array("q")
        block.ends = array("d")

    def _hand_out_all(self) -> None:
        for block in list(self._blocks.values()):  # (a spool that gives up empties the dict)
            self._hand_out(block)

    def _targets_of(self, compiled: CompiledRecords, endpoint: str) -> list[tuple[_Spooled, PlanEntry, int]]:
        """Each record's series (made, from the record, for one seen first), its entry and its row's bytes."""
        series = self._series
        out = []
        for entry, row in compiled.row_views():
            key = (endpoint, entry.meta.gpu_uuid, entry.meta.gpu_instance_id)
            spooled = series.get(key)
            if spooled is None:
                spooled = series[key] = _Spooled(len(series), compiled.record(entry, row))
            out.append((spooled, entry, len(row)))
        return out

    def _add(self, record: GpuRecord, endpoint: str) -> None:
        key = (endpoint, record.gpu_uuid, record.gpu_instance_id)
        spooled = self._series.get(key)
        if spooled is None:
            spooled = self._series[key] = _Spooled(len(self._series), record)
        rows = spooled.rows
        rows.add(record.timestamp_ns, with_end(record.telemetry_data, record.scrape_end_ns))
        if rows.missing:
            rows.fill(partial(getattr, record))
        if rows.used >= spooled.flush_at:
            self._spool(spooled)

    def _spool(self, spooled: _Spooled) -> None:
        rows = spooled.rows
        held = rows.used + len(rows.ts) * 8
        rows_path = f"{self.spool_dir}/{spooled.number}.rows"
        ts_path = f"{self.spool_dir}/{spooled.number}.ts"
        try:
            self._append(rows_path, rows.rows())
            self._append(ts_path, rows.ts)
        except OSError as exc:
            for path, size in ((rows_path, spooled.rows_out * 8), (ts_path, rows.taken * 8)):
                with contextlib.suppress(OSError):  # a half-written flush is written again in full later
                    os.truncate(path, size)
            # Kept in memory and retried at the next flush; the record log has its own buffer and error.
            self._unspooled += held
            if self.error is None:
                logger.warning("cannot spool the live report's series to %s (%s); keeping them in memory",
                               self.spool_dir, exc.strerror or exc)
            self.error = f"cannot write {self.spool_dir}: {exc.strerror or exc}"
            if self._unspooled > _MAX_UNSPOOLED_BYTES:
                self._give_up()
            return
        spooled.rows_out += rows.used // 8
        spooled.flush_at = flush_bytes(len(self._series))
        rows.take()
        self._unspooled = 0

    def _append(self, path: str, data: Any) -> None:
        """`data` (a buffer) at the end of the file at `path`, made with its folder when missing. A file
        descriptor, not a Python file object: the scrape thread flushes a few series a second (issue 18)."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            self.spool_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    def _give_up(self) -> None:
        logger.warning("the live report gave up holding series in memory; the report will re-read the record log")
        self.complete = False
        self._series.clear()
        self._blocks.clear()

    def finish(self) -> list[Series]:
        """Every series, time-sorted, its arrays memory-mapped from the spool (in memory what could not be
        spooled): a one-hour 64-GPU run's ~220 MB of values stay file pages, reclaimable, not heap."""
        import numpy as np

        out: list[Series] = []
        with self._lock:
            self._hand_out_all()
            for (endpoint, _uuid, _instance), spooled in self._series.items():
                if len(spooled.rows.ts):
                    self._spool(spooled)
                ts = self._column(spooled, "ts", np.int64, spooled.rows.ts, spooled.rows.taken)
                rows = self._column(spooled, "rows", np.float64, spooled.rows.rows(), spooled.rows_out)
                out.append(spooled.rows.series(endpoint, ts, rows))
        return out

    def _column(self, spooled: _Spooled, kind: str, dtype: Any, pending: Any, spooled_n: int) -> Any:
        """The spooled values, mapped read-only (a plain ndarray over the map: np.memmap slices at Python level),
        followed by those still in memory."""
        import numpy as np

        tail = np.frombuffer(pending, dtype=dtype).copy()
        if not spooled_n:
            return tail
        head = np.frombuffer(_map_file(self.spool_dir / f"{spooled.number}.{kind}"), dtype=dtype, count=spooled_n)
        head.flags.writeable = False
        return np.concatenate([head, tail]) if tail.size else head

    def remove(self) -> None:
        shutil.rmtree(self.spool_dir, ignore_errors=True)


SPOOL_PREFIX = ".dcgm-bridge-spool-"


def spool_dir(artifact_dir: Path, run_id: str) -> Path:
    return artifact_dir / f"{SPOOL_PREFIX}{run_id}"


def remove_stale_spools(artifact_dir: Path) -> list[Path]:
    """Spool folders a process left when it died (kill -9, OOM): nothing reads them again, since a restarted
    run reads its record log. Removed before a new process spools anything; one log line each."""
    removed = []
    with contextlib.suppress(OSError):
        for path in artifact_dir.glob(f"{SPOOL_PREFIX}*"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
                logger.warning("removed %s, the live report's spool of a process that did not finish", path)
    return removed


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _map_file(path: Path) -> Any:
    """The whole file, mapped read-only and shared (file pages: reclaimable, not heap), as a buffer that unmaps
    itself when the last array over it goes. Its descriptor is closed at once, as a mapping needs none (Linux
    mmap(2): "the file descriptor, fd, can be closed immediately without invalidating the mapping"), while
    Python's `mmap.mmap` keeps a duplicate open per map (docs.python.org, mmap: until 3.13's `trackfd=False`)
    — two descriptors a series, EMFILE past ~500 series under `ulimit -n 1024`."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(path))
    buffer = (ctypes.c_char * size).from_address(address)
    weakref.finalize(buffer, _libc.munmap, address, size)
    return buffer


def _with_ends(column: bytes | memoryview, width: int, ends: array[float]) -> bytes:
    """A series' rows of `width` bytes each, one a page, with the page's end after each."""
    import numpy as np

    rows = np.frombuffer(column, dtype=np.float64).reshape(len(ends), width // 8)
    return np.column_stack((rows, np.frombuffer(ends, dtype=np.float64))).tobytes()
