"""Writes grafana/dashboards/*.json from the panel definitions below (python grafana/generate.py).

The JSON files are what users import; this script is how they are kept consistent (the same query
patterns in every panel, ids and grid positions assigned in one place). tests/grafana checks that
the committed files equal this script's output, so edit here and regenerate.

Grafana "classic" dashboard model, schemaVersion 41 (Grafana 12; Grafana 10.4-11 load it as well,
13 migrates it), core panel types only: timeseries, stat, table, bargauge, row.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rules  # noqa: E402 - the sibling module, found through the path set above
from promql import GPU, Scope  # noqa: E402 - the sibling module, found through the path set above

DASHBOARDS = Path(__file__).resolve().parent / "dashboards"
RULES = Path(__file__).resolve().parent / "rules" / "dcgm-bridge.rules.yml"
SCHEMA_VERSION = 41
DS = {"type": "prometheus", "uid": "${datasource}"}
GPU_LEGEND = "{{host}} gpu {{gpu}}"
INSTANCE_LEGEND = "{{host}} gpu {{slot}}"


# -- panels ------------------------------------------------------------------------------------------
def target(expr: str, ref: str = "A", legend: str = "", *, instant: bool = False,
           table: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "datasource": DS,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
        "refId": ref,
    }
    if table:
        out["format"] = "table"
    return out


def _defaults(unit: str, *, min_: float | None = None, max_: float | None = None,
              decimals: int | None = None, thresholds: list[tuple[str, float | None]] | None = None) -> dict[str, Any]:
    steps = [{"color": color, "value": value} for color, value in (thresholds or [("green", None)])]
    out: dict[str, Any] = {"unit": unit, "color": {"mode": "palette-classic"}, "mappings": [],
                           "thresholds": {"mode": "absolute", "steps": steps}}
    if min_ is not None:
        out["min"] = min_
    if max_ is not None:
        out["max"] = max_
    if decimals is not None:
        out["decimals"] = decimals
    return out


def timeseries(title: str, description: str, targets: list[dict[str, Any]], unit: str, *,
               min_: float | None = None, max_: float | None = None, stack: bool = False) -> dict[str, Any]:
    defaults = _defaults(unit, min_=min_, max_=max_)
    defaults["custom"] = {
        "drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if stack else 0, "showPoints": "never",
        "spanNulls": False, "axisPlacement": "auto", "lineInterpolation": "linear",
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    return {
        "type": "timeseries", "title": title, "description": description, "datasource": DS,
        "targets": targets, "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"showLegend": True, "displayMode": "table", "placement": "bottom",
                       "calcs": ["mean", "max", "lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(title: str, description: str, targets: list[dict[str, Any]], unit: str, *,
         decimals: int | None = None, thresholds: list[tuple[str, float | None]] | None = None,
         overrides: list[dict[str, Any]] | None = None, no_value: str | None = None) -> dict[str, Any]:
    defaults = _defaults(unit, decimals=decimals, thresholds=thresholds)
    if no_value is not None:
        defaults["noValue"] = no_value
    return {
        "type": "stat", "title": title, "description": description, "datasource": DS, "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "none", "textMode": "value_and_name",
                    "justifyMode": "auto", "orientation": "auto", "wideLayout": True},
    }


def bargauge(title: str, description: str, targets: list[dict[str, Any]], unit: str) -> dict[str, Any]:
    return {
        "type": "bargauge", "title": title, "description": description, "datasource": DS, "targets": targets,
        "fieldConfig": {"defaults": _defaults(unit, min_=0), "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
                    "valueMode": "color", "namePlacement": "auto", "sizing": "auto"},
    }


def table(title: str, description: str, targets: list[dict[str, Any]], *, columns: dict[str, str],
          units: dict[str, str], sort_by: str | None = None) -> dict[str, Any]:
    """An instant table: queries merged on their common labels; `columns` renames and orders them."""
    overrides = [
        {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
        for name, unit in units.items()
    ]
    return {
        "type": "table", "title": title, "description": description, "datasource": DS, "targets": targets,
        "fieldConfig": {"defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"}},
                                     "mappings": [], "thresholds": {"mode": "absolute",
                                                                    "steps": [{"color": "green", "value": None}]}},
                        "overrides": overrides},
        "options": {"showHeader": True, "cellHeight": "sm",
                    "sortBy": [{"displayName": sort_by, "desc": True}] if sort_by else []},
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True},
                "indexByName": {name: i for i, name in enumerate(columns)},
                "renameByName": columns,
            }},
        ],
    }


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def by_ref(ref: str, unit: str) -> dict[str, Any]:
    return {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": [{"id": "unit", "value": unit}]}


def layout(items: list[tuple[dict[str, Any], int, int]]) -> list[dict[str, Any]]:
    """Give panels ids and grid positions: (panel, width, height) left to right, wrapping at 24 columns."""
    panels: list[dict[str, Any]] = []
    x = y = line_height = 0
    for number, (panel, width, height) in enumerate(items, 1):
        if panel["type"] == "row" or x + width > 24:
            y, x, line_height = y + line_height, 0, 0
        if panel["type"] == "row":
            width, height = 24, 1
        panels.append({"id": number, "gridPos": {"h": height, "w": width, "x": x, "y": y}, **panel})
        x += width
        line_height = max(line_height, height)
    return panels


# -- variables ---------------------------------------------------------------------------------------
def datasource_variable() -> dict[str, Any]:
    return {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
            "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
            "regex": "", "skipUrlSync": False}


def query_variable(name: str, label: str, query: str, *, regex: str = "", multi: bool = True,
                   include_all: bool = True, description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "query", "name": name, "label": label, "description": description, "datasource": DS,
        # The query as a plain string: every Grafana since 7 reads it (10+ turns it into its query model).
        "definition": query, "query": query,
        "refresh": 2, "regex": regex, "sort": 1, "multi": multi, "includeAll": include_all,
        "current": {}, "hide": 0, "options": [], "skipUrlSync": False,
    }
    if include_all:
        out["allValue"] = ".*"  # also matches series without the label (no host label: -n/--no-hostname)
    return out


def host_variable(scope: Scope) -> dict[str, Any]:
    return query_variable("host", "Host", scope.variable("host"),
                          description="The node: dcgm-exporter's Hostname (<= 4.5) or hostname (4.6+) label, as the "
                                      "recording rules name it; not Prometheus' instance")


def gpu_variable(scope: Scope) -> dict[str, Any]:
    return query_variable("gpu", "GPU", scope.variable("UUID"),
                          description="GPU UUID (MIG instances are shown under their parent GPU's UUID)")


def dashboard(uid: str, title: str, description: str, variables: list[dict[str, Any]],
              panels: list[dict[str, Any]], annotations: list[dict[str, Any]], *, time_from: str,
              refresh: str) -> dict[str, Any]:
    builtin = {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
               "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
               "type": "dashboard"}
    return {
        "__inputs": [],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            *({"type": "panel", "id": t, "name": t, "version": ""}
              for t in sorted({p["type"] for p in panels if p["type"] != "row"})),
        ],
        "annotations": {"list": [builtin, *annotations]},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "panels": panels,
        "refresh": refresh,
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["gpu", "nvidia", "dcgm", "dcgm-bridge"],
        "templating": {"list": variables},
        "time": {"from": time_from, "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


# -- shared panel groups -----------------------------------------------------------------------------
def gpu_panels(s: Scope) -> Iterator[tuple[dict[str, Any], int, int]]:
    """The per-GPU panels both dashboards show, in layout order."""
    yield row("Utilisation and power"), 24, 1
    yield timeseries(
        "Utilisation", "dcgm_bridge:gpu_busy_ratio per GPU or MIG instance: DCGM_FI_DEV_GPU_UTIL, or "
        "GR_ENGINE_ACTIVE where it is absent (MIG instances, some GPU Operator stacks).",
        [target(s.per_slot("busy_ratio"), legend=INSTANCE_LEGEND)], "percentunit", min_=0, max_=1), 12, 8
    yield timeseries(
        "Power per GPU", "dcgm_bridge:gpu_power_watts per physical GPU (MIG instances counted once).",
        [target(s.per_gpu("power_watts"), legend=GPU_LEGEND)], "watt", min_=0), 12, 8
    yield timeseries(
        "Total power", "Sum over GPUs of each GPU's power (no MIG double counting), and per host.",
        [target(s.total_power(), "A", "total"), target(s.total_power("host"), "B", "{{host}}")],
        "watt", min_=0), 12, 8
    yield bargauge(
        "Energy per GPU in the selected range",
        "Increase of dcgm_bridge:gpu_energy_joules_total (reset-aware) over the dashboard's time range, per GPU, "
        "across phases (MIG instances counted once).",
        [target(s.energy_joules_per_gpu(), legend=GPU_LEGEND, instant=True)], "joule"), 12, 8
    yield row("Thermals, memory, clocks"), 24, 1
    yield timeseries(
        "Temperature", "GPU and memory temperature (dcgm_bridge:gpu_temperature_celsius, "
        "…memory_temperature_celsius).",
        [target(s.per_gpu("temperature_celsius"), "A", GPU_LEGEND + " GPU"),
         target(s.per_gpu("memory_temperature_celsius"), "B", GPU_LEGEND + " memory")], "celsius"), 12, 8
    yield timeseries(
        "Memory used", "Framebuffer used / (used + free + reserved), per GPU or MIG instance "
        "(dcgm_bridge:gpu_fb_used_ratio).",
        [target(s.per_slot("fb_used_ratio"), legend=INSTANCE_LEGEND)], "percentunit", min_=0, max_=1), 12, 8
    yield timeseries(
        "SM clock", "dcgm_bridge:gpu_sm_clock_hertz.",
        [target(s.per_gpu("sm_clock_hertz"), legend=GPU_LEGEND)], "hertz"), 12, 8
    yield timeseries(
        "Tensor pipe active", "Share of cycles the tensor (HMMA) pipe is busy, per GPU or MIG instance "
        "(dcgm_bridge:gpu_pipe_tensor_active_ratio).",
        [target(s.per_slot("pipe_tensor_active_ratio"), legend=INSTANCE_LEGEND)], "percentunit", min_=0, max_=1), 12, 8
    yield row("Interconnect, throttling, errors"), 24, 1
    yield timeseries(
        "PCIe throughput", "dcgm_bridge:gpu_pcie_tx/rx_bytes_per_second (protocol headers included).",
        [target(s.per_gpu("pcie_tx_bytes_per_second"), "A", GPU_LEGEND + " tx"),
         target(s.per_gpu("pcie_rx_bytes_per_second"), "B", GPU_LEGEND + " rx")], "Bps", min_=0), 12, 8
    yield timeseries(
        "NVLink traffic", "Rate of dcgm_bridge:gpu_nvlink_bandwidth_bytes_total, all links: bytes, as DCGM 4.7's "
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL states (the legacy field in MB, per dcgm-exporter 4.9's notes).",
        [target(s.rate_per_gpu("nvlink_bandwidth_bytes_total"), legend=GPU_LEGEND)], "Bps", min_=0), 12, 8
    yield timeseries(
        "Throttling", "Share of time each GPU was held back, by reason: rate of the "
        "dcgm_bridge:gpu_*_violation_seconds_total counters. These fields are optional rows of "
        "default-counters.csv.",
        [target(s.rate_per_gpu(f"{reason}_violation_seconds_total"), chr(65 + i), f"{GPU_LEGEND} {title}")
         for i, (reason, title) in enumerate(VIOLATIONS.items())], "percentunit", min_=0), 12, 8
    yield xid_table(s), 12, 8


VIOLATIONS = {"power": "power", "thermal": "thermal", "sync_boost": "sync boost", "board_limit": "board limit",
              "low_util": "low utilisation", "reliability": "reliability"}


def xid_table(s: Scope) -> dict[str, Any]:
    """Each XID a GPU reported in the range, with when it was last reported (codes never reset, #500)."""
    keep = f"{GPU}, err_code, err_msg"
    code = f"max by ({keep}) ({s.over_range('last_over_time', 'xid_code')} > 0)"
    last = f"max_over_time(timestamp({s.sel('xid_code')})[$__range:$__interval])"
    seen = f"max by ({keep}) ({last} and {s.over_range('last_over_time', 'xid_code')} > 0) * 1000"
    return table(
        "XID errors", "dcgm_bridge:gpu_xid_code is the last XID code a GPU reported, with err_code/err_msg "
        "(dcgm-exporter 3.3.6+); it stays until the exporter restarts. One row per GPU and XID in the range: "
        "the code and when it was last reported.",
        [target(code, "A", instant=True, table=True), target(seen, "B", instant=True, table=True)],
        columns={"host": "Host", "gpu": "GPU", "UUID": "UUID", "err_code": "XID", "err_msg": "Message",
                 "Value #A": "Code", "Value #B": "Last reported"},
        units={"Last reported": "dateTimeAsIso"}, sort_by="Last reported")


# -- benchmark-run.json ------------------------------------------------------------------------------
RUN = Scope('run_id="$run_id", phase=~"$phase", host=~"$host", UUID=~"$gpu"')
RUN_PHASES = Scope('run_id="$run_id", phase=~"$phase", phase!="none", host=~"$host", UUID=~"$gpu"')


def benchmark_run() -> dict[str, Any]:
    s = RUN
    variables = [
        datasource_variable(),
        query_variable("run_id", "Run", Scope('run_id!=""').variable("run_id"), multi=False, include_all=False,
                       description="The sidecar's run_id (DCGM_BRIDGE_RUN_ID) on every sample"),
        query_variable("phase", "Phase", Scope('run_id="$run_id"').variable("phase"),
                       description="warmup, profiling, … as the benchmark posted them; none = between phases"),
        host_variable(Scope('run_id="$run_id", phase=~"$phase"')),
        gpu_variable(Scope('run_id="$run_id", phase=~"$phase", host=~"$host"')),
    ]
    energy_total = f"sum({s.energy_joules_per_gpu()})"
    items: list[tuple[dict[str, Any], int, int]] = [
        (stat("Mean total power", "Sum over the selected GPUs of each one's mean power draw in the range (MIG "
              "instances counted once).",
              [target(s.mean_total_power(), instant=True, legend="mean")], "watt", decimals=0), 6, 4),
        (stat("Energy in the selected range", "Increase of the energy counters over the time range, all "
              "selected GPUs and phases.",
              [target(energy_total, "A", "J", instant=True),
               target(f"{energy_total} / 3600000", "B", "kWh", instant=True)],
              "joule", overrides=[by_ref("B", "kwatth")]), 6, 4),
        (stat("Mean utilisation", "Sample mean over the range and the selected GPUs (MIG: per instance).",
              [target(s.mean("busy_ratio"), instant=True, legend="mean")], "percentunit", decimals=1), 6, 4),
        (stat("Peak GPU temperature", "Highest GPU temperature in the range.",
              [target(f"max({s.over_range('max_over_time', 'temperature_celsius')})", instant=True,
                      legend="peak")], "celsius", thresholds=[("green", None), ("orange", 83), ("red", 87)]), 6, 4),
        *gpu_panels(s),
        (row("Warmup vs profiling"), 24, 1),
        (phase_table(), 24, 7),
    ]
    # Each phase while it is the GPUs' current one (the rules record a GPU's current phase only), except the
    # gaps between phases (phase="none").
    annotation = {
        "name": "Phases", "datasource": DS, "enable": True, "hide": False, "iconColor": "rgba(255, 152, 48, 0.4)",
        "expr": f"count by (phase) ({RUN_PHASES.sel('fb_used_bytes')})", "step": "10s",
        "titleFormat": "{{phase}}", "tagKeys": "phase", "textFormat": "", "useValueForTime": False,
    }
    return dashboard(
        "dcgm-bridge-run", "dcgm-bridge · benchmark run",
        "One benchmark run recorded by the dcgm-bridge sidecar: GPU telemetry with run_id and phase, from "
        "VictoriaMetrics/Mimir/Prometheus via OTLP or Prometheus scraping the sidecar, through the recording "
        "rules (grafana/rules). Phases are shaded.",
        variables, layout(items), [annotation], time_from="now-1h", refresh="")


def phase_table() -> dict[str, Any]:
    s = RUN_PHASES
    power = f"sum by (phase) (avg by (UUID, phase) ({s.over_range('avg_over_time', 'power_watts')}))"
    temp = f"max by (phase) ({s.over_range('max_over_time', 'temperature_celsius')})"
    return table(
        "Per phase", "Each phase of the run side by side, over the selected GPUs: energy (counter increase), "
        "mean total power, mean utilisation, peak GPU temperature. Between-phase samples (phase=none) are left "
        "out.",
        [target(s.energy_joules_per_phase(), "A", instant=True, table=True),
         target(power, "B", instant=True, table=True),
         target(s.mean("busy_ratio", "phase"), "C", instant=True, table=True),
         target(temp, "D", instant=True, table=True)],
        columns={"phase": "Phase", "Value #A": "Energy", "Value #B": "Mean total power",
                 "Value #C": "Mean utilisation", "Value #D": "Peak GPU temperature"},
        units={"Energy": "joule", "Mean total power": "watt", "Mean utilisation": "percentunit",
               "Peak GPU temperature": "celsius"})


# -- gpu-fleet.json ----------------------------------------------------------------------------------
FLEET = Scope('host=~"$host", UUID=~"$gpu"')


def gpu_fleet() -> dict[str, Any]:
    s = FLEET
    variables = [datasource_variable(), host_variable(Scope("")), gpu_variable(Scope('host=~"$host"'))]
    items: list[tuple[dict[str, Any], int, int]] = [
        (stat("GPUs", "Distinct GPU UUIDs reporting in the range.",
              [target(f"count(group by (UUID) ({s.over_range('last_over_time', 'fb_used_bytes')}))", instant=True,
                      legend="GPUs")], "none"), 4, 4),
        (stat("Total power now", "Sum of every selected GPU's latest power draw (MIG instances counted once).",
              [target(s.total_power(), instant=True, legend="total")], "watt", decimals=0), 5, 4),
        (stat("Mean utilisation now", "Mean over the selected GPUs (MIG: per instance).",
              [target(f"avg({s.per_slot('busy_ratio')})", instant=True, legend="mean")], "percentunit",
              decimals=1), 5, 4),
        (stat("Hottest GPU now", "Highest current GPU temperature.",
              [target(f"max({s.sel('temperature_celsius')})", instant=True, legend="max")], "celsius",
              thresholds=[("green", None), ("orange", 83), ("red", 87)]), 5, 4),
        (stat("GPUs with an XID", "GPUs that reported an XID code in the range.",
              [target(f"count(group by (UUID) ({s.over_range('last_over_time', 'xid_code')} > 0))",
                      instant=True, legend="GPUs")], "none",
              thresholds=[("green", None), ("red", 1)], no_value="0"), 5, 4),
        *gpu_panels(s),
        (row("Nodes"), 24, 1),
        (timeseries("Power per host", "Each node's GPU power draw (MIG instances counted once).",
                    [target(s.total_power("host"), legend="{{host}}")], "watt", min_=0, stack=True), 24, 8),
    ]
    return dashboard(
        "dcgm-bridge-fleet", "dcgm-bridge · GPU fleet",
        "Live GPUs as dcgm-exporter reports them (scraped directly, or forwarded by dcgm-bridge), through the "
        "recording rules (grafana/rules): MIG-aware, by node name, any exporter dialect.",
        variables, layout(items), [], time_from="now-30m", refresh="30s")


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def outputs() -> dict[str, str]:
    """File name → the JSON this script writes."""
    return {"benchmark-run.json": render(benchmark_run()), "gpu-fleet.json": render(gpu_fleet())}


def main() -> int:
    DASHBOARDS.mkdir(parents=True, exist_ok=True)
    for name, text in outputs().items():
        (DASHBOARDS / name).write_text(text, encoding="utf-8")
        print(f"wrote {DASHBOARDS / name}")
    RULES.parent.mkdir(parents=True, exist_ok=True)
    RULES.write_text(rules.render(rules.rule_groups()), encoding="utf-8")
    print(f"wrote {RULES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
