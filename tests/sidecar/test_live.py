"""The live view."""

from __future__ import annotations

import pytest

from bridge.simulator import ManualClock, SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import NS, scrape_synchronously, session_for


def live_text(tmp_path, config):
    """The live table of one scrape of a simulated exporter 10 s after its start, and the records it shows."""
    from rich.console import Console

    from bridge.sidecar.live import live_table

    clock = ManualClock()
    with SimulatedExporter(config, now_ns=clock) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        clock.advance(10 * NS)
        scrape_synchronously(session, 1)
        console = Console(record=True, width=200)
        console.print(live_table(session))
        latest = {r.gpu_index: r.telemetry_data for _, r in session.latest_records().values()}
        session.complete()
    return console.export_text(), latest


def test_the_live_view_shows_every_gpu_with_its_energy_so_far(tmp_path):
    text, _ = live_text(tmp_path, SimulatorConfig(gpus=2, mig=1))
    assert text.count("NVIDIA H100") == 4  # two GPUs and their MIG instances
    assert "mig" in text and " kJ" in text and "phase -" in text


def test_the_live_view_reads_amd_gpus_under_aiperfs_amd_keys(tmp_path):
    text, latest = live_text(tmp_path, SimulatorConfig(gpus=2, dialect="amd"))
    rows = [line.split("┃") if "┃" in line else line.split("│") for line in text.splitlines()]
    cells = {int(row[2]): [c.strip() for c in row[4:9]] for row in rows if len(row) > 9 and row[2].strip().isdigit()}
    assert sorted(cells) == [0, 1]
    for index, (util, power, temp, memory, energy) in cells.items():
        data = latest[index]
        assert (util, power, temp) == (f"{data['amd_gfx_activity']:.0f}", f"{data['amd_power']:.0f}",
                                       f"{data['amd_temperature']:.0f}")
        assert memory == f"{data['amd_memory_used']:.1f}" and energy.endswith("J")


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
