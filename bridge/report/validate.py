"""`dcgm-bridge validate ARTIFACT_DIR`: re-check a finished run offline.

The events file (gpu_telemetry_events.jsonl) is found at or below ARTIFACT_DIR, the record log beside it, and
the report (ours, or AIPerf's profile_export_aiperf.json it was merged into, below ARTIFACT_DIR) by the record
log it names. Then: the record log's SHA-256 (its bytes as written, gzip included) against the one the report
stores; every number of `telemetry_data` and of the energy metrics rebuilt from the record log, equal to 1e-9
relative; the verdict recomputed. Exit 0 valid, 1 not valid, 2 unreadable input (README "Exit codes").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from bridge.errors import ReportInputError

RELATIVE = 1e-9


@dataclass
class Validation:
    valid: bool
    reasons: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


@click.command()
@click.argument("artifact_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def validate(artifact_dir: Path) -> None:
    """Re-check a finished run: the record log's hash, every number rebuilt from it, the verdict.

    Exit 0 when the measurement is valid and everything matches, 1 when not, 2 when an input is unreadable.
    """
    result = validate_run(artifact_dir)
    for line in result.lines:
        click.echo(line)
    raise SystemExit(0 if result.valid else 1)


def validate_run(artifact_dir: Path) -> Validation:
    from bridge.record_log import EVENTS_FILE, EXPORT_FILE
    from bridge.report.build import build_report_from_events
    from bridge.report.energy import vendor_energy_metrics
    from bridge.report.runs import read_log, records_of_run
    from bridge.report.verdict import FIXES
    from bridge.report.window import explicit_window

    events = _first(artifact_dir, EVENTS_FILE)
    log = next((p for p in (events.parent / EXPORT_FILE, events.parent / f"{EXPORT_FILE}.gz") if p.is_file()), None)
    if log is None:
        raise ReportInputError(f"validate: no {EXPORT_FILE} (or .gz) beside {events}: nothing to rebuild from")
    report_path, doc = _find_report(artifact_dir, log.name)
    try:
        read = read_log(log)  # one pass: the hash and the records
    except (ValueError, TypeError, OSError) as exc:
        raise ReportInputError(f"validate: cannot rebuild the report from {log}: {exc}") from None
    stored: dict[str, Any] = doc["telemetry_data"]
    verdict = stored.get("measurement") if isinstance(stored.get("measurement"), dict) else {}
    reasons: list[str] = []
    lines = [f"report: {report_path}", f"record log: {log}"]
    stored_hash = (verdict.get("record_log") or {}).get("sha256") if isinstance(verdict, dict) else None
    if not stored_hash:
        reasons.append("no_hash")
        lines.append("  the report stores no SHA-256 of the record log")
    elif stored_hash != read.sha256:
        reasons.append("hash_mismatch")
        lines.append("  SHA-256 differs from the one the report stores")
    else:
        lines.append("  SHA-256 matches the report's")
    kwargs: dict[str, Any] = {"counter_mode": stored.get("summary", {}).get("counter_mode") or "interpolated",
                              "record_log": read}
    window = verdict.get("window") if isinstance(verdict, dict) else None
    try:
        if isinstance(window, dict) and window.get("start_ns") is not None and window.get("end_ns") is not None:
            kwargs["window"] = explicit_window(int(window["start_ns"]), int(window["end_ns"]),
                                               int(window.get("grace_ns") or 0))
        run = (verdict.get("record_log") or {}).get("run_id") if isinstance(verdict, dict) else None
        if isinstance(run, str):  # the log holds several runs: the report was built from this one
            kwargs["record_log_run"] = run
        rebuilt = build_report_from_events(list(records_of_run(log, run, [])) if isinstance(run, str) else read,
                                           events, **kwargs)
    except (ValueError, TypeError, OSError) as exc:
        raise ReportInputError(f"validate: cannot rebuild the report from {log}: {exc}") from None
    fresh = {"telemetry_data": rebuilt.telemetry_data, **vendor_energy_metrics(rebuilt.energy, rebuilt.amd_energy, doc)}
    checked, differ = compare_numbers({"telemetry_data": stored, **{k: v for k, v in doc.items()
                                                                    if k.startswith(("nvidia_", "amd_"))}}, fresh)
    if differ:
        reasons.append("numbers_differ")
        lines.append(f"numbers: {len(differ)} of {checked} differ from the record log's (first: {differ[0]})")
    else:
        lines.append(f"numbers: {checked} checked, all equal to the record log's within {RELATIVE:g} relative")
    measured = rebuilt.telemetry_data.get("measurement", {})
    reasons.extend(r for r in measured.get("reasons", []) if r not in reasons)
    if reasons:
        lines.append(f"measurement NOT valid: {', '.join(reasons)} — "
                     + "; ".join(FIXES[r] for r in reasons if r in FIXES))
    else:
        lines.append("measurement valid")
    return Validation(not reasons, reasons, lines)


def _first(root: Path, name: str) -> Path:
    """`root/name`, else the shallowest `name` below `root`."""
    direct = root / name
    if direct.is_file():
        return direct
    found = sorted(root.rglob(name), key=lambda p: (len(p.parts), str(p)))
    if not found:
        raise ReportInputError(f"validate: no {name} at or below {root}: not a dcgm-bridge artifact directory")
    return found[0]


def _find_report(root: Path, log_name: str) -> tuple[Path, dict[str, Any]]:
    """The report JSON below `root` that holds `telemetry_data`, preferring one whose verdict names `log_name`
    (a report merged into AIPerf's folder is found there too)."""
    import orjson

    candidates: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(root.rglob("*.json"), key=lambda p: (len(p.parts), str(p))):
        if "phases" in path.relative_to(root).parts:
            continue
        try:
            doc = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("telemetry_data"), dict):
            candidates.append((path, doc))
    for path, doc in candidates:
        verdict = doc["telemetry_data"].get("measurement")
        if isinstance(verdict, dict) and (verdict.get("record_log") or {}).get("file") == log_name:
            return path, doc
    if not candidates:
        raise ReportInputError(f"validate: no report (a JSON file with telemetry_data) at or below {root}; "
                               "rebuild it with `dcgm-bridge report`")
    return candidates[0]


def compare_numbers(stored: Mapping[str, Any], fresh: Mapping[str, Any]) -> tuple[int, list[str]]:
    """(numbers in `stored`, the paths of those that `fresh` lacks or differs on by more than 1e-9 relative)."""
    checked = 0
    differ: list[str] = []
    for path, value in _numbers(stored, ""):
        checked += 1
        other = _at(fresh, path)
        if not _close(value, other):
            differ.append(f"{path}: {value!r} vs {other!r}")
    return checked, differ


def _numbers(node: Any, path: str) -> Iterator[tuple[str, float]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _numbers(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _numbers(value, f"{path}/{i}")
    elif isinstance(node, int | float) and not isinstance(node, bool):
        yield path, float(node)


def _at(node: Any, path: str) -> Any:
    for part in path.strip("/").split("/"):
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _close(a: float, b: Any) -> bool:
    if not isinstance(b, int | float) or isinstance(b, bool):
        return False
    return a == b or abs(a - float(b)) <= RELATIVE * max(abs(a), abs(float(b)))
