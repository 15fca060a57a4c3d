"""Issue 14 acceptance: the names dcgm-exporter 4.9 / 4.10 ship give the same report as the legacy names.

1. Every real page in tests/data/ with legacy names, rewritten into its dcgm-exporter 4.9 twin by NVIDIA's
   field table (tests/data/go-dcgm_dcgm47-fields.csv: renamed, values converted to the new units,
   `Hostname` -> `hostname`, the driver label renamed), gives every GPU the same report values through
   `dcgm-bridge parse --json` (relative 1e-9).
2. The simulator in every dialect gives the same energy (to the model's ground truth) and the same keys.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.fields import is_blank_value
from tests.conftest import REAL_PAGES
from tests.test_fields_dcgm47 import CURRENT, old_to_new

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{.*\})?(\s+)(\S+)(.*)$")
_META = re.compile(r"^(# (?:HELP|TYPE) )(\S+)(.*)$")


def dcgm49_twin(text: str) -> str:
    """A legacy page as dcgm-exporter 4.9 writes it: DCGM 4.7 names and units, 4.9's label names."""
    out = []
    for line in text.splitlines():
        meta = _META.match(line)
        if meta:
            out.append(meta.group(1) + CURRENT.get(meta.group(2), meta.group(2)) + meta.group(3))
            continue
        sample = _SAMPLE.match(line)
        if line.startswith("#") or not sample:
            out.append(line)
            continue
        name, labels, space, value, rest = sample.groups()
        new = CURRENT.get(name, name)
        labels = (labels or "").replace('Hostname="', 'hostname="').replace(
            'DCGM_FI_DRIVER_VERSION="', 'DCGM_FI_SYSTEM_DRIVER_VERSION="')
        if new != name and not is_blank_value(float(value)):  # DCGM's blank sentinels are no unit's values
            value = repr(float(value) * old_to_new(new))
        out.append(f"{new}{labels}{space}{value}{rest}")
    return "\n".join(out) + "\n"


def parse_json(path: Path, *extra: str) -> dict:
    result = CliRunner().invoke(main, ["parse", "--json", *extra, str(path)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


LEGACY_PAGES = [p for p in REAL_PAGES if dcgm49_twin(p.read_text()) != p.read_text()]


def test_the_real_pages_have_legacy_names() -> None:
    assert len(LEGACY_PAGES) >= 5


@pytest.mark.parametrize("path", LEGACY_PAGES, ids=lambda p: p.stem)
def test_a_real_pages_dcgm49_twin_gives_every_gpu_the_same_report_values(path: Path, tmp_path: Path) -> None:
    twin = tmp_path / "twin.txt"
    twin.write_text(dcgm49_twin(path.read_text()))
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" not in twin.read_text()
    before, after = parse_json(path)["gpus"], parse_json(twin)["gpus"]
    assert len(after) == len(before) > 0
    for old, new in zip(before, after, strict=True):
        identity = ("gpu_uuid", "gpu_instance_id", "hostname")
        assert [new.get(k) for k in identity] == [old.get(k) for k in identity]
        assert set(new["telemetry_data"]) == set(old["telemetry_data"])
        for key, value in old["telemetry_data"].items():
            assert new["telemetry_data"][key] == pytest.approx(value, rel=1e-9), key


# -- the simulator in every dialect -----------------------------------------------------------------
S = 1_000_000_000
START = 1_800_000_000 * S
END = START + 20 * S


def _report_of_dialect(dialect: str) -> tuple[float, float, set[str]]:
    """(reported energy J, ground truth J, report keys) for 20 s of 3 Hz scrapes of a seeded simulator."""
    from bridge.fields import default_table
    from bridge.normalize import Normalizer
    from bridge.parse import parse_page
    from bridge.report import build_report
    from bridge.report.window import explicit_window
    from bridge.simulator.config import SimulatorConfig
    from bridge.simulator.model import NodeModel
    from bridge.simulator.render import render_page

    model = NodeModel(SimulatorConfig(gpus=2, seed=5, dialect=dialect, boot_ns=START - 3600 * S), now_ns=lambda: START)
    normalizer, rng, records = Normalizer(default_table()), random.Random(5), []
    t = START - 300_000_000
    while t <= END + 700_000_000:
        records += normalizer.records(parse_page(render_page(model, t)), source_url="sim:9400", timestamp_ns=t)
        t += 333_000_000 + rng.randrange(-20_000_000, 20_000_000)
    built = build_report(records, window=explicit_window(START, END, 666_000_000))
    assert built.energy.total_energy_j is not None
    truth = model.energy_joules(0, START, END) + model.energy_joules(1, START, END)
    return built.energy.total_energy_j, truth, {k for r in records for k in r.telemetry_data}


def test_every_dialect_gives_the_same_energy_to_ground_truth_and_the_same_keys() -> None:
    from bridge.simulator.config import AMD_DIALECTS, DIALECT_NAMES

    legacy_energy, _, legacy_keys = _report_of_dialect("legacy")
    for dialect in ("dcgm49", "dcgm410", *(d for d in DIALECT_NAMES if d not in AMD_DIALECTS)):  # amd: amd_* keys
        energy, truth, keys = _report_of_dialect(dialect)
        assert abs(energy / truth - 1) < 0.005, dialect
        assert energy == pytest.approx(legacy_energy, rel=1e-9), dialect
        if dialect in ("dcgm49", "dcgm410"):  # FB capacity is a 4.9+ field; nothing else differs
            assert keys - {"nvidia_fb_capacity"} == legacy_keys, dialect
        elif dialect != "old-namespace":  # -o's 1.x file has 16 of the families
            assert keys == legacy_keys, dialect


def test_a_fleet_of_48_and_410_nodes_gives_one_report_with_the_same_keys_and_units() -> None:
    from bridge.fields import default_table
    from bridge.normalize import Normalizer
    from bridge.parse import parse_page
    from bridge.report import build_report
    from bridge.report.window import explicit_window
    from bridge.simulator.config import SimulatorConfig
    from bridge.simulator.model import NodeModel
    from bridge.simulator.render import render_page

    nodes = {"node-48:9400": "current", "node-410:9400": "dcgm410"}
    normalizer, records = Normalizer(default_table()), []
    for seed, (endpoint, dialect) in enumerate(nodes.items()):
        model = NodeModel(SimulatorConfig(gpus=2, seed=seed, dialect=dialect, hostname=endpoint.split(":")[0],
                                          boot_ns=START - 3600 * S), now_ns=lambda: START)
        for step in range(8):
            t = START + step * S
            records += normalizer.records(parse_page(render_page(model, t)), source_url=f"http://{endpoint}/metrics",
                                          timestamp_ns=t)
    built = build_report(records, window=explicit_window(START, START + 7 * S, 0))
    endpoints = built.telemetry_data["endpoints"]
    assert set(endpoints) == set(nodes)
    shapes = {endpoint: {(key, m.get("unit")) for gpu in data["gpus"].values() for key, m in gpu["metrics"].items()
                         if key != "nvidia_fb_capacity"}  # a field only 4.9+ collects by default
              for endpoint, data in endpoints.items()}
    assert shapes["node-48:9400"] == shapes["node-410:9400"]
    assert ("nvidia_energy_consumption", "MJ") in shapes["node-410:9400"], sorted(shapes["node-410:9400"])[:3]
