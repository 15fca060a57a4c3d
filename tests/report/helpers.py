"""Helpers for the report tests: records built by hand, and the record log / events files they go to."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from bridge.record_log import record_to_line
from bridge.samples import GPU_META_FIELDS, GpuRecord

MS = 1_000_000
S = 1_000_000_000
URL = "http://127.0.0.1:19401/metrics"
T0 = 1_796_201_298_411_830_000  # run 1's profiling start (2026-12-02T08:48:18.411830 UTC)


def rec(t_ns: int, data: Mapping[str, float], *, uuid: str = "GPU-0000aaaa-bbbb-cccc-dddd-000000000000",
        index: int = 0, url: str = URL, host: str | None = "node-a", gi: str | None = None,
        model: str = "NVIDIA H100 80GB HBM3", **extra: Any) -> GpuRecord:
    return GpuRecord(
        gpu_index=index, gpu_uuid=uuid, gpu_model_name=model, pci_bus_id="00000000:18:00.0", device="nvidia0",
        hostname=host, namespace=extra.get("namespace"), pod_name=extra.get("pod_name"), platform="nvidia",
        timestamp_ns=t_ns, telemetry_source_url=url, telemetry_data=dict(data), gpu_instance_id=gi,
        gpu_instance_profile=extra.get("profile"),
    )


def recs(times: Iterable[int], counter: Iterable[float], gauge: Iterable[float], *, url: str = URL,
         ends: Iterable[int] | None = None) -> list[GpuRecord]:
    """`rec(t, {"nvidia_energy_consumption": c, "nvidia_power_usage": g}, url=url)` for each (t, c, g), without
    `rec`'s cost per call (a seeded run's thousands of scrapes); `ends`: each scrape's end (`scrape_end_ns`)."""
    meta = [getattr(rec(0, {}), name) for name in GPU_META_FIELDS]
    times = list(times)
    return [GpuRecord(*meta, timestamp_ns=t, telemetry_source_url=url, scrape_end_ns=e,
                      telemetry_data={"nvidia_energy_consumption": c, "nvidia_power_usage": g})
            for t, c, g, e in zip(times, counter, gauge, [None] * len(times) if ends is None else ends, strict=True)]


def served(rng: random.Random, refresh_s: float, start_ns: int, until_ns: int,
           read: Callable[[int], Mapping[str, float]]) -> list[GpuRecord]:
    """What a scraper sees of dcgm-exporter refreshing every `refresh_s` at a random phase: scrapes from within
    300 ms after `start_ns` until `until_ns`, every 333 ms ± 20 ms (AIPerf's), each holding `read(at)` at DCGM's last
    refresh `at` before it."""
    refresh = round(refresh_s * S)
    refresh_phase = rng.randrange(0, refresh)
    out, t = [], start_ns + rng.randrange(0, 300 * MS)
    while t < until_ns:
        out.append(rec(t, read(t - (t - refresh_phase) % refresh)))
        t += 333 * MS + rng.randrange(-20 * MS, 20 * MS)
    return out


def write_log(path: Path, records: Iterable[GpuRecord]) -> Path:
    path.write_bytes(b"".join(record_to_line(r) for r in records))
    return path


def write_events(path: Path, events: Iterable[Mapping[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(dict(e)) + b"\n" for e in events))
    return path
