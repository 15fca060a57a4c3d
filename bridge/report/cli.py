"""`dcgm-bridge report`: rebuild a report after the fact from any record log (ours or AIPerf's own).

Imports numpy, rich and the builder only when the command runs, so `dcgm-bridge --help` stays cheap.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bridge.errors import ReportInputError
from bridge.pods import parse_pod_patterns
from bridge.redact import redact_url
from bridge.roles import parse_roles
from bridge.samples import COUNTER_MODES, DEFAULT_COUNTER_MODE

if TYPE_CHECKING:
    from datetime import tzinfo

    from bridge.fields import FieldTable
    from bridge.report.build import Report
    from bridge.report.events import RunEvents
    from bridge.report.runs import LogRead
    from bridge.samples import GpuRecord

GRACE_ENV = "AIPERF_GPU_FINAL_SCRAPE_GRACE_NS"
PROMETHEUS_HEADERS_ENV = "DCGM_BRIDGE_PROMETHEUS_HEADERS"
PROMETHEUS_TOKEN_ENV = "DCGM_BRIDGE_PROMETHEUS_BEARER_TOKEN_FILE"
PROMETHEUS_USER_ENV = "DCGM_BRIDGE_PROMETHEUS_USER"
PROMETHEUS_PASSWORD_ENV = "DCGM_BRIDGE_PROMETHEUS_PASSWORD_FILE"


@click.command()
@click.option("--jsonl", "jsonl", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Record log: gpu_telemetry_export.jsonl (ours or AIPerf's), plain or .gz.")
@click.option("--prometheus", "prometheus_url", metavar="URL",
              help="Instead of --jsonl: a PromQL store (Prometheus, VictoriaMetrics, Mimir) holding the run.")
@click.option("--run-id", help="With --prometheus: the run's run_id label. With --jsonl: the run to report when the "
                                "record log holds several (default: the newest).")
@click.option("--prometheus-headers", metavar="K=V,K2=V2", envvar=PROMETHEUS_HEADERS_ENV,
              help=f"With --prometheus: headers sent with every query, e.g. X-Scope-OrgID=tenant (Mimir) "
                   f"(env {PROMETHEUS_HEADERS_ENV}). Values are never printed.")
@click.option("--prometheus-headers-file", type=click.Path(dir_okay=False, path_type=Path),
              envvar=f"{PROMETHEUS_HEADERS_ENV}_FILE",
              help=f"With --prometheus: a file of K=V headers, one or more a line, for secret ones "
                   f"(env {PROMETHEUS_HEADERS_ENV}_FILE).")
@click.option("--prometheus-bearer-token-file", type=click.Path(dir_okay=False, path_type=Path),
              envvar=PROMETHEUS_TOKEN_ENV,
              help=f"With --prometheus: send `Authorization: Bearer <the file's token>` (env {PROMETHEUS_TOKEN_ENV}).")
@click.option("--prometheus-user", envvar=PROMETHEUS_USER_ENV,
              help=f"With --prometheus: basic auth user, e.g. Grafana Cloud's instance id (env {PROMETHEUS_USER_ENV}; "
                   "the password from --prometheus-password-file).")
@click.option("--prometheus-password-file", type=click.Path(dir_okay=False, path_type=Path),
              envvar=PROMETHEUS_PASSWORD_ENV,
              help=f"With --prometheus-user: the file holding the password or token (env {PROMETHEUS_PASSWORD_ENV}).")
@click.option("--strip-suffix", type=click.Choice(["_total"]),
              help="With --prometheus: counters arrived with Prometheus' _total suffix (OTLP into Prometheus).")
@click.option("--start-ns", type=int, help="Profiling start, wall-clock ns (with --end-ns).")
@click.option("--end-ns", type=int, help="Requests end, wall-clock ns; the grace is added on top.")
@click.option("--phase-manifest", type=click.Path(exists=True, path_type=Path),
              help="AIPerf's phase_manifest.json, or a directory to search below for it.")
@click.option("--events", "events_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="gpu_telemetry_events.jsonl: phase marks, requests end, endpoints, errors.")
@click.option("--counter-mode", type=click.Choice(COUNTER_MODES),
              help="interpolated (default, or the live run's mode from --events): exact window, reset-aware; "
                   "aiperf: AIPerf 0.13's rule.")
@click.option("--grace-ns", type=click.IntRange(0, 60_000_000_000), envvar=GRACE_ENV,
              help=f"Trailing grace after the requests end (env {GRACE_ENV}; default: the run's, recorded in "
                   "--events, else 666000000).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="profile_export_aiperf.json to merge into (created when missing; default beside --jsonl).")
@click.option("--profile-export-prefix", help="Name the outputs as AIPerf does with this prefix.")
@click.option("--csv", "write_csv", is_flag=True, help="Also write the CSV section (profile_export_aiperf.csv).")
@click.option("--console", "show_console", is_flag=True, help="Print the per-GPU tables.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a self-contained HTML page: summary, per-GPU charts with the phases, energy per phase.")
@click.option("--metrics-csv", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="Custom-metrics CSV (dcgm-exporter format) that names extra fields in the log.")
@click.option("--gpu-pods", multiple=True, metavar="NAMESPACE/GLOB",
              help="Only the GPUs the exporter attributes to matching pods, each for the part of the window it "
                   "served them (repeatable).")
@click.option("--gpu-pod-selector", "gpu_pod_selectors", multiple=True, metavar="NAMESPACE/SELECTOR",
              help="Only the GPUs of the pods a label selector picks among those the run recorded in --events "
                   "(a sidecar's --gpu-pod-selector records them; repeatable).")
@click.option("--requests", "requests_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="AIPerf's per-request records (profile_export.jsonl, --export-level records): each request's "
                   "energy, written to gpu_telemetry_requests.jsonl beside the report.")
@click.option("--role", "roles", multiple=True, metavar="NAME=NAMESPACE/GLOB",
              help="A serving role over the pods dcgm-exporter names on each GPU (repeatable; the first match wins): "
                   "a NAME starting with prefill or decode is that kind, any other aggregated. Without it, "
                   "llm-d's and Dynamo's role labels where --events recorded the pods' labels.")
@click.option("--require-valid", is_flag=True,
              help="Exit 1 when the measurement verdict is NOT valid (the report is still written).")
def report(jsonl: Path | None, prometheus_url: str | None, run_id: str | None, strip_suffix: str | None,
           start_ns: int | None, end_ns: int | None, phase_manifest: Path | None,
           events_path: Path | None, counter_mode: str | None, grace_ns: int | None, output: Path | None,
           profile_export_prefix: str | None, write_csv: bool, show_console: bool,
           metrics_csv: tuple[str, ...], html_path: Path | None, gpu_pods: tuple[str, ...] = (),
           gpu_pod_selectors: tuple[str, ...] = (), require_valid: bool = False,
           prometheus_headers: str | None = None, prometheus_headers_file: Path | None = None,
           prometheus_bearer_token_file: Path | None = None, prometheus_user: str | None = None,
           prometheus_password_file: Path | None = None, requests_path: Path | None = None,
           roles: tuple[str, ...] = ()) -> None:
    """Rebuild telemetry_data (+ energy, CSV, phase files) from a record log and a window.

    The window is --start-ns/--end-ns, else the profiling phase of --phase-manifest, else the marks in
    --events; --events also supplies endpoints, errors and endpoint states when combined with the others.
    """
    from bridge.fields import default_table, table_with_custom
    from bridge.report.console import render_console
    from bridge.report.events import RunEvents, load_events
    from bridge.report.window import WindowError
    from bridge.report.write import ReportWriteError, output_names, write_report

    pod_patterns = parse_pod_patterns(gpu_pods)
    role_rules = parse_roles(roles)
    selecting = bool(pod_patterns or gpu_pod_selectors)
    if selecting and prometheus_url is not None:
        raise ReportInputError("--gpu-pods needs --jsonl: records read back from a PromQL store carry no pod labels")
    if (jsonl is None) == (prometheus_url is None):
        raise click.UsageError("give one record source: --jsonl FILE or --prometheus URL --run-id ID")
    if prometheus_url is not None and not run_id:
        raise click.UsageError("--prometheus needs --run-id")
    store_headers = store_headers_of(prometheus_headers, prometheus_headers_file, prometheus_bearer_token_file,
                                     prometheus_user, prometheus_password_file) if prometheus_url else {}
    check_window_flags(start_ns, end_ns)
    if start_ns is None and phase_manifest is None and events_path is None:
        raise click.UsageError("give the window: --start-ns A --end-ns B, --phase-manifest FILE or --events FILE")
    if jsonl is not None:
        check_record_log(jsonl)
    json_path = output or (jsonl.parent if jsonl else Path(".")) / output_names(profile_export_prefix)[0]
    csv_path = json_path.parent / output_names(profile_export_prefix)[1] if write_csv else None
    check_own_inputs(jsonl, events_path, phase_manifest, json_path, html_path, csv_path)
    from bridge.report.requests import REQUESTS_FILE

    requests_out = json_path.parent / REQUESTS_FILE if requests_path is not None else None
    if requests_out is not None and requests_path is not None and requests_path.resolve() == requests_out.resolve():
        raise ReportInputError(f"--requests {requests_path} is the per-request file the report writes: give AIPerf's "
                               "profile_export.jsonl")
    for flag, path in (("--output", json_path), ("--csv", csv_path), ("--html", html_path),
                       ("--requests (its output)", requests_out)):
        if path is not None:
            check_writable(path, flag)
    table = table_with_custom(default_table(), list(metrics_csv))
    run = load_events(events_path, strict=True) if events_path is not None else RunEvents()
    if gpu_pod_selectors:
        pod_patterns = with_selected_pods(pod_patterns, gpu_pod_selectors, run, events_path)
    try:
        built = rebuild(jsonl, events_path, run=run, start_ns=start_ns, end_ns=end_ns, grace_ns=grace_ns,
                        phase_manifest=phase_manifest, counter_mode=counter_mode, run_id=run_id, table=table,
                        prometheus=(prometheus_url, strip_suffix) if prometheus_url is not None else None,
                        pods=pod_patterns if selecting else None, store_headers=store_headers,
                        requests=requests_path, roles=role_rules)
        counter_mode = built.counter_mode
    except WindowError as exc:  # a manifest with no usable phase, …: the input's fault, exit 2
        raise click.UsageError(str(exc)) from None
    if built.read_errors:
        click.echo(f"warning: {len(built.read_errors)} unreadable lines in {jsonl} were skipped "
                   f"(first: {built.read_errors[0]})", err=True)
    if run.skipped:
        click.echo(f"warning: {run.skipped} unreadable or unknown events were skipped", err=True)
    if not selecting or built.telemetry_data["pods"]["gpus"]:
        check_window_has_records(built, jsonl or redact_url(prometheus_url or ""))
    try:
        written = write_report(built, json_path.parent, profile_export_prefix, json_path=json_path,
                               write_csv=write_csv)
    except ReportWriteError as exc:
        raise click.ClickException(str(exc)) from None
    if html_path is not None:
        from bridge.report.html import write_html

        shown_id = run_id or (run.run_ids[-1] if run.run_ids else None)
        written.append(write_html(built, None, html_path, run_id=shown_id))
    if show_console:
        render_console(built)
    from bridge.report.telemetry_data import gpus_text

    gpus = gpus_text((s.endpoint, s.meta) for s in built.series)
    click.echo(f"{built.records} records, {gpus}, counter mode {counter_mode}")
    for path in written:
        click.echo(f"wrote {path}")
    exit_on_verdict(built.telemetry_data, require_valid, echo=not show_console)


def rebuild(jsonl: Path | None, events_path: Path | None, *, run: RunEvents | None = None, start_ns: int | None = None,
            end_ns: int | None = None, grace_ns: int | None = None, phase_manifest: Path | None = None,
            counter_mode: str | None = None, run_id: str | None = None, table: FieldTable | None = None,
            prometheus: tuple[str, str | None] | None = None, pods: tuple[Any, ...] | None = None,
            store_headers: dict[str, str] | None = None, tz: tzinfo | None = None,
            requests: Path | None = None, roles: tuple[Any, ...] = ()) -> Report:
    """The one way a report is built from a finished run's files, for `report` and `validate` alike: the window is
    --start-ns/--end-ns (plus the grace), else the profiling phase of --phase-manifest, else the events file's marks;
    the grace and the counter mode are the flags', else the run's (its `configured` event), else the defaults; the
    run is --run-id's, else the log's newest. `prometheus`: (URL, strip suffix) instead of the record log; `pods`:
    the --gpu-pods patterns (with those --gpu-pod-selector picked) when selecting; `tz`, the summary's times' zone
    (default: this machine's, as AIPerf writes them); `requests`, AIPerf's per-request records (profile_export.jsonl)
    whose energy is attributed; `roles`, the --role rules (bridge/roles.py)."""
    from bridge.report.build import build_report, pod_labels_of
    from bridge.report.events import RunEvents, load_events
    from bridge.report.runs import read_log
    from bridge.report.window import DEFAULT_GRACE_NS, explicit_window, load_manifest

    if run is None:
        run = load_events(events_path, strict=True) if events_path is not None else RunEvents()
    if start_ns is None:
        check_one_run(run, events_path)
    mode = counter_mode or run.counter_mode or DEFAULT_COUNTER_MODE
    grace = grace_ns if grace_ns is not None else run.grace_ns if run.grace_ns is not None else DEFAULT_GRACE_NS
    kwargs: dict[str, Any] = {
        "marks": run.marks, "requests_end_ns": run.requests_end_ns,
        "endpoints_configured": run.endpoints_configured, "endpoints_successful": run.endpoints_successful,
        "errors": run.errors, "endpoint_states": run.states, "pod_labels": pod_labels_of(run),
        "role_rules": roles, "idle_windows": run.idle,
    }
    if start_ns is not None and end_ns is not None:
        kwargs["window"] = explicit_window(start_ns, end_ns, grace)
        check_times(start_ns, end_ns)
    elif phase_manifest is not None:
        kwargs["phases"] = load_manifest(phase_manifest)
    log = read_log(jsonl) if jsonl is not None else None  # the one pass over the log (its hash too)
    source: Any = None
    if log is not None:
        source, kwargs["record_log_run"] = one_run(log, run_id)
    if prometheus is not None:
        source = _store_records(prometheus[0], run_id or "", kwargs, grace, table, prometheus[1], store_headers)
    if requests is not None:
        kwargs["requests"] = read_requests_file(requests)
    built = build_report(source, table=table, counter_mode=mode, grace_ns=grace,  # type: ignore[arg-type]
                         record_log=log, events_file=events_path, tz=tz, **kwargs)
    if pods is not None:  # (records of one run of several, else the log's pods read from its file)
        pods_source: Any = source if isinstance(source, list) else jsonl
        built = _pods_only(built, pods_source, pods, run.shared, table=table, counter_mode=mode, grace_ns=grace,
                           record_log=log, events_file=events_path, tz=tz, **kwargs)
    return built


def read_requests_file(path: Path) -> Any:
    """AIPerf's per-request records, read once (their SHA-256 too); a file that is none: exit 2 naming it."""
    from bridge.report.requests import RequestsInputError, read_requests

    try:
        read = read_requests(path)
    except RequestsInputError as exc:
        raise ReportInputError(f"--requests {exc}") from None
    if read.errors:
        click.echo(f"warning: {len(read.errors)} unreadable lines in {path} were skipped (first: {read.errors[0]})",
                   err=True)
    return read


def exit_on_verdict(telemetry_data: dict[str, Any], require_valid: bool, *, echo: bool = True) -> None:
    """The verdict's line (unless the console printed it); with `--require-valid`, exit 1 when NOT valid. A NOT-valid
    verdict alone never changes the exit code (issue 27)."""
    from bridge.report.verdict import verdict_line

    line = verdict_line(telemetry_data)
    if echo:
        click.echo(line)
    if require_valid and line != "measurement valid":
        click.echo(f"dcgm-bridge: --require-valid: {line}", err=True)
        raise SystemExit(1)


def one_run(log: LogRead, run_id: str | None) -> tuple[LogRead | list[GpuRecord], str | None]:
    """The record log as read, or, when it holds several runs (or --run-id names one), that run's records only
    (read again: the first pass told which runs there are): the newest unless --run-id says which. Says so in one
    line."""
    from bridge.report.runs import records_of_run

    jsonl, ids = log.path, log.run_ids
    if run_id is None and len(ids) <= 1:
        return log, None
    if run_id is not None and run_id not in ids:
        raise ReportInputError(f"--run-id {run_id}: not in {jsonl} (its runs: {', '.join(ids) or 'none'})")
    chosen = run_id or ids[-1]
    if len(ids) > 1:
        why = "--run-id" if run_id else "the newest; --run-id picks another"
        click.echo(f"{jsonl} holds {len(ids)} runs ({', '.join(ids)}): reporting run {chosen} ({why})", err=True)
    errors: list[str] = []
    return list(records_of_run(jsonl, chosen, errors)), chosen


def with_selected_pods(patterns: Any, values: tuple[str, ...], run: Any, events_path: Path | None) -> Any:
    """`--gpu-pod-selector`: `patterns` plus the pods the run recorded that the selectors pick (report/pods.py)."""
    from bridge.discovery import SELECTOR_FLAG, parse_pod_selector, pod_selector_problems
    from bridge.report.pods import patterns_of_selectors

    problems = [line for value in values for line in pod_selector_problems(value)]
    if problems:
        raise ReportInputError(problems[0])
    if not run.pods:
        where = f"{events_path} records" if events_path is not None else "without --events there are"
        raise ReportInputError(f"{SELECTOR_FLAG}: {where} no pods (a sidecar run with {SELECTOR_FLAG} records "
                               "them); give --events FILE of such a run, or --gpu-pods NAMESPACE/GLOB")
    picked = patterns_of_selectors(run.pods, [parse_pod_selector(value) for value in values])
    recorded = sorted({f"{p.namespace}/{p.name}" for event in run.pods for p in event.pods})
    if not picked:
        click.echo(f"warning: {SELECTOR_FLAG} {', '.join(values)} picks none of the pods the run recorded "
                   f"({', '.join(recorded)})", err=True)
    return tuple(dict.fromkeys([*patterns, *picked]))


def _pods_only(built: Any, source: Path | list[Any], patterns: Any, shared: Any, **kwargs: Any) -> Any:
    """`--gpu-pods`: the report of the GPUs that served matching pods (`shared`: the events file's GPUs whose
    series named several pods at once); the selection's lines on stderr."""
    from bridge.report.pods import report_for_pods, timelines_of_log, timelines_of_records, with_shared

    # (a log of several runs: `source` is the chosen run's records)
    timelines = timelines_of_records(source) if isinstance(source, list) else timelines_of_log(source)
    built, selection = report_for_pods(built, with_shared(timelines, shared), patterns, **kwargs)
    if selection.warning:
        click.echo(f"warning: {selection.warning}", err=True)
    click.echo(f"pods: {selection.summary_line()}", err=True)
    for phase, pods in selection.pods_by_phase.items():
        covered = "; ".join(f"{pod} ({', '.join(gpus)})" for pod, gpus in pods.items()) or "none"
        click.echo(f"pods: {phase}: {covered}", err=True)
    for gpu in selection.shared:
        click.echo(f"pods: {gpu.series.endpoint} {gpu.series.meta.gpu_uuid} not counted ({gpu.reason}, "
                   f"{gpu.sharing}: {', '.join(gpu.pods)})", err=True)
    return built


# -- inputs that would give an empty report (nothing is written then: an existing report stays) --------
_NS_PER_S = 1_000_000_000
_PLAUSIBLE_NS = 10**17  # 1973-03-03 in ns; a time in s, ms or µs is far below it


def check_times(*times: int | None) -> None:
    for flag, value in zip(("--start-ns", "--end-ns"), times, strict=True):
        if value is not None and 0 < value < _PLAUSIBLE_NS:
            unit = "seconds" if value < 10**11 else "milliseconds" if value < 10**14 else "microseconds"
            raise ReportInputError(f"{flag} {value} looks like {unit}, not wall-clock nanoseconds "
                                   f"(now is about {time.time_ns()}); e.g. date +%s%N")


def check_window_flags(start_ns: int | None, end_ns: int | None) -> None:
    if (start_ns is None) != (end_ns is None):
        raise click.UsageError("--start-ns and --end-ns go together")
    if start_ns is not None and end_ns is not None and end_ns < start_ns:
        raise click.UsageError(f"--end-ns {end_ns} is before --start-ns {start_ns}: the window ends before it starts")


def check_writable(path: Path, flag: str) -> None:
    """A promised output that cannot be written is said before any work (exit 2): a folder, a link (never written
    through), a file that cannot be opened for writing, or a folder where the new file cannot be made (the writer
    makes missing folders). Tried as bridge/files.py writes, not judged from the modes, and nothing is changed."""
    from bridge.files import write_problem

    problem = write_problem(path)
    if problem is not None:
        raise ReportInputError(f"{flag} {problem}")


def check_own_inputs(jsonl: Path | None, events: Path | None, manifest: Path | None, json_path: Path,
                     html_path: Path | None, csv_path: Path | None) -> None:
    """No output is written over an input (or another output): `--html` given the record log by a slip of tab
    completion would replace the run's only record with a page."""
    from bridge.files import own_file_problem

    inputs = {"the record log": jsonl, "the events file": events, "the phase manifest": manifest}
    outputs = {"--html": html_path, "--output": json_path, "--csv": csv_path}
    for flag, path in outputs.items():
        if path is None:
            continue
        others = {**inputs, **{f"the {other} file": p for other, p in outputs.items() if other != flag}}
        problem = own_file_problem(flag, path, others)
        if problem is not None:
            raise ReportInputError(problem)


def check_one_run(run: Any, events_path: Path | None) -> None:
    """An events file two runs appended to (before runs rotated their files) would give a window from the first
    run's start to the second's end."""
    if len(run.run_ids) > 1:
        raise ReportInputError(f"--events {events_path} holds {len(run.run_ids)} runs ({', '.join(run.run_ids)}): "
                               "a window would span them; give one run's window with --start-ns/--end-ns")


def check_record_log(path: Path) -> None:
    """An empty file, or the events file given as the record log: say so instead of an empty report."""
    from bridge.record_log import EVENTS_FILE, read_dict_batches

    if path.stat().st_size == 0:
        raise ReportInputError(f"--jsonl {path} is empty: no records to report")
    first = next((d for batch in read_dict_batches(path, []) for d in batch[:1]), None)
    if first is None:
        raise ReportInputError(f"--jsonl {path} is not a record log: no line of it is a JSON object "
                               "(expected gpu_telemetry_export.jsonl)")
    if "type" in first and "gpu_uuid" not in first:
        raise ReportInputError(f"--jsonl {path} is an events file ({EVENTS_FILE}); give it as --events and the "
                               "record log (gpu_telemetry_export.jsonl) as --jsonl")


def check_window_has_records(built: Any, source: Path | str) -> None:
    if built.records == 0:
        first = f" (first problem: {built.read_errors[0]})" if built.read_errors else ""
        raise ReportInputError(f"no record could be read from {source}{first}; nothing was written")
    gpus = [gpu for endpoint in built.telemetry_data["endpoints"].values() for gpu in endpoint["gpus"].values()]
    if not any(gpu.get("metrics") for gpu in gpus):
        window = built.window
        raise ReportInputError(f"none of the {built.records} records of {source} falls in the window "
                               f"{_when(window.start_ns)} – {_when(window.end_ns)}; check --start-ns/--end-ns, "
                               "--phase-manifest or --events (nothing was written)")


def _when(ns: int | None) -> str:
    if ns is None:
        return "open"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / _NS_PER_S)) + " UTC"


