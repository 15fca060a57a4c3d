"""Time-slicing and MPS (issue 31): dcgm-exporter with KUBERNETES_VIRTUAL_GPUS writes a shared GPU's series once
per pod (a `vgpu` label apart). Such a GPU serving a benchmark pod and another pod is the whole board's energy:
it is not forwarded live, and the report lists it apart with its verdict reason, live and offline (the record log
keeps one pod per GPU and scrape; the events file's `gpu_shared` events keep the others)."""

from __future__ import annotations

import itertools
import logging
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.parse import parse_page
from bridge.record_log import read_dicts
from bridge.select import shared_gpus
from tests.loopback import LoopbackServer, send
from tests.sidecar.helpers import scrape_synchronously, session_for

_SERIES = [  # (uuid, gpu, namespace, pod, vgpu): GPU-a is time-sliced, the benchmark's pod listed first
    ("GPU-a", 0, "bench", "llm-0", "0"), ("GPU-a", 0, "other", "job-0", "1"), ("GPU-b", 1, "bench", "llm-1", None)]


def _page(scrape: int) -> bytes:
    lines = ["# TYPE DCGM_FI_DEV_POWER_USAGE gauge", "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter"]
    for name, value in (("DCGM_FI_DEV_POWER_USAGE", 200.0), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                                                              1_000_000 + 10_000 * scrape)):
        for uuid, gpu, namespace, pod, vgpu in _SERIES:
            extra = f',vgpu="{vgpu}"' if vgpu else ""
            lines.append(f'{name}{{gpu="{gpu}",UUID="{uuid}",modelName="NVIDIA H100",Hostname="node-a",'
                         f'container="c",namespace="{namespace}",pod="{pod}"{extra}}} {value}')
    return ("\n".join(lines) + "\n").encode()


def test_a_page_shows_which_gpus_serve_several_pods_at_once() -> None:
    shared = shared_gpus(parse_page(_page(0)))
    assert {gpu: sorted(map(str, pods)) for gpu, pods in shared.items()} == {
        ("GPU-a", None): ["bench/llm-0", "other/job-0"]}


def test_a_time_sliced_gpu_shared_with_another_pod_is_not_forwarded_and_is_reported_apart_live_and_offline(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    scrapes = itertools.count()

    def respond(handler: BaseHTTPRequestHandler) -> None:
        send(handler, _page(next(scrapes)))

    with LoopbackServer(respond) as exporter, caplog.at_level(logging.WARNING):
        session = session_for([exporter.url], tmp_path, run_id="sliced", gpu_pods=("bench/llm-*",))
        session.configure()
        scrape_synchronously(session, 4)
        exposition = session.exposition()
        session.complete()
    assert b"GPU-b" in exposition and b"GPU-a" not in exposition
    assert {d["pod_name"] for d in read_dicts(session.records.path) if d["gpu_uuid"] == "GPU-a"} == {"llm-0"}
    said = [r.getMessage() for r in caplog.records if "at once (time-slicing or MPS)" in r.getMessage()]
    assert len(said) == 1 and "bench/llm-0, other/job-0" in said[0]
    events = [d for d in read_dicts(session.events.path) if d["type"] == "gpu_shared"]
    assert [(e["gpu_uuid"], e["pods"]) for e in events] == [("GPU-a", ["bench/llm-0", "other/job-0"])]

    assert session.outputs is not None and session.outputs.report is not None
    live = session.outputs.report.telemetry_data
    assert [g["gpu_uuid"] for g in live["pods"]["gpus"]] == ["GPU-b"]
    (shared,) = live["pods"]["shared"]
    assert (shared["gpu_uuid"], shared["reason"], shared["sharing"]) == (
        "GPU-a", "gpu_shared_with_other_pods", "time_slicing_or_mps")
    assert "gpu_shared_with_other_pods" in live["measurement"]["reasons"]

    out = tmp_path / "offline.json"
    result = CliRunner().invoke(main, ["report", "--jsonl", str(session.records.path), "--events",
                                       str(session.events.path), "--gpu-pods", "bench/llm-*", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert orjson.loads(out.read_bytes())["telemetry_data"]["pods"] == live["pods"]
    assert "not counted (gpu_shared_with_other_pods, time_slicing_or_mps: bench/llm-0, other/job-0)" in result.output
