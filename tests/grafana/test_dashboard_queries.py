"""Every query of both dashboards, run on real stores holding a real run and the recorded series the mixin's
rules made of it (conftest.py's `stored_run`: once with the legacy exporter names, once with DCGM 4.7's).

Queries are interpolated as Grafana does it (multi-value variables as escaped regex alternations,
All as the variable's allValue, $__range/$__interval/$__rate_interval from the run's time range) and
sent to VictoriaMetrics (OTLP, both naming modes; vmalert evaluating the rules) and Prometheus 2.53 (scraping
the pull endpoint, the rules loaded).
Each must return the series its panel is drawn from, with the labels its legend and table use; the
variables must list the run's values; and every panel's values must be the simulators' ground truth for
the same window (what each simulator served at each step, simrun.py `RecordedRun.served`, read through the
recorded series' documented meaning, `MEANING`): the gauges at every step, the counters' rates within what the
counters moved, the range statistics, the power and energy, MIG instances counted once.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.grafana.conftest import NODE_A, NODE_B, RUN_ID, XID_CODE, XID_GPU, XID_NODE, Store, StoredRun
from tests.grafana.simrun import Served

pytestmark = pytest.mark.realstack

DASHBOARDS = Path(__file__).resolve().parents[2] / "grafana" / "dashboards"
STORES = ("victoria-metrics", "victoria-metrics-prometheus-naming", "prometheus-scrape")
INTERVAL_S = 0.05  # $__interval: the data's own cadence is ~0.1 s (a step waits for a Prometheus scrape)
RATE_INTERVAL = "1s"  # $__rate_interval: >= 4 × the scrape interval, as Grafana computes it
ALL = None  # a variable set to All

# What each panel query returns, by panel title (and refId where the targets differ):
#   total    one series without labels        host     one series per node (host)
#   gpu      one series per physical GPU      instance one per GPU or MIG instance (2 × 3 + 2)
#   phase    one per phase (warmup, profiling)  xid    one row: the GPU with the XID
#   count:N  one series without labels, value N
GPUS, INSTANCES = 4, 8
SHAPES: Mapping[str, str] = {
    "Total power now": "total", "Mean total power": "total", "Energy in the selected range": "total",
    "Mean utilisation": "total",
    "Peak GPU temperature": "total", "Utilisation": "instance", "Power per GPU": "gpu", "Total power/A": "total",
    "Total power/B": "host", "Energy per GPU in the selected range": "gpu", "Temperature": "gpu",
    "Memory used": "instance", "SM clock": "gpu", "Tensor pipe active": "instance", "PCIe throughput": "gpu",
    "NVLink traffic": "gpu", "Throttling": "gpu", "XID errors": "xid", "Per phase": "phase",
    "GPUs": "count:4", "Mean utilisation now": "total", "Hottest GPU now": "total", "GPUs with an XID": "count:1",
    "Power per host": "host", "annotation Phases": "phase",
}
LABELS = {"gpu": {"host", "UUID", "gpu"}, "instance": {"host", "UUID", "gpu", "slot"}, "host": {"host"},
          "xid": {"host", "UUID", "gpu", "err_code", "err_msg"}, "phase": {"phase"}}


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DASHBOARDS / name).read_text(encoding="utf-8"))
    return doc


def panel_queries(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(key, panel, target) for every target; the annotation comes as a range target of its own."""
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            yield f"{panel['title']}/{target['refId']}", panel, target
    for annotation in doc["annotations"]["list"]:
        if "expr" in annotation:
            yield (f"annotation {annotation['name']}", {"title": f"annotation {annotation['name']}", "type": "-"},
                   {"expr": annotation["expr"], "legendFormat": annotation["titleFormat"], "range": True})


CASES = [
    pytest.param(name, key, store, id=f"{name.removesuffix('.json')}-{key}-{store}")
    for name in ("benchmark-run.json", "gpu-fleet.json")
    for key, _, _ in panel_queries(load(name))
    for store in STORES
]


# -- Grafana's interpolation --------------------------------------------------------------------------
def regex_escape(value: str) -> str:
    """The Prometheus datasource's escaping of a multi-value variable's value (a regex in a string)."""
    return re.sub(r"([\\$^*{}\[\]'+?.()|])", r"\\\\\1", value)


