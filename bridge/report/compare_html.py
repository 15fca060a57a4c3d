"""`dcgm-bridge compare --html FILE`: the comparison as one self-contained page in the report's style (html.py):
a forest plot per configuration (each metric's change from the baseline, as a share of it, with its 95 % interval)
and, with `--sweep`, each metric's curve against the swept value with its interval as a band, the Pareto front's
points filled. Inline SVG drawn here, nothing fetched; the data rides along as escaped inline JSON
(`html.script_json`), and a small script checks it and records on <html> how it went (`data-report-status`)."""

from __future__ import annotations

from collections.abc import Sequence

from bridge.report.compare import METRICS, Row, Side
from bridge.report.html import esc, script_json
from bridge.report.sweep import COLUMNS, Point

VERDICT_COLOR = {"better": "#2ca02c", "worse": "#d62728", "inconclusive": "#7f7f7f", "higher": "#1f77b4",
                 "lower": "#1f77b4"}
W, LEFT, RIGHT, ROW_H, TOP = 760, 250, 90, 22, 26
CW, CH, CL, CR, CT, CB = 560, 240, 64, 16, 16, 34


def _forest(index: int, other: Side, rows: Sequence[Row]) -> tuple[str, list[dict[str, object]]]:
    """One forest plot: a row per metric, the change in % of the baseline, its interval a bar, 0 a line."""
    rel = [tuple(100 * x for x in r.relative) for r in rows]
    reach = max([abs(v) for d, lo, hi in rel for v in (d, lo, hi)] + [1.0]) * 1.1
    plot_w = W - LEFT - RIGHT
    height = TOP + ROW_H * len(rows) + 26

    def x(v: float) -> float:
        return LEFT + plot_w * (v + reach) / (2 * reach)

    parts = [f'<svg class="forest" data-forest="{index}" viewBox="0 0 {W} {height}" role="img" '
             f'aria-label="Change from the baseline per metric">',
             f'<line class="zero" x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{TOP - 6}" y2="{height - 22}"/>']
    data: list[dict[str, object]] = []
    for i, (r, (d, lo, hi)) in enumerate(zip(rows, rel, strict=True)):
        y = TOP + ROW_H * i + ROW_H / 2
        color = VERDICT_COLOR.get(r.verdict, "#7f7f7f")
        mark = " *" if r.measurement_only else ""
        parts.append(
            f'<g class="row" data-metric="{esc(r.metric)}" data-relative="{d:.6g}" data-verdict="{esc(r.verdict)}">'
            f'<title>{esc(r.name)}: {d:+.2f} % [{lo:+.2f}, {hi:+.2f}] {esc(r.verdict)}{mark}</title>'
            f'<text class="label" x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{esc(r.name)}{mark}</text>'
            f'<line x1="{x(lo):.1f}" x2="{x(hi):.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" stroke-width="2"/>'
            f'<circle cx="{x(d):.1f}" cy="{y:.1f}" r="4" fill="{color}"/>'
            f'<text class="verdict" x="{W - RIGHT + 6}" y="{y + 4:.1f}" fill="{color}">{esc(r.verdict)}</text></g>')
        data.append({"metric": r.metric, "relative": [d, lo, hi], "verdict": r.verdict})
    for v in (-reach / 1.1, 0.0, reach / 1.1):
        parts.append(f'<text class="axis" x="{x(v):.1f}" y="{height - 6}" text-anchor="middle">{v:+.3g} %</text>')
    parts.append("</svg>")
    caption = f"{esc(other.folder)} against the baseline ({len(other.runs)} run{'s' if len(other.runs) > 1 else ''})"
    return f'<figure class="panel"><figcaption>{caption}</figcaption>{"".join(parts)}</figure>', data


def _curve(index: int, metric: str, unit: str, points: Sequence[Point], key: str) -> tuple[str, dict[str, object]]:
    """One metric against the swept value: the means joined, the intervals a band, the Pareto front filled, the
    points tied with it ringed."""
    known = [(p.value, p.estimates[metric], p) for p in points if metric in p.estimates]
    xs = [v for v, _, _ in known]
    lows = [e.low for _, e, _ in known]
    highs = [e.high for _, e, _ in known]
    x0, x1 = min(xs), max(xs)
    x1 = x1 if x1 > x0 else x0 + 1
    y0, y1 = min(lows), max(highs)
    pad = (y1 - y0) * 0.08 or abs(y1) * 0.05 or 1.0
    y0, y1 = y0 - pad, y1 + pad
    plot_w, plot_h = CW - CL - CR, CH - CT - CB

    def x(v: float) -> float:
        return CL + plot_w * (v - x0) / (x1 - x0)

    def y(v: float) -> float:
        return CT + plot_h * (1 - (v - y0) / (y1 - y0))

    band = " ".join(f"{x(v):.1f},{y(e.high):.1f}" for v, e, _ in known) + " " + \
        " ".join(f"{x(v):.1f},{y(e.low):.1f}" for v, e, _ in reversed(known))
    line = " ".join(f"{x(v):.1f},{y(e.mean):.1f}" for v, e, _ in known)
    parts = [f'<svg class="sweep" data-sweep="{index}" data-metric="{esc(metric)}" viewBox="0 0 {CW} {CH}" '
             f'role="img" aria-label="{esc(metric)} against {esc(key)}">',
             f'<polygon class="band" points="{band}"/>', f'<polyline class="mean" points="{line}"/>']
    for v, e, p in known:
        kind, said = ("front", " (Pareto front)") if p.on_front else ("tied", " (tied with the Pareto front)") \
            if p.tied else ("point", "")
        parts.append(f'<circle cx="{x(v):.1f}" cy="{y(e.mean):.1f}" r="4" class="{kind}">'
                     f'<title>{esc(key)} {v:g}: {e.mean:.4g} [{e.low:.4g}, {e.high:.4g}] {esc(unit)}{said}</title>'
                     '</circle>'
                     f'<text class="axis" x="{x(v):.1f}" y="{CH - 18}" text-anchor="middle">{v:g}</text>')
    for v in (y0 + pad, y1 - pad):
        parts.append(f'<text class="axis" x="{CL - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.4g}</text>')
    parts.append(f'<text class="axis" x="{CL + plot_w / 2:.1f}" y="{CH - 4}" text-anchor="middle">{esc(key)}</text>'
                 "</svg>")
    data: dict[str, object] = {"metric": metric, "x": xs, "mean": [e.mean for _, e, _ in known], "low": lows,
                               "high": highs, "front": [p.on_front for _, _, p in known],
                               "tied": [p.tied for _, _, p in known]}
    name = next((n for k, n, _, _ in METRICS if k == metric), metric)
    return (f'<figure class="panel"><figcaption>{esc(name)} ({esc(unit)}) against {esc(key)}</figcaption>'
            f'{"".join(parts)}</figure>'), data


