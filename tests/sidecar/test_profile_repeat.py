"""`dcgm-bridge profile --repeat N` (issue 45): each repeat a run of its own in run_NNNN/ (its records carry its own
run id), the artifact folder locked once for the whole, a failing repeat stops the series with its exit code, the
repeats read back by `compare`; AIPerf's artifact folder moved per repeat."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
from click.testing import CliRunner

from bridge.cli import main
from bridge.record_log import read_records
from bridge.sidecar.folder_lock import LOCK_FILE, FolderLock
from bridge.sidecar.repeat import repeat_command
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.sidecar.test_profile import BENCHMARK

# The marks benchmark of test_profile, writing which repeat it was told it is, failing where FAIL_AT says.
SCRIPT = BENCHMARK.replace("sys.exit(7)", """
folder = os.environ["DCGM_BRIDGE_REPEAT_DIR"]
open(os.path.join(folder, "told.txt"), "w").write(os.environ["DCGM_BRIDGE_REPEAT"])
sys.exit(7 if os.environ["DCGM_BRIDGE_REPEAT"] == os.environ.get("FAIL_AT") else 0)""")


def _profile(tmp_path: Path, monkeypatch, out: Path, repeats: int, *extra: str) -> object:
    script = tmp_path / "bench.py"
    script.write_text(SCRIPT)
    return CliRunner().invoke(main, ["profile", "--repeat", str(repeats), "--artifact-dir", str(out), "--run-id",
                                     "r-45", *extra, "--", sys.executable, str(script)])


def test_three_repeats_each_in_its_own_folder_with_its_own_records(tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        monkeypatch.setenv("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS", f"127.0.0.1:{exporter.port}")
        monkeypatch.setenv("AIPERF_GPU_COLLECTION_INTERVAL", "0.05")
        result = _profile(tmp_path, monkeypatch, out, 3)
    assert result.exit_code == 0, result.output
    for k in (1, 2, 3):
        folder = out / f"run_{k:04d}"
        assert (folder / "told.txt").read_text() == str(k)
        assert {r.run_id for r in read_records(folder / "gpu_telemetry_export.jsonl")} == {f"r-45-{k:04d}"}
        report = orjson.loads((folder / "profile_export_aiperf.json").read_bytes())
        assert report["telemetry_data"]["summary"]["endpoints_successful"]  # (its verdict: the machine's load)
    assert not (out / LOCK_FILE).exists() and not (out / "gpu_telemetry_export.jsonl").exists()
    assert "3 repeats in" in result.output and "Total GPU Energy:" in result.output
    compared = CliRunner().invoke(main, ["compare", "--until-width", "0.1", "--include-invalid", "--json", str(out)])
    assert compared.exit_code == 0, compared.output
    rows = orjson.loads(compared.output)["until_width"]["folders"][0]["metrics"]
    assert {r["metric"]: r["runs"] for r in rows}["total_gpu_energy"] == 3
    # validate checks each repeat's report against a rebuild from its own files (its verdict may still be NOT
    # valid for this busy machine's scrapes, never for a difference from what the sidecar wrote).
    checked = CliRunner().invoke(main, ["validate", str(out)])
    assert checked.exit_code in (0, 1) and "Traceback" not in checked.output, checked.output
    assert [line.split(":")[0] for line in checked.output.splitlines() if line.startswith("run_")] == \
        ["run_0001", "run_0002", "run_0003"]
    assert not {"report_differs", "hash_mismatch", "window_differs"} & set(checked.output.replace(",", " ").split())


def test_a_failing_repeat_stops_the_series_and_a_held_folder_is_refused(tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        monkeypatch.setenv("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS", f"127.0.0.1:{exporter.port}")
        monkeypatch.setenv("AIPERF_GPU_COLLECTION_INTERVAL", "0.05")
        monkeypatch.setenv("FAIL_AT", "2")
        result = _profile(tmp_path, monkeypatch, out, 3)
        assert result.exit_code == 7 and "repeat 2 of 3 failed" in result.output
        assert (out / "run_0002" / "profile_export_aiperf.json").exists() and not (out / "run_0003").exists()
        held = FolderLock(out, "someone-else")
        held.acquire()
        try:
            result = _profile(tmp_path, monkeypatch, out, 2)
        finally:
            held.release()
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert (out / "run_0001" / "told.txt").read_text() == "1"  # the earlier series' files untouched


def test_aiperfs_artifact_folder_moves_to_each_repeats_folder() -> None:
    folder = Path("/x/out/run_0002")
    assert repeat_command(["aiperf", "profile", "-m", "m", "--artifact-dir", "/x/out", "--ui", "simple"], 2,
                          folder) == ["aiperf", "profile", "-m", "m", "--artifact-dir", "/x/out/run_0002", "--ui",
                                      "simple"]
    assert repeat_command(["aiperf", "profile", "--output-artifact-dir=rel"], 3, folder) == \
        ["aiperf", "profile", "--output-artifact-dir=rel/run_0003"]
    assert repeat_command(["aiperf", "profile", "-m", "m"], 2, folder) == \
        ["aiperf", "profile", "-m", "m", "--artifact-dir", "/x/out/run_0002"]
    assert repeat_command(["python", "bench.py", "--artifact-dir", "a"], 2, folder) == \
        ["python", "bench.py", "--artifact-dir", "a"]  # not AIPerf: as given