def interpolate(text: str, doc: dict[str, Any], chosen: Mapping[str, Sequence[str] | None],
                builtins: Mapping[str, str]) -> str:
    variables = {v["name"]: v for v in doc["templating"]["list"]}

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name in builtins:
            return builtins[name]
        if name not in variables or name == "datasource":
            return match.group(0)  # `$1` of label_replace, and the datasource (not in the text)
        variable, picked = variables[name], chosen.get(name, ALL)
        if picked is None:
            assert variable.get("includeAll"), f"${name} has no All option"
            return str(variable["allValue"])
        if not variable.get("multi") and not variable.get("includeAll"):
            (single,) = picked
            return single
        escaped = [regex_escape(v) for v in picked]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", value, text)


def builtins(run: StoredRun, store: Store) -> dict[str, str]:
    return {"__range": f"{run.range_s(store)}s", "__range_s": str(run.range_s(store)),
            "__interval": f"{int(INTERVAL_S * 1000)}ms", "__rate_interval": RATE_INTERVAL}


def variable_values(doc: dict[str, Any], name: str, run: StoredRun, store: Store,
                    chosen: Mapping[str, Sequence[str] | None]) -> list[str]:
    """What Grafana lists for a query variable: label_values via the labels API, query_result + regex."""
    variable = next(v for v in doc["templating"]["list"] if v["name"] == name)
    query = interpolate(variable["definition"], doc, chosen, builtins(run, store))
    end = run.end_s(store)
    if query.startswith("label_values("):
        selector, label = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query).groups()  # type: ignore[union-attr]
        values = store.label_values(label, selector, end - run.range_s(store), end)
    else:
        expr = re.fullmatch(r"query_result\((.*)\)", query).group(1)  # type: ignore[union-attr]
        lines = [_as_grafana_line(r) for r in store.instant(expr, end)]
        values = []
        pattern = re.compile(variable["regex"].strip("/"))
        for line in lines:
            match = pattern.search(line)
            if match:
                values.append(match.group(1))
    return sorted(set(values))


def _as_grafana_line(result: dict[str, Any]) -> str:
    labels = dict(result["metric"])
    name = labels.pop("__name__", "")
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}} {result['value'][1]} {result['value'][0]}"


def run_query(run: StoredRun, store: Store, doc: dict[str, Any], target: dict[str, Any],
              chosen: Mapping[str, Sequence[str] | None], at_step: int | None = None) -> list[dict[str, Any]]:
    """The target as Grafana sends it: instant at the range's end, or a range over the run."""
    expr = interpolate(target["expr"], doc, chosen, builtins(run, store))
    end = run.end_s(store) if at_step is None else store.eval_s[at_step]
    if target.get("instant"):
        return store.instant(expr, end)
    return store.range(expr, run.start_s, end, INTERVAL_S)


def now_step(run: StoredRun, name: str) -> int | None:
    """When "now" is: the run's end for a run; for the live fleet, while the run still collects (the
    sidecar may end its series with staleness markers when it completes)."""
    return len(run.run.steps) - 2 if name == "gpu-fleet.json" else None


def defaults() -> dict[str, Sequence[str] | None]:
    return {"run_id": [RUN_ID]}


# -- tests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["benchmark-run.json", "gpu-fleet.json"])
@pytest.mark.parametrize("store_name", STORES)
def test_the_variables_list_the_run_its_phases_hosts_and_gpus(stored_run, name, store_name):
    doc, store = load(name), stored_run.stores[store_name]
    uuids = sorted(gpu.uuid for node in stored_run.nodes for gpu in node.model.gpus)
    expected = {"run_id": [RUN_ID], "phase": ["none", "profiling", "warmup"], "host": [NODE_A, NODE_B],
                "gpu": uuids}
    chosen: dict[str, Sequence[str] | None] = {}
    for variable in doc["templating"]["list"]:
        if variable["type"] != "query":
            continue
        values = variable_values(doc, variable["name"], stored_run, store, chosen)
        assert values == expected[variable["name"]], variable["name"]
        chosen[variable["name"]] = values if not variable.get("includeAll") else ALL


