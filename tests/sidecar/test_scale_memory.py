"""What the sidecar keeps per endpoint stays the same page after page (issue 34): the refresh gauges it sends to
OTLP come with one label mapping per endpoint for the whole run, since the OTLP encoder keeps a series per
mapping it is handed (a new mapping every page was a new series every page until its eviction bound)."""

from __future__ import annotations

from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fetch import FetchedPage
from bridge.fields import default_table
from bridge.otlp import ExportStats
from bridge.sidecar.session import SELF_METRICS_EVERY_NS, Session
from bridge.simulator import ManualClock, NodeModel, SimulatorConfig, render_page

NS = 1_000_000_000
URLS = ["http://10.0.0.1:9400/metrics", "http://10.0.0.2:9400/metrics"]


class Pages:
    """A fetcher that renders each endpoint's page at the manual clock's time (a new DCGM refresh each scrape)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.models = {url: NodeModel(SimulatorConfig(gpus=1, seed=i), now_ns=clock) for i, url in enumerate(URLS)}

    def fetch(self, url: str) -> FetchedPage:
        now = self.clock()
        return FetchedPage(render_page(self.models[url], now), now, now + 1_000_000, "text/plain; version=0.0.4")

    def close(self) -> None:
        pass


class Capture:
    """The forwarder seam: keeps what the session submits for the bridge's own resource."""

    def __init__(self) -> None:
        self.own: list = []

    def submit(self, endpoint, page, *, run_id, phase, ts_ns) -> None:
        if endpoint == "dcgm-bridge":
            self.own.append(page)

    def mark_stale(self, endpoint, *, run_id, phase, ts_ns) -> None:
        pass

    def stats(self) -> ExportStats:
        return ExportStats()

    def close(self, timeout_s: float = 5.0) -> ExportStats:
        return ExportStats()


def test_the_refresh_gauges_keep_one_label_mapping_per_endpoint_for_the_run(tmp_path):
    clock = ManualClock(1_750_000_000 * NS)
    capture = Capture()
    config = Config(telemetry=TelemetryItems(urls=URLS), default_endpoints=[], artifact_dir=str(tmp_path),
                    run_id="scale")
    session = Session(config, default_table(), fetcher=Pages(clock), forwarder=capture, now_ns=clock,
                      monotonic=lambda: clock() / NS)
    session.configure()
    for _ in range(4 * SELF_METRICS_EVERY_NS // (NS // 3)):  # four refresh-gauge periods at 3 Hz
        clock.advance(NS // 3)
        for loop in session.loops.values():
            loop.scrape_now()
    session.complete()
    assert len(capture.own) >= 3
    mappings = [{sample.labels["endpoint"]: sample.labels for sample in page.samples} for page in capture.own]
    first = mappings[-1]
    assert len(first) == len(URLS)
    for later in mappings[1:]:
        assert all(later[name] is first[name] for name in later)
