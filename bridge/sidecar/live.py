"""The live view (`--live`, or AIPerf's `--gpu-telemetry dashboard`): a refreshing per-GPU table."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge.sidecar.session import Session

_COLUMNS = (
    ("Util %", "nvidia_gpu_utilization", "{:.0f}"),
    ("Power W", "nvidia_power_usage", "{:.0f}"),
    ("Temp °C", "nvidia_temperature", "{:.0f}"),
    ("Mem GB", "nvidia_memory_used", "{:.1f}"),
)


def live_table(session: Session) -> Any:
    from rich.table import Table

    table = Table(title=f"dcgm-bridge · run {session.run_id} · phase {session.phase or '-'} · "
                        f"{session.records_written} records", expand=False)
    for header in ("Endpoint", "GPU", "Model", *(c[0] for c in _COLUMNS), "Energy so far"):
        table.add_column(header, justify="right" if header not in ("Endpoint", "Model") else "left")
    rows = sorted(session.latest_records().items(),
                  key=lambda kv: (kv[0][0], kv[1][1].gpu_index or 0, kv[0][1][0], kv[0][1][1] or ""))
    for (url, _identity), (first, last) in rows:
        data = last.telemetry_data
        gpu = f"{last.gpu_index}" + (f" mig{last.gpu_instance_id}" if last.gpu_instance_id else "")
        cells = [fmt.format(data[key]) if key in data else "-" for _, key, fmt in _COLUMNS]
        start, now = first.telemetry_data.get("nvidia_energy_consumption"), data.get("nvidia_energy_consumption")
        energy = _joules(now - start) if start is not None and now is not None and now >= start else "-"
        table.add_row(url, gpu, last.gpu_model_name or "-", *cells, energy)
    return table


def _joules(mj: float) -> str:
    joules = mj * 1e6
    return f"{joules / 1000:,.2f} kJ" if joules >= 1000 else f"{joules:,.1f} J"


class LiveView:
    """Refreshes the table in a background thread until stopped."""

    def __init__(self, session: Session, refresh_s: float = 1.0) -> None:
        self.session = session
        self.refresh_s = refresh_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live view", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        from rich.live import Live

        with Live(live_table(self.session), refresh_per_second=4, transient=False) as live:
            while not self._stop.wait(self.refresh_s):
                live.update(live_table(self.session))
