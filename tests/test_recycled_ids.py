"""CPython gives a freed object's address (its id()) to the next object of its size. A cache keyed by id() would
hand that new object the freed one's entry: each cache that once was, or still is, keyed by identity is checked
here with a new object whose id() is the old one's. The collision is forced (the module's `id` made to give one
number for every object), not waited for from the allocator, so the check is the same on every run.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest

import bridge.normalize
import bridge.otlp.encode
import bridge.otlp.starttime
import bridge.report.refresh
from bridge.fields import default_table
from bridge.normalize import Normalizer
from bridge.otlp.encode import EndpointEncoder
from bridge.report.refresh import series_cadence
from bridge.samples import ParsedPage, Sample
from tests.otlp.test_encode import RESOURCE, attrs, ctx, decode, metrics_of, points

S = 1_000_000_000
POWER = "DCGM_FI_DEV_POWER_USAGE"


@pytest.fixture
def one_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every object has the same id() in the modules that key caches (a freed object's address, always reused)."""
    for module in (bridge.normalize, bridge.otlp.encode, bridge.otlp.starttime, bridge.report.refresh):
        monkeypatch.setattr(module, "id", lambda _obj: 42, raising=False)


def labels(k: int) -> MappingProxyType[str, str]:
    return MappingProxyType({"gpu": "0", "UUID": f"GPU-{k:08x}-0000-4000-8000-000000000000", "Hostname": "n"})


def page(*label_sets: MappingProxyType[str, str]) -> ParsedPage:
    return ParsedPage([Sample(POWER, lab, 300.0) for lab in label_sets], {POWER: "gauge"}, {}, [])


@pytest.mark.usefixtures("one_id")
def test_the_normaliser_gives_a_label_set_at_a_freed_ones_address_its_own_gpu() -> None:
    normalizer = Normalizer(default_table())
    old = labels(0)
    (first,) = normalizer.records(page(old), source_url="http://n:9400/metrics", timestamp_ns=S)
    del old
    new = labels(1)
    (second,) = normalizer.records(page(new), source_url="http://n:9400/metrics", timestamp_ns=2 * S)
    assert first.gpu_uuid != second.gpu_uuid == new["UUID"]


@pytest.mark.usefixtures("one_id")
def test_the_otlp_encoder_sends_a_label_set_at_a_freed_ones_address_with_its_own_attributes() -> None:
    """The encoder's series table is keyed by the labels' id() (per point, on the hot path) and holds each entry's
    labels: a new mapping under an old one's id is a new series with its own attributes."""
    encoder = EndpointEncoder(RESOURCE)
    old = labels(0)
    encoder.encode(page(old), ctx(), S)
    del old
    new = labels(1)
    encoded = encoder.encode(page(new), ctx(), 3 * S)
    sent = [p for p in points(metrics_of(decode(encoded.chunk))[POWER]) if not p.flags]  # (not staleness markers)
    assert [attrs(p)["UUID"] for p in sent] == [new["UUID"]]


@pytest.mark.usefixtures("one_id")
def test_a_new_timestamp_array_at_a_freed_ones_address_gets_its_own_cadence() -> None:
    def one_hz(k: int) -> np.ndarray:
        return np.arange(60, dtype=np.int64) * S + k

    def power(ts: np.ndarray) -> dict[str, np.ndarray]:
        return {"nvidia_power_usage": 300.0 + (ts // S % 7).astype(np.float64)}

    old = np.arange(60, dtype=np.int64) * (5 * S)  # a 5 s refresh
    slow = series_cadence(old, power(old))
    del old  # (its cache entry goes with it)
    new = one_hz(1)
    assert series_cadence(new, power(new)) != slow


@pytest.mark.usefixtures("one_id")
def test_a_live_arrays_cadence_is_its_own_while_it_lives() -> None:
    """The guard's other half: while the first array lives, its entry is its own (the forced id is the same)."""
    ts = np.arange(60, dtype=np.int64) * (5 * S)
    assert series_cadence(ts, {"nvidia_power_usage": 300.0 + (ts // S % 7).astype(np.float64)}) is \
        series_cadence(ts, {"nvidia_power_usage": 300.0 + (ts // S % 7).astype(np.float64)})
