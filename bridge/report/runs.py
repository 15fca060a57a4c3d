"""A record log read once for a report (its series, unreadable lines, SHA-256 and run ids in the one pass); and a
log that holds more than one run (runs appended to one file before runs rotated their files, or logs concatenated
by hand): `report` builds one run from it, the newest or `--run-id`'s, and says so."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bridge.record_log import read_records
from bridge.report.series import Series, SeriesAccumulator
from bridge.samples import GpuRecord


@dataclass(frozen=True)
class LogRead:
    """A record log as one pass read it: every record as series (`build_report` takes it as their source), the
    lines it could not read, the SHA-256 of its bytes as written (gzip included: what `dcgm-bridge validate`
    checks) and its run ids in the order they first appear (the last is the newest run appended)."""

    path: Path
    series: SeriesAccumulator
    errors: list[str]
    sha256: str

    @property
    def run_ids(self) -> list[str]:
        return self.series.run_ids

    @property
    def records(self) -> int:
        return self.series.records

    def finish(self) -> list[Series]:
        return self.series.finish()


def read_log(path: Path) -> LogRead:
    """Read a record log (plain or .gz, ours or AIPerf's) once. Raises OSError when it cannot be read."""
    digest = hashlib.sha256()
    errors: list[str] = []
    series = SeriesAccumulator().add_path(path, errors, digest)
    return LogRead(path, series, errors, digest.hexdigest())


def records_of_run(path: Path, run_id: str, errors: list[str]) -> Iterator[GpuRecord]:
    """The records of one run (a record without a run id belongs to none)."""
    return (r for r in read_records(path, errors) if r.run_id == run_id)
