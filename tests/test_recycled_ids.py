"""CPython gives a freed object's address (its id()) to the next object of its size at once. A cache keyed by id()
would hand that new object the freed one's entry: each cache that once was, or still is, keyed by identity is
checked here with a new object built at a freed one's address (`at_freed_address`), its content different."""

from __future__ import annotations

import gc
from collections.abc import Callable
from types import MappingProxyType
from typing import TypeVar

import numpy as np

from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.otlp.encode import EndpointEncoder
from bridge.report.refresh import series_cadence
from bridge.samples import ParsedPage, Sample
from tests.otlp.test_encode import RESOURCE, attrs, ctx, decode, metrics_of, points

T = TypeVar("T")
S = 1_000_000_000
POWER = "DCGM_FI_DEV_POWER_USAGE"


def at_freed_address(old_id: int, make: Callable[[int], T]) -> T:
    """`make(k)` for k = 1, 2, … until one lands where the object of id `old_id` was (that object must be gone)."""
    gc.collect()
    held = []
    for k in range(1, 1000):
        new = make(k)
        if id(new) == old_id:
            return new
        held.append(new)  # (kept, so the next one takes another address)
    raise AssertionError("no new object at the freed address: is the old one still held somewhere?")


def labels(k: int) -> MappingProxyType[str, str]:
    return MappingProxyType({"gpu": "0", "UUID": f"GPU-{k:08x}-0000-4000-8000-000000000000", "Hostname": "n"})


def page(*label_sets: MappingProxyType[str, str]) -> ParsedPage:
    return ParsedPage([Sample(POWER, lab, 300.0) for lab in label_sets], {POWER: "gauge"}, {}, [])


def test_the_normaliser_gives_a_label_set_at_a_freed_ones_address_its_own_gpu() -> None:
    normalizer = Normalizer(default_table())
    old = labels(0)
    (first,) = normalizer.records(page(old), source_url="http://n:9400/metrics", timestamp_ns=S)
    old_id = id(old)
    del old
    new = at_freed_address(old_id, labels)
    (second,) = normalizer.records(page(new), source_url="http://n:9400/metrics", timestamp_ns=2 * S)
    assert first.gpu_uuid != second.gpu_uuid == new["UUID"]


def test_the_otlp_encoder_sends_a_label_set_at_a_freed_ones_address_with_its_own_attributes() -> None:
    """The encoder's series table is keyed by the labels' id() (per point, on the hot path) and holds each entry's
    labels: only once a series is evicted (4,096 series and more, not on the page) can its labels be freed, and
    then the new mapping at their address is a new series with its own attributes."""
    encoder = EndpointEncoder(RESOURCE)
    crowd = [labels(k) for k in range(5000, 9200)]
    old = labels(0)
    encoder.encode(page(old, *crowd), ctx(), S)
    encoder.encode(page(crowd[0]), ctx(), 2 * S)  # the rest are not on this page: evicted
    old_id = id(old)
    del old  # (the crowd stays alive here: only this mapping's address is free)
    new = at_freed_address(old_id, labels)
    encoded = encoder.encode(page(new), ctx(), 3 * S)
    sent = [p for p in points(metrics_of(decode(encoded.chunk))[POWER]) if not p.flags]  # (not staleness markers)
    assert [attrs(p)["UUID"] for p in sent] == [new["UUID"]]


def test_a_new_timestamp_array_at_a_freed_ones_address_gets_its_own_cadence() -> None:
    def one_hz(k: int) -> np.ndarray:
        return np.arange(60, dtype=np.int64) * S + k

    def power(ts: np.ndarray) -> dict[str, np.ndarray]:
        return {"nvidia_power_usage": 300.0 + (ts // S % 7).astype(np.float64)}

    old = np.arange(60, dtype=np.int64) * (5 * S)  # a 5 s refresh
    slow = series_cadence(old, power(old))
    old_id = id(old)
    del old
    new = at_freed_address(old_id, one_hz)
    assert series_cadence(new, power(new)) != slow
