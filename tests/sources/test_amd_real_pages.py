"""The real device-metrics-exporter output in tests/data/amd/ (each file's first line names its source: an issue or
PR of ROCm/device-metrics-exporter, its docs, or silogen/kaiwo), read by `dcgm-bridge parse` into the GPUs,
partitions and values it holds. The expected values come from the file's text through the test's own reader."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bridge.cli import main

DATA = Path(__file__).parents[1] / "data" / "amd"
LINE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def lines_of(name: str) -> list[tuple[str, dict[str, str], float]]:
    """(family, labels, value) of each sample line, by the test's own regular expressions."""
    out = []
    for line in (DATA / name).read_text().splitlines():
        match = LINE.match(line)
        if match:
            out.append((match.group(1), dict(LABEL.findall(match.group(2))), float(match.group(3))))
    return out


def parsed(name: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["parse", "--json", str(DATA / name)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def parse_text(name: str) -> str:
    result = CliRunner().invoke(main, ["parse", str(DATA / name)])
    assert result.exit_code == 0, result.output
    return result.output


def test_every_file_names_its_source_on_its_first_line() -> None:
    files = sorted(DATA.glob("*.txt"))
    assert len(files) == 12
    for path in files:
        assert path.read_text().startswith("# source: "), path.name


def test_a_mi300x_vf_with_an_empty_serial_is_named_by_its_device_uuid() -> None:
    name = "device-metrics-exporter_issue171_mi300x-vf_edge-temperature.txt"
    [(_, labels, value)] = lines_of(name)
    [gpu] = parsed(name)["gpus"]
    assert labels["serial_number"] == "" and gpu["gpu_uuid"] == labels["gpu_uuid"]
    assert gpu["gpu_model_name"] == labels["card_series"] and gpu.get("gpu_instance_id") is None
    assert gpu["telemetry_data"] == {"amd_edge_temperature": value}


def test_the_amd_prefix_is_read_and_a_vf_with_a_zero_uuid_falls_back_to_host_and_gpu_id() -> None:
    name = "device-metrics-exporter_issue233_mi300x-vf_amd-prefix_gfx-activity.txt"
    [(family, labels, value)] = lines_of(name)
    assert family.startswith("amd_") and labels["gpu_uuid"].strip("0-") == ""
    assert labels["gpu_partition_id"] == "4294967295"
    out = parsed(name)
    [gpu] = out["gpus"]
    assert gpu["gpu_uuid"] == f"unknown:{labels['hostname']}:{labels['gpu_id']}"
    assert gpu.get("gpu_instance_id") is None  # UINT32_MAX names no partition
    assert gpu["telemetry_data"] == {"amd_gfx_activity": value}
    assert out["families"][family]["dialect"] == "amd"


def test_a_rocm7_mi300x_is_named_by_its_serial_with_an_na_partition_not_a_partition() -> None:
    name = "device-metrics-exporter_pr236_mi300x-oam_rocm7_gfx-activity.txt"
    [(_, labels, value)] = lines_of(name)
    [gpu] = parsed(name)["gpus"]
    assert gpu["gpu_uuid"] == labels["serial_number"] and gpu.get("gpu_instance_id") is None
    assert gpu["gpu_model_name"] == labels["card_series"]  # card_model holds the part number
    assert gpu["hostname"] == labels["hostname"] and gpu["telemetry_data"] == {"amd_gfx_activity": value}


def test_a_cpx_partition_of_an_unmapped_family_is_shown_as_a_partition_of_its_package() -> None:
    name = "device-metrics-exporter_pr316_mi300x-cpx_pcie-tx.txt"
    [(family, labels, value)] = lines_of(name)
    text = parse_text(name)
    assert f"not mapped, forwarded only (1): {family}" in text and ", 0 GPUs" in text
    assert (f"GPU {labels['gpu_id']} {labels['serial_number']} partition {labels['gpu_partition_id']} (cpx) "
            f"{labels['card_model']} host={labels['hostname']}") in text
    assert re.search(rf"^ +{family} +{value:g}$", text, re.M)


def test_an_apu_without_serial_or_model_reads_its_package_power() -> None:
    name = "device-metrics-exporter_issue353_ryzen-apu_package-power.txt"
    [(_, labels, value)] = lines_of(name)
    [gpu] = parsed(name)["gpus"]
    assert gpu["gpu_uuid"] == f"unknown:{labels['hostname']}:0" and gpu.get("gpu_model_name") is None
    assert gpu.get("gpu_instance_id") is None  # partition type "none" is not a partitioned package
    assert gpu["telemetry_data"] == {"amd_power": value}


def test_a_page_of_the_node_count_alone_exits_2_naming_what_it_saw() -> None:
    name = "device-metrics-exporter_pr367_k8s_amd-prefix_nodes-total.txt"
    [(family, _labels, value)] = lines_of(name)
    result = CliRunner().invoke(main, ["parse", str(DATA / name)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert "none of them GPU telemetry" in result.output and family in result.output
    assert f"counts {value:g} GPUs" in result.output


def test_the_2026_bare_metal_page_without_gpu_uuid_gives_both_gpus_power() -> None:
    name = "device-metrics-exporter_pr558_mi300x_rocm7.14_amd-prefix_package-power.txt"
    rows = lines_of(name)
    assert all("gpu_uuid" not in labels and labels["deployment_mode"] == "baremetal" for _, labels, _ in rows)
    gpus = parsed(name)["gpus"]
    assert len(gpus) == len(rows) == 2
    for gpu, (_, labels, value) in zip(gpus, rows, strict=True):
        # the serials were redacted to "xxxx" by the poster: they name no board, host + gpu_id do
        assert gpu["gpu_uuid"] == f"unknown:{labels['hostname']}:{labels['gpu_id']}"
        assert gpu["gpu_index"] == int(labels["gpu_id"]) and gpu.get("gpu_instance_id") is None
        assert gpu["gpu_model_name"] == labels["card_model"]
        assert gpu["telemetry_data"] == {"amd_power": value}
    assert "2 GPUs" in parse_text(name) and "partition" not in parse_text(name)


def test_the_early_slurm_label_scheme_names_its_gpu_by_serial() -> None:
    name = "device-metrics-exporter_pr16_mi300x_slurm_ecc-mpio.txt"
    [(family, labels, value)] = lines_of(name)
    text = parse_text(name)
    assert f"GPU 0 {labels['serial_number']} {labels['card_series']} host={labels['hostname']}" in text
    assert re.search(rf"^ +{family} +{value:g}$", text, re.M)


def test_the_docs_clock_example_lists_each_gpu_and_clock() -> None:
    name = "device-metrics-exporter_docs_metricslist_clock.txt"
    rows = lines_of(name)
    text = parse_text(name)
    for _, labels, value in rows:
        assert f"GPU {labels['gpu_id']} unknown:xxxx:{labels['gpu_id']} (no model name)" in text
        assert re.search(rf"gpu_clock\{{clock_index={labels['clock_index']},clock_type={labels['clock_type']}\}} +"
                         rf"{value:,.6g}$", text, re.M)


def test_the_docs_xgmi_example_lists_every_link_of_its_gpu() -> None:
    name = "device-metrics-exporter_docs_metricslist_xgmi.txt"
    rows = lines_of(name)
    text = parse_text(name)
    assert text.count("GPU 0 unknown:xxxx:0") == 1 and len(rows) == 16
    for family, labels, value in rows:
        assert re.search(rf"{family}\{{link_index={labels['link_index']}\}} +{re.escape(f'{value:,.6g}')}$", text, re.M)


def test_a_consumer_cards_zero_energy_is_read_and_warned_as_unsupported() -> None:
    name = "device-metrics-exporter_issue259_rx7900xtx_partial.txt"
    rows = {family: (labels, value) for family, labels, value in lines_of(name)}
    labels, energy = rows["gpu_energy_consumed"]
    out = parsed(name)
    [gpu] = out["gpus"]
    assert energy == 0 and gpu["telemetry_data"] == {"amd_energy_consumption": 0.0}
    assert gpu["gpu_uuid"] == f"unknown:{labels['hostname']}:0" and gpu.get("gpu_instance_id") is None
    assert any("not supported" in w for w in out["warnings"])
    assert set(out["unmapped"]) == {"gpu_free_gtt", "gpu_free_visible_vram", "gpu_free_vram"}
    text = parse_text(name)
    for family in ("gpu_free_gtt", "gpu_free_visible_vram", "gpu_free_vram"):
        assert re.search(rf"^ +{family} +{rows[family][1]:,.6g}$", text, re.M)


def test_lines_back_from_prometheus_keep_the_gpus_and_the_cpx_partition() -> None:
    name = "kaiwo_mi300x_gfx-activity_via-prometheus.txt"
    rows = lines_of(name)
    out = parsed(name)
    gpus = {(g["gpu_uuid"], g.get("gpu_instance_id")): g for g in out["gpus"]}
    assert len(gpus) == 3
    for _, labels, value in rows:
        partition = labels["gpu_partition_id"] if labels["gpu_compute_partition_type"] == "cpx" else None
        gpu = gpus[(labels["serial_number"], partition)]
        assert gpu["telemetry_data"] == {"amd_gfx_activity": value} and gpu["hostname"] == labels["hostname"]
    workload = gpus[(rows[2][1]["serial_number"], None)]
    assert workload["pod_name"] == "high-utilization-57ls6" and workload["namespace"] == "default"
    assert "3 GPUs (1 partition)" in parse_text(name)


@pytest.mark.parametrize("prefix", ["", "amd_"])
def test_a_page_of_another_vendors_families_exits_2_listing_them(prefix: str, tmp_path: Path) -> None:
    page = tmp_path / "other.prom"
    page.write_text(f"# TYPE {prefix}node_cpu_seconds_total counter\n{prefix}node_cpu_seconds_total{{cpu=\"0\"}} 12\n"
                    "process_open_fds 9\n")
    result = CliRunner().invoke(main, ["parse", str(page)])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert f"saw {prefix}node_cpu_seconds_total, process_open_fds" in result.output
