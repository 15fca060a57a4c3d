"""The report as one self-contained HTML page: console summary, per-GPU charts with the phases shaded,
energy per phase. Nothing is fetched when the page opens (no CDN, no fonts, no images): the charts are
inline SVG drawn here, and a small inline script adds a hover read-out (the page works without it).

    html = render_html(report)                                        # pure: report in, str out
    write_html(report, None, "out/gpu_telemetry.html")                # the same, written to a file

The series are the report's own (`Report.series`, one line per endpoint and GPU identity, MIG instances
apart): the page draws what the report was built from and never reads the record log again. Given
records (a record log path or GpuRecords), it reads them through the same SeriesAccumulator instead.
Utilisation is DCGM_FI_DEV_GPU_UTIL, or GR_ENGINE_ACTIVE where that is absent (MIG instances). Energy
per phase uses the report's counter rule (bridge.report.energy) over each phase's window.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.report.refresh import source_cadence
from bridge.samples import GpuRecord

if TYPE_CHECKING:
    from bridge.report.build import Report
    from bridge.report.energy import EnergyTotals
    from bridge.report.series import Series

MAX_POINTS = 600  # per line: min and max of each bucket, so spikes survive the thinning
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
DASHES = ("", "6 3", "2 2", "8 3 2 3")
PHASE_FILL = {"warmup": "#f5a623", "profiling": "#4a90e2", "cooldown": "#9b9b9b"}
W, H, LEFT, RIGHT, TOP, BOTTOM = 660, 240, 58, 14, 14, 30


@dataclass(frozen=True)
class ChartSpec:
    key: str
    fallback: str | None  # used for a series that lacks `key` entirely
    title: str
    unit: str
    y_min: float | None  # None: from the data
    y_max: float | None


CHARTS = (
    ChartSpec("nvidia_gpu_utilization", "nvidia_gr_engine_active", "Utilisation", "%", 0.0, 100.0),
    ChartSpec("nvidia_power_usage", None, "Power", "W", 0.0, None),
    ChartSpec("nvidia_temperature", None, "GPU temperature", "°C", None, None),
    ChartSpec("nvidia_memory_used", None, "Memory used", "GB", 0.0, None),
)


@dataclass(frozen=True)
class Line:
    label: str
    color: str
    dash: str
    points: list[tuple[float, float]]  # (seconds since the first sample, value)


@dataclass(frozen=True)
class Band:
    name: str
    kind: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class PhaseEnergy:
    name: str
    kind: str
    start_s: float
    duration_s: float
    energy_j: float | None
    mean_power_w: float | None
    source: str
    vendor: str = ""  # NVIDIA or AMD where the run has GPUs of both; empty otherwise
    uncertainty_j: float | None = None


def render_html(report: Report, records: Path | str | Iterable[GpuRecord] | None = None, *,
                title: str = "dcgm-bridge · GPU telemetry", run_id: str | None = None) -> str:
    """The whole page for `report`: its own series, or those read from `records` (a record log path or records)."""
    series = [s for s in (report.series if records is None else _series(records)) if len(s)]
    origin = min((int(s.timestamps[0]) for s in series), default=0)
    last = max((int(s.timestamps[-1]) for s in series), default=origin)
    span_s = max((last - origin) / 1e9, 1e-9)
    bands = _bands(report, origin, last)
    styles = {_identity(s): (PALETTE[i % len(PALETTE)], DASHES[i // len(PALETTE) % len(DASHES)])
              for i, s in enumerate(sorted(series, key=_sort_key))}
    charts, chart_data = [], {}
    for n, spec in enumerate(CHARTS):
        lines = _lines(series, spec, origin, styles)
        if lines:
            svg, data = _chart(f"c{n}", spec, lines, bands, span_s)
            charts.append(svg)
            chart_data[f"c{n}"] = data
    legend = "".join(
        f'<li><svg width="26" height="10"><line x1="0" y1="5" x2="26" y2="5" stroke="{c}" stroke-width="2.5"'
        f' stroke-dasharray="{d}"/></svg>{esc(label)}</li>' for label, (c, d) in styles.items())
    started = datetime.fromtimestamp(origin / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if series else "-"
    gpus = _gpus_text(report)
    cards = [("Records", f"{report.records:,}"), ("GPUs", gpus), ("Started", started),
             ("Duration", _clock(span_s)), ("Counter mode", report.counter_mode)]
    totals = _vendor_totals(report)
    for vendor, energy, _ in totals:
        if energy.total_energy_j is not None:
            cards.append((_titled(vendor, "energy (profiling)"), _energy_text(energy)))
    for endpoint, body in report.telemetry_data.get("endpoints", {}).items():
        refresh = body.get("refresh")
        if refresh and not refresh.get("fresh") and refresh.get("period_s"):
            seen = f"{refresh['refreshes']:,} of {refresh['scrapes']:,} scrapes new"
            every = "at most once in" if refresh.get("period_at_least") else "every"
            cards.append((f"DCGM refresh {endpoint}", f"{every} {refresh['period_s']:,.1f} s ({seen})"))
    warning = report.telemetry_data.get("summary", {}).get("refresh_warning")
    if warning:
        cards.append(("Warning", warning))
    for vendor, energy, vendor_gpus in totals:
        if energy.average_power_w is not None:
            marked = " (from the sampled power)" if energy.power_from_samples else ""
            cards.append((f"{_titled(vendor, 'total average power')}, {vendor_gpus}",
                          f"{energy.average_power_w:,.0f} W{marked}"))
    cards.append(("Measurement", _verdict_text(report)))
    if run_id:
        cards.insert(0, ("Run", run_id))
    # Every endpoint's state, a down one included (not only in the text dump below).
    cards += [(f"Endpoint {s.display}", (f"up: {s.reason}" if s.reason else "up") if s.up_at_end  # (--gpu-pods)
               else f"down: {s.reason or 'unreachable'}")
              for s in report.endpoints]
    card_html = "".join(f'<div class="card"><span>{esc(k)}</span><b>{_code(v)}</b></div>' for k, v in cards)
    phases = _phase_energy(report, series, origin, last)
    run_meta = f'<meta name="{RUN_META}" content="{esc(run_id)}">\n' if run_id else ""
    return _PAGE.format(
        run_meta=run_meta, title=esc(title), cards=card_html, legend=legend, charts="\n".join(charts),
        phases=_phase_table(phases), serving=_serving(report), console=_console(report),
        data=script_json(chart_data), script=_SCRIPT, style=_STYLE,
    )


# Inside <script> the HTML parser ends the element at `</script` and enters its "escaped" states at `<!--`
# (HTML Living Standard, "script data" states), whatever the JSON means; U+2028/U+2029 end a line in older
# JavaScript. So every <, > and & is written as a JSON \u escape, as Django's json_script does
# (django/utils/html.py `_json_script_escapes`), and the two separators with them: the same value, no markup.
_SCRIPT_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028",
                   0x2029: "\\u2029"}


def script_json(value: object) -> str:
    """`value` as JSON that is safe inside an HTML <script> element (no markup the parser would act on)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).translate(_SCRIPT_ESCAPES)


