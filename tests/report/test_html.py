"""The HTML report of a real short run: self-contained, every GPU and phase on it, energy per phase equal
to the simulator's ground truth, and rendered by headless Chromium without script errors."""

from __future__ import annotations

import re
import struct
import subprocess

import pytest

from bridge.record_log import read_records
from bridge.report.html import render_html, write_html
from bridge.simulator import ManualClock, SimulatedExporter, SimulatorConfig
from tests.conftest import require_binary
from tests.grafana.simrun import NS, RecordedRun, drive_run

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RecordedRun:
    """Two nodes, one with MIG (utilisation from GR_ENGINE_ACTIVE), 2 s between scrapes of simulated time."""
    clock = ManualClock(1_796_000_000 * NS)
    with SimulatedExporter(SimulatorConfig(gpus=2, hostname="gpu-node-a", seed=31), now_ns=clock) as a, \
            SimulatedExporter(SimulatorConfig(gpus=1, mig=2, hostname="gpu-node-b", dialect="current", seed=32),
                              now_ns=clock) as b:
        return drive_run(tmp_path_factory.mktemp("html-run"), [a, b], clock, tick=lambda: clock.advance(2 * NS),
                         warmup_steps=5, profiling_steps=10)


@pytest.fixture(scope="module")
def page(run: RecordedRun) -> str:
    assert run.outputs.report is not None, "the session built no report"
    return render_html(run.outputs.report, run.records_path, title="bench run 1")


def test_the_page_is_one_file_that_needs_no_network(page):
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.IGNORECASE)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert "<img" not in page and "<iframe" not in page


def test_there_is_a_chart_per_metric_with_every_gpu_and_the_phases_shaded(page):
    charts = re.findall(r'<svg class="chart" data-chart="(c\d)"', page)
    assert charts == ["c0", "c1", "c2", "c3"]
    for caption in ("Utilisation (%)", "Power (W)", "GPU temperature (°C)", "Memory used (GB)"):
        assert f"<figcaption>{caption}</figcaption>" in page
    legend = re.search(r'<ul class="legend">(.*?)</ul>', page, re.DOTALL)
    assert legend is not None
    for label in ("gpu-node-a gpu 0", "gpu-node-a gpu 1", "gpu-node-b gpu 0", "gpu-node-b gpu 0 3g.40gb #1",
                  "gpu-node-b gpu 0 3g.40gb #2"):
        assert f"</svg>{label}</li>" in legend.group(1)
    for chart in page.split('<svg class="chart"')[1:]:
        assert "<title>warmup</title></rect>" in chart and "<title>profiling</title></rect>" in chart
        assert chart.count("<path ") >= 3
    utilisation = page.split('<svg class="chart"')[1]
    assert "<title>gpu-node-b gpu 0 3g.40gb #1</title></path>" in utilisation  # GR_ENGINE_ACTIVE, MIG instance


def test_energy_per_phase_is_the_simulators_ground_truth_within_its_stated_uncertainty(run, page):
    rows = {name: (float(joules), float(stated)) for name, joules, stated in
            re.findall(r'<tr data-phase="(\w+)" data-energy-j="([\d.]+)" data-uncertainty-j="([\d.]+)">', page)}
    assert set(rows) == {"warmup", "profiling"}
    for phase in ("warmup", "profiling"):
        steps = run.phase_steps(phase)
        start = steps[0].t_ns  # the start mark's boundary scrape
        end = next(s.t_ns for s in run.steps if s.index == steps[-1].index + 1)  # the end mark's
        joules, stated = rows[phase]
        truth = run.energy_j(start, end)
        assert abs(joules - truth) <= stated < 0.05 * truth, (phase, joules, truth, stated)  # (2 s scrapes: a DCGM
        # refresh of up to 2 s, which the readings cannot rule out)


