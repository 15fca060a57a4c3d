"""`profile --repeat 2` around the real AIPerf 0.13.0 (against the mock server, as test_profile_aiperf.py), two
concurrencies, then `dcgm-bridge compare` and `compare --sweep concurrency` on the two folders as they are (issue 45:
"compared without extra steps"). Truths: each repeat's energy against the simulator's closed form over AIPerf's
window (within the stated bound), its energy per output token against AIPerf's own token count, the sweep's values
against the --concurrency each was run with."""

from __future__ import annotations

import subprocess
from datetime import datetime

import orjson
import pytest
from click.testing import CliRunner

from bridge.cli import main
from tests.sidecar.test_profile_aiperf import _env, _profile, aiperf, exporters, server, tokenizer  # noqa: F401

pytestmark = [pytest.mark.aiperf, pytest.mark.slow]
CONCURRENCIES = (2, 4)


def _ns(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1e6) * 1000


def test_repeats_compare_and_sweep_as_written(aiperf, tokenizer, server, exporters, tmp_path):  # noqa: F811
    used = exporters[0]
    folders = {concurrency: tmp_path / f"c{concurrency}" for concurrency in CONCURRENCIES}
    # The two series side by side (each waits on AIPerf's start-up and the sidecar's grace as much as it computes).
    runs = {}
    try:
        for concurrency, out in folders.items():
            argv = _profile("--repeat", "2", "--artifact-dir", str(out), "--gpu-telemetry", used.url, "--",
                            str(aiperf), "profile", "-m", "mock-model", "--url", server.url, "--endpoint-type",
                            "chat", "--tokenizer", str(tokenizer), "--request-count", "120", "--concurrency",
                            str(concurrency), "--synthetic-input-tokens-mean", "20", "--output-tokens-mean", "10",
                            "--artifact-dir", str(out), "--ui", "simple")
            with (tmp_path / f"c{concurrency}.log").open("w") as log:  # (a pipe left unread would stall it)
                runs[concurrency] = subprocess.Popen(argv, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                                                     text=True, cwd=tmp_path)
        for run in runs.values():
            run.wait(timeout=400)
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.wait()
    per_token: dict[int, list[float]] = {}
    for concurrency, out in folders.items():
        output = (tmp_path / f"c{concurrency}.log").read_text()
        assert runs[concurrency].returncode == 0, output[-3000:]
        assert "2 repeats in" in output, output[-2000:]
        for k in (1, 2):
            doc = orjson.loads((out / f"run_{k:04d}" / "profile_export_aiperf.json").read_bytes())
            assert doc["request_count"]["avg"] == 120
            energy = doc["nvidia_total_gpu_energy"]["avg"]
            truth = sum(used.model.energy_joules(g, _ns(doc["start_time"]), _ns(doc["end_time"])) for g in range(2))
            # Within the report's hard bound (a short window: measured 18 J off 3.5 kJ, stated ± 32 J, bound 400 J).
            assert abs(energy - truth) <= doc["nvidia_total_gpu_energy"]["bound"], (energy, truth)
            assert doc["nvidia_energy_per_output_token"]["avg"] == pytest.approx(energy * 1e3 / doc["total_osl"]["avg"])
            per_token.setdefault(concurrency, []).append(doc["nvidia_energy_per_output_token"]["avg"])
    args = [str(folders[c]) for c in CONCURRENCIES]
    compared = CliRunner().invoke(main, ["compare", "--include-invalid", "--json", *args])
    assert compared.exit_code == 0, compared.output
    doc = orjson.loads(compared.output)
    assert len(doc["baseline"]["runs"]) == 2 and len(doc["comparisons"][0]["runs"]) == 2
    row = doc["comparisons"][0]["metrics"]["energy_per_output_token"]
    expected = sum(per_token[4]) / 2 - sum(per_token[2]) / 2  # the repeats' own values, as AIPerf's JSON holds them
    assert not row["run_to_run_unknown"] and row["difference"] == pytest.approx(expected, rel=1e-9)
    assert row["interval"][0] < row["difference"] < row["interval"][1]
    swept = CliRunner().invoke(main, ["compare", "--include-invalid", "--sweep", "concurrency", "--json",
                                      *reversed(args)])
    assert swept.exit_code == 0, swept.output
    points = orjson.loads(swept.output)["points"]
    assert [p["value"] for p in points] == list(CONCURRENCIES)
    assert all(p["metrics"]["output_token_throughput"]["runs"] == 2 for p in points)


def test_aiperfs_own_profile_runs_each_get_their_window(aiperf, tokenizer, server, exporters, tmp_path):  # noqa: F811
    """`--num-profile-runs 2` (AIPerf's multi-run layout, profile_runs/run_NNNN/): each run's JSON gets the telemetry
    of its own window, and `compare` reads the folder as its two repeats."""
    used = exporters[1]
    out = tmp_path / "multi"
    argv = _profile("--artifact-dir", str(out), "--gpu-telemetry", used.url, "--",
                    str(aiperf), "profile", "-m", "mock-model", "--url", server.url, "--endpoint-type", "chat",
                    "--tokenizer", str(tokenizer), "--request-count", "120", "--concurrency", "4",
                    "--synthetic-input-tokens-mean", "20", "--output-tokens-mean", "10", "--num-profile-runs", "2",
                    "--artifact-dir", str(out), "--ui", "simple")
    result = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=500, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    windows = []
    for k in (1, 2):
        doc = orjson.loads((out / "profile_runs" / f"run_{k:04d}" / "profile_export_aiperf.json").read_bytes())
        energy = doc["nvidia_total_gpu_energy"]["avg"]
        start, end = _ns(doc["start_time"]), _ns(doc["end_time"])
        truth = sum(used.model.energy_joules(g, start, end) for g in range(2))
        assert abs(energy - truth) <= doc["nvidia_total_gpu_energy"]["bound"], (energy, truth)
        assert doc["telemetry_data"]["summary"]["start_time"] == doc["start_time"]
        windows.append((start, end))
    assert windows[0][1] <= windows[1][0]  # two runs, two windows
    compared = CliRunner().invoke(main, ["compare", "--include-invalid", "--until-width", "0.1", "--json", str(out)])
    assert compared.exit_code == 0, compared.output
    rows = orjson.loads(compared.output)["until_width"]["folders"][0]["metrics"]
    assert {r["metric"]: r["runs"] for r in rows}["energy_per_output_token"] == 2
    checked = CliRunner().invoke(main, ["validate", str(out)])  # each run against a rebuild over its own window
    assert checked.exit_code in (0, 1) and "Traceback" not in checked.output, checked.output
    assert "profile_runs/run_0001: measurement" in checked.output and "profile_runs/run_0002: measurement" in \
        checked.output
    assert not {"report_differs", "hash_mismatch", "window_differs"} & set(checked.output.replace(",", " ").split())