def store_headers_of(text: str | None, file: Path | None, token_file: Path | None, user: str | None,
                     password_file: Path | None) -> dict[str, str]:
    """The headers `report --prometheus` sends (bridge/headers.py, as the OTLP side takes them): the flag's or
    variable's `k=v` items, a headers file's, a bearer token's or basic auth's `Authorization`. Every problem is
    said at once, never a value; exit 2."""
    from bridge.errors import ConfigError
    from bridge.headers import basic, bearer, header_pairs, headers_of_file, read_secret

    problems: list[str] = []
    pairs = [*header_pairs(text, problems, "--prometheus-headers")]
    if file is not None:
        pairs += headers_of_file(file, "--prometheus-headers-file", problems)
    if token_file is not None:
        pairs.append(bearer(read_secret(token_file, "--prometheus-bearer-token-file")))
    if (user is None) != (password_file is None):
        problems.append("--prometheus-user and --prometheus-password-file go together")
    elif user is not None and password_file is not None:
        pairs.append(basic(user, read_secret(password_file, "--prometheus-password-file")))
    if sum(name == "authorization" for name, _ in pairs) > 1:
        problems.append("give one Authorization: a bearer token, a user and password, or an Authorization header")
    if problems:
        raise ConfigError("\n".join(sorted(problems)))
    return dict(pairs)


