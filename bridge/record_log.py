"""gpu_telemetry_export.jsonl: one line per GPU (or MIG instance) per scrape; and the events file.

Lines are written whole: the writer buffers complete lines and hands each flush to one write(2),
so a kill loses at most the last flush interval and never leaves half a line; readers still
ignore a final line without its newline (a disk that filled up mid-write can leave one).
The events file's lines are events.py's records (`LineWriter.write_event`).
`.jsonl.gz` paths are written gzip-compressed (sync-flushed, so readable while the run goes on).
"""

from __future__ import annotations

import errno
import io
import logging
import os
import threading
import time
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import IO, Any, Protocol, cast

import orjson

from bridge.events import Event, event_to_line
from bridge.parse.template import pack_ints
from bridge.samples import GpuRecord
from bridge.views import advance

logger = logging.getLogger(__name__)

EXPORT_FILE = "gpu_telemetry_export.jsonl"
EVENTS_FILE = "gpu_telemetry_events.jsonl"
JSON_FILE = "profile_export_aiperf.json"  # the report's, named here with the run's other files: the sidecar's
CSV_FILE = "profile_export_aiperf.csv"  # start checks them without importing the report's writers


def output_names(prefix: str | None = None) -> tuple[str, str]:
    """The report's (json, csv) file names; `--profile-export-prefix foo` gives foo.json and foo.csv."""
    if not prefix:
        return JSON_FILE, CSV_FILE
    return f"{prefix}.json", f"{prefix}.csv"


# AIPerf's keys in AIPerf's order (`TelemetryRecord`, ai-dynamo/aiperf `src/aiperf/common/models/telemetry_models.py`),
# then ours.
_AIPERF_IDENTITY = (
    "gpu_index", "gpu_uuid", "gpu_model_name", "pci_bus_id", "device",
    "hostname", "namespace", "pod_name", "platform",
)
_OURS = ("gpu_instance_id", "gpu_instance_profile", "device_uuid", "run_id", "phase", "scrape_start_ns",
         "scrape_end_ns")


