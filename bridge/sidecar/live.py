"""The live view (`--live`, or AIPerf's `--gpu-telemetry dashboard`): a refreshing per-GPU table.

It shares the terminal with the benchmark: `profile` relays the benchmark's output through the view, which
prints it above the refreshing region (rich redraws the region by moving the cursor; output written beside
it would be overwritten). A benchmark with a full-screen UI of its own cannot share a screen: `profile`
says so and suggests its simple UI.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any

from bridge.endpoints import display_key

if TYPE_CHECKING:
    from bridge.health import RefreshWatch
    from bridge.sidecar.session import Session

# Each column's NVIDIA key, then its AMD one (AIPerf's amd_* keys, the same units): a GPU carries one of them.
_COLUMNS = (
    ("Util %", ("nvidia_gpu_utilization", "amd_gfx_activity"), "{:.0f}"),
    ("Power W", ("nvidia_power_usage", "amd_power"), "{:.0f}"),
    ("Temp °C", ("nvidia_temperature", "amd_temperature"), "{:.0f}"),
    ("Mem GB", ("nvidia_memory_used", "amd_memory_used"), "{:.1f}"),
)
_ENERGY = ("nvidia_energy_consumption", "amd_energy_consumption")  # MJ
_NARROW_HEADERS = ("Util%", "W", "°C", "GB")  # the same columns below NARROW


NARROW = 128  # below this many columns (the console's WIDE_TABLE too) the model column goes, endpoints shorten


def live_table(session: Session, width: int = NARROW) -> Any:
    """The view's table: one line per GPU at any width. Everything from outside (endpoint names, model names,
    error texts, the phase) is escaped: rich would read `[/bold]` in a model name as markup."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    narrow = width < NARROW
    table = Table(title=escape(f"dcgm-bridge · run {session.run_id} · phase {session.phase or '-'} · "
                               f"{session.records_written} records"), expand=False, padding=(0, 1),
                  box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD)  # narrow: no column rules
    loops = list(session.loops.items())
    names = short_names([display_key(url) for url, _ in loops] + [url for (url, _), _ in
                                                                   session.latest_records().items()],
                        shorten=narrow)
    table.add_column("Endpoint", no_wrap=True)
    table.add_column("GPU", justify="right", no_wrap=True)
    if not narrow:
        table.add_column("Model", no_wrap=True, overflow="ellipsis", max_width=28)
    headers = [*(_NARROW_HEADERS if narrow else (c[0] for c in _COLUMNS)), "Energy" if narrow else "Energy so far"]
    for header in headers:  # the numbers keep their width: what gives is the last column's text
        table.add_column(header, justify="right", no_wrap=True)
    # The one column rich may narrow (the others are no_wrap): its cells stay one line, cut with an ellipsis.
    table.add_column("Values", overflow="ellipsis")
    ages = {display_key(url): values_age(loop.stats.refresh, session.config.collection_interval, time.time_ns())
            for url, loop in loops}
    rows = sorted(session.latest_records().items(),
                  key=lambda kv: (kv[0][0], kv[1][1].gpu_index or 0, kv[0][1][0], kv[0][1][1] or ""))
    for (url, _identity), (first, last) in rows:
        data = last.telemetry_data
        gpu = f"{last.gpu_index}" + (f" mig{last.gpu_instance_id}" if last.gpu_instance_id else "")
        values = [(_first_of(data, keys), fmt) for _, keys, fmt in _COLUMNS]
        cells = [fmt.format(value) if value is not None else "-" for value, fmt in values]
        start, now = _first_of(first.telemetry_data, _ENERGY), _first_of(data, _ENERGY)
        energy = _joules(now - start) if start is not None and now is not None and now >= start else "-"
        model = [] if narrow else [last.gpu_model_name or "-"]
        table.add_row(*(escape(c) for c in (names.get(url, url), gpu, *model, *cells, energy)),
                      _one_line(ages.get(url, "-")))
    shown = {url for (url, _identity) in session.latest_records()}
    for url, loop in sorted(loops):
        stats = loop.stats.as_json()
        if display_key(url) not in shown:  # no data yet, or down: still a row, with why
            state = "down" if stats["state"] == "down" or stats["last_error"] else "waiting"
            reason = str(stats["last_error"] or "no scrape yet")
            why, blanks = f"{state}: {reason[:60]}", ["-"] * (len(_COLUMNS) + 1)
            cells = [*blanks, why] if narrow else [why, *blanks, "-"]  # narrow: why in the last column
            table.add_row(*(escape(c) for c in (names.get(display_key(url), display_key(url)), "-", *cells[:-1])),
                          _one_line(cells[-1]))
    return table


