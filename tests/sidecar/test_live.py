"""The live view."""

from __future__ import annotations

from bridge.simulator import ManualClock, SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import NS, scrape_synchronously, session_for


def test_the_live_view_shows_every_gpu_with_its_energy_so_far(tmp_path):
    from rich.console import Console

    from bridge.sidecar.live import live_table

    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=2, mig=1), now_ns=clock) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        clock.advance(10 * NS)
        scrape_synchronously(session, 1)
        console = Console(record=True, width=200)
        console.print(live_table(session))
        session.complete()
    text = console.export_text()
    assert text.count("NVIDIA H100") == 4  # two GPUs and their MIG instances
    assert "mig" in text and " kJ" in text and "phase -" in text