def record_to_dict(rec: GpuRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _AIPERF_IDENTITY:
        value = getattr(rec, key)
        if value is not None:
            out[key] = value
    out["timestamp_ns"] = rec.timestamp_ns
    out["telemetry_source_url"] = rec.telemetry_source_url
    out["telemetry_data"] = dict(rec.telemetry_data)
    for key in _OURS:
        value = getattr(rec, key)
        if value is not None:
            out[key] = value
    return out


def record_to_line(rec: GpuRecord) -> bytes:
    return orjson.dumps(record_to_dict(rec)) + b"\n"


# The record log's line as the compiled kernel writes it (bridge/_kernel.c `records_of`), per record: the text
# before `timestamp_ns`'s value, between it and the first value, before each value (`"key":`), after the last
# value up to `scrape_start_ns`'s value, and before `scrape_end_ns`'s value (b"" without one); the kernel writes
# the numbers between them and the closing `}\n`. The same layout as `record_to_dict`, cut where numbers go.
LinePieces = tuple[bytes, bytes, tuple[bytes, ...], bytes, bytes]
# A page plan's line program as the kernel reads it, flat (three buffers instead of a thousand objects to chase
# through a cold cache): every record's texts in the order they are written; per record (key count, head,
# middle, tail and end lengths) then per key (its text's length, its sample position), int32; every key's
# scale, float64.
LineProgram = tuple[bytes, bytes, bytes]


def _members(rec: GpuRecord, keys: Iterable[str]) -> list[bytes]:
    return [orjson.dumps(key) + b":" + orjson.dumps(value) for key in keys
            if (value := getattr(rec, key)) is not None]


def line_pieces(rec: GpuRecord) -> LinePieces:
    """`record_to_line(rec)` cut where the kernel writes its times and values (the keys of its telemetry_data,
    in order; the values and times themselves are not read)."""
    identity, ours = _members(rec, _AIPERF_IDENTITY), _members(rec, _OURS[:-2])
    head = b"{" + b"".join(member + b"," for member in identity) + b'"timestamp_ns":'
    middle = b',"telemetry_source_url":' + orjson.dumps(rec.telemetry_source_url) + b',"telemetry_data":{'
    keys = tuple((b"," if k else b"") + orjson.dumps(key) + b":" for k, key in enumerate(rec.telemetry_data))
    tail = b"}," + b"".join(member + b"," for member in ours) + b'"scrape_start_ns":'
    end = b',"scrape_end_ns":' if rec.scrape_end_ns is not None else b""
    return head, middle, keys, tail, end


def line_program(records: Iterable[tuple[LinePieces, Sequence[int], Sequence[float]]]) -> LineProgram:
    """The line program of a plan's records: each one's pieces, and the sample position and scale of each value."""
    text: list[bytes] = []
    layout: list[int] = []
    scales: list[float] = []
    for (head, middle, keys, tail, end), positions, factors in records:
        text += (head, middle)
        layout += (len(keys), len(head), len(middle), len(tail), len(end))
        for key, position in zip(keys, positions, strict=True):
            text.append(key)
            layout += (len(key), position)
        text += (tail, end)
        scales += factors
    return b"".join(text), pack_ints(layout), array("d", scales).tobytes()


def dict_to_record(obj: Mapping[str, Any]) -> GpuRecord:
    """A record from a line of ours or AIPerf's (`dcgm_url` was `telemetry_source_url` before 0.12)."""
    data = obj.get("telemetry_data") or {}
    return GpuRecord(
        gpu_index=obj.get("gpu_index"),
        gpu_uuid=str(obj.get("gpu_uuid") or f"unknown:{obj.get('hostname') or ''}:{obj.get('gpu_index')}"),
        gpu_model_name=obj.get("gpu_model_name"),
        pci_bus_id=obj.get("pci_bus_id"),
        device=obj.get("device"),
        hostname=obj.get("hostname"),
        namespace=obj.get("namespace"),
        pod_name=obj.get("pod_name"),
        platform=obj.get("platform") or "nvidia",
        timestamp_ns=int(obj["timestamp_ns"]),
        telemetry_source_url=str(obj.get("telemetry_source_url") or obj.get("dcgm_url") or ""),
        telemetry_data={k: float(v) for k, v in data.items() if isinstance(v, int | float)},
        gpu_instance_id=obj.get("gpu_instance_id"),
        gpu_instance_profile=obj.get("gpu_instance_profile"),
        device_uuid=obj.get("device_uuid"),
        run_id=obj.get("run_id"),
        phase=obj.get("phase"),
        scrape_start_ns=obj.get("scrape_start_ns"),
        scrape_end_ns=obj.get("scrape_end_ns"),
    )


# A run of lines is parsed by one orjson call: ~35 lines of a 64-GPU log, few enough that the decoded dicts
# are freed while still in cache (runs of 1 MiB of lines were slower than one call per line). The file is
# read in pieces of the same size, for the same reason.
_BATCH_BYTES = 64 * 1024
# A record line is a few kB (64 MIG instances' worth is ~40 kB): a longer one is no record of ours or AIPerf's,
# and holding it whole would let one unterminated line (a file of NUL bytes) take the reader's memory.
MAX_LINE_BYTES = 1 << 20


class Digest(Protocol):
    """A hashlib object (`hashlib.sha256()`): what `line_batches` feeds the file's bytes to."""

    def update(self, data: bytes, /) -> None: ...


def line_batches(path: Path, errors: list[str] | None = None, digest: Digest | None = None) -> Iterator[bytes]:
    """Runs of complete lines, each ending with its newline, of about _BATCH_BYTES (a longer line is a run
    of its own); a trailing partial line is skipped.

    Linear in the bytes read, whatever they hold: each byte is copied a bounded number of times, and at most
    one line of MAX_LINE_BYTES is held. A longer line is skipped — given as an empty line, so the lines
    after it keep their numbers — and described in `errors` by its byte offset (and logged).

    `digest`, when given, is fed every byte of the file as stored (gzip included) as it is read, so the log's
    hash costs no second read; it holds the whole file once the batches are exhausted (a gzip stream that
    breaks off is read to the end of the file all the same)."""
    raw = _raw_chunks(path, digest)
    chunks = _gunzip_chunks(path, raw) if path.suffix == ".gz" else raw
    head: list[bytes] = []  # the current line's bytes so far (pieces without a newline)
    held = 0  # their length
    skipping = False  # the current line is past MAX_LINE_BYTES: dropped up to its newline
    offset = 0  # where the current chunk starts in the (decompressed) log
    for chunk in chunks:
        end = chunk.rfind(b"\n") + 1
        if end == 0:  # the current line goes on
            held += len(chunk)
            if not skipping and held > MAX_LINE_BYTES:
                skipping, head = True, []
            elif not skipping:
                head.append(chunk)
        else:
            first = chunk.find(b"\n") + 1
            if skipping or held + first > MAX_LINE_BYTES:
                _note_long_line(path, offset - held, held + first - 1, errors)
                data = b"\n" + chunk[first:end]
            elif head:
                data = b"".join((*head, memoryview(chunk)[:end]))
            else:
                data = chunk if end == len(chunk) else chunk[:end]
            skipping, head, held = False, ([chunk[end:]] if end < len(chunk) else []), len(chunk) - end
            yield from _runs(data)
        offset += len(chunk)
    for _ in raw:  # what is left after a broken gzip stream: no lines, but bytes of the file
        pass


def _runs(data: bytes) -> Iterator[bytes]:
    """`data` (whole lines) in runs of about _BATCH_BYTES, cut at newlines."""
    start, end = 0, len(data)
    while end - start > 2 * _BATCH_BYTES:
        cut = data.rfind(b"\n", start, start + _BATCH_BYTES) + 1
        if cut <= start:
            cut = data.find(b"\n", start + _BATCH_BYTES) + 1
        yield data[start:cut]
        start = cut
    if end > start:
        yield data[start:end] if start else data


def _note_long_line(path: Path, start: int, size: int, errors: list[str] | None) -> None:
    message = (f"{path}: the line at byte {start:,} has {size:,} bytes (over {MAX_LINE_BYTES:,}): no record; "
               "skipped")
    if errors is not None:
        errors.append(message)
    logger.warning("%s", message)


def _raw_chunks(path: Path, digest: Digest | None = None) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_BATCH_BYTES):
            if digest is not None:
                digest.update(chunk)
            yield chunk


