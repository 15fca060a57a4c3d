"""The console summary: `k/n telemetry sources reachable` with ✔/!/✘ per endpoint, then one table per GPU
(rows `<display> (<unit>)`, columns avg min max p99 p90 p50 std), as AIPerf's GPU telemetry exporter.

Energy is shown in a unit a person can read (J, kJ or MJ) instead of AIPerf's `0.00 MJ`: one unit for every GPU,
chosen for the largest value. Everything that came from outside (GPU names, hostnames, endpoint names, error
texts) is escaped before it reaches rich markup: a model name holding `[/bold]` is printed as it is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any, Literal, NamedTuple

from bridge.samples import NOT_FAILED_SCRAPES, MetricKind

if TYPE_CHECKING:
    from rich.console import Console

    from bridge.report.build import Report
    from bridge.report.energy import EnergyTotals
    from bridge.report.telemetry_data import EndpointStatus

COLUMNS = ("avg", "min", "max", "p99", "p90", "p50", "std")
_MJ_KEYS = frozenset(["nvidia_energy_consumption", "amd_energy_consumption"])
PIPE_WIDTH = 80  # a pipe or a file counts as an 80-column terminal unless COLUMNS says otherwise


def console_width(stream: IO[str] | None = None, env: Mapping[str, str] | None = None) -> int | None:
    """The one terminal policy of every console output (final report, `profile`, `--live`, `report --console`):
    COLUMNS when set, else the terminal's own width (None: rich asks the terminal), else 80 for a pipe."""
    columns = (os.environ if env is None else env).get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = stream if stream is not None else sys.stdout
    return None if stream.isatty() else PIPE_WIDTH


def make_console(stderr: bool = False, env: Mapping[str, str] | None = None) -> Console:
    """A rich console under the terminal policy (`console_width`)."""
    from rich.console import Console

    return Console(stderr=stderr, width=console_width(sys.stderr if stderr else sys.stdout, env))


def plural(count: int, noun: str) -> str:
    """`1 GPU`, `2 GPUs`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def format_number(value: Any) -> str:
    """AIPerf's console format: `{:,.2f}`, `{:.2e}` from 1e6, N/A when missing."""
    if value is None:
        return "N/A"
    if isinstance(value, bool) or isinstance(value, int) and abs(value) < 1_000_000:
        return f"{value:,}" if not isinstance(value, bool) else str(value)
    number = float(value)
    return f"{number:.2e}" if abs(number) >= 1e6 else f"{number:,.2f}"


_ENERGY_UNITS = (("MJ", 1e6), ("kJ", 1e3), ("J", 1.0))


def energy_unit(joules: float) -> tuple[str, float]:
    """(unit, joules per unit) in J, kJ or MJ so that `joules` reads as 1-999 where possible."""
    magnitude = abs(joules)
    return next((unit, scale) for unit, scale in _ENERGY_UNITS if magnitude >= scale or unit == "J")


def plus_minus(joules: float, unit: str, scale: float) -> str:
    """An uncertainty in the total's unit (`0.37 kJ`), or, where that would print as 0.00, in the unit that shows
    its two significant digits (`4.1 J`, `0.52 J`): never a ± that reads as zero."""
    if round(joules / scale, 2) != 0 or joules == 0:
        return f"{format_number(joules / scale)} {unit}"
    small, small_scale = energy_unit(joules)
    return f"{joules / small_scale:.2g} {small}"


def readable_energy(joules: float) -> tuple[float, str]:
    """(value, unit) in J, kJ or MJ so that the value reads as 1-999 where possible."""
    unit, scale = energy_unit(joules)
    return joules / scale, unit


