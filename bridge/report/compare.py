"""`dcgm-bridge compare A B [C …]`: each configuration against the first, per metric, with a 95 % interval that holds
both the run-to-run variation and each run's measurement `uncertainty` (issue 45, its first part).

A configuration is a folder: one run (its `profile_export_aiperf.json`) or a folder of repeats (`run_NNNN/`,
AIPerf's multi-run `profile_runs/run_NNNN/`, or any sub-folders each holding one report). Per metric and side:

- the mean of the runs' values and, with two or more, their sample variance over n (the run-to-run part, as AIPerf's
  `orchestrator/aggregation/confidence.py` takes it);
- the measurement part: each run's stated uncertainty is a 95 % half-width (README "the uncertainty"); it is not
  assumed to average away over repeats (a sensor's bias repeats with the run), so the side's share is the runs'
  mean half-width / 1.96 as a standard error.

The difference B − A has the two sides' variances summed; its interval takes Student's t at Welch-Satterthwaite's
degrees of freedom from the run-to-run parts (the measurement parts counted as known). With one run on a side the
run-to-run variation is unknown: the interval is the measurement part alone and the row is marked. A row is
"better" or "worse" only when its interval excludes 0 (each metric's better direction known), else "inconclusive";
a difference inside the measurement uncertainty alone is therefore never called.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPORT_FILE = "profile_export_aiperf.json"
Z95 = 1.959964

# (key in the report, what the row says, unit, lower is better). Energies and powers per vendor (AIPerf's `nvidia_*`
# and `amd_*` families); throughput from AIPerf's own metrics, which carry no measurement uncertainty.
METRICS: tuple[tuple[str, str, str, bool], ...] = (
    ("total_gpu_energy", "Total GPU Energy", "J", True),
    ("energy_per_output_token", "Energy per Output Token", "mJ/token", True),
    ("output_tokens_per_joule", "Output Tokens per Joule", "tokens/J", False),
    ("average_gpu_power", "Average GPU Power", "W", True),
    ("output_token_throughput", "Output Token Throughput", "tokens/sec", False),
)
_ENERGY_SHARE = ("total_gpu_energy", "energy_per_output_token", "output_tokens_per_joule", "average_gpu_power")
# Energy per phase (`phase:<name>`, from the phase files) and the GPU gauges' means (`gauge:<metric>`, the window's
# averages in `telemetry_data` averaged over the GPUs; their measurement uncertainty is not stated, so 0).
PHASE_PREFIX = "phase:"
GAUGE_PREFIX = "gauge:"
_ENERGY_UNITS = {"J": 1.0, "kJ": 1e3, "MJ": 1e6}
# A gauge's better direction where it has one (the name after the vendor prefix); others are called higher or lower.
_GAUGE_LOWER_BETTER: dict[str, bool] = {"power_usage": True, "temperature": True, "gpu_temperature": True,
                                         "memory_temperature": True, "memory_temp": True, "power_violation": True,
                                         "thermal_violation": True, "xid_errors": True}

# Student's t at 97.5 % for 1-30 degrees of freedom; between them linear in 1/df, beyond 30 Cornish-Fisher's series.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


class CompareError(ValueError):
    """A folder that holds no report, or reports that cannot be compared: one line naming it."""


@dataclass(frozen=True, slots=True)
class Run:
    path: Path
    valid: bool
    values: dict[str, tuple[float, float]]  # metric → (value, stated 95 % half-width)
    config: Any = None  # AIPerf's input_config, for --sweep
    labels: dict[str, tuple[str, str, bool | None]] = field(default_factory=dict)  # phase:/gauge: → (name, unit,
    # lower is better, None where neither)


@dataclass(frozen=True, slots=True)
class Side:
    folder: Path
    runs: tuple[Run, ...]
    left_out: tuple[Path, ...]  # NOT-valid runs, unless included


@dataclass(frozen=True, slots=True)
class Row:
    metric: str
    name: str
    unit: str
    baseline: float
    value: float
    difference: float
    low: float
    high: float
    verdict: str  # better, worse, inconclusive; higher, lower for a gauge without a better direction
    measurement_only: bool  # one run on a side: run-to-run variation unknown

    @property
    def relative(self) -> tuple[float, float, float]:
        """The difference and its interval as shares of the baseline."""
        return self.difference / self.baseline, self.low / self.baseline, self.high / self.baseline


def t975(df: float) -> float:
    if df <= 1:
        return _T975[0]
    if df >= 30:
        z = Z95
        return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
    lo = int(df)
    if lo == df:
        return _T975[lo - 1]
    a, b = _T975[lo - 1], _T975[lo]
    w = (1 / lo - 1 / df) / (1 / lo - 1 / (lo + 1))
    return a + (b - a) * w


def find_runs(folder: Path) -> list[Path]:
    """The reports a configuration's folder holds: its own, else one per sub-folder (two levels down: AIPerf's
    `profile_runs/run_NNNN/`), sorted. Links are not followed."""
    if not folder.is_dir() or folder.is_symlink():
        raise CompareError(f"{folder}: not a folder (give an artifact folder or a folder of repeats)")
    own = folder / REPORT_FILE
    multi_run = (folder / "profile_runs").is_dir() and any((folder / "profile_runs").glob(f"run_*/{REPORT_FILE}"))
    if own.is_file() and not own.is_symlink() and not multi_run:  # (beside AIPerf's profile_runs/: the bridge's
        return [own]  # report over the whole series, not a repeat)
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):  # (followlinks=False: a link to a folder is not entered)
        depth = len(Path(root).relative_to(folder).parts)
        dirs[:] = sorted(dirs) if depth < 2 else []
        if multi_run and depth >= 1 and Path(root).relative_to(folder).parts[0] != "profile_runs":
            continue  # AIPerf's aggregate/ and the like: not runs
        if REPORT_FILE in files and depth >= 1 and not (Path(root) / REPORT_FILE).is_symlink():
            found.append(Path(root) / REPORT_FILE)
    if not found:
        raise CompareError(f"{folder}: no {REPORT_FILE} in it or in its sub-folders (run `dcgm-bridge profile` or "
                           "`dcgm-bridge report` there first)")
    return sorted(found)


def read_run(path: Path) -> Run:
    import orjson

    from bridge.files import read_output

    try:
        doc = orjson.loads(read_output(path))
    except (OSError, orjson.JSONDecodeError) as exc:
        raise CompareError(f"{path}: cannot read it as a report ({exc})") from None
    if not isinstance(doc, dict):
        raise CompareError(f"{path}: not a report (a JSON object is expected)")
    telemetry = doc.get("telemetry_data")
    measurement = telemetry.get("measurement") if isinstance(telemetry, dict) else None
    valid = bool(measurement.get("valid")) if isinstance(measurement, dict) else False
    energy = _vendor_sum(doc, "total_gpu_energy")
    stated = _vendor_sum(doc, "total_gpu_energy", "uncertainty")
    share = stated / energy if energy and stated is not None else 0.0  # the energy's relative uncertainty
    values: dict[str, tuple[float, float]] = {}
    for key, _, _, _ in METRICS:
        value = _number(doc, key) if key == "output_token_throughput" else _vendor_value(doc, key, energy)
        if value is None:
            continue
        values[key] = (value, abs(value) * share if key in _ENERGY_SHARE else 0.0)
    labels: dict[str, tuple[str, str, bool | None]] = {}
    for name, (joules, stated) in _phase_energies(path.parent).items():
        values[PHASE_PREFIX + name] = (joules, stated)
        labels[PHASE_PREFIX + name] = (f"Energy, phase {name}", "J", True)
    if isinstance(telemetry, dict):
        for key, (mean, unit) in _gauge_means(telemetry).items():
            values[GAUGE_PREFIX + key] = (mean, 0.0)
            labels[GAUGE_PREFIX + key] = (f"GPU mean {key}", unit, _GAUGE_LOWER_BETTER.get(key.split("_", 1)[-1]))
    return Run(path, valid, values, doc.get("input_config"), labels)


def _gpu_metrics(telemetry: dict[str, Any]) -> list[dict[str, Any]]:
    """Each GPU's `metrics` in a `telemetry_data` (or a phase file's `data`) block."""
    endpoints = telemetry.get("endpoints")
    found = []
    for endpoint in endpoints.values() if isinstance(endpoints, dict) else ():
        gpus = endpoint.get("gpus") if isinstance(endpoint, dict) else None
        for gpu in gpus.values() if isinstance(gpus, dict) else ():
            metrics = gpu.get("metrics") if isinstance(gpu, dict) else None
            if isinstance(metrics, dict):
                found.append(metrics)
    return found


def _phase_energies(folder: Path) -> dict[str, tuple[float, float]]:
    """Per phase file (`phases/<phase>/gpu_telemetry.json`, written when a run has 2+ phases): the GPUs' energy
    summed, in J, and its stated 95 % half-width summed as the report sums the run's (README "the uncertainty")."""
    import orjson

    from bridge.files import read_output

    out: dict[str, tuple[float, float]] = {}
    phases = folder / "phases"
    if not phases.is_dir() or phases.is_symlink():
        return out
    for phase_file in sorted(phases.glob("*/gpu_telemetry.json")):
        try:
            doc = orjson.loads(read_output(phase_file))
        except (OSError, orjson.JSONDecodeError):
            continue  # a phase file that cannot be read: that phase is not compared
        data = doc.get("data") if isinstance(doc, dict) else None
        phase = doc.get("phase") if isinstance(doc, dict) else None
        name = phase.get("phase_name") if isinstance(phase, dict) else None
        if not isinstance(data, dict) or not isinstance(name, str):
            continue
        energy = stated = 0.0
        seen = False
        for metrics in _gpu_metrics(data):
            for key, entry in metrics.items():
                if key.endswith("_energy_consumption") and isinstance(entry, dict):
                    scale = _ENERGY_UNITS.get(str(entry.get("unit")))
                    value, half = _number(metrics, key), _number(metrics, key, "uncertainty")
                    if scale is not None and value is not None:
                        energy += value * scale
                        stated += (half or 0.0) * scale
                        seen = True
        if seen:
            out[name] = (energy, stated)
    return out