def write_html(report: Report, records_path: Path | str | None, out_path: Path | str, *,
               title: str = "dcgm-bridge · GPU telemetry", run_id: str | None = None) -> Path:
    """render_html written to `out_path` (parent directories created); returns the path. `records_path`
    None: the report's own series."""
    from bridge.files import write_atomically

    out = Path(out_path)
    records = None if records_path is None else Path(records_path)
    write_atomically(out, render_html(report, records, title=title, run_id=run_id).encode("utf-8"))  # never via a link
    return out


# -- data -------------------------------------------------------------------------------------------
def _series(records: Path | str | Iterable[GpuRecord]) -> list[Series]:
    from bridge.report import SeriesAccumulator

    if isinstance(records, str | Path):
        return SeriesAccumulator().add_path(Path(records)).finish()
    return SeriesAccumulator().add_all(records).finish()


def _identity(s: Series) -> str:
    m = s.meta
    name = f"{m.hostname or s.endpoint} gpu {m.gpu_index if m.gpu_index is not None else '?'}"
    if m.gpu_instance_id is not None:
        name += f" {m.gpu_instance_profile or 'mig'} #{m.gpu_instance_id}"
    return name


def _sort_key(s: Series) -> tuple[str, int, str]:
    m = s.meta
    return (m.hostname or s.endpoint, m.gpu_index if m.gpu_index is not None else -1, m.gpu_instance_id or "")