def render_console(report: Report, console: Console | None = None) -> None:
    console = console or make_console()
    console.print()
    console.print("[bold]dcgm-bridge | GPU Telemetry Summary[/bold]")
    _print_endpoints(report, console)
    units = energy_units(report)
    if console.width < WIDE_TABLE:
        _print_stacked(report, units, console)
    else:
        _print_wide(report, units, console)
    _print_energy(report, console)
    from rich.markup import escape

    for line in serving_lines(report.telemetry_data):
        console.print(escape(line.text), highlight=False)
    print_verdict(report, console)


_EFFICIENCY_SHOWN = (("j_per_input_token", "J/input token"), ("j_per_output_token", "J/output token"),
                     ("j_per_token", "J/token"))


class ServingLine(NamedTuple):
    """One line of the serving summary, tagged with what it shows so the HTML need not read its text."""

    kind: Literal["role", "idle", "steady", "requests"]
    text: str
    role: str | None = None  # the role's name, for kind "role"


def serving_lines(block: Mapping[str, Any]) -> list[ServingLine]:
    """One line per serving role (`roles`), the idle baseline, the steady state and the requests' energy
    (`requests`), for the console and the HTML: energy ± uncertainty, average power, efficiency; the per-request
    distribution and what no request took."""
    lines = []
    for name, role in (block.get("roles") or {}).items():
        parts = [f"Role {name} ({role['kind']}, {plural(len(role['gpus']), 'GPU')}):"]
        if role.get("energy_j") is not None:
            value, unit = readable_energy(role["energy_j"])
            scale = role["energy_j"] / value if value else 1.0
            parts.append(f"{format_number(value)} {unit} ± {plus_minus(role['uncertainty_j'] or 0.0, unit, scale)},")
        if role.get("average_power_w") is not None:
            parts.append(f"average power {format_number(role['average_power_w'])} W")
        shown = [f"{role[key]:.4g} {label}" for key, label in _EFFICIENCY_SHOWN if role.get(key) is not None]
        parts.extend(f", {text}" for text in shown)
        if role.get("reasons"):
            parts.append(f" [{', '.join(role['reasons'])}]")
        lines.append(ServingLine("role", " ".join(parts).replace(" ,", ","), name))
    idle = block.get("idle")
    if idle:
        text = "Idle baseline: " + ("none usable" if idle.get("idle_j") is None else
                                    f"idle {format_number(idle['idle_j'])} J ± {idle['idle_uncertainty_j']:.3g} J, "
                                    f"active {format_number(idle['active_j'])} J")
        powers = [f"{g['idle_power_w']:.1f} W" for g in idle["gpus"].values() if g.get("idle_power_w") is not None]
        text += f" (idle power per GPU {', '.join(powers)})" if powers else ""
        if idle.get("reasons"):
            text += f" [{', '.join(idle['reasons'])}]"
        lines.append(ServingLine("idle", text))
    steady = block.get("steady_state")
    if steady:
        whole = steady.get("window_j_per_output_token")
        beside = f" (whole window {whole:.4g} J/output token)" if whole is not None else ""
        if steady.get("found"):
            per = steady.get("j_per_output_token")
            text = (f"Steady state: {steady['duration_s']:.1f} s at {steady['concurrency']:.1f} requests in flight"
                    + (f", {per:.4g} J/output token" if per is not None else "") + beside)
        else:
            text = f"Steady state: none (longest {steady['longest_s']:.1f} s){beside}"
        lines.append(ServingLine("steady", text))
    requests = block.get("requests")
    if requests:
        per = requests.get("energy_per_request_j") or {}
        token = requests.get("energy_per_output_token_j") or {}
        idle, unit = readable_energy(requests["unattributed_j"])
        text = f"Requests: {requests['requests_attributed']:,} attributed"
        if per:
            text += f", energy per request p50 {per['p50']:.4g} J, p90 {per['p90']:.4g} J, p99 {per['p99']:.4g} J"
        if token:
            text += f", per output token p50 {token['p50']:.4g} J, p99 {token['p99']:.4g} J"
        text += f"; unattributed (no request in flight) {format_number(idle)} {unit}"
        text += f"; each request in {requests['file']}"
        if requests.get("reasons"):
            text += f" [{', '.join(requests['reasons'])}]"
        lines.append(ServingLine("requests", text))
    return lines


