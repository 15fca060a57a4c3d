"""The lifecycle's last step: build the report from what was recorded and write it.

The report is built from the records the run wrote and the events file — what `dcgm-bridge report`
reads afterwards — so the two agree (tests/test_longrun.py compares them). The records do not come
back from the JSONL log, though: re-reading a 1-hour 64-GPU log costs ~5 CPU-seconds, while the
shutdown budget under a 25m limit is 0.75 (30 s × 25m). `LiveSeries` takes each record as it is
written, appends its values as one row to its series' spool file (raw float64/int64, a few µs per
record, nothing kept in memory beyond 64 KB per series, so RSS stays flat over hours), and at the end
hands `build_report` the series as memory-mapped arrays. When the spool cannot be written (disk
full) and its in-memory fallback outgrows its bound, the report falls back to the record log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.endpoints import display_key
from bridge.record_log import dict_to_record
from bridge.report.series import endpoint_of
from bridge.samples import GpuRecord

if TYPE_CHECKING:
    from bridge.lifecycle import Session, SessionOutputs
    from bridge.report.series import Series

logger = logging.getLogger(__name__)

_FLUSH_BYTES = 16 * 1024  # per series and file: ~8 s of one GPU at 3 Hz
_MAX_UNSPOOLED_BYTES = 64 * 1024 * 1024  # held in memory while the spool cannot be written; past it: give up
_FILLABLE = ("gpu_model_name", "pci_bus_id", "device", "hostname", "namespace", "pod_name", "gpu_instance_profile")


class _Spooled:
    """One series (endpoint × GPU identity): its first record, labels filled later, and its spooled rows."""

    __slots__ = ("number", "url", "first", "filled", "missing", "keys", "blocks", "ts", "rows", "rows_out",
                 "ts_out", "count")

    def __init__(self, number: int, record: GpuRecord) -> None:
        self.number = number
        self.url = record.telemetry_source_url
        self.first = record
        self.filled: dict[str, str] = {}
        self.missing = [name for name in _FILLABLE if getattr(record, name) is None]
        self.keys: tuple[str, ...] = ()
        self.blocks: list[tuple[tuple[str, ...], int, int]] = []  # (keys, first row, rows)
        self.ts: array[int] = array("q")  # not yet spooled
        self.rows: array[float] = array("d")
        self.ts_out = 0  # rows already in the files
        self.rows_out = 0  # float64 values already in the rows file
        self.count = 0


class LiveSeries:
    """Records → per-series spool files → `build_report`'s series. Thread-safe (one lock).

    `spool_dir=None` keeps everything in memory (`series_from_log`: a report rebuilt from a log).
    """

    def __init__(self, spool_dir: Path | None) -> None:
        self.spool_dir = spool_dir
        self._series: dict[tuple[str, str, str | None], _Spooled] = {}
        self._lock = threading.Lock()
        self.records = 0
        self.complete = True  # False once a record could not be kept: the report re-reads the log
        self.error: str | None = None
        self._unspooled = 0
        self._display: dict[str, str] = {}

    def add(self, records: Sequence[GpuRecord], endpoint: str | None = None) -> None:
        """Records of one scrape (`endpoint`: their display key, when the caller knows it)."""
        if not self.complete or not records:
            return
        with self._lock:
            for record in records:
                self._add(record, endpoint or display_key(record.telemetry_source_url))
            self.records += len(records)

    def _add(self, record: GpuRecord, endpoint: str) -> None:
        key = (endpoint, record.gpu_uuid, record.gpu_instance_id)
        spooled = self._series.get(key)
        if spooled is None:
            spooled = self._series[key] = _Spooled(len(self._series), record)
        data = record.telemetry_data
        keys = tuple(data)
        if keys != spooled.keys or not spooled.blocks:
            spooled.keys = keys
            spooled.blocks.append((keys, spooled.count, 0))
        keys_, start, rows = spooled.blocks[-1]
        spooled.blocks[-1] = (keys_, start, rows + 1)
        spooled.rows.extend(data.values())
        spooled.ts.append(record.timestamp_ns)
        spooled.count += 1
        if spooled.missing:
            for name in list(spooled.missing):
                value = getattr(record, name)
                if value is not None:
                    spooled.filled[name] = value
                    spooled.missing.remove(name)
        if len(spooled.rows) * 8 >= _FLUSH_BYTES and self.spool_dir is not None:
            self._spool(spooled)

    def add_dict(self, obj: Mapping[str, Any]) -> None:
        """A decoded record-log line (ours or AIPerf's), read as SeriesAccumulator.add_dict reads it: numbers
        only (anything else leaves its slot empty). Raises KeyError/TypeError/ValueError for a non-record."""
        data = obj.get("telemetry_data") or {}
        if not isinstance(data, Mapping):
            raise TypeError(f"telemetry_data is a {type(data).__name__}, not an object")
        t_ns = int(obj["timestamp_ns"])
        url = str(obj.get("telemetry_source_url") or obj.get("dcgm_url") or "")
        uuid = obj.get("gpu_uuid") or dict_to_record(obj).gpu_uuid
        key = (endpoint_of(self._display, url), str(uuid), obj.get("gpu_instance_id"))
        spooled = self._series.get(key)
        if spooled is None:
            spooled = self._series[key] = _Spooled(len(self._series), dict_to_record(obj))
        keys = tuple(data)
        before = len(spooled.rows)
        try:
            if keys != spooled.keys or not spooled.blocks:
                raise TypeError  # a new key set: a new block
            spooled.rows.extend(data.values())
        except TypeError:  # (or a value that is not a number: AIPerf's reader keeps numbers only)
            del spooled.rows[before:]
            numbers = {k: v for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}
            keys = tuple(numbers)
            if keys != spooled.keys or not spooled.blocks:
                spooled.keys = keys
                spooled.blocks.append((keys, spooled.count, 0))
            spooled.rows.extend(numbers.values())
        keys_, start, rows = spooled.blocks[-1]
        spooled.blocks[-1] = (keys_, start, rows + 1)
        spooled.ts.append(t_ns)
        spooled.count += 1
        self.records += 1
        if spooled.missing:
            for name in list(spooled.missing):
                value = obj.get(name)
                if value is not None:
                    spooled.filled[name] = value
                    spooled.missing.remove(name)

    def _spool(self, spooled: _Spooled) -> None:
        assert self.spool_dir is not None
        held = (len(spooled.rows) + len(spooled.ts)) * 8
        rows_path = self.spool_dir / f"{spooled.number}.rows"
        ts_path = self.spool_dir / f"{spooled.number}.ts"
        try:
            self.spool_dir.mkdir(parents=True, exist_ok=True)
            with open(rows_path, "ab") as rows:
                spooled.rows.tofile(rows)
            with open(ts_path, "ab") as ts:
                spooled.ts.tofile(ts)
        except OSError as exc:
            for path, size in ((rows_path, spooled.rows_out * 8), (ts_path, spooled.ts_out * 8)):
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
        spooled.rows_out += len(spooled.rows)
        spooled.ts_out += len(spooled.ts)
        del spooled.rows[:]
        del spooled.ts[:]
        self._unspooled = 0

    def _give_up(self) -> None:
        logger.warning("the live report gave up holding series in memory; the report will re-read the record log")
        self.complete = False
        self._series.clear()

    def finish(self) -> list[Series]:
        """Every series, time-sorted, its arrays memory-mapped from the spool (in memory what could not be
        spooled): a one-hour 64-GPU run's ~220 MB of values stay file pages, reclaimable, not heap."""
        import numpy as np

        from bridge.report.series import GpuMeta, Series, _merge_aliases

        out: list[Series] = []
        with self._lock:
            for (endpoint, _uuid, _instance), spooled in self._series.items():
                if (len(spooled.rows) or len(spooled.ts)) and self.spool_dir is not None:
                    self._spool(spooled)
                ts = self._column(spooled, "ts", np.int64, spooled.ts, spooled.ts_out)
                rows = self._column(spooled, "rows", np.float64, spooled.rows, spooled.rows_out)
                values: dict[str, Any] = {}
                offset = 0
                for keys, start, count in spooled.blocks:
                    block = rows[offset: offset + count * len(keys)].reshape(count, len(keys))
                    offset += count * len(keys)
                    if count == spooled.count:  # the usual case: one key set for the whole run, no copy
                        values = {key: block[:, k] for k, key in enumerate(keys)}
                        continue
                    for k, key in enumerate(keys):
                        column = values.get(key)
                        if column is None:
                            column = values[key] = np.full(spooled.count, np.nan)
                        column[start: start + count] = block[:, k]
                values = _merge_aliases(values)
                if ts.size > 1 and bool(np.any(ts[1:] < ts[:-1])):
                    order = np.argsort(ts, kind="stable")
                    ts = ts[order]
                    values = {key: col[order] for key, col in values.items()}
                first = spooled.first

                def pick(name: str, first: GpuRecord = first, filled: dict[str, str] = spooled.filled) -> Any:
                    value = getattr(first, name)
                    return value if value is not None else filled.get(name)

                meta = GpuMeta(first.gpu_index, first.gpu_uuid, pick("gpu_model_name"), pick("pci_bus_id"),
                               pick("device"), pick("hostname"), pick("namespace"), pick("pod_name"),
                               first.platform, first.gpu_instance_id, pick("gpu_instance_profile"))
                out.append(Series(endpoint, spooled.url, meta, ts, values))
        return out

    def _column(self, spooled: _Spooled, kind: str, dtype: Any, pending: Any, spooled_n: int) -> Any:
        import numpy as np

        tail = np.frombuffer(pending, dtype=dtype) if len(pending) else np.empty(0, dtype)
        if not spooled_n or self.spool_dir is None:
            return tail.copy()
        head = np.memmap(self.spool_dir / f"{spooled.number}.{kind}", dtype=dtype, mode="r", shape=(spooled_n,))
        return np.concatenate([head, tail]) if tail.size else head

    def remove(self) -> None:
        if self.spool_dir is not None:
            shutil.rmtree(self.spool_dir, ignore_errors=True)


def series_from_log(path: Path, errors: list[str] | None = None) -> Any:
    """A record log (plain or .gz, ours or AIPerf's) as build_report's input, one `array.extend` per record
    instead of one `append` per value: the report command's reader (bench/bench_report.py)."""
    from bridge.record_log import read_dicts

    live = LiveSeries(None)
    add = live.add_dict
    for number, obj in enumerate(read_dicts(path, errors), 1):
        try:
            add(obj)
        except (KeyError, TypeError, ValueError) as exc:
            if errors is not None:
                errors.append(f"{path}: record {number}: {exc!r}")
    return accumulated(live)


def manifest_phases(session: Session) -> Any:
    """Phases from AIPerf's phase_manifest.json when the run posted no marks and one is configured."""
    from bridge.report import load_manifest

    if session.marks or not session.config.phase_manifest:
        return None
    try:
        return load_manifest(Path(session.config.phase_manifest))
    except (OSError, ValueError) as exc:
        logger.warning("no phases from %s (%s): the report covers the whole run", session.config.phase_manifest, exc)
        return None


def write_session_report(session: Session, outputs: SessionOutputs) -> None:
    from bridge.report import build_report_from_events, write_report

    kwargs: dict[str, Any] = {}
    phases = manifest_phases(session)
    if phases:
        kwargs["phases"] = phases
    live = session.live_series
    records: Any = session.records.path
    if live is not None and live.complete:
        records = accumulated(live)
    report = build_report_from_events(records, _events(session), table=session.table,
                                      counter_mode=session.config.counter_mode,
                                      grace_ns=session.config.final_scrape_grace_ns, **kwargs)
    outputs.report = report
    outputs.files.extend(write_report(report, session.artifact_dir, prefix=session.config.profile_export_prefix))


def _events(session: Session) -> Any:
    """The events file, plus the lines the disk refused (still in memory): a full disk loses no failure."""
    pending = session.events.pending()
    if not pending:
        return session.events.path
    import orjson

    from bridge.record_log import read_dicts
    from bridge.report.events import events_from_dicts

    written = list(read_dicts(session.events.path)) if session.events.path.exists() else []
    return events_from_dicts(written + [orjson.loads(line) for line in pending])


def accumulated(live: LiveSeries) -> Any:
    """A SeriesAccumulator whose `finish()` is the live series: build_report's in-memory input."""
    from bridge.report.series import SeriesAccumulator

    class Accumulated(SeriesAccumulator):
        def finish(self) -> list[Series]:
            return live.finish()

    result = Accumulated()
    result.records = live.records
    return result
