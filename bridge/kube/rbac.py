"""The sidecar's own identity for `--gpu-pod-selector` (issue 31): exactly the API access discovery needs.

    ServiceAccount  <job>-telemetry                 benchmark namespace
    Role            <job>-telemetry-pods            benchmark namespace   get/list/watch pods
    RoleBinding     <job>-telemetry-pods            benchmark namespace
    Role            <job>-telemetry-endpointslices  exporter namespace    get/list/watch endpointslices
    RoleBinding     <job>-telemetry-endpointslices  exporter namespace

The pod keeps `automountServiceAccountToken: false`; the sidecar alone mounts a projected token of that
account (with the cluster CA and its namespace, where in-cluster clients look for them). A RoleBinding in
another namespace cannot carry an owner reference to the JobSet (owner references are namespace-local), so
`kube delete` removes the objects of the exporter namespace itself; the JobSet names that namespace in an
annotation. `kube delete` removes those of the benchmark namespace too (they carry the job-id label).
"""

from __future__ import annotations

from typing import Any

RBAC_API = "rbac.authorization.k8s.io/v1"
EXPORTER_NAMESPACE_ANNOTATION = "dcgm-bridge.nvidia.com/exporter-namespace"
# The API calls bridge/discovery.py makes, as RBAC rules (tests/kube/test_pod_discovery.py checks both agree).
POD_RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
)
ENDPOINTSLICE_RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
)
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"  # where in-cluster clients read token, CA, namespace
TOKEN_VOLUME = "sidecar-api-token"
TOKEN_SECONDS = 3600  # the kubelet refreshes a projected token at 80 % of its life


def account_name(job_id: str) -> str:
    return f"{job_id}-telemetry"


def rbac_objects(job_id: str, namespace: str, exporter_namespace: str,
                 labels: dict[str, str]) -> list[dict[str, Any]]:
    """The ServiceAccount, Roles and RoleBindings, benchmark namespace first."""
    account = account_name(job_id)
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    out: list[dict[str, Any]] = [{
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": account, "namespace": namespace, "labels": dict(labels)},
        "automountServiceAccountToken": False,
    }]
    for suffix, where, rules in (("pods", namespace, POD_RULES),
                                 ("endpointslices", exporter_namespace, ENDPOINTSLICE_RULES)):
        name = f"{account}-{suffix}"
        meta = {"name": name, "namespace": where, "labels": dict(labels)}
        out.append({"apiVersion": RBAC_API, "kind": "Role", "metadata": meta, "rules": [dict(r) for r in rules]})
        out.append({"apiVersion": RBAC_API, "kind": "RoleBinding", "metadata": dict(meta),
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                    "subjects": [dict(s) for s in subject]})
    return out


def token_volume() -> dict[str, Any]:
    """A projected service-account token, the cluster CA and the namespace: what the default mount holds."""
    return {"name": TOKEN_VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}


def token_mount() -> dict[str, Any]:
    return {"name": TOKEN_VOLUME, "mountPath": TOKEN_PATH, "readOnly": True}
