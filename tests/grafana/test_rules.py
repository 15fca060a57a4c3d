"""The recording and alerting rules as the ecosystem tests a mixin: promtool and vmalert-tool.

Input series are written in every exporter dialect, each in its own test group, and every group expects
the very same recorded series (names, labels, values): a dashboard over the recorded series cannot tell
which exporter wrote the data. The DCGM 4.7 names (dcgm-exporter 4.9+) are NVIDIA's own, from
NVIDIA/go-dcgm pkg/dcgm/const_fields.go, not fields.csv's rows, so a wrong row there fails here.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "grafana" / "rules" / "dcgm-bridge.rules.yml"


def _module(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "grafana"))
    try:
        spec = importlib.util.spec_from_file_location(f"grafana_{name}", ROOT / "grafana" / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "grafana"))


# One GPU, the same physical readings in every dialect: 250 W, 1000 J so far (+10 J per minute), 50 % busy,
# 61 °C, SM clock 1410 MHz, XID 79, 20 GiB of 80 GiB used, 0 reserved.
RUN = {"run_id": "r1", "phase": "profiling"}
DEVICE = {"host": "node-1", "UUID": "GPU-aaaa", "gpu": "0", **RUN}
WHOLE = {**DEVICE, "slot": "0"}
MIB = 1048576
FB_USED_MIB, FB_FREE_MIB = 20480, 61440

# dialect -> (host label, uuid label, {quantity: (exporter family, value at 0m, step per minute)})
LEGACY = {
    "power": ("DCGM_FI_DEV_POWER_USAGE", 250, 0), "energy": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1000000, 10000),
    "util": ("DCGM_FI_DEV_GPU_UTIL", 50, 0), "temp": ("DCGM_FI_DEV_GPU_TEMP", 61, 0),
    "clock": ("DCGM_FI_DEV_SM_CLOCK", 1410, 0), "xid": ("DCGM_FI_DEV_XID_ERRORS", 79, 0),
    "fb_used": ("DCGM_FI_DEV_FB_USED", FB_USED_MIB, 0), "fb_free": ("DCGM_FI_DEV_FB_FREE", FB_FREE_MIB, 0),
    "fb_reserved": ("DCGM_FI_DEV_FB_RESERVED", 0, 0),
}
DCGM47 = {  # NVIDIA's DCGM 4.7 names and units: J, 0-1 ratio, Hz (FB fields keep their names and MiB)
    **LEGACY,
    "power": ("DCGM_FI_DEV_BOARD_POWER_WATTS", 250, 0), "energy": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1000, 10),
    "util": ("DCGM_FI_DEV_GPU_UTIL_RATIO", 0.5, 0), "temp": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 61, 0),
    "clock": ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1410000000, 0), "xid": ("DCGM_FI_DEV_XID_ERROR", 79, 0),
}
OLD = {  # -o / 1.x: etc/1.x-compatibility-metrics.csv (no FB_RESERVED there)
    "power": ("dcgm_power_usage", 250, 0), "energy": ("dcgm_total_energy_consumption", 1000000, 10000),
    "util": ("dcgm_gpu_utilization", 50, 0), "temp": ("dcgm_gpu_temp", 61, 0), "clock": ("dcgm_sm_clock", 1410, 0),
    "xid": ("dcgm_xid_errors", 79, 0), "fb_used": ("dcgm_fb_used", FB_USED_MIB, 0),
    "fb_free": ("dcgm_fb_free", FB_FREE_MIB, 0),
}
DIALECTS: dict[str, tuple[str, str, dict[str, tuple[str, float, float]], bool]] = {
    # name: (host label, uuid label, families, counters carry `_total` as a Prometheus-style OTLP receiver writes)
    "dcgm-exporter<=4.5 Hostname": ("Hostname", "UUID", LEGACY, False),
    "dcgm-exporter 4.6-4.8 hostname": ("hostname", "UUID", LEGACY, False),
    "dcgm-exporter 4.9+ DCGM 4.7 names": ("hostname", "UUID", DCGM47, False),
    "DCGM 4.7 names via OTLP with _total": ("hostname", "UUID", DCGM47, True),
    "-o 1.x names": ("Hostname", "uuid", OLD, False),
    "legacy via OTLP with _total": ("Hostname", "UUID", LEGACY, True),
}
XID_LABELS = {"err_code": "79", "err_msg": "Fallen off the bus"}


def _labels(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _series(name: str, labels: dict[str, str], start: float, step: float) -> dict[str, str]:
    return {"series": name + _labels(labels), "values": f"{_plain(start)}+{_plain(step)}x10"}


def _plain(x: float) -> str:
    """vmalert-tool's series notation reads no exponents."""
    return str(int(x)) if x == int(x) else repr(x)


