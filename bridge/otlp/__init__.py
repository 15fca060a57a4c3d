"""OTLP forwarding: every sample of every scrape, with `run_id` and `phase`, to an OTLP receiver.

The scrape loop's whole surface (DECISIONS.md "OTLP forwarding" has the mapping):

    config = resolve_config(os.environ, endpoint=flags.otlp_endpoint, ...)    # None: export off
    forwarder = OtlpForwarder(config, base_resource=base_attributes(os.environ, service_name=...),
                              static_attributes=..., relabel_config=...)
    forwarder.submit("host:9400", page, run_id=run_id, phase=phase or "none", ts_ns=scrape_start_ns)
    forwarder.mark_stale("host:9400", run_id=..., phase=..., ts_ns=...)       # endpoint gone
    forwarder.stats().as_dict()                                              # /status, report summary
    forwarder.close()

Module map: encode.py (ParsedPage → protobuf bytes: the line loop) and plan.py (its fast path, the page
plan), points.py (their context and result records), over wire.py (protobuf field writers),
starttime.py (series state: start times, resets, staleness), resource.py, config.py, export.py
(queue, batching thread, retries), transport.py (HTTP, gRPC).
Importing this package loads neither grpc nor the OpenTelemetry SDK.
"""

from bridge.otlp.config import OtlpConfig, OtlpConfigError, resolve_config
from bridge.otlp.encode import EndpointEncoder
from bridge.otlp.export import ExportStats, OtlpForwarder
from bridge.otlp.points import ContextCache, EncodedPage, PointContext
from bridge.otlp.resource import base_attributes, endpoint_attributes, parse_resource_attributes
from bridge.otlp.transport import GrpcSender, HttpSender, Sender, SendResult, make_sender
from bridge.otlp.wire import request_bytes

__all__ = [
    "ContextCache",
    "EncodedPage",
    "EndpointEncoder",
    "ExportStats",
    "GrpcSender",
    "HttpSender",
    "OtlpConfig",
    "OtlpConfigError",
    "OtlpForwarder",
    "PointContext",
    "SendResult",
    "Sender",
    "base_attributes",
    "endpoint_attributes",
    "make_sender",
    "parse_resource_attributes",
    "request_bytes",
    "resolve_config",
]
