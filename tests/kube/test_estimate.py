"""The controller pod memory estimator: the seed's rule for the GPU-telemetry share."""

from __future__ import annotations

import math

from bridge.kube.estimate import (
    CPU_WARN_FRACTION,
    SCRAPE_CPU_SECONDS_PER_GPU,
    benchmark_memory_request,
    estimate_controller,
    sidecar_cpu,
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


def test_the_telemetry_share_grows_with_endpoints_and_duration() -> None:
    one = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=1)
    four = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=4)
    long = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=1, duration_s=6000)
    assert 0 < one.component("gpu-telemetry").mib < four.component("gpu-telemetry").mib
    assert one.component("gpu-telemetry").mib < long.component("gpu-telemetry").mib


def test_the_total_is_the_sum_and_the_table_names_every_component() -> None:
    estimate = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=2)
    assert estimate.total_mib == sum(c.mib for c in estimate.components)
    lines = estimate.lines()
    assert lines[0].startswith("controller pod memory estimate")
    assert any(line.strip().startswith("benchmark") for line in lines)
    assert lines[-1].strip().startswith("total")


def test_an_estimate_above_the_sidecars_limit_warns_with_the_variable_to_raise() -> None:
    estimate = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=16, duration_s=7200,
                                   telemetry_memory="192Mi")
    (warning,) = estimate.warnings()
    assert "AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY" in warning


def test_more_gpus_than_25m_can_scrape_at_the_interval_warns_with_the_variables_to_change() -> None:
    # the fewest 8-GPU endpoints whose scraping at 3 Hz needs more than the warning's share of 25m
    many = math.floor(0.025 * CPU_WARN_FRACTION * 0.333 / (8 * SCRAPE_CPU_SECONDS_PER_GPU)) + 1
    one = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=1, telemetry_cpu="25m")
    crowded = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=many, telemetry_cpu="25m")
    assert one.warnings() == []
    (warning,) = crowded.warnings()
    assert "AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU" in warning and "AIPERF_GPU_COLLECTION_INTERVAL" in warning
    relaxed = estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=many, telemetry_cpu="25m",
                                  collection_interval_s=1.0)
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
    twelve = sidecar_cpu(endpoints=12, gpus_per_endpoint=8, collection_interval_s=0.333)
    sixteen = sidecar_cpu(endpoints=16, gpus_per_endpoint=8, collection_interval_s=0.333)
    slow = sidecar_cpu(endpoints=16, gpus_per_endpoint=8, collection_interval_s=1.0)
    cores = [float(quantity_value(c.quantity)) for c in (twelve, sixteen, slow)]
    assert 0.025 < cores[0] < cores[1] and cores[2] < cores[1]
    # sized so that the scraping need stays under the warning's fraction of the limit
    need = 16 * 8 * SCRAPE_CPU_SECONDS_PER_GPU / 0.333
    assert need <= cores[1] * CPU_WARN_FRACTION
    assert "16 endpoints x 8 GPUs" in sixteen.reason
    assert sidecar_cpu(endpoints=16, gpus_per_endpoint=8, collection_interval_s=0.333, override="40m").quantity == "40m"


def test_a_sized_sidecar_never_warns_that_it_cannot_keep_up() -> None:
    for urls in (1, 4, 16, 64):
        assert estimate_controller(**COMMON, telemetry_enabled=True, telemetry_urls=urls).warnings() == []
