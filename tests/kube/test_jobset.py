"""The JobSet builder: telemetry on/off/legacy/overrides, all checked against the CRD schema and webhook rules."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from typing import Any

import pytest

from bridge.kube.jobset import (
    CONTROL_PLANE,
    CONTROL_TOKEN_FILE,
    DONE_FILE,
    REPORT_CPU_SECONDS_PER_GPU,
    SIDECAR,
    Benchmark,
    Placement,
    ProfileSpec,
    SecretRef,
    Telemetry,
    Toleration,
    build_jobset,
    control_plane_script,
    startup_failure_threshold,
    termination_grace_seconds,
)
from bridge.kube.validate import webhook_problems
from tests.kube.crd_schema import schema_errors

BENCH = Benchmark(model="Qwen/Qwen3-0.6B", url="dynamo-frontend.inference.svc.cluster.local:8000",
                  endpoint="/v1/chat/completions", streaming=True, concurrency=32, request_count=1024)


def make_spec(**changes: Any) -> ProfileSpec:
    base = ProfileSpec(job_id="bench-1", namespace="my-benchmarks", benchmark=BENCH,
                       telemetry=Telemetry(urls=("http://dcgm-exporter.gpu-operator.svc.cluster.local:9400/metrics",)),
                       results_hold_seconds=300)
    return replace(base, **changes)


def pod(jobset: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return spec


def container(jobset: dict[str, Any], name: str) -> dict[str, Any] | None:
    p = pod(jobset)
    return next((c for c in [*p.get("initContainers", []), *p["containers"]] if c["name"] == name), None)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


VARIANTS = {
    "native": make_spec(),
    "disabled": make_spec(telemetry=Telemetry(enabled=False)),
    "legacy": make_spec(telemetry=Telemetry(urls=("http://n1:9400/metrics",), legacy_sidecar=True)),
    "overrides": make_spec(telemetry=Telemetry(urls=("http://n1:9400/metrics",), cpu="500m", memory="1Gi")),
    "everything": make_spec(
        telemetry=Telemetry(urls=("http://n1:9400/metrics", "http://n2:9400/metrics"),
                            metrics_csv="DCGM_FI_DEV_SM_CLOCK, gauge, SM clock (in MHz)",
                            env=(("AIPERF_GPU_COLLECTION_INTERVAL", "0.5"), ("OTEL_SERVICE_NAME", "bench")),
                            otlp_headers_secret=SecretRef("otlp", "headers"),
                            exporter_token_secret=SecretRef("dcgm-token", "token")),
        placement=Placement(service_account="bench", node_selector=(("pool", "cpu"),),
                            tolerations=(Toleration("dedicated", "bench", "NoSchedule"), Toleration("gpu")),
                            image_pull_secrets=("regcred",), queue="team-a"),
        artifacts_pvc="bench-artifacts", ttl_seconds=0, results_hold_seconds=0),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_passes_the_crd_schema_strictly_and_the_webhook_rules(variant: str) -> None:
    jobset = build_jobset(VARIANTS[variant])
    assert schema_errors(jobset) == []
    assert webhook_problems(jobset) == []


def test_the_controller_job_has_aiperfs_shape() -> None:
    jobset = build_jobset(make_spec())
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
    (rjob,) = jobset["spec"]["replicatedJobs"]
    assert rjob["name"] == "controller" and rjob["replicas"] == 1
    job = rjob["template"]["spec"]
    assert (job["completionMode"], job["backoffLimit"], job["parallelism"], job["completions"]) == ("Indexed", 0, 1, 1)
    assert pod(jobset)["restartPolicy"] == "Never"
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["controller"]}
    assert jobset["spec"]["ttlSecondsAfterFinished"] == 300
    assert "suspend" not in jobset["spec"]


def test_the_job_id_label_is_on_the_jobset_and_the_pod_template() -> None:
    jobset = build_jobset(make_spec())
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert jobset["metadata"]["labels"]["aiperf.nvidia.com/job-id"] == "bench-1"
    assert template["metadata"]["labels"]["aiperf.nvidia.com/job-id"] == "bench-1"


def test_telemetry_on_adds_a_native_sidecar_with_aiperfs_port_probes_and_resources() -> None:
    jobset = build_jobset(make_spec())
    (sidecar,) = pod(jobset)["initContainers"]
    assert sidecar["name"] == SIDECAR and sidecar["restartPolicy"] == "Always"
    assert sidecar["ports"] == [{"containerPort": 8086, "name": "health"}]
    assert sidecar["resources"] == {"requests": {"cpu": "25m", "memory": "192Mi"},
                                    "limits": {"cpu": "25m", "memory": "192Mi"}}
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert sidecar["command"] == ["dcgm-bridge", "sidecar"]
    assert sidecar["args"] == ["--run-id", "bench-1", "--artifact-dir", "/artifacts", "--health-port", "8086",
                               "--gpu-telemetry", "http://dcgm-exporter.gpu-operator.svc.cluster.local:9400/metrics"]
    assert [c["name"] for c in pod(jobset)["containers"]] == [CONTROL_PLANE]


def test_no_gpu_telemetry_omits_the_container_entirely() -> None:
    jobset = build_jobset(VARIANTS["disabled"])
    assert "initContainers" not in pod(jobset)
    assert [c["name"] for c in pod(jobset)["containers"]] == [CONTROL_PLANE]
    assert "telemetry-tmp" not in [v["name"] for v in pod(jobset)["volumes"]]
    assert "gpu-telemetry-manager" not in str(jobset)


def test_the_benchmark_runs_aiperf_with_its_own_telemetry_off_and_artifacts_on_the_shared_volume() -> None:
    cp = container(build_jobset(make_spec()), CONTROL_PLANE)
    assert cp is not None
    assert cp["args"][:2] == ["aiperf", "profile"]
    assert cp["args"][-3:] == ["--artifact-dir", "/artifacts", "--no-gpu-telemetry"]
    assert {"name": "artifacts", "mountPath": "/artifacts"} in cp["volumeMounts"]
    sidecar = container(build_jobset(make_spec()), SIDECAR)
    assert sidecar is not None and {"name": "artifacts", "mountPath": "/artifacts"} in sidecar["volumeMounts"]
    assert env_of(sidecar)["DCGM_BRIDGE_PHASE_MANIFEST"] == "/artifacts"


def test_a_native_sidecar_is_told_to_outlive_complete_so_the_kubelet_does_not_restart_it() -> None:
    native = env_of(container(build_jobset(make_spec()), SIDECAR) or {})
    legacy = env_of(container(build_jobset(VARIANTS["legacy"]), SIDECAR) or {})
    assert native["DCGM_BRIDGE_EXIT_ON_COMPLETE"] == "false"
    assert "DCGM_BRIDGE_EXIT_ON_COMPLETE" not in legacy and "DCGM_BRIDGE_DONE_FILE" not in native


def test_the_legacy_sidecar_is_a_regular_container_told_to_exit_by_a_done_file() -> None:
    jobset = build_jobset(VARIANTS["legacy"])
    assert "initContainers" not in pod(jobset)
    sidecar = container(jobset, SIDECAR)
    assert sidecar is not None and "restartPolicy" not in sidecar
    assert env_of(sidecar)["DCGM_BRIDGE_DONE_FILE"] == DONE_FILE
    script = control_plane_script(VARIANTS["legacy"])
    assert (f'(umask 077; printf "%s %s %s\\n" "$DCGM_BRIDGE_RUN_ID" "$rc" "$(cat {CONTROL_TOKEN_FILE})" '
            f'> {DONE_FILE})') in script
    assert "http://127.0.0.1:8086/readyz" in script  # no start ordering: it waits for the sidecar itself
    assert DONE_FILE not in control_plane_script(make_spec())


def test_resource_overrides_set_requests_equal_to_limits_and_resize_the_probes() -> None:
    sidecar = container(build_jobset(VARIANTS["overrides"]), SIDECAR)
    assert sidecar is not None
    assert sidecar["resources"]["requests"] == sidecar["resources"]["limits"] == {"cpu": "500m", "memory": "1Gi"}
    assert sidecar["startupProbe"]["failureThreshold"] < startup_failure_threshold("25m")


def test_the_startup_probe_and_grace_period_are_sized_for_a_25m_cpu_limit() -> None:
    # 1.5 CPU-seconds at 0.025 cores is 60 s of wall time; both budgets allow twice that.
    assert startup_failure_threshold("25m") * 5 >= 120
    assert termination_grace_seconds(Telemetry()) >= 120
    assert termination_grace_seconds(Telemetry(cpu="1")) == 30
    assert termination_grace_seconds(Telemetry(enabled=False)) == 30


def test_the_grace_period_grows_with_the_records_the_final_report_must_read() -> None:
    short, hour = Telemetry(expected_records=14_416), Telemetry(expected_records=86_496)  # 8 GPUs, 10 min / 1 h
    assert termination_grace_seconds(Telemetry()) < termination_grace_seconds(short) < termination_grace_seconds(hour)
    assert termination_grace_seconds(hour) >= 2 * (1.5 + 86_496 * 9e-7) / 0.025  # twice the measured cost at 25m


def test_the_grace_period_grows_with_the_gpus_whose_ages_the_final_report_fits() -> None:
    """Each GPU's readings' ages cost the report a bounded fit (bench/bench_longrun.py times its slowest: a drifting
    grid); the grace holds twice that at 25m for every GPU."""
    eight, sixty_four = Telemetry(expected_gpus=8), Telemetry(expected_gpus=64)
    assert termination_grace_seconds(Telemetry()) < termination_grace_seconds(eight) < termination_grace_seconds(
        sixty_four)
    assert termination_grace_seconds(sixty_four) >= 2 * (1.5 + 64 * REPORT_CPU_SECONDS_PER_GPU) / 0.025


def test_secrets_travel_only_as_secret_key_references() -> None:
    sidecar = container(build_jobset(VARIANTS["everything"]), SIDECAR)
    assert sidecar is not None
    env = env_of(sidecar)
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == {"secretKeyRef": {"name": "otlp", "key": "headers"}}
    assert env["DCGM_BRIDGE_BEARER_TOKEN"] == {"secretKeyRef": {"name": "dcgm-token", "key": "token"}}
    assert env["OTEL_SERVICE_NAME"] == "bench" and env["AIPERF_GPU_COLLECTION_INTERVAL"] == "0.5"


def test_the_sidecar_gets_its_pod_name_and_namespace_from_the_downward_api() -> None:
    env = env_of(container(build_jobset(make_spec()), SIDECAR) or {})
    assert env["DCGM_BRIDGE_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["DCGM_BRIDGE_POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["DCGM_BRIDGE_RUN_ID"] == "bench-1"
    assert "$(DCGM_BRIDGE_POD_NAME)" in env["OTEL_RESOURCE_ATTRIBUTES"]


def test_a_custom_metrics_csv_rides_in_the_environment_and_is_written_before_exec() -> None:
    sidecar = container(build_jobset(VARIANTS["everything"]), SIDECAR)
    assert sidecar is not None
    assert env_of(sidecar)["DCGM_BRIDGE_METRICS_CSV"].startswith("DCGM_FI_DEV_SM_CLOCK")
    assert sidecar["command"][:2] == ["/bin/sh", "-c"]
    assert "exec dcgm-bridge sidecar" in sidecar["command"][2]
    assert sidecar["args"][-1].endswith(",/tmp/dcgm-bridge-metrics.csv")


def test_every_container_is_non_root_with_a_read_only_root_and_no_capabilities() -> None:
    jobset = build_jobset(VARIANTS["legacy"])
    assert pod(jobset)["securityContext"]["runAsNonRoot"] is True
    for c in pod(jobset)["containers"]:
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                        "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def test_placement_options_reach_the_pod_and_a_queue_suspends_the_jobset() -> None:
    jobset = build_jobset(VARIANTS["everything"])
    p = pod(jobset)
    assert p["serviceAccountName"] == "bench" and "automountServiceAccountToken" not in p
    assert p["nodeSelector"] == {"pool": "cpu"}
    assert p["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "bench", "effect": "NoSchedule"},
                                {"key": "gpu", "operator": "Exists"}]
    assert p["imagePullSecrets"] == [{"name": "regcred"}]
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert jobset["spec"]["suspend"] is True
    assert jobset["spec"]["ttlSecondsAfterFinished"] == 0


def test_an_artifacts_pvc_is_mounted_with_one_folder_per_run() -> None:
    jobset = build_jobset(VARIANTS["everything"])
    assert {"name": "artifacts", "persistentVolumeClaim": {"claimName": "bench-artifacts"}} in pod(jobset)["volumes"]
    cp = container(jobset, CONTROL_PLANE)
    assert cp is not None
    assert {"name": "artifacts", "mountPath": "/artifacts", "subPath": "bench-1"} in cp["volumeMounts"]


def test_the_results_hold_keeps_the_control_plane_alive_until_fetched_or_the_hold_ends() -> None:
    script = control_plane_script(make_spec())
    assert "/artifacts/.dcgm-bridge-results-fetched" in script and "-lt 300" in script
    assert script.endswith('exit "$rc"')
    assert "fetched" not in control_plane_script(make_spec(results_hold_seconds=0))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_control_plane_script_is_valid_posix_shell(variant: str) -> None:
    result = subprocess.run(["sh", "-n", "-c", control_plane_script(VARIANTS[variant])], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_the_control_plane_script_exits_with_the_benchmarks_status() -> None:
    script = control_plane_script(make_spec(results_hold_seconds=0))
    result = subprocess.run(["sh", "-c", script, "control-plane", "sh", "-c", "exit 3"], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 3
    assert "benchmark exited with status 3" in result.stdout