def _gunzip_chunks(path: Path, raw: Iterator[bytes]) -> Iterator[bytes]:
    """Decompress every gzip member (each writer session appends one) of the file's `raw` chunks, in pieces of
    at most _BATCH_BYTES (a small piece of a compressed run of zeros is megabytes); a stream cut short by a
    kill yields everything that was sync-flushed before the cut."""
    decoder = zlib.decompressobj(wbits=31)
    for chunk in raw:
        while chunk:
            try:
                piece = decoder.decompress(chunk, _BATCH_BYTES)
            except zlib.error:
                logger.warning("%s: corrupt gzip data; reading stopped there", path)
                return
            if piece:
                yield piece
            if decoder.eof:  # the member ended; the next one starts in `unused_data` (looked at before the tail:
                # a call cut short by the size limit leaves that input in `unconsumed_tail` too, read again forever)
                chunk = decoder.unused_data
                decoder = zlib.decompressobj(wbits=31)
            elif decoder.unconsumed_tail:
                chunk = decoder.unconsumed_tail
            else:
                break
    try:
        rest = decoder.flush()  # what the last call held back (a stream cut short: as far as it goes)
    except zlib.error:
        return
    if rest:
        yield rest


def read_dict_batches(path: Path, errors: list[str] | None = None,
                      digest: Digest | None = None) -> Iterator[list[dict[str, Any]]]:
    """The JSON objects of a log's lines (as `read_dicts`), a list per run of lines (`dicts_of_lines`); `digest`
    as `line_batches`'."""
    number = 0  # lines before this run
    for batch in line_batches(path, errors, digest):
        yield dicts_of_lines(batch, number, path, errors)
        number += batch.count(b"\n")