@pytest.mark.parametrize(("name", "key", "store_name"), CASES)
def test_every_query_returns_the_series_its_panel_draws(stored_run, name, key, store_name):
    doc, store = load(name), stored_run.stores[store_name]
    _, panel, target = next(q for q in panel_queries(doc) if q[0] == key)
    result = run_query(stored_run, store, doc, target, defaults(), at_step=now_step(stored_run, name))
    assert result, f"{key}: no data"
    shape = SHAPES.get(key) or SHAPES[panel["title"]]
    labels = [r["metric"] for r in result]
    values = [float(v) for r in result for v in ([r["value"][1]] if "value" in r else [p[1] for p in r["values"]])]
    assert all(math.isfinite(v) for v in values), f"{key}: {values}"
    if shape == "total" or shape.startswith("count:"):
        assert labels == [{}], f"{key}: {labels}"
        if shape.startswith("count:"):
            assert float(result[0]["value"][1]) == float(shape.split(":")[1])
    else:
        for metric in labels:
            assert LABELS[shape] <= metric.keys(), f"{key}: {metric} lacks {LABELS[shape] - metric.keys()}"
        identities = {tuple(m[k] for k in sorted(LABELS[shape])) for m in labels}
        assert len(identities) == len(labels), f"{key}: one series per identity, got duplicates: {labels}"
        expected_count = {"gpu": GPUS, "instance": INSTANCES, "host": 2, "xid": 1, "phase": 2}[shape]
        assert len(labels) == expected_count, f"{key}: {len(labels)} series, want {expected_count}: {labels}"
        if shape in ("gpu", "instance", "host"):
            assert {m["host"] for m in labels} == {NODE_A, NODE_B}
        if shape == "phase":
            assert {m["phase"] for m in labels} == {"warmup", "profiling"}
    for placeholder in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
        assert all(placeholder in m for m in labels), f"{key}: legend {{{{{placeholder}}}}} missing in {labels}"


@pytest.mark.parametrize("name", ["benchmark-run.json", "gpu-fleet.json"])
@pytest.mark.parametrize("store_name", STORES)
def test_the_queries_follow_the_variables(stored_run, name, store_name):
    doc, store = load(name), stored_run.stores[store_name]
    node_a = stored_run.nodes[XID_NODE]
    uuid = node_a.model.gpus[XID_GPU].uuid
    chosen = {**defaults(), "host": [NODE_A], "gpu": [uuid, "GPU-not-in-this-run"], "phase": ["profiling"]}
    last_profiling = stored_run.run.phase_steps("profiling")[-1].index  # "now" for the instant queries
    for key, _, target in panel_queries(doc):
        result = run_query(stored_run, store, doc, target, chosen, at_step=last_profiling)
        assert result, f"{key}: no data for one GPU"
        for row in result:
            metric = row["metric"]
            if "UUID" in metric:
                assert metric["UUID"] == uuid, key
            if "host" in metric:
                assert metric["host"] == NODE_A, key
            if "phase" in metric:
                assert metric["phase"] == "profiling", key


def _value(store: Store, expr: str, at_s: float) -> float:
    (row,) = store.instant(expr, at_s)
    return float(row["value"][1])


def _target(doc: dict[str, Any], title: str, ref: str = "A") -> dict[str, Any]:
    panel = next(p for p in doc["panels"] if p["title"] == title)
    target: dict[str, Any] = next(t for t in panel["targets"] if t["refId"] == ref)
    return target


@pytest.mark.parametrize(("name", "title"), [("benchmark-run.json", "Total power"),
                                             ("gpu-fleet.json", "Total power now")])
@pytest.mark.parametrize("store_name", STORES)
def test_total_power_is_the_simulators_ground_truth_at_every_step(stored_run, name, title, store_name):
    """Every step, the phase boundaries included: MIG instances once, a finished phase's series not at all."""
    doc, store = load(name), stored_run.stores[store_name]
    expr = interpolate(_target(doc, title)["expr"], doc, defaults(), builtins(stored_run, store))
    for step in stored_run.run.steps:
        measured = _value(store, expr, store.eval_s[step.index])
        assert measured == pytest.approx(stored_run.run.power_w(step.t_ns), abs=0.005), \
            f"step {step.index} ({step.phase})"


