"""A seeded, deterministic simulated NVIDIA dcgm-exporter: the product and its tests run without a GPU.

    from bridge.simulator import Fault, ManualClock, SimulatedExporter, SimulatorConfig

    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=8, dialect="current"), now_ns=clock) as exporter:
        httpx.get(exporter.url)                          # a real HTTP /metrics page on 127.0.0.1
        exporter.add_fault(Fault("counter-reset", from_ns=clock() + 60 * 10**9))
        exporter.model.energy_joules(0, t0_ns, t1_ns)    # ground truth, whatever the counters did

Modules: schema (fields, dialects), config (SimulatorConfig, Fault), model (physics, ground truth),
render (text per dialect), server (HTTP + faults), cli (`dcgm-bridge simulate`, needs click: import it
from bridge.simulator.cli). Importing this package uses the standard library only.
"""

from bridge.simulator.config import DIALECT_NAMES, FAULT_KINDS, Fault, SimulatorConfig, parse_fault_spec
from bridge.simulator.model import ManualClock, NodeModel, Snapshot, scaled_clock
from bridge.simulator.render import PageMods, render_page
from bridge.simulator.server import SimulatedExporter

__all__ = [
    "DIALECT_NAMES",
    "FAULT_KINDS",
    "Fault",
    "ManualClock",
    "NodeModel",
    "PageMods",
    "SimulatedExporter",
    "SimulatorConfig",
    "Snapshot",
    "parse_fault_spec",
    "render_page",
    "scaled_clock",
]
