"""Fetching a run's raw samples from a PromQL store (fake client here; VictoriaMetrics in test_realstack)."""

from __future__ import annotations

from typing import Any

from bridge.report.promql import fetch_run_samples, run_selector


class FakeStore:
    """Answers `{run_id=...}[Nms]` at time t with the stored points in (t - N, t], like the real stores."""

    def __init__(self, series: list[tuple[dict[str, str], list[tuple[int, float]]]]) -> None:
        self.series = series
        self.queries: list[tuple[str, float]] = []

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        at_ms = round(float((params or {})["time"]) * 1000)
        range_ms = int(query.rsplit("[", 1)[1].rstrip("ms]"))
        self.queries.append((query, at_ms))
        out = []
        for metric, points in self.series:
            values = [[ts / 1000, repr(v)] for ts, v in points if at_ms - range_ms < ts <= at_ms]
            if values:
                out.append({"metric": metric, "values": values})
        return out


LABELS = {
    "gpu": "0",
    "UUID": "GPU-1",
    "run_id": "r1",
    "phase": "profiling",
    "service.instance.id": "node:9400",
}
STORE = FakeStore(
    [
        ({"__name__": "DCGM_FI_DEV_GPU_UTIL", **LABELS}, [(1000, 10.0), (2000, 20.0), (3000, 30.0)]),
        (
            {"__name__": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total", **LABELS},
            [(1000, 5.0), (2000, float("nan")), (3000, 7.0)],
        ),
        (
            {"__name__": "DCGM_FI_DEV_GPU_UTIL", **LABELS, "gpu": "1", "service.instance.id": "other:9400"},
            [(2000, 1.0)],
        ),
    ]
)


def test_samples_come_back_grouped_per_endpoint_and_scrape_time_in_time_order():
    groups = fetch_run_samples(STORE, "r1", 1_000_000_000, 3_000_000_000)
    assert [(g.endpoint, g.timestamp_ns, len(g.samples)) for g in groups] == [
        ("node:9400", 1_000_000_000, 2),
        ("node:9400", 2_000_000_000, 1),
        ("other:9400", 2_000_000_000, 1),
        ("node:9400", 3_000_000_000, 2),
    ]
    sample = groups[0].samples[0]
    assert (sample.name, sample.value, sample.timestamp_ms) == ("DCGM_FI_DEV_GPU_UTIL", 10.0, 1000)
    assert "__name__" not in sample.labels and sample.labels["phase"] == "profiling"


def test_a_long_run_is_fetched_in_windows_without_losing_or_repeating_boundary_points():
    whole = fetch_run_samples(STORE, "r1", 1_000_000_000, 3_000_000_000)
    windowed = fetch_run_samples(STORE, "r1", 1_000_000_000, 3_000_000_000, chunk_s=1.0)
    assert windowed == whole
    assert len(STORE.queries) > 2


def test_the_counter_suffix_of_a_prometheus_receiver_can_be_stripped_and_the_range_is_inclusive():
    groups = fetch_run_samples(STORE, "r1", 3_000_000_000, 3_000_000_000, strip_suffix="_total")
    assert sorted(s.name for s in groups[0].samples) == [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    ]


def test_the_run_id_is_quoted_safely_in_promql():
    assert run_selector('a"b\\c', 'phase="x"') == '{run_id="a\\"b\\\\c",phase="x"}'
