"""The wire-format encoder, checked by decoding its bytes with opentelemetry-proto."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from bridge import __version__
from bridge.fields import is_blank_label, is_blank_value
from bridge.otlp.encode import ContextCache, EncodedPage, EndpointEncoder, PointContext
from bridge.otlp.wire import request_bytes
from bridge.parse import PageParser, parse_page
from bridge.relabel import parse_config
from bridge.samples import ParsedPage, Sample
from tests.conftest import REAL_PAGES
from tests.otlp.pages import COUNTERS, dcgm_page

RESOURCE = {"service.name": "dcgm-exporter", "service.instance.id": "node:9400"}
NO_VALUE = pb.DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
S = 1_000_000_000


def decode(*chunks: bytes) -> ExportMetricsServiceRequest:
    return ExportMetricsServiceRequest.FromString(request_bytes(chunks))


def metrics_of(request: ExportMetricsServiceRequest) -> dict[str, pb.Metric]:
    (rm,) = request.resource_metrics
    (sm,) = rm.scope_metrics
    return {m.name: m for m in sm.metrics}


def attrs(point: pb.NumberDataPoint) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


def points(metric: pb.Metric) -> list[pb.NumberDataPoint]:
    return list(metric.sum.data_points if metric.HasField("sum") else metric.gauge.data_points)


_CONTEXTS = ContextCache()


def ctx(phase: str = "profiling", run_id: str = "run-1") -> PointContext:
    return _CONTEXTS.get(run_id, phase)


@pytest.mark.parametrize("path", REAL_PAGES, ids=lambda p: p.stem)
def test_every_sample_of_a_real_page_arrives_with_its_name_value_time_and_labels(path):
    page = parse_page(path.read_bytes())
    encoded = EndpointEncoder(RESOURCE).encode(page, ctx(), 7 * S)
    got = {
        (m.name, tuple(sorted(attrs(p).items()))): p
        for m in metrics_of(decode(encoded.chunk)).values()
        for p in points(m)
    }
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sample in page.samples:
        if not is_blank_value(sample.value):
            labels = {k: v for k, v in sample.labels.items() if not is_blank_label(v)}
            key = (sample.name, tuple(sorted({**labels, "run_id": "run-1", "phase": "profiling"}.items())))
            expected.setdefault(key, sample.value)  # `pod=""` and no pod label are one series: first wins
    assert encoded.points == len(expected) == len(got)
    assert encoded.blank == sum(is_blank_value(s.value) for s in page.samples)
    for key, value in expected.items():
        assert got[key].as_double == value
        assert got[key].time_unix_nano == 7 * S


def test_a_small_page_encodes_exactly_to_the_golden_message():
    page = parse_page(
        '# HELP G gauge help\n# TYPE G gauge\nG{gpu="0",pod=""} 1.5\n# TYPE C counter\nC{gpu="0"} 10\nU 3\n'
    )
    encoded = EndpointEncoder(RESOURCE).encode(page, PointContext("r", "warmup", (("team", "a"),)), 5 * S)

    def kv(key: str, value: str) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(string_value=value))

    ours = [kv("run_id", "r"), kv("phase", "warmup"), kv("team", "a")]
    golden = ExportMetricsServiceRequest(
        resource_metrics=[
            pb.ResourceMetrics(
                resource=Resource(attributes=[kv(k, v) for k, v in RESOURCE.items()]),
                scope_metrics=[
                    pb.ScopeMetrics(
                        scope=InstrumentationScope(name="dcgm-bridge", version=__version__),
                        metrics=[
                            pb.Metric(
                                name="G",
                                description="gauge help",
                                gauge=pb.Gauge(
                                    data_points=[
                                        pb.NumberDataPoint(
                                            attributes=[kv("gpu", "0"), *ours],
                                            time_unix_nano=5 * S,
                                            as_double=1.5,
                                        )
                                    ]
                                ),
                            ),
                            pb.Metric(
                                name="C",
                                sum=pb.Sum(
                                    data_points=[
                                        pb.NumberDataPoint(
                                            attributes=[kv("gpu", "0"), *ours],
                                            start_time_unix_nano=5 * S,
                                            time_unix_nano=5 * S,
                                            as_double=10.0,
                                        )
                                    ],
                                    aggregation_temporality=pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE,
                                    is_monotonic=True,
                                ),
                            ),
                            pb.Metric(
                                name="U",
                                metadata=[kv("prometheus.type", "unknown")],
                                gauge=pb.Gauge(
                                    data_points=[
                                        pb.NumberDataPoint(
                                            attributes=ours, time_unix_nano=5 * S, as_double=3.0
                                        )
                                    ]
                                ),
                            ),
                        ],
                    )
                ],
            )
        ]
    )
    # Equal as messages; not byte-identical: attributes (field 7) are written before time and value.
    assert decode(encoded.chunk) == golden


def test_gauges_untyped_and_codes_are_gauges_and_counters_are_cumulative_monotonic_sums():
    page = parse_page(
        dcgm_page(gpus=1)
        + (
            "# TYPE DCGM_EXP_XID_ERRORS_COUNT counter\n"
            'DCGM_EXP_XID_ERRORS_COUNT{gpu="0",window_size_in_ms="300000",xid="42"} 1\n'
            "# TYPE DCGM_EXP_CLOCK_EVENTS_COUNT counter\n"
            'DCGM_EXP_CLOCK_EVENTS_COUNT{gpu="0",window_size_in_ms="300000",clock_event="x"} 2\n'
            'untyped_thing{gpu="0"} 4\n'
        )
    )
    metrics = metrics_of(decode(EndpointEncoder(RESOURCE).encode(page, ctx(), S).chunk))
    for name, metric in metrics.items():
        if name in COUNTERS:
            assert metric.WhichOneof("data") == "sum", name
            assert metric.sum.is_monotonic
            assert metric.sum.aggregation_temporality == pb.AGGREGATION_TEMPORALITY_CUMULATIVE
        else:
            assert metric.WhichOneof("data") == "gauge", name
    assert {m.key for m in metrics["untyped_thing"].metadata} == {"prometheus.type"}
    assert not metrics["DCGM_FI_DEV_GPU_UTIL"].metadata


def test_names_and_label_names_are_forwarded_exactly_as_written_in_any_dialect():
    page = parse_page(
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",uuid="GPU-1",Hostname="h"} 1\n'
        'dcgm_fi_dev_gpu_util{gpu="0",UUID="GPU-1",hostname="h",modelName="NVIDIA H100"} 2\n'
    )
    metrics = metrics_of(decode(EndpointEncoder(RESOURCE).encode(page, ctx(), S).chunk))
    assert set(metrics) == {"DCGM_FI_DEV_GPU_UTIL", "dcgm_fi_dev_gpu_util"}
    assert set(attrs(metrics["dcgm_fi_dev_gpu_util"].gauge.data_points[0])) == {
        "gpu",
        "UUID",
        "hostname",
        "modelName",
        "run_id",
        "phase",
    }
    assert metrics["DCGM_FI_DEV_GPU_UTIL"].unit == ""


def test_a_counter_keeps_its_start_time_across_a_phase_boundary():
    parser, encoder, contexts = PageParser(), EndpointEncoder(RESOURCE), ContextCache()
    starts = []
    for step, phase in enumerate(["warmup", "warmup", "profiling", "profiling"]):
        page = parser.parse(dcgm_page(gpus=2, step=step))
        metric = metrics_of(decode(encoder.encode(page, contexts.get("r", phase), (10 + step) * S).chunk))
        (point,) = [
            p
            for p in metric["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].sum.data_points
            if attrs(p)["gpu"] == "0" and not p.flags
        ]
        starts.append(point.start_time_unix_nano)
        assert attrs(point)["phase"] == phase
    assert starts == [10 * S] * 4


def test_a_counter_that_goes_down_starts_again_just_after_its_previous_point():
    parser, encoder = PageParser(), EndpointEncoder(RESOURCE)
    values = [100, 200, 5, 50, 60]
    starts = []
    for step, value in enumerate(values):
        page = parser.parse(f'# TYPE E counter\nE{{gpu="0"}} {value}\n')
        (point,) = metrics_of(decode(encoder.encode(page, ctx(), (step + 1) * S).chunk))["E"].sum.data_points
        starts.append(point.start_time_unix_nano)
    assert starts == [1 * S, 1 * S, 2 * S + 1, 2 * S + 1, 2 * S + 1]


def test_at_a_phase_boundary_the_old_phase_series_gets_one_staleness_marker():
    parser, encoder = PageParser(), EndpointEncoder(RESOURCE)
    encoder.encode(parser.parse('# TYPE E counter\nE{gpu="0"} 1\nG{gpu="0"} 1\n'), ctx("warmup"), S)
    encoded = encoder.encode(
        parser.parse('# TYPE E counter\nE{gpu="0"} 2\nG{gpu="0"} 2\n'), ctx("profiling"), 2 * S
    )
    assert (encoded.points, encoded.stale) == (4, 2)
    for metric in metrics_of(decode(encoded.chunk)).values():
        marker, point = points(metric)
        assert (attrs(marker)["phase"], marker.flags, marker.time_unix_nano) == ("warmup", NO_VALUE, 2 * S)
        assert (attrs(point)["phase"], point.flags, point.as_double) == ("profiling", 0, 2.0)
    assert (
        encoder.encode(parser.parse('# TYPE E counter\nE{gpu="0"} 3\n'), ctx("profiling"), 3 * S).stale == 1
    )


def test_a_vanished_series_is_marked_stale_under_the_phase_of_its_last_point():
    parser, encoder = PageParser(), EndpointEncoder(RESOURCE)
    encoder.encode(parser.parse('G{gpu="0"} 1\n'), ctx("warmup"), S)
    encoded = encoder.encode(ParsedPage([], {}, {}, []), ctx("cooldown"), 2 * S)
    (marker,) = points(metrics_of(decode(encoded.chunk))["G"])
    assert attrs(marker)["phase"] == "warmup" and marker.flags == NO_VALUE



def test_a_staleness_marker_never_shares_the_millisecond_of_its_series_last_point():
    """A store keeps one sample per series and millisecond, the later one: a run completed within a millisecond
    of its final scrape would have had that scrape's points replaced by the markers (seen in VictoriaMetrics)."""
    parser, encoder, empty = PageParser(), EndpointEncoder(RESOURCE), ParsedPage([], {}, {}, [])
    last = 1_796_344_322_835_400_000
    encoder.encode(parser.parse('G{gpu="0"} 1\n'), ctx(), last)
    (marker,) = points(metrics_of(decode(encoder.encode(empty, ctx(), last + 300_000).chunk))["G"])
    assert marker.flags == NO_VALUE and marker.time_unix_nano == 1_796_344_322_836_000_000
    encoder.encode(parser.parse('G{gpu="0"} 2\n'), ctx(), last + 5_000_000)  # later: the marker at its own time
    (marker,) = points(metrics_of(decode(encoder.encode(empty, ctx(), last + 9_000_000).chunk))["G"])
    assert marker.time_unix_nano == last + 9_000_000


