"""`dcgm-bridge compare` (issue 45, its first part): the interval against textbook Welch, its calibration on
configurations whose truth is known (drawn here: the run-to-run coefficient of variation fixed at 1 % and the seeds
written before the first run), a difference inside the measurement uncertainty never called, and the folders it
reads (one run, repeats, AIPerf's profile_runs/, NOT-valid runs left out)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.report.compare import Run, Side, compare, load_side, t975

TOKENS = 40_000.0


def _report(folder: Path, energy: float, stated: float, *, seconds: float = 60.0, valid: bool = True) -> Path:
    """A report as `dcgm-bridge report` merges it into AIPerf's JSON: the energy family (AIPerf 0.13's keys, our
    `uncertainty` beside them), AIPerf's token counts and throughput, the verdict."""
    folder.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "total_osl": {"unit": "tokens", "avg": TOKENS},
        "output_token_throughput": {"unit": "tokens/sec", "avg": TOKENS / seconds},
        "telemetry_data": {"measurement": {"valid": valid, "reasons": [] if valid else ["low_coverage"]}},
        "nvidia_average_gpu_power": {"unit": "W", "avg": energy / seconds},
        "nvidia_total_gpu_energy": {"unit": "J", "avg": energy, "uncertainty": stated, "bound": 3 * stated},
        "nvidia_output_tokens_per_joule": {"unit": "tokens/J", "avg": TOKENS / energy},
        "nvidia_energy_per_output_token": {"unit": "mJ/token", "avg": energy * 1e3 / TOKENS},
    }
    (folder / "profile_export_aiperf.json").write_bytes(orjson.dumps(doc))
    return folder


def _side(values: list[tuple[float, float]]) -> Side:
    return Side(Path("x"), tuple(Run(Path(f"r{i}"), True, {"total_gpu_energy": v})
                                 for i, v in enumerate(values)), ())


def test_the_interval_is_welchs_where_nothing_is_measured() -> None:
    """Textbook: samples 1, 2, 3 and 2, 3, 4: difference 1, standard error √(1/3 + 1/3), Welch's df 4, t 2.776."""
    row, = compare(_side([(1.0, 0.0), (2.0, 0.0), (3.0, 0.0)]), _side([(2.0, 0.0), (3.0, 0.0), (4.0, 0.0)]))
    half = 2.776 * (2 / 3) ** 0.5
    assert row.difference == pytest.approx(1.0)
    assert (row.low, row.high) == pytest.approx((1 - half, 1 + half), rel=1e-3)
    assert row.verdict == "inconclusive" and not row.measurement_only
    assert t975(1) == pytest.approx(12.706) and t975(120) == pytest.approx(1.980, abs=2e-3)
    assert t975(4.5) < t975(4) and t975(4.5) > t975(5)


def test_a_difference_inside_the_measurement_uncertainty_alone_is_never_called() -> None:
    # One run a side: 0.8 % apart, each stated ± 1 % (95 %): inconclusive, marked.
    row, = compare(_side([(10_000.0, 100.0)]), _side([(10_080.0, 100.8)]))
    assert row.verdict == "inconclusive" and row.measurement_only
    # Repeats that agree to the joule hide nothing of the measurement: still inconclusive.
    row, = compare(_side([(10_000.0, 100.0)] * 5), _side([(10_080.0, 100.8)] * 5))
    assert row.verdict == "inconclusive" and not row.measurement_only
    # The same difference with a measurement ten times finer is called.
    row, = compare(_side([(10_000.0, 10.0)] * 5), _side([(10_080.0, 10.08)] * 5))
    assert row.verdict == "worse"  # more energy is worse


CALIBRATION_SEEDS = range(45_001, 45_021)  # written before the first run


