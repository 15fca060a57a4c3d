"""bridge.otlp's curated surface, pinned; importing it stays cheap (no grpc, no OpenTelemetry SDK)."""

from __future__ import annotations

import subprocess
import sys

import bridge.otlp


def test_the_public_surface_is_exactly_this():
    assert sorted(bridge.otlp.__all__) == [
        "ContextCache", "EncodedPage", "EndpointEncoder", "ExportStats", "GrpcSender", "HttpSender",
        "OtlpConfig", "OtlpConfigError", "OtlpForwarder", "PointContext", "SendResult", "Sender",
        "base_attributes", "endpoint_attributes", "make_sender", "parse_resource_attributes", "request_bytes",
        "resolve_config",
    ]  # fmt: skip
    for name in bridge.otlp.__all__:
        assert getattr(bridge.otlp, name) is not None


def test_importing_the_package_loads_no_heavy_dependency():
    code = (
        "import sys, bridge.otlp, bridge.relabel, bridge.sidecar.pull, bridge.report.promql; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'grpc', 'opentelemetry', 'google', 'yaml', 'urllib3', 'prometheus_api_client', 'requests'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