def test_a_sample_time_past_what_otlp_nanoseconds_hold_is_not_sent_and_the_rest_of_the_page_is():
    """The text format allows any int64 millisecond timestamp; OTLP's time is a uint64 of nanoseconds (to 2554).
    A sample past it (a flipped byte in a value can make one: `9\r2337...` reads as value 9 and a timestamp) is
    counted and not sent, gauge or histogram; the page's other points go out."""
    far = 2**64 // 1_000_000 + 1  # ms
    page = parse_page(f'G{{gpu="0"}} 1 {far}\nG{{gpu="1"}} 2\n# TYPE h histogram\n'
                      f'h_bucket{{le="+Inf"}} 3 {far}\nh_count 3 {far}\nh_sum 4 {far}\n')
    encoded = EndpointEncoder(RESOURCE).encode(page, ctx(), 10 * S)
    metrics = metrics_of(decode(encoded.chunk))
    assert [attrs(p)["gpu"] for p in points(metrics["G"])] == ["1"] and "h" not in metrics
    assert encoded.out_of_order == 1


def test_start_time_unset_mode_leaves_the_start_empty():
    encoder = EndpointEncoder(RESOURCE, start_time="unset")
    page = parse_page('# TYPE E counter\nE{gpu="0"} 1\n')
    (point,) = metrics_of(decode(encoder.encode(page, ctx(), S).chunk))["E"].sum.data_points
    assert point.start_time_unix_nano == 0


