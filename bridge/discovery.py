"""`k8s://<namespace>/<service>[:port]` → one scrape URL per ready endpoint of that Service.

Opt-in, at submit time, with the user's credentials (AIPerf does no discovery, and a load-balanced
Service URL lands each scrape on a random node: kube-proxy spreads a ClusterIP Service's connections
over its endpoints). We list the Service's EndpointSlices (label `kubernetes.io/service-name`), which needs only
`list` on `endpointslices.discovery.k8s.io` in that namespace (deploy/rbac/discovery-role.yaml). The API is passed in:
anything with `list_namespaced_endpoint_slice(namespace, label_selector=...)`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.errors import KubeError

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
DEFAULT_PORT = 9400
# Port names dcgm-exporter uses: the GPU Operator's pods say "metrics", its Service "gpu-metrics".
PORT_NAMES = ("gpu-metrics", "metrics")
_ITEM = re.compile(r"^k8s://(?P<ns>[^/]+)/(?P<svc>[^/:]+)(?::(?P<port>[^/]+))?/?$", re.I)
RBAC_HINT = ("grant `list` on endpointslices (apiGroup discovery.k8s.io) in namespace {ns}: "
             "kubectl apply -n {ns} -f deploy/rbac/discovery-role.yaml (then bind it to you), "
             "or pass the exporter URLs yourself")


class DiscoveryError(KubeError):
    """A k8s:// item that cannot be expanded; the message says why and what to do."""


class EndpointSliceLister(Protocol):
    def list_namespaced_endpoint_slice(self, namespace: str, **kwargs: Any) -> Any: ...


class PodLister(Protocol):
    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class ServiceRef:
    namespace: str
    service: str
    port: str | None  # a number or a port name; None = pick by name, then 9400

    @classmethod
    def parse(cls, item: str) -> ServiceRef:
        match = _ITEM.match(item.strip())
        if not match:
            raise DiscoveryError(f"--gpu-telemetry {item!r}: expected k8s://<namespace>/<service>[:port]")
        return cls(match["ns"], match["svc"], match["port"])


def expand(items: Iterable[str], api: EndpointSliceLister) -> list[str]:
    """Every k8s:// item's URLs, in item order, each item's URLs sorted by node then address."""
    urls: list[str] = []
    for item in items:
        for url in service_urls(ServiceRef.parse(item), api, item):
            if url not in urls:
                urls.append(url)
    return urls


def service_urls(ref: ServiceRef, api: EndpointSliceLister, item: str) -> list[str]:
    return [url for _, _, url in ready_endpoints(ref, api, item)]


def ready_endpoints(ref: ServiceRef, api: EndpointSliceLister, item: str) -> list[tuple[str, str, str]]:
    """(node, address, URL) of every ready endpoint of the Service, sorted by node then address."""
    slices = _listed(
        lambda: api.list_namespaced_endpoint_slice(ref.namespace,
                                                   label_selector=f"{SERVICE_NAME_LABEL}={ref.service}"),
        f"--gpu-telemetry {item}", f"EndpointSlices in namespace {ref.namespace}",
        denied_fix=RBAC_HINT.format(ns=ref.namespace),
        missing=f"the cluster does not serve discovery.k8s.io/v1 EndpointSlices or namespace {ref.namespace} "
                "does not exist")
    if not slices:
        raise DiscoveryError(f"--gpu-telemetry {item}: no EndpointSlices for Service {ref.service} in namespace "
                             f"{ref.namespace} (is the Service name right? kubectl -n {ref.namespace} get svc)")
    found: list[tuple[str, str, str]] = []  # (node, address, url)
    for eps in slices:
        port = _pick_port(eps.ports or [], ref)
        if port is None:
            continue
        for endpoint in eps.endpoints or []:
            # `ready` unset means ready (EndpointConditions API); terminating endpoints are not ready.
            if endpoint.conditions is not None and endpoint.conditions.ready is False:
                continue
            for address in endpoint.addresses or []:
                found.append((endpoint.node_name or "", address, f"http://{_host(address)}:{port}/metrics"))
    if not found:
        on_port = "" if ref.port is None else f" on port {ref.port}"
        raise DiscoveryError(f"--gpu-telemetry {item}: Service {ref.namespace}/{ref.service} has no ready endpoint"
                             f"{on_port} (kubectl -n {ref.namespace} get endpointslices "
                             f"-l {SERVICE_NAME_LABEL}={ref.service})")
    return sorted(set(found))


