"""The run's commands: `sidecar` (the container entry point), `profile -- CMD` and `demo`.

Loaded by bridge/cli.py only when one of them runs."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from bridge.errors import ConfigError


class TelemetryCommand(click.Command):
    """`--gpu-telemetry A B C` as AIPerf users type it (and the README shows): the list ends at the next
    option or at `--`, so a mistyped flag after it is still reported by name."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from bridge.endpoints import expand_telemetry_args

        return super().parse_args(ctx, expand_telemetry_args(args))


# -- sidecar ----------------------------------------------------------------------------------------
def telemetry_options(func: Any) -> Any:
    options = [
        click.option("--gpu-telemetry", multiple=True, metavar="ITEM",
                     help="DCGM exporter URL(s), a custom-metrics .csv, k8s://ns/svc[:port] or 'dashboard'. "
                          "Several per flag (space or comma separated)."),
        click.option("--no-gpu-telemetry", is_flag=True, default=None, help="Disable GPU telemetry."),
        click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="YAML file with a gpu_telemetry: block (AIPerf's shape plus our settings)."),
        click.option("--run-id", help="Run id on every record and OTLP point (default: generated)."),
        click.option("--artifact-dir", help="Where the outputs go (default ./artifacts)."),
        click.option("--counter-mode", type=click.Choice(["interpolated", "aiperf"])),
        click.option("--profile-export-prefix", help="Name the outputs as AIPerf does with this prefix."),
        click.option("--live", is_flag=True, help="Show a refreshing per-GPU table while collecting."),
    ]
    options += [
        click.option("--otlp-endpoint", help="Forward every sample as OTLP here (else OTEL_EXPORTER_OTLP_"
                     "[METRICS_]ENDPOINT; off when neither is set)."),
        click.option("--otlp-protocol", type=click.Choice(["http/protobuf", "grpc"]),
                     help="OTLP transport (default http/protobuf, or OTEL_EXPORTER_OTLP_PROTOCOL)."),
        click.option("--otlp-headers", help="k=v,k2=v2 sent with every export (or OTEL_EXPORTER_OTLP_HEADERS)."),
        click.option("--otlp-timeout", type=float, help="Seconds per export request."),
        click.option("--otlp-compression", type=click.Choice(["gzip", "none"])),
        click.option("--otlp-insecure", is_flag=True, default=None, help="gRPC without TLS."),
        click.option("--otlp-units", type=click.Choice(["none", "ucum"]),
                     help="Set UCUM units on metrics (changes their Prometheus names; default none)."),
        click.option("--otlp-export-interval", type=float, help="Seconds between exports (default 1)."),
        click.option("--otlp-max-queue-points", type=int, help="Queue bound; the oldest pages are dropped past it."),
        click.option("--relabel-config", type=click.Path(exists=True, dir_okay=False),
                     help="Prometheus-style relabel rules (YAML) applied to OTLP and the pull endpoint."),
        click.option("--service-name", help="OTLP resource service.name (default dcgm-exporter)."),
        click.option("--resource-attribute", multiple=True, metavar="K=V", help="Extra OTLP resource attribute."),
        click.option("--attribute", multiple=True, metavar="K=V", help="Static attribute on every data point."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


_OTLP_FLAGS = ("otlp_endpoint", "otlp_protocol", "otlp_headers", "otlp_timeout", "otlp_compression",
               "otlp_insecure", "otlp_units", "otlp_export_interval", "otlp_max_queue_points", "relabel_config",
               "service_name", "resource_attribute", "attribute")


def _pairs(values: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {value!r}: expected KEY=VALUE")
        out[key.strip()] = val.strip()
    return out


def build_forwarder(otlp: dict[str, Any]) -> tuple[Any, Any]:
    """The OTLP forwarder (None when export is off) and the relabel rules, from the flags and OTEL_* env."""
    import os

    from bridge.otlp import OtlpConfigError, OtlpForwarder, base_attributes, resolve_config
    from bridge.relabel import NO_RELABEL, load_config

    try:
        relabel = load_config(otlp["relabel_config"]) if otlp.get("relabel_config") else NO_RELABEL
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--relabel-config {otlp['relabel_config']}: {exc}") from None
    try:
        config = resolve_config(os.environ, endpoint=otlp.get("otlp_endpoint"), protocol=otlp.get("otlp_protocol"),
                                headers=otlp.get("otlp_headers"), timeout_s=otlp.get("otlp_timeout"),
                                compression=otlp.get("otlp_compression"), insecure=otlp.get("otlp_insecure"),
                                units=otlp.get("otlp_units"), export_interval_s=otlp.get("otlp_export_interval"),
                                max_queue_points=otlp.get("otlp_max_queue_points"))
    except OtlpConfigError as exc:
        raise ConfigError(f"OTLP configuration: {exc}") from None
    if config is None:
        return None, relabel
    resource = base_attributes(os.environ, service_name=otlp.get("service_name"),
                               attributes=_pairs(otlp.get("resource_attribute") or (), "--resource-attribute"))
    forwarder = OtlpForwarder(config, base_resource=resource,
                              static_attributes=_pairs(otlp.get("attribute") or (), "--attribute"),
                              relabel_config=relabel)
    return forwarder, relabel


def split_flags(flags: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    otlp = {k: flags.pop(k) for k in _OTLP_FLAGS if k in flags}
    return flags, otlp


def resolve_config(flags: dict[str, Any]) -> Any:
    from bridge.config import resolve

    config_file = flags.pop("config_file", None)
    flags["gpu_telemetry"] = flags.get("gpu_telemetry") or None
    return resolve(flags, config_file=config_file)  # a ConfigError is reported by bridge/cli.py (exit 2)


def build_session_table(config: Any) -> Any:
    from bridge.fields import default_table, table_with_custom

    return table_with_custom(default_table(), config.telemetry.metrics_files)


def build_session(config: Any, otlp: dict[str, Any]) -> Any:
    from bridge.sidecar.session import Session

    table = build_session_table(config)
    forwarder, relabel = build_forwarder(otlp)
    return Session(config, table, forwarder=forwarder, relabel_config=relabel)


@click.command(cls=TelemetryCommand)
@telemetry_options
@click.option("--health-port", type=int, help="Control API port (default 8086).")
def sidecar(live: bool, **flags: Any) -> None:
    """The container entry point: configure, serve the control API, collect until complete or a signal."""
    from bridge.sidecar.control import ControlServer

    flags, otlp = split_flags(flags)
    config = resolve_config(flags)
    if not config.enabled:
        click.echo("GPU telemetry is disabled (--no-gpu-telemetry); nothing to do.")
        return
    session = build_session(config, otlp)
    session.prepare_artifacts()  # an unwritable folder stops start-up (exit 2) before anything is served
    done = threading.Event()
    # A native sidecar that exits is restarted by the kubelet (and would overwrite the finished run):
    # with exit_on_complete false it stays up after POST /complete until SIGTERM.
    server = ControlServer(session, config.health_host, config.health_port, config.control_allow,
                           on_complete=done.set if config.exit_on_complete else None,
                           metrics_text=session.exposition)
    server.start()
    click.echo(f"dcgm-bridge sidecar: run {session.run_id}, control API on port {server.port}", err=True)

    def _signal(signum: int, _frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)
    session.configure()
    session.start()
    view = _live_view(session, live or config.telemetry.dashboard)
    done_file = Path(config.done_file) if config.done_file else None
    watch = OtlpLossWatch()
    while not done.wait(0.25):
        if done_file is not None and done_file.exists():
            break
        if session.forwarder is not None:
            watch.check(session.forwarder.stats().as_dict())
    if view is not None:
        view.stop()
    outputs = session.complete()
    server.stop()
    click.echo(f"dcgm-bridge sidecar: run {session.run_id} complete; outputs in {session.artifact_dir}", err=True)
    _exit_on_problems(outputs)


class OtlpLossWatch:
    """During the run: one line when the OTLP receiver starts losing points, then at most one a minute while
    the count grows (the events file and /status have the details)."""

    def __init__(self, every_s: float = 60.0, monotonic: Any = None) -> None:
        import time

        self._monotonic = monotonic or time.monotonic
        self.every_s = every_s
        self._reported = 0
        self._last = -every_s

    def check(self, stats: dict[str, Any]) -> str | None:
        lost = int(stats.get("dropped_points", 0)) + int(stats.get("rejected_points", 0))
        now = self._monotonic()
        if lost <= self._reported or now - self._last < self.every_s and self._reported:
            return None
        self._reported, self._last = lost, now
        line = (f"warning: OTLP receiver is losing data: {lost} points dropped or rejected so far, "
                f"{stats.get('sent_points', 0)} sent (last error: {stats.get('last_error') or '-'})")
        click.echo(line, err=True)
        return line


def _live_view(session: Any, wanted: bool) -> Any:
    if not wanted:
        return None
    from bridge.sidecar.live import LiveView

    view = LiveView(session)
    view.start()
    return view


@click.command(cls=TelemetryCommand, context_settings={"allow_interspersed_args": False})
@telemetry_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def profile(command: tuple[str, ...], live: bool, **flags: Any) -> None:
    """Run a benchmark command with GPU telemetry: dcgm-bridge profile [OPTIONS] -- CMD [ARGS]…

    CMD gets DCGM_BRIDGE_CONTROL_URL to post phase marks; without marks the phases come from a
    phase_manifest.json below the artifact directory (AIPerf writes one), else the whole run is
    reported. The exit code is CMD's.
    """
    import shutil

    from bridge.sidecar.profile import run_profile

    if command and shutil.which(command[0]) is None:  # before anything starts: nothing to collect around
        raise ConfigError(f"profile: cannot run {command[0]!r}: no such program (not on PATH, or not executable); "
                          "check the command after --")
    flags, otlp = split_flags(flags)
    config = resolve_config(flags)
    session = build_session(config, otlp) if config.enabled else None
    from bridge.errors import BridgeError

    try:
        code = run_profile(config, session, list(command), live=live)
    except BridgeError:
        raise  # its own message and exit code (bridge/cli.py)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot run {' '.join(command)}: {exc}") from None
    if session is not None and session.outputs is not None and code == 1 and session.outputs.problems:
        _exit_on_problems(session.outputs)
    sys.exit(code)


def _exit_on_problems(outputs: Any) -> None:
    """README "Exit codes": 1 when a promised output (the report, the record log) was lost or not written."""
    for problem in outputs.problems:
        click.echo(f"Error: {problem}", err=True)
    if outputs.problems:
        sys.exit(1)


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("artifacts/demo"),
              show_default=True, help="Where the artifacts go.")
@click.option("--duration", type=click.FloatRange(2.0, 3600.0), default=15.0, show_default=True,
              envvar="DEMO_DURATION", help="Seconds of collection (env DEMO_DURATION).")
@click.option("--gpus", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--mig", type=click.IntRange(0, 7), default=0, help="MIG instances per simulated GPU.")
def demo(out: Path, duration: float, gpus: int, mig: int) -> None:
    """Run a warmup + profiling collection against the embedded simulated exporter and report it."""
    from bridge.sidecar.demo import run_demo

    run_demo(out, duration, gpus=gpus, mig=mig)
