"""The run's last step: build the report from what the run recorded and write it.

The series come from the live spool (report/spool.py) when it kept every record, else from the record
log; the failures from the events file plus the lines a full disk still holds in memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bridge.config import Config
from bridge.fields import FieldTable
from bridge.record_log import LineWriter
from bridge.report.spool import LiveSeries
from bridge.samples import PhaseMark

if TYPE_CHECKING:
    from bridge.report.build import Records, Report
    from bridge.report.events import RunEvents
    from bridge.report.window import Phase

logger = logging.getLogger(__name__)


@dataclass
class SessionOutputs:
    artifact_dir: Path
    files: list[Path] = field(default_factory=list)
    report: Report | None = None
    error: str | None = None  # why the report (a promised output) was not written


@dataclass(frozen=True)
class ReportTarget:
    """Where the report goes when it is not the session's own artifact directory: the benchmark's files
    (`profile -- aiperf …`: AIPerf's folder, its prefix), and the phases read from them."""

    directory: Path
    prefix: str | None = None
    phases: list[Any] | None = None  # report.window.Phase list; None: marks or the configured manifest


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


def manifest_phases(session: FinishedRun) -> list[Phase] | None:
    """Phases from AIPerf's phase_manifest.json when the run posted no marks and one is configured."""
    from bridge.report import load_manifest

    if session.marks or not session.config.phase_manifest:
        return None
    try:
        return load_manifest(Path(session.config.phase_manifest))
    except (OSError, ValueError) as exc:
        logger.warning("no phases from %s (%s): the report covers the whole run", session.config.phase_manifest, exc)
        return None


def write_session_report(session: FinishedRun, outputs: SessionOutputs) -> None:
    from bridge.report import build_report_from_events, write_report

    kwargs: dict[str, Any] = {}
    target = session.report_target
    phases = target.phases if target is not None and target.phases and not session.marks else None
    phases = phases or manifest_phases(session)
    if phases:
        kwargs["phases"] = phases
    live = session.live_series
    records: Records = live if live is not None and live.complete else session.records.path
    report = build_report_from_events(records, _events(session), table=session.table,
                                      counter_mode=session.config.counter_mode,
                                      grace_ns=session.config.final_scrape_grace_ns, **kwargs)
    outputs.report = report
    if target is not None:
        outputs.files.extend(write_report(report, target.directory, prefix=target.prefix))
    else:
        outputs.files.extend(write_report(report, session.artifact_dir, prefix=session.config.profile_export_prefix))


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
