"""The console summary: `k/n telemetry sources reachable` with ✔/✘ per endpoint, then one table per GPU
(rows `<display> (<unit>)`, columns avg min max p99 p90 p50 std), as AIPerf's GPU telemetry exporter.

Energy is shown in a unit a person can read (J, kJ or MJ) instead of AIPerf's `0.00 MJ`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge.samples import MetricKind

if TYPE_CHECKING:
    from rich.console import Console

    from bridge.report.build import Report

COLUMNS = ("avg", "min", "max", "p99", "p90", "p50", "std")
_MJ_KEYS = frozenset(["nvidia_energy_consumption", "amd_energy_consumption"])


def format_number(value: Any) -> str:
    """AIPerf's console format: `{:,.2f}`, `{:.2e}` from 1e6, N/A when missing."""
    if value is None:
        return "N/A"
    if isinstance(value, bool) or isinstance(value, int) and abs(value) < 1_000_000:
        return f"{value:,}" if not isinstance(value, bool) else str(value)
    number = float(value)
    return f"{number:.2e}" if abs(number) >= 1e6 else f"{number:,.2f}"


def readable_energy(joules: float) -> tuple[float, str]:
    """(value, unit) in J, kJ or MJ so that the value reads as 1-999 where possible."""
    magnitude = abs(joules)
    if magnitude >= 1e6:
        return joules / 1e6, "MJ"
    if magnitude >= 1e3:
        return joules / 1e3, "kJ"
    return joules, "J"


