"""The run's commands: `sidecar` (the container entry point), `profile -- CMD` and `demo`.

Loaded by bridge/cli.py only when one of them runs."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bridge.errors import ConfigError
from bridge.samples import COUNTER_MODES
from bridge.sidecar.otlp_watch import OtlpLossWatch as OtlpLossWatch

if TYPE_CHECKING:
    from bridge.otlp import OtlpForwarder
    from bridge.relabel import RelabelConfig


class TelemetryCommand(click.Command):
    """`--gpu-telemetry A B C` as AIPerf users type it (and the README shows): the list ends at the next
    option or at `--`, so a mistyped flag after it is still reported by name."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from bridge.endpoints import expand_telemetry_args

        check_telemetry_flags(ctx, args, command_follows=self.name == "profile")
        return super().parse_args(ctx, expand_telemetry_args(args))


_NO_SEPARATOR = ("put -- before the benchmark command: dcgm-bridge profile --gpu-telemetry URL… -- CMD [ARGS]…; "
                 "without it --gpu-telemetry takes the command as exporter URLs")


def check_telemetry_flags(ctx: click.Context, args: list[str], command_follows: bool) -> None:
    """A `--gpu-telemetry` that takes nothing (the next word is an option) is a forgotten URL, not "the defaults"
    (they need no flag); for `profile`, a list that runs into the benchmark's command took it as URLs. Only the
    bridge's own flags are checked: those before `--`, or before the command (its first word on PATH)."""
    if "--" in args:
        head = args[:args.index("--")]
    elif command_follows:
        command = next((i for i, a in enumerate(args) if not a.startswith("-") and shutil.which(a)), len(args))
        flags = [i for i, a in enumerate(args[:command]) if a == "--gpu-telemetry"]
        if flags and not any(a.startswith("-") for a in args[flags[-1] + 1: command + 1]):
            raise click.UsageError(_NO_SEPARATOR, ctx)
        head = args[:command]
    else:
        head = args
    for position, arg in enumerate(head):
        following = head[position + 1] if position + 1 < len(head) else None
        if arg == "--gpu-telemetry" and (following is None or following.startswith("-")):
            raise click.UsageError(f"--gpu-telemetry is followed by {following or 'nothing'}, not an exporter: "
                                   "give one or more (host:9400, http://host:9400/metrics, k8s://ns/svc, a .csv), "
                                   "or leave the flag out for the defaults", ctx)


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
        click.option("--counter-mode", type=click.Choice(COUNTER_MODES),
                     help="How counters (energy, errors) become window totals: interpolated (default) to the exact "
                          "window, reset-aware; aiperf: AIPerf 0.13's last-minus-first."),
        click.option("--profile-export-prefix", help="Name the outputs as AIPerf does with this prefix."),
        click.option("--gpu-pods", multiple=True, metavar="NAMESPACE/GLOB",
                     help="Only the GPUs the exporter attributes to matching pods count in the report, each for "
                          "the part of the window it served them (repeatable; the record log keeps every GPU)."),
        click.option("--role", "roles", multiple=True, metavar="NAME=NAMESPACE/GLOB",
                     help="A serving role over the pods the exporter names on each GPU, in the report with its "
                          "energy and efficiency (repeatable; NAME prefill… or decode… is that kind, else "
                          "aggregated). Without it, llm-d's and Dynamo's role labels of --gpu-pod-selector's pods."),
        click.option("--live", is_flag=True, help="Show a refreshing per-GPU table while collecting."),
    ]
    options += [
        click.option("--otlp-endpoint", help="Forward every sample as OTLP here (else OTEL_EXPORTER_OTLP_"
                     "[METRICS_]ENDPOINT; off when neither is set)."),
        click.option("--otlp-protocol", type=click.Choice(["http/protobuf", "grpc"]),
                     help="OTLP transport (default http/protobuf, or OTEL_EXPORTER_OTLP_PROTOCOL)."),
        click.option("--otlp-headers", help="k=v,k2=v2 sent with every export (or OTEL_EXPORTER_OTLP_HEADERS)."),
        click.option("--otlp-timeout", type=float, help="Seconds per export request."),
        click.option("--otlp-compression", type=click.Choice(["gzip", "none"]),
                     help="Compress OTLP requests (default none, or OTEL_EXPORTER_OTLP_COMPRESSION)."),
        click.option("--otlp-insecure", is_flag=True, default=None, help="gRPC without TLS."),
        click.option("--otlp-units", type=click.Choice(["none", "ucum"]),
                     help="Set UCUM units on metrics (changes their Prometheus names; default none)."),
        click.option("--otlp-names", type=click.Choice(["exporter", "semconv"]),
                     help="exporter (default): the exporter's names; semconv: GPU metrics as OpenTelemetry's "
                          "hardware conventions (hw.power, hw.energy, hw.gpu.utilization, …)."),
        click.option("--otlp-export-interval", type=float, help="Seconds between exports (default 1)."),
        click.option("--otlp-max-queue-points", type=int,
                     help="A bound in points beside the queue's 16 MiB; the oldest pages are dropped past it."),
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
               "otlp_insecure", "otlp_units", "otlp_names", "otlp_export_interval", "otlp_max_queue_points",
               "relabel_config", "service_name", "resource_attribute", "attribute")