def _store_records(url: str, run_id: str, kwargs: dict[str, Any], grace_ns: int, table: Any,
                   strip_suffix: str | None, headers: dict[str, str] | None = None) -> list[Any]:
    """The run's records from a PromQL store, over the span the window needs (with a margin for the
    samples that bracket its edges). The URL is never printed with its credentials, nor a header's value."""
    from bridge.redact import scrub, secret_list, url_secrets
    from bridge.report.promql import connect
    from bridge.report.store import records_from_store
    from bridge.report.window import phases_from_marks

    window = kwargs.get("window")
    phases = kwargs.get("phases") or phases_from_marks(kwargs.get("marks") or ())
    starts = [window.start_ns] if window is not None else [p.start_ns for p in phases if p.start_ns]
    ends = [window.end_ns] if window is not None else [p.end_ns for p in phases if p.end_ns]
    if not starts or not ends:
        raise click.UsageError("--prometheus needs a window: --start-ns/--end-ns, --phase-manifest or --events")
    margin = 60 * 10**9
    secrets = secret_list([*url_secrets(url), *(headers or {}).values()])
    try:
        client = connect(url, headers=headers)
        return list(records_from_store(client, run_id, min(starts) - margin, max(ends) + grace_ns + margin, table,
                                       strip_suffix=strip_suffix))
    except Exception as exc:  # the store's client raises many kinds; name the store and the cause
        raise click.ClickException(scrub(f"cannot read run {run_id!r} from {redact_url(url)}: {exc}{_auth_hint(exc)}",
                                         secrets)) from None


def _auth_hint(exc: Exception) -> str:
    """What to do when the store refused the query for want of credentials (401/403)."""
    text = str(exc)
    if not any(code in text for code in ("401", "403", "Unauthorized", "Forbidden")):
        return ""
    return ("; the store wants credentials: --prometheus-headers (X-Scope-OrgID for Mimir), "
            "--prometheus-bearer-token-file, or --prometheus-user with --prometheus-password-file")
