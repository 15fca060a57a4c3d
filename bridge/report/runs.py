"""A record log that holds more than one run (runs appended to one file before runs rotated their files, or
logs concatenated by hand): `report` builds one run from it, the newest or `--run-id`'s, and says so."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from bridge.record_log import line_batches, read_records
from bridge.samples import GpuRecord

# Our record lines are written by orjson (no spaces); a run id is a plain string (bridge/config.py checks it).
_RUN_ID = re.compile(rb'"run_id":"([^"\\]*)"')


def run_ids_in(path: Path) -> list[str]:
    """The run ids of a record log, in the order they first appear (the last is the newest run appended)."""
    seen: dict[str, None] = {}
    for batch in line_batches(path):
        if len(seen) == 1 and _only(batch, next(iter(seen))):  # the common case, at the speed of bytes.count
            continue
        for match in _RUN_ID.finditer(batch):
            seen.setdefault(match.group(1).decode("utf-8", "replace"), None)
    return list(seen)


def _only(batch: bytes, run_id: str) -> bool:
    """Every run id in `batch` is `run_id`."""
    return batch.count(b'"run_id":"') == batch.count(b'"run_id":"' + run_id.encode() + b'"')


def records_of_run(path: Path, run_id: str, errors: list[str]) -> Iterator[GpuRecord]:
    """The records of one run (a record without a run id belongs to none)."""
    return (r for r in read_records(path, errors) if r.run_id == run_id)
