"""One GPU, one count (issue 27): a session over real HTTP on loopback whose endpoints include one exporter under
two names scrapes, records and reports its GPUs once; `report` does the same offline on a log that holds both."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fields import default_table
from bridge.record_log import read_dicts
from bridge.report import build_report_from_events
from bridge.report.events import load_events
from bridge.sidecar.session import Session
from bridge.simulator import NodeModel, SimulatedExporter, SimulatorConfig
from bridge.simulator.render import PageRenderer
from tests.sidecar.helpers import scrape_synchronously


def _run(tmp_path: Path, users: list[str], defaults: list[str], counter_mode: str = "interpolated") -> Session:
    config = Config(telemetry=TelemetryItems(urls=users), default_endpoints=defaults, artifact_dir=str(tmp_path),
                    collection_interval=0.05, scrape_timeout=1.0, connect_timeout=0.5, run_id="test-run",
                    shutdown_delay=3.0, counter_mode=counter_mode)  # type: ignore[arg-type]
    session = Session(config, default_table())
    session.configure()
    scrape_synchronously(session, 3)
    session.complete()
    return session


def _gpus(session: Session) -> int:
    assert session.outputs is not None and session.outputs.report is not None
    endpoints = session.outputs.report.telemetry_data["endpoints"]
    return sum(len(e["gpus"]) for e in endpoints.values())


@pytest.mark.parametrize("counter_mode", ["interpolated", "aiperf"])
def test_a_default_and_the_explicit_address_of_one_exporter_count_eight_gpus_not_sixteen(
        tmp_path: Path, counter_mode: str) -> None:
    with SimulatedExporter(SimulatorConfig(gpus=8, seed=21)) as exporter:
        default = f"http://localhost:{exporter.port}/metrics"
        session = _run(tmp_path, [exporter.url], [default], counter_mode)
    assert session.loops[default].stats.scrapes == 0  # the default is not scraped at all
    assert [e["state"] for e in session.status()["endpoints"]] == ["stopped", "duplicate"]
    sources = {d["telemetry_source_url"] for d in read_dicts(session.records.path)}
    assert sources == {exporter.url}
    assert session.outputs is not None and session.outputs.report is not None
    report = session.outputs.report
    assert _gpus(session) == 8
    assert report.telemetry_data["summary"]["duplicate_endpoints"] == \
        [{"endpoint": f"localhost:{exporter.port}", "duplicate_of": f"127.0.0.1:{exporter.port}"}]
    states = [s for s in load_events(session.events.path).states if s.state == "duplicate"]
    assert [s.endpoint for s in states] == [default]


def test_two_given_names_of_one_exporter_count_once_and_the_first_given_wins(tmp_path: Path) -> None:
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=22)) as exporter:
        by_name = f"http://localhost:{exporter.port}/metrics"
        first = _run(tmp_path / "a", [exporter.url, by_name], [])
        second = _run(tmp_path / "b", [by_name, exporter.url], [])
    assert first.loops[by_name].retired and not first.loops[exporter.url].retired and _gpus(first) == 2
    assert second.loops[exporter.url].retired and not second.loops[by_name].retired and _gpus(second) == 2


def test_report_on_a_log_holding_both_gives_the_live_numbers(tmp_path: Path) -> None:
    """A log that holds both (a run before de-duplication, or AIPerf's): the offline report applies the same rule
    and gets the live report's numbers."""
    with SimulatedExporter(SimulatorConfig(gpus=4, seed=23)) as exporter:
        default = f"http://localhost:{exporter.port}/metrics"
        session = _run(tmp_path / "live", [exporter.url], [default])
    live = session.outputs.report if session.outputs is not None else None
    assert live is not None
    both = tmp_path / "both.jsonl"
    lines = session.records.path.read_bytes().splitlines(keepends=True)
    twins = [line.replace(exporter.url.encode(), default.encode()) for line in lines]
    both.write_bytes(b"".join(lines + twins))
    events = tmp_path / "events.jsonl"  # without the live run's `duplicate` state: the rule alone decides
    events.write_bytes(b"".join(line for line in session.events.path.read_bytes().splitlines(keepends=True)
                                if orjson.loads(line).get("state") != "duplicate"))
    offline = build_report_from_events(both, events)
    assert offline.energy == live.energy
    assert [(e.display, e.reason) for e in offline.endpoints if not e.up_at_end] == \
        [(f"localhost:{exporter.port}", f"duplicate of 127.0.0.1:{exporter.port}")]
    assert offline.telemetry_data["endpoints"] == live.telemetry_data["endpoints"]
    assert offline.telemetry_data["summary"]["duplicate_endpoints"] == \
        live.telemetry_data["summary"]["duplicate_endpoints"]


class SimulatedNvml:
    """A local reader (bridge/sources/runner.py `Reader`) of a simulated node: the page NVML's reader would write,
    rendered without HTTP (no GPU or vendor library here)."""

    def __init__(self, config: SimulatorConfig, source: str = "pynvml://localhost") -> None:
        self.source = source
        self.model = NodeModel(config)
        self.renderer = PageRenderer(self.model)
        self.reads = 0
        self.closed = False

    def read_page(self, now_ns: int) -> bytes:
        self.reads += 1
        return self.renderer.page(now_ns)

    def close(self) -> None:
        self.closed = True


def _with_local(tmp_path: Path, users: list[str], reader: SimulatedNvml, monkeypatch: pytest.MonkeyPatch) -> Session:
    monkeypatch.setattr("bridge.sidecar.session.open_reader", lambda name: reader)
    config = Config(telemetry=TelemetryItems(urls=users, local=["pynvml"]), default_endpoints=[],
                    artifact_dir=str(tmp_path), collection_interval=0.05, scrape_timeout=1.0, connect_timeout=0.5,
                    run_id="test-run", shutdown_delay=3.0)
    session = Session(config, default_table())
    session.configure()
    scrape_synchronously(session, 2)
    session.complete()
    return session


def test_a_local_reader_plugs_into_the_pipeline_and_its_gpus_are_recorded_beside_an_exporters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = SimulatedNvml(SimulatorConfig(gpus=2, seed=24))
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=25)) as exporter:
        session = _with_local(tmp_path, [exporter.url], reader, monkeypatch)
    by_source: dict[str, set[str]] = {}
    for d in read_dicts(session.records.path):
        by_source.setdefault(d["telemetry_source_url"], set()).add(d["gpu_uuid"])
    assert {k: len(v) for k, v in by_source.items()} == {exporter.url: 2, reader.source: 2}
    assert _gpus(session) == 4 and reader.closed


def test_a_local_reader_that_sees_the_gpus_of_a_given_exporter_is_its_duplicate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = SimulatedNvml(SimulatorConfig(gpus=2, seed=26))
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=26)) as exporter:
        session = _with_local(tmp_path, [exporter.url], reader, monkeypatch)
    assert {d["telemetry_source_url"] for d in read_dicts(session.records.path)} == {exporter.url}
    assert reader.reads == 1  # the first read only: retired before its baseline
    assert _gpus(session) == 2
    assert session.outputs is not None and session.outputs.report is not None
    assert session.outputs.report.telemetry_data["summary"]["duplicate_endpoints"] == \
        [{"endpoint": reader.source, "duplicate_of": f"127.0.0.1:{exporter.port}"}]
