"""--gpu-pod-selector: pods → their nodes → the exporter's EndpointSlices on those nodes, from API responses in
the API server's wire form (tests/kube/data, written by hand after `kubectl get --raw` output: no cluster here),
read into the client's own models. The calls the discovery makes are exactly what the generated Roles allow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import V1EndpointSliceList, V1PodList
from kubernetes.client.exceptions import ApiException

from bridge.discovery import DiscoveryError, parse_pod_selector, pod_endpoints, pod_selector_problems
from bridge.kube.rbac import ENDPOINTSLICE_RULES, POD_RULES, rbac_objects

DATA = Path(__file__).parent / "data"


class RecordingApi:
    """CoreV1Api.list_namespaced_pod and DiscoveryV1Api.list_namespaced_endpoint_slice over recorded bodies;
    every call is kept as (verb, API group, resource, namespace)."""

    def __init__(self, pods_error: ApiException | None = None) -> None:
        self.calls: list[tuple[str, str, str, str]] = []
        self.selectors: list[str] = []
        self.pods_error = pods_error

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> V1PodList:
        self.calls.append(("list", "", "pods", namespace))
        self.selectors.append(kwargs["label_selector"])
        if self.pods_error:
            raise self.pods_error
        return V1PodList.model_validate(json.loads((DATA / "pods_app_llama.json").read_text()))

    def list_namespaced_endpoint_slice(self, namespace: str, **kwargs: Any) -> V1EndpointSliceList:
        self.calls.append(("list", "discovery.k8s.io", "endpointslices", namespace))
        self.selectors.append(kwargs["label_selector"])
        return V1EndpointSliceList.model_validate(json.loads((DATA / "endpointslices_dcgm_exporter.json").read_text()))


def test_the_selected_running_pods_lead_to_the_exporters_on_their_nodes_only() -> None:
    api = RecordingApi()
    found = pod_endpoints([parse_pod_selector("bench/app=llama")], api, api)
    assert found.nodes == ("gpu-node-a", "gpu-node-b")  # llama-2 is unscheduled, llama-old finished
    assert found.urls == ("http://10.0.1.5:9400/metrics", "http://10.0.2.7:9400/metrics")
    assert [(name, node, labels["app"]) for name, node, labels in found.pods] == [
        ("bench/llama-0", "gpu-node-a", "llama"), ("bench/llama-1", "gpu-node-b", "llama")]
    assert api.selectors == ["app=llama", "kubernetes.io/service-name=nvidia-dcgm-exporter"]


def test_the_api_calls_of_discovery_are_allowed_by_the_generated_roles_in_their_namespaces() -> None:
    api = RecordingApi()
    pod_endpoints([parse_pod_selector("bench/app=llama")], api, api, "k8s://gpu-operator/nvidia-dcgm-exporter")
    roles = [o for o in rbac_objects("bench-1", "bench", "gpu-operator", {}) if o["kind"] == "Role"]
    allowed = {(verb, group, resource, role["metadata"]["namespace"])
               for role in roles for rule in role["rules"]
               for verb in rule["verbs"] for group in rule["apiGroups"] for resource in rule["resources"]}
    assert set(api.calls) <= allowed
    # every Role is used: one per resource the discovery reads, in the namespace it reads it in
    assert {(g, r, ns) for _, g, r, ns in api.calls} == {(g, r, ns) for _, g, r, ns in allowed}
    assert [r["rules"] for r in roles] == [list(POD_RULES), list(ENDPOINTSLICE_RULES)]


def test_a_selector_with_no_running_pod_says_how_to_check_it() -> None:
    api = RecordingApi()
    with pytest.raises(DiscoveryError, match="no running pod matches"):
        pod_endpoints([parse_pod_selector("bench/app=mistral")], _NoPods(), api)


class _NoPods:
    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> V1PodList:
        return V1PodList(items=[])


def test_a_forbidden_pod_list_names_the_namespace_and_the_role() -> None:
    api = RecordingApi(pods_error=ApiException(status=403, reason="Forbidden"))
    with pytest.raises(DiscoveryError, match="not allowed to list pods in namespace bench .*Role"):
        pod_endpoints([parse_pod_selector("bench/app=llama")], api, api)


@pytest.mark.parametrize("value", ["bench/app=llama", "bench/app in (llama, mistral),tier!=canary",
                                   "bench/!canary", "bench/example.com/team==ml", "bench/app notin (a)"])
def test_label_selectors_the_api_accepts_are_accepted(value: str) -> None:
    assert pod_selector_problems(value) == []


@pytest.mark.parametrize(("value", "message"), [
    ("app=llama", "expected NAMESPACE/SELECTOR"),
    ("bench/", "expected NAMESPACE/SELECTOR"),
    ("Bench/app=llama", "'Bench' is not a namespace name"),
    ("bench/llama-*", "'llama-*' is not a label selector requirement"),
    ("bench/app in llama", "'app in llama' is not a label selector requirement"),
])
def test_a_bad_selector_is_named_with_what_a_selector_looks_like(value: str, message: str) -> None:
    (problem,) = pod_selector_problems(value)
    assert problem.startswith(f"--gpu-pod-selector {value!r}:") and message in problem


LABELS = {"app": "llama", "tier": "serve"}


@pytest.mark.parametrize(("selector", "selected"), [
    ("app=llama", True), ("app==llama", True), ("app!=llama", False), ("app!=mistral", True),
    ("zone!=a", True),  # `!=` selects a pod without the key, as the API server does
    ("zone=a", False), ("app", True), ("!app", False), ("!zone", True),
    ("tier in (serve, batch)", True), ("tier in (batch)", False), ("tier notin (serve)", False),
    ("zone notin (a)", True), ("zone in (a)", False),
    ("app=llama,tier in (batch)", False), ("app=llama, tier in (serve,batch), !zone", True),
])
def test_a_recorded_pods_labels_are_selected_offline_as_the_api_server_selects_them(selector: str,
                                                                                    selected: bool) -> None:
    from bridge.discovery import selector_matches

    assert pod_selector_problems(f"bench/{selector}") == []
    assert selector_matches(selector, LABELS) is selected