def _configuration(tmp: Path, rng: random.Random, power_w: float, repeats: int) -> Side:
    """Repeats of one configuration: the run-to-run coefficient of variation of energy 1 %, each run's energy
    measured to within its stated uncertainty (0.3 %, 95 %)."""
    for k in range(repeats):
        truth = power_w * 60.0 * rng.gauss(1.0, 0.01)
        measured = truth * (1 + rng.gauss(0.0, 0.003 / 1.96))
        _report(tmp / f"run_{k:04d}", measured, 0.003 * measured)
    return load_side(tmp)


def test_calibration_a_against_itself_contains_0_and_a_2_percent_difference_is_called(tmp_path: Path) -> None:
    same = called = 0
    for seed in CALIBRATION_SEEDS:
        rng = random.Random(seed)
        a = _configuration(tmp_path / f"{seed}-a", rng, 500.0, 3)
        b = _configuration(tmp_path / f"{seed}-b", rng, 500.0, 3)
        row = next(r for r in compare(a, b) if r.metric == "total_gpu_energy")
        same += row.low <= 0 <= row.high
        c = _configuration(tmp_path / f"{seed}-c", rng, 500.0, 5)
        d = _configuration(tmp_path / f"{seed}-d", rng, 510.0, 5)  # 2 % more power
        row = next(r for r in compare(c, d) if r.metric == "total_gpu_energy")
        called += row.verdict == "worse" and row.difference > 0
    assert same >= 18, same
    assert called >= 16, called


def test_the_command_reads_repeats_profile_runs_and_leaves_not_valid_runs_out(tmp_path: Path) -> None:
    base = tmp_path / "base"
    for k, energy in enumerate((30_000.0, 30_300.0, 29_700.0)):
        _report(base / "profile_runs" / f"run_{k + 1:04d}", energy, 60.0)
    other = tmp_path / "other"
    for k, energy in enumerate((27_000.0, 27_270.0, 26_730.0)):
        _report(other / f"run_{k:04d}", energy, 54.0)
    _report(other / "run_0003", 10.0, 1.0, valid=False)  # a broken repeat: left out, named
    result = CliRunner().invoke(main, ["compare", str(base), "--json", str(other)])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.output)
    assert len(doc["baseline"]["runs"]) == 3
    comparison, = doc["comparisons"]
    assert len(comparison["runs"]) == 3
    assert comparison["left_out_not_valid"][0].endswith("run_0003/profile_export_aiperf.json")
    energy = comparison["metrics"]["total_gpu_energy"]
    assert energy["difference"] == pytest.approx(-3000.0) and energy["verdict"] == "better"
    assert comparison["metrics"]["output_tokens_per_joule"]["verdict"] == "better"  # more tokens per joule
    assert comparison["metrics"]["energy_per_output_token"]["relative"][0] == pytest.approx(-0.1)
    included = CliRunner().invoke(main, ["compare", "--include-invalid", "--json", str(base), str(other)])
    assert len(orjson.loads(included.output)["comparisons"][0]["runs"]) == 4
    console = CliRunner().invoke(main, ["compare", str(base), str(other)], env={"COLUMNS": "80"})
    assert console.exit_code == 0 and "left out (measurement NOT valid)" in console.output
    assert all(len(line) <= 80 for line in console.output.splitlines() if not line.startswith(("baseline", "B:",
                                                                                                  "  left out")))


def test_a_folder_without_a_report_or_a_report_through_a_link_is_one_line(tmp_path: Path) -> None:
    _report(tmp_path / "a", 1000.0, 5.0)
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(main, ["compare", str(tmp_path / "a"), str(empty)])
    assert result.exit_code == 2 and "no profile_export_aiperf.json" in result.output
    assert "Traceback" not in result.output
    linked = tmp_path / "linked" / "run_0000"
    linked.mkdir(parents=True)
    (linked / "profile_export_aiperf.json").symlink_to(tmp_path / "a" / "profile_export_aiperf.json")
    result = CliRunner().invoke(main, ["compare", str(tmp_path / "a"), str(tmp_path / "linked")])
    assert result.exit_code == 2 and "no profile_export_aiperf.json" in result.output
    assert CliRunner().invoke(main, ["compare", str(tmp_path / "a")]).exit_code == 2  # one folder: nothing to compare