def _print_endpoints(report: Report, console: Console) -> None:
    statuses = report.endpoints
    up = sum(1 for s in statuses if s.up_at_end)
    console.print(f"{up}/{len(statuses)} telemetry sources reachable", highlight=False)  # AIPerf's words
    for status in statuses:
        console.print(f"  {endpoint_line(report, status)}", highlight=False)


def endpoint_line(report: Report, status: EndpointStatus) -> str:
    """One endpoint as markup: `✔` only when every scrape due in the window succeeded, `!` with the failed share
    and the longest gap when some failed, `✘` when it was down at the end."""
    from rich.markup import escape

    name = escape(status.display)
    if not status.up_at_end:
        return f"[red]✘[/red] {name} ({escape(status.reason or 'unreachable')})"
    if status.reason:  # read, but left out: none of its GPUs taken by --gpu-pods (report/pods.py)
        return f"[yellow]![/yellow] {name} ({escape(status.reason)})"
    if not status.has_data:  # it answered, but nothing it said was a sample (an HTML page, a wrong path)
        return f"[yellow]![/yellow] {name} (reachable, but no sample was read from it)"
    failed, due, gap_s = scrape_health(report, status.display)
    if failed:
        return (f"[yellow]![/yellow] {name} ({failed} of {plural(due, 'scrape')} failed, {100 * failed / due:.0f}%; "
                f"longest gap {_duration(gap_s)})")
    endpoint: dict[str, Any] = report.telemetry_data.get("endpoints", {}).get(status.display, {})
    refresh = endpoint.get("refresh") or {}
    if refresh.get("fresh", True) or not refresh.get("period_s"):
        return f"[green]✔[/green] {name}"
    every = "at most once in" if refresh.get("period_at_least") else "every"
    return f"[green]✔[/green] {name} (DCGM refresh {every} {refresh['period_s']:,.1f} s)"


def scrape_health(report: Report, display: str) -> tuple[int, int, float]:
    """(failed scrapes, scrapes due, longest gap between good scrapes in s) of one endpoint in the window: the
    failures are the error summary's, the good scrapes the distinct record times of the endpoint's GPUs."""
    failed = sum(int(e.get("count", 0)) for e in report.telemetry_data.get("error_summary", [])
                 if e.get("error_details", {}).get("type") not in ("endpoint_down", *NOT_FAILED_SCRAPES)
                 and str(e.get("error_details", {}).get("message", "")).startswith(f"{display}: "))
    import numpy as np

    window = report.window
    start = window.start_ns if window.start_ns is not None else -(2**63)
    end = window.end_ns + window.grace_ns if window.end_ns is not None else 2**63 - 1
    stamps = [s.timestamps[(s.timestamps >= start) & (s.timestamps <= end)] for s in report.series
              if s.endpoint == display]
    times = np.unique(np.concatenate(stamps)) if stamps else np.empty(0, dtype=np.int64)  # one per scrape
    if times.size == 0:
        whole = end - window.start_ns if window.start_ns is not None and window.end_ns is not None else 0
        return failed, failed, whole / 1e9
    return failed, failed + int(times.size), float(np.diff(times).max(initial=0)) / 1e9


def _duration(seconds: float) -> str:
    """`12.3 s`, or `250 ms` below a second (never `0.0 s`)."""
    return f"{seconds * 1000:,.0f} ms" if seconds < 1 else f"{seconds:,.1f} s"