@pytest.mark.parametrize("store_name", STORES)
def test_the_mean_total_power_is_a_mean_of_the_true_totals(stored_run, store_name):
    """A mean of the recorded samples: each step's total at least once, weighted by how many rule evaluations
    saw it."""
    doc, store, run = load("benchmark-run.json"), stored_run.stores[store_name], stored_run.run
    (row,) = run_query(stored_run, store, doc, _target(doc, "Mean total power"), defaults())
    totals = [run.power_w(s.t_ns) for s in run.steps]
    assert min(totals) <= float(row["value"][1]) <= max(totals)


@pytest.mark.parametrize("store_name", STORES)
def test_the_power_graphs_only_ever_show_true_values(stored_run, store_name):
    """The range queries behind "Total power" and "Power per GPU": every point is some step's truth."""
    doc, store, run = load("benchmark-run.json"), stored_run.stores[store_name], stored_run.run
    totals = [run.power_w(s.t_ns) for s in run.steps]
    (series,) = run_query(stored_run, store, doc, _target(doc, "Total power"), defaults())
    for _, value in series["values"]:
        assert min(abs(float(value) - t) for t in totals) < 0.005, value
    truth = {gpu.uuid: [run.gpu_power_w(node, gpu.index, s.t_ns) for s in run.steps]
             for node in stored_run.nodes for gpu in node.model.gpus}
    per_gpu = run_query(stored_run, store, doc, _target(doc, "Power per GPU"), defaults())
    assert len(per_gpu) == GPUS
    for series in per_gpu:
        options = truth[series["metric"]["UUID"]]
        for _, value in series["values"]:
            assert min(abs(float(value) - t) for t in options) < 0.0005, value


@pytest.mark.parametrize("store_name", STORES)
def test_energy_per_phase_is_the_simulators_ground_truth(stored_run, store_name):
    """VictoriaMetrics' increase() is the counter's delta; Prometheus extrapolates it by at most half a
    sample interval at each end of the phase, so up to 1/(n-1) more with n samples."""
    doc, store, run = load("benchmark-run.json"), stored_run.stores[store_name], stored_run.run
    rows = run_query(stored_run, store, doc, _target(doc, "Per phase", "A"), defaults())
    measured = {r["metric"]["phase"]: float(r["value"][1]) for r in rows}
    for phase in ("warmup", "profiling"):
        steps = run.phase_steps(phase)
        truth = run.energy_j(steps[0].t_ns, steps[-1].t_ns)
        if store_name.startswith("victoria-metrics"):
            assert measured[phase] == pytest.approx(truth, abs=0.01), phase
        else:
            assert truth - 0.01 <= measured[phase] <= truth * (1 + 1 / (len(steps) - 1)) + 0.01, phase


@pytest.mark.parametrize("name", ["benchmark-run.json", "gpu-fleet.json"])
@pytest.mark.parametrize("store_name", STORES)
def test_energy_in_the_range_counts_every_gpu_once_across_phases(stored_run, name, store_name):
    doc, store, run = load(name), stored_run.stores[store_name], stored_run.run
    steps = run.steps
    truth = run.energy_j(steps[0].t_ns, steps[-1].t_ns)
    per_gpu = run_query(stored_run, store, doc, _target(doc, "Energy per GPU in the selected range"), defaults())
    total = sum(float(r["value"][1]) for r in per_gpu)
    if store_name.startswith("victoria-metrics"):
        assert total == pytest.approx(truth, abs=0.01)
    else:
        # Prometheus extrapolates increase() beyond the first and last subquery points (half a step at the
        # start, up to 1.1 steps to the range's end), at the rate it sees in its own scrape times.
        duration_s = (steps[-1].t_ns - steps[0].t_ns) / 1e9
        assert truth - 0.01 <= total <= truth * (1 + 2 * INTERVAL_S / duration_s), (total, truth)
    if name == "benchmark-run.json":
        (joules,) = run_query(stored_run, store, doc, _target(doc, "Energy in the selected range", "A"), defaults())
        (kwh,) = run_query(stored_run, store, doc, _target(doc, "Energy in the selected range", "B"), defaults())
        assert float(joules["value"][1]) == pytest.approx(total)
        assert float(kwh["value"][1]) == pytest.approx(total / 3.6e6)


