"""`sidecar --gpu-pod-selector NAMESPACE/SELECTOR` in a cluster: the selected pods, their nodes and the
exporter's endpoints on those nodes (bridge/discovery.py), resolved once at start through the API with the
sidecar's own ServiceAccount token (`kube profile` generates it and exactly the Roles this needs). The pods
found become `--gpu-pods NAMESPACE/NAME` selections, so the report counts their GPUs only, and the exporter
endpoints on their nodes are scraped: no URL has to be listed. The pods, with their labels, go to the events file
(a `pods` event, bridge/events.py), so `report --gpu-pod-selector` applies the selector offline.

Resolved once: a pod that moves to another node during the run is not followed (a watch is not built yet).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from bridge.config import Config
from bridge.errors import ConfigError
from bridge.events import PodsResolved, ResolvedPod

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


def with_selected_pods(config: Config, values: Sequence[str], pods_api: Any, slices_api: Any,
                       now_ns: Callable[[], int] = time.time_ns) -> tuple[Config, PodsResolved]:
    """`config` with the selectors' exporter endpoints added to its URLs and their pods to its `gpu_pods`; the pods
    as the events file records them."""
    from bridge.discovery import DEFAULT_EXPORTER_SERVICE, DiscoveryError, parse_pod_selector, pod_endpoints

    try:
        selectors = [parse_pod_selector(value) for value in values]
        service = config.telemetry.discovery[0] if config.telemetry.discovery else DEFAULT_EXPORTER_SERVICE
        found = pod_endpoints(selectors, pods_api, slices_api, service)
    except DiscoveryError as exc:
        raise ConfigError(str(exc)) from None
    pods = tuple(name for name, _node, _labels in found.pods)
    logger.warning("--gpu-pod-selector %s: %d pods on %d nodes (%s); scraping %s", ", ".join(values), len(pods),
                   len(found.nodes), ", ".join(pods), ", ".join(found.urls))
    urls = list(dict.fromkeys([*config.telemetry.urls, *found.urls]))
    telemetry = replace(config.telemetry, urls=urls, discovery=[])
    resolved = PodsResolved(now_ns(), tuple(values), tuple(_pod(*pod) for pod in found.pods))
    return replace(config, telemetry=telemetry, gpu_pods=tuple(dict.fromkeys([*config.gpu_pods, *pods]))), resolved


def _pod(name: str, node: str, labels: dict[str, str]) -> ResolvedPod:
    namespace, _, pod = name.partition("/")
    return ResolvedPod(namespace, pod, node, labels)
