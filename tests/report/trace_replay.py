"""A raw GPU trace replayed as each source would have served it, the product's report judged on random windows
(issue 47 item 2).

A trace is one GPU's fast NVML reads: the energy counter, the power reading (a one-second average on an H200) and,
where recorded, the instant power field with its own timestamps. Two readers make one: `from_corpus` (the format
`scripts/check-gpu.sh --record` writes, read by its manifest's own description) and `from_record_log` (the
73 ms log of `check-gpu.sh` on the H200, tests/data/h200_check_gpu/73ms, which has no instant field).

What each source would have served:
- dcgm-exporter at `-c R`: the latest read at or before DCGM's last refresh instant, scraped every 333 ms ± 20 ms
  (tests/report/h200_replay.py `served`, reused);
- the NVML reader every I s (`pynvml://localhost`, AIPerf's 0.333 s among them): the first read at or after each tick,
  with its own times.

The references, both from the trace, independent of the report:
- `counter_reference`: the counter's readings placed on its update grid (fitted per stretch of about 30 s: each
  change happened after the read before it began and before the read that saw it ended; the latest grid instant
  before that read carries the value) and interpolated linearly between updates;
- `power_reference`: the instant power integrated by the trapezoid rule, the edges interpolated; where the trace has
  no instant field (the 73 ms log), the one-second average read 0.5 s earlier (a trailing average centred), said so
  in its name.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
import statistics
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bridge.record_log import read_records
from bridge.report import build_report
from bridge.report.window import DEFAULT_GRACE_NS, explicit_window
from bridge.samples import GpuRecord
from tests.report.h200_replay import served

NS = 1_000_000_000
MS = 1_000_000
NVML_URL = "pynvml://localhost"
LENGTHS_S = (20, 60, 120, 300)


@dataclasses.dataclass(frozen=True)
class Trace:
    name: str
    reads: list[GpuRecord]  # every read as a record (timestamp: when the read began; power W, energy MJ)
    begun_ns: np.ndarray  # when each energy read began and ended (wall clock)
    ended_ns: np.ndarray
    energy_j: np.ndarray
    instant: tuple[np.ndarray, np.ndarray] | None  # (the field's own timestamps ns, W), or None
    gauge_w: np.ndarray  # the power reading at each read (the H200's: the trailing second's average)

    @property
    def span_s(self) -> float:
        return float(self.begun_ns[-1] - self.begun_ns[0]) / NS


def from_record_log(path: Path, name: str) -> Trace:
    """A check-gpu.sh record log (one GPU read through `pynvml`): its reads as they are."""
    reads = sorted(read_records(path), key=lambda r: r.timestamp_ns)
    begun = np.array([r.scrape_start_ns or r.timestamp_ns for r in reads], dtype=np.int64)
    ended = np.array([r.scrape_end_ns or r.timestamp_ns for r in reads], dtype=np.int64)
    energy = np.array([r.telemetry_data["nvidia_energy_consumption"] * 1e6 for r in reads])
    gauge = np.array([r.telemetry_data["nvidia_power_usage"] for r in reads])
    return Trace(name, reads, begun, ended, energy, None, gauge)


_NUMPY = {"B": "u1", "I": "u4", "i": "i4", "q": "i8", "Q": "u8", "d": "f8"}


def corpus_rows(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """A --record corpus: its manifest and its columns (read by the manifest's own format description: a
    little-endian struct of the kinds in _NUMPY, no padding)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    form = manifest["format"]
    layout = form["row_struct"]
    if layout[0] != "<" or any(c not in _NUMPY for c in layout[1:]) or len(layout) - 1 != len(form["columns"]):
        raise ValueError(f"{folder}/manifest.json: row_struct {layout!r} is not a layout this reader knows")
    dtype = np.dtype([(name, "<" + _NUMPY[c]) for name, c in zip(form["columns"], layout[1:], strict=True)])
    assert dtype.itemsize == struct.calcsize(layout)
    table = np.frombuffer(gzip.decompress((folder / form["file"]).read_bytes()), dtype=dtype)
    return manifest, {name: table[name] for name in form["columns"]}


def from_corpus(folder: Path, gpu: int = 0) -> Trace:
    manifest, columns = corpus_rows(folder)
    mine = columns["gpu"] == gpu
    c = {k: v[mine] for k, v in columns.items()}
    ok = (c["energy_mj"] >= 0) & (c["power_mw"] >= 0)
    c = {k: v[ok] for k, v in c.items()}
    meta = manifest["gpus"][gpu]
    begun = c["wall_ns"]
    begun = begun.astype(np.int64)
    ended = begun + c["energy_done_ns"].astype(np.int64)
    reads = [GpuRecord(gpu, meta["uuid"], meta["name"], meta["pci_bus_id"], f"nvidia{gpu}", "corpus", None, None,
                       timestamp_ns=int(b), telemetry_source_url=NVML_URL,
                       telemetry_data={"nvidia_power_usage": float(p) / 1000, "nvidia_energy_consumption": e / 1e9},
                       scrape_start_ns=int(b), scrape_end_ns=int(b + d))
             for b, d, p, e in zip(begun, c["fields_done_ns"].astype(np.int64), c["power_mw"], c["energy_mj"],
                                   strict=True)]
    instant = None
    stamps = c["field_power_instant_us"]
    good = (stamps > 0) & np.isfinite(c["field_power_instant_mw"])
    if good.any():
        t, first = np.unique(stamps[good] * 1000, return_index=True)
        instant = (t, c["field_power_instant_mw"][good][first] / 1000)
    return Trace(f"{folder.name} GPU {gpu}", reads, begun, ended, c["energy_mj"] / 1000, instant, c["power_mw"] / 1000)