def _pick_port(ports: list[Any], ref: ServiceRef) -> int | None:
    """The slice port to scrape: the one asked for, else a dcgm-exporter-named one, else 9400, else the only."""
    numbered = [p for p in ports if p.port is not None]
    if ref.port is not None:
        for p in numbered:
            if (ref.port.isdigit() and p.port == int(ref.port)) or p.name == ref.port:
                return int(p.port)
        # A Service port that maps to another targetPort isn't visible in the slice; a number the
        # user gave is still the best guess when the slice has a single port.
        return int(ref.port) if ref.port.isdigit() and not numbered else None
    for name in PORT_NAMES:
        for p in numbered:
            if p.name == name:
                return int(p.port)
    for p in numbered:
        if p.port == DEFAULT_PORT:
            return DEFAULT_PORT
    return int(numbered[0].port) if len(numbered) == 1 else None


def _host(address: str) -> str:
    try:
        return f"[{address}]" if isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address) else address
    except ValueError:
        return address  # an FQDN endpoint (addressType FQDN)


# -- --gpu-pod-selector NAMESPACE/SELECTOR: pods → their nodes → the exporter endpoints on those nodes (issue 31)

DEFAULT_EXPORTER_SERVICE = "k8s://gpu-operator/nvidia-dcgm-exporter"  # the GPU Operator's Service
SELECTOR_FLAG = "--gpu-pod-selector"
_KEY = r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
# One requirement of a label selector (k8s.io/apimachinery pkg/labels/selector.go): key, !key, key=v, key==v,
# key!=v, key in (v,...), key notin (v,...).
_SET = rf"\s+(in|notin)\s*\(\s*{_VALUE}(\s*,\s*{_VALUE})*\s*\)"
_REQUIREMENT = re.compile(rf"!\s*{_KEY}|{_KEY}\s*((==?|!=)\s*{_VALUE}|{_SET})?")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NOT_RUNNING = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodSelector:
    namespace: str
    selector: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.selector}"


def pod_selector_problems(value: str) -> list[str]:
    """What is wrong with one `--gpu-pod-selector` value, as lines naming it; [] when it is good."""
    namespace, slash, selector = value.partition("/")
    if not slash or not selector.strip():
        return [f"{SELECTOR_FLAG} {value!r}: expected NAMESPACE/SELECTOR, e.g. {SELECTOR_FLAG} 'bench/app=llama'"]
    if not _NAMESPACE.fullmatch(namespace):
        return [f"{SELECTOR_FLAG} {value!r}: {namespace!r} is not a namespace name"]
    bad = [part for part in _requirements(selector) if not _REQUIREMENT.fullmatch(part.strip())]
    return [f"{SELECTOR_FLAG} {value!r}: {part.strip()!r} is not a label selector requirement "
            "(key, !key, key=value, key!=value, key in (a,b), key notin (a,b))" for part in bad]


def parse_pod_selector(value: str) -> PodSelector:
    problems = pod_selector_problems(value)
    if problems:
        raise DiscoveryError(problems[0], exit_code=2)
    namespace, _, selector = value.partition("/")
    return PodSelector(namespace, selector.strip())


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether a pod with `labels` is selected by a (valid) label selector, as the API server decides
    (k8s.io/apimachinery pkg/labels/selector.go: `!=` and `notin` select a pod without the key too)."""
    return all(_holds(part.strip(), labels) for part in _requirements(selector))


def _holds(requirement: str, labels: Mapping[str, str]) -> bool:
    if requirement.startswith("!"):
        return requirement[1:].strip() not in labels
    in_set = _IN_SET.fullmatch(requirement)
    if in_set is not None:
        inside = labels.get(in_set["key"]) in {v.strip() for v in in_set["values"].split(",")} and \
            in_set["key"] in labels
        return inside if in_set["op"] == "in" else not inside
    compare = _COMPARE.fullmatch(requirement)
    if compare is None:
        return requirement in labels  # `key`: the pod has the label
    key, op, value = compare.groups()
    return (labels.get(key) == value) == (op != "!=")


_IN_SET = re.compile(r"(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)")
_COMPARE = re.compile(r"(\S+?)\s*(==|=|!=)\s*(\S*)")


def _requirements(selector: str) -> list[str]:
    """The selector split at the commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in selector:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [*parts, current]


