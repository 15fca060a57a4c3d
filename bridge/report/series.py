"""Records → one time-sorted series per (endpoint, GPU identity): an int64 timestamp array and one
float64 array per report key (NaN where a record did not carry the key).

Streaming: a record is one row of float64 values appended to its series (one `struct.pack`), never a dict
kept per record, so a one-hour 64-GPU log at 3 Hz (~700k records) is ~220 MB of rows. Records may arrive
out of time order; `finish()` sorts each series once (stable, so equal timestamps keep arrival order). Every
record is a sample, including one whose values did not change since the previous scrape: repeated values
are real observations (AIPerf drops byte-identical bodies: AIPerf 0.13.0, ai-dynamo/aiperf 
`src/aiperf/common/mixins/base_metrics_collector_mixin.py`).
"""

from __future__ import annotations

import mmap
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from bridge import kernel
from bridge.endpoints import display_key
from bridge.record_log import Digest, dict_to_record, dicts_of_lines, line_batches, read_dict_batches
from bridge.samples import GpuRecord

# A line shape the kernel reads (bridge/_kernel.c `scan_lines`): its literal segments, the token of each of
# its series' columns, its timestamp's token, and the rows and times read since the last hand-over.
LineTarget = tuple[tuple[bytes, ...], tuple[int, ...], int, bytearray, bytearray]
_MAX_SHAPES = 8  # lines of a series given (or refused) a shape before the series stops trying
# A record's `scrape_end_ns` rides in its series' rows as one more column under this name (no telemetry key starts
# with a NUL), and leaves them as `Series.ends`.
END_COLUMN = "\x00scrape_end_ns"

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

# Keys of AIPerf logs written before 0.13 (TelemetryMetrics validation_alias in ai-dynamo/aiperf
# `src/aiperf/common/models/telemetry_models.py`).
LEGACY_ALIASES: Mapping[str, str] = {
    "gpu_power_usage": "nvidia_power_usage",
    "energy_consumption": "nvidia_energy_consumption",
    "gpu_utilization": "nvidia_gpu_utilization",
    "mem_utilization": "nvidia_memory_utilization",
    "gpu_memory_used": "nvidia_memory_used",
    "gpu_temperature": "nvidia_temperature",
    "sm_utilization": "nvidia_sm_utilization",
    "decoder_utilization": "nvidia_decoder_utilization",
    "encoder_utilization": "nvidia_encoder_utilization",
    "jpg_utilization": "nvidia_jpg_utilization",
    "xid_errors": "nvidia_xid_errors",
    "power_violation": "nvidia_power_violation",
}


@dataclass(frozen=True, slots=True)
class GpuMeta:
    """A GPU identity's labels: the first record's, with fields it lacked filled from later records."""

    gpu_index: int | None
    gpu_uuid: str
    gpu_name: str | None
    pci_bus_id: str | None
    device: str | None
    hostname: str | None
    namespace: str | None
    pod_name: str | None
    platform: str
    gpu_instance_id: str | None
    gpu_instance_profile: str | None
    device_uuid: str | None = None  # bridge/samples.py GpuMeta.device_uuid

    @property
    def identity(self) -> tuple[str, str | None]:
        return (self.gpu_uuid, self.gpu_instance_id)


