"""`kube profile --gpu-pods/--gpu-pod-selector`: the flags reach the sidecar; with a selector the sidecar alone gets
an API token of its own ServiceAccount, whose Roles allow exactly what discovery reads; `kube delete` removes the
objects in the exporter's namespace that no owner reference would."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from kubernetes.client.exceptions import ApiException

from bridge.kube import submit
from bridge.kube.cli import kube
from bridge.kube.rbac import EXPORTER_NAMESPACE_ANNOTATION, TOKEN_PATH
from tests.kube.crd_schema import schema_errors
from tests.kube.rbac_schema import rbac_problems
from tests.kube.test_cli import BASE, dry_run, sidecar_of


def pod_of(jobset: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return spec


def test_gpu_pods_alone_reaches_the_sidecar_and_creates_no_rbac() -> None:
    result = dry_run("--gpu-telemetry", "node1:9400", "--gpu-pods", "bench/llama-*", "--gpu-pods", "bench/vllm-?")
    assert result.exit_code == 0, result.output
    (jobset,) = yaml.safe_load_all(result.stdout)
    sidecar = sidecar_of(jobset)
    assert sidecar is not None
    assert sidecar["args"][-4:] == ["--gpu-pods", "bench/llama-*", "--gpu-pods", "bench/vllm-?"]
    assert pod_of(jobset)["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod_of(jobset)


def test_roles_reach_the_sidecar() -> None:
    result = dry_run("--gpu-telemetry", "node1:9400", "--role", "prefill=bench/*-prefill-*", "--role",
                     "decode=bench/*-decode-*")
    assert result.exit_code == 0, result.output
    (jobset,) = yaml.safe_load_all(result.stdout)
    sidecar = sidecar_of(jobset)
    assert sidecar is not None
    assert sidecar["args"][-4:] == ["--role", "prefill=bench/*-prefill-*", "--role", "decode=bench/*-decode-*"]


def test_a_selector_gives_the_sidecar_alone_a_projected_token_of_its_own_account() -> None:
    result = dry_run("--namespace", "bench", "--gpu-pod-selector", "bench/app=llama")
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "Role", "RoleBinding", "JobSet"]
    jobset = docs[-1]
    assert schema_errors(jobset) == []
    for doc in docs[:-1]:
        assert rbac_problems(doc) == [], doc
    assert [(d["kind"], d["metadata"]["namespace"]) for d in docs[1:5]] == [
        ("Role", "bench"), ("RoleBinding", "bench"), ("Role", "gpu-operator"), ("RoleBinding", "gpu-operator")]
    pod = pod_of(jobset)
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == docs[0]["metadata"]["name"] == "bench-1-telemetry"
    sidecar = sidecar_of(jobset)
    assert sidecar is not None
    assert {"name": "sidecar-api-token", "mountPath": TOKEN_PATH, "readOnly": True} in sidecar["volumeMounts"]
    others = [c for c in pod["containers"] if c["name"] != sidecar["name"]]
    assert others and all(m["mountPath"] != TOKEN_PATH for c in others for m in c.get("volumeMounts", []))
    assert sidecar["args"][-4:] == ["--gpu-telemetry", "k8s://gpu-operator/nvidia-dcgm-exporter",
                                    "--gpu-pod-selector", "bench/app=llama"]
    assert jobset["metadata"]["annotations"][EXPORTER_NAMESPACE_ANNOTATION] == "gpu-operator"


def test_a_k8s_item_names_the_exporter_service_the_sidecar_discovers_in() -> None:
    result = dry_run("--gpu-telemetry", "k8s://monitoring/dcgm-exporter", "--gpu-pod-selector", "default/app=x")
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["metadata"]["namespace"] for d in docs if d["kind"] == "Role"] == ["default", "monitoring"]
    sidecar = sidecar_of(docs[-1])
    assert sidecar is not None and "k8s://monitoring/dcgm-exporter" in sidecar["args"]


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu-pods", "llama-*"], "--gpu-pods 'llama-*': expected NAMESPACE/GLOB"),
    (["--gpu-pod-selector", "bench/llama-*"], "--gpu-pod-selector 'bench/llama-*': 'llama-*' is not a label"),
    (["--gpu-pod-selector", "bench/app=x", "--service-account", "mine"], "--service-account and --gpu-pod-selector"),
    (["--gpu-pods", "bench/x", "--no-gpu-telemetry"], "--no-gpu-telemetry: there is no sidecar"),
    (["--role", "prefill"], "--role 'prefill': expected NAME=NAMESPACE/GLOB"),
])
def test_bad_pod_options_exit_2_naming_the_flag(args: list[str], message: str) -> None:
    result = CliRunner().invoke(kube, [*BASE, *args])
    assert result.exit_code == 2
    assert message in result.stderr


class FakeRbacCluster:
    """CustomObjectsApi (the JobSet), CoreV1Api and RbacAuthorizationV1Api deletes, as the client names them."""

    def __init__(self, annotations: dict[str, str]) -> None:
        self.annotations = annotations
        self.deleted: list[tuple[str, str, str]] = []
        self.missing = {("role_binding", "bench-1-telemetry-pods")}

    def get_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        return {"metadata": {"name": "bench-1", "annotations": self.annotations}}

    def delete_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
        self.deleted.append(("jobset", args[-1], args[2]))

    def __getattr__(self, name: str) -> Any:
        kind = name.removeprefix("delete_namespaced_")

        def delete(obj_name: str, namespace: str) -> None:
            if (kind, obj_name) in self.missing:
                raise ApiException(status=404, reason="Not Found")
            self.deleted.append((kind, obj_name, namespace))
        return delete


def test_delete_removes_the_sidecars_rbac_objects_in_both_namespaces_then_the_jobset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeRbacCluster({EXPORTER_NAMESPACE_ANNOTATION: "gpu-operator"})
    monkeypatch.setattr(submit, "connect", lambda *_: submit.Clients(None, cluster, cluster, None, cluster))
    result = CliRunner().invoke(kube, ["delete", "bench-1", "-n", "bench"])
    assert result.exit_code == 0, result.output
    assert cluster.deleted == [
        ("role", "bench-1-telemetry-endpointslices", "gpu-operator"),
        ("role_binding", "bench-1-telemetry-endpointslices", "gpu-operator"),
        ("role", "bench-1-telemetry-pods", "bench"),  # its RoleBinding was already gone: skipped
        ("service_account", "bench-1-telemetry", "bench"),
        ("jobset", "bench-1", "bench"),
    ]
    assert "rolebinding/bench-1-telemetry-endpointslices deleted from namespace gpu-operator" in result.output


def test_delete_of_a_run_without_a_selector_touches_no_rbac(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeRbacCluster({})
    monkeypatch.setattr(submit, "connect", lambda *_: submit.Clients(None, cluster, cluster, None, cluster))
    assert CliRunner().invoke(kube, ["delete", "bench-1", "-n", "bench"]).exit_code == 0
    assert cluster.deleted == [("jobset", "bench-1", "bench")]
