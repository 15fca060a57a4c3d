"""`dcgm-bridge compare --sweep KEY` and `--until-width W` (issue 45): configurations ordered by a swept parameter,
each metric's mean with its 95 % interval, the throughput-vs-energy-per-token Pareto front; and how many repeats
would bring a configuration's interval under a share of its mean.

A configuration's interval is its mean's: the run-to-run part (the sample variance over n, Student's t at the
Welch-Satterthwaite degrees of freedom with the measurement part counted as known) and the measurement part (the
runs' mean stated half-width, which repeats do not shrink), as `compare` sums them (compare.py). With one run the
run-to-run part is unknown and the interval is the measurement's alone, marked.

The sweep's value comes from AIPerf's `input_config` in each run's profile export: `concurrency` and `request_rate`
(or `rate`) are the first profiling phase's; any other KEY is a dotted path (`phases.profiling.concurrency`: a list
is entered by an element's `name`, `kind` or index). Every run of a configuration must hold the same number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bridge.report.compare import METRICS, Z95, CompareError, Run, Side, metrics_of, parts, t975, welch_df

_ALIASES = {"concurrency": "concurrency", "request_rate": "rate", "rate": "rate"}
THROUGHPUT, PER_TOKEN = "output_token_throughput", "energy_per_output_token"


@dataclass(frozen=True, slots=True)
class Estimate:
    metric: str
    mean: float
    low: float
    high: float
    runs: int
    run_to_run_unknown: bool


def estimate(metric: str, values: Sequence[tuple[float, float]]) -> Estimate:
    """A configuration's mean of `metric` and its 95 % interval."""
    mean, run_to_run, measurement = parts(values)
    n = len(values)
    se = math.sqrt(run_to_run + measurement)
    half = (Z95 if n < 2 else t975(welch_df([(run_to_run, measurement, n)]))) * se
    return Estimate(metric, mean, mean - half, mean + half, n, n < 2)


def side_estimates(side: Side) -> dict[str, Estimate]:
    out = {}
    for key, *_ in metrics_of(side):
        values = [r.values[key] for r in side.runs if key in r.values]
        if values:
            out[key] = estimate(key, values)
    return out


def _lookup(config: Any, path: str) -> Any:
    node = config
    for part in path.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list):
            named = [e for e in node if isinstance(e, dict) and part in (e.get("name"), e.get("kind"))]
            if named:
                node = named[0]
            elif part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        else:
            return None
    return node


def sweep_value(run: Run, key: str) -> float | None:
    """The run's value of KEY in AIPerf's `input_config` (see the module docstring), or None."""
    config = run.config
    if not isinstance(config, dict):
        return None
    alias = _ALIASES.get(key)
    if alias is not None:
        value = _lookup(config, f"phases.profiling.{alias}")
        if value is None:  # a config whose phases carry no kind: the first phase not excluded from results
            phases = config.get("phases")
            kept = [p for p in phases if isinstance(p, dict) and not p.get("exclude_from_results")] \
                if isinstance(phases, list) else []
            value = kept[0].get(alias) if kept else None
    else:
        value = _lookup(config, key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True, slots=True)
class Point:
    side: Side
    value: float
    estimates: dict[str, Estimate]
    on_front: bool
    tied: bool = False  # off the front by the means, but no point beats it beyond both intervals (`tied_with_front`)


def sweep(sides: Sequence[Side], key: str) -> list[Point]:
    """The configurations ordered by KEY's value, each on the Pareto front of higher throughput and lower energy
    per token (by their means), tied with it (`tied_with_front`) or neither. A folder whose runs lack KEY or
    disagree on it: CompareError."""
    valued: list[tuple[float, Side]] = []
    for side in sides:
        found = {sweep_value(run, key) for run in side.runs}
        values = {v for v in found if v is not None}
        if None in found:
            lacking = next(r.path for r in side.runs if sweep_value(r, key) is None)
            raise CompareError(f"--sweep {key}: {lacking} has no number at {key!r} in AIPerf's input_config (give "
                               "concurrency, request_rate or a dotted path such as phases.profiling.concurrency)")
        if len(values) > 1:
            raise CompareError(f"--sweep {key}: the runs of {side.folder} disagree on it ({sorted(values)}); give "
                               "one folder per value")
        valued.append((values.pop(), side))
    if len({v for v, _ in valued}) < len(valued):
        raise CompareError(f"--sweep {key}: two folders have the same value; give one folder per value")
    valued.sort(key=lambda p: p[0])
    estimates = [side_estimates(side) for _, side in valued]
    pairs = [(e.get(THROUGHPUT), e.get(PER_TOKEN)) for e in estimates]
    front = pareto_front(pairs)
    tied = tied_with_front(pairs, front)
    return [Point(side, value, est, i in front, i in tied)
            for i, ((value, side), est) in enumerate(zip(valued, estimates, strict=True))]


def pareto_front(points: Sequence[tuple[Estimate | None, Estimate | None]]) -> set[int]:
    """The indices of the points no other point dominates: as much throughput or more and as little energy per
    token or less, one of them strictly. Points lacking either metric are not on it."""
    known = [(i, t.mean, e.mean) for i, (t, e) in enumerate(points) if t is not None and e is not None]
    return {i for i, t, e in known
            if not any(t2 >= t and e2 <= e and (t2 > t or e2 < e) for j, t2, e2 in known if j != i)}