def _pairs(values: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {value!r}: expected KEY=VALUE")
        out[key.strip()] = val.strip()
    return out


def build_forwarder(otlp: dict[str, Any]) -> tuple[OtlpForwarder | None, RelabelConfig]:
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
                                units=otlp.get("otlp_units"), names=otlp.get("otlp_names"),
                                export_interval_s=otlp.get("otlp_export_interval"),
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
    from dataclasses import replace

    from bridge.config import resolve
    from bridge.pods import parse_pod_patterns
    from bridge.roles import parse_roles

    config_file = flags.pop("config_file", None)
    gpu_pods = tuple(flags.pop("gpu_pods", None) or ())
    parse_pod_patterns(gpu_pods)  # a bad NAMESPACE/GLOB is a ConfigError now, not after the benchmark
    roles = tuple(flags.pop("roles", None) or ())
    parse_roles(roles)  # as --gpu-pods: a bad value stops the start
    flags["gpu_telemetry"] = flags.get("gpu_telemetry") or None
    config = resolve(flags, config_file=config_file)  # a ConfigError is reported by bridge/cli.py (exit 2)
    config = replace(config, gpu_pods=gpu_pods) if gpu_pods else config
    return replace(config, roles=roles) if roles else config


def build_session_table(config: Any) -> Any:
    from bridge.fields import default_table, table_with_custom

    return table_with_custom(default_table(), config.telemetry.metrics_files)


# mallopt(3) parameters, as glibc's malloc/malloc.h defines them (ctypes does not export them).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def bound_malloc() -> None:
    """Give freed memory back, but not at every batch: glibc raises its mmap threshold after freeing a large
    block, so later large blocks (a hostile 12 MB page, its text and its lines) come from the heap and stay in
    RSS after they are freed; a fixed 1 MiB threshold keeps them mapped and returned, and two arenas keep the
    scrape, OTLP and HTTP threads from each holding their own (tests/test_memory.py holds the RSS of a hostile page
    to it). A fixed mmap threshold also pins the trim threshold at its 128 KiB default, so every OTLP batch (megabytes
    a second) was given back and faulted in again; a 4 MiB trim threshold and 1 MiB top pad keep that much per arena
    (the page-fault counts are in bench/NOTES.md). A no-op off glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
        libc.mallopt(M_ARENA_MAX, 2)
        libc.mallopt(M_TRIM_THRESHOLD, 4 << 20)
        libc.mallopt(M_TOP_PAD, 1 << 20)
    except (OSError, AttributeError):
        pass


def build_session(config: Any, otlp: dict[str, Any]) -> Any:
    from bridge.sidecar.session import Session

    bound_malloc()
    table = build_session_table(config)
    forwarder, relabel = build_forwarder(otlp)
    return Session(config, table, forwarder=forwarder, relabel_config=relabel)


@click.command(cls=TelemetryCommand)
@telemetry_options
@click.option("--gpu-pod-selector", "gpu_pod_selectors", multiple=True, metavar="NAMESPACE/SELECTOR",
              help="In a cluster: the pods a label selector picks, the exporters on their nodes, and only those "
                   "pods' GPUs in the report (resolved at start, then followed as they move; `kube profile` grants "
                   "the API access).")
@click.option("--health-port", type=int, help="Control API port (default 8086).")
def sidecar(live: bool, **flags: Any) -> None:
    """The container entry point: configure, serve the control API, collect until complete or a signal."""
    from bridge.sidecar.control import ControlServer
    from bridge.sidecar.control_token import sidecar_token

    selectors = flags.pop("gpu_pod_selectors", ())
    flags, otlp = split_flags(flags)
    config = resolve_config(flags)
    if not config.enabled:
        click.echo("GPU telemetry is disabled (--no-gpu-telemetry); nothing to do.")
        return
    selected = apis = None
    if selectors:
        from bridge.sidecar.pod_discovery import in_cluster_apis, with_selected_pods

        apis = in_cluster_apis()
        selected = with_selected_pods(config, selectors, *apis)
        config = selected.config
    session = build_session(config, otlp)
    made = missing_folders(Path(session.artifact_dir))
    session.prepare_artifacts()  # an unwritable folder stops start-up (exit 2) before anything is served
    if selected is not None:  # the selected pods and their labels: `report --gpu-pod-selector` reads them
        session.events.write_event(selected.event)
    done = threading.Event()  # a signal, or POST /complete
    look = threading.Event()  # done, or the OTLP receiver losing points: the main thread has a look

    def finish() -> None:
        done.set()
        look.set()

    # A native sidecar that exits is restarted by the kubelet (and would overwrite the finished run):
    # with exit_on_complete false it stays up after POST /complete until SIGTERM.
    try:
        token = sidecar_token(config)
        server = ControlServer(session, config.health_host, config.health_port, config.control_allow,
                               on_complete=finish if config.exit_on_complete else None,
                               metrics_text=session.exposition, token=token,
                               protect_reads=config.control_protect_reads)
        server.start()
    except ConfigError:  # the port is taken: nothing ran, so no empty artifact folder is left behind
        session.abandon()
        remove_if_empty(made)
        raise
    click.echo(f"dcgm-bridge sidecar: run {session.run_id}, control API on port {server.port} "
               f"(address {config.health_host})", err=True)

    def _signal(signum: int, _frame: object) -> None:
        finish()

    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)
    done_file = Path(config.done_file) if config.done_file else None
    if done_file is not None:  # an earlier run's marker is removed now, before /readyz can say this run is ready
        from bridge.sidecar.artifacts import done_marker_is_ours

        done_marker_is_ours(done_file, session.run_id, token)
    try:
        session.configure()  # no NVML, no GPU: the session lets the folder go (session.abandon)
    except BaseException:
        server.stop()
        remove_if_empty(made)
        raise
    session.start()
    pod_watch: Any = None
    if selected is not None and apis is not None:  # the pods are followed as they move (sidecar/pod_watch.py)
        from bridge.sidecar.pod_discovery import follow

        pod_watch = follow(session, selected, *apis)
    view = _live_view(session, live or config.telemetry.dashboard)
    watch = OtlpLossWatch()
    finished_by_file = False
    # A look at the done file once a second when there is one, and at the OTLP counters when the forwarder says
    # points were lost (or a loss held back by the watch's one-a-minute limit is due); else the main thread sleeps
    # until done (each look is a wake-up of an idle process).
    if session.forwarder is not None:
        session.forwarder.loss_signal = look
    while not done.is_set():
        waits = [w for w in (1.0 if done_file is not None else None, watch.due_in()) if w is not None]
        look.wait(min(waits) if waits else None)
        look.clear()
        if done.is_set():
            break
        if done_file is not None and done_marker_is_ours(done_file, session.run_id, token):
            finished_by_file = True
            break
        if session.forwarder is not None:
            watch.check(session.forwarder.stats())
    # Complete: a SIGTERM now (the kubelet's, as the pod ends) has nothing left to stop, and once the interpreter
    # is exiting its handler is gone, so the default action would end a finished run with -15.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if view is not None:
        view.stop()
    if pod_watch is not None:
        pod_watch.stop()
    outputs = session.complete(await_refresh=finished_by_file)  # not on SIGTERM: the kubelet's grace is short
    server.stop()
    click.echo(f"dcgm-bridge sidecar: run {session.run_id} complete; outputs in {session.artifact_dir}", err=True)
    _exit_on_problems(outputs)


def missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first (what making it would create)."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


_DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "": 1.0}


def parse_duration(value: str, flag: str) -> float:
    """`10s`, `500ms`, `1m` or plain seconds, from 0 to an hour; a ConfigError naming the flag otherwise."""
    import re

    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m)?\s*", value)
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or ""] if match else None
    if seconds is None or not 0 <= seconds <= 3600:
        raise ConfigError(f"{flag} {value!r}: expected a duration up to an hour, e.g. {flag} 10s (or 500ms, 1m)")
    return seconds


def remove_if_empty(folders: list[Path]) -> None:
    """Remove the folders a failed start made (deepest first), as long as they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _live_view(session: Any, wanted: bool) -> Any:
    if not wanted:
        return None
    from bridge.sidecar.live import LiveView

    view = LiveView(session)
    view.start()
    return view


@click.command(cls=TelemetryCommand, context_settings={"allow_interspersed_args": False})
@telemetry_options
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the self-contained HTML report here.")
@click.option("--stop-timeout", type=click.FloatRange(1, 3600), default=60.0, show_default=True,
              help="Seconds the benchmark gets to finish its files after a forwarded SIGINT/SIGTERM.")
@click.option("--require-valid", is_flag=True,
              help="Exit 1 when the benchmark succeeded but the measurement verdict is NOT valid.")
@click.option("--keep-children", is_flag=True,
              help="Leave running what the benchmark started and left behind (stopped at the end by default).")
@click.option("--repeat", type=click.IntRange(1, 1000), default=1, show_default=True,
              help="Run the benchmark N times, each run's telemetry in its own run_NNNN/ below the artifact folder "
                   "(compare them with `dcgm-bridge compare`).")
@click.option("--idle-window", "idle_window", metavar="DURATION",
              help="Keep quiet windows this long (e.g. 10s, 500ms, 1m) before and after the benchmark: each GPU's "
                   "idle power, the energy split into idle and active, a baseline that moved or started under load "
                   "flagged.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def profile(command: tuple[str, ...], live: bool, html_path: Path | None, stop_timeout: float,
            require_valid: bool = False, keep_children: bool = False, repeat: int = 1,
            idle_window: str | None = None, **flags: Any) -> None:
    """Run a benchmark command with GPU telemetry: dcgm-bridge profile [OPTIONS] -- CMD [ARGS]…

    CMD gets DCGM_BRIDGE_CONTROL_URL and DCGM_BRIDGE_CONTROL_TOKEN to post phase marks. For `aiperf
    profile …` the report is merged into AIPerf's own profile_export_aiperf.json/.csv and its
    --gpu-telemetry items are collected by the bridge. Exit code: CMD's when non-zero, 128+N after
    signal N, 1 when the report failed.
    """
    from bridge.sidecar.profile import run_profile

    idle_s = parse_duration(idle_window, "--idle-window") if idle_window is not None else 0.0
    if command and shutil.which(command[0]) is None:  # before anything starts: nothing to collect around
        raise ConfigError(f"profile: cannot run {command[0]!r}: no such program (not on PATH, or not executable); "
                          "check the command after --")
    if html_path is not None:
        from bridge.report.cli import check_writable

        check_writable(html_path, "--html")
    flags, otlp = split_flags(flags)
    if repeat > 1:
        if html_path is not None:
            raise ConfigError("profile --repeat: --html writes one run's page; compare the repeats instead: "
                              "`dcgm-bridge compare FOLDER OTHER --html FILE`")
        _profile_repeats(command, repeat, flags, otlp, live=live, stop_timeout=stop_timeout,
                         require_valid=require_valid, keep_children=keep_children, idle_window_s=idle_s)
        return
    argv: Any = list(command)
    env = dict(os.environ)
    from bridge.sidecar.aiperf import is_aiperf, parse_command

    if is_aiperf(argv):
        argv = parse_command(argv)
        flags = _take_over_aiperf_telemetry(flags, argv, env)
    config = resolve_config(flags)
    session = build_session(config, otlp) if config.enabled else None
    if html_path is not None and session is not None:
        check_not_the_runs(html_path, "--html", session)
    from bridge.errors import BridgeError

    made = missing_folders(Path(config.artifact_dir)) if session is not None else []
    try:
        run = run_profile(config, session, argv, live=live, stop_timeout=stop_timeout, env=env,
                          keep_children=keep_children, idle_window_s=idle_s)
    except BridgeError:  # its own message and exit code (bridge/cli.py); a failed start leaves no folder
        remove_if_empty(made)
        raise
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot run {' '.join(command)}: {exc}") from None
    _summary(run, session, html_path)
    if run.exit_code == 0 and require_valid and run.outputs is not None and run.outputs.report is not None:
        from bridge.report.cli import exit_on_verdict

        exit_on_verdict(run.outputs.report.telemetry_data, True, echo=False)  # (the console printed the line)
    sys.exit(run.exit_code)


def _profile_repeats(command: tuple[str, ...], repeats: int, flags: dict[str, Any], otlp: dict[str, Any], *,
                     live: bool, stop_timeout: float, require_valid: bool, keep_children: bool,
                     idle_window_s: float = 0.0) -> None:
    """`profile --repeat N` (bridge/sidecar/repeat.py): the artifact folder locked once, each repeat a run of its own
    in run_NNNN/; the first failing repeat stops the series with its exit code."""
    from dataclasses import replace

    from bridge.errors import BridgeError
    from bridge.sidecar.aiperf import is_aiperf, parse_command
    from bridge.sidecar.folder_lock import FolderLock
    from bridge.sidecar.profile import run_profile
    from bridge.sidecar.repeat import REPEAT_DIR_ENV, REPEAT_ENV, repeat_command, repeat_folder

    env = dict(os.environ)
    aiperf = is_aiperf(list(command))
    if aiperf:
        flags = _take_over_aiperf_telemetry(flags, parse_command(list(command)), env)
    config = resolve_config(flags)
    if not config.enabled:
        raise ConfigError("profile --repeat: the telemetry is off, so there is nothing to keep apart per repeat; "
                          "drop --repeat or the option that turns the telemetry off")
    base = Path(config.artifact_dir)
    made = missing_folders(base)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--artifact-dir {base}: cannot make that folder ({exc.strerror or exc}); give one you "
                          "can write") from None
    run_id = config.effective_run_id()
    lock = FolderLock(base, run_id)
    try:
        lock.acquire()
    except BridgeError:
        remove_if_empty(made)
        raise
    not_valid: list[int] = []
    try:
        for k in range(1, repeats + 1):
            folder = repeat_folder(base, k)
            repeat_config = replace(config, artifact_dir=str(folder), run_id=f"{run_id}-{k:04d}")
            session = build_session(repeat_config, otlp)
            argv = repeat_command(command, k, folder)
            click.echo(f"dcgm-bridge: repeat {k} of {repeats} in {folder}", err=True)
            try:
                run = run_profile(repeat_config, session, parse_command(argv) if aiperf else argv, live=live,
                                  stop_timeout=stop_timeout, keep_children=keep_children, idle_window_s=idle_window_s,
                                  env={**env, REPEAT_ENV: str(k), REPEAT_DIR_ENV: str(folder)})
            except (OSError, ValueError) as exc:
                raise click.ClickException(f"cannot run {' '.join(command)}: {exc}") from None
            _summary(run, session, None)
            report = run.outputs.report if run.outputs is not None else None
            if report is not None and not report.telemetry_data.get("measurement", {}).get("valid", False):
                not_valid.append(k)
            if run.exit_code:
                click.echo(f"dcgm-bridge: repeat {k} of {repeats} failed: the series stops there", err=True)
                sys.exit(run.exit_code)
    finally:
        lock.release()
    _repeats_summary(base, repeats)
    if require_valid and not_valid:
        click.echo(f"dcgm-bridge: the measurement of repeat {', '.join(map(str, not_valid))} is NOT valid", err=True)
        sys.exit(1)


