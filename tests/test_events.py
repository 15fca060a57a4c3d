"""The events file's schema (bridge/events.py): each kind encodes to the line the file has always held
and decodes back to the same record; what an older or damaged file holds is refused, never fatal."""

from __future__ import annotations

import orjson
import pytest

from bridge.events import (
    Complete,
    Configured,
    EndpointState,
    Event,
    GpuShared,
    PodsResolved,
    ResolvedPod,
    event_from_dict,
    event_to_line,
)
from bridge.samples import PhaseMark, ScrapeFailure

LINES: list[tuple[Event, bytes]] = [
    (Configured(1, "r1", ("http://a:9400/metrics",), (), "interpolated", 666_000_000),
     b'{"type":"configured","time_ns":1,"run_id":"r1","endpoints_configured":["http://a:9400/metrics"],'
     b'"endpoints_successful":[],"counter_mode":"interpolated","grace_ns":666000000}\n'),
    (PhaseMark("p", "profiling", "start", 2),
     b'{"type":"phase","name":"p","kind":"profiling","event":"start","time_ns":2}\n'),
    (ScrapeFailure("http://a:9400/metrics", 3, "timeout", "slow"),
     b'{"type":"scrape_error","endpoint":"http://a:9400/metrics","time_ns":3,"kind":"timeout","message":"slow"}\n'),
    (EndpointState("http://a:9400/metrics", 4, "down", "refused"),
     b'{"type":"endpoint_state","endpoint":"http://a:9400/metrics","time_ns":4,"state":"down","reason":"refused"}\n'),
    (GpuShared("http://a:9400/metrics", 7, "GPU-a", None, ("bench/llm-0", "other/job-0")),
     b'{"type":"gpu_shared","endpoint":"http://a:9400/metrics","time_ns":7,"gpu_uuid":"GPU-a","gpu_instance_id":null,'
     b'"pods":["bench/llm-0","other/job-0"]}\n'),
    (PodsResolved(6, ("bench/app=llama",), (ResolvedPod("bench", "llama-0", "gpu-node-a", {"app": "llama"}),)),
     b'{"type":"pods","time_ns":6,"selectors":["bench/app=llama"],"pods":[{"namespace":"bench","name":"llama-0",'
     b'"node":"gpu-node-a","labels":{"app":"llama"}}]}\n'),
    (Complete(5, None, True, ({"url": "http://a:9400/metrics", "scrapes": 3},), None, {"lines_written": 8}),
     b'{"type":"complete","time_ns":5,"requests_end_ns":null,"collection_complete":true,'
     b'"endpoints":[{"url":"http://a:9400/metrics","scrapes":3}],"otlp":null,"record_log":{"lines_written":8}}\n'),
]


@pytest.mark.parametrize(("event", "line"), LINES)
def test_every_event_kind_is_the_line_the_events_file_has_always_held(event: Event, line: bytes) -> None:
    assert event_to_line(event) == line
    assert event_from_dict(orjson.loads(line)) == event


def test_a_configured_event_of_an_older_version_takes_the_defaults() -> None:
    old = {"type": "configured", "time_ns": 1, "endpoints_configured": ["u"], "endpoints_successful": ["u"]}
    assert event_from_dict(old) == Configured(1, None, ("u",), ("u",), None)
    assert event_from_dict({**old, "counter_mode": "linear"}) == Configured(1, None, ("u",), ("u",), None)
    for grace in (-1, "666000000", 1.5, True, 60_000_000_001):  # not a grace `report --grace-ns` takes: the default
        assert event_from_dict({**old, "grace_ns": grace}) == Configured(1, None, ("u",), ("u",), None)


@pytest.mark.parametrize("obj", [
    {"type": "phase", "name": "p", "kind": "benchmark", "event": "start", "time_ns": 1},
    {"type": "phase", "name": "p", "kind": "warmup", "event": "pause", "time_ns": 1},
    {"type": "phase", "name": "p", "kind": "warmup", "event": "start"},
    {"type": "scrape_error", "endpoint": "u", "time_ns": "soon", "kind": "timeout"},
    {"type": "scrape_error", "endpoint": "u", "time_ns": 1, "kind": "mystery"},
    {"type": "endpoint_state", "endpoint": "u", "time_ns": 1, "state": "sideways"},
    {"type": "configured", "time_ns": 1, "endpoints_configured": 7},
    {"type": "complete"},
    {"type": "pods", "time_ns": 1, "pods": [{"namespace": "bench", "name": "llama-0", "labels": {"app": 7}}]},
    {"type": "pods", "time_ns": 1, "pods": [{"namespace": "bench", "name": ["llama-0"], "labels": {}}]},
    {"type": "pods", "time_ns": 1, "pods": [{"namespace": "bench", "labels": {}}]},
    {"type": "pods", "time_ns": 1, "pods": ["bench/llama-0"]},
    {"type": "checkpoint", "time_ns": 1},
    {},
])
def test_an_unknown_or_malformed_event_is_refused_with_a_value_error(obj: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        event_from_dict(obj)
