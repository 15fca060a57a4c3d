"""The dashboards and provisioning files as files: schema, ids, grid, variables, datasources.

No store needed. The per-query tests (test_dashboard_queries.py) run every query on real data.
"""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
DASHBOARD_FILES = sorted((GRAFANA / "dashboards").glob("*.json"))
CORE_PANEL_TYPES = {"timeseries", "stat", "table", "bargauge", "gauge", "text", "row"}
DEPRECATED_PANEL_TYPES = {"graph", "singlestat", "table-old", "grafana-piechart-panel", "graph-old"}
# Grafana's own variables (docs "Global variables"), and `$1`-style back-references of label_replace.
GLOBAL_VARIABLES = {"__interval", "__interval_ms", "__rate_interval", "__rate_interval_ms", "__range", "__range_s",
                    "__range_ms", "__from", "__to", "__dashboard", "__org", "__user", "__name", "timeFilter"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\[\[(\w+)(?::\w+)?\]\]|\$(\w+)")

# The classic dashboard model as Grafana's dashboard kind (schema v0, kinds/dashboard) states it,
# narrowed to what a current Grafana (10.4-13) renders without a migration: core panel types, field
# config in `fieldConfig`, datasources as {type, uid} references.
DATASOURCE_REF = {"type": "object", "required": ["type", "uid"],
                  "properties": {"type": {"type": "string"}, "uid": {"type": "string", "minLength": 1}}}
GRID_POS = {
    "type": "object", "required": ["h", "w", "x", "y"], "additionalProperties": False,
    "properties": {"h": {"type": "integer", "minimum": 1}, "w": {"type": "integer", "minimum": 1, "maximum": 24},
                   "x": {"type": "integer", "minimum": 0, "maximum": 23}, "y": {"type": "integer", "minimum": 0}},
}
TARGET = {
    "type": "object", "required": ["refId", "expr", "datasource"],
    "properties": {"refId": {"type": "string", "pattern": "^[A-Z]$"}, "expr": {"type": "string", "minLength": 1},
                   "datasource": DATASOURCE_REF, "legendFormat": {"type": "string"},
                   "instant": {"type": "boolean"}, "range": {"type": "boolean"},
                   "format": {"enum": ["time_series", "table", "heatmap"]}},
}
PANEL = {
    "type": "object", "required": ["id", "type", "title", "gridPos"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": sorted(CORE_PANEL_TYPES)},
        "title": {"type": "string", "minLength": 1},
        "gridPos": GRID_POS,
    },
    "if": {"properties": {"type": {"const": "row"}}},
    "then": {"required": ["collapsed", "panels"],
             "properties": {"collapsed": {"type": "boolean"}, "panels": {"type": "array", "maxItems": 0}}},
    "else": {
        "required": ["datasource", "targets", "fieldConfig", "options"],
        "properties": {
            "datasource": DATASOURCE_REF,
            "targets": {"type": "array", "minItems": 1, "items": TARGET},
            "fieldConfig": {"type": "object", "required": ["defaults", "overrides"],
                            "properties": {"defaults": {"type": "object"},
                                           "overrides": {"type": "array", "items": {
                                               "type": "object", "required": ["matcher", "properties"]}}}},
            "options": {"type": "object"},
            "transformations": {"type": "array", "items": {"type": "object", "required": ["id", "options"]}},
        },
    },
}
VARIABLE = {
    "type": "object", "required": ["type", "name"],
    "properties": {
        "type": {"enum": ["query", "adhoc", "constant", "datasource", "interval", "textbox", "custom", "groupby"]},
        "name": {"type": "string", "pattern": r"^\w+$"},
        "refresh": {"enum": [0, 1, 2]},
        "multi": {"type": "boolean"}, "includeAll": {"type": "boolean"},
    },
    "if": {"properties": {"type": {"const": "query"}}},
    "then": {"required": ["datasource", "query", "definition", "refresh"],
             "properties": {"datasource": DATASOURCE_REF, "refresh": {"const": 2}}},
}
ANNOTATION = {
    "type": "object", "required": ["name", "datasource", "enable", "iconColor"],
    "properties": {"name": {"type": "string"}, "enable": {"type": "boolean"}, "iconColor": {"type": "string"},
                   "datasource": DATASOURCE_REF},
}
DASHBOARD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "editable", "graphTooltip", "time", "panels", "templating",
                 "annotations"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "id": {"type": "null"},  # an exported dashboard carries no instance-local id
        "schemaVersion": {"type": "integer", "minimum": 39},
        "editable": {"type": "boolean"},
        "graphTooltip": {"enum": [0, 1, 2]},
        "time": {"type": "object", "required": ["from", "to"]},
        "refresh": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "panels": {"type": "array", "minItems": 1, "items": PANEL},
        "templating": {"type": "object", "required": ["list"],
                       "properties": {"list": {"type": "array", "items": VARIABLE}}},
        "annotations": {"type": "object", "required": ["list"],
                        "properties": {"list": {"type": "array", "items": ANNOTATION}}},
    },
}


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_generate", GRAFANA / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def queries(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, text) of every string Grafana interpolates: panel queries, variable queries, annotations."""
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
            yield f"panel {panel['title']!r} {target['refId']} legend", target.get("legendFormat", "")
    for variable in doc["templating"]["list"]:
        if variable["type"] == "query":
            yield f"variable {variable['name']}", variable["definition"]
    for annotation in doc["annotations"]["list"]:
        if "expr" in annotation:
            yield f"annotation {annotation['name']}", annotation["expr"]


