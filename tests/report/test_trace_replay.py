"""The replay harness (tests/report/trace_replay.py, issue 47 item 2): its references against independent truths,
and the report judged on random windows of the real H200's 73 ms log as each source would have served it.

Truths: NVML's own counter delta over each phase of the H200 run, read by the check where the counter changed
(tests/data/h200_check_gpu/73ms/summary.json), and, for a `--record --fake` corpus, the fake GPU's power curve's
closed-form integral. The fast subset below runs in `make unit`; bench/trace_replay.py prints the full table
(bench/RESULTS.md, "A real GPU").
"""

from __future__ import annotations

import functools
import json
import math
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ahead import on_two_processes
from tests.report.trace_replay import (
    LENGTHS_S,
    SOURCES,
    Judged,
    Source,
    counter_knots,
    counter_reference,
    from_corpus,
    from_record_log,
    judge,
    power_reference,
    replayable,
    summarise,
)

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data" / "h200_check_gpu" / "73ms"
SUMMARY = json.loads((DATA / "summary.json").read_text())
TRACE = from_record_log(DATA / "gpu_telemetry_export.jsonl.gz", "h200-73ms")


def test_the_counter_grid_fitted_to_the_h200_log_is_its_100_ms_update_period() -> None:
    knots, _ = counter_knots(TRACE)
    gaps = sorted(int(b - a) for a, b in zip(knots, knots[1:], strict=False))
    assert abs(gaps[len(gaps) // 2] - 100_000_000) < 50_000  # the probe's measured period (summary.json)
    assert sum(abs(g - 100_000_000) < 1_000_000 for g in gaps) >= 0.95 * len(gaps)


def test_the_counter_reference_agrees_with_nvmls_own_phase_deltas() -> None:
    """Each phase's edges were where the check saw the counter change; NVML's delta there is good to the edges'
    poll spacing (the allowance). The interpolated counter places each update on the fitted grid: within that
    allowance plus 0.25 % of the phase (measured: 6.5 J at most, on the 3.1 kJ quarter-load phase; before the grid
    was fitted by its phase, 18 J)."""
    reference = counter_reference(TRACE)
    for phase in SUMMARY["phases"]:
        got = reference(phase["start_ns"], phase["end_ns"])
        assert abs(got - phase["nvml_delta_j"]) <= phase["counter_lag_allowance_j"] + 0.0025 * phase["nvml_delta_j"], (
            phase["name"], got, phase["nvml_delta_j"])
    name, power = power_reference(TRACE)
    assert name.startswith("1 s average")  # this log has no instant field: the average, centred
    # a second, independent reading of the same energy, from the power gauge: within 2.5 % (measured 1.9 % at idle,
    # where the gauge reads 2 W over the counter's rate; bench/RESULTS.md found the power integral 1-5 % off)
    for phase in SUMMARY["phases"]:
        assert abs(power(phase["start_ns"], phase["end_ns"]) / phase["nvml_delta_j"] - 1) < 0.025, phase["name"]


def test_the_h200_log_replayed_as_each_source_serves_it_every_window_within_its_bound() -> None:
    """The fast subset: dcgm-exporter at -c 1000 and AIPerf's NVML reader (0.333 s), 6 windows of 20 s each at
    random edges (seed 47), AIPerf's grace: the bound covers every window's error against the counter reference
    (plus the reference's own 0.25 %); the coverage of the stated uncertainty is bench/trace_replay.py's to
    report."""
    judged = judge(TRACE, [Source("exporter", 1), Source("nvml", 0.333)], [20], 6)
    assert len(judged) == 12
    for j in judged:
        assert abs(j.ours_j - j.counter_j) <= j.bound_j + 0.0025 * j.counter_j, j
        assert j.uncertainty_j <= j.bound_j
    rows = summarise(judged)
    assert [(r.source, r.windows) for r in rows] == [("dcgm-exporter -c 1000", 6),
                                                     ("NVML reader 0.333 s (AIPerf's)", 6)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    out, t0 = tmp_path_factory.mktemp("corpus"), time.time()
    env = {**os.environ, "PYTHON": sys.executable, "DCGM_BRIDGE_FAKE_NVML_T0": repr(t0)}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "check-gpu.sh"), "--record", "--fake", "--no-venv",
                             "--record-scale", "0.01", "--out", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return out, t0


def test_on_a_rehearsed_corpus_both_references_are_the_fake_gpus_true_energy(corpus: tuple[Path, float]) -> None:
    folder, t0 = corpus
    fake = runpy.run_path(str(ROOT / "tests" / "fakes" / "modules" / "pynvml.py"))["FAKE"]
    for gpu in (0, 1):
        trace = from_corpus(folder, gpu)
        curve = fake.gpus[gpu].curve
        by_counter, (name, by_power) = counter_reference(trace), power_reference(trace)
        assert name == "instant power"
        first, last = int(trace.begun_ns[0]), int(trace.begun_ns[-1])
        step = (last - first) // 12
        # linear between updates 0.1 s apart, the counter's energy errs by up to |P'| × 0.1² / 8 at each edge
        interpolation = 2 * curve.ripple_w * 2 * math.pi / curve.ripple_s * 0.1**2 / 8
        for a in range(first + step, last - 3 * step, step):  # 1 s-ish windows across the run
            b = a + 2 * step
            truth = curve.energy_j(b / 1e9 - t0) - curve.energy_j(a / 1e9 - t0)
            assert abs(by_counter(a, b) - truth) <= 0.01 + interpolation, (gpu, a, by_counter(a, b), truth)
            assert abs(by_power(a, b) - truth) <= 0.005 * truth, (gpu, a, by_power(a, b), truth)


# --- the H200 log judged per source by issue 42's per-group criterion: the stated uncertainty covers >= 95 % of the
# valid windows, the bound every window. Fixed before its first run: every source of trace_replay.SOURCES that the
# log can stand for, 10 windows per length (20 and 60 s: the log is 78 s) at seed 47, AIPerf's grace. Not held out:
# the model was shaped on this log's phases (bench/RESULTS.md). bench/trace_replay.py prints the same table.

MISSED = {  # the first run's figures (2026-12-07): covered / valid windows; issue 42 is open. -c 500 passes since
    # session 23 (18 of 20 before: the counter clock's walk and a burst's share, DECISIONS.md)
    Source("exporter", 1): "18 of 20 valid windows covered (90 %)",
    Source("nvml", 1): "17 of 20 valid windows covered (85 %)"}


REPLAYABLE = [s for s in SOURCES if replayable(TRACE, s)]


def _h200_windows(source: Source) -> list[Judged]:
    return judge(TRACE, [source], [20, 60], 10)


@functools.cache
def _h200_judged() -> dict[Source, list[Judged]]:
    """Every source's windows, judged on two processes (or ahead: `AHEAD`)."""
    return dict(zip(REPLAYABLE, on_two_processes(_h200_windows, REPLAYABLE), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("source", [
    pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=f"issue 42 (open): {MISSED[s]}")) if s in MISSED else s
    for s in REPLAYABLE], ids=lambda s: s.label)
def test_the_h200_log_per_source_the_uncertainty_covers_95_percent_of_valid_windows(source: Source) -> None:
    judged = _h200_judged()[source]
    assert len(judged) == 20
    assert all(abs(j.ours_j - j.counter_j) <= j.bound_j + 0.0025 * j.counter_j for j in judged)
    valid = [j for j in judged if j.valid]
    covered = sum(abs(j.ours_j - j.counter_j) <= j.uncertainty_j for j in valid)
    assert covered >= 0.95 * len(valid), (covered, len(valid))


# --- the corpora `scripts/check-gpu.sh --record` recorded on real GPUs (tests/data/gpu_trace/<gpu>-<date>/,
# DECISIONS.md "GPU trace corpus"); none yet: no GPU was lent to the session that built this. Each is judged as the
# H200 log above, at every window length it is long enough for; a group that misses goes xfail (strict) with its
# figures.

CORPORA = sorted(p.parent for p in (ROOT / "tests" / "data" / "gpu_trace").glob("*/manifest.json"))


@pytest.mark.parametrize("folder", CORPORA, ids=lambda p: p.name)
def test_a_recorded_corpus_replayed_its_bound_covers_every_window(folder: Path) -> None:
    trace = from_corpus(folder)
    judged = judge(trace, [Source("exporter", 1), Source("nvml", 0.333)], [20], 6)
    assert len(judged) == 12
    assert all(abs(j.ours_j - j.counter_j) <= j.bound_j + 0.0025 * j.counter_j for j in judged)


@pytest.mark.slow
@pytest.mark.parametrize(("folder", "source"), [(f, s) for f in CORPORA for s in SOURCES],
                         ids=lambda x: x.name if isinstance(x, Path) else x.label)
def test_a_recorded_corpus_per_source_the_uncertainty_covers_95_percent_of_valid_windows(folder: Path,
                                                                                          source: Source) -> None:
    trace = from_corpus(folder)
    if not replayable(trace, source):
        pytest.skip(f"{folder.name}'s reads cannot stand for {source.label}")
    judged = judge(trace, [source], [n for n in LENGTHS_S if n + 4 < trace.span_s], 10)
    assert all(abs(j.ours_j - j.counter_j) <= j.bound_j + 0.0025 * j.counter_j for j in judged)
    valid = [j for j in judged if j.valid]
    assert sum(abs(j.ours_j - j.counter_j) <= j.uncertainty_j for j in valid) >= 0.95 * len(valid)


# Judged ahead where the test is selected (tests/ahead.py).
AHEAD = {test_the_h200_log_per_source_the_uncertainty_covers_95_percent_of_valid_windows.__name__:
         [(_h200_windows, REPLAYABLE)]}