def energy_units(report: Report) -> dict[str, tuple[str, float]]:
    """One unit per energy metric for the whole console: (unit, joules per unit), chosen for the largest value of
    that metric across every GPU (so no table mixes kJ and J)."""
    largest: dict[str, float] = {}
    for gpu in _gpus(report):
        for key, result in gpu.get("metrics", {}).items():
            if key in _MJ_KEYS and result.get("unit") == "MJ" and result.get("avg") is not None:
                largest[key] = max(largest.get(key, 0.0), abs(float(result["avg"])) * 1e6)
    return {key: energy_unit(joules) for key, joules in largest.items()}


def _gpus(report: Report) -> list[dict[str, Any]]:
    return [gpu for body in report.telemetry_data.get("endpoints", {}).values()
            for gpu in body.get("gpus", {}).values()]


def _gpu_title(endpoint: str, gpu_key: str, gpu: dict[str, Any], endpoint_first: bool) -> str:
    """A GPU's heading as plain text (the caller escapes it)."""
    parts = [f"GPU {gpu.get('gpu_index')}", str(gpu.get("gpu_name") or "unknown model")]
    parts = [endpoint, *parts] if endpoint_first else [*parts, endpoint]
    if gpu_key != f"gpu_{gpu.get('gpu_index')}":
        parts.append(gpu_key)
    return " | ".join(parts)


def _print_wide(report: Report, units: dict[str, tuple[str, float]], console: Console) -> None:
    from rich.markup import escape
    from rich.table import Table

    for endpoint, body in report.telemetry_data.get("endpoints", {}).items():
        for gpu_key, gpu in body.get("gpus", {}).items():
            table = Table(title=escape(_gpu_title(endpoint, gpu_key, gpu, True)), title_justify="left")
            table.add_column("Metric", style="cyan")
            for column in COLUMNS:
                table.add_column(column, justify="right")
            for key, result in gpu.get("metrics", {}).items():
                table.add_row(*(escape(cell) for cell in _row(report, key, result, units)))
            console.print(table)


WIDE_TABLE = 128  # the per-GPU table's width with AIPerf's long metric names
_CELL = 10


def _print_stacked(report: Report, units: dict[str, tuple[str, float]], console: Console) -> None:
    """Narrow terminals (80 columns, a pipe, a CI log): each metric's short name on its own line, its values
    under the column heads, so nothing wraps."""
    from rich.markup import escape

    head = "".join(f"{c:>{_CELL}}" for c in COLUMNS)
    for endpoint, body in report.telemetry_data.get("endpoints", {}).items():
        for gpu_key, gpu in body.get("gpus", {}).items():
            console.print()
            console.print(f"[bold]{escape(_gpu_title(endpoint, gpu_key, gpu, False))}[/bold]", overflow="fold")
            console.print(head, highlight=False)
            for key, result in gpu.get("metrics", {}).items():
                name, *cells = _row(report, key, result, units)
                console.print(f"[cyan]{escape(_short(name))}[/cyan]", overflow="fold")
                console.print(escape("".join(f"{c:>{_CELL}}" for c in cells)), highlight=False, overflow="fold")


def _short(display: str) -> str:
    for prefix in ("NVIDIA ", "AMD "):
        if display.startswith(prefix):
            return display[len(prefix):]
    return display


def _row(report: Report, key: str, result: dict[str, Any], units: dict[str, tuple[str, float]]) -> list[str]:
    """A metric's row as plain text: `<display> (<unit>)` and the column cells."""
    label = report.labels.get(key)
    display = label.display if label else key
    unit = str(result.get("unit", label.unit if label else ""))
    if label is not None and label.kind == MetricKind.CODE and "last" in result:
        cells = {"avg": f"last {format_number(result['last'])}", "max": format_number(result.get("max"))}
        return [f"{display} ({unit})"] + [cells.get(c, "N/A") for c in COLUMNS]
    if key in _MJ_KEYS and unit == "MJ":
        unit, scale = units.get(key) or energy_unit(float(result["avg"]) * 1e6)
        cells = {"avg": format_number(float(result["avg"]) * 1e6 / scale) + _resets(result)}
        return [f"{display} ({unit})"] + [cells.get(c, "N/A") for c in COLUMNS]
    if unit == "count":  # error counts: whole numbers, not 0.00
        result = {c: _whole(v) if c in COLUMNS else v for c, v in result.items()}
    cells = {c: format_number(result.get(c)) for c in COLUMNS}
    cells["avg"] += _resets(result)
    return [f"{display} ({unit})"] + [cells[c] for c in COLUMNS]