@pytest.fixture(params=DASHBOARD_FILES, ids=[p.stem for p in DASHBOARD_FILES])
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load(request.param)


def test_there_are_the_two_dashboards():
    assert [p.name for p in DASHBOARD_FILES] == ["benchmark-run.json", "gpu-fleet.json"]


def test_the_committed_dashboards_are_what_the_generator_writes():
    for name, text in generator().outputs().items():
        assert (GRAFANA / "dashboards" / name).read_text(encoding="utf-8") == text, \
            f"{name} differs from grafana/generate.py's output: run `python grafana/generate.py`"


def test_a_dashboard_is_valid_for_the_current_grafana_schema(dashboard):
    jsonschema.validate(dashboard, DASHBOARD_SCHEMA)


def test_no_panel_uses_a_deprecated_type(dashboard):
    types = {p["type"] for p in dashboard["panels"]}
    assert types <= CORE_PANEL_TYPES and not types & DEPRECATED_PANEL_TYPES


def test_panel_ids_are_unique(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_grid_positions_fit_the_24_columns_and_never_overlap(dashboard):
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in taken, f"{panel['title']!r} overlaps {taken[(x, y)]!r} at {(x, y)}"
                taken[(x, y)] = panel["title"]


def test_rows_span_the_width_and_panels_below_a_row_start_under_it(dashboard):
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    assert rows, "panels are grouped in rows"
    for row in rows:
        assert row["gridPos"]["w"] == 24 and row["gridPos"]["x"] == 0 and row["gridPos"]["h"] == 1


def test_every_variable_a_query_uses_is_defined(dashboard):
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    order = [v["name"] for v in dashboard["templating"]["list"]]
    for where, text in queries(dashboard):
        for match in _VARIABLE.finditer(text):
            name = next(g for g in match.groups() if g)
            if name.isdigit() or name in GLOBAL_VARIABLES:
                continue
            assert name in defined, f"{where} uses ${name}, which is not defined"
            if where.startswith("variable "):
                own = where.split()[1]
                assert order.index(name) < order.index(own), f"${own} uses ${name}, defined after it"


def test_every_panel_and_target_uses_the_datasource_variable(dashboard):
    variable = next(v for v in dashboard["templating"]["list"] if v["type"] == "datasource")
    assert variable["name"] == "datasource" and variable["query"] == "prometheus"
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == ref, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == ref, (panel["title"], target["refId"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == ref, variable["name"]
    for annotation in dashboard["annotations"]["list"]:
        if not annotation.get("builtIn"):
            assert annotation["datasource"] == ref, annotation["name"]


def test_ref_ids_are_unique_within_a_panel(dashboard):
    for panel in dashboard["panels"]:
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


def test_every_query_reads_the_recorded_series_only(dashboard):
    """The dialects, units, host labels, `_total` and MIG are the rules' business (grafana/rules.py): a panel
    that named an exporter family would go empty on the dialects it does not name."""
    recorded = set(generator().rules.record_names())
    for where, text in queries(dashboard):
        assert not re.search(r"\b(DCGM_FI_|dcgm_)\w+", text.replace("dcgm_bridge:", "")), where
        for name in re.findall(r"dcgm_bridge:\w+", text):
            assert name in recorded, f"{where}: {name} is not a recorded series"


def test_hosts_are_told_apart_by_the_node_name_never_by_instance(dashboard):
    for where, text in queries(dashboard):
        assert not re.search(r"\binstance\b", text), where
        assert not re.search(r"\b[Hh]ostname\b", text), f"{where}: the rules' `host` label, not the exporter's"


def test_panel_queries_are_short_enough_to_read_and_edit():
    """Issue 17: the median panel query at most 200 characters, none over 600 (they were ~850 and 1,705
    when every query carried the dialect handling itself)."""
    lengths = sorted(len(target["expr"]) for path in DASHBOARD_FILES for panel in load(path)["panels"]
                     for target in panel.get("targets", []))
    assert len(lengths) > 40
    assert statistics.median(lengths) <= 200, statistics.median(lengths)
    assert lengths[-1] <= 600, lengths[-1]


def test_every_graph_query_names_its_series(dashboard):
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            if panel["type"] in ("timeseries", "bargauge", "stat"):
                assert target["legendFormat"] not in ("", "__auto"), (panel["title"], target["refId"])


def test_the_fleet_dashboard_needs_no_run_labels():
    """It reads dcgm-exporter scraped directly; grouping by `phase` (absent there) only keeps forwarded
    phases apart when a sidecar's data is in the same store."""
    fleet = load(GRAFANA / "dashboards" / "gpu-fleet.json")
    for where, text in queries(fleet):
        assert not re.search(r"(run_id|phase)\s*(=|!=|=~|!~)", text) and "$run_id" not in text, where


def test_the_run_dashboard_has_the_issues_variables_and_panels():
    run = load(GRAFANA / "dashboards" / "benchmark-run.json")
    assert [v["name"] for v in run["templating"]["list"]] == ["datasource", "run_id", "phase", "host", "gpu"]
    titles = {p["title"] for p in run["panels"]}
    assert {"Utilisation", "Power per GPU", "Total power", "Energy in the selected range", "Temperature",
            "Memory used", "SM clock", "Tensor pipe active", "PCIe throughput", "NVLink traffic", "Throttling",
            "XID errors", "Per phase"} <= titles
    xid = next(p for p in run["panels"] if p["title"] == "XID errors")
    assert xid["type"] == "table"
    energy = next(p for p in run["panels"] if p["title"] == "Energy in the selected range")
    units = {energy["fieldConfig"]["defaults"]["unit"]} | {
        prop["value"] for o in energy["fieldConfig"]["overrides"] for prop in o["properties"]}
    assert units == {"joule", "kwatth"}


def test_the_provisioning_files_point_at_the_dashboards_and_a_prometheus_datasource():
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "dcgm-bridge.yaml").read_text())
    assert provider["apiVersion"] == 1
    (entry,) = provider["providers"]
    assert entry["type"] == "file" and entry["options"]["path"]
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "dcgm-bridge.yaml").read_text())
    assert datasources["apiVersion"] == 1
    assert datasources["datasources"] and all(d["type"] == "prometheus" for d in datasources["datasources"])
    uids = [d["uid"] for d in datasources["datasources"]]
    assert len(uids) == len(set(uids))
    for ds in datasources["datasources"]:
        assert ds["url"].startswith("http") and ds["jsonData"]["timeInterval"]
