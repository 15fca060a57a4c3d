"""The live report needs a bounded number of open files, whatever the series count: a sidecar process
collecting 64 GPUs × 7 MIG instances (512 series: each GPU and its 7 instances; 1024 spool files) under
`ulimit -n 256` writes its report, and it equals the report rebuilt from the record log and the events."""

from __future__ import annotations

import resource
import signal
from pathlib import Path

import orjson
import pytest

from bridge.fields import default_table
from bridge.report import build_report_from_events
from bridge.report.write import write_report
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import start_sidecar, stop, wait_records

OPEN_FILES = 256
GPUS, MIG = 64, 7
SERIES = GPUS * (MIG + 1)  # the simulator's records: the GPU's own and one per instance


def _lower_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


@pytest.mark.slow
def test_a_sidecar_with_512_series_under_ulimit_256_writes_the_report_the_log_rebuilds(tmp_path: Path) -> None:
    out = tmp_path / "out"
    log = tmp_path / "sidecar.log"
    with SimulatedExporter(SimulatorConfig(gpus=GPUS, mig=MIG, seed=3)) as exporter:
        process, base = start_sidecar(log, exporter.url, out, preexec_fn=_lower_open_files,
                                      AIPERF_GPU_COLLECTION_INTERVAL="0.5", DCGM_BRIDGE_RUN_ID="many")
        try:
            wait_records(base, 3 * SERIES, timeout_s=120)  # every series has three records
            process.send_signal(signal.SIGTERM)
            code = process.wait(120)
        finally:
            stop(process)
    text = log.read_text()
    assert code == 0, text
    assert "Too many open files" not in text
    written = orjson.loads((out / "profile_export_aiperf.json").read_bytes())["telemetry_data"]
    gpus = written["endpoints"][exporter.url.removeprefix("http://").removesuffix("/metrics")]["gpus"]
    assert len(gpus) == SERIES
    rebuilt = build_report_from_events(out / "gpu_telemetry_export.jsonl", out / "gpu_telemetry_events.jsonl",
                                       table=default_table())
    again = tmp_path / "again"
    write_report(rebuilt, again)
    assert orjson.loads((again / "profile_export_aiperf.json").read_bytes())["telemetry_data"] == written


@pytest.mark.slow
def test_series_filling_at_one_pace_spool_in_different_scrapes(tmp_path: Path, monkeypatch) -> None:
    """512 series fed one record each per scrape reach the spool threshold together; their thresholds are
    staggered, so no scrape writes more than an eighth of them (one scrape would otherwise write 1,024 files
    and hold the scrape thread up for tens of ms)."""
    from bridge.sidecar import spool
    from tests.report.helpers import T0, S, rec

    written: list[int] = []
    live = spool.LiveSeries(tmp_path / "spool")
    original = live._spool

    def counting(spooled: spool._Spooled) -> None:
        written[-1] += 1
        original(spooled)

    monkeypatch.setattr(live, "_spool", counting)
    data = {f"nvidia_key_{k}": float(k) for k in range(40)}
    for scrape in range(200):  # 200 × 328 bytes: every series past its threshold at least once
        written.append(0)
        live.add([rec(T0 + scrape * S, data, uuid=f"GPU-{n}") for n in range(SERIES)], "node:9400")
    assert sum(written) >= SERIES and max(written) <= SERIES // 8
    assert all(len(s) == 200 for s in live.finish())


def _spool_writes(tmp_path: Path, monkeypatch, series: int, scrapes: int) -> tuple[int, int]:
    """(spool writes, the most rows bytes the series held together) for `series` series fed one record each per
    scrape."""
    from bridge.sidecar import spool
    from tests.report.helpers import T0, S, rec

    live = spool.LiveSeries(tmp_path / f"spool-{series}")
    writes, original = [0], live._spool

    def counting(spooled: spool._Spooled) -> None:
        writes[0] += 1
        original(spooled)

    monkeypatch.setattr(live, "_spool", counting)
    data = {f"nvidia_key_{k}": float(k) for k in range(40)}
    held = 0
    for scrape in range(scrapes):
        live.add([rec(T0 + scrape * S, data, uuid=f"GPU-{n}") for n in range(series)], "node:9400")
        held = max(held, sum(s.rows.used for s in live._series.values()))
    assert all(len(s) == scrapes for s in live.finish())
    return writes[0], held


def test_few_series_spool_in_fewer_larger_writes_within_the_memory_budget(tmp_path: Path, monkeypatch) -> None:
    """Each spool write costs an open, an append and a close whatever its size: with 64 series (8 × 8 GPUs) the
    rows are held up to the spool's memory budget (32 KiB a series after the first, staggered spool at the 16 KiB
    floor) and written about half as often as at the floor, and together they stay within the budget."""
    from bridge.sidecar import spool

    assert spool.flush_bytes(64) == 2 * spool.flush_bytes(512) == 2 * spool._FLUSH_BYTES
    assert spool.flush_bytes(1) == 8 * spool._FLUSH_BYTES  # (a single series is not held past 128 KiB)
    budget = spool._SPOOL_MEMORY
    few, held_few = _spool_writes(tmp_path, monkeypatch, 64, 1000)  # 1000 × 328 bytes a series
    monkeypatch.setattr(spool, "_SPOOL_MEMORY", 0)  # every series at the floor
    floor, held_floor = _spool_writes(tmp_path, monkeypatch, 64, 1000)
    assert 0 < few <= floor * 0.6
    assert held_floor < held_few <= budget + 64 * 400