def dicts_of_lines(batch: bytes, number: int, path: Path, errors: list[str] | None) -> list[dict[str, Any]]:
    """The JSON objects of a run of whole lines (each ending with its newline; `number` lines before it).

    A run of n lines is parsed as one JSON array, its newlines turned into `,0,\n`, when it holds no `[`. A
    line boundary then cannot fall inside a value: inside an object a comma must be followed by a key (not
    `0`), a string cannot hold a raw newline, and the only array is the outer one. So every line holds whole
    top-level values, at least one (an empty line gives `,,`), and 2n - 1 values mean exactly one per line,
    the line's own. Otherwise (a bad line, an empty one, an array anywhere) the run is read line by line:
    the same values and the same error messages either way.
    """
    joined = batch.replace(b"\n", b",0,\n")
    lines = (len(joined) - len(batch)) // 3
    values: list[Any] | None = None
    if b"[" not in batch:
        try:
            values = orjson.loads(b"".join((b"[", memoryview(joined)[:-4], b"]")))  # (without the last ",0,\n")
        except orjson.JSONDecodeError:
            values = None
    if values is not None and len(values) == 2 * lines - 1:
        return [value for value in values[::2] if isinstance(value, dict)]
    return _line_by_line(batch[:-1], number, path, errors)


def _line_by_line(body: bytes, number: int, path: Path, errors: list[str] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line_number, line in enumerate(body.split(b"\n"), number + 1):
        if not line:
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if errors is not None:
                errors.append(f"{path}:{line_number}: not JSON ({exc})")
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def read_dicts(path: Path, errors: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """The JSON object on each line of a log (plain or .gz); a line that is not JSON is skipped and described
    in `errors` (`<path>:<line>: not JSON (...)`), one that holds another JSON value is skipped."""
    for batch in read_dict_batches(path, errors):
        yield from batch


def read_records(path: Path, errors: list[str] | None = None) -> Iterator[GpuRecord]:
    """Records of our record log or AIPerf's own gpu_telemetry_export.jsonl (plain or .gz)."""
    for number, obj in enumerate(read_dicts(path, errors), 1):
        try:
            yield dict_to_record(obj)
        except (KeyError, TypeError, ValueError) as exc:
            if errors is not None:
                errors.append(f"{path}: record {number}: {exc!r}")


class LineWriter:
    """Buffered, thread-safe appender of whole JSON lines with a bounded buffer.

    `write` never raises: when the disk refuses a flush, the lines stay buffered (bounded by
    `max_buffered_bytes`; beyond it the oldest are dropped and counted) and the error is kept in
    `last_error` for the status and the report, so a full disk never stops collection. A flush writes in
    chunks of whole lines, so a disk with a little room again takes what fits instead of nothing until the whole
    backlog does. With `flush_interval_s` > 0 a background thread flushes what waits longer than that, so a
    kill loses at most that much even when no new line comes (every endpoint down).
    """

    CHUNK_BYTES = 1 << 20

    def __init__(self, path: Path, *, flush_interval_s: float = 1.0, max_buffered_bytes: int = 32 << 20,
                 opener: Callable[[Path], IO[bytes]] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.flush_interval_s = flush_interval_s
        self.max_buffered_bytes = max_buffered_bytes
        self._opener = opener or _open_append
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._buffer: deque[bytes] = deque()
        self._counts: deque[int] = deque()  # the lines in each piece of the buffer
        self._buffered_bytes = 0
        self._file: IO[bytes] | None = None
        self._last_flush = monotonic()
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        self.lines_written = 0
        self.lines_dropped = 0
        self.last_error: str | None = None
        self._closed = False  # after close(): a late line (a scrape that ended after completion) is written
        # and its file closed again at once, never left open to be collected by the garbage collector

    def write_lines(self, lines: Iterable[bytes]) -> None:
        with self._lock:
            for line in lines:
                self._buffer.append(line)
                self._counts.append(1)
                self._buffered_bytes += len(line)
            self._after_write_locked()

    def write_block(self, block: bytes, lines: int | None = None) -> None:
        """Whole lines already joined (each ending in a newline): the kernel's record lines of a page, buffered
        as one piece and counted as the `lines` they are (counted here when not given)."""
        if block:
            with self._lock:
                self._buffer.append(block)
                self._counts.append(block.count(b"\n") if lines is None else lines)
                self._buffered_bytes += len(block)
                self._after_write_locked()

    def _after_write_locked(self) -> None:
        """The buffer's bound, then a flush when one is due (or a background flusher to make it due)."""
        while self._buffered_bytes > self.max_buffered_bytes and len(self._buffer) > 1:
            self._buffered_bytes -= len(self._buffer.popleft())
            self.lines_dropped += self._counts.popleft()
        if self._closed or self._monotonic() - self._last_flush >= self.flush_interval_s:
            self._flush_locked()
        elif self._flusher is None and self.flush_interval_s > 0:
            self._flusher = threading.Thread(target=self._flush_when_due, name=f"flush {self.path.name}",
                                             daemon=True)
            self._flusher.start()

    def write_records(self, records: Iterable[GpuRecord]) -> None:
        self.write_lines(record_to_line(r) for r in records)

    def write_event(self, event: Event) -> None:
        self.write_lines([event_to_line(event)])

    def pending(self) -> list[bytes]:
        """Lines not written yet (the disk refused them): what the report still needs."""
        with self._lock:
            return [line for piece in self._buffer for line in piece.splitlines(keepends=True)]

    def flush(self) -> bool:
        """Write everything buffered; False (with `last_error`) when the disk refused it."""
        with self._lock:
            return self._flush_locked()

    def close(self) -> bool:
        self._stop.set()
        with self._lock:
            self._closed = True
            return self._flush_locked()

    def _flush_when_due(self) -> None:
        """The background flusher: lines that waited a whole interval are written even if no new line comes. It
        sleeps until the last flush is an interval old when lines wait, else an interval (a line buffered meanwhile
        came after the last flush, so it is due no later than that): one wake-up an interval, and no line waits
        longer than one."""
        interval = self.flush_interval_s
        while True:
            with self._lock:
                due = self._last_flush + interval if self._buffer else None
            wait = interval if due is None else max(0.0, due - self._monotonic())
            if self._stop.wait(wait):
                return
            with self._lock:
                if self._buffer and self._monotonic() - self._last_flush >= interval:
                    self._flush_locked()

    def _close_file_locked(self) -> bool:
        if self._file is None:
            return True
        try:
            self._file.close()
        except OSError as exc:
            return self._fail(exc)
        finally:
            self._file = None
        return True

    def _flush_locked(self) -> bool:
        ok = self._write_buffer_locked()
        if self._closed:
            ok = self._close_file_locked() and ok
        return ok

    def _write_buffer_locked(self) -> bool:
        self._last_flush = self._monotonic()
        while self._buffer:
            count, size = 0, 0
            for line in self._buffer:  # whole lines, about CHUNK_BYTES at a time
                if count and size + len(line) > self.CHUNK_BYTES:
                    break
                count, size = count + 1, size + len(line)
            parts = list(islice(self._buffer, count))
            start: int | None = None
            try:
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._file = self._opener(self.path)
                start = _position(self._file)
                _write_parts(self._file, parts)
                self._file.flush()
            except OSError as exc:
                if start is not None and self._file is not None:
                    self._rollback(self._file, start)
                return self._fail(exc)
            lines = 0
            for _ in range(count):
                self._buffer.popleft()
                lines += self._counts.popleft()
            self._buffered_bytes -= size
            self.lines_written += lines
        self.last_error = None
        return True

    def _rollback(self, file: IO[bytes], start: int) -> None:
        """A disk that fills up mid-write leaves part of the chunk: cut the file back to its last whole line,
        so it never holds half a line (the lines stay buffered and are written again)."""
        try:
            file.truncate(start)
        except (OSError, ValueError) as exc:
            logger.warning("%s: could not cut a partial write back (%s); readers skip a final partial line",
                           self.path, exc)

    def _fail(self, exc: OSError) -> bool:
        message = f"cannot write {self.path}: {exc.strerror or exc}"
        if message != self.last_error:
            logger.error("%s; keeping %d lines in memory and retrying at the next flush", message,
                         len(self._buffer))
        self.last_error = message
        return False


def _position(file: IO[bytes]) -> int | None:
    """Where the next write lands: the end (an append-mode file's tell() is stale after a truncate)."""
    try:
        return file.seek(0, os.SEEK_END)
    except (OSError, ValueError, AttributeError):
        return None


def _write_all(file: IO[bytes], data: bytes) -> None:
    """write() until all is written: a raw file may take part of a chunk (a disk filling up does that)."""
    view = memoryview(data)
    while view:
        written = file.write(view)
        if written is None or written >= len(view):
            return
        if written <= 0:
            raise OSError(errno.ENOSPC, "the write made no progress")
        view = view[written:]


def _write_parts(file: IO[bytes], parts: list[bytes]) -> None:
    """`_write_all` of the parts joined; a plain file takes them in one writev, not copied into one buffer first
    (a second's pages are ~300 KB, cold by the time they are flushed)."""
    if not isinstance(file, io.FileIO) or len(parts) == 1:
        _write_all(file, parts[0] if len(parts) == 1 else b"".join(parts))
        return
    fd = file.fileno()
    views = [memoryview(part) for part in parts]
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        if written <= 0:
            raise OSError(errno.ENOSPC, "the write made no progress")
        advance(views, written)


_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16


class _SyncGzip:
    """One gzip member per writer session, every flush a Z_SYNC_FLUSH: a reader sees all flushed lines.

    Written with zlib directly so that a failed flush can be undone: the raw file is cut back to where the
    flush began and the compressor restored from its copy, so the stream stays valid (see LineWriter)."""

    def __init__(self, path: Path) -> None:
        self._raw = open(path, "ab", buffering=0, opener=_no_follow)  # noqa: SIM115 - owned by this object
        # Level 1: ~4x less CPU than gzip's default 9 for a log that compresses ~6x either way.
        self._zip = zlib.compressobj(1, zlib.DEFLATED, 31)
        self._saved = self._zip.copy()
        self._pending: list[bytes] = []
        self._size = 0  # uncompressed bytes in this member

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Only `seek(0, SEEK_END)`, as LineWriter asks before a flush: also keeps the compressor's state."""
        self._saved = self._zip.copy()
        return self._raw.seek(offset, whence)

    def truncate(self, size: int) -> int:
        self._raw.truncate(size)
        self._zip = self._saved.copy()
        self._pending.clear()
        return size

    def write(self, data: bytes | memoryview) -> int:
        self._pending.append(self._zip.compress(data))
        return len(data)

    def flush(self) -> None:
        self._pending.append(self._zip.flush(zlib.Z_SYNC_FLUSH))
        data, self._pending = b"".join(self._pending), []
        _write_all(self._raw, data)

    def close(self) -> None:
        try:
            _write_all(self._raw, self._zip.flush(zlib.Z_FINISH))
        finally:
            self._raw.close()


def _open_append(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return cast(IO[bytes], _SyncGzip(path))
    return open(path, "ab", buffering=0, opener=_no_follow)  # noqa: SIM115 - owned by LineWriter


def _no_follow(path: str, flags: int) -> int:
    """A link planted under a log's name is refused (ELOOP), never written through (issue 28)."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)