def _lines(series: Sequence[Series], spec: ChartSpec, origin: int,
           styles: dict[str, tuple[str, str]]) -> list[Line]:
    lines = []
    for s in sorted(series, key=_sort_key):
        key = spec.key if spec.key in s.values else spec.fallback
        if key is None or key not in s.values:
            continue
        values = s.values[key].tolist()  # report units: GR_ENGINE_ACTIVE is a percentage there too
        times = s.timestamps.tolist()
        points = [((t - origin) / 1e9, v) for t, v in zip(times, values, strict=True) if not math.isnan(v)]
        cadence = source_cadence(s.endpoint, s.timestamps, s.values, s.ends)
        if not cadence.fresh and cadence.new is not None:  # a slow refresh: steps, not repeats drawn as readings
            points = _held(points, times, set(cadence.new.tolist()), origin)
        if points:
            color, dash = styles[_identity(s)]
            lines.append(Line(_identity(s), color, dash, _thin(points)))
    return lines


def _held(points: list[tuple[float, float]], times: list[int], new: set[int],
          origin: int) -> list[tuple[float, float]]:
    """A value drawn from the scrape that first saw it, held flat until the next new one: a step per DCGM refresh,
    so that a stale stretch reads as one held value (the repeats between refreshes are not new readings)."""
    at = {(t - origin) / 1e9 for i, t in enumerate(times) if i in new}
    out: list[tuple[float, float]] = []
    for t, v in points:
        if not out or t in at:
            if out:
                out.append((t, out[-1][1]))  # the held value up to the new one
            out.append((t, v))
    if points and out[-1][0] < points[-1][0]:
        out.append((points[-1][0], out[-1][1]))
    return out


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return points
    size = math.ceil(len(points) / (MAX_POINTS // 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(points), size):
        bucket = points[i:i + size]
        low, high = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out.extend(sorted({low, high}))
    return out


def _bands(report: Report, origin: int, last: int) -> list[Band]:
    bands = []
    for phase in report.phases:
        if phase.start_ns is None:
            continue
        end = phase.end_ns if phase.end_ns is not None else last
        bands.append(Band(phase.name, phase.kind, (phase.start_ns - origin) / 1e9, (end - origin) / 1e9))
    window = report.window
    if not bands and window.start_ns is not None and window.end_ns is not None:
        bands.append(Band("profiling window", "profiling", (window.start_ns - origin) / 1e9,
                          (window.end_ns - origin) / 1e9))
    return bands


def _gpus_text(report: Report, series: Sequence[Series] | None = None) -> str:
    from bridge.report.telemetry_data import gpus_text

    return gpus_text((s.endpoint, s.meta) for s in (report.series if series is None else series))


def _vendor_totals(report: Report) -> list[tuple[str, EnergyTotals, str]]:
    """Each vendor's totals with its name (empty where the run's GPUs are all NVIDIA ones) and its GPUs."""
    from bridge.report.console import VENDOR_NAMES
    from bridge.report.energy import vendor_series

    totals = report.vendor_energy()
    named = [v for v, _ in totals] != ["nvidia"]
    return [(VENDOR_NAMES[v] if named else "", energy, _gpus_text(report, vendor_series(report.series, v)))
            for v, energy in totals]


def _titled(vendor: str, what: str) -> str:
    """A card's title: `AMD energy (profiling)`, or `Energy (profiling)` without a vendor."""
    return f"{vendor} {what}" if vendor else what[0].upper() + what[1:]


def _energy_text(energy: EnergyTotals) -> str:
    """`95.34 kJ ± 0.01 kJ` from the uncertainty (the hard bound beside it, when there is one)."""
    assert energy.total_energy_j is not None
    text = _joules(energy.total_energy_j)
    if energy.uncertainty_j is not None:
        text += f" ± {_joules(energy.uncertainty_j)}"
    if energy.bound_j is not None:
        text += f" (bound ± {_joules(energy.bound_j)})"
    return text


def _verdict_text(report: Report) -> str:
    from bridge.report.verdict import verdict_line

    return verdict_line(report.telemetry_data)


def _phase_energy(report: Report, series: Sequence[Series], origin: int, last: int) -> list[PhaseEnergy]:
    from bridge.report.console import VENDOR_NAMES
    from bridge.report.energy import energy_totals
    from bridge.report.window import phase_window

    vendors = [v for v, _ in report.vendor_energy()]
    out = []
    for phase in report.phases:
        if phase.start_ns is None:
            continue
        window = phase_window(phase, report.window, report.phases)
        if window.end_ns is None:
            window = window.resolved(None, max(last, phase.start_ns))
        for vendor in vendors:  # each vendor's GPUs on a row of their own, never summed together
            totals = energy_totals(series, window, report.counter_mode, vendor)
            out.append(PhaseEnergy(phase.name, phase.kind, (phase.start_ns - origin) / 1e9, totals.duration_s,
                                   totals.total_energy_j, totals.average_power_w, totals.source,
                                   VENDOR_NAMES[vendor] if len(vendors) > 1 else "", totals.uncertainty_j))
    return out


# -- drawing --------------------------------------------------------------------------------------------
def _nice_step(span: float, target: int) -> float:
    raw = span / max(target, 1)
    base = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next((m * base for m in (1, 2, 2.5, 5, 10) if m * base >= raw), 10 * base)


def _time_step(span_s: float) -> float:
    return next((s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
                 if span_s / s <= 8), 14400.0)


def _chart(chart_id: str, spec: ChartSpec, lines: list[Line], bands: list[Band],
           span_s: float) -> tuple[str, dict[str, object]]:
    values = [v for line in lines for _, v in line.points]
    low = spec.y_min if spec.y_min is not None else math.floor(min(values) - 2)
    high = spec.y_max if spec.y_max is not None else max(values) * 1.08 + 1e-9
    if high <= low:
        high = low + 1.0
    step = _nice_step(high - low, 5)
    low = math.floor(low / step + 1e-9) * step
    high = math.ceil(high / step - 1e-9) * step
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + plot_w * t / span_s

    def y(v: float) -> float:
        return TOP + plot_h * (1 - (v - low) / (high - low))

    parts = [f'<svg class="chart" data-chart="{chart_id}" viewBox="0 0 {W} {H}" role="img" '
             f'aria-label="{esc(spec.title)} per GPU">']
    for band in bands:
        x0, x1 = x(max(band.start_s, 0.0)), x(min(band.end_s, span_s))
        if x1 > x0:
            fill = PHASE_FILL.get(band.kind, "#9b9b9b")
            parts.append(f'<rect class="phase" x="{x0:.1f}" y="{TOP}" width="{x1 - x0:.1f}" height="{plot_h}" '
                         f'fill="{fill}" fill-opacity="0.13"><title>{esc(band.name)}</title></rect>'
                         f'<text class="phase-label" x="{x0 + 4:.1f}" y="{TOP + 12}">{esc(band.name)}</text>')
    tick = low
    while tick <= high + step / 2:
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
                     f'<text class="axis" x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{_num(tick)}</text>')
        tick += step
    t_step = _time_step(span_s)
    t = 0.0
    while t <= span_s + 1e-9:
        parts.append(f'<text class="axis" x="{x(t):.1f}" y="{H - 10}" text-anchor="middle">{_clock(t)}</text>')
        t += t_step
    for line in lines:
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(t):.1f},{y(v):.1f}" for i, (t, v) in enumerate(line.points))
        parts.append(f'<path d="{path}" fill="none" stroke="{line.color}" stroke-width="1.6" '
                     f'stroke-dasharray="{line.dash}"><title>{esc(line.label)}</title></path>')
    parts.append(f'<text class="unit" x="{LEFT}" y="{TOP - 3}">{esc(spec.unit)}</text></svg>')
    svg = (f'<figure class="panel"><figcaption>{esc(spec.title)} ({esc(spec.unit)})</figcaption>'
           f'<div class="plot">{"".join(parts)}<div class="tip" hidden></div></div></figure>')
    data: dict[str, object] = {
        "unit": spec.unit, "span": span_s, "low": low, "high": high,
        "box": [LEFT, TOP, plot_w, plot_h, W, H],
        "lines": [{"label": ln.label, "color": ln.color, "t": [round(p[0], 3) for p in ln.points],
                   "v": [round(p[1], 3) for p in ln.points]} for ln in lines],
    }
    return svg, data


