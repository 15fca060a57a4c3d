"""`sidecar --gpu-pod-selector`: the selected pods become the report's `--gpu-pods` selection and the exporters on
their nodes are scraped (the API answers are the recorded ones tests/kube/test_pod_discovery.py reads)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.errors import ConfigError
from bridge.sidecar.pod_discovery import with_selected_pods
from tests.kube.test_pod_discovery import RecordingApi


def test_the_selected_pods_are_the_reports_selection_and_their_nodes_exporters_are_scraped() -> None:
    api = RecordingApi()
    config = Config(telemetry=TelemetryItems(urls=["http://given:9400/metrics"],
                                             discovery=["k8s://gpu-operator/nvidia-dcgm-exporter"]))
    resolved, pods, *_ = with_selected_pods(config, ["bench/app=llama"], api, api, now_ns=lambda: 1234)
    assert resolved.telemetry.urls == ["http://given:9400/metrics", "http://10.0.1.5:9400/metrics",
                                       "http://10.0.2.7:9400/metrics"]
    assert resolved.telemetry.discovery == []
    assert resolved.gpu_pods == ("bench/llama-0", "bench/llama-1")
    # what the events file records, so `report --gpu-pod-selector` can apply the selector offline
    assert (pods.time_ns, pods.selectors) == (1234, ("bench/app=llama",))
    assert [(p.namespace, p.name, p.node, p.labels["app"]) for p in pods.pods] == [
        ("bench", "llama-0", "gpu-node-a", "llama"), ("bench", "llama-1", "gpu-node-b", "llama")]


def test_a_selector_the_api_refuses_is_a_configuration_error_naming_the_fix() -> None:
    from kubernetes.client.exceptions import ApiException

    api = RecordingApi(pods_error=ApiException(status=403, reason="Forbidden"))
    with pytest.raises(ConfigError, match="not allowed to list pods in namespace bench"):
        with_selected_pods(Config(), ["bench/app=llama"], api, api)


def test_outside_a_cluster_the_sidecar_says_so_in_one_line_and_exits_2(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = CliRunner().invoke(main, ["sidecar", "--gpu-pod-selector", "bench/app=llama", "--gpu-pods", "bench/x-*",
                                       "--artifact-dir", str(tmp_path / "out"), "--health-port", "0"])
    assert result.exit_code == 2, result.output
    assert "--gpu-pod-selector needs the Kubernetes API from inside a pod" in result.output
    assert result.output.count("\n") == 1


def test_the_sidecar_parses_every_argument_kube_profile_gives_it_with_pods_and_a_selector() -> None:
    import yaml

    from bridge.sidecar.cli import sidecar
    from tests.kube.test_cli import dry_run, sidecar_of

    result = dry_run("--namespace", "bench", "--gpu-pods", "bench/llama-*", "--gpu-pod-selector", "bench/app=llama")
    assert result.exit_code == 0, result.output
    container = sidecar_of(list(yaml.safe_load_all(result.stdout))[-1])
    assert container is not None
    args = container["args"]
    context = sidecar.make_context("sidecar", list(args))
    assert context.params["gpu_pods"] == ("bench/llama-*",)
    assert context.params["gpu_pod_selectors"] == ("bench/app=llama",)
