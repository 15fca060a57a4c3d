"""Recording and alerting rules (Prometheus rule-file format) generated from bridge/data/fields.csv.

Every exporter dialect — dcgm-exporter <= 4.5 (`Hostname`), 4.6+ (`hostname`), `-o`/1.x (`dcgm_*` names,
`uuid`), 4.9+ (DCGM 4.7 names in SI units), MIG instances, vGPU — is recorded as one set of series
`dcgm_bridge:gpu_<quantity>_<unit>` in one unit each, with the same identity labels:

    host, UUID, gpu, run_id, phase                      device-level fields (one series per physical GPU)
    host, UUID, gpu, GPU_I_ID, GPU_I_PROFILE, slot, …   instance-level fields (per GPU or MIG instance)
    … + err_code, err_msg                               XID

fields.csv names each exporter family with its report key, unit and scale (value × scale = report unit);
the recorded unit is the SI unit of that report unit (UNITS below), so a row added or corrected there is
recorded with the right name and factor on the next `python grafana/generate.py`.

Inside each rule (so the dashboards need not):
- the host label from either spelling (dcgm-exporter #655 renamed `Hostname` to `hostname` in 4.6);
- `_total` appended by Prometheus-style OTLP receivers to counters: selected as `{__name__=~"M(_total)?"}`;
- MIG: device-level fields repeat on every GPU-instance series (dcgm-exporter #317, #353): `max by` the
  device identity, so a device-level series exists once per GPU;
- lingering series: `run_id`/`phase` split a GPU's data into several series, and OTLP-fed stores answer
  with a series for up to 5 minutes after its last sample; only each GPU's newest series is recorded
  (`timestamp(M) == max by (UUID) (timestamp(M))`), so a finished phase does not add to the current one.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIELDS_CSV = Path(__file__).resolve().parents[1] / "bridge" / "data" / "fields.csv"
PREFIX = "dcgm_bridge:gpu_"

# Report unit (fields.csv `unit`) -> (recorded unit suffix, factor from the report unit to it).
UNITS: dict[str, tuple[str, float]] = {
    "W": ("watts", 1.0), "MJ": ("joules", 1e6), "%": ("ratio", 0.01), "GB": ("bytes", 1e9),
    "°C": ("celsius", 1.0), "MHz": ("hertz", 1e6), "us": ("seconds", 1e-6), "MB/s": ("bytes_per_second", 1e6),
    "MB": ("bytes", 1e6),
    "count": ("", 1.0), "code": ("code", 1.0),
}
# Report key (minus `nvidia_`) -> the quantity's name in the recorded series, where the key reads badly.
QUANTITY = {
    "power_usage": "power", "energy_consumption": "energy", "gpu_utilization": "utilization",
    "memory_utilization": "memory_copy_utilization", "memory_used": "fb_used", "xid_errors": "xid",
    "pcie_tx_bytes": "pcie_tx", "pcie_rx_bytes": "pcie_rx", "nvlink_tx_bytes": "nvlink_tx",
    "nvlink_rx_bytes": "nvlink_rx", "memory_temp": "memory_temperature", "sm_utilization": "sm_active",
}

# DCGM 4.7 names (dcgm-exporter 4.9+) that fields.csv does not have yet (its rows guessed the names; the
# correction is issue 14). From NVIDIA's field table, NVIDIA/go-dcgm pkg/dcgm/const_fields.go (DCGM 4.7
# ids 1603, 1604, 1611, 230, 1001-1008, 449) and the dcgm-exporter 4.9.0 release notes (Hz, J, 0-1 ratios).
# Used only for a name fields.csv lacks, so this table retires itself once fields.csv has them: delete it then.
# Columns as fields.csv: name, key, unit, scale, kind, level.
DCGM47_NOT_YET_IN_FIELDS = """
DCGM_FI_DEV_SM_CLOCK_HERTZ,nvidia_sm_clock,MHz,1e-6,gauge,device
DCGM_FI_DEV_MEMORY_CLOCK_HERTZ,nvidia_mem_clock,MHz,1e-6,gauge,device
DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL,nvidia_energy_consumption,MJ,1e-6,counter,device
DCGM_FI_DEV_XID_ERROR,nvidia_xid_errors,code,1,code,instance
DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO,nvidia_gr_engine_active,%,100,gauge,instance
DCGM_FI_PROF_SM_UTIL_RATIO,nvidia_sm_utilization,%,100,gauge,instance
DCGM_FI_PROF_SM_OCCUPANCY_RATIO,nvidia_sm_occupancy,%,100,gauge,instance
DCGM_FI_PROF_TENSOR_UTIL_RATIO,nvidia_pipe_tensor_active,%,100,gauge,instance
DCGM_FI_PROF_DRAM_UTIL_RATIO,nvidia_dram_active,%,100,gauge,instance
DCGM_FI_PROF_FP64_UTIL_RATIO,nvidia_pipe_fp64_active,%,100,gauge,instance
DCGM_FI_PROF_FP32_UTIL_RATIO,nvidia_pipe_fp32_active,%,100,gauge,instance
DCGM_FI_PROF_FP16_UTIL_RATIO,nvidia_pipe_fp16_active,%,100,gauge,instance
"""

DEVICE_BY = ("host", "UUID", "gpu", "run_id", "phase")
INSTANCE_BY = ("host", "UUID", "gpu", "GPU_I_ID", "GPU_I_PROFILE", "slot", "run_id", "phase")
CODE_BY = ("err_code", "err_msg")
STALE_WINDOW = "2m"  # "no new value": four refreshes at dcgm-exporter's default 30 s DCGM refresh (-c 30000)


@dataclass(frozen=True)
class Row:
    name: str
    key: str
    unit: str
    scale: float
    kind: str  # gauge | counter | code
    level: str  # device | instance


def read_rows(path: Path = FIELDS_CSV) -> list[Row]:
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
    rows = [Row(r["name"], r["key"], r["unit"], float(r["scale"]), r["kind"], r["level"])
            for r in csv.DictReader(lines)]
    known = {r.name for r in rows}
    for line in DCGM47_NOT_YET_IN_FIELDS.strip().splitlines():
        name, key, unit, scale, kind, level = line.split(",")
        if name not in known:
            rows.append(Row(name, key, unit, float(scale), kind, level))
    return rows


def record_name(row: Row) -> str:
    stem = row.key.removeprefix("nvidia_")
    stem = QUANTITY.get(stem, stem)
    suffix, _ = UNITS[row.unit]
    if row.kind == "counter":
        stem = stem.removesuffix("_total")
        return f"{PREFIX}{stem}{'_' + suffix if suffix else ''}_total"
    return f"{PREFIX}{stem}_{suffix}" if suffix else f"{PREFIX}{stem}"


def _number(x: float) -> str:
    return f"{x:.12g}"


def _selector(row: Row) -> str:
    return f'{{__name__=~"{row.name}(_total)?"}}' if row.kind == "counter" else row.name


def _uuid_label(row: Row) -> str:
    return "uuid" if row.name.startswith("dcgm_") else "UUID"  # -o/1.x (etc/1.x-compatibility-metrics.csv)


def normalised(row: Row) -> str:
    """One exporter family as recorded: fresh series only, host/UUID/slot labels, identity, unit."""
    sel, uuid = _selector(row), _uuid_label(row)
    fresh = f"{sel} and (timestamp({sel}) == on({uuid}) group_left() max by ({uuid}) (timestamp({sel})))"
    expr = _hosted(f"({fresh})", uuid)
    by = DEVICE_BY if row.level == "device" else INSTANCE_BY
    if row.level != "device":  # a legend-ready name for a GPU or MIG instance: "0", "1 2g.20gb 3"
        expr = f'label_join({expr}, "slot", " ", "gpu", "GPU_I_PROFILE", "GPU_I_ID")'
        expr = f'label_replace({expr}, "slot", "$1", "slot", "(.*?) *")'
    if row.kind == "code":
        by = by + CODE_BY
    out = f"max by ({', '.join(by)}) ({expr})"
    factor = float(_number(row.scale * UNITS[row.unit][1]))
    return out if factor == 1 else f"{out} * {_number(factor)}"


def _hosted(expr: str, uuid: str) -> str:
    expr = f'label_replace(label_replace({expr}, "host", "$1", "Hostname", "(.+)"), "host", "$1", "hostname", "(.+)")'
    return f'label_replace({expr}, "UUID", "$1", "uuid", "(.+)")' if uuid == "uuid" else expr


def _newest_sample(row: Row) -> str:
    """Time of a GPU's newest sample of `row` (timestamp() of the selector itself: of an expression it would
    be the evaluation time)."""
    return f"max by ({', '.join(DEVICE_BY)}) ({_hosted(f'timestamp({_selector(row)})', _uuid_label(row))})"


def by_record(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for row in rows:
        if row.unit in UNITS:
            out.setdefault(record_name(row), []).append(row)
    return out


def _any(rows: list[Row]) -> str:
    """The recorded quantity from whichever dialect's family a store holds (one per GPU in practice)."""
    return "\n  or\n".join(f"({normalised(r)})" for r in rows)