def tied_with_front(points: Sequence[tuple[Estimate | None, Estimate | None]], front: set[int]) -> set[int]:
    """The indices of the points off the front by their means that no point beats beyond the intervals: every point
    with more throughput and less energy per token has an interval that overlaps the point's in at least one of the
    two, so the runs cannot tell that it is worse. A point beaten beyond both intervals is not tied."""
    known = [(i, t, e) for i, (t, e) in enumerate(points) if t is not None and e is not None]
    return {i for i, t, e in known if i not in front
            and not any(t2.low > t.high and e2.high < e.low for j, t2, e2 in known if j != i)}


def repeats_for_width(values: Sequence[tuple[float, float]], width: float, most: int = 1000) -> int | None:
    """How many runs in all bring the interval's full width (2 × half-width, AIPerf's ci_width rule) under `width`
    of the mean, the run-to-run spread taken as the repeats show it; None where the measurement part alone is that
    wide (no repeat count helps) or the mean is 0; 0 where the run-to-run variation is unknown (one run)."""
    mean, run_to_run, measurement = parts(values)
    n = len(values)
    if n < 2:
        return 0
    if mean == 0 or 2 * Z95 * math.sqrt(measurement) >= width * abs(mean):
        return None
    variance = run_to_run * n  # the sample variance
    for total in range(max(n, 2), most + 1):
        spread = variance / total
        if 2 * t975(welch_df([(spread, measurement, total)])) * math.sqrt(spread + measurement) < width * abs(mean):
            return total
    return None


def width_rows(side: Side, width: float) -> list[dict[str, Any]]:
    """Per fixed metric: runs so far, the interval's width as a share of the mean, the runs needed in all."""
    rows = []
    for key, name, *_ in METRICS:
        values = [r.values[key] for r in side.runs if key in r.values]
        if not values:
            continue
        e = estimate(key, values)
        needed = repeats_for_width(values, width)
        rows.append({"metric": key, "name": name, "runs": len(values),
                     "width": (e.high - e.low) / abs(e.mean) if e.mean else None,
                     "runs_needed": needed if needed else None,
                     "more_runs": max(needed - len(values), 0) if needed else None,
                     "run_to_run_unknown": len(values) < 2,
                     "measurement_too_wide": needed is None and len(values) >= 2})
    return rows


def width_lines(side: Side, width: float) -> list[str]:
    lines = [f"{side.folder}: repeats for an interval under {100 * width:g} % of the mean"]
    for row in width_rows(side, width):
        now = f"{100 * row['width']:.1f} %" if row["width"] is not None else "-"
        if row["run_to_run_unknown"]:
            more = "1 run: repeat it (3 runs at least) to see its spread"
        elif row["measurement_too_wide"]:
            more = "never: the measurement alone is wider"
        elif row["more_runs"] == 0:
            more = "already"
        else:
            more = f"{row['more_runs']} more ({row['runs_needed']} in all)"
        lines.append(f"  {row['name']}: {now} now; {more}")
    return lines


def as_json(points: Sequence[Point], key: str) -> dict[str, Any]:
    return {"sweep": key, "points": [
        {"folder": str(p.side.folder), "value": p.value, "runs": [str(r.path) for r in p.side.runs],
         "left_out_not_valid": [str(x) for x in p.side.left_out], "pareto_front": p.on_front, "pareto_tied": p.tied,
         "metrics": {k: {"mean": e.mean, "interval": [e.low, e.high], "runs": e.runs,
                         "run_to_run_unknown": e.run_to_run_unknown} for k, e in p.estimates.items()}}
        for p in points]}


COLUMNS = ((THROUGHPUT, "tokens/s"), (PER_TOKEN, "mJ/token"), ("average_gpu_power", "W"),
            ("output_tokens_per_joule", "tokens/J"))


def render(points: Sequence[Point], key: str) -> list[str]:
    """One line per configuration, 80 columns: KEY's value, runs, then each column's mean ± half-width; `*` marks
    the Pareto front, `=` a point tied with it, `~` an interval that is the measurement's alone (one run)."""
    head = f"{'value':>10} {'n':>3}" + "".join(f" {unit:>15}" for _, unit in COLUMNS) + " F"
    lines = [f"sweep over {key}: each folder's mean ± its 95 % half-width", head]
    for p in points:
        cells = []
        for metric, _ in COLUMNS:
            e = p.estimates.get(metric)
            if e is None:
                cells.append(f" {'-':>15}")
                continue
            mark = "~" if e.run_to_run_unknown else " "
            cells.append(f" {_short(e.mean):>7}±{_short((e.high - e.low) / 2):<6}{mark}")
        lines.append(f"{p.value:>10g} {len(p.side.runs):>3}" + "".join(cells)
                     + (" *" if p.on_front else " =" if p.tied else ""))
    lines.append("± the 95 % interval's half-width; ~ one run: the measurement's alone")
    lines.append("* on the Pareto front: no other point has more throughput and less mJ/token")
    if any(p.tied for p in points):
        lines.append("= tied with the front: beaten by the means, never beyond both intervals")
    for p in points:
        for path in p.side.left_out:
            lines.append(f"left out (measurement NOT valid): {path}")
    return lines


def _short(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1e5 else f"{x:.3g}"
