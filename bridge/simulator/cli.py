"""`dcgm-bridge simulate`: serve simulated dcgm-exporter pages until Ctrl-C or SIGTERM, or print one."""

from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import cast

import click

from bridge.simulator.config import (
    DIALECT_NAMES,
    FAULT_KINDS,
    NS,
    Counters,
    Dialect,
    PodLabels,
    SensorKind,
    SimulatorConfig,
    parse_fault_spec,
)
from bridge.simulator.model import NodeModel, scaled_clock
from bridge.simulator.render import render_page
from bridge.simulator.server import SimulatedExporter


@click.command("simulate")
@click.option("--port", type=click.IntRange(0, 65535), default=9400, show_default=True,
              help="Port on 127.0.0.1 (0: ephemeral). With --endpoints N, ports P..P+N-1.")
@click.option("--gpus", type=click.IntRange(1, 64), default=8, show_default=True, help="Simulated GPUs per node.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the simulated values and UUIDs: the same seed serves the same pages.")
@click.option("--dialect", type=click.Choice(DIALECT_NAMES), default="legacy", show_default=True,
              help="legacy: Hostname (<= 4.8.2); current: hostname; old-namespace: -o 1.x names; "
                   "dcgm49: 4.9 DCGM 4.7 names and units; dcgm410: and 4.10's _BYTES_PER_SECOND; "
                   "bare: no HELP/TYPE; openmetrics; sorted-labels; spaced; amd: AMD device-metrics-exporter "
                   "(2025 labels), amd-prefixed: its amd_ names, amd-2026: amd_ names and the 2026 bare-metal "
                   "labels (no gpu_uuid).")
@click.option("--mig", type=click.IntRange(0, 7), default=0, show_default=True, help="MIG instances per GPU.")
@click.option("--pod-labels", "pod_labels", flag_value="mapped", help="pod/namespace/container per GPU.")
@click.option("--empty-pod-labels", "pod_labels", flag_value="empty", help='The old pod="" style.')
@click.option("--refresh-ms", type=click.IntRange(min=0), default=0, show_default=True,
              help="DCGM refresh cadence (-c); 0: fresh values on every request.")
@click.option("--sensors", type=click.Choice(["h200", "ideal"]), default="h200", show_default=True,
              help="h200: the power gauge a 1 s average and the energy counter held 100 ms, as measured on an H200; "
                   "ideal: both read the truth at the instant served.")
@click.option("--hostname", default=None, help="Hostname label value (default: a pod-like name).")
@click.option("--no-hostname", is_flag=True, help="Omit the hostname label (-n).")
@click.option("--counters", type=click.Choice(["full", "default"]), default="full", show_default=True,
              help="full: ~40 families per GPU; default: etc/default-counters.csv only.")
@click.option("--model-name", default="NVIDIA H100 80GB HBM3", show_default=True,
              help="The modelName label of every GPU.")
@click.option("--driver-version", default="570.124.06", show_default=True,
              help="The DCGM_FI_DRIVER_VERSION label of every GPU.")
@click.option("--timestamps", is_flag=True, help="Add sample timestamps.")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Simulated seconds per real second (long runs in short benches).")
@click.option("--fault", "faults", multiple=True, metavar="SPEC",
              help=f"KIND[,key=value...], e.g. http-500,requests=3-5 or restart,from=30,for=10 "
                   f"(seconds after start). Repeatable. Kinds: {', '.join(FAULT_KINDS)}. Keys: requests=N|N-M|N-, "
                   "from=S, until=S, for=S, delay=S, mb=N, gpu=N, code=N.")
@click.option("--endpoints", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Serve N simulated nodes (seeds S..S+N-1) on consecutive ports.")
@click.option("--repeat", type=click.IntRange(min=0), default=None,
              help="A repeat's number: the load's jitter drawn anew and the power scaled by a factor from "
                   "N(1, --run-to-run-cv) (the same seed and repeat serve the same run).")
@click.option("--run-to-run-cv", type=click.FloatRange(0, 0.2), default=0.0, show_default=True,
              help="With --repeat: the run-to-run coefficient of variation of the power.")
@click.option("--power-scale", type=click.FloatRange(0.1, 10), default=1.0, show_default=True,
              help="Scale every GPU's power (a configuration that draws more or less).")
@click.option("--once", is_flag=True, help="Write one page and exit (for `dcgm-bridge parse`).")
@click.option("--at", "at_s", type=float, default=None, help="With --once: simulated Unix time in seconds.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --once: write the page here instead of stdout.")
def simulate(port: int, gpus: int, seed: int, dialect: str, mig: int, pod_labels: str | None,
             refresh_ms: int, sensors: str, hostname: str | None, no_hostname: bool, counters: str, model_name: str,
             driver_version: str, timestamps: bool, time_scale: float, faults: tuple[str, ...],
             endpoints: int, repeat: int | None, run_to_run_cv: float, power_scale: float, once: bool,
             at_s: float | None, output: Path | None) -> None:
    """Serve a seeded, deterministic simulated NVIDIA dcgm-exporter (no GPU needed)."""
    now_ns = scaled_clock(time_scale) if time_scale != 1.0 else time.time_ns
    start_ns = now_ns()
    try:
        config = SimulatorConfig(
            gpus=gpus, seed=seed, dialect=cast(Dialect, dialect), mig=mig,
            pod_labels=cast(PodLabels, pod_labels or "none"), refresh_ms=refresh_ms, hostname=hostname,
            no_hostname=no_hostname, counters=cast(Counters, counters), model_name=model_name,
            driver_version=driver_version, sensors=cast(SensorKind, sensors),
            timestamps=timestamps, port=port, repeat=repeat, run_to_run_cv=run_to_run_cv, power_scale=power_scale,
            faults=tuple(parse_fault_spec(spec, start_ns) for spec in faults),
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    if once:
        at_ns = round(at_s * NS) if at_s is not None else start_ns
        page = render_page(NodeModel(config, lambda: at_ns), at_ns)
        if output is None:
            sys.stdout.buffer.write(page)
        else:
            output.write_bytes(page)
        return
    exporters = [
        SimulatedExporter(replace(config, seed=seed + i, port=port + i if port else 0), now_ns=now_ns)
        for i in range(endpoints)
    ]
    _serve(exporters, config)


def _serve(exporters: list[SimulatedExporter], config: SimulatorConfig) -> None:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    started: list[SimulatedExporter] = []
    try:
        for exporter in exporters:
            started.append(exporter.start())
            gpus = f"{config.gpus} GPU{'' if config.gpus == 1 else 's'}"
            click.echo(f"simulated dcgm-exporter ({gpus}, dialect {config.dialect}, "
                       f"seed {exporter.config.seed}) at {exporter.url}")
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        from bridge.errors import ConfigError

        port = exporters[len(started)].config.port
        raise ConfigError(f"--port {port}: cannot listen on 127.0.0.1:{port} ({exc.strerror or exc}); choose another "
                          "port, or 0 for a free one") from None
    finally:
        for exporter in started:
            exporter.stop()