def recording_rules(rows: list[Row]) -> list[dict[str, Any]]:
    groups = by_record(rows)
    rules = [{"record": name, "expr": _any(family)} for name, family in groups.items()]
    util, gr = groups.get(f"{PREFIX}utilization_ratio", []), groups.get(f"{PREFIX}gr_engine_active_ratio", [])
    # DCGM_FI_DEV_GPU_UTIL is absent on MIG instances and some GPU Operator stacks (dcgm-exporter #216, #430,
    # #634): GR_ENGINE_ACTIVE (same 0-1 scale once recorded) stands in.
    rules.append({"record": f"{PREFIX}busy_ratio", "expr": f"({_any(util)})\nor\n({_any(gr)})"})
    used, free = _any(groups[f"{PREFIX}fb_used_bytes"]), _any(groups[f"{PREFIX}fb_free_bytes"])
    reserved = _any(groups[f"{PREFIX}fb_reserved_bytes"])
    rules.append({"record": f"{PREFIX}fb_used_ratio",
                  "expr": f"({used})\n/\n(({used}) + ({free}) + (({reserved}) or ({used}) * 0))"})
    # Newest sample per GPU (FB_USED: present on every kind of GPU, vGPU included, dcgm-exporter #236).
    stamps = "\n  or\n".join(f"({_newest_sample(r)})" for r in groups[f"{PREFIX}fb_used_bytes"])
    rules.append({"record": f"{PREFIX}last_sample_timestamp_seconds", "expr": stamps})
    rules.append({"record": "dcgm_bridge:exporter_dialect_info", "expr": _dialect_info(rows)})
    return rules + refresh_rules()


