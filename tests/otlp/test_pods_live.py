"""`sidecar --gpu-pods` live (issue 31): OTLP and the pull /metrics page carry only the GPUs of matching pods, each
point with its pod as OpenTelemetry's `k8s.*` attributes, while the record log keeps every GPU. A real
VictoriaMetrics receives the OTLP; the simulator serves a shared node (one GPU per pod, four pods)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fields import default_table
from bridge.otlp import OtlpForwarder, resolve_config
from bridge.parse import parse_page
from bridge.record_log import read_dicts
from bridge.sidecar.session import Session
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.otlp.conftest import VictoriaMetrics, prom_query
from tests.sidecar.helpers import scrape_synchronously

pytestmark = pytest.mark.realstack  # VictoriaMetrics

OURS = "llm-bench/llm-server-[01]"


def _session(out: Path, url: str, run_id: str, store: VictoriaMetrics | None, gpu_pods: tuple[str, ...]) -> Session:
    forwarder = None
    if store is not None:
        otlp = resolve_config({}, endpoint=store.otlp_url, export_interval_s=0.2)
        forwarder = OtlpForwarder(otlp, base_resource={"service.name": "dcgm-exporter"})
    config = Config(telemetry=TelemetryItems(urls=[url]), default_endpoints=[], artifact_dir=str(out),
                    collection_interval=0.05, scrape_timeout=1.0, connect_timeout=0.5, run_id=run_id,
                    shutdown_delay=3.0, gpu_pods=gpu_pods)
    session = Session(config, default_table(), forwarder=forwarder)
    session.configure()
    return session


def _pods_of_page(body: bytes) -> set[str]:
    return {s.labels["pod"] for s in parse_page(body).samples if s.name == "DCGM_FI_DEV_POWER_USAGE"}


def _live_warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    """What the run said while scraping (not the report at its end)."""
    return [r.getMessage() for r in caplog.records if r.name == "bridge.sidecar.pod_sinks" and text in r.getMessage()]


def test_otlp_and_metrics_forward_only_the_gpus_of_matching_pods_with_the_pod_as_attributes(
        victoria_metrics: VictoriaMetrics, tmp_path: Path) -> None:
    run = "pods-live-1"
    with SimulatedExporter(SimulatorConfig(gpus=4, seed=31, pod_labels="mapped")) as exporter:
        session = _session(tmp_path, exporter.url, run, victoria_metrics, (OURS,))
        scrape_synchronously(session, 3)
        assert _pods_of_page(session.exposition()) == {"llm-server-0", "llm-server-1"}
        session.complete()
    logged = {d["pod_name"] for d in read_dicts(session.records.path)}
    assert logged == {"llm-server-0", "llm-server-1", "llm-server-2", "llm-server-3"}  # the log keeps every GPU
    victoria_metrics.flush()
    stored = prom_query(victoria_metrics.base, f'DCGM_FI_DEV_POWER_USAGE{{run_id="{run}"}}[10m]', time.time())
    labels = [series["metric"] for series in stored]
    assert {m["pod"] for m in labels} == {"llm-server-0", "llm-server-1"}
    assert all(m["k8s.pod.name"] == m["pod"] and m["k8s.namespace.name"] == "llm-bench"
               and m["k8s.container.name"] == "vllm" for m in labels)


def test_an_exporter_without_pod_labels_is_warned_about_at_its_first_scrape_and_nothing_is_forwarded(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=32)) as exporter:
        session = _session(tmp_path, exporter.url, "pods-live-2", None, (OURS,))
        with caplog.at_level(logging.WARNING):
            scrape_synchronously(session, 3)
        page = session.exposition()
        session.complete()
    warned = _live_warnings(caplog, "no GPU carries pod labels")
    assert len(warned) == 1  # at the first scrape, once (the report says it again at the end)
    assert "DCGM_EXPORTER_KUBERNETES=true" in warned[0] and "/var/lib/kubelet/pod-resources" in warned[0]
    assert b"DCGM_FI_DEV_POWER_USAGE" not in page
    assert len({d["gpu_uuid"] for d in read_dicts(session.records.path)}) == 2


def test_an_exporter_whose_pods_do_not_match_is_warned_about_with_the_pattern(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=33, pod_labels="mapped")) as exporter:
        session = _session(tmp_path, exporter.url, "pods-live-3", None, ("other-ns/*",))
        with caplog.at_level(logging.WARNING):
            scrape_synchronously(session, 2)
        session.complete()
    warned = _live_warnings(caplog, "no GPU is attributed to a pod matching")
    assert len(warned) == 1 and "other-ns/*" in warned[0]
