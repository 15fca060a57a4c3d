"""The live view."""

from __future__ import annotations

import pytest

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


def test_a_down_endpoint_has_a_row_with_why(tmp_path):
    from rich.console import Console

    from bridge.sidecar.live import live_table

    session = session_for(["http://127.0.0.1:1/metrics"], tmp_path)
    session.configure()
    scrape_synchronously(session, 1)
    console = Console(record=True, width=200)
    console.print(live_table(session))
    session.complete()
    text = console.export_text()
    assert "127.0.0.1:1" in text and "down: cannot connect" in text


def test_the_benchmarks_output_stays_readable_above_the_live_table(tmp_path):
    import io
    import re
    import subprocess
    import sys

    from rich.console import Console

    from bridge.sidecar.live import LiveView

    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        out = io.StringIO()
        view = LiveView(session, refresh_s=0.05, console=Console(file=out, force_terminal=True, width=120))
        view.start()
        benchmark = subprocess.Popen([sys.executable, "-c", "import time\nfor i in range(8):\n print('line', i, "
                                      "flush=True); time.sleep(0.03)"], stdout=subprocess.PIPE)
        view.relay(benchmark.stdout).join(10)
        benchmark.wait()
        view.stop()
        session.complete()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    printed = [line.strip() for line in text.splitlines() if line.strip().startswith("line ")]
    assert printed == [f"line {i}" for i in range(8)]  # all 8, in order, none overwritten by the table
    assert "dcgm-bridge · run test-run" in text


def test_aiperfs_full_screen_dashboard_is_named_instead_of_fought_over():
    from bridge.sidecar.profile import full_screen_conflict

    assert "use --ui-type simple" in full_screen_conflict(["aiperf", "profile", "--ui-type", "dashboard"])
    assert "use --ui-type simple" in full_screen_conflict(["aiperf", "profile", "--ui=dashboard"])
    assert full_screen_conflict(["aiperf", "profile", "--ui-type", "simple"]) is None
    assert full_screen_conflict(["aiperf", "profile"]) is None  # piped through the view, it picks its plain UI
    assert full_screen_conflict(["vllm", "bench", "--ui-type", "dashboard"]) is None


@pytest.mark.slow
def test_a_stale_stretch_shows_as_the_age_of_the_values_not_a_flat_line(tmp_path):
    """A 400 ms refresh scraped every 50 ms: the view says how old the values are and how often they change."""
    import time

    from rich.console import Console

    from bridge.sidecar.live import live_table

    with SimulatedExporter(SimulatorConfig(gpus=1, refresh_ms=400)) as exporter:
        session = session_for([exporter.url], tmp_path, run_id="stale")
        session.configure()
        session.start()
        time.sleep(1.8)
        console = Console(record=True, width=240)
        console.print(live_table(session))
        session.complete()
    text = console.export_text()
    assert " s old · every 0.4 s" in text


def test_fresh_values_say_fresh(tmp_path):
    from rich.console import Console

    from bridge.sidecar.live import live_table

    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        session = session_for([exporter.url], tmp_path, run_id="fresh")
        session.configure()
        scrape_synchronously(session, 6)
        console = Console(record=True, width=240)
        console.print(live_table(session))
        session.complete()
    assert "fresh" in console.export_text()
