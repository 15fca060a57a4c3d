"""--gpu-pod-selector discovery against the test API server, where it can serve the types: EndpointSlices come
from an EndpointSlice stand-in CRD (tests/kube/endpointslice_crd.yaml: group discovery.k8s.io, the built-in's
schema), read by the real DiscoveryV1Api; pods (no core API on this server) from the recorded responses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.discovery import DiscoveryError, parse_pod_selector, pod_endpoints
from tests.kube.conftest import KubeAPI, install_crd
from tests.kube.test_pod_discovery import DATA, RecordingApi

pytestmark = pytest.mark.kubeapi

CRD = Path(__file__).parent / "endpointslice_crd.yaml"


@pytest.fixture(scope="module")
def slices_api(kube_api: KubeAPI) -> Iterator[KubeAPI]:
    from kubernetes import client

    ext = client.ApiextensionsV1Api(kube_api.clients().api_client)
    crd = yaml.safe_load(CRD.read_text())
    install_crd(kube_api, crd)
    yield kube_api
    ext.delete_custom_resource_definition(crd["metadata"]["name"], _preload_content=False)


def _create_recorded_slices(api: KubeAPI, namespace: str) -> None:
    custom = api.clients().custom
    recorded: dict[str, Any] = json.loads((DATA / "endpointslices_dcgm_exporter.json").read_text())
    for item in recorded["items"]:
        body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", **item,
                "metadata": {"name": item["metadata"]["name"], "labels": item["metadata"]["labels"]}}
        custom.create_namespaced_custom_object("discovery.k8s.io", "v1", namespace, "endpointslices", body)


def test_discovery_lists_the_exporters_endpointslices_through_the_api_and_keeps_the_pods_nodes(
        slices_api: KubeAPI, namespace: str) -> None:
    _create_recorded_slices(slices_api, namespace)
    found = pod_endpoints([parse_pod_selector("bench/app=llama")], RecordingApi(), slices_api.clients().discovery,
                          f"k8s://{namespace}/nvidia-dcgm-exporter")
    assert found.urls == ("http://10.0.1.5:9400/metrics", "http://10.0.2.7:9400/metrics")


def test_a_sidecar_without_the_endpointslice_role_is_told_what_to_grant(slices_api: KubeAPI, namespace: str) -> None:
    nobody = slices_api.clients(slices_api.nobody_kubeconfig).discovery
    with pytest.raises(DiscoveryError, match=f"not allowed to list EndpointSlices in namespace {namespace}"):
        pod_endpoints([parse_pod_selector("bench/app=llama")], RecordingApi(), nobody,
                      f"k8s://{namespace}/nvidia-dcgm-exporter")


def test_the_watch_follows_an_exporter_endpoint_that_becomes_ready_on_a_selected_pods_node(
        slices_api: KubeAPI, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    """The EndpointSlices are watched through the API server (the real client's Watch over its wire form): the
    exporter on the node a pod was rescheduled to comes up during the run and is scraped from then on."""
    from bridge.config import Config
    from bridge.endpoints import TelemetryItems
    from bridge.sidecar.pod_discovery import follow, with_selected_pods
    from tests.kube.test_pod_watch import NODE_C, Followed, FollowedApi, _wait

    recorded: dict[str, Any] = json.loads((DATA / "endpointslices_dcgm_exporter.json").read_text())
    (item,) = recorded["items"]
    on_c = [e for e in item["endpoints"] if e["nodeName"] == "gpu-node-c"]
    item["endpoints"] = [e for e in item["endpoints"] if e["nodeName"] != "gpu-node-c"]
    custom = slices_api.clients().custom
    meta = {"labels": item["metadata"]["labels"]}
    custom.create_namespaced_custom_object("discovery.k8s.io", "v1", namespace, "endpointslices", {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", **item, "metadata": {"name": "a-b-d", **meta}})
    pods = FollowedApi()
    pods.move("llama-1", "gpu-node-c", "llama-1-5f7c9", stream=False)  # rescheduled before the run: no exporter yet
    discovery = slices_api.clients().discovery
    config = Config(telemetry=TelemetryItems(discovery=[f"k8s://{namespace}/nvidia-dcgm-exporter"]))
    selected = with_selected_pods(config, ["bench/app=llama"], pods, discovery)
    assert NODE_C not in selected.config.telemetry.urls
    followed = Followed()
    watch = follow(followed, selected, pods, discovery, watch_s=5, pause_s=0.1)
    try:
        custom.create_namespaced_custom_object("discovery.k8s.io", "v1", namespace, "endpointslices", {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", **item, "endpoints": on_c,
            "metadata": {"name": "c", **meta}})
        _wait(lambda: any(NODE_C in urls for urls, _, _ in followed.changes), "the new exporter endpoint")
    finally:
        watch.stop(timeout_s=6.0)
    urls, names, _ = next(c for c in followed.changes if NODE_C in c[0])
    assert urls == ["http://10.0.1.5:9400/metrics", NODE_C] and names == ["bench/llama-0", "bench/llama-1-5f7c9"]
    assert not [r for r in caplog.records if "watching failed" in r.getMessage()]  # the watch saw it, no retry
