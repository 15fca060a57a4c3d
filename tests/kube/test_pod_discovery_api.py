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
