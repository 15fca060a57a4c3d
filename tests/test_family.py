"""One "family of this sample" rule (bridge.parse.family_of), and what each consumer does with it.

The intended behaviour, pinned before parse.py, sidecar/pull.py and otlp/encode.py were given the one
rule (they treated `_created` three ways): a sample belongs to its own name's TYPE, else to the TYPE of
the name without one of the family suffixes. `x_created` is OpenMetrics metadata of the family `x`
(its start time), not a value: neither OTLP nor the pull page sends it. The pull page speaks text 0.0.4,
where a counter's TYPE is named after its sample (`x_total`, as prometheus_client writes it).
"""

from __future__ import annotations

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from bridge.otlp.encode import ContextCache, EndpointEncoder
from bridge.otlp.wire import request_bytes
from bridge.parse import Family, family_of, family_type, parse_page
from bridge.sidecar.pull import BridgeHealth, LatestPage, render_exposition

PAGE = b"""# HELP x Requests.
# TYPE x counter
x_total 5
x_created 1700000000.5
# TYPE h histogram
h_bucket{le="1"} 1
h_bucket{le="+Inf"} 2
h_count 2
h_sum 3
h_created 1700000000.5
# TYPE g gauge
g 7
# TYPE i info
i_info{version="1"} 1
plain 3
# EOF
"""


def test_a_sample_belongs_to_its_own_type_else_to_the_type_of_its_name_without_the_suffix() -> None:
    types = parse_page(PAGE).types
    assert family_of("x_total", types) == Family("x", "counter", "_total")
    assert family_of("x_created", types) == Family("x", "counter", "_created")
    assert family_of("h_bucket", types) == Family("h", "histogram", "_bucket")
    assert family_of("g", types) == Family("g", "gauge", "")
    assert family_of("i_info", types) == Family("i", "info", "_info")
    assert family_of("plain", types) == Family("plain", "untyped", "")
    assert family_of("g_total", types) == Family("g", "gauge", "_total")
    assert family_type(types, "x_created") == "counter"


def test_otlp_sends_no_created_sample_and_names_each_metric_as_written() -> None:
    encoded = EndpointEncoder({"service.name": "t"}).encode(parse_page(PAGE), ContextCache().get("r", "none"), 10**18)
    request = ExportMetricsServiceRequest.FromString(request_bytes([encoded.chunk]))
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    assert sorted(metrics) == ["g", "h", "i_info", "plain", "x_total"]
    assert metrics["x_total"].sum.is_monotonic and metrics["x_total"].description == "Requests."


def test_the_pull_page_sends_no_created_sample_and_types_a_counter_by_its_sample_name() -> None:
    text = render_exposition([LatestPage("a:9400", parse_page(PAGE), "r", "none")], BridgeHealth()).decode()
    assert "_created" not in text
    assert "# HELP x_total Requests.\n# TYPE x_total counter\nx_total{" in text
    assert '# TYPE h histogram\nh_bucket{le="1",' in text
    assert "# TYPE g gauge\ng{" in text and "# TYPE plain untyped\nplain{" in text
