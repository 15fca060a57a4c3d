"""`dcgm-bridge kube …` from the command line: --dry-run needs no cluster, prints valid YAML, leaks nothing."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from bridge.endpoints import expand_telemetry_args as expand_variadic
from bridge.kube.cli import kube
from tests.kube.crd_schema import schema_errors

BASE = ["profile", "--model", "Qwen/Qwen3-0.6B", "--url", "frontend:8000", "--job-id", "bench-1", "--dry-run"]


def dry_run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(kube, [*BASE, *args], env=env, catch_exceptions=False)


def sidecar_of(jobset: dict[str, Any]) -> dict[str, Any] | None:
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return next((c for c in [*pod.get("initContainers", []), *pod["containers"]]
                 if c["name"] == "gpu-telemetry-manager"), None)


def test_gpu_telemetry_takes_several_values_like_aiperf() -> None:
    assert expand_variadic(["--gpu-telemetry", "a", "b", "--streaming", "--gpu-telemetry", "c"]) == [
        "--gpu-telemetry", "a", "--gpu-telemetry", "b", "--streaming", "--gpu-telemetry", "c"]
    assert expand_variadic(["--gpu-telemetry", "--streaming"]) == ["--streaming"]  # alone: on, defaults
    assert expand_variadic(["--gpu-telemetry=a,b"]) == ["--gpu-telemetry=a,b"]


def test_dry_run_prints_one_yaml_document_that_the_crd_schema_accepts() -> None:
    result = dry_run("--gpu-telemetry", "node1:9400", "node2:9400")
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert len(docs) == 1 and docs[0]["kind"] == "JobSet"
    assert schema_errors(docs[0]) == []
    sidecar = sidecar_of(docs[0])
    assert sidecar is not None
    assert sidecar["args"][-1] == "http://node1:9400/metrics,http://node2:9400/metrics"


def test_dry_run_shows_the_memory_estimate_as_yaml_comments() -> None:
    out = dry_run("--gpu-telemetry", "node1:9400").stdout
    assert out.startswith("# controller pod memory estimate (heuristic):")
    assert "#   gpu-telemetry" in out


def test_no_gpu_telemetry_leaves_the_sidecar_out_of_the_printed_jobset() -> None:
    result = dry_run("--no-gpu-telemetry")
    (jobset,) = yaml.safe_load_all(result.stdout)
    assert sidecar_of(jobset) is None
    assert "gpu-telemetry       0 MiB  disabled" in result.stdout


def test_dry_run_applies_the_resource_overrides_from_the_environment() -> None:
    env = {"AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU": "500m", "AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY": "1Gi"}
    (jobset,) = yaml.safe_load_all(dry_run(env=env).stdout)
    sidecar = sidecar_of(jobset)
    assert sidecar is not None
    assert sidecar["resources"]["limits"] == {"cpu": "500m", "memory": "1Gi"}


def test_dry_run_never_prints_a_secret_value() -> None:
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret-value", "OTEL_SERVICE_NAME": "bench"}
    result = dry_run("--otlp-headers-secret", "otlp-auth:headers", "--exporter-token-secret", "dcgm", env=env)
    assert result.exit_code == 0
    assert "s3cret-value" not in result.output
    (jobset,) = yaml.safe_load_all(result.stdout)
    env_vars = {e["name"]: e for e in (sidecar_of(jobset) or {})["env"]}
    assert env_vars["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"] == {
        "secretKeyRef": {"name": "otlp-auth", "key": "headers"}}
    assert env_vars["DCGM_BRIDGE_BEARER_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "dcgm", "key": "token"}}


def test_invalid_options_exit_2_listing_every_flag_to_fix() -> None:
    result = CliRunner().invoke(kube, ["profile", "--model", "m", "--url", "ftp://x", "--job-id", "Bad",
                                       "--dry-run"], env={"AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU": "lots"})
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: invalid options:")
    for name in ("--job-id 'Bad'", "--url 'ftp://x'", "AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU"):
        assert name in result.stderr


def test_a_discovery_item_in_a_dry_run_without_a_cluster_is_refused_in_one_line(tmp_path: Any) -> None:
    result = dry_run("--gpu-telemetry", "k8s://gpu-operator/nvidia-dcgm-exporter",
                     env={"KUBECONFIG": str(tmp_path / "none"), "KUBERNETES_SERVICE_HOST": ""})
    assert result.exit_code == 2
    assert result.stdout == ""  # no sidecar without its exporters to pipe into kubectl apply
    assert result.stderr.count("\n") == 1
    assert "--dry-run cannot expand k8s://gpu-operator/nvidia-dcgm-exporter without a cluster" in result.stderr


def test_a_discovery_item_in_a_dry_run_is_expanded_from_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.kube import submit
    from tests.kube.test_discovery import GPU_OPERATOR, FakeDiscovery

    monkeypatch.setattr(submit, "connect", lambda _config, _context: submit.Clients(
        None, None, None, FakeDiscovery(GPU_OPERATOR)))  # EndpointSlices: no such server here
    result = dry_run("--gpu-telemetry", "k8s://gpu-operator/nvidia-dcgm-exporter")
    assert result.exit_code == 0, result.output
    args = " ".join((sidecar_of(next(yaml.safe_load_all(result.stdout))) or {}).get("args", []))
    assert "http://10.0.1.5:9400/metrics" in args and "http://10.0.2.7:9400/metrics" in args


def test_estimate_prints_the_components() -> None:
    result = CliRunner().invoke(kube, ["estimate", "--concurrency", "8", "--gpu-telemetry", "n1:9400", "n2:9400"])
    assert result.exit_code == 0, result.output
    assert "benchmark" in result.stdout and "2 endpoints x 8 GPUs" in result.stdout
    none = CliRunner().invoke(kube, ["estimate", "--concurrency", "8"])
    assert "no --gpu-telemetry URL (defaults never count)" in none.stdout


def test_dry_run_does_not_import_the_kubernetes_client() -> None:
    code = ("import sys; from bridge.kube.cli import kube\n"
            "try:\n"
            "    kube(['profile', '--model', 'm', '--url', 'h:8000', '--job-id', 'j', '--dry-run'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "assert 'kubernetes' not in sys.modules, 'kubernetes imported'\n"
            "print('ok', file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().endswith("ok")


@pytest.mark.parametrize("command", [["status", "x"], ["delete", "x"], ["results", "x"]])
def test_commands_that_need_a_cluster_explain_a_missing_kubeconfig(command: list[str], tmp_path: Any) -> None:
    missing = tmp_path / "nope.kubeconfig"
    result = CliRunner().invoke(kube, [*command, "--kubeconfig", str(missing)])
    assert result.exit_code == 2  # a configuration error (README "Exit codes")
    assert f"cannot load kubeconfig {missing}" in result.stderr


def test_dry_run_with_128_endpoints_and_otlp_sizes_the_sidecar_from_the_model_and_says_why() -> None:
    # (64 endpoints until issue 48: since then the model's 64 x 8 GPUs with OTLP, 110 MiB with a full queue, x1.2,
    # is under AIPerf's 192Mi floor; bench/RESULTS.md measured ~100 MiB there)
    urls = [f"node{i}:9400" for i in range(128)]
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    result = dry_run("--gpu-telemetry", *urls, env=otlp)
    assert result.exit_code == 0, result.output
    (jobset,) = yaml.safe_load_all(result.stdout)
    sidecar = sidecar_of(jobset)
    assert sidecar is not None
    cpu, memory = sidecar["resources"]["limits"]["cpu"], sidecar["resources"]["limits"]["memory"]
    assert cpu.endswith("m") and int(cpu[:-1]) > 25 and memory.endswith("Mi") and int(memory[:-2]) > 192
    assert sidecar["resources"]["requests"] == {"cpu": cpu, "memory": memory}
    assert f"# gpu-telemetry sidecar CPU: {cpu} (the model: 128 endpoints x 8 GPUs" in result.stdout
    assert f"# gpu-telemetry sidecar memory: {memory} (the model's peak" in result.stdout
    assert "# gpu-telemetry sidecar model: 1024 GPUs" in result.stdout and "bench/bench_scale.py" in result.stdout
    at_64 = dry_run("--gpu-telemetry", *urls[:64], env=otlp)
    assert sidecar_of(next(yaml.safe_load_all(at_64.stdout)))["resources"]["limits"]["memory"] == "192Mi"
    assert "warning" not in result.stdout
    overridden = dry_run("--gpu-telemetry", *urls, env={**otlp, "AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU": "30m",
                                                        "AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY": "512Mi"})
    (jobset,) = yaml.safe_load_all(overridden.stdout)
    assert sidecar_of(jobset)["resources"]["limits"] == {"cpu": "30m", "memory": "512Mi"}  # type: ignore[index]
    assert "(from AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY)" in overridden.stdout
    assert "(from AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU)" in overridden.stdout
