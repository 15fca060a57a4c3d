"""The H200's fast reads served as dcgm-exporter would have served them (issue 42, item 5).

tests/data/h200_check_gpu/73ms is NVML read every 73 ms on a real H200 (its energy counter moves every 100 ms, its
power gauge is a one-second average). dcgm-exporter with `-c R` serves, at each scrape, DCGM's sample from its
latest refresh instant (a grid of period R); the replay serves the latest real read at or before that instant, with
the scrape's own time, scraped at AIPerf's 333 ms ± 20 ms and, on even offsets, at each phase's edges as the
sidecar's phase marks ask. The latest read can be up to 73 ms older than the sample DCGM would have taken: the
replayed values are that much staler than a real exporter's, never fresher. The reference is NVML's own counter
delta over each phase (summary.json).
"""

from __future__ import annotations

import bisect
import dataclasses
import random
from typing import NamedTuple

from bridge.report import build_report
from bridge.report.window import explicit_window
from bridge.samples import GpuRecord

EXPORTER_URL = "http://127.0.0.1:9400/metrics"
MS = 1_000_000


class Replayed(NamedTuple):
    phase: str
    refresh_s: float
    offset: int
    error_j: float  # |ours − NVML's delta|
    uncertainty_j: float
    bound_j: float
    allowance_j: float  # the reference's own edge spacing (summary.json)
    truth_j: float
    valid: bool


def served(reads: list[GpuRecord], edges: list[int], refresh_s: float, offset: int) -> list[GpuRecord]:
    """The records a sidecar scraping dcgm-exporter at `-c refresh_s` would have written from these reads."""
    rng = random.Random(f"h200-replay:{refresh_s}:{offset}")
    refresh = round(refresh_s * 1e9)
    refresh_phase = rng.randrange(refresh)
    times = [r.timestamp_ns for r in reads]
    marks = sorted(edges) if offset % 2 == 0 else []
    out: list[GpuRecord] = []
    t = times[0] + refresh + rng.randrange(333 * MS)
    while t <= times[-1]:
        if marks and t >= marks[0]:
            t = marks.pop(0)
        sampled = t - (t - refresh_phase) % refresh
        k = bisect.bisect_right(times, sampled) - 1
        if k >= 0:
            out.append(dataclasses.replace(reads[k], timestamp_ns=t, telemetry_source_url=EXPORTER_URL,
                                           scrape_start_ns=None, scrape_end_ns=None))
        t += 333 * MS + rng.randrange(-20 * MS, 20 * MS)
    return out


def replay(reads: list[GpuRecord], phases: list[dict], refresh_s: float, offset: int) -> list[Replayed]:
    records = served(reads, [e for p in phases for e in (p["start_ns"], p["end_ns"])], refresh_s, offset)
    out = []
    for phase in phases:
        built = build_report(records, window=explicit_window(phase["start_ns"], phase["end_ns"], 666 * MS))
        energy = built.energy
        assert energy.total_energy_j is not None and energy.uncertainty_j is not None
        bound = float("inf") if energy.bound_j is None else energy.bound_j
        out.append(Replayed(phase["name"], refresh_s, offset, abs(energy.total_energy_j - phase["nvml_delta_j"]),
                            energy.uncertainty_j, bound, phase["counter_lag_allowance_j"], phase["nvml_delta_j"],
                            bool(built.telemetry_data["measurement"]["valid"])))
    return out