def test_the_console_summary_is_on_the_page(run, page):
    console = re.search(r'<pre class="console">(.*?)</pre>', page, re.DOTALL)
    assert console is not None
    text = re.sub(r"<[^>]+>", "", console.group(1))
    assert "GPU Telemetry Summary" in text and "2/2 telemetry sources reachable" in text
    assert "NVIDIA GPU Power Usage (W)" in text


def test_records_or_their_log_give_the_same_page(run, page):
    report = run.outputs.report
    assert render_html(report, list(read_records(run.records_path)), title="bench run 1") == page


def test_write_html_creates_the_directory_and_returns_the_path(run, tmp_path):
    out = write_html(run.outputs.report, run.records_path, tmp_path / "a" / "b" / "report.html")
    assert out == tmp_path / "a" / "b" / "report.html" and out.read_text(encoding="utf-8").startswith("<!DOCTYPE")


@pytest.mark.realstack
def test_headless_chromium_renders_the_page_without_script_errors_and_draws_the_charts(run, tmp_path):
    chromium = require_binary("chromium")
    html_path = write_html(run.outputs.report, run.records_path, tmp_path / "report.html")
    url = html_path.resolve().as_uri()
    dom = subprocess.run(
        [str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile-dom'}", "--dump-dom", url],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    root = re.search(r"<html[^>]*>", dom)
    assert root is not None
    assert 'data-report-status="ok"' in root.group(0), root.group(0)
    assert 'data-charts="4"' in root.group(0), root.group(0)
    shot = tmp_path / "report.png"
    subprocess.run(
        [str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile-shot'}", f"--screenshot={shot}",
         "--window-size=1400,2000", url],
        capture_output=True, timeout=60, check=True,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert (width, height) == (1400, 2000)
    # A blank 1400×2000 page compresses to a few kB; four charts, tables and text make it far larger.
    assert len(data) > 100_000, len(data)


@pytest.mark.realstack
def test_the_script_reports_an_error_instead_of_hiding_it(run, tmp_path):
    """The status marker is not written blindly: a page whose chart data is missing says so."""
    chromium = require_binary("chromium")
    page = render_html(run.outputs.report, run.records_path)
    broken = re.sub(r'(<script type="application/json" id="chart-data">)\{.*?\}(</script>)', r"\1{}\2", page,
                    flags=re.DOTALL)
    path = tmp_path / "broken.html"
    path.write_text(broken, encoding="utf-8")
    dom = subprocess.run(
        [str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
         path.resolve().as_uri()],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert 'data-report-status="error: no data for chart 0"' in dom


def test_a_report_without_records_still_renders_a_page():
    from bridge.report import build_report

    page = render_html(build_report([]), [])
    assert "<h1>dcgm-bridge · GPU telemetry</h1>" in page and '<svg class="chart"' not in page
    assert "No phases were marked" in page


def test_the_page_draws_the_series_the_report_was_built_from_without_reading_the_log(run, page, tmp_path):
    report = run.outputs.report
    assert report is not None and report.series
    assert render_html(report, title="bench run 1") == page
    moved = tmp_path / "elsewhere.jsonl"
    run.records_path.rename(moved)
    try:
        assert write_html(report, None, tmp_path / "own.html", title="bench run 1").read_text(encoding="utf-8") == page
    finally:
        moved.rename(run.records_path)


def test_the_cards_count_gpus_apart_from_mig_instances_and_give_the_energy_with_its_uncertainty_and_verdict(page):
    """Issue 27: "3 GPUs (2 MIG instances)", not 5; `… kJ ± … kJ` from the uncertainty; the verdict's line."""
    cards = dict(re.findall(r'<div class="card"><span>(.*?)</span><b>(.*?)</b></div>', page))
    assert cards["GPUs"] == "3 GPUs (2 MIG instances)"
    assert re.fullmatch(r"[\d.,]+ k?J ± [\d.,]+ k?J \(bound ± [\d.,]+ k?J\)", cards["Energy (profiling)"])
    assert cards["Measurement"].startswith("measurement ")