def _resets(result: dict[str, Any]) -> str:
    resets = int(result.get("resets") or 0)
    return f" ({plural(resets, 'reset')})" if resets else ""


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD"}


def _print_energy(report: Report, console: Console) -> None:
    """One energy line per vendor, each its own GPUs' (never one summed into the other); named by its vendor
    unless the run's GPUs are all NVIDIA ones."""
    from rich.markup import escape

    totals = report.vendor_energy()
    for vendor, energy in totals:
        named = "Energy" if [v for v, _ in totals] == ["nvidia"] else f"{VENDOR_NAMES[vendor]} energy"
        _print_vendor_energy(report, vendor, named, energy, console)
    warning = report.telemetry_data.get("summary", {}).get("refresh_warning")
    if warning and any(energy.total_energy_j is not None for _, energy in totals):
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)


def _print_vendor_energy(report: Report, vendor: str, named: str, energy: EnergyTotals, console: Console) -> None:
    from rich.markup import escape

    if energy.total_energy_j is None:
        return
    from bridge.report.energy import vendor_series
    from bridge.report.telemetry_data import gpus_text

    value, unit = readable_energy(energy.total_energy_j)
    scale = energy.total_energy_j / value if value else 1.0
    parts = [f"total GPU energy {format_number(value)} {unit}"]
    if energy.uncertainty_j is not None:  # the expected error (bridge/report/uncertainty.py)
        parts[0] += f" ± {plus_minus(energy.uncertainty_j, unit, scale)}"
    if energy.average_power_w is not None:  # a sum over the GPUs: say so, or it reads as per GPU
        marked = " (from the sampled power)" if energy.power_from_samples else ""
        parts.append(f"total average power {format_number(energy.average_power_w)} W{marked}")
    parts.append(f"over {_duration(energy.duration_s)} ({report.counter_mode} counters)")
    grace_s = report.window.grace_ns / 1e9
    if grace_s and report.counter_mode != "aiperf":  # AIPerf's end_time is later than the energy's end (issue 44)
        parts.append(f"summary.end_time adds AIPerf's {grace_s:g} s grace (summary.energy_window)")
    separator = ", " if console.width >= WIDE_TABLE else "\n  "  # narrow: one figure per line, no wrapping
    if energy.bound_j:  # how far the truth can be (bridge/report/refresh.py), in the total's unit
        parts.append(f"bound ± {format_number(energy.bound_j / scale)} {unit}")
    if energy.refresh_period_s is not None:
        every = "at most once in" if energy.refresh_at_least else "every"
        source = "DCGM" if vendor == "nvidia" else "exporter"
        parts.append(f"{source} refresh {every} {energy.refresh_period_s:,.1f} s")
    gpus = gpus_text((s.endpoint, s.meta) for s in vendor_series(report.series, vendor))
    heading = f"{named}, {gpus if gpus.split()[0] == '1' else f'all {gpus}'}:"
    console.print(escape(heading + (" " if separator == ", " else separator) + separator.join(parts)),
                  highlight=False)


def print_verdict(report: Report, console: Console) -> None:
    """The closing line: `measurement valid` or `measurement NOT valid: <reasons> — <fix>` (report/verdict.py)."""
    from rich.markup import escape

    from bridge.report.verdict import verdict_line

    line = verdict_line(report.telemetry_data)
    style = "green" if line == "measurement valid" else "yellow"
    console.print(f"[{style}]{escape(line)}[/{style}]", highlight=False, overflow="fold")