def render_compare_html(baseline: Side, others: Sequence[Side], results: Sequence[Sequence[Row]],
                        points: Sequence[Point] | None = None, key: str | None = None) -> str:
    forests, forest_data = [], []
    for i, (other, rows) in enumerate(zip(others, results, strict=True)):
        svg, data = _forest(i, other, rows)
        forests.append(svg)
        forest_data.append({"folder": str(other.folder), "rows": data})
    curves: list[str] = []
    curve_data: list[dict[str, object]] = []
    if points and key:
        for metric, unit in COLUMNS:
            if any(metric in p.estimates for p in points):
                svg, cdata = _curve(len(curves), metric, unit, points, key)
                curves.append(svg)
                curve_data.append(cdata)
    left_out = [str(p) for s in (baseline, *others) for p in s.left_out]
    notes = "".join(f"<li>left out (measurement NOT valid): {esc(p)}</li>" for p in left_out)
    sweep_html = (f"<h2>Sweep over {esc(key)}</h2><p>Mean and 95 % interval (band) per value; filled points: the "
                  "Pareto front (no other value has more throughput and less energy per token); ringed: tied with "
                  "it (beaten by the means, never beyond both intervals).</p>"
                  f'<div class="grid2">{"".join(curves)}</div>') if curves else ""
    return _PAGE.format(
        baseline=esc(baseline.folder), runs=len(baseline.runs), notes=f"<ul>{notes}</ul>" if notes else "",
        forests="".join(forests) or "<p>One folder: nothing to compare with it.</p>", sweep=sweep_html,
        data=script_json({"forests": forest_data, "sweeps": curve_data}), style=_STYLE, script=_SCRIPT)


_STYLE = """
body{font-family:"DejaVu Sans",Arial,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:22px;margin:0 0 12px}h2{font-size:17px;margin:28px 0 10px}p,li{font-size:13px}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:14px}
.panel{margin:0 0 14px;background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}
.panel figcaption{font-weight:bold;font-size:13px;margin-bottom:4px}
svg{width:100%;height:auto;display:block}.axis{font-size:10px;fill:#666}.label,.verdict{font-size:12px}
.zero{stroke:#333;stroke-dasharray:3 3}.band{fill:#1f77b4;fill-opacity:.18;stroke:none}
.mean{fill:none;stroke:#1f77b4;stroke-width:1.8}.point{fill:#fff;stroke:#1f77b4;stroke-width:1.8}
.front{fill:#ff7f0e;stroke:#ff7f0e}.tied{fill:#fff;stroke:#ff7f0e;stroke-width:2.4}
"""

_SCRIPT = r"""
(function () {
  var root = document.documentElement;
  function fail(message) { root.setAttribute("data-report-status", "error: " + message); }
  window.addEventListener("error", function (event) { fail(event.message); });
  try {
    var data = JSON.parse(document.getElementById("compare-data").textContent);
    var forests = document.querySelectorAll("svg.forest"), sweeps = document.querySelectorAll("svg.sweep");
    if (forests.length !== data.forests.length) { throw new Error("forest plots and data disagree"); }
    if (sweeps.length !== data.sweeps.length) { throw new Error("sweep charts and data disagree"); }
    for (var i = 0; i < forests.length; i++) {
      if (forests[i].querySelectorAll("g.row").length !== data.forests[i].rows.length) {
        throw new Error("forest " + i + " lacks rows");
      }
    }
    root.setAttribute("data-forests", String(forests.length));
    root.setAttribute("data-sweeps", String(sweeps.length));
    if (!root.hasAttribute("data-report-status")) { root.setAttribute("data-report-status", "ok"); }
  } catch (error) { fail(error.message); }
})();
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>dcgm-bridge · compare</title>
<style>{style}</style>
</head>
<body>
<h1>dcgm-bridge · compare</h1>
<p>Baseline: {baseline} ({runs} runs). Each bar: the change from the baseline in % of it with its 95 % interval
(run-to-run variation and each run's measurement uncertainty); a verdict is called only when the interval
excludes 0. * one run on a side: the interval is the measurement's alone.</p>
{notes}
<h2>Differences</h2>
{forests}
{sweep}
<script type="application/json" id="compare-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""
