"""`dcgm-bridge compare --html`: the page in headless Chromium (as the report's page, test_html.py), its forest plot
and sweep curves against the values the runs hold, hostile folder names kept out of the markup, and the page never
written through a link."""

from __future__ import annotations

import html
import re
import struct
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from tests.conftest import require_binary
from tests.report.test_compare import _sweep_point
from tests.report.test_html import CHROMIUM_FLAGS

# (concurrency, throughput tokens/s, energy per token mJ) as in test_compare's sweep: 4 and 8 on the front.
POINTS = {1: (100.0, 5.0), 4: (300.0, 3.0), 8: (350.0, 3.5), 16: (320.0, 4.0)}
HOSTILE = "c8 <script>alert(1)<!--"


def _folders(tmp_path: Path) -> list[str]:
    folders = []
    for c, (throughput, per_token) in POINTS.items():
        folder = tmp_path / (HOSTILE if c == 8 else f"c{c}")
        _sweep_point(folder, c, throughput, per_token)
        folders.append(str(folder))
    return folders


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("compare-html")
    out = tmp / "page" / "compare.html"
    result = CliRunner().invoke(main, ["compare", "--sweep", "concurrency", "--html", str(out), *_folders(tmp)])
    assert result.exit_code == 0, result.output
    return out, out.read_text(encoding="utf-8")


def test_the_forest_plot_holds_each_metrics_change_from_the_baseline(page: tuple[Path, str]) -> None:
    _, text = page
    assert "<link" not in text and "url(" not in text and "<script>alert" not in text
    forest = text.split('data-forest="0"')[1].split("</svg>")[0]  # concurrency 4 against concurrency 1
    rows = dict(re.findall(r'data-metric="([^"]+)" data-relative="([^"]+)"', forest))
    assert float(rows["energy_per_output_token"]) == pytest.approx(-40.0, rel=1e-3)  # 3 mJ against 5
    assert float(rows["output_token_throughput"]) == pytest.approx(200.0, rel=1e-3)  # 300 tokens/s against 100
    assert 'data-metric="energy_per_output_token" data-relative="-40" data-verdict="better"' in forest
    assert html.escape(HOSTILE) in text


@pytest.mark.realstack
def test_headless_chromium_draws_the_forests_and_the_sweep_curves_without_script_errors(
        page: tuple[Path, str], tmp_path: Path) -> None:
    chromium = require_binary("chromium")
    path, _ = page
    url = path.resolve().as_uri()
    dom = subprocess.run([str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'dom'}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    root = re.search(r"<html[^>]*>", dom)
    assert root is not None
    assert 'data-report-status="ok"' in root.group(0), root.group(0)
    assert 'data-forests="3"' in root.group(0) and 'data-sweeps="4"' in root.group(0), root.group(0)
    assert len(re.findall(r"<script\b", dom)) == 2 and "&lt;script&gt;alert(1)" in dom  # text, never an element
    shot = tmp_path / "compare.png"
    subprocess.run([str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'shot'}", f"--screenshot={shot}",
                    "--window-size=1200,1600", url], capture_output=True, timeout=60, check=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (1200, 1600)
    assert len(data) > 60_000, len(data)  # a blank page compresses to a few kB


def test_the_page_is_never_written_through_a_link_nor_over_a_report(tmp_path: Path) -> None:
    folders = _folders(tmp_path)
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep")
    link = tmp_path / "page.html"
    link.symlink_to(target)
    result = CliRunner().invoke(main, ["compare", "--html", str(link), *folders[:2]])
    assert result.exit_code == 2 and "symbolic link" in result.output and target.read_text() == "keep"
    report = Path(folders[1]) / "run_0000" / "profile_export_aiperf.json"
    before = report.read_bytes()
    result = CliRunner().invoke(main, ["compare", "--html", str(report), *folders[:2]])
    assert result.exit_code == 2 and "one of the reports compared" in result.output and report.read_bytes() == before