def _expected(records: list[str]) -> list[tuple[str, dict[str, str], float]]:
    """(query, labels, value) at 5m: the same for every dialect."""
    out = [
        ("dcgm_bridge:gpu_power_watts", DEVICE, 250), ("dcgm_bridge:gpu_energy_joules_total", DEVICE, 1050),
        ("dcgm_bridge:gpu_utilization_ratio", WHOLE, 0.5), ("dcgm_bridge:gpu_busy_ratio", WHOLE, 0.5),
        ("dcgm_bridge:gpu_temperature_celsius", DEVICE, 61), ("dcgm_bridge:gpu_sm_clock_hertz", DEVICE, 1.41e9),
        ("dcgm_bridge:gpu_xid_code", {**WHOLE, **XID_LABELS}, 79),
        ("dcgm_bridge:gpu_fb_used_bytes", WHOLE, FB_USED_MIB * MIB),
        ("dcgm_bridge:gpu_fb_used_ratio", WHOLE, 0.25),
        ("dcgm_bridge:gpu_last_sample_timestamp_seconds", DEVICE, 300),
    ]
    assert {q for q, _, _ in out} <= set(records)
    return out


def _test_group(dialect: str, records: list[str], expr_key: str) -> dict[str, Any]:
    host_label, uuid_label, families, otlp_total = DIALECTS[dialect]
    base = {host_label: "node-1", uuid_label: "GPU-aaaa", "gpu": "0", "modelName": "NVIDIA H100 80GB HBM3",
            "instance": "sidecar-0:9400", "job": "dcgm-bridge", **RUN}
    inputs = []
    for quantity, (name, start, step) in families.items():
        labels = {**base, **(XID_LABELS if quantity == "xid" else {})}
        if otlp_total and quantity == "energy":
            name += "_total"
        inputs.append(_series(name, labels, start, step))
    # A finished phase of the same GPU lingers in the store (OTLP: no staleness marker): never recorded.
    power_name = families["power"][0]
    inputs.append({"series": power_name + _labels({**base, "phase": "warmup"}), "values": "999 999 _x8"})
    tests = [{"expr": query + _labels(labels), "eval_time": "5m",
              "exp_samples": [{"labels": query + _labels(labels), "value": value}]}
             for query, labels, value in _expected(records)]
    tests.append({"expr": 'count(dcgm_bridge:gpu_power_watts{phase="warmup"}) or vector(0)', "eval_time": "5m",
                  "exp_samples": [{"labels": "{}", "value": 0}]})
    return {"name": dialect, "interval": "1m", "input_series": inputs, expr_key: tests,
            "alert_rule_test": [{"eval_time": "5m", "alertname": "DcgmBridgeXidSeen", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "host": "node-1", "UUID": "GPU-aaaa", "gpu": "0", **XID_LABELS},
                "exp_annotations": {
                    "summary": "XID 79 on node-1 GPU 0 (GPU-aaaa)",
                    "description": "Fallen off the bus. dcgm-exporter keeps reporting the last XID until it "
                                   "restarts (dcgm-exporter #500)."}}]}]}