def _repeats_summary(base: Path, repeats: int) -> None:
    """The repeats' intervals as `compare --until-width 0.10` shows them, and how to compare them."""
    from bridge.report.compare import CompareError, load_side
    from bridge.report.sweep import width_lines

    try:
        side = load_side(base, include_invalid=True)
    except CompareError as exc:
        click.echo(f"dcgm-bridge: the repeats cannot be read back: {exc}", err=True)
        return
    click.echo(f"\ndcgm-bridge: {repeats} repeats in {base}")
    for line in width_lines(side, 0.10):
        click.echo(line)
    click.echo(f"compare them with another configuration: dcgm-bridge compare {base} OTHER_FOLDER")


def check_not_the_runs(path: Path, flag: str, session: Any) -> None:
    """An output that is one of the run's own files (the record log, the events file, the folder's lock, a report
    spool, the report the run writes) is refused at start (exit 2): `--html out/gpu_telemetry_export.jsonl`, a
    tab-completion slip, would replace the run's record with a page."""
    from bridge.files import own_file_problem
    from bridge.record_log import output_names
    from bridge.sidecar.artifacts import SPOOL_PREFIX

    folder = Path(session.artifact_dir)
    json_name, csv_name = output_names(session.config.profile_export_prefix)
    own = {"the run's record log": session.records.path, "the run's events file": session.events.path,
           "the folder's lock file": session.folder_lock.path, "the run's report": folder / json_name,
           "the run's CSV": folder / csv_name, "the run's phase files": folder / "phases"}
    problem = own_file_problem(flag, path, own)
    resolved = Path(os.path.realpath(path))
    if problem is None and any(p.name.startswith(SPOOL_PREFIX) for p in (resolved, *resolved.parents)):
        problem = f"{flag} {path} is in a run's report spool: give another path for {flag}"
    if problem is not None:
        raise ConfigError(problem)