@dataclass(frozen=True, slots=True)
class Series:
    endpoint: str  # display key (host:port[/path], no scheme, no userinfo)
    source_url: str  # the first record's telemetry_source_url
    meta: GpuMeta
    timestamps: NDArray[np.int64]  # sorted
    values: Mapping[str, NDArray[np.float64]]  # report key -> values aligned with timestamps, NaN = absent
    # When each scrape was complete (`scrape_end_ns`; its start where a record lacks it; never before an earlier
    # scrape's), aligned with timestamps: a value is read between its scrape's start and its end. None: no record
    # carried one (AIPerf's logs).
    ends: NDArray[np.int64] | None = None

    def __len__(self) -> int:
        return int(self.timestamps.size)

    def matrix(self, keys: Sequence[str], out: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
        """The columns of `keys` as the rows of one C-contiguous matrix (keys × records), in `out` if given, for
        statistics over many columns at once (transient: a 1-hour series is ~3.5 MB). (np.take into `out` was
        5x slower: it first copies the whole transposed block.)"""
        import numpy as np

        if out is None:
            out = np.empty((len(keys), len(self)), dtype=np.float64)
        for row, key in enumerate(keys):
            np.copyto(out[row], self.values[key])
        return out


_FIRST_BYTES = 64 * 1024  # a series' first row buffer: ~200 records of 40 keys
_FILLABLE = ("gpu_model_name", "pci_bus_id", "device", "hostname", "namespace", "pod_name", "gpu_instance_profile",
             "device_uuid")


def _values_of(keys: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The values of `keys` in that order, as a tuple (KeyError when a key is missing)."""
    if len(keys) > 1:
        return itemgetter(*keys)
    if keys:
        key = keys[0]
        return lambda data: (data[key],)
    return lambda data: ()


class SeriesRows:
    """One series being collected: a record is a row of float64 values and an int64 time. Rows sit in blocks
    of consecutive records carrying the same keys; a GPU's records nearly always do, so a run is one block.
    `finish`/`series` turn the rows into columns without copying them.

    The rows are written (`struct.pack_into`) into an anonymous memory map that doubles in place when full,
    so each page is touched once, when written, where a bytearray grown by `+=` touches several times its
    final size as it is reallocated (as costly as packing the row: bench/NOTES.md).
    """

    __slots__ = ("url", "first", "filled", "missing", "ts", "buf", "used", "taken", "blocks", "keys", "width",
                 "values_of", "pack", "pack_into", "stride")

    def __init__(self, first: GpuRecord) -> None:
        self.url = first.telemetry_source_url
        self.first = first
        self.filled: dict[str, Any] = {}
        self.missing = [name for name in _FILLABLE if getattr(first, name) is None]
        self.ts: array[int] = array("q")
        self.buf = mmap.mmap(-1, _FIRST_BYTES, flags=mmap.MAP_PRIVATE)
        self.used = 0  # bytes of rows in `buf`
        self.taken = 0  # records handed over by `take` before those in `ts` and `buf`
        self.blocks: list[tuple[tuple[str, ...], int]] = []  # (keys, index of the block's first record)
        self.keys: tuple[str, ...] = ()
        self.width = -1  # no block yet
        self._set_keys(())

    def _set_keys(self, keys: tuple[str, ...]) -> None:
        row = struct.Struct(f"={len(keys)}d")
        self.keys, self.width, self.stride = keys, len(keys), row.size
        self.values_of = _values_of(keys)
        self.pack, self.pack_into = row.pack, row.pack_into

    def add(self, t_ns: int, data: Mapping[str, Any]) -> None:
        """One record. Numbers only, as AIPerf's reader (a bool is 1.0, as pydantic makes it): any other
        value leaves its slot NaN. Raises OverflowError/TypeError (and changes nothing) for a time that is
        not an int64 or a number beyond float64."""
        keys: tuple[str, ...] | None = None
        try:
            if len(data) != self.width:
                raise KeyError
            packed = self.pack(*self.values_of(data))
        except (KeyError, TypeError, OverflowError, struct.error):
            numbers = {k: v for k, v in data.items() if isinstance(v, int | float)}
            keys = tuple(numbers)
            packed = struct.pack(f"={len(keys)}d", *numbers.values())
        self.ts.append(t_ns)
        if keys is not None and (keys != self.keys or not self.blocks):
            self.blocks.append((keys, self.taken + len(self.ts) - 1))
            self._set_keys(keys)
        self.append(packed)

    def add_row(self, t_ns: int, keys: tuple[str, ...], row: bytes | memoryview) -> None:
        """One record given as its keys and its values packed as native float64 in that order (the kernel's
        rows): what `add` does with a record whose data holds exactly those keys."""
        self.ts.append(t_ns)
        if (keys is not self.keys and keys != self.keys) or not self.blocks:  # (a plan's rows: the same tuple)
            if len(keys) == self.width and self.blocks and set(keys) == set(self.keys):
                row = self.pack(*map(dict(zip(keys, memoryview(row).cast("d"), strict=True)).__getitem__, self.keys))
            else:
                self.blocks.append((keys, self.taken + len(self.ts) - 1))
                self._set_keys(keys)
        self.append(row)

    def add_rows(self, ts: Sequence[int], keys: tuple[str, ...], rows: bytes | memoryview) -> None:
        """`add_row` for several records of the same keys at once: their times and their rows one after the
        other (the live series hands out an endpoint's pages of one plan this way)."""
        if (keys is self.keys or keys == self.keys) and self.blocks:
            self.ts.extend(ts)
            self.append(rows)
            return
        width = 8 * len(keys)
        view = memoryview(rows)
        for k, t_ns in enumerate(ts):
            self.add_row(t_ns, keys, view[k * width: (k + 1) * width])

    def append(self, rows: bytes | bytearray | memoryview) -> None:
        """Rows already packed as native float64 in the current block's key order, after the ones held."""
        size = len(rows)
        self.reserve(size)
        self.buf[self.used: self.used + size] = rows
        self.used += size

    def reserve(self, size: int) -> None:
        """Room for `size` more bytes of rows: the map doubles in place (mremap moves page tables, copies
        nothing), or into a copy while series made by `finish` still use it."""
        if self.used + size <= len(self.buf):
            return
        capacity = max(2 * len(self.buf), self.used + size)
        try:
            self.buf.resize(capacity)
        except BufferError:
            grown = mmap.mmap(-1, capacity, flags=mmap.MAP_PRIVATE)
            grown[: self.used] = memoryview(self.buf)[: self.used]
            self.buf = grown  # (the old map lives on as long as those series)

    def rows(self) -> memoryview:
        """The rows added since the last `take` (valid until the next `add`)."""
        return memoryview(self.buf)[: self.used]

    def take(self) -> None:
        """Forget the times and rows added so far, which the caller has kept elsewhere (the sidecar spools
        them to disk); `series` then needs all of them back, in order."""
        self.taken += len(self.ts)
        self.ts = array("q")
        if self.used:  # the map's pages go back to the system until rows fill them again (issue 48: RSS is what a
            self.buf.madvise(mmap.MADV_DONTNEED)  # series holds now, not the most it ever held)
        self.used = 0

    def fill(self, get: Callable[[str], Any]) -> None:
        for name in list(self.missing):
            value = get(name)
            if value is not None:
                self.filled[name] = value
                self.missing.remove(name)

    def meta(self) -> GpuMeta:
        first = self.first

        def pick(name: str) -> Any:
            value = getattr(first, name)
            return value if value is not None else self.filled.get(name)

        return GpuMeta(first.gpu_index, first.gpu_uuid, pick("gpu_model_name"), pick("pci_bus_id"), pick("device"),
                       pick("hostname"), pick("namespace"), pick("pod_name"), first.platform, first.gpu_instance_id,
                       pick("gpu_instance_profile"), pick("device_uuid"))

    def finish(self, endpoint: str) -> Series:
        """The series over the rows in memory (views of them; more records may still be added later), for a
        series whose rows were never handed over by `take`."""
        import numpy as np

        return self.series(endpoint, np.frombuffer(self.ts, dtype=np.int64).copy(),
                           np.frombuffer(self.buf, dtype=np.float64, count=self.used // 8))

    def series(self, endpoint: str, ts: NDArray[np.int64], rows: NDArray[np.float64]) -> Series:
        """The series over `ts` and the flat `rows` (every record of this series, in the order added): one
        column per key, a strided view of the rows when one block holds them all, NaN where a record lacked
        the key."""
        import numpy as np

        count = int(ts.size)
        values: dict[str, NDArray[np.float64]] = {}
        offset = 0
        bounds = [at for _, at in self.blocks[1:]] + [count]
        for (keys, at), until in zip(self.blocks, bounds, strict=True):
            n = until - at
            block = rows[offset: offset + n * len(keys)].reshape(n, len(keys))
            offset += n * len(keys)
            if n == count:
                values = {key: block[:, k] for k, key in enumerate(keys)}
                continue
            for k, key in enumerate(keys):
                column = values.get(key)
                if column is None:
                    column = values[key] = np.full(count, np.nan)
                column[at:until] = block[:, k]
        values = _merge_aliases(values)
        ended = values.pop(END_COLUMN, None)
        if ts.size > 1 and bool(np.any(ts[1:] < ts[:-1])):
            order = np.argsort(ts, kind="stable")
            ts = ts[order]
            values = {key: col[order] for key, col in values.items()}
            ended = None if ended is None else ended[order]
        ends = None
        if ended is not None:  # (float64 holds the ns to within 256)
            ends = _scrape_ends(ts, ended)
        return Series(endpoint, self.url, self.meta(), ts, values, ends)


def _scrape_ends(ts: NDArray[np.int64], ended: NDArray[np.float64]) -> NDArray[np.int64]:
    """Each scrape's end as the records give it, never before its start (its start where a record gave none), and
    never before an earlier scrape's end: each value was read before its own end, so before every later one."""
    import numpy as np

    with np.errstate(invalid="ignore"):  # (an end past int64's range: as late as it goes)
        within = np.clip(np.nan_to_num(ended, nan=-1.0), ts.astype(np.float64), float(np.iinfo(np.int64).max // 2))
    return np.maximum.accumulate(np.maximum(within.astype(np.int64), ts))


def with_end(data: Mapping[str, Any], end: object) -> Mapping[str, Any]:
    """A record's values and its scrape's end among them (`END_COLUMN`), where it has one."""
    return data if end is None else {**data, END_COLUMN: end}


def _merge_aliases(values: dict[str, NDArray[np.float64]]) -> dict[str, NDArray[np.float64]]:
    import numpy as np

    if not any(key in LEGACY_ALIASES for key in values):
        return values
    out: dict[str, NDArray[np.float64]] = {}
    for key, col in values.items():
        target = LEGACY_ALIASES.get(key, key)
        if target in out:
            out[target] = np.where(np.isnan(out[target]), col, out[target])
        else:
            out[target] = col
    return out


def endpoint_of(cache: dict[str, str], url: str) -> str:
    """A record's endpoint key (its source URL's display key), memoised per URL in `cache`."""
    endpoint = cache.get(url)
    if endpoint is None:
        endpoint = cache[url] = display_key(url) if url else "unknown"
    return endpoint


class SeriesAccumulator:
    """Feed records (in any order) with `add`, or a whole record log with `add_path`; `finish()` sorts.

    Series are keyed by (display key of the source URL, GPU UUID, MIG GPU instance id): never by index.
    `finish` does not consume it: more records can follow, and `finish` again gives every series.
    """

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str, str | None], SeriesRows] = {}
        self._display: dict[str, str] = {}
        # (telemetry_source_url, gpu_uuid, gpu_instance_id) as a line carries them -> its series: the
        # reader's shortcut past the key resolution for lines in our own format.
        self._as_read: dict[tuple[Any, Any, Any], SeriesRows] = {}
        self._run_ids: dict[str, None] = {}

    @property
    def records(self) -> int:
        return sum(len(rows.ts) for rows in self._rows.values())

    @property
    def run_ids(self) -> list[str]:
        """The run ids of the lines read (a JSON object's `run_id` string; the records' `run_id`), in the order
        they first appear: the last is the newest run appended to a log."""
        return list(self._run_ids)

    def add(self, record: GpuRecord) -> None:
        key = (endpoint_of(self._display, record.telemetry_source_url), record.gpu_uuid, record.gpu_instance_id)
        rows = self._rows.get(key) or SeriesRows(record)
        rows.add(record.timestamp_ns, with_end(record.telemetry_data, record.scrape_end_ns))
        if record.run_id is not None:
            self._run_ids.setdefault(record.run_id, None)
        self._rows[key] = rows  # (a new series only once it holds its first record)
        if rows.missing:
            rows.fill(partial(getattr, record))

    def add_all(self, records: Iterable[GpuRecord]) -> SeriesAccumulator:
        add = self.add
        for record in records:
            add(record)
        return self

    def add_dict(self, obj: Mapping[str, Any]) -> None:
        """A decoded log line (ours or AIPerf's), read as `record_log.dict_to_record` would read it.

        Raises KeyError/TypeError/ValueError/OverflowError for a line that is not a record.
        """
        data = obj.get("telemetry_data") or {}
        if not isinstance(data, Mapping):
            raise TypeError(f"telemetry_data is a {type(data).__name__}, not an object")
        t_ns = int(obj["timestamp_ns"])
        url = obj.get("telemetry_source_url") or obj.get("dcgm_url") or ""
        uuid = obj.get("gpu_uuid") or dict_to_record(obj).gpu_uuid
        key = (endpoint_of(self._display, str(url)), str(uuid), obj.get("gpu_instance_id"))
        rows = self._rows.get(key) or SeriesRows(dict_to_record(obj))
        rows.add(t_ns, with_end(data, obj.get("scrape_end_ns")))
        self._rows[key] = rows  # (a new series only once it holds its first record)
        if rows.missing:
            rows.fill(obj.get)
        as_read = (obj.get("telemetry_source_url"), obj.get("gpu_uuid"), obj.get("gpu_instance_id"))
        if isinstance(as_read[0], str) and as_read[0] and isinstance(as_read[1], str) and as_read[1]:
            self._as_read[as_read] = rows  # the same key as above, whatever else the line carries

    def add_path(self, path: Path, errors: list[str] | None = None, digest: Digest | None = None
                 ) -> SeriesAccumulator:
        """Every record of a record log (plain or .gz, ours or AIPerf's); unreadable lines are skipped and
        described in `errors`; `digest` is fed the file's bytes as they are read (`record_log.line_batches`).

        With the compiled kernel, a line whose shape (its text around its numbers) is one this reader has
        seen is read straight into its series' rows (`_add_path_compiled`); any other line, and every line
        without the kernel, is decoded by orjson and taken by `_add_objs`.
        """
        if kernel.running():  # (the compiled kernel: lines of a known shape straight to rows)
            return self._add_path_compiled(path, errors, digest)
        number = 0  # records (JSON objects) before this batch
        for batch in read_dict_batches(path, errors, digest):
            self._add_objs(batch, number, path, errors)
            number += len(batch)
        return self

    def _add_objs(self, batch: list[dict[str, Any]], number: int, path: Path,
                  errors: list[str] | None) -> list[SeriesRows | None]:
        """Decoded lines (`number` records before them), each added to its series; the series each went to.

        A line in our format whose series and key set are already known is one row: its values taken in the
        block's key order and written as float64 into the series' rows; any other line goes through
        `add_dict`. (A failed write leaves the rows as they were: they only count once `used` moves on.)
        Every line's run id is noted, whether or not it is a record.
        """
        for obj in batch:
            run_id = obj.get("run_id")
            if isinstance(run_id, str):
                self._run_ids.setdefault(run_id, None)
        as_read = self._as_read
        add_dict = self.add_dict
        went: list[SeriesRows | None] = []
        for obj in batch:
            try:
                rows = as_read[obj.get("telemetry_source_url"), obj.get("gpu_uuid"), obj.get("gpu_instance_id")]
                data = with_end(obj["telemetry_data"], obj.get("scrape_end_ns"))
                if len(data) != rows.width:
                    raise KeyError
                # (struct.error too when the buffer is full: `add_dict` makes room)
                rows.pack_into(rows.buf, rows.used, *rows.values_of(data))
                rows.ts.append(obj["timestamp_ns"])
            except (KeyError, TypeError, OverflowError, struct.error):
                try:
                    add_dict(obj)
                except (KeyError, TypeError, ValueError, OverflowError) as exc:
                    if errors is not None:
                        at = next(i for i, o in enumerate(batch) if o is obj)
                        errors.append(f"{path}: record {number + at + 1}: {exc!r}")
                    went.append(None)
                    continue
                key = (obj.get("telemetry_source_url"), obj.get("gpu_uuid"), obj.get("gpu_instance_id"))
                went.append(as_read.get(key))
                continue
            rows.used += rows.stride
            if rows.missing:
                rows.fill(obj.get)
            went.append(rows)
        return went

    def _add_path_compiled(self, path: Path, errors: list[str] | None, digest: Digest | None) -> SeriesAccumulator:
        """`add_path` with the kernel: each batch of lines is read by `scan_lines` while its lines have a
        registered shape; from the first line that has none, the rest of the batch is decoded and taken as
        without the kernel, and its lines in our own format (`orjson.dumps` of the decoded line gives the
        line back) register their shapes for the batches after. Rows read by the kernel are handed to their
        series before any decoded line is taken, so every series keeps its lines' order. A shape's text
        outside its numbers is literal, run id included: a line the kernel takes carries the run id of the
        decoded line that registered its shape, already noted."""
        shapes: dict[int, list[LineTarget]] = {}
        targets: list[tuple[LineTarget, SeriesRows, tuple[str, ...]]] = []
        tries: dict[SeriesRows, int] = {}  # series rows (by identity; held here) -> lines given (or refused) a shape
        lines = records = 0  # before this batch
        for batch in line_batches(path, errors, digest):
            position, taken = kernel.scan_lines(batch, 0, shapes)
            records += taken
            lines += taken  # (a taken line is one line)
            if position < len(batch):
                _hand_over(targets)
                rest = batch[position:]
                objs = dicts_of_lines(rest, lines, path, errors)
                went = self._add_objs(objs, records, path, errors)
                records += len(objs)
                raw = rest.split(b"\n")[:-1]
                if len(raw) == len(objs):  # every line one object: each decoded line beside its text
                    for line, obj, rows in zip(raw, objs, went, strict=True):
                        if rows is not None and tries.get(rows, 0) < _MAX_SHAPES:
                            tries[rows] = tries.get(rows, 0) + 1
                            _register(line, obj, rows, shapes, targets)
                _drop_stale(shapes, targets)
                lines += rest.count(b"\n")
        _hand_over(targets)
        return self

    def endpoints(self) -> list[str]:
        """Display keys in order of first appearance."""
        return list(dict.fromkeys(key[0] for key in self._rows))

    def finish(self) -> list[Series]:
        return [rows.finish(key[0]) for key, rows in self._rows.items()]


def _register(line: bytes, obj: dict[str, Any], rows: SeriesRows, shapes: dict[int, list[LineTarget]],
              targets: list[tuple[LineTarget, SeriesRows, tuple[str, ...]]]) -> bool:
    """Give the kernel the shape of a line just taken into `rows`, when the line is in our own format (orjson's
    bytes of the decoded object: no duplicate key, no white space, numbers as orjson writes them) and every
    value of its telemetry_data is a number: its tokens are then the object's numbers in document order."""
    data = obj.get("telemetry_data")
    if not isinstance(data, dict) or set(with_end(data, obj.get("scrape_end_ns"))) != set(rows.keys) \
            or len(data) + (obj.get("scrape_end_ns") is not None) != rows.width:
        return False
    if orjson.dumps(obj) != line:
        return False
    shape = kernel.line_shape(line)
    if shape is None:
        return False
    key, segments, tokens = shape
    numbers: list[tuple[str, str | None, Any]] = []
    for top, value in obj.items():
        for sub, item in (value.items() if isinstance(value, dict) else [(None, value)]):
            if isinstance(item, dict | list):
                return False  # (deeper objects: none in a record; not worth following)
            if isinstance(item, int | float) and not isinstance(item, bool):
                numbers.append((top, sub, item))
    if len(numbers) != len(tokens) or any(float(n) != float(t) for (*_, n), t in zip(numbers, tokens, strict=True)):
        return False
    slot = {(top, sub): k for k, (top, sub, _) in enumerate(numbers)}
    ts_slot = slot.get(("timestamp_ns", None))
    where = {name: ("telemetry_data", name) for name in rows.keys} | {END_COLUMN: ("scrape_end_ns", None)}
    if ts_slot is None or not isinstance(obj["timestamp_ns"], int) or any(
            where[name] not in slot for name in rows.keys):
        return False
    columns = tuple(slot[where[name]] for name in rows.keys)
    known = shapes.setdefault(key, [])
    if any(t[0] == segments and t[1] == columns and t[2] == ts_slot for t in known):
        return True
    target: LineTarget = (segments, columns, ts_slot, bytearray(), bytearray())
    known.append(target)
    targets.append((target, rows, rows.keys))
    return True


def _hand_over(targets: list[tuple[LineTarget, SeriesRows, tuple[str, ...]]]) -> None:
    """The rows and times the kernel read, appended to their series (as `add_path`'s own row would be)."""
    for (_, _, _, out, times), rows, _keys in targets:
        if out:
            rows.append(out)
            rows.ts.frombytes(times)
            del out[:], times[:]


def _drop_stale(shapes: dict[int, list[LineTarget]], targets: list[tuple[LineTarget, SeriesRows, tuple[str, ...]]]
                ) -> None:
    """A series whose key set changed (a new block) no longer takes rows in its old shapes' column order."""
    stale = [target for target, rows, keys in targets if rows.keys is not keys]
    if not stale:
        return
    targets[:] = [entry for entry in targets if entry[1].keys is entry[2]]
    for key in list(shapes):
        shapes[key] = [t for t in shapes[key] if all(t is not s for s in stale)]
        if not shapes[key]:
            del shapes[key]


def series_from_path(path: Path, errors: list[str] | None = None) -> list[Series]:
    return SeriesAccumulator().add_path(path, errors).finish()


def iter_keys(series: Iterable[Series]) -> Iterator[str]:
    """Every report key present in any series, in order of first appearance."""
    seen: dict[str, None] = {}
    for s in series:
        for key in s.values:
            seen.setdefault(key, None)
    yield from seen
