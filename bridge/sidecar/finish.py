"""The run's last step: build the report from what the run recorded and write it.

The series come from the live spool (sidecar/spool.py) when it kept every record, else from the record
log; the failures from the events file plus the lines a full disk still holds in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bridge.config import Config
from bridge.errors import ConfigError
from bridge.fields import FieldTable
from bridge.record_log import LineWriter
from bridge.samples import PhaseMark
from bridge.sidecar.marks import phase_problems
from bridge.sidecar.spool import LiveSeries

if TYPE_CHECKING:
    from bridge.report.build import Records, Report
    from bridge.report.events import RunEvents
    from bridge.report.window import Phase
    from bridge.sidecar.pod_sinks import PodTimelineSink

logger = logging.getLogger(__name__)
_MTIME_SLACK_NS = 2_000_000_000  # file times come from a coarse kernel clock, behind time.time_ns()


@dataclass
class SessionOutputs:
    artifact_dir: Path
    files: list[Path] = field(default_factory=list)
    report: Report | None = None
    problems: list[str] = field(default_factory=list)  # promised outputs lost or not written: exit 1

    @property
    def error(self) -> str | None:
        """The problems in one line (None when every promised output was written)."""
        return "; ".join(self.problems) or None


@dataclass(frozen=True)
class ReportTarget:
    """Where the report goes when it is not the session's own artifact directory: the benchmark's files
    (`profile -- aiperf …`: AIPerf's folder, its prefix), and the phases read from them."""

    directory: Path
    prefix: str | None = None
    phases: list[Any] | None = None  # report.window.Phase list; None: marks or the configured manifest


def run_exit_code(benchmark_code: int, outputs: SessionOutputs | None) -> int:
    """README "Exit codes": the benchmark's own failure wins (a signal is 128 + its number); a benchmark that
    succeeded while a promised telemetry output was lost gives 1."""
    if benchmark_code < 0:  # subprocess: killed by signal -code
        return 128 - benchmark_code
    if benchmark_code != 0:
        return benchmark_code
    return 1 if outputs is not None and outputs.problems else 0


class FinishedRun(Protocol):
    """What the finish step reads of a session (sidecar/session.py's `Session`)."""

    config: Config
    table: FieldTable
    artifact_dir: Path
    marks: list[PhaseMark]
    report_target: ReportTarget | None
    live_series: LiveSeries | None
    records: LineWriter
    events: LineWriter
    started_ns: int | None
    pod_timelines: PodTimelineSink | None  # --gpu-pods, when this process saw every record


def manifest_phases(session: FinishedRun) -> list[Phase] | None:
    """Phases from AIPerf's phase_manifest.json when the run posted no marks and one is configured.

    A folder is searched for a manifest written during this run only: an earlier run's (moved into its
    subfolder, or left by a benchmark that wrote elsewhere this time) would give another run's phases."""
    from bridge.report import load_manifest
    from bridge.report.window import MANIFEST_FILE

    if session.marks or not session.config.phase_manifest:
        return None
    path = Path(session.config.phase_manifest)
    try:
        if path.is_dir() and session.started_ns is not None:
            since = session.started_ns - _MTIME_SLACK_NS
            found = sorted((p for p in path.rglob(MANIFEST_FILE) if p.stat().st_mtime_ns >= since),
                           key=lambda p: (len(p.parts), str(p)))
            if not found:  # the normal case of a benchmark that writes none (`profile` searches its folder)
                logger.info("no %s written during this run at or below %s: the report covers the whole run",
                            MANIFEST_FILE, path)
                return None
            path = found[0]
        return load_manifest(path)
    except (OSError, ValueError) as exc:
        logger.warning("no phases from %s (%s): the report covers the whole run", session.config.phase_manifest, exc)
        return None


def adopted_phases(session: FinishedRun) -> list[Phase] | None:
    """The phases the report takes when the run posted no marks: the benchmark's files' (`profile -- aiperf`),
    else the configured manifest's; None when there are none or they are unusable (said once, here)."""
    target = session.report_target
    phases = target.phases if target is not None and target.phases and not session.marks else None
    phases = phases or manifest_phases(session)
    problems = phase_problems(phases or [])
    if problems:
        logger.warning("the benchmark's phases are not used (%s): the report covers the whole run",
                       "; ".join(problems))
        return None
    return phases or None


def marks_of_phases(phases: Sequence[Phase] | None) -> list[PhaseMark]:
    """The phase marks that give back exactly `phases` (report/window.py `phases_from_marks`), for the events file
    to record the window the report took from elsewhere (`validate` rebuilds it from the marks); none when marks
    cannot say them all (a cancelled phase that has an end, a phase with no start, a kind marks do not have)."""
    from bridge.report.window import phases_from_marks
    from bridge.samples import PHASE_KINDS

    if not phases or any(p.start_ns is None or p.kind not in PHASE_KINDS for p in phases):
        return []
    marks = [PhaseMark(p.name, p.kind, event, time)  # type: ignore[arg-type]
             for p in phases for event, time in (("start", p.start_ns), ("end", p.end_ns)) if time is not None]
    return marks if phases_from_marks(marks) == list(phases) else []


def write_session_report(session: FinishedRun, outputs: SessionOutputs, phases: list[Phase] | None = None) -> None:
    """The report, over `phases` (`adopted_phases`, taken before the events file closed) when the run posted no
    marks."""
    from bridge.record_log import output_names
    from bridge.report import build_report_from_events, write_report

    kwargs: dict[str, Any] = {}
    target = session.report_target
    if phases:
        kwargs["phases"] = phases
    live = session.live_series
    records: Records = live if live is not None and live.complete else session.records.path
    kwargs.update(table=session.table, counter_mode=session.config.counter_mode,
                  grace_ns=session.config.final_scrape_grace_ns, record_log=session.records.path)
    events = _events(session)
    if target is not None:
        kwargs["requests"] = _benchmark_requests(target, session.started_ns)
    if session.config.roles:
        from bridge.roles import parse_roles

        kwargs["role_rules"] = parse_roles(session.config.roles)
    report = build_report_from_events(records, events, **kwargs)
    if session.config.gpu_pods:
        report = _pods_only(report, session, events, kwargs)
    outputs.report = report
    if target is not None:
        _refuse_foreign(target.directory, output_names(target.prefix))
        outputs.files.extend(write_report(report, target.directory, prefix=target.prefix))
    else:
        _refuse_foreign(session.artifact_dir, output_names(session.config.profile_export_prefix))
        outputs.files.extend(write_report(report, session.artifact_dir, prefix=session.config.profile_export_prefix))


def _benchmark_requests(target: ReportTarget, started_ns: int | None) -> Any:
    """AIPerf's per-request records of this run (`profile_export.jsonl`, or `<prefix>.jsonl`; AIPerf 0.13 writes
    them by default), for each request's energy; None when it wrote none this run or they cannot be read (said)."""
    from bridge.report.requests import AIPERF_RECORDS_FILE, RequestsInputError, read_requests

    path = target.directory / (f"{target.prefix}.jsonl" if target.prefix else AIPERF_RECORDS_FILE)
    try:
        if not path.is_file() or (started_ns is not None and path.stat().st_mtime_ns < started_ns - _MTIME_SLACK_NS):
            return None
        read = read_requests(path)
    except (OSError, RequestsInputError) as exc:
        logger.warning("no per-request energy: %s", exc)
        return None
    if read.errors:
        logger.warning("%d unreadable lines in %s were skipped (first: %s)", len(read.errors), path, read.errors[0])
    return read


def _pods_only(report: Report, session: FinishedRun, events: Path | RunEvents, kwargs: dict[str, Any]) -> Report:
    """--gpu-pods: the report of the GPUs that served matching pods (report/pods.py), from the pods the pages
    named as the run went (the record log's pod labels, read back, only for a run this process resumed); what
    was left out, in one line."""
    from bridge.pods import parse_pod_patterns
    from bridge.report.build import event_kwargs
    from bridge.report.events import load_events
    from bridge.report.pods import report_for_pods, timelines_of_log, with_shared

    patterns = parse_pod_patterns(session.config.gpu_pods)
    live = session.pod_timelines
    timelines = live.timelines.timelines() if live is not None else timelines_of_log(session.records.path)
    timelines = with_shared(timelines, (load_events(events) if isinstance(events, Path) else events).shared)
    report, selection = report_for_pods(report, timelines, patterns, **event_kwargs(events), **kwargs,
                                        events_file=events if isinstance(events, Path) else None)
    if selection.warning:
        logger.warning("%s", selection.warning)
    logger.info("pods: %s", selection.summary_line())
    return report


def _refuse_foreign(directory: Path, names: tuple[str, str]) -> None:
    """A report is merged only into the benchmark's own regular files in its own folder: a link planted there
    during the run (to another user's JSON) is an error naming it, never read or written through."""
    from bridge.sidecar.artifacts import output_problem, report_paths

    for path in report_paths(directory, names):
        problem = output_problem(path)
        if problem is not None:
            raise ConfigError(problem)


def _events(session: FinishedRun) -> Path | RunEvents:
    """The events file, plus the lines the disk refused (still in memory): a full disk loses no failure."""
    pending = session.events.pending()
    if not pending:
        return session.events.path
    import orjson

    from bridge.record_log import read_dicts
    from bridge.report.events import events_from_dicts

    written = list(read_dicts(session.events.path)) if session.events.path.exists() else []
    return events_from_dicts(written + [orjson.loads(line) for line in pending])
