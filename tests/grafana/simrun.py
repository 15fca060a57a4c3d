"""A benchmark run, warmup then profiling, recorded by the real sidecar pipeline from simulated exporters.

`Session` (bridge/sidecar/session.py) scrapes real HTTP simulators on loopback, writes the record log and
events, builds the report at completion and hands every parsed page to its listeners — the seam the
sidecar's OTLP forwarder and pull endpoint hang on. The scrape loops are never started: the driver
triggers each scrape itself, so the run is one deterministic sequence of steps, and a `Step` callback
can hold the run until a store has taken the step's pages in.

    run = drive_run(tmp_path, [node_a, node_b], tick=..., on_step=...)

The simulators and the session share one clock: every page of a step carries the step's time, at which
the simulator's model gives the ground truth (power, energy). The session's own OTLP forwarder and
pull endpoint (`Session.exposition()`) are the sidecar's outputs the stores are fed from.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.config import Config
from bridge.endpoints import TelemetryItems, display_key
from bridge.fields import default_table
from bridge.samples import ParsedPage
from bridge.sidecar.session import Session, SessionOutputs
from bridge.simulator import ManualClock, SimulatedExporter

NS = 1_000_000_000


@dataclass(frozen=True)
class Page:
    endpoint: str  # display key, host:port
    page: ParsedPage
    ts_ns: int
    phase: str  # "none" outside a phase


@dataclass(frozen=True)
class Served:
    """One series group (a whole GPU or a MIG instance) as its simulator served it at one step: the labels the
    dashboards group by and every field's value in the simulator's canonical units (bridge/simulator/model.py
    `Snapshot`: MHz, C, W, mJ, %, MiB, ns), whichever dialect rendered them."""

    host: str
    uuid: str
    gpu: str  # the GPU's index
    slot: str  # the GPU's index, or for a MIG instance "index profile instance-id" (the rules' `slot` label)
    values: Mapping[str, float]


@dataclass
class Step:
    index: int
    t_ns: int
    phase: str
    pages: list[Page]


@dataclass
class RecordedRun:
    run_id: str
    session: Session
    outputs: SessionOutputs
    nodes: Sequence[SimulatedExporter]
    steps: list[Step] = field(default_factory=list)
    _served: dict[int, list[Served]] = field(default_factory=dict, repr=False)

    @property
    def records_path(self) -> Path:
        return self.session.records.path

    @property
    def events_path(self) -> Path:
        return self.session.events.path

    def phase_steps(self, phase: str) -> list[Step]:
        return [s for s in self.steps if s.phase == phase]

    def power_w(self, t_ns: int) -> float:
        """Ground truth: every GPU's power at t, as the exporter shows it (NVML's mW resolution)."""
        return sum(round(node.model.power_watts(g, t_ns), 3) for node in self.nodes
                   for g in range(node.config.gpus))

    def gpu_power_w(self, node: SimulatedExporter, gpu: int, t_ns: int) -> float:
        return round(node.model.power_watts(gpu, t_ns), 3)

    def served(self, step: Step) -> list[Served]:
        """Ground truth: what every simulator served at `step` (its model's snapshot at the step's time)."""
        if step.index in self._served:
            return self._served[step.index]
        out = self._served[step.index] = []
        for node in self.nodes:
            model = node.model
            for entity, values in zip(model.entities, model.snapshot(step.t_ns).values, strict=True):
                slot = str(entity.gpu) if entity.instance_id is None else \
                    f"{entity.gpu} {entity.profile} {entity.instance_id}"
                out.append(Served(model.hostname, model.gpus[entity.gpu].uuid, str(entity.gpu), slot, values))
        return out

    def energy_j(self, t0_ns: int, t1_ns: int) -> float:
        """Ground truth: energy all GPUs really used over [t0, t1]."""
        return sum(node.model.energy_joules(g, t0_ns, t1_ns) for node in self.nodes
                   for g in range(node.config.gpus))


class _Collector:
    """The session listener: the pages of the scrape in progress, grouped by the driver into steps."""

    def __init__(self) -> None:
        self.pending: list[Page] = []
        self._lock = threading.Lock()

    def __call__(self, url: str, page: ParsedPage, ts_ns: int, phase: str | None) -> None:
        with self._lock:
            self.pending.append(Page(display_key(url), page, ts_ns, phase or "none"))

    def take(self) -> list[Page]:
        with self._lock:
            pages, self.pending = self.pending, []
        return pages


def drive_run(
    artifact_dir: Path,
    nodes: Sequence[SimulatedExporter],
    clock: ManualClock,
    *,
    tick: Callable[[], None],
    on_step: Callable[[Step, Session], None] = lambda step, session: None,
    run_id: str = "bench-run-1",
    warmup_steps: int = 6,
    profiling_steps: int = 12,
    before_step: Callable[[int], None] = lambda index: None,
    forwarder: Any = None,
) -> RecordedRun:
    """Baseline scrape, warmup, a gap, profiling, completion; `tick()` moves `clock` before every scrape.

    `forwarder` is the sidecar's OTLP forwarder (Session submits every page to it, closes it at the end).
    """
    collector = _Collector()
    config = Config(telemetry=TelemetryItems(urls=[n.url for n in nodes]), default_endpoints=[],
                    artifact_dir=str(artifact_dir), collection_interval=1.0, run_id=run_id,
                    scrape_timeout=5.0, connect_timeout=2.0, shutdown_delay=5.0, flush_interval=0.0)
    session = Session(config, default_table(), now_ns=clock, listeners=[collector], forwarder=forwarder)
    steps: list[Step] = []

    def emit(phase: str) -> None:
        pages = collector.take()
        assert len(pages) == len(nodes), f"a scrape failed: {session.status()['endpoints']}"
        step = Step(len(steps), pages[0].ts_ns, phase, pages)
        assert {p.phase for p in pages} == {phase} and {p.ts_ns for p in pages} == {step.t_ns}
        steps.append(step)
        on_step(step, session)

    def scrape(phase: str) -> None:
        before_step(len(steps))
        tick()
        for loop in session.loops.values():
            assert loop.scrape_now(), loop.stats.last_error
        emit(phase)

    def mark(name: str, kind: str, event: str) -> None:
        before_step(len(steps))
        tick()
        session.mark_phase(name, kind, event, clock())
        for thread in threading.enumerate():  # the boundary scrape runs on the mark's own thread
            if thread.name == f"boundary {name} {event}":
                thread.join(10)
        emit(name if event == "start" else "none")

    before_step(0)
    tick()
    session.configure()  # probes, then the baseline scrape
    emit("none")
    for name, kind, count in (("warmup", "warmup", warmup_steps), ("profiling", "profiling", profiling_steps)):
        mark(name, kind, "start")
        for _ in range(count):
            scrape(name)
        mark(name, kind, "end")
    before_step(len(steps))
    tick()
    outputs = session.complete(requests_end_ns=steps[-1].t_ns)
    emit("none")  # the final scrape
    return RecordedRun(run_id, session, outputs, nodes, steps)
