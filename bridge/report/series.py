"""Records → one time-sorted series per (endpoint, GPU identity): an int64 timestamp array and one
float64 array per report key (NaN where a record did not carry the key).

Streaming: a record costs a few `array.append`s, never a dict kept per record, so a one-hour 64-GPU log
at 3 Hz (~700k records) fits in ~100 MB. Records may arrive out of time order; `finish()` sorts each
series once (stable, so equal timestamps keep arrival order). Every record is a sample, including one
whose values did not change since the previous scrape: repeated values are real observations
(AIPerf drops byte-identical bodies, aiperf-compat.md §13.1).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.endpoints import display_key
from bridge.record_log import dict_to_record, read_dicts
from bridge.samples import GpuRecord

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

_NAN = float("nan")

# Keys of AIPerf logs written before 0.13 (TelemetryMetrics validation_alias, aiperf-compat.md §3).
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

    def __len__(self) -> int:
        return int(self.timestamps.size)


_FILLABLE = ("gpu_model_name", "pci_bus_id", "device", "hostname", "namespace", "pod_name", "gpu_instance_profile")


class _Builder:
    """One series being collected. `keys`/`key_cols` cache the previous record's key order: records of
    one GPU nearly always carry the same keys, and then a record is one `append` per value."""

    __slots__ = ("url", "first", "filled", "missing", "ts", "cols", "n", "keys", "key_cols")

    def __init__(self, record: GpuRecord) -> None:
        self.url = record.telemetry_source_url
        self.first = record
        self.filled: dict[str, str] = {}
        self.missing = [name for name in _FILLABLE if getattr(record, name) is None]
        self.ts: array[int] = array("q")
        self.cols: dict[str, array[float]] = {}
        self.n = 0
        self.keys: tuple[str, ...] = ()
        self.key_cols: list[array[float]] = []

    def add(self, t_ns: int, data: Mapping[str, Any]) -> None:
        n = self.n
        keys = tuple(data)
        if keys == self.keys:
            try:
                for col, value in zip(self.key_cols, data.values(), strict=True):
                    col.append(value)
            except TypeError:  # a non-numeric value: undo this record's appends, take the slow path
                for col in self.key_cols:
                    if len(col) > n:
                        col.pop()
            else:
                self.ts.append(t_ns)
                self.n = n + 1
                return
        self._add_slow(t_ns, data, keys)

    def _add_slow(self, t_ns: int, data: Mapping[str, Any], keys: tuple[str, ...]) -> None:
        n = self.n
        cols = self.cols
        complete = True
        for key, value in data.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                complete = False  # AIPerf's reader keeps numbers only; the slot stays NaN
                continue
            col = cols.get(key)
            if col is None:
                col = array("d", [_NAN]) * n
                cols[key] = col
            col.append(value)
        for col in cols.values():
            if len(col) == n:
                col.append(_NAN)
        self.ts.append(t_ns)
        self.n = n + 1
        if complete and len(keys) == len(cols):
            self.keys, self.key_cols = keys, [cols[k] for k in keys]
        else:
            self.keys, self.key_cols = (), []

    def fill(self, get: Callable[[str], Any]) -> None:
        for name in list(self.missing):
            value = get(name)
            if value is not None:
                self.filled[name] = value
                self.missing.remove(name)

    def finish(self, endpoint: str) -> Series:
        import numpy as np

        ts = np.frombuffer(self.ts, dtype=np.int64).copy() if self.n else np.empty(0, dtype=np.int64)
        values = {key: np.frombuffer(col, dtype=np.float64).copy() for key, col in self.cols.items()}
        values = _merge_aliases(values)
        if ts.size > 1 and bool(np.any(ts[1:] < ts[:-1])):
            order = np.argsort(ts, kind="stable")
            ts = ts[order]
            values = {key: col[order] for key, col in values.items()}
        first = self.first

        def pick(name: str) -> str | None:
            value = getattr(first, name)
            return value if value is not None else self.filled.get(name)

        meta = GpuMeta(
            gpu_index=first.gpu_index,
            gpu_uuid=first.gpu_uuid,
            gpu_name=pick("gpu_model_name"),
            pci_bus_id=pick("pci_bus_id"),
            device=pick("device"),
            hostname=pick("hostname"),
            namespace=pick("namespace"),
            pod_name=pick("pod_name"),
            platform=first.platform,
            gpu_instance_id=first.gpu_instance_id,
            gpu_instance_profile=pick("gpu_instance_profile"),
        )
        return Series(endpoint, self.url, meta, ts, values)


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
    """Feed records (in any order) with `add` (or raw log lines with `add_dict`); `finish()` sorts.

    Series are keyed by (display key of the source URL, GPU UUID, MIG GPU instance id): never by index.
    Stateful on purpose: the live sidecar can feed it as records arrive (~5 µs a record) instead of
    re-reading the log at the end; `finish` does not consume it.
    """

    def __init__(self) -> None:
        self._builders: dict[tuple[str, str, str | None], _Builder] = {}
        self._display: dict[str, str] = {}
        self.records = 0

    def add(self, record: GpuRecord) -> None:
        key = (endpoint_of(self._display, record.telemetry_source_url), record.gpu_uuid, record.gpu_instance_id)
        builder = self._builders.get(key)
        if builder is None:
            builder = self._builders[key] = _Builder(record)
        builder.add(record.timestamp_ns, record.telemetry_data)
        if builder.missing:
            builder.fill(partial(getattr, record))
        self.records += 1

    def add_dict(self, obj: Mapping[str, Any]) -> None:
        """A decoded log line (ours or AIPerf's), read as `record_log.dict_to_record` would read it.

        Raises KeyError/TypeError/ValueError for a line that is not a record.
        """
        url = obj.get("telemetry_source_url") or obj.get("dcgm_url") or ""
        uuid = obj.get("gpu_uuid")
        if not uuid:
            uuid = dict_to_record(obj).gpu_uuid
        key = (endpoint_of(self._display, str(url)), str(uuid), obj.get("gpu_instance_id"))
        t_ns = int(obj["timestamp_ns"])
        builder = self._builders.get(key)
        if builder is None:
            builder = self._builders[key] = _Builder(dict_to_record(obj))
        data = obj.get("telemetry_data") or {}
        if not isinstance(data, Mapping):
            raise TypeError(f"telemetry_data is a {type(data).__name__}, not an object")
        builder.add(t_ns, data)
        if builder.missing:
            builder.fill(obj.get)
        self.records += 1

    def add_all(self, records: Iterable[GpuRecord]) -> SeriesAccumulator:
        add = self.add
        for record in records:
            add(record)
        return self

    def add_path(self, path: Path, errors: list[str] | None = None) -> SeriesAccumulator:
        """Every record of a record log (plain or .gz); unreadable lines are skipped and described."""
        add = self.add_dict
        for number, obj in enumerate(read_dicts(path, errors), 1):
            try:
                add(obj)
            except (KeyError, TypeError, ValueError) as exc:
                if errors is not None:
                    errors.append(f"{path}: record {number}: {exc!r}")
        return self

    def endpoints(self) -> list[str]:
        """Display keys in order of first appearance."""
        return list(dict.fromkeys(key[0] for key in self._builders))

    def finish(self) -> list[Series]:
        return [builder.finish(key[0]) for key, builder in self._builders.items()]


def series_from_path(path: Path, errors: list[str] | None = None) -> list[Series]:
    return SeriesAccumulator().add_path(path, errors).finish()


def iter_keys(series: Iterable[Series]) -> Iterator[str]:
    """Every report key present in any series, in order of first appearance."""
    seen: dict[str, None] = {}
    for s in series:
        for key in s.values:
            seen.setdefault(key, None)
    yield from seen
