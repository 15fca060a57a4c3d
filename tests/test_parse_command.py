"""`dcgm-bridge parse`: what the bridge sees in one page."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.conftest import REAL_PAGES


@pytest.mark.parametrize("path", REAL_PAGES, ids=lambda p: p.name)
def test_parse_json_shows_samples_dropped_lines_and_gpus(path):
    result = CliRunner().invoke(main, ["parse", str(path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out) == {"samples", "dropped", "gpus", "families", "unmapped", "warnings"} and out["samples"]
    assert all(set(s) == {"name", "labels", "value", "timestamp_ms"} for s in out["samples"])
    assert len(out["gpus"]) == (2 if "mig" in path.name else 1)


def test_parse_json_keeps_sentinels_and_encodes_non_finite_values(tmp_path):
    page = tmp_path / "p.txt"
    page.write_text('a{gpu="0",UUID="GPU-1"} NaN\nb{gpu="0",UUID="GPU-1"} +Inf\n'
                    'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 9223372036854775794\nbroken line here\n')
    out = json.loads(CliRunner().invoke(main, ["parse", str(page), "--json"]).output)
    assert [s["value"] for s in out["samples"]] == [None, "+Inf", 9.223372036854776e18]
    assert out["dropped"][0]["line"] == 4 and out["gpus"] == []


def test_parse_reads_a_url(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=3)) as exporter:
        result = CliRunner().invoke(main, ["parse", f"127.0.0.1:{exporter.port}"])
    assert result.exit_code == 0 and "3 GPUs" in result.output


def test_parse_of_a_missing_file_says_so():
    result = CliRunner().invoke(main, ["parse", "/nonexistent/page.txt"])
    assert result.exit_code != 0 and "no such file" in result.output


def test_parse_counts_mig_instances_apart_from_their_gpu():
    """Issue 27: a 1-GPU page with 3 instances said "4 GPUs"."""
    with SimulatedExporter(SimulatorConfig(gpus=1, mig=3)) as exporter:
        result = CliRunner().invoke(main, ["parse", f"127.0.0.1:{exporter.port}"])
    assert result.exit_code == 0 and "1 GPU (3 MIG instances)" in result.output.splitlines()[0]


HTML = b"<!DOCTYPE html>\n<html><head><title>Grafana</title></head>\n<body>" + b"<p>x</p>\n" * 3000 + b"</html>\n"


@pytest.mark.parametrize(("body", "looks"), [(HTML, "it looks like HTML"),
                                             (b'{"records": 5,\n "gpus": 1}\n', "it looks like JSON: a report?")])
def test_parse_of_a_page_with_no_sample_exits_2_in_one_line(tmp_path, body, looks):
    page = tmp_path / "page"
    page.write_bytes(body)
    for args in (["parse", str(page)], ["parse", str(page), "--json"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2
        assert result.output.count("\n") == 1 and looks in result.output, result.output[:500]


def test_an_html_page_answered_with_200_is_a_content_type_error_not_a_page():
    from tests.loopback import LoopbackServer, send

    with LoopbackServer(lambda h: send(h, HTML, content_type="text/html; charset=utf-8")) as server:
        result = CliRunner().invoke(main, ["parse", server.url])
    assert result.exit_code == 1
    assert "answered an HTML page (text/html; charset=utf-8): it is not a dcgm-exporter /metrics endpoint" \
        in result.output and result.output.count("\n") == 1


def test_a_page_that_declares_its_families_but_serves_no_sample_says_the_exporter_sees_no_gpu(tmp_path):
    # A real L4 page's HELP/TYPE lines without its samples: what dcgm-exporter serves when DCGM may watch no GPU
    # (GKE time-sharing, NVIDIA/dcgm-exporter issue 222). It is a dcgm-exporter page, not "not a metrics page".
    real = next(p for p in REAL_PAGES if "kops_l4" in p.name).read_text().splitlines()
    page = tmp_path / "declared.prom"
    page.write_text("".join(f"{line}\n" for line in real if line.startswith(("# HELP", "# TYPE"))))
    result = CliRunner().invoke(main, ["parse", str(page)])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "declares 23 families (DCGM_FI_DEV_SM_CLOCK," in result.output and "sees no GPU" in result.output
    assert "issue 222" in result.output and "not a metrics page" not in result.output