# The sidecar's self-metrics about each DCGM endpoint's refresh (bridge/scrape.py RefreshWatch), on its pull
# /metrics page and over OTLP: labelled by `endpoint` (host:port of the exporter), plus the sidecar's identity
# (instance/job, resource attributes) and run_id/phase.
REFRESH_PERIOD = "dcgm_bridge_exporter_refresh_period_seconds"
LAST_REFRESH = "dcgm_bridge_exporter_last_refresh_timestamp_seconds"
STALE_PERIODS, STALE_FLOOR_S = 3, 30


def refresh_rules() -> list[dict[str, Any]]:
    """Per endpoint, across the run's phases: its refresh cadence and when its values last changed."""
    newest = f"(timestamp({REFRESH_PERIOD}) == ignoring(run_id, phase) group_left() " \
             f"max without (run_id, phase) (timestamp({REFRESH_PERIOD})))"
    return [
        # The current phase's series only: a finished phase's lingers in OTLP-fed stores with an older median.
        {"record": "dcgm_bridge:exporter_refresh_period_seconds",
         "expr": f"max without (run_id, phase) ({REFRESH_PERIOD} and {newest})"},
        {"record": "dcgm_bridge:exporter_last_refresh_timestamp_seconds",
         "expr": f"max without (run_id, phase) ({LAST_REFRESH})"},
    ]


# A family only one dialect writes, per dialect (the power field: present on whole GPUs, MIG and vGPU).
DIALECT_MARKERS = {
    "dcgm-exporter<=4.8": "DCGM_FI_DEV_POWER_USAGE",
    "dcgm-exporter>=4.9 (DCGM 4.7 names)": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "-o/1.x names": "dcgm_power_usage",
}


def _dialect_info(rows: list[Row]) -> str:
    """1 per host, dialect and host-label spelling: which exporter a node runs, to explain a mixed fleet."""
    parts = []
    for dialect, marker in DIALECT_MARKERS.items():
        for label in ("Hostname", "hostname"):
            sel = f'group by ({label}) ({marker}{{{label}!=""}})'
            sel = f'label_replace({sel}, "host", "$1", "{label}", "(.+)")'
            sel = f'label_replace({sel}, "host_label", "{label}", "", "")'
            parts.append(f'label_replace({sel}, "dialect", "{dialect}", "", "")')
    return "group by (host, dialect, host_label) (\n  " + "\n  or\n  ".join(parts) + "\n)"


def _throttling(title: str, reason: str, severity: str, summary: str, by_what: str) -> dict[str, Any]:
    """Share of time a DCGM_FI_DEV_*_VIOLATION counter (ns of throttling, recorded in s) says the GPU was held back."""
    return {"alert": f"DcgmBridge{title}Throttling",
            "expr": f"max by (host, UUID, gpu) (rate({PREFIX}{reason}_violation_seconds_total[5m])) > 0.01",
            "for": "1m", "labels": {"severity": severity},
            "annotations": {"summary": summary,
                            "description": f"Share of time held back by {by_what}: "
                                           "{{ $value | humanizePercentage }}."}}


