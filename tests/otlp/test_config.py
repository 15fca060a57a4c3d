"""OTLP settings: flag > OTEL_EXPORTER_OTLP_METRICS_* > OTEL_EXPORTER_OTLP_* > default; resource."""

from __future__ import annotations

import pytest

from bridge.otlp import (
    OtlpConfigError,
    base_attributes,
    endpoint_attributes,
    parse_resource_attributes,
    resolve_config,
)


def test_export_is_off_unless_an_endpoint_is_configured():
    assert resolve_config({}) is None
    assert resolve_config({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) is None


def test_the_generic_endpoint_gets_the_metrics_path_and_the_metrics_one_is_used_as_is():
    assert (
        resolve_config({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}).endpoint
        == "http://c:4318/v1/metrics"
    )
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://vm:8428/opentelemetry/v1/metrics",
    }
    assert resolve_config(env).endpoint == "http://vm:8428/opentelemetry/v1/metrics"


def test_a_flag_wins_over_the_environment_and_a_bare_host_gets_http_and_the_path():
    env = {
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://env:1/v1/metrics",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
    }
    config = resolve_config(env, endpoint="vm:8428", timeout_s=3.0)
    assert (config.endpoint, config.timeout_s, config.protocol) == (
        "http://vm:8428/v1/metrics",
        3.0,
        "http/protobuf",
    )
    assert resolve_config(env).timeout_s == 2.5  # the spec's unit is milliseconds


def test_metrics_specific_variables_win_over_generic_ones():
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
        "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "gzip",
        "OTEL_EXPORTER_OTLP_HEADERS": "a=1",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "Authorization=Bearer%20t0k,X-Scope-OrgID=team",
    }
    config = resolve_config(env)
    assert config.compression == "gzip"
    assert config.headers == (("authorization", "Bearer t0k"), ("x-scope-orgid", "team"))


def test_grpc_endpoints_take_plaintext_from_http_and_tls_from_https_or_the_insecure_variable():
    grpc = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    plain = resolve_config({**grpc, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://rotel:4317"})
    assert (plain.endpoint, plain.insecure, plain.protocol) == ("rotel:4317", True, "grpc")
    assert resolve_config({**grpc, "OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317"}).insecure is False
    assert resolve_config({**grpc, "OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317"}).insecure is False
    bare = {**grpc, "OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"}
    assert resolve_config(bare).insecure is True


def test_tls_files_come_from_the_environment():
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://c",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/ca.pem",
        "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE": "/c.pem",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/k.pem",
    }
    config = resolve_config(env)
    assert (config.certificate, config.client_certificate, config.client_key) == (
        "/ca.pem",
        "/c.pem",
        "/k.pem",
    )


def test_bad_settings_are_all_reported_sorted_and_never_echo_a_header_value():
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "soon",
        "OTEL_EXPORTER_OTLP_HEADERS": "secret-token-value",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd",
    }
    with pytest.raises(OtlpConfigError) as info:
        resolve_config(env)
    lines = str(info.value).splitlines()
    assert len(lines) == 4 and lines == sorted(lines)
    assert "secret-token-value" not in str(info.value)
    assert "http/json" in str(info.value)


@pytest.mark.parametrize("headers", ["x-token=abc%0D%0AX-Injected: 1", "x-token=a%00b", "bad name=v",
                                     "x-token=caf%C3%A9%E2%82%AC"])
def test_a_header_that_would_break_the_request_is_refused_without_showing_its_value(headers: str):
    with pytest.raises(OtlpConfigError) as info:
        resolve_config({}, endpoint="http://c:1", headers=headers)
    message = str(info.value)
    assert "OTLP header" in message and "abc" not in message and "Injected" not in message


def test_the_config_repr_hides_header_values():
    config = resolve_config({}, endpoint="http://c:1", headers="authorization=Bearer s3cret")
    assert "s3cret" not in repr(config) and config.header_names == ["authorization"]


def test_resource_attributes_merge_detected_env_and_flags_in_that_order():
    env = {
        "NODE_NAME": "gpu-node-7",
        "POD_NAME": "bench-0",
        "POD_NAMESPACE": "llm",
        "OTEL_RESOURCE_ATTRIBUTES": "k8s.cluster.name=prod,service.name=from-env,team=a%2Cb,bad",
    }
    attrs = base_attributes(env, attributes={"team": "flag"}, hostname=lambda: "container-1")
    assert attrs == {
        "host.name": "gpu-node-7",
        "k8s.node.name": "gpu-node-7",
        "k8s.pod.name": "bench-0",
        "k8s.namespace.name": "llm",
        "k8s.cluster.name": "prod",
        "service.name": "from-env",
        "team": "flag",
    }
    assert base_attributes({**env, "OTEL_SERVICE_NAME": "svc"})["service.name"] == "svc"
    assert base_attributes(env, service_name="cli")["service.name"] == "cli"


def test_the_default_service_name_is_dcgm_exporter_and_the_host_name_is_detected(tmp_path):
    ns = tmp_path / "namespace"
    ns.write_text("gpu-ns\n")
    attrs = base_attributes({"POD_NAME": "p"}, hostname=lambda: "h", namespace_file=ns)
    assert attrs["service.name"] == "dcgm-exporter" and attrs["host.name"] == "h"
    assert attrs["k8s.namespace.name"] == "gpu-ns"


def test_service_instance_id_is_always_the_endpoint():
    base = base_attributes({"OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=x"}, hostname=lambda: "h")
    assert endpoint_attributes(base, "10.0.0.1:9400")["service.instance.id"] == "10.0.0.1:9400"


def test_resource_attribute_text_is_percent_decoded():
    assert parse_resource_attributes("a=b%3Dc, d = e ,=x,") == {"a": "b=c", "d": "e"}


def test_the_downward_api_names_kube_profile_sets_become_resource_attributes():
    from bridge.otlp import base_attributes

    env = {"DCGM_BRIDGE_NODE_NAME": "gpu-node-7", "DCGM_BRIDGE_POD_NAME": "bench-controller-0-0-abcde",
           "DCGM_BRIDGE_POD_NAMESPACE": "bench"}
    attrs = base_attributes(env, hostname=lambda: "container")
    assert attrs["host.name"] == "gpu-node-7" and attrs["k8s.node.name"] == "gpu-node-7"
    assert attrs["k8s.pod.name"] == "bench-controller-0-0-abcde" and attrs["k8s.namespace.name"] == "bench"