def _gpus(gauges: list[dict[str, float]], energies_mj: list[tuple[float, float]] | None = None) -> dict[str, Any]:
    """`telemetry_data`'s endpoints block: one GPU per entry of `gauges` (metric → window average, AIPerf's stats
    shape), with an energy entry (MJ, its uncertainty) where given."""
    gpus = {}
    for i, values in enumerate(gauges):
        metrics: dict[str, Any] = {key: {"unit": "%" if "util" in key else "C", "avg": v, "count": 10}
                                   for key, v in values.items()}
        if energies_mj:
            mj, half = energies_mj[i]
            metrics["nvidia_energy_consumption"] = {"unit": "MJ", "avg": mj, "uncertainty": half, "bound": 2 * half}
        gpus[f"gpu_{i}"] = {"gpu_index": i, "metrics": metrics}
    return {"endpoints": {"127.0.0.1:9400": {"gpus": gpus}}}


def _run_with_phases(folder: Path, energy: float, phases: dict[str, list[tuple[float, float]]],
                     gauges: list[dict[str, float]]) -> None:
    _report(folder, energy, 0.001 * energy)
    doc = orjson.loads((folder / "profile_export_aiperf.json").read_bytes())
    doc["telemetry_data"].update(_gpus(gauges))
    (folder / "profile_export_aiperf.json").write_bytes(orjson.dumps(doc))
    for index, (name, per_gpu) in enumerate(phases.items()):
        phase = {"phase_name": name, "phase_index": index, "phase_kind": name}
        (folder / "phases" / name).mkdir(parents=True)
        (folder / "phases" / name / "gpu_telemetry.json").write_bytes(orjson.dumps(
            {"data": _gpus([{}] * len(per_gpu), per_gpu), "phase": phase, "schema_version": 1, "warnings": []}))


