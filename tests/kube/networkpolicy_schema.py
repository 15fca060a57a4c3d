"""A NetworkPolicy manifest against the Kubernetes NetworkPolicy schema, and the value rules the API server adds.

The schema is the one the kubernetes Python client carries: its models are generated from the Kubernetes
OpenAPI spec (pydantic, unknown fields forbidden, required fields and types strict). The client also takes
its own snake_case names, so the manifest must come back unchanged from the client's serialiser: a field
spelt `match_labels` fails here as it would on the cluster. The value rules are those of
`ValidateNetworkPolicySpec` (kubernetes/kubernetes pkg/apis/networking/validation/validation.go): policy
types, protocols, port numbers and names, endPort, one kind of peer per entry, CIDRs. No network plugin runs
here: this checks what the API server would accept, not what a CNI enforces.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import pydantic
from kubernetes.client import ApiClient, V1NetworkPolicy

_PROTOCOLS = ("TCP", "UDP", "SCTP")
_PORT_NAME = re.compile(r"(?=.*[a-z])[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?")  # IANA_SVC_NAME, IsValidPortName


def model_problems(model_type: Any, doc: dict[str, Any]) -> list[str]:
    """`doc` against the client's model of its kind: the schema's fields and types, spelt as the API spells them."""
    try:
        model = model_type.model_validate(doc)
    except pydantic.ValidationError as exc:
        return [f"{'.'.join(map(str, error['loc']))}: {error['msg']}" for error in exc.errors()]
    if ApiClient().sanitize_for_serialization(model) != doc:
        return ["a field is not spelt as the API spells it (camelCase) or is empty"]
    return []


def networkpolicy_problems(doc: dict[str, Any]) -> list[str]:
    """Everything the API server would refuse in `doc`, as `path: reason` lines; [] when it is valid."""
    problems = model_problems(V1NetworkPolicy, doc)
    if problems:
        return problems
    if (doc.get("apiVersion"), doc.get("kind")) != ("networking.k8s.io/v1", "NetworkPolicy"):
        problems.append("apiVersion/kind: expected networking.k8s.io/v1 NetworkPolicy")
    spec = doc.get("spec") or {}
    if "podSelector" not in spec:
        problems.append("spec.podSelector: required")
    types = spec.get("policyTypes", [])
    if len(types) > 2 or len(set(types)) != len(types) or not set(types) <= {"Ingress", "Egress"}:
        problems.append(f"spec.policyTypes: {types} is not a subset of Ingress, Egress")
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        for i, rule in enumerate(spec.get(direction) or []):
            where = f"spec.{direction}[{i}]"
            problems += [f"{where}.ports[{j}]: {p}" for j, port in enumerate(rule.get("ports") or [])
                         for p in _port_problems(port)]
            problems += [f"{where}.{peers_key}[{j}]: {p}" for j, peer in enumerate(rule.get(peers_key) or [])
                         for p in _peer_problems(peer)]
    return problems


def _port_problems(port: dict[str, Any]) -> list[str]:
    problems = []
    if port.get("protocol", "TCP") not in _PROTOCOLS:
        problems.append(f"protocol {port['protocol']!r} is not one of {', '.join(_PROTOCOLS)}")
    number = port.get("port")
    if isinstance(number, int) and not 1 <= number <= 65535:
        problems.append(f"port {number} is not in 1-65535")
    if isinstance(number, str) and not _PORT_NAME.fullmatch(number):
        problems.append(f"port {number!r} is neither a number nor a port name")
    if "endPort" in port and (not isinstance(number, int) or not number <= port["endPort"] <= 65535):
        problems.append("endPort needs a numeric port no greater than it")
    return problems


def _peer_problems(peer: dict[str, Any]) -> list[str]:
    kinds = [k for k in ("podSelector", "namespaceSelector", "ipBlock") if k in peer]
    if not kinds:
        return ["must specify a peer"]
    if "ipBlock" in kinds and len(kinds) > 1:
        return ["may not specify both ipBlock and another peer"]
    if "ipBlock" not in peer:
        return []
    try:
        block = ipaddress.ip_network(peer["ipBlock"]["cidr"])
        outside = [e for e in peer["ipBlock"].get("except", [])
                   if not ipaddress.ip_network(e).subnet_of(block)]
    except (ValueError, TypeError) as exc:
        return [f"ipBlock: {exc}"]
    return [f"ipBlock.except {e} is outside {block}" for e in outside]
