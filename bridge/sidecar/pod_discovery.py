"""`sidecar --gpu-pod-selector NAMESPACE/SELECTOR` in a cluster: the selected pods, their nodes and the
exporter's endpoints on those nodes (bridge/discovery.py), resolved at start through the API with the
sidecar's own ServiceAccount token (`kube profile` generates it and exactly the Roles this needs). The pods
found become `--gpu-pods NAMESPACE/NAME` selections, so the report counts their GPUs only, and the exporter
endpoints on their nodes are scraped: no URL has to be listed. The pods, with their labels, go to the events file
(a `pods` event, bridge/events.py), so `report --gpu-pod-selector` applies the selector offline.

Then followed (sidecar/pod_watch.py): when the selected pods or the exporter's endpoints change (a pod restarted
under a new name, rescheduled to another node, a new replica), the new pods join the selection (live and the
report's), the exporter endpoints on new nodes are scraped from then on, and the pods go to the events file again.
Endpoints are added, never dropped: an exporter on a node no selected pod runs on any more is still scraped (its
GPUs, attributed to other pods or none, are not counted), so the run's record of it has no hole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

from bridge.config import Config
from bridge.discovery import (
    DEFAULT_EXPORTER_SERVICE,
    DiscoveryError,
    PodEndpoints,
    PodSelector,
    parse_pod_selector,
    pod_endpoints,
)
from bridge.errors import ConfigError
from bridge.events import PodsResolved, ResolvedPod
from bridge.sidecar.pod_watch import PodWatch

logger = logging.getLogger(__name__)


def in_cluster_apis() -> tuple[Any, Any]:
    """CoreV1Api and DiscoveryV1Api with the pod's ServiceAccount token; ConfigError outside a cluster."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException as exc:
        raise ConfigError(f"--gpu-pod-selector needs the Kubernetes API from inside a pod ({exc}); outside a "
                          "cluster give --gpu-pods NAMESPACE/GLOB and the exporter URLs") from None
    return client.CoreV1Api(), client.DiscoveryV1Api()


class SelectedPods(NamedTuple):
    """What the start resolved: the config to run with, the pods as the events file records them, and what the
    watch follows from (sidecar/pod_watch.py)."""

    config: Config
    event: PodsResolved
    selectors: tuple[PodSelector, ...]
    service: str
    found: PodEndpoints


def with_selected_pods(config: Config, values: Sequence[str], pods_api: Any, slices_api: Any,
                       now_ns: Callable[[], int] = time.time_ns) -> SelectedPods:
    """`config` with the selectors' exporter endpoints added to its URLs and their pods to its `gpu_pods`."""
    try:
        selectors = tuple(parse_pod_selector(value) for value in values)
        service = config.telemetry.discovery[0] if config.telemetry.discovery else DEFAULT_EXPORTER_SERVICE
        found = pod_endpoints(selectors, pods_api, slices_api, service)
    except DiscoveryError as exc:
        raise ConfigError(str(exc)) from None
    pods = names_of(found)
    logger.warning("--gpu-pod-selector %s: %d pods on %d nodes (%s); scraping %s", ", ".join(values), len(pods),
                   len(found.nodes), ", ".join(pods), ", ".join(found.urls))
    urls = list(dict.fromkeys([*config.telemetry.urls, *found.urls]))
    telemetry = replace(config.telemetry, urls=urls, discovery=[])
    config = replace(config, telemetry=telemetry, gpu_pods=tuple(dict.fromkeys([*config.gpu_pods, *pods])))
    return SelectedPods(config, pods_event(selectors, found, now_ns()), selectors, service, found)


class Follower(Protocol):
    """What the watch changes of a session (sidecar/session.py `Session.follow_pods`)."""

    def follow_pods(self, urls: Sequence[str], pods: Sequence[str], event: PodsResolved) -> list[str]: ...


def follow(session: Follower, selected: SelectedPods, pods_api: Any, slices_api: Any,
           now_ns: Callable[[], int] = time.time_ns, **watch_options: Any) -> PodWatch:
    """A started watch of the selected pods and the exporter's EndpointSlices: each change of the selection goes
    to `session` (its new pods, its endpoints, the event recording them)."""

    def changed(found: PodEndpoints) -> None:
        added = session.follow_pods(found.urls, names_of(found), pods_event(selected.selectors, found, now_ns()))
        logger.warning("--gpu-pod-selector: now %d pods on %d nodes (%s)%s", len(found.pods), len(found.nodes),
                       ", ".join(names_of(found)), f"; scraping {', '.join(added)} too" if added else "")

    watch = PodWatch(selected.selectors, selected.service, pods_api, slices_api, changed, **watch_options)
    watch.start(selected.found)
    return watch


def names_of(found: PodEndpoints) -> tuple[str, ...]:
    """The pods as `--gpu-pods NAMESPACE/NAME` selections."""
    return tuple(name for name, _node, _labels in found.pods)


def pods_event(selectors: Sequence[PodSelector], found: PodEndpoints, time_ns: int) -> PodsResolved:
    return PodsResolved(time_ns, tuple(map(str, selectors)), tuple(_pod(*pod) for pod in found.pods))


def _pod(name: str, node: str, labels: dict[str, str]) -> ResolvedPod:
    namespace, _, pod = name.partition("/")
    return ResolvedPod(namespace, pod, node, labels)