def _phase_table(phases: Sequence[PhaseEnergy]) -> str:
    if not phases:
        return "<p>No phases were marked: the report covers the whole recording.</p>"
    top = max((p.energy_j or 0.0 for p in phases), default=0.0) or 1.0
    rows = []
    for p in phases:
        bar = f'<span class="bar" style="width:{100 * (p.energy_j or 0) / top:.1f}%;' \
              f'background:{PHASE_FILL.get(p.kind, "#9b9b9b")}"></span>'
        energy = _joules(p.energy_j) if p.energy_j is not None else "n/a"
        power = f"{p.mean_power_w:,.0f} W" if p.mean_power_w is not None else "n/a"
        joules = f"{p.energy_j:.3f}" if p.energy_j is not None else ""
        stated = f' data-uncertainty-j="{p.uncertainty_j:.3f}"' if p.uncertainty_j is not None else ""
        if p.uncertainty_j is not None and p.energy_j is not None:
            energy += f" ± {_joules(p.uncertainty_j)}"
        vendor = f' data-vendor="{esc(p.vendor)}"' if p.vendor else ""
        named = f"{p.name} ({p.vendor})" if p.vendor else p.name
        rows.append(f'<tr data-phase="{esc(p.name)}" data-energy-j="{joules}"{vendor}{stated}><td>{esc(named)}</td>'
                    f"<td>{esc(p.kind)}</td><td class='num'>{offset(p.start_s)}</td>"
                    f"<td>{p.duration_s:,.1f} s</td><td class='num'>{energy}</td><td class='num'>{power}</td>"
                    f"<td class='bars'>{bar}</td><td>{esc(p.source)}</td></tr>")
    head = ("<tr><th>Phase</th><th>Kind</th><th>Start</th><th>Duration</th><th>Energy</th>"
            "<th>Mean power</th><th></th><th>Source</th></tr>")
    return f'<table class="phases">{head}{"".join(rows)}</table>'


