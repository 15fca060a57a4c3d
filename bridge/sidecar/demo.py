"""`dcgm-bridge demo`: the whole pipeline against the embedded simulator (8 GPUs), no GPU needed.

A warmup phase, then a profiling phase; then the console report and the written artifacts. This is
the one place that waits on real time: it is a demonstration of a run, not a test.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fields import default_table
from bridge.sidecar.session import Session, SessionOutputs


def run_demo(out: Path, duration: float, gpus: int = 8, interval: float = 0.333, console: Any = None,
             mig: int = 0, refresh_ms: int = 0) -> SessionOutputs:
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from bridge.report.console import make_console
    from bridge.simulator import SimulatedExporter, SimulatorConfig

    console = console or make_console()  # piped: 80 columns, the stacked tables (one terminal policy)
    out.mkdir(parents=True, exist_ok=True)
    simulated = SimulatorConfig(gpus=gpus, seed=7, mig=mig, refresh_ms=refresh_ms, sensors="h200")  # as on an H200
    with SimulatedExporter(simulated) as exporter:
        config = Config(telemetry=TelemetryItems(urls=[exporter.url]), default_endpoints=[],
                        artifact_dir=str(out), collection_interval=interval,
                        run_id=f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}")
        session = Session(config, default_table())
        console.print(f"[bold]dcgm-bridge demo[/]: simulated dcgm-exporter with {gpus} GPUs at {exporter.url}, "
                      f"run {session.run_id}")
        session.configure()
        session.start()
        warmup = max(1.0, duration * 0.25)
        phases = [("warmup", "warmup", warmup), ("profiling", "profiling", max(1.0, duration - warmup))]
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[records]} records"),
                      TimeRemainingColumn(), console=console, transient=True) as progress:
            for name, kind, seconds in phases:
                session.mark_phase(name, kind, "start", time.time_ns())
                task = progress.add_task(f"{name:>9}", total=seconds, records=session.records_written)
                started = time.monotonic()
                while (elapsed := time.monotonic() - started) < seconds:
                    time.sleep(min(0.2, seconds - elapsed))
                    progress.update(task, completed=time.monotonic() - started, records=session.records_written)
                end_ns = time.time_ns()
                session.mark_phase(name, kind, "end", end_ns)
        outputs = session.complete(requests_end_ns=end_ns, await_refresh=True)
    if outputs.report is not None:
        from bridge.report.html import write_html

        try:
            outputs.files.append(write_html(outputs.report, None, out / "gpu_telemetry.html",
                                            run_id=session.run_id, title=f"dcgm-bridge demo · {session.run_id}"))
        except OSError as exc:
            outputs.problems.append(f"cannot write {out / 'gpu_telemetry.html'}: {exc.strerror or exc}")
        from bridge.report import render_console

        render_console(outputs.report, console)
    console.print(f"\n[bold]{session.records_written}[/] records from {gpus} GPUs. "
                  f"Artifacts in [bold]{escape(str(out))}[/]:")
    for path in outputs.files:
        console.print(f"  {escape(str(path))}", highlight=False, soft_wrap=True)  # a path is never cut
    return outputs