@dataclass(frozen=True)
class PodEndpoints:
    """What a selector resolved to: its pods (name, node, labels), their nodes, the exporter URLs there."""

    pods: tuple[tuple[str, str, dict[str, str]], ...]
    nodes: tuple[str, ...]
    urls: tuple[str, ...]


def pod_endpoints(selectors: Iterable[PodSelector], pods_api: PodLister, slices_api: EndpointSliceLister,
                  service: str = DEFAULT_EXPORTER_SERVICE) -> PodEndpoints:
    """The selected pods that are placed and not finished, their nodes, and the ready endpoints of the exporter
    Service on those nodes (EndpointSlices filtered by `nodeName`). Raises DiscoveryError with the fix."""
    found: list[tuple[str, str, dict[str, str]]] = []
    for sel in selectors:
        for pod in _list_pods(sel, pods_api):
            node = pod.spec.node_name if pod.spec is not None else None
            phase = pod.status.phase if pod.status is not None else None
            if node and phase not in _NOT_RUNNING:
                found.append((f"{sel.namespace}/{pod.metadata.name}", node, dict(pod.metadata.labels or {})))
    nodes = tuple(sorted({node for _, node, _ in found}))
    if not nodes:
        raise DiscoveryError(f"{SELECTOR_FLAG} {', '.join(map(str, selectors))}: no running pod matches "
                             "(kubectl get pods -n NAMESPACE -l SELECTOR shows what it selects)")
    ref = ServiceRef.parse(service)
    urls = tuple(url for node, _, url in ready_endpoints(ref, slices_api, service) if node in nodes)
    if not urls:
        raise DiscoveryError(f"{SELECTOR_FLAG}: Service {ref.namespace}/{ref.service} has no ready endpoint on the "
                             f"pods' nodes ({', '.join(nodes)}); is dcgm-exporter scheduled there?")
    return PodEndpoints(tuple(sorted(found, key=lambda p: p[0])), nodes, urls)


def _list_pods(sel: PodSelector, api: PodLister) -> list[Any]:
    return _listed(lambda: api.list_namespaced_pod(sel.namespace, label_selector=sel.selector),
                   f"{SELECTOR_FLAG} {sel}", f"pods in namespace {sel.namespace}",
                   denied_fix="the sidecar's Role from `kube profile` grants it")


def _listed(call: Callable[[], Any], subject: str, what: str, *, denied_fix: str, missing: str | None = None,
            ) -> list[Any]:
    """The items a list call returns, its failures as one DiscoveryError each: `subject` (the flag and its value)
    first, then what went wrong with listing `what`, and the fix."""
    from kubernetes.client.exceptions import ApiException  # lazy: only discovery imports the client
    from urllib3.exceptions import HTTPError

    try:
        return list(call().items or [])
    except HTTPError as exc:
        raise DiscoveryError(f"{subject}: cannot reach the Kubernetes API server: {exc}") from None
    except ApiException as exc:
        if exc.status in (401, 403):
            raise DiscoveryError(f"{subject}: not allowed to list {what} (HTTP {exc.status}); {denied_fix}") from None
        if exc.status == 404 and missing is not None:
            raise DiscoveryError(f"{subject}: {missing}") from None
        raise DiscoveryError(f"{subject}: listing {what} failed: HTTP {exc.status} {exc.reason}") from None
