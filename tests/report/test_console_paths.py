"""Every console path (wide, narrow, live, `report --console`): outside text printed as it is, one terminal
policy, one unit per metric, an endpoint's trouble shown (issue 33 items 4, 6, 7; issue 28 item 8)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from bridge.report import build_report, render_console
from bridge.report.cli import report
from bridge.report.console import console_width
from bridge.report.window import explicit_window
from bridge.samples import ScrapeFailure
from bridge.sidecar.live import live_table, short_names
from bridge.simulator import ManualClock, SimulatedExporter, SimulatorConfig
from tests.report.helpers import T0, URL, S, rec, write_events, write_log
from tests.sidecar.helpers import NS, scrape_synchronously, session_for

HOSTILE = "NVIDIA [/bold] H100 [red]x[/red]"


def _records(model: str = "NVIDIA H100 80GB HBM3", every_ns: int = S // 3, **kw: object) -> list:  # type: ignore[type-arg]
    return [rec(T0 + i * every_ns, {"nvidia_power_usage": 300.0, "nvidia_energy_consumption": 1.0 + i * 100e-6},
                model=model, **kw)  # type: ignore[arg-type]
            for i in range(-3, int(10 * S / every_ns) + 3)]


def _text(built: object, width: int) -> str:
    console = Console(record=True, width=width, force_terminal=False, file=io.StringIO())
    render_console(built, console)  # type: ignore[arg-type]
    return console.export_text()


@pytest.mark.parametrize("width", [80, 140])
def test_a_gpu_name_holding_markup_is_printed_as_it_is_in_the_wide_and_the_narrow_layout(width: int) -> None:
    built = build_report(_records(HOSTILE), window=explicit_window(T0, T0 + 10 * S), endpoints_configured=[URL],
                         endpoints_successful=[URL])
    assert HOSTILE in _text(built, width)


def test_a_gpu_name_holding_markup_is_printed_as_it_is_in_the_live_view(tmp_path: Path) -> None:
    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=1, model_name=HOSTILE), now_ns=clock) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        clock.advance(10 * NS)
        scrape_synchronously(session, 1)
        texts = []
        for width in (80, 200):
            console = Console(record=True, width=width, file=io.StringIO())
            console.print(live_table(session, width))
            texts.append(console.export_text())
        session.complete()
    assert "NVIDIA [/bold] H100 [red]" in texts[1]  # the model column is cut at 28 characters
    assert "[/bold]" not in texts[0]  # narrow: no model column, and no crash


@pytest.mark.parametrize("columns", ["80", "140"])
def test_a_gpu_name_holding_markup_is_printed_as_it_is_by_report_console(tmp_path: Path, columns: str) -> None:
    log = write_log(tmp_path / "gpu_telemetry_export.jsonl", _records(HOSTILE))
    events = write_events(tmp_path / "gpu_telemetry_events.jsonl", [
        {"type": "configured", "time_ns": T0 - S, "endpoints_configured": [URL], "endpoints_successful": [URL]},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "start", "time_ns": T0},
        {"type": "complete", "time_ns": T0 + 11 * S, "requests_end_ns": T0 + 10 * S, "collection_complete": True},
    ])
    result = CliRunner().invoke(report, ["--jsonl", str(log), "--events", str(events), "--console"],
                                env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    assert HOSTILE in result.output


# -- one terminal policy -------------------------------------------------------------------------------------
class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_a_pipe_counts_as_80_columns_unless_columns_says_otherwise() -> None:
    assert console_width(_Stream(False), env={}) == 80
    assert console_width(_Stream(False), env={"COLUMNS": "150"}) == 150
    assert console_width(_Stream(True), env={}) is None  # the terminal's own width
    assert console_width(_Stream(True), env={"COLUMNS": "100"}) == 100


def test_endpoints_lose_their_common_prefix_never_their_distinguishing_end() -> None:
    assert short_names(["127.0.0.1:19400", "127.0.0.1:19401"]) == {"127.0.0.1:19400": "…:19400",
                                                                     "127.0.0.1:19401": "…:19401"}
    assert short_names(["10.0.0.1:9400", "10.0.0.2:9400"]) == {"10.0.0.1:9400": "….1:9400",
                                                               "10.0.0.2:9400": "….2:9400"}
    assert short_names(["node-a:9400"]) == {"node-a:9400": "node-a:9400"}


def test_the_live_view_at_80_and_100_columns_is_one_line_per_gpu_and_tells_endpoints_apart(
        tmp_path: Path) -> None:
    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=2), now_ns=clock) as a, \
            SimulatedExporter(SimulatorConfig(gpus=2, seed=1), now_ns=clock) as b:
        session = session_for([a.url, b.url, "http://127.0.0.1:1/metrics"], tmp_path)
        session.configure()
        clock.advance(10 * NS)
        scrape_synchronously(session, 1)
        outputs = {}
        for width in (80, 100):
            console = Console(record=True, width=width, file=io.StringIO())
            console.print(live_table(session, width))
            outputs[width] = console.export_text()
        session.complete()
    for width, text in outputs.items():
        lines = text.splitlines()
        ports = [url.rsplit(":", 1)[1].split("/")[0] for url in (a.url, b.url)]
        for port in ports:
            assert sum(f"…:{port} " in line for line in lines) == 2, text  # its two GPUs, one line each
        assert sum("…:1 " in line and "down: cannot conn" in line for line in lines) == 1, text
        assert max(map(len, lines)) <= width


# -- one unit per metric ------------------------------------------------------------------------------------
def test_one_energy_unit_for_every_gpu_chosen_for_the_largest_value() -> None:
    big = _records(uuid="GPU-a", index=0)
    small = [rec(r.timestamp_ns, {"nvidia_power_usage": 30.0,
                                  "nvidia_energy_consumption": 1.0 + (r.timestamp_ns - T0) / S * 5e-6},
                 uuid="GPU-b", index=1) for r in big]
    built = build_report(big + small, window=explicit_window(T0, T0 + 10 * S), endpoints_configured=[URL],
                         endpoints_successful=[URL])
    for width in (80, 140):
        text = _text(built, width)
        assert "Energy Consumption (kJ)" in text and "Energy Consumption (J)" not in text, text
        assert "0.05" in text  # the small GPU's 50 J, in kJ


def test_a_very_short_run_is_not_over_zero_seconds() -> None:
    records = [rec(T0 + i * 10_000_000, {"nvidia_power_usage": 300.0, "nvidia_energy_consumption": 1.0 + i * 3e-6})
               for i in range(-3, 10)]
    built = build_report(records, window=explicit_window(T0, T0 + 40_000_000, grace_ns=0),
                         endpoints_configured=[URL], endpoints_successful=[URL])
    text = _text(built, 140)
    assert "over 0.0 s" not in text and " ms (" in text


# -- trouble shown as trouble ------------------------------------------------------------------------------
def test_an_endpoint_down_for_part_of_the_window_gets_a_mark_with_its_failed_share_and_longest_gap() -> None:
    records = [r for r in _records(every_ns=S // 2) if not T0 + 3 * S < r.timestamp_ns < T0 + 7 * S]
    failures = [ScrapeFailure(URL, T0 + 3 * S + k * S // 2, "connect", "cannot connect to 127.0.0.1:19401")
                for k in range(1, 8)]
    built = build_report(records, window=explicit_window(T0, T0 + 10 * S), endpoints_configured=[URL],
                         endpoints_successful=[URL], errors=failures)
    text = _text(built, 140)
    assert "✔" not in text
    assert "! 127.0.0.1:19401 (7 of 22 scrapes failed, 32%; longest gap 4.0 s)" in text, text


def test_an_endpoint_whose_every_scrape_succeeded_gets_a_tick() -> None:
    built = build_report(_records(), window=explicit_window(T0, T0 + 10 * S), endpoints_configured=[URL],
                         endpoints_successful=[URL])
    assert "✔ 127.0.0.1:19401" in _text(built, 140)


def test_an_endpoint_that_answered_but_gave_no_sample_gets_no_tick() -> None:
    other = "http://10.0.0.2:9400/metrics"
    built = build_report(_records(), window=explicit_window(T0, T0 + 10 * S), endpoints_configured=[URL, other],
                         endpoints_successful=[URL, other])
    text = _text(built, 140)
    assert "! 10.0.0.2:9400 (reachable, but no sample was read from it)" in text
    assert "✔ 127.0.0.1:19401" in text


def test_nvlink_bandwidth_says_it_counts_megabytes_in_every_dialect() -> None:
    import re

    from bridge.fields import default_table
    from bridge.simulator.model import NodeModel
    from bridge.simulator.render import render_page

    table = default_table()
    for dialect in ("legacy", "dcgm49"):
        page = render_page(NodeModel(SimulatorConfig(gpus=1, dialect=dialect), lambda: 0), 0)  # type: ignore[arg-type]
        names = set(re.findall(rb"^(DCGM_FI_DEV_NVLINK_(?:BANDWIDTH|THROUGHPUT)_TOTAL)\{", page, re.MULTILINE))
        assert names, dialect
        assert {table.by_name[n.decode()].unit for n in names} == {"MB"}, dialect
    built = build_report([rec(T0 + i * S, {"nvidia_nvlink_bandwidth_total": 1e8 + i * 1e6}) for i in range(-1, 12)],
                         window=explicit_window(T0, T0 + 10 * S))
    assert "NVIDIA NVLink Bandwidth Total (MB)" in _text(built, 140)
