"""The report against a real GPU: an H200's record logs from scripts/check-gpu.sh (tests/data/h200_check_gpu), each
load phase's energy against NVML's own counter delta read where the counter changed at the phase's edges.

Each log is also read thinned to every k-th read, every offset, as a slower reader would have read the same GPU,
and the stated uncertainty covers every window (within the reference's own edge spacing). The 73 ms run is what
changed the model: without the counter's update period (bridge.sources.COUNTER_UPDATE_S) one of its 114 windows
fell outside; the 333 ms run (AIPerf's interval) was recorded after the change, held out (bench/RESULTS.md, "A real
GPU").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.record_log import read_records
from bridge.report import build_report
from bridge.report.window import explicit_window
from bridge.samples import GpuRecord

DATA = Path(__file__).parents[1] / "data" / "h200_check_gpu"
RUNS = {run: (json.loads((DATA / run / "summary.json").read_text()),
              list(read_records(DATA / run / "gpu_telemetry_export.jsonl.gz"))) for run in ("73ms", "333ms")}


def phase_reports(run: str, records: list[GpuRecord]) -> list[tuple[dict, float, float, float]]:
    """(phase, our energy J, stated uncertainty J, bound J) per phase."""
    out = []
    for phase in RUNS[run][0]["phases"]:
        built = build_report(records, window=explicit_window(phase["start_ns"], phase["end_ns"], 0))
        energy = built.energy
        assert energy.total_energy_j is not None and energy.uncertainty_j is not None and energy.bound_j is not None
        out.append((phase, energy.total_energy_j, energy.uncertainty_j, energy.bound_j))
    return out


@pytest.mark.parametrize("run", RUNS)
def test_the_record_logs_are_the_h200_runs(run: str) -> None:
    summary, records = RUNS[run]
    assert {r.gpu_model_name for r in records} == {"NVIDIA H200"}
    assert summary["driver"] == "580.159.04" and summary["energy_update_period_s"] == pytest.approx(0.1, abs=0.005)
    assert [p["name"] for p in summary["phases"]] == ["idle", "half", "full", "bursty", "quarter", "cool"]


@pytest.mark.parametrize(("run", "every"), [("73ms", 1), ("73ms", 4), ("73ms", 14), ("333ms", 1), ("333ms", 3)],
                         ids=["73ms", "73ms-every-4th", "73ms-every-14th", "333ms", "333ms-every-3rd"])
def test_every_phase_is_within_its_stated_uncertainty_of_nvmls_counter(run: str, every: int) -> None:
    for offset in range(every):
        for phase, ours, stated, bound in phase_reports(run, RUNS[run][1][offset::every]):  # one GPU: k-th reads
            error = abs(ours - phase["nvml_delta_j"])
            allowed = phase["counter_lag_allowance_j"]  # NVML's own reads at the edges: their poll spacing
            assert error <= stated + allowed, (every, offset, phase["name"], error, stated)
            assert error <= bound + allowed
            assert stated <= bound


def test_with_the_fast_reads_the_error_is_a_fraction_of_a_percent() -> None:
    for phase, ours, _, _ in phase_reports("73ms", RUNS["73ms"][1]):
        assert abs(ours / phase["nvml_delta_j"] - 1) < 0.01, phase["name"]


# --- issue 42 item 5: the same H200 served as dcgm-exporter at `-c 100` to `-c 2000` would have served it ----------
# (tests/report/h200_replay.py). Each refresh: 8 scrape schedules × 6 phases. Not held out: the first replay (the
# model before `uncertainty._step`) missed 3 of 48 phases at 1 s and at 2 s; the step term was designed from those
# misses (the load changes at every phase's edge). bench/h200_replay.py prints the table in bench/RESULTS.md.

REPLAY_REFRESHES = (0.1, 0.25, 0.5, 1, 2)


@pytest.mark.slow
@pytest.mark.parametrize("refresh_s", [
    *REPLAY_REFRESHES[:4],
    pytest.param(2, marks=pytest.mark.xfail(strict=True, reason=(
        "issue 42 (open): 47 of 48 phases covered at 2 s (cool: 43.1 J off, 41.2 J stated; 39.4 J before session "
        "23). 1 s missed one too until session 23 (quarter: 56.4 J off, 53.6 J stated)")))])
def test_replayed_as_an_exporter_serves_it_every_phase_is_within_its_uncertainty(refresh_s: float) -> None:
    from tests.report.h200_replay import replay

    summary, reads = RUNS["73ms"]
    judged = [r for offset in range(8) for r in replay(reads, summary["phases"], refresh_s, offset)]
    assert len(judged) == 48
    assert all(r.error_j <= r.bound_j + r.allowance_j for r in judged)
    missed = [r for r in judged if r.error_j > r.uncertainty_j + r.allowance_j]
    assert not missed, missed
