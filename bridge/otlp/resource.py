"""Resource attributes of the OTLP data: one Resource per scraped endpoint.

Lowest to highest precedence:
1. detected: `host.name` (`$NODE_NAME`, else this host's name), `k8s.node.name` (`$NODE_NAME`),
   `k8s.pod.name` (`$POD_NAME`), `k8s.namespace.name` (`$POD_NAMESPACE`, else the service
   account's namespace file) — the Downward API variables of the sidecar's pod spec;
2. `OTEL_RESOURCE_ATTRIBUTES` (`k=v,k2=v2`, percent-decoded, as the SDK's OTELResourceDetector);
3. `OTEL_SERVICE_NAME`, then the configured service name (default `dcgm-exporter`);
4. configured attributes (flags);
5. `service.instance.id` = the endpoint's host:port, always: Prometheus derives `instance` from it,
   so one value for several endpoints would merge their series.
The SDK's Resource is not used: importing it costs start-up time for a dict merge.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import unquote

logger = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "dcgm-exporter"
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def parse_resource_attributes(text: str) -> dict[str, str]:
    """`OTEL_RESOURCE_ATTRIBUTES`: comma-separated `key=value`, percent-decoded; bad items are skipped."""
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            if item.strip():
                logger.warning("OTEL_RESOURCE_ATTRIBUTES: ignoring an item that is not key=value")
            continue
        out[unquote(key.strip())] = unquote(value.strip())
    return out


def base_attributes(
    env: Mapping[str, str],
    *,
    service_name: str | None = None,
    attributes: Mapping[str, str] | None = None,
    hostname: Callable[[], str] = socket.gethostname,
    namespace_file: Path = SA_NAMESPACE_FILE,
) -> dict[str, str]:
    """Every resource attribute except the per-endpoint `service.instance.id`."""
    out: dict[str, str] = {}
    # `kube profile` sets the DCGM_BRIDGE_-prefixed names through the Downward API.
    node = (env.get("NODE_NAME") or env.get("DCGM_BRIDGE_NODE_NAME") or "").strip()
    out["host.name"] = node or hostname()
    if node:
        out["k8s.node.name"] = node
    pod = (env.get("POD_NAME") or env.get("DCGM_BRIDGE_POD_NAME") or "").strip()
    if pod:
        out["k8s.pod.name"] = pod
    namespace = (env.get("POD_NAMESPACE") or env.get("DCGM_BRIDGE_POD_NAMESPACE") or "").strip()
    if not namespace and pod:
        try:
            namespace = namespace_file.read_text(encoding="utf-8").strip()
        except OSError:
            namespace = ""
    if namespace:
        out["k8s.namespace.name"] = namespace
    out.update(parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    name = service_name or env.get("OTEL_SERVICE_NAME", "").strip() or out.get("service.name")
    out["service.name"] = name or DEFAULT_SERVICE_NAME
    if attributes:
        out.update(attributes)
    return {k: v for k, v in out.items() if v != ""}


def endpoint_attributes(base: Mapping[str, str], endpoint: str) -> dict[str, str]:
    """The Resource of one endpoint: `base` plus `service.instance.id` = host:port."""
    return {**base, "service.instance.id": endpoint}
