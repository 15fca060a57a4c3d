"""`dcgm-bridge parse` names the dialect of every family and the families it does not map; custom-metrics CSVs
naming DCGM 4.7 fields work like the defaults (issue 14 items 4 and 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.fields import default_table, dialect_summary, parse_custom_metrics

UUID = "GPU-00000000-0000-0000-0000-000000000000"
LABELS = f'gpu="0",UUID="{UUID}",modelName="NVIDIA H100 80GB HBM3",hostname="n",DCGM_FI_SYSTEM_DRIVER_VERSION="580"'


def run(*args: str) -> str:
    result = CliRunner().invoke(main, ["parse", *args])
    assert result.exit_code == 0, result.output
    return result.output


def write_page(tmp_path: Path, lines: dict[str, float]) -> Path:
    path = tmp_path / "page.txt"
    path.write_text("".join(f"{name}{{{LABELS}}} {value}\n" for name, value in lines.items()))
    return path


PAGE = {
    "DCGM_FI_DEV_BOARD_POWER_WATTS": 412.5,
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": 123456.0,
    "DCGM_FI_DEV_FB_USED": 1024,
    "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND": 2e6,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123456000,
    "dcgm_gpu_temp": 40,
    "DCGM_FI_DEV_NVLINK_TX_THROUGHPUT_TOTAL": 5,
    "DCGM_FI_DEV_SM_APP_CLOCK_HERTZ": 1.41e9,
}


def test_parse_prints_the_dialect_of_every_family_and_the_unmapped_ones(tmp_path: Path) -> None:
    out = run(str(write_page(tmp_path, PAGE)))
    text = " ".join(out.split())
    assert ("dcgm-exporter 4.9+ (DCGM 4.7 name): DCGM_FI_DEV_BOARD_POWER_WATTS, "
            "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL") in text
    assert "every dcgm-exporter: DCGM_FI_DEV_FB_USED" in text
    assert "dcgm-exporter 4.10+: DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND" in text
    assert "dcgm-exporter <= 4.8: DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in text
    assert "1.x / -o name: dcgm_gpu_temp" in text
    assert ("not mapped, forwarded only (2): DCGM_FI_DEV_NVLINK_TX_THROUGHPUT_TOTAL, "
            "DCGM_FI_DEV_SM_APP_CLOCK_HERTZ") in text
    assert all(len(line) <= 80 for line in out.splitlines() if not line.startswith("/"))


def test_parse_json_has_the_dialects_and_the_unmapped_families(tmp_path: Path) -> None:
    out = json.loads(run("--json", str(write_page(tmp_path, PAGE))))
    assert out["families"]["DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"] == {"dialect": "4.9+",
                                                                      "key": "nvidia_energy_consumption"}
    assert out["families"]["dcgm_gpu_temp"]["dialect"] == "1.x"
    assert out["unmapped"] == ["DCGM_FI_DEV_NVLINK_TX_THROUGHPUT_TOTAL", "DCGM_FI_DEV_SM_APP_CLOCK_HERTZ"]
    assert out["warnings"] == []


def test_parse_warns_of_a_ratio_above_one(tmp_path: Path) -> None:
    out = run(str(write_page(tmp_path, {"DCGM_FI_DEV_GPU_UTIL_RATIO": 87})))
    assert "warning: DCGM_FI_DEV_GPU_UTIL_RATIO = 87" in " ".join(out.split())


def test_openmetrics_total_suffix_counts_as_its_family() -> None:
    summary = dialect_summary(["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"], default_table())
    assert summary.mapped == {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total": ("<=4.8", "nvidia_energy_consumption")}


CUSTOM = """\
# DCGM 4.7 fields (NVIDIA/go-dcgm dcgm_fields.h), as a dcgm-exporter 4.9+ user writes them
DCGM_FI_DEV_SM_APP_CLOCK_HERTZ, gauge, SM application clock target (in MHz).
DCGM_FI_PROF_IMMA_UTIL_RATIO, gauge, Ratio of cycles the tensor (IMMA) pipe is active.
DCGM_FI_DEV_BAR1_USED_BYTES, gauge, Used BAR1 of the GPU (in bytes).
DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS, gauge, Slowdown temperature.
DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL, counter, Total energy (in mJ).
"""


def test_a_custom_metrics_csv_naming_dcgm47_fields_takes_the_unit_from_the_name() -> None:
    specs = {s.name: s for s in parse_custom_metrics(CUSTOM, "custom.csv", default_table())}
    units = {name: (spec.unit, spec.scale) for name, spec in specs.items()}
    assert units["DCGM_FI_DEV_SM_APP_CLOCK_HERTZ"] == ("MHz", 1e-6)  # the name's Hz, not the help's "(in MHz)"
    assert units["DCGM_FI_PROF_IMMA_UTIL_RATIO"] == ("%", 100.0)
    assert units["DCGM_FI_DEV_BAR1_USED_BYTES"] == ("GB", 1e-9)
    assert specs["DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS"].unit == "°C"
    assert "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL" not in specs  # a default row: its mapping (J) stands
    assert {s.dialect for s in specs.values()} == {"custom"}


def test_parse_with_a_custom_metrics_csv_of_dcgm47_fields(tmp_path: Path) -> None:
    csv = tmp_path / "custom.csv"
    csv.write_text(CUSTOM)
    page = write_page(tmp_path, {"DCGM_FI_DEV_SM_APP_CLOCK_HERTZ": 1.41e9, "DCGM_FI_PROF_IMMA_UTIL_RATIO": 0.25,
                                 "DCGM_FI_DEV_BAR1_USED_BYTES": 5e8, "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": 2e6})
    out = json.loads(run("--json", "--metrics-csv", str(csv), str(page)))
    (gpu,) = out["gpus"]
    data = gpu["telemetry_data"]
    assert data["nvidia_sm_app_clock_hertz"] == pytest.approx(1410.0)
    assert data["nvidia_imma_util_ratio"] == pytest.approx(25.0)
    assert data["nvidia_bar1_used_bytes"] == pytest.approx(0.5)
    assert data["nvidia_energy_consumption"] == pytest.approx(2.0)
    assert out["families"]["DCGM_FI_PROF_IMMA_UTIL_RATIO"]["dialect"] == "custom" and out["unmapped"] == []