@pytest.mark.parametrize("name", ["benchmark-run.json", "gpu-fleet.json"])
@pytest.mark.parametrize("store_name", STORES)
def test_the_xid_table_shows_the_gpus_last_code_and_message(stored_run, name, store_name):
    from bridge.simulator.schema import xid_message

    doc, store, run = load(name), stored_run.stores[store_name], stored_run.run
    node = stored_run.nodes[XID_NODE]
    (code,) = run_query(stored_run, store, doc, _target(doc, "XID errors", "A"), defaults())
    (seen,) = run_query(stored_run, store, doc, _target(doc, "XID errors", "B"), defaults())
    assert code["metric"]["UUID"] == node.model.gpus[XID_GPU].uuid and code["metric"]["gpu"] == str(XID_GPU)
    assert code["metric"]["err_code"] == str(XID_CODE) and code["metric"]["err_msg"] == xid_message(XID_CODE)
    assert float(code["value"][1]) == XID_CODE
    last_ms = float(seen["value"][1])
    assert run.steps[0].t_ns / 1e6 < last_ms <= stored_run.end_s(store) * 1000


@pytest.mark.parametrize("store_name", STORES)
def test_phase_annotations_cover_each_phase_and_never_overlap(stored_run, store_name):
    doc, store, run = load("benchmark-run.json"), stored_run.stores[store_name], stored_run.run
    _, _, target = next(q for q in panel_queries(doc) if q[0] == "annotation Phases")
    series = {s["metric"]["phase"]: [float(t) for t, _ in s["values"]]
              for s in run_query(stored_run, store, doc, target, defaults())}
    assert set(series) == {"warmup", "profiling"}
    warmup, profiling = series["warmup"], series["profiling"]
    assert max(warmup) < min(profiling), "a finished phase must not linger into the next one"
    first, last = run.phase_steps("profiling")[0], run.phase_steps("profiling")[-1]
    assert min(profiling) >= first.t_ns / 1e9 - INTERVAL_S
    assert max(profiling) <= store.eval_s[last.index + 1] + INTERVAL_S


def test_counters_reach_a_prometheus_naming_store_with_the_total_suffix(stored_run):
    """The rules' `(_total)?` regex matters: with Prometheus naming the unsuffixed counter does not exist."""
    store, end = stored_run.stores["victoria-metrics-prometheus-naming"], stored_run.end_s
    at = end(stored_run.stores["victoria-metrics-prometheus-naming"])
    energy = stored_run.energy_family
    assert store.instant(f'count({energy}_total{{run_id="{RUN_ID}"}})', at)
    assert not store.instant(f'count({energy}{{run_id="{RUN_ID}"}})', at)
    plain = stored_run.stores["victoria-metrics"]
    assert plain.instant(f'count({energy}{{run_id="{RUN_ID}"}})', at)
    assert not plain.instant(f'count({energy}_total{{run_id="{RUN_ID}"}})', at)


@pytest.mark.parametrize("store_name", STORES)
def test_each_endpoints_refresh_is_recorded_and_the_stale_alert_stays_quiet(stored_run, store_name):
    """The sidecar's refresh self-metrics (OTLP, pull page) become one series per endpoint, across phases; the
    exporters refresh at every scrape, so DcgmBridgeExporterStale's expression returns nothing."""
    from bridge.endpoints import display_key

    store, run = stored_run.stores[store_name], stored_run.run
    at = store.eval_s[len(run.steps) - 2]
    endpoints = sorted(display_key(node.url) for node in stored_run.nodes)
    last = store.instant("dcgm_bridge:exporter_last_refresh_timestamp_seconds", at)
    assert sorted(r["metric"]["endpoint"] for r in last) == endpoints, last
    for row in last:
        assert run.steps[0].t_ns / 1e9 - 1 <= float(row["value"][1]) <= at, row
    period = store.instant("dcgm_bridge:exporter_refresh_period_seconds", at)
    assert sorted(r["metric"]["endpoint"] for r in period) == endpoints, period
    rules = yaml.safe_load((DASHBOARDS.parent / "rules" / "dcgm-bridge.rules.yml").read_text())
    stale = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "DcgmBridgeExporterStale")
    assert store.instant(stale["expr"], at) == []


