"""Units come from the name (NVIDIA's field table, the release notes), never from the values (issue 14 item 2).

- a `_RATIO` value above 1 is an anomaly, said once per family per run (log, events, report), not rescaled;
- an exporter upgraded mid-run (legacy energy in mJ, then DCGM 4.7's in J, same GPU) continues one series.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bridge.fetch import FetchedPage
from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.parse import parse_page
from bridge.record_log import read_dicts
from bridge.report import build_report
from bridge.report.build import build_report_from_events
from bridge.report.window import explicit_window
from tests.sidecar.test_pipeline import Recorder, pipeline

S = 1_000_000_000
U0, U1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"


def page(*lines: str) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()


def ratio_page(tensor: float, sm: float) -> bytes:
    return page(*(f'{name}{{gpu="{i}",UUID="{uuid}",modelName="M",hostname="n"}} {value}'
                  for i, uuid in enumerate((U0, U1))
                  for name, value in (("DCGM_FI_PROF_TENSOR_UTIL_RATIO", tensor), ("DCGM_FI_PROF_SM_UTIL_RATIO", sm))))


def test_a_ratio_above_one_is_one_anomaly_per_family_and_is_not_rescaled() -> None:
    normalizer = Normalizer(default_table())
    first = normalizer.records(parse_page(ratio_page(63.0, 0.5)), source_url="http://a:9400/metrics", timestamp_ns=1)
    assert [r.telemetry_data["nvidia_pipe_tensor_active"] for r in first] == [6300.0, 6300.0]  # as the name says
    (anomaly,) = normalizer.take_anomalies()
    assert (anomaly.family, anomaly.value, anomaly.gpu_uuid) == ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 63.0, U0)
    assert "DCGM_FI_PROF_TENSOR_UTIL_RATIO" in anomaly.message() and "not rescaled" in anomaly.message()
    normalizer.records(parse_page(ratio_page(64.0, 0.5)), source_url="http://a:9400/metrics", timestamp_ns=2)
    assert normalizer.take_anomalies() == []  # once per run
    normalizer.records(parse_page(ratio_page(0.6, 55.0)), source_url="http://a:9400/metrics", timestamp_ns=3)
    assert [a.family for a in normalizer.take_anomalies()] == ["DCGM_FI_PROF_SM_UTIL_RATIO"]


def test_ratios_at_or_below_one_and_blank_sentinels_are_no_anomaly() -> None:
    normalizer = Normalizer(default_table())
    normalizer.records(parse_page(ratio_page(1.0, 140737488355328.0)), source_url="u", timestamp_ns=1)
    assert normalizer.take_anomalies() == []


def test_the_sidecar_says_a_ratio_anomaly_once_in_the_log_the_events_and_the_report(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    pipe, events = pipeline(tmp_path, recorder)
    url = "http://a:9400/metrics"
    with caplog.at_level(logging.WARNING):
        for t in range(1, 4):
            pipe.on_page(url, FetchedPage(ratio_page(63.0, 0.5), t * S, t * S + 1000, "text/plain"))
    events.close()
    units = [e for e in read_dicts(events.path) if e.get("kind") == "unit"]
    assert len(units) == 1 and units[0]["time_ns"] == 1 * S and units[0]["endpoint"] == url
    assert len([r for r in caplog.records if "TENSOR_UTIL_RATIO" in r.getMessage()]) == 1
    records = [r for p in recorder.pages for r in p.records]
    assert {r.telemetry_data["nvidia_pipe_tensor_active"] for r in records} == {6300.0}
    report = build_report_from_events(records, events.path)
    (error,) = report.telemetry_data["error_summary"]
    assert error["error_details"]["type"] == "unit" and "DCGM_FI_PROF_TENSOR_UTIL_RATIO" in error[
        "error_details"]["message"]


# -- an exporter upgraded mid-run ----------------------------------------------------------------------
def energy_page(name: str, value: float, host_label: str) -> bytes:
    return page(f'{name}{{gpu="0",UUID="{U0}",modelName="M",{host_label}="n"}} {value!r}',
                f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{U0}",modelName="M",{host_label}="n"}} 400')


@pytest.mark.parametrize("upgrade_at", [3, 10])
def test_an_exporter_upgraded_mid_run_continues_one_energy_series(upgrade_at: int) -> None:
    """400 W for 20 s: 4.8's mJ counter, then 4.9's J counter of the same driver count (a new field id, the
    same energy): one series in MJ, no reset, no jump, 8000 J."""
    normalizer, records = Normalizer(default_table()), []
    start_mj = 7.5e9  # the driver's count since boot
    for t in range(0, 21):
        mj = start_mj + 400_000 * t
        body = (energy_page("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", mj, "Hostname") if t < upgrade_at
                else energy_page("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", mj / 1000, "hostname"))
        records += normalizer.records(parse_page(body), source_url="http://a:9400/metrics", timestamp_ns=t * S)
    assert len({(r.gpu_uuid, r.hostname) for r in records}) == 1
    energy = [r.telemetry_data["nvidia_energy_consumption"] for r in records]
    steps = [b - a for a, b in zip(energy, energy[1:], strict=False)]
    assert steps == pytest.approx([400e-6] * 20, rel=1e-9)  # MJ per second: no jump at the upgrade
    built = build_report(records, window=explicit_window(0, 20 * S, 0))
    assert built.energy.total_energy_j == pytest.approx(8000.0, rel=1e-6)
    (gpu,) = built.telemetry_data["endpoints"]["a:9400"]["gpus"].values()
    assert gpu["metrics"]["nvidia_energy_consumption"].get("resets", 0) == 0