def _first_of(data: Mapping[str, float], keys: Iterable[str]) -> float | None:
    return next((data[key] for key in keys if key in data), None)


def _one_line(text: str) -> Any:
    """A cell of plain text (no markup read in it) kept to one line, cut with an ellipsis when narrowed."""
    from rich.text import Text

    return Text(text, no_wrap=True, overflow="ellipsis")


def short_names(names: Iterable[str], shorten: bool = True) -> dict[str, str]:
    """Each endpoint name with the prefix they all share cut to `…` at its last separator, so that a narrow
    column keeps what tells them apart: `127.0.0.1:19400`, `127.0.0.1:19401` → `…:19400`, `…:19401`. A lone
    name, or names that share no separator, stay whole."""
    unique = sorted(set(names))
    if not shorten or len(unique) < 2:
        return {n: n for n in unique}
    prefix = os.path.commonprefix(unique)
    cut = max(prefix.rfind(c) for c in ".:/")
    if cut <= 0:
        return {n: n for n in unique}
    return {n: "…" + n[cut:] for n in unique}


def values_age(watch: RefreshWatch, interval_s: float, now_ns: int) -> str:
    """How old the values shown are: "fresh" when the exporter refreshes at about every scrape, else the age of
    its latest refresh and its period (a stale stretch says so, instead of looking like a flat line)."""
    period = watch.period_s
    if watch.last_new_ns is None:
        return "-"
    if period is None or not watch.slower_than(interval_s):
        return "fresh"
    age = max(now_ns - watch.last_new_ns, 0) / 1e9
    return f"{_seconds(age)} s old · every {_seconds(period)} s"


def _seconds(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def _joules(mj: float) -> str:
    joules = mj * 1e6
    return f"{joules / 1000:,.2f} kJ" if joules >= 1000 else f"{joules:,.1f} J"


class LiveView:
    """Refreshes the table in a background thread until stopped."""

    def __init__(self, session: Session, refresh_s: float = 1.0, console: Any = None) -> None:
        self.session = session
        self.refresh_s = refresh_s
        self.console = console
        self._live: Any = None
        self._started = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live view", daemon=True)

    def print_line(self, text: str) -> None:
        """A line of the benchmark's output, printed above the refreshing table."""
        self._started.wait(5)
        console = self._live.console if self._live is not None else self.console
        if console is None:
            print(text, flush=True)
            return
        console.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)

    def relay(self, stream: IO[bytes]) -> threading.Thread:
        """Copy a benchmark's output (a pipe) through the view, line by line, until it closes."""
        def copy() -> None:
            for line in iter(stream.readline, b""):
                self.print_line(line.decode("utf-8", errors="replace").rstrip("\r\n"))
            stream.close()

        thread = threading.Thread(target=copy, name="benchmark output", daemon=True)
        thread.start()
        return thread

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        from rich.live import Live

        from bridge.report.console import make_console

        console = self.console or make_console()
        with Live(live_table(self.session, console.width), refresh_per_second=4, transient=False,
                  console=console) as live:
            self._live = live
            self._started.set()
            while not self._stop.wait(self.refresh_s):
                live.update(live_table(self.session, console.width))