def counter_knots(trace: Trace, stretch: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """(the update instants ns, the energy J then) of the counter, its grid fitted per `stretch` changes (about 10 s
    at 100 ms: a grid drifting by 0.01 % moves 1 ms in that time).

    Each change happened after the read before it began and before the read that saw it ended. Per stretch, the
    period is the one under which those instants line up best (the sightings' circular concentration, scanned
    within ±25 % of their mean spacing: a stalled poll that spans two updates does not move it), the phase their
    circular mean, then both refined by weighted least squares and narrowed to where every change's interval
    agrees; each change's value goes to the latest grid instant before the read that saw it."""
    changed = np.flatnonzero(np.diff(trace.energy_j) != 0) + 1
    after = trace.begun_ns[changed - 1].astype(np.float64)
    before = trace.ended_ns[changed].astype(np.float64)
    mids = (after + before) / 2
    mean_gap = float(mids[-1] - mids[0]) / max(len(mids) - 1, 1)
    knots = np.empty(len(changed))
    starts = list(range(0, len(changed), stretch))
    if len(starts) > 1 and len(changed) - starts[-1] < stretch // 2:  # a short tail joins the stretch before it
        starts.pop()
    for lo, hi in zip(starts, [*starts[1:], len(changed)], strict=True):
        part = slice(lo, hi)
        m = mids[part] - mids[lo]
        span = max(float(m[-1]), mean_gap)
        candidates = np.arange(0.75 * mean_gap, 1.25 * mean_gap, 0.05 * mean_gap**2 / (2 * np.pi * span))
        angles = 2 * np.pi * m[None, :] / candidates[:, None]
        strength = np.hypot(np.mean(np.cos(angles), axis=1), np.mean(np.sin(angles), axis=1))
        period = float(candidates[np.argmax(strength)])
        angle = 2 * np.pi * m / period
        phase = period * np.arctan2(np.mean(np.sin(angle)), np.mean(np.cos(angle))) / (2 * np.pi)
        k = np.round((m - phase) / period)
        if len(np.unique(k)) > 2:  # the scan's step, refined: the sightings' least-squares line, each weighed by
            # how narrowly its interval places it (a stalled poll's wide interval would bend the line)
            width = np.maximum(before[part] - after[part], 1000.0)
            period, phase = (float(x) for x in np.polyfit(k, m, 1, w=1 / width))
        low, high = np.max(after[part] - mids[lo] - k * period), np.min(before[part] - mids[lo] - k * period)
        if low < high:  # every change's interval agrees: the grid lies between
            phase = (low + high) / 2
        # the latest grid instant inside the change's interval; where none is (the phase a little off), the nearest
        a, b = after[part] - mids[lo] - phase, before[part] - mids[lo] - phase
        latest = np.floor(b / period) * period
        outside = latest <= a
        knots[part] = mids[lo] + phase + np.where(outside & (latest + period - b < a - latest), latest + period, latest)
    # a change the grid puts on the same update as the one before (a slow read) keeps the later value
    keep = np.append(np.diff(knots) > 0, True)
    return knots[keep].astype(np.int64), trace.energy_j[changed][keep]


def counter_reference(trace: Trace) -> Callable[[int, int], float]:
    t, e = counter_knots(trace)
    return lambda a, b: float(np.interp(b, t, e) - np.interp(a, t, e))


def power_reference(trace: Trace) -> tuple[str, Callable[[int, int], float]]:
    if trace.instant is not None:
        name, (t, w) = "instant power", trace.instant
    else:
        name, t, w = "1 s average, 0.5 s earlier", trace.begun_ns - NS // 2, trace.gauge_w

    def integral(a: int, b: int) -> float:
        inside = (t > a) & (t < b)
        ts = np.concatenate([[a], t[inside], [b]]).astype(np.float64)
        ws = np.concatenate([[np.interp(a, t, w)], w[inside], [np.interp(b, t, w)]])
        return float(np.sum(np.diff(ts) * (ws[1:] + ws[:-1]) / 2) / NS)

    return name, integral


class Source(NamedTuple):
    kind: str  # "exporter" (dcgm-exporter at -c), "nvml" (the NVML reader)
    interval_s: float

    @property
    def label(self) -> str:
        if self.kind == "exporter":
            return f"dcgm-exporter -c {round(self.interval_s * 1000)}"
        return f"NVML reader {self.interval_s:g} s" + (" (AIPerf's)" if self.interval_s == 0.333 else "")


SOURCES = (*(Source("exporter", r) for r in (0.1, 0.25, 0.5, 1, 2, 5, 10, 30)),
           *(Source("nvml", i) for i in (0.1, 0.2, 0.333, 0.5, 1)))


def serve(trace: Trace, source: Source, seed: int) -> list[GpuRecord]:
    if source.kind == "exporter":
        return served(trace.reads, [], source.interval_s, 2 * seed + 1)
    rng = random.Random(f"nvml-reader:{trace.name}:{source.interval_s}:{seed}")
    out, k, tick = [], 0, int(trace.begun_ns[0]) + rng.randrange(round(source.interval_s * NS))
    while True:
        k = int(np.searchsorted(trace.begun_ns, tick))
        if k >= len(trace.reads):
            return out
        out.append(trace.reads[k])
        tick = max(tick + round(source.interval_s * NS), int(trace.ended_ns[k]))


def replayable(trace: Trace, source: Source) -> bool:
    """Whether the trace's reads can stand for the source's: a reader's ticks at least two of the trace's reads
    apart (a 0.1 s reader replayed from 73 ms reads would see gaps of 73 and 146 ms, and the report rightly finds
    a quarter of its scrapes missing); an exporter holds values, any refresh."""
    spacing = float(np.median(np.diff(trace.begun_ns))) / NS
    return source.kind == "exporter" or source.interval_s >= 2 * spacing


class Judged(NamedTuple):
    source: Source
    length_s: int
    start_ns: int
    ours_j: float
    uncertainty_j: float
    bound_j: float
    valid: bool
    counter_j: float  # the references
    power_j: float


def windows(trace: Trace, length_s: int, count: int, seed: int) -> list[tuple[int, int]]:
    """`count` windows of `length_s` at random edges, 2 s inside the trace's ends (none where it is too short)."""
    first, last = int(trace.begun_ns[0]) + 2 * NS, int(trace.begun_ns[-1]) - 2 * NS - length_s * NS
    if last <= first:
        return []
    rng = random.Random(f"windows:{trace.name}:{length_s}:{seed}")
    return [(s, s + length_s * NS) for s in (rng.randrange(first, last) for _ in range(count))]


def judge(trace: Trace, sources: Sequence[Source], lengths: Sequence[int], count: int, seed: int = 47
          ) -> list[Judged]:
    """Every source × window length: `count` windows at random edges, AIPerf's grace; the report against both
    references."""
    by_counter, (_, by_power) = counter_reference(trace), power_reference(trace)
    out = []
    for source in sources:
        if not replayable(trace, source):
            continue
        records = serve(trace, source, seed)
        for length in lengths:
            for start, end in windows(trace, length, count, seed):
                built = build_report(records, window=explicit_window(start, end, DEFAULT_GRACE_NS))
                energy = built.energy
                if energy.total_energy_j is None:
                    continue
                out.append(Judged(source, length, start, energy.total_energy_j, energy.uncertainty_j or 0.0,
                                  float("inf") if energy.bound_j is None else energy.bound_j,
                                  bool(built.telemetry_data["measurement"]["valid"]),
                                  by_counter(start, end), by_power(start, end)))
    return out


class Row(NamedTuple):
    source: str
    length_s: int
    windows: int
    covered: int  # |ours − counter reference| ≤ the stated uncertainty
    bounded: int
    valid: int
    ratio: float  # median uncertainty / median |error| (the counter reference)
    error_pct: float  # median |ours − reference| / reference, each reference
    power_error_pct: float
    references_pct: float  # median |counter − power reference| / counter reference


def summarise(judged: Sequence[Judged]) -> list[Row]:
    groups: dict[tuple[str, int], list[Judged]] = {}
    for j in judged:
        groups.setdefault((j.source.label, j.length_s), []).append(j)
    rows = []
    for (label, length), js in groups.items():
        errors = [abs(j.ours_j - j.counter_j) for j in js]
        rows.append(Row(label, length, len(js), sum(e <= j.uncertainty_j for e, j in zip(errors, js, strict=True)),
                        sum(e <= j.bound_j for e, j in zip(errors, js, strict=True)), sum(j.valid for j in js),
                        statistics.median(j.uncertainty_j for j in js) / max(statistics.median(errors), 1e-9),
                        100 * statistics.median(e / j.counter_j for e, j in zip(errors, js, strict=True)),
                        100 * statistics.median(abs(j.ours_j - j.power_j) / j.power_j for j in js),
                        100 * statistics.median(abs(j.counter_j - j.power_j) / j.counter_j for j in js)))
    return rows


def table(rows: Sequence[Row], power_name: str) -> str:
    lines = [f"| source | window | windows | covered by ± | by bound | valid | median ± / median error | median error "
             f"(counter ref.) | median error ({power_name}) | references apart |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r.source} | {r.length_s} s | {r.windows} | {r.covered} | {r.bounded} | {r.valid} | {r.ratio:.1f} "
              f"| {r.error_pct:.3f} % | {r.power_error_pct:.3f} % | {r.references_pct:.3f} % |" for r in rows]
    return "\n".join(lines)