# -- every panel's values against what the simulators served ----------------------------------------------------
# What each recorded series is (grafana/README.md's table), from one series group's served values in the
# simulator's canonical units (tests/grafana/simrun.py `Served`): an independent statement of the rules' meaning,
# whichever dialect's names and units carried the values.
def _busy(v: Mapping[str, float]) -> float:
    """GPU_UTIL where the group has it, else the graphics engine's activity (MIG instances have no GPU_UTIL)."""
    return v["DCGM_FI_DEV_GPU_UTIL"] / 100 if "DCGM_FI_DEV_GPU_UTIL" in v else v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]


def _violation(field: str) -> Callable[[Mapping[str, float]], float]:
    return lambda v: v[f"DCGM_FI_DEV_{field}_VIOLATION"] * 1e-9  # served in ns


MEANING: Mapping[str, Callable[[Mapping[str, float]], float]] = {
    "dcgm_bridge:gpu_power_watts": lambda v: v["DCGM_FI_DEV_POWER_USAGE"],
    "dcgm_bridge:gpu_busy_ratio": _busy,
    "dcgm_bridge:gpu_fb_used_ratio": lambda v: v["DCGM_FI_DEV_FB_USED"] / (
        v["DCGM_FI_DEV_FB_USED"] + v["DCGM_FI_DEV_FB_FREE"] + v["DCGM_FI_DEV_FB_RESERVED"]),
    "dcgm_bridge:gpu_temperature_celsius": lambda v: v["DCGM_FI_DEV_GPU_TEMP"],
    "dcgm_bridge:gpu_memory_temperature_celsius": lambda v: v["DCGM_FI_DEV_MEMORY_TEMP"],
    "dcgm_bridge:gpu_sm_clock_hertz": lambda v: v["DCGM_FI_DEV_SM_CLOCK"] * 1e6,  # served in MHz
    "dcgm_bridge:gpu_pipe_tensor_active_ratio": lambda v: v["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"],
    "dcgm_bridge:gpu_pcie_tx_bytes_per_second": lambda v: v["DCGM_FI_PROF_PCIE_TX_BYTES"],
    "dcgm_bridge:gpu_pcie_rx_bytes_per_second": lambda v: v["DCGM_FI_PROF_PCIE_RX_BYTES"],
    # counters, shown as their rate
    "dcgm_bridge:gpu_nvlink_bandwidth_bytes_total": lambda v: v["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] * 1e6,  # MB
    **{f"dcgm_bridge:gpu_{f.lower()}_violation_seconds_total": _violation(f)
       for f in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTIL", "RELIABILITY")},
}
POWER, BUSY, TEMP = "dcgm_bridge:gpu_power_watts", "dcgm_bridge:gpu_busy_ratio", "dcgm_bridge:gpu_temperature_celsius"
# Each panel drawn from a gauge: its series and what it shows of it: one series per GPU or per instance, the sum
# per host, or the total, mean or highest over the run's GPUs (instances for the mean).
GAUGES: Mapping[str, tuple[str, str]] = {
    "Utilisation/A": (BUSY, "instance"), "Power per GPU/A": (POWER, "gpu"), "Total power/A": (POWER, "sum"),
    "Total power/B": (POWER, "host"), "Temperature/A": (TEMP, "gpu"),
    "Temperature/B": ("dcgm_bridge:gpu_memory_temperature_celsius", "gpu"),
    "Memory used/A": ("dcgm_bridge:gpu_fb_used_ratio", "instance"),
    "SM clock/A": ("dcgm_bridge:gpu_sm_clock_hertz", "gpu"),
    "Tensor pipe active/A": ("dcgm_bridge:gpu_pipe_tensor_active_ratio", "instance"),
    "PCIe throughput/A": ("dcgm_bridge:gpu_pcie_tx_bytes_per_second", "gpu"),
    "PCIe throughput/B": ("dcgm_bridge:gpu_pcie_rx_bytes_per_second", "gpu"),
    "Total power now/A": (POWER, "sum"), "Mean utilisation now/A": (BUSY, "mean"),
    "Hottest GPU now/A": (TEMP, "max"), "Power per host/A": (POWER, "host"),
}
# Each panel drawn from a counter's rate (per GPU).
RATES: Mapping[str, str] = {
    "NVLink traffic/A": "dcgm_bridge:gpu_nvlink_bandwidth_bytes_total",
    **{f"Throttling/{ref}": f"dcgm_bridge:gpu_{f}_violation_seconds_total" for ref, f in zip(
        "ABCDEF", ("power", "thermal", "sync_boost", "board_limit", "low_util", "reliability"), strict=True)},
}
# A DCP ratio is served with six decimals, a clock in whole MHz: what a page can carry.
SERVED = {"rel": 1e-6, "abs": 1e-6}


def _truth(served: Sequence[Served], series: str, shows: str) -> dict[tuple[str, ...], float]:
    """What a panel showing `series` as `shows` must show, by the identity of each of its series."""
    meaning = MEANING[series]
    per_instance = {(s.uuid, s.slot): meaning(s.values) for s in served}
    per_gpu = {(s.uuid,): meaning(s.values) for s in served}  # a device field: each instance serves the GPU's value
    if shows == "instance":
        return per_instance
    if shows == "gpu":
        return per_gpu
    if shows == "host":
        hosts = {s.uuid: s.host for s in served}
        return {(host,): sum(v for (uuid,), v in per_gpu.items() if hosts[uuid] == host)
                for host in set(hosts.values())}
    values = list(per_instance.values()) if shows == "mean" else list(per_gpu.values())
    return {(): {"sum": sum, "mean": statistics.fmean, "max": max}[shows](values)}


IDENTITY = {"instance": ("UUID", "slot"), "gpu": ("UUID",), "host": ("host",)}  # else one series, no labels


def _identity(metric: Mapping[str, str], shows: str) -> tuple[str, ...]:
    return tuple(metric[label] for label in IDENTITY.get(shows, ()))


GAUGE_CASES = [pytest.param(name, key, id=f"{name.removesuffix('.json')}-{key}")
               for name in ("benchmark-run.json", "gpu-fleet.json") for key, _, _ in panel_queries(load(name))
               if key in GAUGES]
RATE_CASES = [pytest.param(name, key, id=f"{name.removesuffix('.json')}-{key}")
              for name in ("benchmark-run.json", "gpu-fleet.json") for key, _, _ in panel_queries(load(name))
              if key in RATES]


def test_every_gauge_and_rate_panel_has_a_truth() -> None:
    """A panel added to a dashboard must be given its meaning here (or in the tests above)."""
    judged = {*GAUGES, *RATES, "Mean total power/A", "Energy in the selected range/A", "Energy in the selected range/B",
              "Mean utilisation/A", "Peak GPU temperature/A", "Energy per GPU in the selected range/A",
              "XID errors/A", "XID errors/B", "Per phase/A", "Per phase/B", "Per phase/C", "Per phase/D",
              "GPUs/A", "GPUs with an XID/A", "annotation Phases"}
    for name in ("benchmark-run.json", "gpu-fleet.json"):
        assert {key for key, _, _ in panel_queries(load(name))} <= judged, name


@pytest.mark.parametrize(("name", "key"), GAUGE_CASES)
@pytest.mark.parametrize("store_name", STORES)
def test_every_gauge_panel_shows_what_the_simulators_served_at_every_step(stored_run, name, key, store_name):
    """At every step, the phase boundaries included, each of the panel's series is the served value (or the sum,
    mean or highest of them its panel shows), and there is one for every GPU, instance or host and no other."""
    doc, store, run = load(name), stored_run.stores[store_name], stored_run.run
    _, _, target = next(q for q in panel_queries(doc) if q[0] == key)
    expr = interpolate(target["expr"], doc, defaults(), builtins(stored_run, store))
    series, shows = GAUGES[key]
    for step in run.steps:
        truth = _truth(run.served(step), series, shows)
        rows = store.instant(expr, store.eval_s[step.index])
        shown = {_identity(r["metric"], shows): float(r["value"][1]) for r in rows}
        assert shown.keys() == truth.keys(), f"step {step.index} ({step.phase})"
        for identity, value in truth.items():
            assert shown[identity] == pytest.approx(value, **SERVED), f"step {step.index} ({step.phase}) {identity}"


@pytest.mark.parametrize(("name", "key"), RATE_CASES)
@pytest.mark.parametrize("store_name", STORES)
def test_every_rate_panel_shows_the_served_counters_rate(stored_run, name, key, store_name):
    """The panel's graph over the run, per GPU: no point above the most a counter moved in one step, spread over the
    1 s rate window (a window holds at most one step's move: the steps are over a second apart), times what the store
    may extrapolate (VictoriaMetrics: nothing; Prometheus: up to 1.1 sample intervals at each end, so with as few as
    two samples in the window 1 + 2 x 1.1 times what they show), none below 0, and where the counter moves, some
    point above a tenth of its slowest true rate."""
    doc, store, run = load(name), stored_run.stores[store_name], stored_run.run
    _, _, target = next(q for q in panel_queries(doc) if q[0] == key)
    counters = [_truth(run.served(step), RATES[key], "gpu") for step in run.steps]
    shown = {r["metric"]["UUID"]: [float(v) for _, v in r["values"]]
             for r in run_query(stored_run, store, doc, target, defaults())}
    assert {(uuid,) for uuid in shown} == counters[0].keys()
    window_s = float(RATE_INTERVAL.removesuffix("s"))
    for (uuid,) in counters[0]:
        moves = [(b[(uuid,)] - a[(uuid,)], (sb.t_ns - sa.t_ns) / 1e9)
                 for a, b, sa, sb in zip(counters, counters[1:], run.steps, run.steps[1:], strict=False)]
        most = max(move for move, _ in moves) / window_s * (1 + 2 * 1.1 if store_name == "prometheus-scrape" else 1.01)
        assert all(0 <= point <= most + 1e-12 for point in shown[uuid]), (uuid, most, max(shown[uuid]))
        if most:
            slowest = min(move / dt for move, dt in moves)
            assert max(shown[uuid]) >= slowest / 10, (uuid, slowest, shown[uuid])


@pytest.mark.parametrize("store_name", STORES)
def test_the_run_and_phase_statistics_are_those_of_the_served_values(stored_run, store_name):
    """The stat and table panels over the selected range: a highest is the highest served value, a mean lies
    between the least and the most served (it weighs each step by the rule evaluations that saw it)."""
    doc, store, run = load("benchmark-run.json"), stored_run.stores[store_name], stored_run.run

    def shown(key: str) -> list[dict[str, Any]]:
        title, ref = key.split("/")
        return run_query(stored_run, store, doc, _target(doc, title, ref), defaults())

    def served(series: str, shows: str, phase: str | None = None) -> list[float]:
        return [v for step in run.steps if phase in (None, step.phase)
                for v in _truth(run.served(step), series, shows).values()]

    ((peak,),) = [[float(r["value"][1]) for r in shown("Peak GPU temperature/A")]]
    assert peak == max(served(TEMP, "gpu"))
    ((mean_busy,),) = [[float(r["value"][1]) for r in shown("Mean utilisation/A")]]
    assert min(served(BUSY, "instance")) - 1e-6 <= mean_busy <= max(served(BUSY, "instance")) + 1e-6
    for key, check in (("Per phase/B", "power"), ("Per phase/C", "busy"), ("Per phase/D", "temperature")):
        rows = {r["metric"]["phase"]: float(r["value"][1]) for r in shown(key)}
        assert set(rows) == {"warmup", "profiling"}, key
        for phase, value in rows.items():
            if check == "temperature":  # the phase's hottest GPU
                assert value == max(served(TEMP, "gpu", phase)), (key, phase)
            elif check == "busy":  # the mean over the phase's instances and samples
                busy = served(BUSY, "instance", phase)
                assert min(busy) - 1e-6 <= value <= max(busy) + 1e-6, (key, phase)
            else:  # the sum over GPUs of each one's mean power in the phase
                steps = run.phase_steps(phase)
                per_gpu = [[_truth(run.served(s), POWER, "gpu")[g] for s in steps]
                           for g in _truth(run.served(steps[0]), POWER, "gpu")]
                low, high = sum(min(p) for p in per_gpu), sum(max(p) for p in per_gpu)
                assert low - 0.005 <= value <= high + 0.005, (key, phase, low, value, high)