def render_console(report: Report, console: Console | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    statuses = report.endpoints
    up = sum(1 for s in statuses if s.up_at_end)
    console.print()
    console.print("[bold]dcgm-bridge | GPU Telemetry Summary[/bold]")
    console.print(f"{up}/{len(statuses)} telemetry sources reachable")
    endpoints_data: dict[str, Any] = report.telemetry_data.get("endpoints", {})
    for status in statuses:
        refresh = endpoints_data.get(status.display, {}).get("refresh") or {}
        every = "at most once in" if refresh.get("period_at_least") else "every"
        slow = "" if refresh.get("fresh", True) or not refresh.get("period_s") else \
            f" (DCGM refresh {every} {refresh['period_s']:,.1f} s)"
        if status.up_at_end:
            console.print(f"  [green]✔[/green] {status.display}{slow}")
        else:
            console.print(f"  [red]✘[/red] {status.display} ({status.reason or 'unreachable'})")
    endpoints: dict[str, Any] = report.telemetry_data.get("endpoints", {})
    if console.width < WIDE_TABLE:
        _print_stacked(report, endpoints, console)
        _print_energy(report, console)
        print_verdict(report, console)
        return
    for endpoint, body in endpoints.items():
        for gpu_key, gpu in body.get("gpus", {}).items():
            title = f"{endpoint} | GPU {gpu.get('gpu_index')} | {gpu.get('gpu_name') or 'unknown model'}"
            if gpu_key != f"gpu_{gpu.get('gpu_index')}":
                title += f" | {gpu_key}"
            table = Table(title=title, title_justify="left")
            table.add_column("Metric", style="cyan")
            for column in COLUMNS:
                table.add_column(column, justify="right")
            for key, result in gpu.get("metrics", {}).items():
                table.add_row(*_row(report, key, result))
            console.print(table)
    _print_energy(report, console)
    print_verdict(report, console)


WIDE_TABLE = 128  # the per-GPU table's width with AIPerf's long metric names
_CELL = 10


def _print_stacked(report: Report, endpoints: dict[str, Any], console: Console) -> None:
    """Narrow terminals (80 columns, a pipe, a CI log): each metric's short name on its own line, its values
    under the column heads, so nothing wraps."""
    from rich.markup import escape

    head = "".join(f"{c:>{_CELL}}" for c in COLUMNS)
    for endpoint, body in endpoints.items():
        for gpu_key, gpu in body.get("gpus", {}).items():
            title = f"GPU {gpu.get('gpu_index')} | {gpu.get('gpu_name') or 'unknown model'} | {endpoint}"
            if gpu_key != f"gpu_{gpu.get('gpu_index')}":
                title += f" | {gpu_key}"
            console.print()
            console.print(f"[bold]{escape(title)}[/bold]", overflow="fold")
            console.print(head, highlight=False)
            for key, result in gpu.get("metrics", {}).items():
                name, *cells = _row(report, key, result)
                console.print(f"[cyan]{escape(_short(name))}[/cyan]", overflow="fold")
                console.print("".join(f"{c:>{_CELL}}" for c in cells), highlight=False, overflow="fold")


def _short(display: str) -> str:
    for prefix in ("NVIDIA ", "AMD "):
        if display.startswith(prefix):
            return display[len(prefix):]
    return display


def _row(report: Report, key: str, result: dict[str, Any]) -> list[str]:
    label = report.labels.get(key)
    display = label.display if label else key
    unit = str(result.get("unit", label.unit if label else ""))
    if label is not None and label.kind == MetricKind.CODE and "last" in result:
        cells = {"avg": f"last {format_number(result['last'])}", "max": format_number(result.get("max"))}
        return [f"{display} ({unit})"] + [cells.get(c, "N/A") for c in COLUMNS]
    if key in _MJ_KEYS and unit == "MJ":
        cells = {}
        joules = float(result["avg"]) * 1e6
        value, unit = readable_energy(joules)
        cells["avg"] = format_number(value)
        if result.get("resets"):
            cells["avg"] += f" ({result['resets']} reset{'s' if result['resets'] > 1 else ''})"
        return [f"{display} ({unit})"] + [cells.get(c, "N/A") for c in COLUMNS]
    if unit == "count":  # error counts: whole numbers, not 0.00
        result = {c: _whole(v) if c in COLUMNS else v for c, v in result.items()}
    cells = {c: format_number(result.get(c)) for c in COLUMNS}
    if result.get("resets"):
        cells["avg"] += f" ({result['resets']} reset{'s' if result['resets'] > 1 else ''})"
    return [f"{display} ({unit})"] + [cells[c] for c in COLUMNS]


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _print_energy(report: Report, console: Console) -> None:
    energy = report.energy
    if energy.total_energy_j is None:
        return
    from bridge.report.telemetry_data import gpus_text

    value, unit = readable_energy(energy.total_energy_j)
    scale = energy.total_energy_j / value if value else 1.0
    parts = [f"total GPU energy {format_number(value)} {unit}"]
    if energy.uncertainty_j is not None:  # the expected error (bridge/report/uncertainty.py), in the total's unit
        parts[0] += f" ± {format_number(energy.uncertainty_j / scale)} {unit}"
    if energy.average_power_w is not None:  # a sum over the GPUs: say so, or it reads as per GPU
        marked = " (from the sampled power)" if energy.power_from_samples else ""
        parts.append(f"total average power {format_number(energy.average_power_w)} W{marked}")
    parts.append(f"over {energy.duration_s:,.1f} s ({report.counter_mode} counters)")
    separator = ", " if console.width >= WIDE_TABLE else "\n  "  # narrow: one figure per line, no wrapping
    if energy.bound_j:  # how far the truth can be (bridge/report/refresh.py), in the total's unit
        parts.append(f"bound ± {format_number(energy.bound_j / scale)} {unit}")
    if energy.refresh_period_s is not None:
        every = "at most once in" if energy.refresh_at_least else "every"
        parts.append(f"DCGM refresh {every} {energy.refresh_period_s:,.1f} s")
    gpus = gpus_text((s.endpoint, s.meta.identity) for s in report.series)
    console.print(f"Energy, all {gpus}:" + (" " if separator == ", " else separator)
                  + separator.join(parts))
    warning = report.telemetry_data.get("summary", {}).get("refresh_warning")
    if warning:
        console.print(f"[yellow]warning:[/yellow] {warning}", markup=True, highlight=False)


def print_verdict(report: Report, console: Console) -> None:
    """The closing line: `measurement valid` or `measurement NOT valid: <reasons> — <fix>` (report/verdict.py)."""
    from rich.markup import escape

    from bridge.report.verdict import verdict_line

    line = verdict_line(report.telemetry_data)
    style = "green" if line == "measurement valid" else "yellow"
    console.print(f"[{style}]{escape(line)}[/{style}]", highlight=False, overflow="fold")
