"""The lifecycle's last step: build the report from what was recorded and write it.

The live report is built from the record log and the events file — the same inputs `dcgm-bridge
report` reads afterwards — so the two can never disagree.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge.lifecycle import Session, SessionOutputs

logger = logging.getLogger(__name__)


def manifest_phases(session: Session) -> Any:
    """Phases from AIPerf's phase_manifest.json when the run posted no marks and one is configured."""
    from bridge.report import load_manifest

    if session.marks or not session.config.phase_manifest:
        return None
    try:
        return load_manifest(Path(session.config.phase_manifest))
    except (OSError, ValueError) as exc:
        logger.warning("no phases from %s (%s): the report covers the whole run", session.config.phase_manifest, exc)
        return None


def write_session_report(session: Session, outputs: SessionOutputs) -> None:
    from bridge.report import build_report_from_events, write_report

    kwargs: dict[str, Any] = {}
    phases = manifest_phases(session)
    if phases:
        kwargs["phases"] = phases
    report = build_report_from_events(session.records.path, session.events.path, table=session.table,
                                      counter_mode=session.config.counter_mode,
                                      grace_ns=session.config.final_scrape_grace_ns, **kwargs)
    outputs.report = report
    outputs.files.extend(write_report(report, session.artifact_dir, prefix=session.config.profile_export_prefix))
