"""An AMD energy counter that cannot be read is said so, never counted as 0 J (issue 44): one that reads 0
throughout is `counter_unsupported` (AMD's exporter writes 0 where the counter is not supported: the RX 7900 XTX page
of ROCm/device-metrics-exporter issue #259), one that does not move while the GPU draws power is `counter_stuck`
(MI100, ROCm/amdsmi issue #22: 131.426 J at 33-34 W, unchanged for every read). Magnitudes from those captures
(tests/data/amd/ and ../shared/data/amd/); AIPerf's mode (`--counter-mode aiperf`) is left as AIPerf computes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.report import build_report
from bridge.report.write import write_report
from tests.report.helpers import T0, S
from tests.report.test_amd_totals import AMD_W, PHASES, amd, build

MI100_W = 33.5  # amd-smi's CURRENT_POWER and amdsmi's average_socket_power on the idle MI100s (amdsmi#22): 33-34 W
MI100_FROZEN_MJ = 131.426e-6  # TOTAL_ENERGY_CONSUMPTION: 131.426 J on all four GPUs, every read
MI210_START_MJ = 20909145.914e-6  # amd-smi metric -E on an MI210 (amdsmi#38): ~2.09e7 J after days of uptime
MI210_J_PER_S = 42.7  # the same capture's increase per 1 s read (20909145.914 -> 20909188.578 J)


def records(energy_mj, watts: float | None = MI100_W) -> list:
    """61 scrapes a second apart; the power alternates 0.5 W either side of `watts` as the MI100s' did (33, 34 W),
    so the exporter's refreshes show."""
    out = []
    for k in range(61):
        power = max(watts + (0.5 if k % 2 else -0.5), 0.0) if watts else 0.0
        record = amd(T0 + k * S, power, energy_mj(k))
        if watts is None:
            record = type(record)(**{**{f: getattr(record, f) for f in record.__dataclass_fields__},
                                     "telemetry_data": {"amd_energy_consumption": energy_mj(k)}})
        out.append(record)
    return out


def doc_of(report, tmp_path: Path) -> dict:
    write_report(report, tmp_path)
    return json.loads((tmp_path / "profile_export_aiperf.json").read_text())


def gpu_entry(doc: dict) -> dict:
    (entry,) = doc["telemetry_data"]["measurement"]["gpus"]["mi300x:5000"].values()
    return entry


def test_a_frozen_counter_is_stuck_and_the_energy_is_the_power_integral_not_0_j(tmp_path: Path) -> None:
    doc = doc_of(build(records(lambda k: MI100_FROZEN_MJ)), tmp_path)
    measurement = doc["telemetry_data"]["measurement"]
    assert not measurement["valid"] and "counter_stuck" in measurement["reasons"]
    assert "amdsmi issue #22" in measurement["fixes"]["counter_stuck"]
    entry = gpu_entry(doc)
    assert entry["counter_state"] == "stuck" and entry["energy_source"] == "power_integral"
    assert doc["amd_total_gpu_energy"]["avg"] == pytest.approx(MI100_W * 30, rel=0.02)  # the profiling phase, 30 s


def test_a_counter_of_0_throughout_is_unsupported_and_the_energy_is_the_power_integral(tmp_path: Path) -> None:
    doc = doc_of(build(records(lambda k: 0.0)), tmp_path)
    measurement = doc["telemetry_data"]["measurement"]
    assert not measurement["valid"] and "counter_unsupported" in measurement["reasons"]
    assert "counter_stuck" not in measurement["reasons"]
    assert gpu_entry(doc)["counter_state"] == "unsupported"
    assert doc["amd_total_gpu_energy"]["avg"] == pytest.approx(MI100_W * 30, rel=0.02)


def test_a_counter_of_0_without_a_power_gauge_gives_no_energy_figure(tmp_path: Path) -> None:
    doc = doc_of(build(records(lambda k: 0.0, watts=None)), tmp_path)
    measurement = doc["telemetry_data"]["measurement"]
    assert "counter_unsupported" in measurement["reasons"]
    assert gpu_entry(doc)["energy_source"] == "unavailable"
    assert not doc.get("amd_total_gpu_energy")  # no 0 J figure


def test_a_counter_that_stops_while_the_gpu_idles_at_0_w_is_not_stuck(tmp_path: Path) -> None:
    doc = doc_of(build(records(lambda k: MI100_FROZEN_MJ, watts=0.0)), tmp_path)
    assert "counter_stuck" not in doc["telemetry_data"]["measurement"]["reasons"]


def test_a_moving_mi210_counter_is_used_at_its_real_magnitude(tmp_path: Path) -> None:
    watts = MI210_J_PER_S  # what the counter's increase says the GPU drew
    doc = doc_of(build(records(lambda k: MI210_START_MJ + MI210_J_PER_S * k * 1e-6, watts=watts)), tmp_path)
    measurement = doc["telemetry_data"]["measurement"]
    assert measurement["valid"], measurement["reasons"]
    entry = gpu_entry(doc)
    assert entry["energy_source"] == "counter" and "counter_state" not in entry
    assert doc["amd_total_gpu_energy"]["avg"] == pytest.approx(MI210_J_PER_S * 30, rel=1e-6)


def test_aiperfs_mode_reads_the_frozen_counter_as_aiperf_does() -> None:
    report = build_report(records(lambda k: MI100_FROZEN_MJ), phases=PHASES, requests_end_ns=T0 + 50 * S,
                          grace_ns=0, counter_mode="aiperf")
    reasons = report.telemetry_data.get("measurement", {}).get("reasons", [])
    assert "counter_stuck" not in reasons and "counter_unsupported" not in reasons
    assert AMD_W  # (the interpolated tests above use the MI100's power instead of the totals test's 500 W)