def test_energy_per_phase_and_the_gauges_means_against_what_the_runs_hold(tmp_path: Path) -> None:
    """Two GPUs a run, three repeats a side: warmup the same (within 0.1 %), profiling 10 % more energy on B; SM
    utilisation 60/70 % on A, 80/90 % on B (means 65 and 85: higher, no better direction), temperature 10 C lower."""
    jitter = (0.999, 1.0, 1.001)
    for k, j in enumerate(jitter):
        _run_with_phases(tmp_path / "a" / f"run_{k:04d}", 30_000.0 * j,
                         {"warmup": [(0.002 * j, 1e-6)] * 2, "profiling": [(0.015 * j, 1e-5)] * 2},
                         [{"nvidia_sm_utilization": 60.0 * j, "nvidia_temperature": 70.0},
                          {"nvidia_sm_utilization": 70.0 * j, "nvidia_temperature": 70.0}])
        _run_with_phases(tmp_path / "b" / f"run_{k:04d}", 33_000.0 * j,
                         {"warmup": [(0.002 * jitter[2 - k], 1e-6)] * 2, "profiling": [(0.0165 * j, 1.1e-5)] * 2},
                         [{"nvidia_sm_utilization": 80.0 * j, "nvidia_temperature": 60.0},
                          {"nvidia_sm_utilization": 90.0 * j, "nvidia_temperature": 60.0}])
    result = CliRunner().invoke(main, ["compare", "--json", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    metrics = orjson.loads(result.output)["comparisons"][0]["metrics"]
    warmup, profiling = metrics["phase:warmup"], metrics["phase:profiling"]
    assert warmup["baseline"] == pytest.approx(4000.0) and warmup["verdict"] == "inconclusive"
    assert profiling["difference"] == pytest.approx(3000.0) and profiling["verdict"] == "worse"
    assert profiling["interval"][0] < 3000.0 < profiling["interval"][1] and profiling["unit"] == "J"
    sm = metrics["gauge:nvidia_sm_utilization"]
    assert (sm["baseline"], sm["value"]) == pytest.approx((65.0, 85.0)) and sm["verdict"] == "higher"
    temperature = metrics["gauge:nvidia_temperature"]
    assert temperature["difference"] == pytest.approx(-10.0) and temperature["verdict"] == "better"
    console = CliRunner().invoke(main, ["compare", str(tmp_path / "a"), str(tmp_path / "b")], env={"COLUMNS": "80"})
    assert "Energy, phase warmup" in console.output and "GPU mean nvidia_sm_utilization" in console.output


def _with_config(folder: Path, config: dict[str, Any]) -> None:
    path = folder / "profile_export_aiperf.json"
    doc = orjson.loads(path.read_bytes())
    doc["input_config"] = config
    path.write_bytes(orjson.dumps(doc))


def _sweep_point(folder: Path, concurrency: int, throughput: float, mj_per_token: float, repeats: int = 2) -> None:
    """Repeats whose throughput and energy per token are the given ones (± 1 % spread); AIPerf's input_config with
    a warmup phase first, as AIPerf 0.13 writes its phases."""
    for k in range(repeats):
        j = 1 + 0.01 * (k - (repeats - 1) / 2)
        energy = TOKENS * mj_per_token * j / 1e3
        run = _report(folder / f"run_{k:04d}", energy, 0.001 * energy, seconds=TOKENS / (throughput * j))
        _with_config(run, {"phases": [{"kind": "warmup", "name": "warmup", "concurrency": 1},
                                      {"kind": "profiling", "name": "profiling", "concurrency": concurrency}]})


def test_a_sweep_is_ordered_by_its_key_with_each_points_interval_and_the_pareto_front(tmp_path: Path) -> None:
    # (concurrency, throughput tokens/s, energy per token mJ): 4 dominates 1; 16 is dominated by 8; 4 and 8 trade.
    points = {16: (320.0, 4.0), 1: (100.0, 5.0), 8: (350.0, 3.5), 4: (300.0, 3.0)}
    for c, (throughput, per_token) in points.items():
        _sweep_point(tmp_path / f"c{c}", c, throughput, per_token)
    folders = [str(tmp_path / f"c{c}") for c in points]
    result = CliRunner().invoke(main, ["compare", "--sweep", "concurrency", "--json", *folders])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.output)
    assert doc["sweep"] == "concurrency" and [p["value"] for p in doc["points"]] == [1, 4, 8, 16]
    assert [p["pareto_front"] for p in doc["points"]] == [False, True, True, False]
    # Two runs at 0.995 and 1.005 of the value: the mean's half-width t(1) × 0.005 × value (closed form; the
    # throughput carries no measurement part).
    tput = doc["points"][0]["metrics"]["output_token_throughput"]
    low, high = tput["interval"]
    assert tput["mean"] == pytest.approx(100.0, rel=1e-4)
    assert (high - low) / 2 == pytest.approx(12.706 * (0.5 * 100 / 0.995 - 0.5 * 100 / 1.005), rel=2e-3)
    # The same through a dotted path into input_config, and the console within 80 columns.
    dotted = CliRunner().invoke(main, ["compare", "--sweep", "phases.profiling.concurrency", "--json", *folders])
    assert [p["value"] for p in orjson.loads(dotted.output)["points"]] == [1, 4, 8, 16]
    console = CliRunner().invoke(main, ["compare", "--sweep", "concurrency", *folders], env={"COLUMNS": "80"})
    assert console.exit_code == 0, console.output
    rows = console.output.splitlines()
    assert all(len(line) <= 80 for line in rows), max(rows, key=len)
    assert [line.split()[0] for line in rows[2:6]] == ["1", "4", "8", "16"]
    assert [line.endswith("*") for line in rows[2:6]] == [False, True, True, False]


def test_a_point_beaten_by_the_means_but_not_beyond_the_intervals_is_tied_with_the_front(tmp_path: Path) -> None:
    # Three repeats at 0.99, 1 and 1.01 of each value: every interval about ± 2.5 % of its mean (t(2) × 1 % / √3).
    # 16 is beaten by 8 by the means (340 < 350 tokens/s, 3.55 > 3.5 mJ) by less than that: tied. 1 and 32 are
    # beaten by 4 by far more in both (100 and 250 against 300 tokens/s, 5 and 4 against 3 mJ): not tied.
    points = {1: (100.0, 5.0), 4: (300.0, 3.0), 8: (350.0, 3.5), 16: (340.0, 3.55), 32: (250.0, 4.0)}
    for c, (throughput, per_token) in points.items():
        _sweep_point(tmp_path / f"c{c}", c, throughput, per_token, repeats=3)
    folders = [str(tmp_path / f"c{c}") for c in points]
    result = CliRunner().invoke(main, ["compare", "--sweep", "concurrency", "--json", *folders])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.output)
    assert [p["value"] for p in doc["points"]] == [1, 4, 8, 16, 32]
    assert [p["pareto_front"] for p in doc["points"]] == [False, True, True, False, False]
    assert [p["pareto_tied"] for p in doc["points"]] == [False, False, False, True, False]
    eight, sixteen = (doc["points"][i]["metrics"]["output_token_throughput"]["interval"] for i in (2, 3))
    assert eight[0] < sixteen[1]  # (the intervals do overlap, as constructed)
    console = CliRunner().invoke(main, ["compare", "--sweep", "concurrency", *folders], env={"COLUMNS": "80"})
    rows = console.output.splitlines()
    assert [line.endswith(" *") for line in rows[2:7]] == [False, True, True, False, False], console.output
    assert [line.endswith(" =") for line in rows[2:7]] == [False, False, False, True, False], console.output
    assert "= tied with the front: beaten by the means, never beyond both intervals" in console.output
    page = tmp_path / "compare.html"
    drawn = CliRunner().invoke(main, ["compare", "--sweep", "concurrency", "--html", str(page), *folders])
    assert drawn.exit_code == 0, drawn.output
    text = page.read_text(encoding="utf-8")
    assert text.count('class="tied"') == 4 and text.count("(tied with the Pareto front)") == 4  # one per curve