def _gauge_means(telemetry: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """Each gauge (a metric with `avg` and `count`, as AIPerf's telemetry stats) averaged over the run's GPUs."""
    sums: dict[str, list[float]] = {}
    units: dict[str, str] = {}
    for metrics in _gpu_metrics(telemetry):
        for key, entry in metrics.items():
            if not isinstance(entry, dict) or "count" not in entry or (value := _number(metrics, key)) is None:
                continue
            sums.setdefault(key, []).append(value)
            units[key] = str(entry.get("unit", ""))
    return {key: (sum(v) / len(v), units[key]) for key, v in sorted(sums.items())}


def _number(doc: dict[str, Any], key: str, field: str = "avg") -> float | None:
    """A metric's finite number (`avg`, or `field`), else None."""
    entry = doc.get(key)
    value = entry.get(field) if isinstance(entry, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _vendor_sum(doc: dict[str, Any], key: str, field: str = "avg") -> float | None:
    found = [value for vendor in ("amd_", "nvidia_") if (value := _number(doc, vendor + key, field)) is not None]
    return sum(found) if found else None


def _vendor_value(doc: dict[str, Any], key: str, energy: float | None) -> float | None:
    """A vendor family's metric; in a mixed run, the energy-based ones from both vendors' energies together."""
    vendors = [v for v in ("amd_", "nvidia_") if isinstance(doc.get(v + key), dict)]
    if len(vendors) == 1:
        return _number(doc, vendors[0] + key)
    if not vendors or not energy:
        return None
    if key == "total_gpu_energy":
        return energy
    if key == "average_gpu_power":
        return _vendor_sum(doc, key)
    tokens = _number(doc, "total_osl")
    if not tokens:
        return None
    return energy * 1e3 / tokens if key == "energy_per_output_token" else tokens / energy


def load_side(folder: Path, include_invalid: bool = False) -> Side:
    runs = [read_run(p) for p in find_runs(folder)]
    kept = tuple(r for r in runs if r.valid or include_invalid)
    left = tuple(r.path for r in runs if not (r.valid or include_invalid))
    if not kept:
        raise CompareError(f"{folder}: every run's measurement is NOT valid ({', '.join(map(str, left))}); "
                           "give --include-invalid to compare them anyway")
    return Side(folder, kept, left)


def metrics_of(*sides: Side) -> list[tuple[str, str, str, bool | None]]:
    """The fixed metrics, then each phase's energy and each gauge's mean that any run of the sides has."""
    labels: dict[str, tuple[str, str, bool | None]] = {}
    for side in sides:
        for run in side.runs:
            labels.update(run.labels)
    extra = sorted(labels, key=lambda k: (not k.startswith(PHASE_PREFIX), k))
    return [*METRICS, *((k, *labels[k]) for k in extra)]


def compare(baseline: Side, other: Side) -> list[Row]:
    rows = []
    for key, name, unit, lower_better in metrics_of(baseline, other):
        a = [r.values[key] for r in baseline.runs if key in r.values]
        b = [r.values[key] for r in other.runs if key in r.values]
        if not a or not b:
            continue
        mean_a, var_a = _side(a)
        mean_b, var_b = _side(b)
        difference = mean_b - mean_a
        se = math.sqrt(var_a + var_b)
        unknown = len(a) < 2 or len(b) < 2
        half = (Z95 if unknown else t975(_welch_df(a, b))) * se
        low, high = difference - half, difference + half
        verdict = "inconclusive"
        if unknown and se == 0:
            pass  # one run a side and no stated uncertainty (throughput, a gauge): nothing to call it on
        elif (low > 0 or high < 0) and lower_better is None:
            verdict = "higher" if difference > 0 else "lower"
        elif low > 0 or high < 0:
            verdict = "better" if (difference < 0) == lower_better else "worse"
        if mean_a == 0:
            continue
        rows.append(Row(key, name, unit, mean_a, mean_b, difference, low, high, verdict, unknown))
    return rows


def parts(values: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """(mean, the run-to-run variance of the mean, the measurement's)."""
    n = len(values)
    mean = sum(v for v, _ in values) / n
    run_to_run = sum((v - mean) ** 2 for v, _ in values) / (n - 1) / n if n > 1 else 0.0
    return mean, run_to_run, (sum(u for _, u in values) / n / Z95) ** 2


def _side(values: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(mean, the variance of the mean: run-to-run plus the measurement's)."""
    mean, run_to_run, measurement = parts(values)
    return mean, run_to_run + measurement


def _welch_df(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    return welch_df([(*parts(values)[1:], len(values)) for values in (a, b)])


def welch_df(sides: Sequence[tuple[float, float, int]]) -> float:
    """Welch-Satterthwaite's degrees of freedom over sides of (run-to-run variance of the mean, the measurement's,
    runs): the run-to-run parts estimated (n − 1 each), the measurement parts counted as known."""
    total = sum(run + measured for run, measured, _ in sides)
    denominator = sum(run ** 2 / (n - 1) for run, _, n in sides if run > 0)
    return total ** 2 / denominator if denominator > 0 else math.inf


def as_json(baseline: Side, others: Sequence[Side], results: Sequence[Sequence[Row]]) -> dict[str, Any]:
    def side(s: Side) -> dict[str, Any]:
        return {"folder": str(s.folder), "runs": [str(r.path) for r in s.runs],
                "left_out_not_valid": [str(p) for p in s.left_out]}

    return {"baseline": side(baseline), "comparisons": [
        {**side(o), "metrics": {r.metric: {"name": r.name, "unit": r.unit, "baseline": r.baseline, "value": r.value,
                                           "difference": r.difference, "interval": [r.low, r.high],
                                           "relative": list(r.relative), "verdict": r.verdict,
                                           "run_to_run_unknown": r.measurement_only} for r in rows}}
        for o, rows in zip(others, results, strict=True)]}


def render(baseline: Side, others: Sequence[Side], results: Sequence[Sequence[Row]]) -> list[str]:
    import shutil

    from bridge.report.console import console_width

    wide = (console_width() or shutil.get_terminal_size().columns) >= 120
    lines = [f"baseline A: {baseline.folder} ({_runs(baseline)})"]
    for other, rows in zip(others, results, strict=True):
        lines.append(f"B: {other.folder} ({_runs(other)})")
        for side in (baseline, other):
            for path in side.left_out:
                lines.append(f"  left out (measurement NOT valid): {path}")
        quiet = [r for r in rows if r.metric.startswith(GAUGE_PREFIX) and r.verdict == "inconclusive"]
        for r in rows:
            if r in quiet:
                continue
            d, lo, hi = (100 * x for x in r.relative)
            mark = " *" if r.measurement_only else ""
            if wide:
                lines.append(f"  {r.name[:36]:<36} {_fmt(r.baseline):>10} → {_fmt(r.value):>10} {r.unit:<10} "
                             f"{d:+6.2f} % [{lo:+.2f}, {hi:+.2f}]  {r.verdict}{mark}")
            else:
                lines.append(f"  {r.name} ({r.unit}): {_fmt(r.baseline)} → {_fmt(r.value)}")
                lines.append(f"    {d:+.2f} % [{lo:+.2f}, {hi:+.2f}] {r.verdict}{mark}")
        if quiet:
            lines.append(f"  {len(quiet)} more GPU gauge means: inconclusive (--json lists them)")
        if any(r.measurement_only for r in rows):
            lines.append("  * one run on a side: run-to-run variation unknown, the interval is the measurement's "
                         "alone (repeat the runs)")
    return lines


def _runs(side: Side) -> str:
    return "1 run" if len(side.runs) == 1 else f"{len(side.runs)} runs"


def _fmt(value: float) -> str:
    return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
