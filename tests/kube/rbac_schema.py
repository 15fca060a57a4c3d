"""ServiceAccount, Role and RoleBinding manifests against the Kubernetes OpenAPI schema, as the kubernetes
Python client carries it (models generated from the spec: pydantic, unknown fields forbidden, required fields
and types strict; see networkpolicy_schema.py), and the value rules the API server adds
(kubernetes/kubernetes pkg/apis/rbac/validation/validation.go: a rule names verbs and API groups, a RoleBinding's
roleRef is a Role or ClusterRole of rbac.authorization.k8s.io, a ServiceAccount subject names its namespace)."""

from __future__ import annotations

import re
from typing import Any

from kubernetes.client import V1Role, V1RoleBinding, V1ServiceAccount

from tests.kube.networkpolicy_schema import model_problems

_MODELS: dict[tuple[str, str], Any] = {
    ("v1", "ServiceAccount"): V1ServiceAccount,
    ("rbac.authorization.k8s.io/v1", "Role"): V1Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): V1RoleBinding,
}
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # DNS-1123 subdomain


def rbac_problems(doc: dict[str, Any]) -> list[str]:
    """Everything the API server would refuse in `doc`, as `path: reason` lines; [] when it is valid."""
    model_type = _MODELS.get((doc.get("apiVersion", ""), doc.get("kind", "")))
    if model_type is None:
        return [f"apiVersion/kind: {doc.get('apiVersion')} {doc.get('kind')} is not a ServiceAccount, "
                "Role or RoleBinding"]
    problems = model_problems(model_type, doc)
    if problems:
        return problems
    meta = doc.get("metadata") or {}
    if not _NAME.fullmatch(meta.get("name", "")):
        problems.append(f"metadata.name: {meta.get('name')!r} is not a DNS-1123 subdomain")
    if not meta.get("namespace"):
        problems.append("metadata.namespace: required for a namespaced object")
    for i, rule in enumerate(doc.get("rules") or []):
        if not rule.get("verbs"):
            problems.append(f"rules[{i}].verbs: required")
        if "apiGroups" not in rule:
            problems.append(f"rules[{i}].apiGroups: required with resources")
    if doc.get("kind") == "RoleBinding":
        ref = doc["roleRef"]
        if ref.get("apiGroup") != "rbac.authorization.k8s.io" or ref.get("kind") not in ("Role", "ClusterRole"):
            problems.append("roleRef: must be a Role or ClusterRole of rbac.authorization.k8s.io")
        for j, subject in enumerate(doc.get("subjects") or []):
            if subject.get("kind") == "ServiceAccount" and not subject.get("namespace"):
                problems.append(f"subjects[{j}].namespace: required for a ServiceAccount")
    return problems
