"""`kube profile` flags + environment → ProfileSpec: overrides, pass-through, secrets and problems."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.kube.profile import ProfileOptions, resolve
from bridge.kube.validate import ValidationError

OPTS = ProfileOptions(model="Qwen/Qwen3-0.6B", url="frontend:8000", job_id="bench-1")


def problems_of(opts: ProfileOptions, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        resolve(opts, env or {})
    return caught.value.problems


def test_telemetry_is_on_by_default_with_aiperfs_25m_and_192mi() -> None:
    telemetry = resolve(OPTS, {}).spec.telemetry
    assert telemetry.enabled and not telemetry.legacy_sidecar
    assert (telemetry.cpu, telemetry.memory) == ("25m", "192Mi")


def test_the_resource_variables_override_the_sidecars_requests_and_limits() -> None:
    env = {"AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU": "500m", "AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY": "1Gi"}
    telemetry = resolve(OPTS, env).spec.telemetry
    assert (telemetry.cpu, telemetry.memory) == ("500m", "1Gi")


def test_bad_resource_variables_are_named_in_the_error() -> None:
    env = {"AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU": "lots", "AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY": "1Ki"}
    problems = problems_of(OPTS, env)
    assert problems[0].startswith("AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU: 'lots' is not a Kubernetes quantity")
    assert problems[1] == "AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY: 1Ki is below the minimum of 64Mi"


def test_gpu_telemetry_urls_are_normalised_like_aiperfs() -> None:
    opts = ProfileOptions(**{**OPTS.__dict__, "gpu_telemetry": ("node1:9400", "http://h/custom,node1:9400")})
    assert resolve(opts, {}).spec.telemetry.urls == ("http://node1:9400/metrics", "http://h/custom/metrics")


def test_a_url_with_credentials_is_refused_and_its_secret_is_not_repeated() -> None:
    opts = ProfileOptions(**{**OPTS.__dict__, "gpu_telemetry": ("http://user:hunter2@node1:9400/metrics",)})
    (problem,) = problems_of(opts)
    assert "--exporter-token-secret" in problem and "hunter2" not in problem


def test_a_token_named_query_is_refused_and_any_other_query_value_is_a_warning_that_does_not_repeat_it() -> None:
    opts = ProfileOptions(**{**OPTS.__dict__, "gpu_telemetry": ("http://node1:9400/metrics?sig=hunter2",)})
    (problem,) = problems_of(opts)
    assert "carries credentials" in problem and "hunter2" not in problem
    opts = ProfileOptions(**{**OPTS.__dict__, "gpu_telemetry": ("http://node1:9400/metrics?session=hunter3",)})
    resolved = resolve(opts, {})
    (warning,) = [w for w in resolved.warnings if "--gpu-telemetry" in w]
    assert "session=REDACTED" in warning and "clear text" in warning and "hunter3" not in warning


def test_gpu_telemetry_with_no_gpu_telemetry_is_an_error() -> None:
    opts = ProfileOptions(**{**OPTS.__dict__, "gpu_telemetry": ("node1:9400",), "no_gpu_telemetry": True})
    assert problems_of(opts) == ["--gpu-telemetry and --no-gpu-telemetry: give one or the other"]


def test_aiperf_and_otel_variables_pass_through_but_credentials_only_as_secret_references() -> None:
    env = {"AIPERF_GPU_COLLECTION_INTERVAL": "0.5", "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "localhost:9400",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.obs:4317", "OTEL_SERVICE_NAME": "bench",
           "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret", "HOME": "/root"}
    opts = ProfileOptions(**{**OPTS.__dict__, "otlp_headers_secret": "otlp-auth"})
    resolved = resolve(opts, env)
    assert dict(resolved.spec.telemetry.env) == {
        "AIPERF_GPU_COLLECTION_INTERVAL": "0.5", "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "localhost:9400",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.obs:4317", "OTEL_SERVICE_NAME": "bench"}
    assert resolved.spec.telemetry.otlp_headers_secret is not None
    assert resolved.spec.telemetry.otlp_headers_secret.key == "headers"
    assert any("OTEL_EXPORTER_OTLP_HEADERS is set but not copied" in w for w in resolved.warnings)
    assert "s3cret" not in str(resolved)


def test_a_collection_interval_out_of_range_is_named() -> None:
    (problem,) = problems_of(OPTS, {"AIPERF_GPU_COLLECTION_INTERVAL": "0.001"})
    assert problem.startswith("AIPERF_GPU_COLLECTION_INTERVAL:")


def test_a_custom_metrics_csv_is_read_checked_and_carried(tmp_path: Path, data_dir: Path) -> None:
    csv = tmp_path / "extra.csv"
    csv.write_text("DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, PCIe replays (in count)\n")
    opts = ProfileOptions(**{**OPTS.__dict__, "gpu_telemetry": ("node1:9400", str(csv))})
    telemetry = resolve(opts, {}).spec.telemetry
    assert telemetry.metrics_csv is not None and "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in telemetry.metrics_csv
    bad = tmp_path / "bad.csv"
    bad.write_text("NOT_A_FIELD, gauge, x\n")
    (problem,) = problems_of(ProfileOptions(**{**OPTS.__dict__, "gpu_telemetry": (str(bad),)}))
    assert problem.startswith(f"--gpu-telemetry {bad}:") and "does not start with DCGM_" in problem


def test_every_problem_is_reported_at_once_naming_its_flag() -> None:
    opts = ProfileOptions(model="m", url="ftp://x", job_id="Bad_Id", namespace="Bad_NS", concurrency=0,
                          node_selector=("novalue",), toleration=("gpu:Sometimes",), ttl=-1, queue="a b")
    flags = [p.split(" ")[0].rstrip(":") for p in problems_of(opts)]
    assert flags == sorted(flags)
    assert {"--job-id", "--namespace", "--url", "--concurrency", "--node-selector", "--toleration", "--ttl",
            "--queue"} <= set(flags)


def test_a_pvc_turns_the_results_hold_off_unless_asked() -> None:
    assert resolve(OPTS, {}).spec.results_hold_seconds == 300
    with_pvc = ProfileOptions(**{**OPTS.__dict__, "artifacts_pvc": "bench-artifacts"})
    assert resolve(with_pvc, {}).spec.results_hold_seconds == 0
    asked = ProfileOptions(**{**OPTS.__dict__, "artifacts_pvc": "bench-artifacts", "results_hold": 60})
    assert resolve(asked, {}).spec.results_hold_seconds == 60


def test_discovery_items_wait_for_submit_time_and_count_once_in_the_estimate() -> None:
    opts = ProfileOptions(**{**OPTS.__dict__, "gpu_telemetry": ("k8s://gpu-operator/nvidia-dcgm-exporter:9400",)})
    resolved = resolve(opts, {})
    assert resolved.discovery == ("k8s://gpu-operator/nvidia-dcgm-exporter:9400",)
    assert resolved.spec.telemetry.urls == ()
    assert resolved.estimate.component("gpu-telemetry").mib > 0
    merged = resolved.with_urls(["http://10.0.0.1:9400/metrics"])
    assert merged.telemetry.urls == ("http://10.0.0.1:9400/metrics",)
