"""bridge/data/fields.csv against NVIDIA's field table (issue 14).

Oracle: tests/data/go-dcgm_dcgm47-fields.csv, NVIDIA's field table as NVIDIA/go-dcgm carries it
(`pkg/dcgm/const_fields.go`, `dcgm_fields.h`): one row per field id, its DCGM 4.7 name, the older names of
the same id, and the header's description (with its unit; "Deprecated: Use X instead" where DCGM gave the
field a new id because its unit changed).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from bridge.fields import FieldSpec, default_table, parse_table
from bridge.samples import MetricKind

DATA = Path(__file__).parent / "data"
TABLE = DATA / "go-dcgm_dcgm47-fields.csv"

# Names no field table lists, each introduced by a release note of dcgm-exporter itself.
RELEASE_NOTE_NAMES = {
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": "dcgm-exporter 4.9.0 release notes (GPU memory from MiB to bytes)",
    "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND": "dcgm-exporter 4.10.0 release notes",
    "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND": "dcgm-exporter 4.10.0 release notes",
    "DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND": "dcgm-exporter 4.10.0 release notes",
    "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND": "dcgm-exporter 4.10.0 release notes",
}
# Names that were never anyone's: the suffix-style guesses issue 14 removed.
INVENTED = ["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_JOULES", "DCGM_FI_DEV_SM_CLOCK_HZ", "DCGM_FI_DEV_FB_USED_BYTES",
            "DCGM_FI_DEV_MEM_COPY_UTIL_RATIO", "DCGM_FI_DEV_POWER_USAGE_WATTS", "DCGM_FI_DEV_FB_FREE_BYTES",
            "DCGM_FI_DEV_FB_RESERVED_BYTES", "DCGM_FI_DEV_MEM_CLOCK_HZ"]
# Unit changes a new id stands for (its description says so), as scale factors old value -> new value.
_DEPRECATED = re.compile(r"Deprecated: Use (\w+) instead")


def nvidia_table() -> tuple[dict[str, str], dict[str, str]]:
    """(every name -> its DCGM 4.7 name, following "Deprecated: Use X" to the new id), (4.7 name -> description)."""
    with TABLE.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(ln for ln in f if not ln.startswith("#")))
    current: dict[str, str] = {}
    description = {row["dcgm47_name"]: row["description"] for row in rows}
    for row in rows:
        new = _DEPRECATED.search(row["description"])
        target = new.group(1) if new else row["dcgm47_name"]
        for name in [row["dcgm47_name"], *row["legacy_aliases_same_id"].split()]:
            current[name] = target
    return current, description


CURRENT, DESCRIPTION = nvidia_table()
ROWS: list[FieldSpec] = parse_table((Path(__file__).parents[1] / "bridge/data/fields.csv").read_text("utf-8"))


def test_the_table_is_nvidias() -> None:
    assert CURRENT["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"
    assert CURRENT["DCGM_FI_DEV_POWER_USAGE"] == "DCGM_FI_DEV_BOARD_POWER_WATTS"
    assert "joules" in DESCRIPTION["DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"]


@pytest.mark.parametrize("name", sorted({r.name for r in ROWS if r.name.startswith("DCGM_")}))
def test_every_name_is_nvidias_or_a_release_notes(name: str) -> None:
    assert name in CURRENT or name in RELEASE_NOTE_NAMES, f"{name}: in no NVIDIA table and no release note"


@pytest.mark.parametrize("name", INVENTED)
def test_invented_names_are_gone(name: str) -> None:
    assert name not in default_table().by_name
    assert name not in CURRENT


def old_to_new(new: str) -> float:
    """legacy value × this = DCGM 4.7 value, from the table's units: mJ -> J, MHz -> Hz, % -> ratio, MB/s -> B/s."""
    if new.endswith("_JOULES_TOTAL"):
        return 1e-3
    if new.endswith("_HERTZ"):
        return 1e6
    if new == "DCGM_FI_DEV_GPU_UTIL_RATIO":
        return 0.01  # the one legacy % field that became a ratio (4.9.0 notes); PROF ratios were always 0-1
    if new == "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL":
        return 1e6  # MB/s -> B/s (4.9.0 notes)
    return 1.0


@pytest.mark.parametrize("row", [r for r in ROWS if r.name in CURRENT and CURRENT[r.name] != r.name],
                         ids=lambda r: r.name)
def test_every_legacy_row_has_its_dcgm47_twin_with_the_same_report_value(row: FieldSpec) -> None:
    twin = default_table().by_name.get(CURRENT[row.name])
    assert twin is not None, f"{row.name}: no row for its DCGM 4.7 name {CURRENT[row.name]}"
    assert (twin.key, twin.unit, twin.kind, twin.level) == (row.key, row.unit, row.kind, row.level)
    # one legacy unit of the value is worth the same report value as its twin's
    assert old_to_new(twin.name) * twin.scale == pytest.approx(row.scale, rel=1e-12)


def test_the_energy_twin_is_in_joules_and_reports_megajoules() -> None:
    table = default_table()
    legacy, new = table.by_name["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"], table.by_name[
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"]
    assert legacy.unit == new.unit == "MJ" and new.kind is MetricKind.COUNTER
    assert 5e6 * legacy.scale == pytest.approx(5e3 * new.scale)  # 5e6 mJ == 5e3 J


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_the_dialect_column_agrees_with_the_table(row: FieldSpec) -> None:
    """`parse` says which exporters write a name; the table says whether the name is DCGM 4.7's."""
    if row.dialect == "1.x":
        assert row.name.startswith("dcgm_")
    elif row.dialect == "<=4.8":
        assert CURRENT[row.name] != row.name  # an older name of an id, or a deprecated id
    elif row.dialect in ("any", "4.9+"):
        assert CURRENT.get(row.name) == row.name or row.name in RELEASE_NOTE_NAMES
    elif row.dialect == "<=4.9":
        assert CURRENT[row.name] == row.name and row.name + "_PER_SECOND" in RELEASE_NOTE_NAMES
    else:
        assert row.dialect == "4.10+" and row.name in RELEASE_NOTE_NAMES