def _serving(report: Report) -> str:
    """Energy per serving role and per request (report/roles.py, report/requests.py): a row each, when the report
    has them."""
    from bridge.report.console import serving_lines

    block = report.telemetry_data
    lines = serving_lines(block)
    if not lines:
        return ""
    rows = []
    for line in lines:
        if line.role is not None:
            attrs = f' data-role="{esc(line.role)}" data-energy-j="{block["roles"][line.role].get("energy_j")}"'
        else:
            attrs = f' data-{line.kind}="1"'
        rows.append(f"<tr{attrs}><td>{_code(line.text)}</td></tr>")
    return f'<h2>Energy per role, idle and request</h2>\n<table class="phases">{"".join(rows)}</table>'


def _console(report: Report) -> str:
    from rich.console import Console

    from bridge.report import render_console
    from bridge.report.console import WIDE_TABLE

    console = Console(record=True, width=WIDE_TABLE, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    render_console(report, console)
    return console.export_html(inline_styles=True, code_format="{code}")


# -- formatting -------------------------------------------------------------------------------------
def esc(text: object) -> str:
    """Text or an attribute's value, escaped for HTML (quotes too): the one escape of every page we write."""
    return html.escape(str(text), quote=True)


def _num(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:,.2g}"


def offset(seconds: float) -> str:
    """A start time after the recording's first sample, in one format for a whole column: `0:08.9`, `1:02:03.0`."""
    tenths = round(max(seconds, 0.0) * 10)
    whole, tenth = divmod(tenths, 10)
    hours, rest = divmod(whole, 3600)
    minutes = f"{hours}:{rest // 60:02d}" if hours else f"{rest // 60}"
    return f"{minutes}:{rest % 60:02d}.{tenth}"


def _code(text: object) -> str:
    """Escaped text whose `quoted` parts (a command to run, a flag) show as code, not as raw backticks."""
    return re.sub(r"`([^`<>]+)`", r"<code>\1</code>", esc(text))


def _clock(seconds: float) -> str:
    if seconds < 10 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _joules(joules: float) -> str:
    if abs(joules) >= 1e6:
        return f"{joules / 1e6:,.2f} MJ ({joules / 3.6e6:,.3f} kWh)"
    return f"{joules / 1e3:,.2f} kJ" if abs(joules) >= 1e3 else f"{joules:,.1f} J"


_STYLE = """
body{font-family:"DejaVu Sans",Arial,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:22px;margin:0 0 12px}h2{font-size:17px;margin:28px 0 10px}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{background:#fff;border:1px solid #ddd;border-radius:6px;
padding:8px 14px}.card span{display:block;font-size:11px;color:#666}.card b{font-size:16px}
.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12px}
.legend li{display:flex;align-items:center;gap:6px}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:14px}
.panel{margin:0;background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}
.panel figcaption{font-weight:bold;font-size:13px;margin-bottom:4px}.plot{position:relative}
svg.chart{width:100%;height:auto;display:block}.grid{stroke:#e6e6e6}.axis,.unit{font-size:10px;fill:#666}
.phase-label{font-size:10px;fill:#555}.cursor{stroke:#333;stroke-width:0.8}
.tip{position:absolute;pointer-events:none;background:rgba(255,255,255,.95);border:1px solid #bbb;
border-radius:4px;padding:4px 6px;font-size:11px;white-space:nowrap}
table.phases{border-collapse:collapse;background:#fff;font-size:13px}
table.phases td,table.phases th{border:1px solid #ddd;padding:4px 10px;text-align:left}
td.num{text-align:right}td.bars{width:220px}.bar{display:block;height:12px;border-radius:2px}
pre.console{background:#fff;border:1px solid #ddd;padding:10px;font-size:12px;overflow-x:auto;
font-family:"DejaVu Sans Mono",monospace;line-height:1.25}
"""

# Progressive enhancement only: hover read-out of every line at the nearest sample. The page records
# how it went on <html> (data-report-status="ok" / "error: …"): tests read it with --dump-dom.
_SCRIPT = r"""
(function () {
  var root = document.documentElement;
  function fail(message) { root.setAttribute("data-report-status", "error: " + message); }
  window.addEventListener("error", function (event) { fail(event.message); });
  function nearest(ts, t) {
    var lo = 0, hi = ts.length - 1;
    while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (ts[mid] < t) { lo = mid; } else { hi = mid; } }
    return Math.abs(ts[lo] - t) <= Math.abs(ts[hi] - t) ? lo : hi;
  }
  function attach(svg, spec) {
    var ns = "http://www.w3.org/2000/svg", box = spec.box, tip = svg.parentNode.querySelector(".tip");
    var cursor = document.createElementNS(ns, "line");
    cursor.setAttribute("class", "cursor"); cursor.setAttribute("y1", box[1]);
    cursor.setAttribute("y2", box[1] + box[3]); cursor.style.display = "none"; svg.appendChild(cursor);
    svg.addEventListener("mousemove", function (event) {
      var rect = svg.getBoundingClientRect(), sx = (event.clientX - rect.left) * box[4] / rect.width;
      var t = (sx - box[0]) / box[2] * spec.span;
      if (t < 0 || t > spec.span) { cursor.style.display = "none"; tip.hidden = true; return; }
      cursor.setAttribute("x1", sx); cursor.setAttribute("x2", sx); cursor.style.display = "";
      tip.textContent = "";
      var head = document.createElement("div");
      head.textContent = "t = " + t.toFixed(1) + " s"; tip.appendChild(head);
      spec.lines.forEach(function (line) {
        var row = document.createElement("div"), mark = document.createElement("b");
        mark.style.color = line.color; mark.textContent = "\u25a0 ";
        row.appendChild(mark);
        row.appendChild(document.createTextNode(line.label + ": " + line.v[nearest(line.t, t)] + " " + spec.unit));
        tip.appendChild(row);
      });
      tip.hidden = false;
      tip.style.left = Math.min(event.clientX - rect.left + 12, rect.width - tip.offsetWidth) + "px";
      tip.style.top = "8px";
    });
    svg.addEventListener("mouseleave", function () { cursor.style.display = "none"; tip.hidden = true; });
  }
  try {
    var data = JSON.parse(document.getElementById("chart-data").textContent);
    var charts = document.querySelectorAll("svg.chart");
    for (var i = 0; i < charts.length; i++) {
      var spec = data[charts[i].getAttribute("data-chart")];
      if (!spec || !spec.lines.length) { throw new Error("no data for chart " + i); }
      attach(charts[i], spec);
    }
    root.setAttribute("data-charts", String(charts.length));
    if (!root.hasAttribute("data-report-status")) { root.setAttribute("data-report-status", "ok"); }
  } catch (error) { fail(error.message); }
})();
"""

RUN_META = "dcgm-bridge-run"  # the page names its run: an earlier run's page moves aside with its files


def page_run_id(head: bytes) -> str | None:
    """The run a page written by `write_html` names in its head (None for any other file)."""
    found = re.search(rb'<meta name="' + RUN_META.encode() + rb'" content="([^"<>]*)">', head)
    return html.unescape(found.group(1).decode("utf-8", "replace")) if found else None


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{run_meta}<title>{title}</title>
<style>{style}</style>
</head>
<body>
<h1>{title}</h1>
<div class="cards">{cards}</div>
<h2>GPUs</h2>
<ul class="legend">{legend}</ul>
<div class="grid2">
{charts}
</div>
<h2>Energy per phase</h2>
{phases}
{serving}
<h2>Summary</h2>
<pre class="console">{console}</pre>
<script type="application/json" id="chart-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""