def _take_over_aiperf_telemetry(flags: dict[str, Any], aiperf: Any, env: dict[str, str]) -> dict[str, Any]:
    """AIPerf's --gpu-telemetry items and AIPERF_GPU_* variables become the bridge's (one info line); AIPerf
    runs with --no-gpu-telemetry and without those variables."""
    taken = [f"--gpu-telemetry {' '.join(aiperf.telemetry_items)}"] if aiperf.telemetry_items else []
    if aiperf.telemetry_items:
        if flags.get("no_gpu_telemetry"):
            raise ConfigError("--no-gpu-telemetry given to dcgm-bridge and --gpu-telemetry to AIPerf: give one")
        flags["gpu_telemetry"] = tuple(flags.get("gpu_telemetry") or ()) + tuple(aiperf.telemetry_items)
    variables = sorted(k for k in env if k.startswith("AIPERF_GPU_"))
    for name in variables:
        env.pop(name)
    taken += variables
    if taken or aiperf.had_no_gpu_telemetry:
        click.echo(f"dcgm-bridge collects the GPU telemetry ({', '.join(taken) or 'its defaults'}); "
                   "AIPerf runs with --no-gpu-telemetry", err=True)
    return flags


def _summary(run: Any, session: Any, html_path: Path | None) -> None:
    """The end of the run: the notes, the console tables, the files written (+ HTML), and why the exit code."""
    from rich.markup import escape

    from bridge.report.console import make_console

    console = make_console()
    for note in run.notes:
        click.echo(f"dcgm-bridge: {note}", err=True)
    outputs = run.outputs
    if outputs is None:
        return
    if outputs.report is not None:
        from bridge.report import render_console

        render_console(outputs.report, console)
        if html_path is not None:
            from bridge.files import LinkRefused
            from bridge.report.html import write_html

            try:
                outputs.files.append(write_html(outputs.report, session.records.path, html_path,
                                                title=f"dcgm-bridge profile · {session.run_id}",
                                                run_id=session.run_id))
            except OSError as exc:  # (a link planted meanwhile: its own sentence, bridge/files.py)
                outputs.problems.append(exc.strerror if isinstance(exc, LinkRefused) else
                                        f"cannot write {html_path}: {exc.strerror or exc}")
    console.print(f"\n[bold]dcgm-bridge[/]: run {escape(session.run_id)}, {session.records_written} records. Files:")
    for path in outputs.files:
        console.print(f"  {escape(str(path))}", highlight=False, soft_wrap=True)  # a path is never cut
    if outputs.error:
        click.echo(f"dcgm-bridge: the telemetry report is incomplete: {outputs.error}", err=True)
    if run.exit_code and run.returncode == 0:
        why = "cancelled" if run.cancelled else "report failed"
        click.echo(f"dcgm-bridge: exit {run.exit_code} ({why})", err=True)
    elif run.exit_code:  # the benchmark's code wins (README "Exit codes"): say whose it is
        how = f"stopped by signal {-run.returncode}" if run.returncode < 0 else f"it exited {run.returncode}"
        click.echo(f"dcgm-bridge: exit {run.exit_code}, the benchmark's ({how})", err=True)


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
@click.option("--gpus", type=click.IntRange(1, 64), default=8, show_default=True,
              help="GPUs of the simulated exporter.")
@click.option("--mig", type=click.IntRange(0, 7), default=0, help="MIG instances per simulated GPU.")
@click.option("--refresh-ms", type=click.IntRange(min=0), default=0, show_default=True,
              help="The simulated exporter's DCGM refresh (-c); 0: fresh values. Try 30000, dcgm-exporter's default, "
                   "to see the report flag a window with too few refreshes.")
def demo(out: Path, duration: float, gpus: int, mig: int, refresh_ms: int) -> None:
    """Run a warmup + profiling collection against the embedded simulated exporter and report it."""
    from bridge.sidecar.demo import run_demo

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot make that folder ({exc.strerror or exc}); give one you can write") \
            from None
    _exit_on_problems(run_demo(out, duration, gpus=gpus, mig=mig, refresh_ms=refresh_ms))
