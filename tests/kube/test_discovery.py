"""k8s://namespace/service[:port] → one URL per ready EndpointSlice endpoint, from real client models."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import (
    DiscoveryV1EndpointPort,
    V1EndpointConditions,
    V1EndpointSlice,
    V1EndpointSliceList,
    V1ObjectMeta,
)
from kubernetes.client import V1Endpoint as Endpoint
from kubernetes.client.exceptions import ApiException

from bridge.discovery import DiscoveryError, ServiceRef, expand


def endpoint(address: str, node: str, ready: bool | None = True) -> Endpoint:
    return Endpoint(addresses=[address], node_name=node, conditions=V1EndpointConditions(ready=ready))


def eps(name: str, endpoints: list[Endpoint], ports: list[tuple[str | None, int]],
        family: str = "IPv4") -> V1EndpointSlice:
    return V1EndpointSlice(address_type=family, metadata=V1ObjectMeta(name=name),
                           endpoints=endpoints, ports=[DiscoveryV1EndpointPort(name=n, port=p) for n, p in ports])


class FakeDiscovery:
    """Answers list_namespaced_endpoint_slice like DiscoveryV1Api, and records what was asked."""

    def __init__(self, slices: list[V1EndpointSlice] | None = None, error: ApiException | None = None) -> None:
        self.slices = slices or []
        self.error = error
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def list_namespaced_endpoint_slice(self, namespace: str, **kwargs: Any) -> V1EndpointSliceList:
        self.calls.append((namespace, kwargs))
        if self.error:
            raise self.error
        return V1EndpointSliceList(items=self.slices)


GPU_OPERATOR = [
    eps("nvidia-dcgm-exporter-abc", [endpoint("10.0.2.7", "gpu-node-b"), endpoint("10.0.1.5", "gpu-node-a"),
                                     endpoint("10.0.3.9", "gpu-node-c", ready=False)], [("gpu-metrics", 9400)]),
]


def test_one_url_per_ready_endpoint_ordered_by_node() -> None:
    api = FakeDiscovery(GPU_OPERATOR)
    assert expand(["k8s://gpu-operator/nvidia-dcgm-exporter"], api) == [
        "http://10.0.1.5:9400/metrics", "http://10.0.2.7:9400/metrics"]
    assert api.calls == [("gpu-operator", {"label_selector": "kubernetes.io/service-name=nvidia-dcgm-exporter"})]


def test_an_endpoint_without_a_ready_condition_counts_as_ready() -> None:
    api = FakeDiscovery([eps("s", [endpoint("10.0.0.1", "n1", ready=None)], [("metrics", 9400)])])
    assert expand(["k8s://ns/svc"], api) == ["http://10.0.0.1:9400/metrics"]


def test_the_port_is_chosen_by_number_or_name_and_ipv6_is_bracketed() -> None:
    slices = [eps("s", [endpoint("fd00::7", "n1")], [("http", 8080), ("metrics", 9400)], family="IPv6")]
    assert expand(["k8s://ns/svc"], FakeDiscovery(slices)) == ["http://[fd00::7]:9400/metrics"]
    assert expand(["k8s://ns/svc:http"], FakeDiscovery(slices)) == ["http://[fd00::7]:8080/metrics"]
    assert expand(["k8s://ns/svc:8080"], FakeDiscovery(slices)) == ["http://[fd00::7]:8080/metrics"]


def test_urls_are_deduplicated_across_slices_and_items() -> None:
    slices = [eps("a", [endpoint("10.0.0.1", "n1")], [("metrics", 9400)]),
              eps("b", [endpoint("10.0.0.1", "n1")], [("metrics", 9400)])]
    assert expand(["k8s://ns/svc", "k8s://ns/svc"], FakeDiscovery(slices)) == ["http://10.0.0.1:9400/metrics"]


def forbidden() -> ApiException:
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps({"message": 'endpointslices.discovery.k8s.io is forbidden: User "u" cannot list'})
    return error


def test_a_missing_list_right_names_the_rbac_to_grant() -> None:
    with pytest.raises(DiscoveryError) as caught:
        expand(["k8s://gpu-operator/nvidia-dcgm-exporter"], FakeDiscovery(error=forbidden()))
    message = str(caught.value)
    assert "not allowed to list EndpointSlices in namespace gpu-operator (HTTP 403)" in message
    assert "discovery.k8s.io" in message and "deploy/rbac/discovery-role.yaml" in message


@pytest.mark.parametrize("slices,fragment", [
    ([], "no EndpointSlices for Service svc in namespace ns"),
    ([eps("s", [endpoint("10.0.0.1", "n1", ready=False)], [("metrics", 9400)])], "has no ready endpoint"),
    ([eps("s", [endpoint("10.0.0.1", "n1")], [("a", 1), ("b", 2)])], "has no ready endpoint"),
])
def test_nothing_to_scrape_is_an_error_saying_how_to_look(slices: list[V1EndpointSlice], fragment: str) -> None:
    with pytest.raises(DiscoveryError, match=fragment):
        expand(["k8s://ns/svc"], FakeDiscovery(slices))


@pytest.mark.parametrize("item", ["k8s://ns", "k8s:///svc", "k8s://ns/svc/extra"])
def test_malformed_items_say_the_expected_form(item: str) -> None:
    with pytest.raises(DiscoveryError, match=r"expected k8s://<namespace>/<service>\[:port\]"):
        ServiceRef.parse(item)