def test_a_sweep_key_no_folder_holds_or_that_differs_within_a_folder_is_one_line(tmp_path: Path) -> None:
    _sweep_point(tmp_path / "c1", 1, 100.0, 5.0)
    _sweep_point(tmp_path / "c2", 2, 180.0, 4.0)
    folders = [str(tmp_path / "c1"), str(tmp_path / "c2")]
    for key in ("batch_size", "phases.profiling.rate"):
        result = CliRunner().invoke(main, ["compare", "--sweep", key, *folders])
        assert result.exit_code == 2 and f"--sweep {key}" in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1
    _with_config(tmp_path / "c2" / "run_0001", {"phases": [{"kind": "profiling", "concurrency": 3}]})
    result = CliRunner().invoke(main, ["compare", "--sweep", "concurrency", *folders])
    assert result.exit_code == 2 and "disagree" in result.output


def test_until_width_counts_the_repeats_by_aiperfs_rule(tmp_path: Path) -> None:
    """Throughput 95, 100, 105 (sample sd 5 % of the mean, no measurement part): the full width 2 t(n-1) 5/√n is
    under 10 of the mean first at n = 7 (t(5) = 2.571 > √6 = 2.449; t(6) = 2.447 < √7 = 2.646): 4 more runs."""
    for k, throughput in enumerate((95.0, 100.0, 105.0)):
        _report(tmp_path / "a" / f"run_{k:04d}", 30_000.0, 2_000.0, seconds=TOKENS / throughput)
    result = CliRunner().invoke(main, ["compare", "--until-width", "0.1", "--json", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    rows = {r["metric"]: r for r in orjson.loads(result.output)["until_width"]["folders"][0]["metrics"]}
    tput = rows["output_token_throughput"]
    assert (tput["runs_needed"], tput["more_runs"]) == (7, 4)
    assert tput["width"] == pytest.approx(2 * 4.303 * 5 / 3 ** 0.5 / 100, rel=1e-3)
    # The energy stated ± 6.7 % (95 %) each run: the measurement alone is wider than 10 %, no repeat count helps.
    assert rows["total_gpu_energy"]["measurement_too_wide"] and rows["total_gpu_energy"]["runs_needed"] is None
    console = CliRunner().invoke(main, ["compare", "--until-width", "0.2", str(tmp_path / "a")])
    assert console.exit_code == 0 and "under 20 % of the mean" in console.output
    assert "never: the measurement alone is wider" not in console.output.split("Total GPU Energy")[1].splitlines()[0]


def test_the_wide_console_fits_its_width(tmp_path: Path) -> None:
    for k, j in enumerate((0.99, 1.01)):  # two repeats a side: the gauge's change is called
        _run_with_phases(tmp_path / "a" / f"run_{k:04d}", 30_000.0 * j, {"warmup": [(0.002 * j, 1e-6)]},
                         [{"nvidia_pipe_tensor_active": 60.0 * j}])
        _run_with_phases(tmp_path / "b" / f"run_{k:04d}", 33_000.0 * j, {"warmup": [(0.003 * j, 1e-6)]},
                         [{"nvidia_pipe_tensor_active": 90.0 * j}])
    result = CliRunner().invoke(main, ["compare", str(tmp_path / "a"), str(tmp_path / "b")], env={"COLUMNS": "120"})
    rows = [line for line in result.output.splitlines() if line.startswith("  ")]
    assert any("GPU mean nvidia_pipe_tensor_active" in line and line.endswith("higher") for line in rows), rows
    assert all(len(line) <= 120 for line in rows), max(rows, key=len)


def test_one_run_a_side_without_a_stated_uncertainty_is_not_called(tmp_path: Path) -> None:
    """A gauge (no measurement part) 60 -> 90 with one run a side: the interval holds nothing, so no call."""
    _run_with_phases(tmp_path / "a", 30_000.0, {}, [{"nvidia_pipe_tensor_active": 60.0}])
    _run_with_phases(tmp_path / "b", 30_000.0, {}, [{"nvidia_pipe_tensor_active": 90.0}])
    result = CliRunner().invoke(main, ["compare", "--json", str(tmp_path / "a"), str(tmp_path / "b")])
    row = orjson.loads(result.output)["comparisons"][0]["metrics"]["gauge:nvidia_pipe_tensor_active"]
    assert row["difference"] == pytest.approx(30.0) and row["run_to_run_unknown"]
    assert row["verdict"] == "inconclusive"


def test_beside_aiperfs_profile_runs_the_top_report_is_the_whole_series_not_a_repeat(tmp_path: Path) -> None:
    """`profile -- aiperf profile --num-profile-runs N`: the bridge's report over the whole session sits at the top,
    AIPerf's runs in profile_runs/run_NNNN/, its aggregate in aggregate/: the runs are the profile_runs."""
    _report(tmp_path / "multi", 60_000.0, 100.0)
    for k, energy in enumerate((30_000.0, 30_300.0)):
        _report(tmp_path / "multi" / "profile_runs" / f"run_{k + 1:04d}", energy, 60.0)
    _report(tmp_path / "multi" / "aggregate" / "x", 1.0, 0.1)
    from bridge.report.compare import find_runs

    assert [p.parent.name for p in find_runs(tmp_path / "multi")] == ["run_0001", "run_0002"]