def test_a_vanished_series_gets_one_no_recorded_value_marker_and_then_nothing():
    parser, encoder = PageParser(), EndpointEncoder(RESOURCE)
    full = dcgm_page(gpus=2, families=6)
    encoder.encode(parser.parse(full), ctx(), 1 * S)
    gone = parser.parse(
        dcgm_page(gpus=2, families=6, missing=frozenset({("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1)}))
    )
    first = encoder.encode(gone, ctx(), 2 * S)
    assert first.stale == 1
    energy = metrics_of(decode(first.chunk))["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    marker = [p for p in energy.sum.data_points if p.flags & NO_VALUE]
    assert len(marker) == 1 and attrs(marker[0])["gpu"] == "1"
    assert marker[0].time_unix_nano == 2 * S and marker[0].start_time_unix_nano == 1 * S
    assert not marker[0].HasField("as_double")
    assert encoder.encode(gone, ctx(), 3 * S).stale == 0
    back = encoder.encode(parser.parse(full), ctx(), 4 * S)
    assert back.stale == 0 and back.points == 12
    assert encoder.encode(gone, ctx(), 5 * S).stale == 1


def test_a_whole_family_that_vanishes_is_marked_stale_under_its_own_type_and_help():
    parser, encoder = PageParser(), EndpointEncoder(RESOURCE)
    encoder.encode(parser.parse(dcgm_page(gpus=1, families=7)), ctx(), S)
    encoded = encoder.encode(parser.parse(dcgm_page(gpus=1, families=5)), ctx(), 2 * S)
    metrics = metrics_of(decode(encoded.chunk))
    replay = metrics["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]
    assert replay.WhichOneof("data") == "sum" and replay.description == "Total number of PCIe retries."
    assert all(p.flags & NO_VALUE for p in replay.sum.data_points)
    assert encoded.stale == 2


def test_an_endpoint_that_returns_nothing_marks_every_series_stale_once():
    encoder = EndpointEncoder(RESOURCE)
    parser = PageParser()
    encoder.encode(parser.parse(dcgm_page(gpus=2, families=3)), ctx(), S)
    empty = ParsedPage([], {}, {}, [])
    assert encoder.encode(empty, ctx(), 2 * S).stale == 6
    assert encoder.encode(empty, ctx(), 3 * S) == EncodedPage(b"", 0, 0, 0, 0, 0)


def test_sentinel_values_are_not_sent_and_empty_or_sentinel_labels_are_dropped():
    page = parse_page(
        'A{gpu="0",pod="",GPU_I_PROFILE="<<<NULL>>>"} 9223372036854775794\n'
        'B{gpu="0",pod="",GPU_I_PROFILE="<<<NULL>>>"} 1\n'
    )
    encoded = EndpointEncoder(RESOURCE).encode(page, ctx(), S)
    metrics = metrics_of(decode(encoded.chunk))
    assert set(metrics) == {"B"} and encoded.blank == 1
    assert attrs(metrics["B"].gauge.data_points[0]) == {"gpu": "0", "run_id": "run-1", "phase": "profiling"}


def test_an_exporter_label_that_clashes_with_ours_is_kept_as_exported():
    page = parse_page('A{gpu="0",phase="prefill",run_id="x"} 1\n')
    point = metrics_of(decode(EndpointEncoder(RESOURCE).encode(page, ctx(), S).chunk))["A"].gauge.data_points[
        0
    ]
    assert attrs(point) == {
        "gpu": "0",
        "exported_phase": "prefill",
        "exported_run_id": "x",
        "run_id": "run-1",
        "phase": "profiling",
    }


def test_two_label_sets_that_differ_only_by_empty_labels_are_one_series():
    parser, encoder = PageParser(), EndpointEncoder(RESOURCE)
    page = parser.parse('A{gpu="0"} 1\nA{gpu="0",pod=""} 2\n')
    encoded = encoder.encode(page, ctx(), S)
    assert (encoded.points, encoded.out_of_order) == (1, 1)
    later = encoder.encode(parser.parse('A{gpu="0",pod=""} 3\n'), ctx(), 2 * S)
    assert (later.points, later.stale) == (1, 0)


def test_points_not_newer_than_the_series_last_point_are_not_sent():
    parser, encoder = PageParser(), EndpointEncoder(RESOURCE)
    page = parser.parse('A{gpu="0"} 1\nB{gpu="0"} 2 1000\n')
    assert encoder.encode(page, ctx(), 5 * S).points == 2
    again = encoder.encode(page, ctx(), 6 * S)  # B carries its own (old) timestamp
    assert (again.points, again.out_of_order) == (1, 1)
    assert encoder.encode(page, ctx(), 6 * S).out_of_order == 2
    duplicate = parser.parse('C{gpu="0"} 1\nC{gpu="0"} 2\n')
    assert encoder.encode(duplicate, ctx(), 7 * S).out_of_order == 1


def test_ucum_units_come_from_the_help_text_only_when_asked():
    page = parse_page(dcgm_page(gpus=1, families=8))
    plain = metrics_of(decode(EndpointEncoder(RESOURCE).encode(page, ctx(), S).chunk))
    assert {m.unit for m in plain.values()} == {""}
    ucum = metrics_of(decode(EndpointEncoder(RESOURCE, units="ucum").encode(page, ctx(), S).chunk))
    assert ucum["DCGM_FI_DEV_POWER_USAGE"].unit == "W"
    assert ucum["DCGM_FI_DEV_GPU_TEMP"].unit == "Cel"
    assert ucum["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].unit == "mJ"
    assert ucum["DCGM_FI_DEV_GPU_UTIL"].unit == "%"
    assert ucum["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"].unit == ""


def test_ucum_units_of_dcgm47_names_come_from_the_name():
    page = parse_page(
        "# HELP DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL Total energy consumption since boot.\n"
        "# TYPE DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL counter\n"
        'DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL{gpu="0",UUID="GPU-a"} 12.5\n'
        "# HELP DCGM_FI_DEV_SM_CLOCK_HERTZ SM frequency (in MHz).\n# TYPE DCGM_FI_DEV_SM_CLOCK_HERTZ gauge\n"
        'DCGM_FI_DEV_SM_CLOCK_HERTZ{gpu="0",UUID="GPU-a"} 1.41e9\n'
        "# HELP DCGM_FI_DEV_GPU_UTIL_RATIO GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL_RATIO gauge\n"
        'DCGM_FI_DEV_GPU_UTIL_RATIO{gpu="0",UUID="GPU-a"} 0.5\n'
        "# HELP DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND PCIe tx.\n"
        "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND gauge\n"
        'DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND{gpu="0",UUID="GPU-a"} 1e6\n')
    ucum = metrics_of(decode(EndpointEncoder(RESOURCE, units="ucum").encode(page, ctx(), S).chunk))
    assert {name: m.unit for name, m in ucum.items()} == {
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": "J", "DCGM_FI_DEV_SM_CLOCK_HERTZ": "Hz",
        "DCGM_FI_DEV_GPU_UTIL_RATIO": "1", "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND": "By/s"}


def test_relabel_rules_drop_series_remove_labels_and_can_rename():
    rules = parse_config(
        {
            "metric_relabel_configs": [
                {"source_labels": ["__name__"], "regex": "DCGM_FI_PROF_.*", "action": "drop"},
                {"action": "labeldrop", "regex": "DCGM_FI_DRIVER_VERSION|pci_bus_id"},
                {
                    "source_labels": ["__name__"],
                    "regex": "DCGM_FI_DEV_GPU_TEMP",
                    "target_label": "__name__",
                    "replacement": "gpu_temp_celsius",
                },
            ]
        }
    )
    page = parse_page(dcgm_page(gpus=2))
    encoded = EndpointEncoder(RESOURCE, relabel_config=rules).encode(page, ctx(), S)
    metrics = metrics_of(decode(encoded.chunk))
    assert not [n for n in metrics if n.startswith("DCGM_FI_PROF_")]
    assert encoded.dropped == 2 * 12
    assert "gpu_temp_celsius" in metrics and "DCGM_FI_DEV_GPU_TEMP" not in metrics
    for metric in metrics.values():
        for point in points(metric):
            assert "DCGM_FI_DRIVER_VERSION" not in attrs(point) and "pci_bus_id" not in attrs(point)


def test_histograms_and_summaries_follow_the_spec_mapping():
    page = parse_page(
        "# TYPE h histogram\n"
        'h_bucket{gpu="0",le="0.1"} 1\nh_bucket{gpu="0",le="1"} 3\nh_bucket{gpu="0",le="+Inf"} 4\n'
        'h_sum{gpu="0"} 2.5\nh_count{gpu="0"} 4\n'
        "# TYPE s summary\n"
        's{gpu="0",quantile="0.5"} 0.2\ns{gpu="0",quantile="0.9"} 0.7\n'
        's_sum{gpu="0"} 9\ns_count{gpu="0"} 20\n'
        '# TYPE nocount histogram\nnocount_bucket{le="+Inf"} 1\n'
    )
    metrics = metrics_of(decode(EndpointEncoder(RESOURCE).encode(page, ctx(), S).chunk))
    assert set(metrics) == {"h", "s"}
    (hp,) = metrics["h"].histogram.data_points
    assert list(hp.explicit_bounds) == [0.1, 1.0] and list(hp.bucket_counts) == [1, 2, 1]
    assert (hp.count, hp.sum, hp.start_time_unix_nano) == (4, 2.5, S)
    assert {kv.key for kv in hp.attributes} == {"gpu", "run_id", "phase"}
    assert metrics["h"].histogram.aggregation_temporality == pb.AGGREGATION_TEMPORALITY_CUMULATIVE
    (sp,) = metrics["s"].summary.data_points
    assert (sp.count, sp.sum) == (20, 9.0)
    assert [(q.quantile, q.value) for q in sp.quantile_values] == [(0.5, 0.2), (0.9, 0.7)]


def test_pages_of_several_endpoints_concatenate_into_one_request_with_one_resource_each():
    parser_a, parser_b = PageParser(), PageParser()
    a = EndpointEncoder({**RESOURCE, "service.instance.id": "a:9400"}).encode(
        parser_a.parse(dcgm_page(gpus=1)), ctx(), S
    )
    b = EndpointEncoder({**RESOURCE, "service.instance.id": "b:9400"}).encode(
        parser_b.parse(dcgm_page(gpus=2)), ctx(), S
    )
    request = decode(a.chunk, b.chunk)
    ids = [
        {kv.key: kv.value.string_value for kv in rm.resource.attributes}["service.instance.id"]
        for rm in request.resource_metrics
    ]
    assert ids == ["a:9400", "b:9400"]
    assert sum(len(points(m)) for rm in request.resource_metrics for m in rm.scope_metrics[0].metrics) == 120


label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True).filter(
    lambda k: k not in ("run_id", "phase")
)
label_values = st.text(min_size=1, max_size=40).filter(lambda v: not is_blank_label(v))


@settings(max_examples=60, deadline=None)
@given(
    series=st.lists(
        st.tuples(
            st.sampled_from(["A", "b_total", "DCGM_FI_DEV_X"]),
            st.dictionaries(label_names, label_values, max_size=12),
        ),
        min_size=1,
        max_size=20,
        unique_by=lambda s: (s[0], tuple(sorted(s[1].items()))),
    ),
    value=st.floats(allow_nan=False).filter(lambda v: not is_blank_value(v)),
    ts=st.integers(min_value=1, max_value=2**63 - 1),
)
@pytest.mark.slow
def test_any_labels_and_values_decode_back_to_what_was_given(series, value, ts):
    samples = [Sample(name, labels, value) for name, labels in series]
    encoded = EndpointEncoder(RESOURCE).encode(ParsedPage(samples, {}, {}, []), ctx(), ts)
    got = sorted(
        (m.name, tuple(sorted(attrs(p).items())), p.as_double, p.time_unix_nano)
        for m in metrics_of(decode(encoded.chunk)).values()
        for p in points(m)
    )
    want = sorted(
        (name, tuple(sorted({**labels, "run_id": "run-1", "phase": "profiling"}.items())), value, ts)
        for name, labels in series
    )
    assert got == want


def test_nan_is_sent_as_a_double_and_not_as_staleness():
    page = parse_page("A 1\n".replace("1", "NaN"))
    (point,) = metrics_of(decode(EndpointEncoder(RESOURCE).encode(page, ctx(), S).chunk))[
        "A"
    ].gauge.data_points
    assert math.isnan(point.as_double) and point.flags == 0


def test_label_bytes_are_built_once_per_label_mapping_not_per_family(monkeypatch):
    import bridge.otlp.encode as encode

    context = ctx()
    calls: list[object] = []
    real = encode.attributes

    def counting(tag, items):
        calls.append(tag)
        return real(tag, items)

    monkeypatch.setattr(encode, "attributes", counting)
    parser, encoder = PageParser(), EndpointEncoder(RESOURCE)
    for step in range(3):
        encoder.encode(parser.parse(dcgm_page(gpus=8, step=step)), context, (step + 1) * S)
    assert (
        calls.count(0x3A) == 8
    )  # NumberDataPoint.attributes; 320 series, 8 distinct label mappings (one per GPU), 3 pages


@pytest.mark.parametrize("plans", [True, False], ids=["plans", "loop"])
def test_a_family_whose_type_line_goes_away_is_encoded_as_its_new_kind(plans: bool) -> None:
    """A page that drops a family's `# TYPE … counter` line makes it a gauge: each point's length prefix is that
    of a gauge point from then on (a prefix kept from the Sum gave a malformed request), plans or not."""
    typed = b'# TYPE x_total counter\nx_total{gpu="0"} 1\n# TYPE g gauge\ng{gpu="0"} 5\n'
    untyped = b'x_total{gpu="0"} 2\n# TYPE g gauge\ng{gpu="0"} 6\n'
    encoder, parser, ctx = EndpointEncoder({"service.name": "t"}), PageParser(), ContextCache().get("r", "p")
    encoder.use_plans = plans
    for k, body in enumerate([typed, typed, typed, untyped, untyped, typed]):
        chunk = encoder.encode(parser.parse(body), ctx, 1_800_000_000 * S + k * S).chunk
        metrics = metrics_of(decode(chunk))
        x = metrics["x_total"]
        points = x.sum.data_points if x.HasField("sum") else x.gauge.data_points
        assert x.HasField("sum") == (body is typed), k
        assert [p.as_double for p in points] == [1.0 if body is typed else 2.0], k
        assert [p.as_double for p in metrics["g"].gauge.data_points] == [5.0 if body is typed else 6.0]