def _mig_group(records: list[str], expr_key: str) -> dict[str, Any]:
    """A MIG GPU: device fields repeat on every instance (counted once), GPU_UTIL absent, GR_ENGINE per
    instance; a profiling instance at 0 % fires the idle alert."""
    base = {"Hostname": "node-1", "UUID": "GPU-aaaa", "gpu": "0", **RUN}
    inputs = []
    for gid, busy in ((3, 0.8), (4, 0.0)):
        inst = {**base, "GPU_I_ID": str(gid), "GPU_I_PROFILE": "2g.20gb"}
        inputs += [_series("DCGM_FI_DEV_POWER_USAGE", inst, 250, 0),
                   _series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", inst, busy, 0)]
    instance = {**DEVICE, "GPU_I_ID": "3", "GPU_I_PROFILE": "2g.20gb", "slot": "0 2g.20gb 3"}
    tests = [
        {"expr": "dcgm_bridge:gpu_power_watts", "eval_time": "5m",
         "exp_samples": [{"labels": "dcgm_bridge:gpu_power_watts" + _labels(DEVICE), "value": 250}]},
        {"expr": 'dcgm_bridge:gpu_busy_ratio{GPU_I_ID="3"}', "eval_time": "5m",
         "exp_samples": [{"labels": "dcgm_bridge:gpu_busy_ratio" + _labels(instance), "value": 0.8}]},
    ]
    assert "dcgm_bridge:gpu_busy_ratio" in records
    return {"name": "MIG", "interval": "1m", "input_series": inputs, expr_key: tests,
            "alert_rule_test": [{"eval_time": "5m", "alertname": "DcgmBridgeGpuIdleWhileProfiling", "exp_alerts": [{
                "exp_labels": {"severity": "warning", **DEVICE, "slot": "0 2g.20gb 4"},
                "exp_annotations": {"summary": "node-1 GPU 0 2g.20gb 4 (GPU-aaaa) is at 0 % during profiling of run r1",
                                    "description": "The benchmark is profiling but this GPU does no work."}}]}]}


# The sidecar's refresh self-metrics, one endpoint per case (at 5m = 300 s; stale past 3 × max(period, 30 s)):
# node-1 refreshed just now; node-2 stuck since 10 s; node-3 refreshes every 60 s and is 100 s old (< 180 s);
# node-4 has no period yet and is 300 s old (> 90 s). node-1's finished warmup phase lingers with another
# period: the recorded period is the current phase's.
REFRESH = {  # endpoint: (last refresh series, period series or None)
    "node-1:9400": ("0+60x10", "30x10"), "node-2:9400": ("10x10", "30x10"), "node-3:9400": ("200x10", "60x10"),
    "node-4:9400": ("0x10", None),
}
SIDECAR = {"instance": "sidecar-0:8086", "job": "dcgm-bridge"}


def _refresh_group(expr_key: str) -> dict[str, Any]:
    inputs = []
    for endpoint, (last, period) in REFRESH.items():
        labels = {"endpoint": endpoint, **SIDECAR, **RUN}
        inputs.append({"series": "dcgm_bridge_exporter_last_refresh_timestamp_seconds" + _labels(labels),
                       "values": last})
        if period:
            inputs.append({"series": "dcgm_bridge_exporter_refresh_period_seconds" + _labels(labels),
                           "values": period})
    warmup = {"endpoint": "node-1:9400", **SIDECAR, **RUN, "phase": "warmup"}
    inputs.append({"series": "dcgm_bridge_exporter_refresh_period_seconds" + _labels(warmup), "values": "999 _x9"})
    record = "dcgm_bridge:exporter_refresh_period_seconds"
    tests = [{"expr": record, "eval_time": "5m", "exp_samples": [
        {"labels": record + _labels({"endpoint": e, **SIDECAR}), "value": float(p.split("x")[0])}
        for e, (_, p) in REFRESH.items() if p]}]
    annotations = {"summary": "dcgm-exporter {endpoint} serves old values",
                   "description": "No new DCGM refresh for over 3 refresh periods (at least 90 s): dcgm-exporter "
                                  "or DCGM under it is stuck. The sidecar's own measure "
                                  "(dcgm_bridge_exporter_last_refresh_timestamp_seconds)."}
    alerts = [{"exp_labels": {"severity": "warning", "endpoint": e, **SIDECAR},
               "exp_annotations": {k: v.format(endpoint=e) for k, v in annotations.items()}}
              for e in ("node-2:9400", "node-4:9400")]
    return {"name": "exporter refresh", "interval": "1m", "input_series": inputs, expr_key: tests,
            "alert_rule_test": [{"eval_time": "5m", "alertname": "DcgmBridgeExporterStale", "exp_alerts": alerts}]}


def _test_file(tmp_path: Path, expr_key: str) -> Path:
    records = [r["record"] for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]]
    groups = [_test_group(d, records, expr_key) for d in DIALECTS] + [_mig_group(records, expr_key),
                                                                       _refresh_group(expr_key)]
    doc: dict[str, Any] = {"rule_files": [str(RULES)], "evaluation_interval": "1m"}
    if expr_key == "metricsql_expr_test":  # vmalert-tool names the alert's group, and labels alerts with it
        for group in groups:
            for alert in group["alert_rule_test"]:
                alert["groupname"] = "dcgm-bridge.alerts"
                for exp in alert["exp_alerts"]:
                    exp["exp_labels"]["alertgroup"] = "dcgm-bridge.alerts"
    doc["tests"] = groups
    path = tmp_path / f"{expr_key}.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_committed_rules_are_generate_pys_output():
    rules = _module("rules")
    assert RULES.read_text(encoding="utf-8") == rules.render(rules.rule_groups()), \
        "run python grafana/generate.py"


def test_every_fields_csv_family_is_recorded_under_one_name_and_unit():
    rules = _module("rules")
    rows = rules.read_rows()
    recorded = rules.by_record(rows)
    for name, family in recorded.items():
        assert len({(r.unit, r.kind, r.level) for r in family}) == 1, name
    assert {r.name for rs in recorded.values() for r in rs} == {r.name for r in rows}


@pytest.mark.realstack
def test_promtool_checks_the_rules():
    promtool = require_binary("promtool")
    out = subprocess.run([str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _run(argv: list[str], cwd: Path) -> None:
    out = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.realstack
def test_every_dialect_records_the_same_series_in_promtool(tmp_path):
    promtool = require_binary("promtool")
    _run([str(promtool), "test", "rules", str(_test_file(tmp_path, "promql_expr_test"))], tmp_path)


@pytest.mark.realstack
def test_every_dialect_records_the_same_series_in_vmalert_tool(tmp_path):
    tool = require_binary("vmalert-tool")
    _run([str(tool), "unittest", f"--files={_test_file(tmp_path, 'metricsql_expr_test')}"], tmp_path)


def test_the_readme_explains_every_recorded_series_and_alert():
    readme = (ROOT / "grafana" / "README.md").read_text(encoding="utf-8")
    doc = yaml.safe_load(RULES.read_text())
    names = [r.get("record") or r["alert"] for group in doc["groups"] for r in group["rules"]]
    missing = [name for name in names if f"`{name}`" not in readme]
    assert not missing, f"grafana/README.md does not name {missing}"
