"""The controller pod memory estimator (the seed's rule for the GPU-telemetry share) and the sidecar's resource
model (issue 34)."""

from __future__ import annotations

import math

from bridge.kube.estimate import (
    CPU_HEADROOM,
    CPU_MS_PER_GPU_SCRAPE,
    CPU_WARN_FRACTION,
    MEMORY_HEADROOM,
    MODEL_SOURCE,
    benchmark_memory_request,
    estimate_controller,
    sidecar_cpu,
    sidecar_model,
)
from bridge.kube.validate import quantity_value

COMMON = {"concurrency": 32, "request_count": 1024, "streaming": True}


def test_the_telemetry_share_is_zero_when_telemetry_is_disabled() -> None:
    estimate = estimate_controller(**COMMON, telemetry_enabled=False, telemetry_urls=3)
    assert estimate.component("gpu-telemetry").mib == 0
    assert "disabled" in estimate.component("gpu-telemetry").formula


def test_the_telemetry_share_is_zero_without_a_url_because_defaults_never_count() -> None:
    estimate = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=0)
    assert estimate.component("gpu-telemetry").mib == 0
    assert "defaults never count" in estimate.component("gpu-telemetry").formula


def test_the_telemetry_share_grows_with_endpoints_and_otlp_but_not_with_the_runs_length() -> None:
    one = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=1)
    four = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=4)
    otlp = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=4, otlp=True)
    long = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=1, duration_s=6000)
    share = [e.component("gpu-telemetry").mib for e in (one, four, otlp, long)]
    assert 0 < share[0] < share[1] < share[2] and share[3] == share[0]


def test_the_total_is_the_sum_and_the_table_names_every_component() -> None:
    estimate = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=2)
    assert estimate.total_mib == sum(c.mib for c in estimate.components)
    lines = estimate.lines()
    assert lines[0].startswith("controller pod memory estimate")
    assert any(line.strip().startswith("benchmark") for line in lines)
    assert lines[-1].strip().startswith("total")


def test_a_memory_limit_set_below_the_model_warns_with_the_variable_to_raise() -> None:
    estimate = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=64, otlp=True,
                                   telemetry_memory="96Mi")  # (128Mi until issue 48: the model's 110 MiB now)
    (warning,) = estimate.warnings()
    assert "AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY" in warning
    assert estimate.telemetry_memory is not None and estimate.telemetry_memory.quantity == "96Mi"


def test_more_gpus_than_25m_can_scrape_at_the_interval_warns_with_the_variables_to_change() -> None:
    # the fewest 8-GPU endpoints whose scraping at 3 Hz needs more than the warning's share of 25m
    many = math.floor(25 * CPU_WARN_FRACTION * 0.333 / (8 * CPU_MS_PER_GPU_SCRAPE)) + 1
    one = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=1, telemetry_cpu="25m", otlp=True)
    crowded = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=many, telemetry_cpu="25m",
                                  otlp=True)
    assert one.warnings() == []
    (warning,) = crowded.warnings()
    assert "AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU" in warning and "AIPERF_GPU_COLLECTION_INTERVAL" in warning
    relaxed = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=many, telemetry_cpu="25m",
                                  collection_interval_s=1.0, otlp=True)
    assert relaxed.warnings() == []


def test_the_record_count_sizes_the_shutdown_and_counts_only_named_urls() -> None:
    assert estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=0).telemetry_records == 0
    one = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=1, duration_s=600)
    assert one.telemetry_records == 1802 * 8


def test_the_benchmark_memory_request_is_the_estimate_rounded_up_to_256mi() -> None:
    estimate = estimate_controller(**COMMON, telemetry_enabled=False, telemetry_urls=0)
    assert benchmark_memory_request(estimate) == "1792Mi"


def test_the_sidecar_cpu_grows_with_endpoints_and_interval_from_the_25m_floor() -> None:
    one = sidecar_cpu(endpoints=1, gpus_per_endpoint=8, collection_interval_s=0.333)
    assert one.quantity == "25m" and "floor" in one.reason
    twelve = sidecar_cpu(endpoints=24, gpus_per_endpoint=8, collection_interval_s=0.333)
    sixteen = sidecar_cpu(endpoints=32, gpus_per_endpoint=8, collection_interval_s=0.333)
    slow = sidecar_cpu(endpoints=32, gpus_per_endpoint=8, collection_interval_s=1.0)
    cores = [float(quantity_value(c.quantity)) for c in (twelve, sixteen, slow)]
    assert 0.025 <= cores[0] < cores[1] and cores[2] < cores[1]
    # sized so that the scraping need stays under the warning's fraction of the limit
    need = 32 * 8 * CPU_MS_PER_GPU_SCRAPE / 0.333 / 1000
    assert need <= cores[1] * CPU_WARN_FRACTION
    assert "32 endpoints x 8 GPUs" in sixteen.reason
    assert sidecar_cpu(endpoints=16, gpus_per_endpoint=8, collection_interval_s=0.333, override="40m").quantity == "40m"


def test_the_model_gives_at_least_its_peak_with_headroom_and_never_below_aiperfs_25m_and_192mi() -> None:
    for endpoints in (1, 8, 16, 32, 64, 128):
        for otlp in (False, True):
            model = sidecar_model(endpoints=endpoints, gpus_per_endpoint=8, collection_interval_s=0.333, otlp=otlp)
            cpu_m = float(quantity_value(model.cpu_quantity)) * 1000
            memory_mib = float(quantity_value(model.memory_quantity)) / 2**20
            assert cpu_m >= max(25.0, model.cpu_m * CPU_HEADROOM)
            assert memory_mib >= max(192.0, model.memory_mib * MEMORY_HEADROOM)
    small = sidecar_model(endpoints=1, gpus_per_endpoint=8, collection_interval_s=0.333)
    assert (small.cpu_quantity, small.memory_quantity) == ("25m", "192Mi")


def test_the_model_counts_mig_instances_and_otlp_and_its_memory_ignores_the_runs_length() -> None:
    plain = sidecar_model(endpoints=8, gpus_per_endpoint=8, collection_interval_s=0.333, otlp=False)
    otlp = sidecar_model(endpoints=8, gpus_per_endpoint=8, collection_interval_s=0.333, otlp=True)
    mig = sidecar_model(endpoints=8, gpus_per_endpoint=8, collection_interval_s=0.333, otlp=True, mig=7)
    assert plain.memory_mib < otlp.memory_mib < mig.memory_mib and plain.cpu_m < otlp.cpu_m < mig.cpu_m
    assert mig.gpus == 8 * 8 * 7


def test_dry_run_lines_give_the_models_figures_their_source_and_the_overrides() -> None:
    sized = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=64, otlp=True)
    text = "\n".join(sized.all_lines())
    assert MODEL_SOURCE in text and "512 GPUs" in text
    assert sized.telemetry_cpu is not None and sized.telemetry_memory is not None
    assert f"sidecar CPU: {sized.model.cpu_quantity}" in text and f"memory: {sized.model.memory_quantity}" in text
    given = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=64, otlp=True,
                                telemetry_cpu="300m", telemetry_memory="1Gi")
    lines = "\n".join(given.all_lines())
    assert "CPU: 300m (from AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU)" in lines
    assert "memory: 1Gi (from AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY)" in lines


def test_a_sized_sidecar_never_warns_that_it_cannot_keep_up() -> None:
    for urls in (1, 4, 16, 64):
        assert estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=urls).warnings() == []
