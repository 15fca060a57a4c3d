"""`kube profile`, `status`, `delete` and `--wait` against a real API server serving the JobSet CRD."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from bridge.kube import submit
from bridge.kube.cli import kube
from bridge.kube.jobset import SIDECAR, build_jobset
from tests.kube.conftest import KubeAPI
from tests.kube.test_jobset import make_spec

pytestmark = pytest.mark.kubeapi

BASE = ["--model", "Qwen/Qwen3-0.6B", "--url", "dynamo-frontend.inference.svc.cluster.local:8000",
        "--endpoint-type", "chat", "--endpoint", "/v1/chat/completions", "--streaming",
        "--concurrency", "32", "--request-count", "1024"]
DEADLINE_S = 30.0


def run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(kube, list(args), env=env, catch_exceptions=False)


def pod_of(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return spec


def patch_status(api: KubeAPI, namespace: str, name: str, status: dict[str, Any]) -> None:
    custom = api.clients().custom
    custom.patch_namespaced_custom_object_status(submit.GROUP, submit.VERSION, namespace, submit.PLURAL, name,
                                                 {"status": status})


def condition(kind: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": "True", "reason": f"AllJobs{kind}", "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


def jobs_status(active: int, succeeded: int = 0, failed: int = 0) -> list[dict[str, Any]]:
    return [{"name": "controller", "active": active, "ready": active, "succeeded": succeeded, "failed": failed,
             "suspended": 0}]


def poll(predicate: Any, what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.parametrize("variant,extra,env", [
    ("telemetry-on", ["--gpu-telemetry", "http://dcgm-exporter.gpu-operator.svc.cluster.local:9400/metrics"], {}),
    ("telemetry-off", ["--no-gpu-telemetry"], {}),
    ("overrides", ["--gpu-telemetry", "node1:9400", "node2:9400", "--legacy-sidecar"],
     {"AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU": "500m", "AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY": "1Gi"}),
])
def test_the_dry_run_output_is_a_jobset_the_api_server_accepts_without_pruning_anything(
        kube_api: KubeAPI, namespace: str, variant: str, extra: list[str], env: dict[str, str]) -> None:
    result = run("profile", *BASE, *extra, "--job-id", variant, "-n", namespace, "--dry-run", env=env)
    assert result.exit_code == 0, result.output
    (jobset,) = list(yaml.safe_load_all(result.stdout))
    custom = kube_api.clients().custom
    # Strict field validation turns what the server would silently prune into a 400: nothing may be.
    stored = custom.create_namespaced_custom_object(submit.GROUP, submit.VERSION, namespace, submit.PLURAL,
                                                    jobset, field_validation="Strict")
    names = [c["name"] for c in [*pod_of(stored).get("initContainers", []), *pod_of(stored)["containers"]]]
    assert (SIDECAR in names) == (variant != "telemetry-off")
    if variant == "overrides":
        sidecar = next(c for c in pod_of(stored)["containers"] if c["name"] == SIDECAR)
        assert sidecar["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"},
                                        "limits": {"cpu": "500m", "memory": "1Gi"}}


def test_kube_profile_stores_the_jobset_with_the_crd_defaults_applied(kube_api: KubeAPI, namespace: str) -> None:
    result = run("profile", *BASE, "--gpu-telemetry", "node1:9400", "--job-id", "stored", "-n", namespace,
                 "--kubeconfig", str(kube_api.kubeconfig))
    assert result.exit_code == 0, result.output
    assert f"jobset.jobset.x-k8s.io/stored created in namespace {namespace}" in result.output
    obj = submit.get_jobset(kube_api.clients().custom, namespace, "stored")
    assert obj["metadata"]["labels"]["aiperf.nvidia.com/job-id"] == "stored"
    rjob = obj["spec"]["replicatedJobs"][0]
    assert rjob["groupName"] == "default"  # CRD default
    assert obj["spec"]["failurePolicy"]["restartStrategy"] == "Recreate"  # CRD default
    sidecar = pod_of(obj)["initContainers"][0]
    assert sidecar["ports"] == [{"containerPort": 8086, "name": "health", "protocol": "TCP"}]  # default TCP
    assert sidecar["restartPolicy"] == "Always"
    # Selecting by the job-id label works the way the seed's `kubectl get pod -l …` recipe relies on.
    listed = kube_api.clients().custom.list_namespaced_custom_object(
        submit.GROUP, submit.VERSION, namespace, submit.PLURAL, label_selector="aiperf.nvidia.com/job-id=stored")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["stored"]


def test_a_malformed_jobset_shows_each_of_the_servers_field_errors(kube_api: KubeAPI, namespace: str) -> None:
    jobset = build_jobset(make_spec(job_id="malformed", namespace=namespace))
    broken = copy.deepcopy(jobset)
    broken["spec"]["replicatedJobs"][0]["replicas"] = "two"
    broken["spec"]["ttlSecondsAfterFinished"] = -1
    broken["spec"]["successPolicy"]["operator"] = "Most"
    with pytest.raises(submit.KubeError) as caught:
        submit.create_jobset(kube_api.clients().custom, broken)
    message = str(caught.value)
    assert message.startswith("422 Invalid")
    assert "spec.replicatedJobs[0].replicas" in message
    assert "spec.ttlSecondsAfterFinished" in message
    assert "spec.successPolicy.operator" in message and "Unsupported value" in message


def test_a_second_profile_with_the_same_job_id_is_explained_as_a_conflict(kube_api: KubeAPI, namespace: str) -> None:
    args = ["profile", *BASE, "--job-id", "twice", "-n", namespace, "--kubeconfig", str(kube_api.kubeconfig)]
    assert run(*args).exit_code == 0
    second = run(*args)
    assert second.exit_code == 1
    assert "409 Conflict: JobSet twice already exists" in second.stderr
    assert "dcgm-bridge kube delete twice" in second.stderr


def test_a_user_without_rights_is_told_which_verb_resource_and_namespace_are_missing(
        kube_api: KubeAPI, namespace: str) -> None:
    result = run("profile", *BASE, "--job-id", "denied", "-n", namespace,
                 "--kubeconfig", str(kube_api.nobody_kubeconfig))
    assert result.exit_code == 1
    assert f"403 Forbidden: your credentials may not create jobsets.jobset.x-k8s.io in namespace {namespace}" \
        in result.stderr
    assert "kubectl auth can-i create jobsets.jobset.x-k8s.io" in result.stderr


def test_a_cluster_without_the_jobset_api_version_gets_the_install_command(
        kube_api: KubeAPI, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submit, "VERSION", "v1alpha1")  # a version this server doesn't serve: a real 404
    result = run("profile", *BASE, "--job-id", "nocrd", "-n", namespace, "--kubeconfig", str(kube_api.kubeconfig))
    assert result.exit_code == 1
    assert "404: this cluster does not serve jobset.x-k8s.io/v1alpha1: the JobSet CRD is not installed" \
        in result.stderr
    assert "kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/releases/download/" \
        in result.stderr


def test_wait_reports_each_state_the_controller_writes_until_completed(kube_api: KubeAPI, namespace: str) -> None:
    custom = kube_api.clients().custom
    submit.create_jobset(custom, build_jobset(make_spec(job_id="followed", namespace=namespace)))
    seen: list[submit.JobSetState] = []
    outcome: list[submit.JobSetState] = []
    waiter = threading.Thread(target=lambda: outcome.append(submit.wait_for(
        kube_api.clients().custom, namespace, "followed", timeout_s=DEADLINE_S, on_change=seen.append)))
    waiter.start()
    poll(lambda: seen, "the first state")
    assert seen[0].phase == "Pending"
    patch_status(kube_api, namespace, "followed", {"replicatedJobsStatus": jobs_status(active=1)})
    poll(lambda: any(s.phase == "Running" for s in seen), "Running")
    patch_status(kube_api, namespace, "followed", {
        "terminalState": "Completed", "conditions": [condition("Completed", "jobset completed successfully")],
        "replicatedJobsStatus": jobs_status(active=0, succeeded=1)})
    waiter.join(DEADLINE_S)
    assert not waiter.is_alive()
    assert [s.phase for s in seen] == ["Pending", "Running", "Completed"]
    assert outcome[0].exit_code == 0
    assert "1 succeeded" in outcome[0].detail


def test_profile_wait_exits_1_when_the_jobset_fails(kube_api: KubeAPI, namespace: str) -> None:
    def fail_it() -> None:
        custom = kube_api.clients().custom

        def exists() -> bool:
            try:
                submit.get_jobset(custom, namespace, "doomed")
                return True
            except submit.KubeError:
                return False

        poll(exists, "the JobSet to be created")
        patch_status(kube_api, namespace, "doomed", {
            "terminalState": "Failed", "conditions": [condition("Failed", "jobset failed: backoff limit")],
            "replicatedJobsStatus": jobs_status(active=0, failed=1)})

    patcher = threading.Thread(target=fail_it)
    patcher.start()
    result = run("profile", *BASE, "--job-id", "doomed", "-n", namespace, "--kubeconfig", str(kube_api.kubeconfig),
                 "--wait", "--timeout", str(DEADLINE_S))
    patcher.join(DEADLINE_S)
    assert result.exit_code == 1, result.output
    assert "Failed" in result.stdout and "jobset failed: backoff limit" in result.stdout


def test_status_shows_the_state_and_delete_removes_the_jobset(kube_api: KubeAPI, namespace: str) -> None:
    config = ["-n", namespace, "--kubeconfig", str(kube_api.kubeconfig)]
    assert run("profile", *BASE, "--job-id", "short-lived", *config).exit_code == 0
    patch_status(kube_api, namespace, "short-lived", {"replicatedJobsStatus": jobs_status(active=1)})
    status = run("status", "short-lived", *config)
    assert status.exit_code == 0
    assert status.stdout.startswith("short-lived  Running  controller: 1 active")
    deleted = run("delete", "short-lived", *config)
    assert deleted.exit_code == 0
    assert f"deleted from namespace {namespace}" in deleted.stdout
    gone = run("status", "short-lived", *config)
    assert gone.exit_code == 1
    assert f"404: no JobSet short-lived in namespace {namespace}" in gone.stderr
