"""`dcgm-bridge profile -- aiperf profile …` against the real AIPerf 0.13.0 (PyPI), offline.

AIPerf runs from its own venv in the cache (scripts/install-aiperf.sh, run by `make servers`; installed
here when missing), against a small OpenAI-compatible server on loopback and simulated exporters, with
a tokenizer trained here by the `tokenizers` package (AIPerf's dependency) on text the test ships: no
hub download. The tokenizer sits in a test-local Hugging Face cache, as a downloaded one would, and AIPerf
runs with HF_HUB_OFFLINE (a warm cache): a folder path would not do offline (AIPerf 0.13's loader goes
through huggingface_hub even for a folder), and online AIPerf spends 2 s a run prefetching it in a
subprocess. Each run is a few hundred requests.
"""

from __future__ import annotations

import csv
import io
import math
import os
import pty
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.sidecar.aiperf import phase_from_document
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.conftest import CACHE, DATA
from tests.sidecar.openai_mock import OpenAIMock

pytestmark = [pytest.mark.aiperf, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
AIPERF_VENV = CACHE / "bench-aiperf-0.13.0"
GRACE_S = 0.666
TRAIN = """
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tokenizer.train_from_iterator(Path(sys.argv[2]).read_text().splitlines(), trainer)
tokenizer.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "model_max_length": 100000}))
(out / "config.json").write_text("{}")
"""


@pytest.fixture(scope="module")
def aiperf() -> Path:
    binary = AIPERF_VENV / "bin" / "aiperf"
    if not (binary.exists() and (AIPERF_VENV / ".complete").exists()):
        result = subprocess.run(["bash", str(ROOT / "scripts" / "install-aiperf.sh")], capture_output=True,
                                text=True, timeout=900)
        if result.returncode != 0:
            pytest.fail(f"installing aiperf==0.13.0 failed: {result.stderr[-2000:]}")
    return binary


TOKENIZER = "local/bridge-tokenizer"


@pytest.fixture(scope="module")
def tokenizer(aiperf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tokenizer's name, TOKENIZER, in a Hugging Face cache of the module's own (HF_HOME, HF_HUB_OFFLINE
    while the module runs, which _env passes on): the cache's layout, models--<org>--<name>/snapshots/<rev>/ with
    refs/main naming <rev>, is how huggingface_hub finds a downloaded model offline."""
    home = tmp_path_factory.mktemp("hf")
    revision = "0" * 40
    model = home / "hub" / f"models--{TOKENIZER.replace('/', '--')}"
    subprocess.run([str(aiperf.parent / "python"), "-c", TRAIN, str(model / "snapshots" / revision),
                    str(DATA / "aiperf" / "corpus.txt")], check=True, timeout=120)
    (model / "refs").mkdir()
    (model / "refs" / "main").write_text(revision)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(home))
        patch.setenv("HF_HUB_OFFLINE", "1")
        yield TOKENIZER


@pytest.fixture(scope="module")
def server() -> OpenAIMock:
    with OpenAIMock() as mock:
        yield mock


@pytest.fixture(scope="module")
def exporters() -> list[SimulatedExporter]:
    sims = [SimulatedExporter(SimulatorConfig(gpus=2, seed=10 + i)).start() for i in range(2)]
    yield sims
    for sim in sims:
        sim.stop()


def _env() -> dict[str, str]:
    # AIPerf's server-metrics flush (2 s of waiting after the last request, for the LLM server's /metrics) is
    # skipped: the mock has no metrics page (AIPerf disables it), and nothing here reads server metrics.
    return {**os.environ, "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "AIPERF_GPU_COLLECTION_INTERVAL": "0.1",
            "AIPERF_SERVER_METRICS_COLLECTION_FLUSH_PERIOD": "0", "HF_HUB_DISABLE_TELEMETRY": "1",
            "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "160"}


def _aiperf_args(aiperf: Path, server: OpenAIMock, tokenizer: str, requests: int, *extra: str) -> list[str]:
    return [str(aiperf), "profile", "-m", "mock-model", "--url", server.url, "--endpoint-type", "chat",
            "--tokenizer", str(tokenizer), "--request-count", str(requests), "--concurrency", "4",
            "--synthetic-input-tokens-mean", "20", "--output-tokens-mean", "10", *extra]


def _profile(*args: str) -> list[str]:
    return [sys.executable, "-m", "bridge.cli", "profile", *args]


def _local(ns: int) -> str:
    """Naive local time, µs truncated (the report's format)."""
    return datetime.fromtimestamp(ns // 10**9).replace(microsecond=ns // 1000 % 10**6).isoformat()


def _assert_efficiency_from_aiperfs_counts(doc: dict) -> None:
    energy = doc["nvidia_total_gpu_energy"]["avg"]
    power = doc["nvidia_average_gpu_power"]["avg"]
    osl, isl = doc["total_osl"]["avg"], doc["total_isl"]["avg"]
    requests, latency_ms = doc["request_count"]["avg"], doc["request_latency"]["avg"]
    expected = {
        "nvidia_output_tokens_per_joule": ("tokens/J", osl / energy),
        "nvidia_energy_per_output_token": ("mJ/token", energy * 1e3 / osl),
        "nvidia_energy_per_total_token": ("mJ/token", energy * 1e3 / (isl + osl)),
        "nvidia_energy_per_request": ("joules/request", energy / requests),
        "nvidia_energy_per_user": ("joules/user", energy / 4),  # --concurrency 4
        "nvidia_energy_delay_product": ("J*s", energy / requests * latency_ms / 1e3),
        "nvidia_performance_per_watt": ("requests/sec/W", doc["request_throughput"]["avg"] / power),
        "nvidia_output_tps_per_watt": ("tokens/sec/W", doc["output_token_throughput"]["avg"] / power),
    }
    for tag, (unit, value) in expected.items():
        assert doc[tag]["unit"] == unit and doc[tag]["avg"] == pytest.approx(value, rel=1e-9), tag
    keys = list(doc)
    family = [k for k in keys if k.startswith("nvidia_")]
    assert keys[-len(family):] == family  # last, as AIPerf's own telemetry would put them
    assert family == ["nvidia_total_gpu_power", "nvidia_average_gpu_power", "nvidia_total_gpu_energy",
                      *expected][: len(family)]
    assert keys[keys.index("telemetry_data") + 1] == "input_config"


def _assert_csv_merged(path: Path, endpoints: set[str]) -> None:
    text = path.read_bytes().decode()
    single = text.split("Metric,Value\r\n")[1].split("\r\n\r\n")[0]
    names = [row[0] for row in csv.reader(io.StringIO(single))]
    assert {"Total GPU Energy (J)", "Energy per Output Token (mJ/token)", "Energy per User (joules/user)"} <= set(names)
    telemetry = list(csv.reader(io.StringIO(text.split("\r\n\r\n\r\n")[-1])))
    assert telemetry[0][:6] == ["Endpoint", "GPU_Index", "GPU_Name", "GPU_UUID", "Platform", "Metric"]
    assert {row[0] for row in telemetry[1:]} == endpoints


@pytest.mark.parametrize("layout", ["subfolder-one-exporter", "same-folder-two-exporters"])
def test_aiperfs_own_files_carry_the_telemetry(layout, aiperf, tokenizer, server, exporters, tmp_path):
    out = tmp_path / "out"
    if layout == "subfolder-one-exporter":
        # The bridge's --gpu-telemetry; AIPerf in a folder of its own below OUT, with a warmup (a manifest).
        used = exporters[:1]
        aiperf_dir, prefix = out / "aiperf", None
        argv = _profile("--artifact-dir", str(out), "--gpu-telemetry", used[0].url, "--",
                        *_aiperf_args(aiperf, server, tokenizer, 300, "--warmup-request-count", "20",
                                      "--artifact-dir", str(aiperf_dir), "--ui", "simple"))
    else:
        # AIPerf's own --gpu-telemetry A B (taken over), one folder for both, AIPerf's prefix, one phase.
        used = exporters
        aiperf_dir, prefix = out, "run1"
        argv = _profile("--artifact-dir", str(out), "--",
                        *_aiperf_args(aiperf, server, tokenizer, 300, "--gpu-telemetry", *[e.url for e in used],
                                      "--artifact-dir", str(out), "--profile-export-file", "run1.json",
                                      "--ui", "simple"))
    result = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    json_path = aiperf_dir / f"{prefix or 'profile_export_aiperf'}.json"
    doc = orjson.loads(json_path.read_bytes())
    assert doc["aiperf_version"] == "0.13.0" and doc["request_count"]["avg"] == 300
    telemetry = doc["telemetry_data"]
    endpoints = {e.url.split("//")[1].removesuffix("/metrics") for e in used}
    assert set(telemetry["endpoints"]) == endpoints
    assert all(len(body["gpus"]) == 2 for body in telemetry["endpoints"].values())
    gpu = next(iter(next(iter(telemetry["endpoints"].values()))["gpus"].values()))
    assert gpu["metrics"]["nvidia_power_usage"]["count"] >= 10
    _assert_efficiency_from_aiperfs_counts(doc)
    _assert_csv_merged(aiperf_dir / f"{prefix or 'profile_export_aiperf'}.csv", endpoints)
    # The window is AIPerf's: its manifest's profiling phase, else its JSON's start and end.
    summary = telemetry["summary"]
    if layout == "subfolder-one-exporter":
        manifest = orjson.loads((aiperf_dir / "phase_manifest.json").read_bytes())["phases"]
        profiling = next(p for p in manifest if p["phase_kind"] == "profiling")
        assert summary["start_time"] == _local(profiling["start_ns"])
        assert summary["end_time"] == _local(profiling["end_ns"] + int(GRACE_S * 1e9))
        assert (aiperf_dir / "phases" / "profiling" / "gpu_telemetry.json").exists()
        assert not (aiperf_dir / "gpu_telemetry_export.jsonl").exists()  # AIPerf did not scrape
        start_ns, end_ns = profiling["start_ns"], profiling["end_ns"]
    else:
        assert summary["start_time"] == doc["start_time"]
        assert "dcgm-bridge collects the GPU telemetry (--gpu-telemetry" in result.stderr
        start_ns = int(datetime.fromisoformat(doc["start_time"]).timestamp() * 1e6) * 1000
        end_ns = int(datetime.fromisoformat(doc["end_time"]).timestamp() * 1e6) * 1000
    # The energy over AIPerf's window against the simulators' ground truth (measured: 0.004 % and 0.06 %).
    truth = sum(e.model.energy_joules(g, start_ns, end_ns) for e in used for g in range(2))
    assert doc["nvidia_total_gpu_energy"]["avg"] == pytest.approx(truth, rel=0.005)
    records = [orjson.loads(line) for line in (out / "gpu_telemetry_export.jsonl").read_bytes().splitlines()]
    assert records and all("run_id" in r for r in records)  # the bridge's log, not AIPerf's
    assert "Files:" in result.stdout and str(json_path) in result.stdout.replace("\n", "")
    _assert_requests_sum(aiperf_dir, prefix, doc)
    # validate rebuilds all of it (JSON, CSV, phase files) over the window AIPerf's files gave, which the events
    # file records as phase marks (issue 43); given that window the way `report` takes it, the same.
    validated = CliRunner().invoke(main, ["validate", str(out)])
    assert validated.exit_code == 0, validated.output
    assert "(from the events file's phase marks)" in validated.output
    if layout == "subfolder-one-exporter":
        window = ["--phase-manifest", str(aiperf_dir / "phase_manifest.json")]
    else:
        phase = phase_from_document(doc)
        assert phase is not None
        window = ["--start-ns", str(phase.start_ns), "--end-ns", str(phase.end_ns)]
    given = CliRunner().invoke(main, ["validate", str(out), *window])
    assert given.exit_code == 0, given.output


def _assert_requests_sum(aiperf_dir: Path, prefix: str | None, doc: dict) -> None:
    """Issue 46: each request's energy from AIPerf's own per-request records (profile_export.jsonl, or
    <prefix>.jsonl), one line per request id; with the unattributed energy they add up to the GPUs' energy."""
    aiperf_records = (aiperf_dir / f"{prefix or 'profile_export'}.jsonl").read_bytes().splitlines()
    metadata = [orjson.loads(line)["metadata"] for line in aiperf_records]
    ids = [m.get("x_request_id") or str(m["session_num"]) for m in metadata if m["benchmark_phase"] == "profiling"]
    lines = [orjson.loads(line) for line in (aiperf_dir / "gpu_telemetry_requests.jsonl").read_bytes().splitlines()]
    assert [line["request_id"] for line in lines] == ids and len(ids) == 300
    block = doc["telemetry_data"]["requests"]
    assert block["input"]["file"] == f"{prefix or 'profile_export'}.jsonl" and block["requests_attributed"] > 0
    total = doc["nvidia_total_gpu_energy"]["avg"]
    parts = math.fsum([*(line["energy_j"] for line in lines), block["unattributed_j"]])
    assert abs(parts - total) <= 1e-9 * total, (parts, total)


def _wait_requests(server: OpenAIMock, count: int, process: subprocess.Popen, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    start = server.requests
    while server.requests < start + count:
        assert process.poll() is None, "profile exited before the benchmark ran"
        assert time.monotonic() < deadline, "AIPerf sent no requests"
        time.sleep(0.1)


def _cancelled_report(out: Path) -> dict:
    doc = orjson.loads((out / "profile_export_aiperf.json").read_bytes())
    assert doc["was_cancelled"] is True and 0 < doc["request_count"]["avg"] < 3000
    summary = doc["telemetry_data"]["summary"]
    assert summary["start_time"] == doc["start_time"]  # the window: AIPerf's, ending at its cancel
    end = datetime.fromisoformat(doc["end_time"]).timestamp() + GRACE_S
    assert datetime.fromisoformat(summary["end_time"]).timestamp() == pytest.approx(end, abs=2e-6)
    assert doc["telemetry_data"]["endpoints"] and doc["nvidia_total_gpu_energy"]["avg"] > 0
    return doc


def test_one_ctrl_c_on_the_terminal_reaches_aiperf_once_and_its_results_are_kept(
        aiperf, tokenizer, server, exporters, tmp_path):
    out = tmp_path / "out"
    master, slave = pty.openpty()
    argv = _profile("--artifact-dir", str(out), "--gpu-telemetry", exporters[0].url, "--",
                    *_aiperf_args(aiperf, server, tokenizer, 3000, "--artifact-dir", str(out), "--ui", "simple"))

    def controlling_terminal() -> None:  # a session of its own whose terminal is the pty, as in a shell
        import fcntl

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(argv, env=_env(), stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path,
                               start_new_session=True, preexec_fn=controlling_terminal)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        _wait_requests(server, 200, process)
        os.write(master, b"\x03")  # Ctrl-C: the terminal signals its foreground group (AIPerf's, not ours)
        code = process.wait(120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        reader.join(5)
        os.close(master)
    output = b"".join(chunks).decode(errors="replace")
    assert code == 130, output[-3000:]
    assert output.count("BENCHMARK CANCELLED") == 1 and "FORCE QUIT" not in output
    _cancelled_report(out)
    assert "cancelled" in output


def test_sigterm_to_profile_becomes_one_sigint_to_aiperf(aiperf, tokenizer, server, exporters, tmp_path):
    out = tmp_path / "out"
    argv = _profile("--artifact-dir", str(out), "--gpu-telemetry", exporters[1].url, "--",
                    *_aiperf_args(aiperf, server, tokenizer, 3000, "--artifact-dir", str(out / "aiperf")))
    log = (tmp_path / "profile.log").open("wb")
    process = subprocess.Popen(argv, env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    log.close()
    try:
        _wait_requests(server, 200, process)
        process.send_signal(signal.SIGTERM)
        code = process.wait(120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = (tmp_path / "profile.log").read_text(errors="replace")
    assert code == 143, output[-3000:]
    assert output.count("BENCHMARK CANCELLED") == 1 and "FORCE QUIT" not in output
    _cancelled_report(out / "aiperf")
    assert not list(out.glob(".dcgm-bridge-spool-*"))  # finished, not killed: the spool is gone


def test_a_slow_exporter_refresh_reaches_aiperfs_files_with_the_bound(aiperf, tokenizer, server, tmp_path):
    """An exporter refreshing every second (ten scrapes a refresh): the report in AIPerf's own JSON times the
    energy at DCGM's refresh, carries the bound beside AIPerf's keys, and the run waited for the refresh that
    brackets the window's end (issue 15)."""
    out = tmp_path / "out"
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=31, refresh_ms=1000)) as exporter:
        argv = _profile("--artifact-dir", str(out), "--gpu-telemetry", exporter.url, "--",
                        *_aiperf_args(aiperf, server, tokenizer, 600, "--artifact-dir", str(out), "--ui", "simple"))
        result = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        doc = orjson.loads((out / "profile_export_aiperf.json").read_bytes())
        start_ns = int(datetime.fromisoformat(doc["start_time"]).timestamp() * 1e6) * 1000
        end_ns = int(datetime.fromisoformat(doc["end_time"]).timestamp() * 1e6) * 1000
        truth = sum(exporter.model.energy_joules(g, start_ns, end_ns) for g in range(2))
    (body,) = doc["telemetry_data"]["endpoints"].values()
    assert body["refresh"]["fresh"] is False and body["refresh"]["period_s"] == pytest.approx(1.0, rel=0.05)
    energy = doc["nvidia_total_gpu_energy"]
    assert set(energy) == {"unit", "avg", "uncertainty", "bound"} and energy["unit"] == "J"
    assert 0 < energy["uncertainty"] <= energy["bound"]
    assert abs(energy["avg"] - truth) <= energy["bound"]
    assert energy["avg"] == pytest.approx(truth, rel=0.02)
    gpu = next(iter(body["gpus"].values()))["metrics"]
    assert gpu["nvidia_energy_consumption"]["bound"] > 0 and gpu["nvidia_power_usage"]["refreshes"] >= 2
    records = [orjson.loads(line) for line in (out / "gpu_telemetry_export.jsonl").read_bytes().splitlines()]
    after = {r["telemetry_data"]["nvidia_energy_consumption"] for r in records
             if r["timestamp_ns"] > end_ns and r["gpu_index"] == 0}
    assert len(after) >= 2  # a new refresh came after the window's end before the run was closed