def alerting_rules() -> list[dict[str, Any]]:
    p = PREFIX
    gpu = "{{ $labels.host }} GPU {{ $labels.gpu }} ({{ $labels.UUID }})"
    age, period = "dcgm_bridge:exporter_last_refresh_timestamp_seconds", "dcgm_bridge:exporter_refresh_period_seconds"
    return [
        {"alert": "DcgmBridgeXidSeen",
         "expr": f"max by (host, UUID, gpu, err_code, err_msg) ({p}xid_code) > 0",
         "labels": {"severity": "warning"},
         "annotations": {"summary": f"XID {{{{ $labels.err_code }}}} on {gpu}",
                         "description": "{{ $labels.err_msg }}. dcgm-exporter keeps reporting the last XID "
                                        "until it restarts (dcgm-exporter #500)."}},
        _throttling("Thermal", "thermal", "warning", f"{gpu} is thermally throttled", "thermal limits"),
        _throttling("Power", "power", "info", f"{gpu} is held at its power limit", "the power cap"),
        {"alert": "DcgmBridgeExporterStale",
         # No new DCGM refresh for STALE_PERIODS periods (at least STALE_FLOOR_S each: dcgm-exporter's default
         # collect interval, and a floor for a period measured short); an endpoint whose period is not known
         # yet (fewer than two refreshes seen) gets the floor. The value is the age of the values in seconds.
         "expr": f"(time() - {age}) > {STALE_PERIODS} * clamp_min({period}, {STALE_FLOOR_S})\n"
                 f"or\n(time() - {age} > {STALE_PERIODS * STALE_FLOOR_S}) unless {period}",
         "for": "1m", "labels": {"severity": "warning"},
         "annotations": {"summary": "dcgm-exporter {{ $labels.endpoint }} serves old values",
                         "description": f"No new DCGM refresh for over {STALE_PERIODS} refresh periods (at least "
                                        f"{STALE_PERIODS * STALE_FLOOR_S} s): dcgm-exporter or DCGM under it is "
                                        "stuck. The sidecar's own measure (dcgm_bridge_exporter_last_refresh_"
                                        "timestamp_seconds)."}},
        {"alert": "DcgmBridgeEnergyCounterFrozen",
         # Without the sidecar (dcgm-exporter scraped directly) there is no refresh self-metric: the energy
         # counter moves at every DCGM refresh while a GPU is powered, so unchanged for several refresh
         # periods means the exporter (or DCGM under it) serves old values.
         "expr": f"max by (host, UUID, gpu) (changes({p}energy_joules_total[{STALE_WINDOW}])) == 0",
         "for": "1m", "labels": {"severity": "warning"},
         "annotations": {"summary": f"No new value from {gpu} for {STALE_WINDOW}",
                         "description": "The energy counter has not changed: dcgm-exporter or DCGM is stuck."}},
        {"alert": "DcgmBridgeExporterDown",
         "expr": "increase(dcgm_bridge_scrape_errors_total[2m]) > 0 or up{job=~\".*dcgm.*\"} == 0",
         "for": "1m", "labels": {"severity": "critical"},
         "annotations": {"summary": "dcgm-exporter {{ $labels.endpoint }}{{ $labels.instance }} cannot be scraped",
                         "description": "The sidecar's scrapes fail ({{ $labels.kind }}), or Prometheus' do."}},
        {"alert": "DcgmBridgeGpuIdleWhileProfiling",
         # per GPU or MIG instance (slot): one idle instance of a busy GPU is a lost share of the benchmark
         "expr": f'max by (host, UUID, gpu, slot, run_id, phase) ({p}busy_ratio{{phase=~"(?i)profil.*"}}) == 0',
         "for": "30s", "labels": {"severity": "warning"},
         "annotations": {"summary": "{{ $labels.host }} GPU {{ $labels.slot }} ({{ $labels.UUID }}) is at 0 % "
                                    "during {{ $labels.phase }} of run {{ $labels.run_id }}",
                         "description": "The benchmark is profiling but this GPU does no work."}},
    ]


def rule_groups(rows: list[Row] | None = None, interval: str = "") -> dict[str, Any]:
    rows = read_rows() if rows is None else rows
    rec: dict[str, Any] = {"name": "dcgm-bridge.rules", "rules": recording_rules(rows)}
    alerts: dict[str, Any] = {"name": "dcgm-bridge.alerts", "rules": alerting_rules()}
    if interval:
        rec["interval"] = alerts["interval"] = interval
    return {"groups": [rec, alerts]}


def render(doc: dict[str, Any]) -> str:
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    _Dumper.add_representer(str, _str)
    header = "# Generated by grafana/generate.py from bridge/data/fields.csv: edit those, not this file.\n"
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=200, allow_unicode=True)


def record_names(rows: list[Row] | None = None) -> Iterator[str]:
    for rule in rule_groups(rows)["groups"][0]["rules"]:
        yield rule["record"]
