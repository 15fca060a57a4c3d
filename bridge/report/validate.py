"""`dcgm-bridge validate ARTIFACT_DIR`: re-check a finished run offline.

The events file (gpu_telemetry_events.jsonl) is found at or below ARTIFACT_DIR, the record log beside it, and
the report (ours, or AIPerf's profile_export_aiperf.json it was merged into, below ARTIFACT_DIR) by the record
log it names. The report is rebuilt from the record log and the events file as `report` builds it (report/cli.py
`rebuild`: the window from the events file's phase marks, or from validate's own --start-ns/--end-ns or
--phase-manifest; never from the report, which cannot vouch for its own window). Then:

- the SHA-256 of the record log and of the events file against those the report stores;
- the report's window against the rebuilt one (`window_differs`);
- every key and value of `telemetry_data`, of the energy metrics, of the CSV's telemetry section (and its energy
  rows in AIPerf's `Metric,Value` section) and of each per-phase file against the rebuild: a missing or extra
  key, GPU or row, a value of another JSON type (a number written as a string), another string (a unit) or a
  number off by more than 1e-9 relative is a difference, named by its path and both values (`report_differs`);
  so is every other report below ARTIFACT_DIR that stores the same record log's SHA-256 (window included;
  AIPerf's profile_runs/ apart, each over its own window);
  a CSV or phase file that is a link is named, never read (bridge/files.py `read_output`);
- the verdict recomputed.

A folder of runs (`profile --repeat`'s run_NNNN/, AIPerf's profile_runs/run_NNNN/) is checked run by run
(`validate_folder`), valid when every run is.

Exit 0 valid, 1 not valid, 2 unreadable input (README "Exit codes").
"""

from __future__ import annotations

import csv
import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bridge.errors import ReportInputError
from bridge.files import read_output
from bridge.samples import COUNTER_MODES

if TYPE_CHECKING:
    from datetime import tzinfo

    from bridge.report.build import Report

RELATIVE = 1e-9
SHOWN = 20  # differences listed; the rest counted
# Checked apart (the hashes against the files, the window against the marks), so left out of the value diff.
_HASHES = ("/telemetry_data/measurement/record_log/sha256", "/telemetry_data/measurement/events/sha256")
_APART = ("/telemetry_data/measurement/window", *_HASHES)
PROFILE_RUNS = "profile_runs"  # AIPerf's multi-run layout (`--num-profile-runs`): profile_runs/run_NNNN/


@dataclass
class Validation:
    valid: bool
    reasons: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


@click.command()
@click.argument("artifact_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--start-ns", type=int, help="The window the report was built over, as `report --start-ns` took it "
                                           "(with --end-ns); default: the events file's phase marks.")
@click.option("--end-ns", type=int, help="As `report --end-ns` (with --start-ns).")
@click.option("--grace-ns", type=click.IntRange(0, 60_000_000_000), envvar="AIPERF_GPU_FINAL_SCRAPE_GRACE_NS",
              help="As `report --grace-ns` (default: the run's, recorded in the events file, else 666000000).")
@click.option("--phase-manifest", type=click.Path(exists=True, path_type=Path),
              help="As `report --phase-manifest`: the window is the manifest's profiling phase.")
@click.option("--counter-mode", type=click.Choice(COUNTER_MODES),
              help="As `report --counter-mode` (default: the run's, recorded in the events file).")
@click.option("--run-id", help="As `report --run-id`: the run of a record log that holds several (default: the "
                               "newest).")
@click.option("--metrics-csv", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="As `report --metrics-csv`: the custom-metrics CSV the report was built with.")
@click.option("--gpu-pods", multiple=True, metavar="NAMESPACE/GLOB", help="As `report --gpu-pods` (repeatable).")
@click.option("--gpu-pod-selector", "gpu_pod_selectors", multiple=True, metavar="NAMESPACE/SELECTOR",
              help="As `report --gpu-pod-selector` (repeatable).")
@click.option("--role", "roles", multiple=True, metavar="NAME=NAMESPACE/GLOB", help="As `report --role` (repeatable).")
def validate(artifact_dir: Path, start_ns: int | None, end_ns: int | None, grace_ns: int | None,
             phase_manifest: Path | None, counter_mode: str | None, run_id: str | None,
             metrics_csv: tuple[str, ...] = (), gpu_pods: tuple[str, ...] = (),
             gpu_pod_selectors: tuple[str, ...] = (), roles: tuple[str, ...] = ()) -> None:
    """Re-check a finished run: the hashes of the record log and the events file, the window against the phase
    marks, and every key and value of the report, the CSV section and the phase files against a rebuild.

    Exit 0 when the measurement is valid and everything matches, 1 when not, 2 when an input is unreadable.
    """
    from bridge.report.cli import check_window_flags

    check_window_flags(start_ns, end_ns)
    result = validate_folder(artifact_dir, start_ns=start_ns, end_ns=end_ns, grace_ns=grace_ns,
                             phase_manifest=phase_manifest, counter_mode=counter_mode, run_id=run_id,
                             metrics_csv=metrics_csv, gpu_pods=gpu_pods, gpu_pod_selectors=gpu_pod_selectors,
                             roles=roles)
    for line in result.lines:
        click.echo(line)
    raise SystemExit(0 if result.valid else 1)


def validate_folder(artifact_dir: Path, **flags: Any) -> Validation:
    """ARTIFACT_DIR's run and each run below it, every one as `validate_run` checks a run; valid when all are.

    `profile --repeat N` writes each repeat as a run of its own in `run_NNNN/` (and nothing at the top): each is
    validated alone. AIPerf's `--num-profile-runs N` under `profile` writes `profile_runs/run_NNNN/` beside the
    bridge's report over the whole session: each run's report is rebuilt from the top's record log and events over
    that run's window, taken from its files as `profile` took it (its phase manifest, else its JSON's start_time and
    end_time)."""
    from bridge.record_log import EVENTS_FILE

    repeats = [] if (artifact_dir / EVENTS_FILE).is_file() else _run_folders(artifact_dir, EVENTS_FILE)
    if repeats:
        return _with_runs(None, [(p.name, validate_run(p, **flags)) for p in repeats])
    top = validate_run(artifact_dir, **flags)
    runs = _run_folders(artifact_dir / PROFILE_RUNS, "*.json")
    if not runs:
        return top
    rest = {k: v for k, v in flags.items() if k not in ("start_ns", "end_ns", "phase_manifest")}
    return _with_runs(top, [(f"{PROFILE_RUNS}/{p.name}", _validate_profile_run(artifact_dir, p, rest)) for p in runs])


def _run_folders(folder: Path, holding: str) -> list[Path]:
    """`folder/run_NNNN/` folders (not links) holding a file matching `holding`, in run order."""
    found = [p for p in folder.glob("run_[0-9]*") if p.is_dir() and not p.is_symlink() and any(p.glob(holding))]
    return sorted(found)


def _validate_profile_run(artifact_dir: Path, folder: Path, flags: dict[str, Any]) -> Validation:
    """One of AIPerf's profile_runs/run_NNNN/, over the window `profile` gave it (sidecar/profile.py
    `_merge_profile_runs`)."""
    from bridge.report.window import MANIFEST_FILE, phase_from_document

    try:
        (_, doc), *_ = _find_reports(folder, "")
    except ReportInputError as exc:  # (AIPerf's JSON alone: `profile` found no window for it, or it was removed)
        return Validation(False, ["no_report"], [str(exc)])
    manifest = folder / MANIFEST_FILE
    if manifest.is_file():
        return validate_run(artifact_dir, reports_in=folder, phase_manifest=manifest, **flags)
    phase = phase_from_document(doc)
    if phase is None or phase.start_ns is None or phase.end_ns is None:
        return Validation(False, ["no_window"], [f"no {MANIFEST_FILE} nor start_time and end_time in {folder}: "
                                                 "no window to rebuild its report over"])
    return validate_run(artifact_dir, reports_in=folder, start_ns=phase.start_ns, end_ns=phase.end_ns,
                        window_from="its JSON's start_time and end_time", **flags)


def _with_runs(top: Validation | None, runs: list[tuple[str, Validation]]) -> Validation:
    """The top's lines (when it is a run), then a line per run below it, its details under it when it is NOT
    valid, then one line for all."""
    from bridge.report.console import plural

    lines = list(top.lines) if top is not None else []
    for name, result in runs:
        lines.append(f"{name}: {result.lines[-1]}")
        if not result.valid:
            lines.extend(f"  {line}" for line in result.lines[:-1])
    failed = [name for name, result in runs if not result.valid]
    reasons = list(dict.fromkeys(r for _, result in runs for r in result.reasons))
    if top is not None and not top.valid:
        failed.insert(0, "the top report")
        reasons = list(dict.fromkeys([*top.reasons, *reasons]))
    if failed:
        lines.append(f"measurement NOT valid: {', '.join(reasons)} — in {', '.join(failed)}")
    else:
        lines.append(f"measurement valid ({'the top report and ' if top else ''}{plural(len(runs), 'run')})")
    return Validation(not failed, reasons, lines)


def validate_run(artifact_dir: Path, *, reports_in: Path | None = None, start_ns: int | None = None,
                 end_ns: int | None = None, window_from: str = "--start-ns/--end-ns", grace_ns: int | None = None,
                 phase_manifest: Path | None = None, counter_mode: str | None = None, run_id: str | None = None,
                 metrics_csv: tuple[str, ...] = (), gpu_pods: tuple[str, ...] = (),
                 gpu_pod_selectors: tuple[str, ...] = (), roles: tuple[str, ...] = ()) -> Validation:
    """One run: its events file and record log at or below `artifact_dir`, its report (and the copies of it) at or
    below `reports_in` (default `artifact_dir`, AIPerf's profile_runs/ left to `validate_folder`), rebuilt over the
    window the flags give (`window_from` names --start-ns/--end-ns' source)."""
    from bridge.fields import default_table, table_with_custom
    from bridge.pods import parse_pod_patterns
    from bridge.record_log import EVENTS_FILE, EXPORT_FILE
    from bridge.report.cli import rebuild, with_selected_pods
    from bridge.report.events import load_events
    from bridge.report.verdict import FIXES
    from bridge.report.window import WindowError
    from bridge.roles import parse_roles

    events = _first(artifact_dir, EVENTS_FILE)
    log = next((p for p in (events.parent / EXPORT_FILE, events.parent / f"{EXPORT_FILE}.gz") if p.is_file()), None)
    if log is None:
        raise ReportInputError(f"validate: no {EXPORT_FILE} (or .gz) beside {events}: nothing to rebuild from")
    (report_path, doc), *others = _find_reports(reports_in or artifact_dir, log.name)
    pods = parse_pod_patterns(gpu_pods)
    role_rules = parse_roles(roles)
    try:
        run = load_events(events, strict=True)  # a damaged number: exit 2 naming the line, as `report`
        if gpu_pod_selectors:
            pods = with_selected_pods(pods, gpu_pod_selectors, run, events)
        again = functools.partial(rebuild, log, events, run=run, start_ns=start_ns, end_ns=end_ns, grace_ns=grace_ns,
                                  phase_manifest=phase_manifest, counter_mode=counter_mode, run_id=run_id,
                                  table=table_with_custom(default_table(), list(metrics_csv)),
                                  pods=pods if gpu_pods or gpu_pod_selectors else None,
                                  requests=_requests_input(doc, report_path, artifact_dir), roles=role_rules)
        rebuilt = again()
        zone = _written_zone(doc["telemetry_data"], rebuilt.telemetry_data)
        if zone is not None:  # written where the clock read another zone: rebuilt in that zone
            rebuilt = again(tz=zone)
    except ReportInputError:  # already one line naming the input
        raise
    except WindowError as exc:
        raise ReportInputError(f"validate: {exc}") from None
    except (ValueError, TypeError, OSError) as exc:
        raise ReportInputError(f"validate: cannot rebuild the report from {log}: {exc}") from None
    held = doc["telemetry_data"].get("measurement")
    verdict: dict[str, Any] = held if isinstance(held, dict) else {}
    lines = [f"report: {report_path}"]
    reasons = _check_hashes(verdict, rebuilt, {"record_log": ("record log", log), "events": ("events", events)},
                            lines)
    source = window_from if start_ns is not None else f"{phase_manifest}" if phase_manifest else \
        "the events file's phase marks"
    window = rebuilt.telemetry_data.get("measurement", {}).get("window")
    lines.append(f"window: {_window_text(window)} (from {source})")
    moved = _differences(verdict.get("window"), window, "/telemetry_data/measurement/window")
    if moved:
        reasons.append("window_differs")
        lines.append("  the report's window differs (stored vs rebuilt):")
        lines.extend(f"  {line}" for line in moved)
    checked, differ = compare_report(report_path, doc, rebuilt)
    read = _sha256_in(rebuilt.telemetry_data.get("measurement", {}), "record_log")
    for path, other in others:  # a copy that claims the same record log is checked as well, window included
        if read is not None and _sha256_in(other["telemetry_data"].get("measurement") or {}, "record_log") == read:
            lines.append(f"report: {path} (built from the same record log)")
            more, found = compare_report(path, other, rebuilt, skip=_HASHES)
            checked += more
            differ += [f"/{path.relative_to(reports_in or artifact_dir).as_posix()}{line}" for line in found]
    if differ:
        reasons.append("report_differs")
        lines.append(f"values: {len(differ)} of {checked} differ from the rebuild (stored vs rebuilt):")
        lines.extend(f"  {line}" for line in _shown(differ))
        if len(differ) > SHOWN:
            lines.append(f"  … and {len(differ) - SHOWN} more")
    else:
        lines.append(f"values: {checked} checked, all equal to the rebuild's within {RELATIVE:g} relative")
    measured = rebuilt.telemetry_data.get("measurement", {})
    reasons = list(dict.fromkeys([*reasons, *measured.get("reasons", [])]))
    if reasons:
        lines.append(f"measurement NOT valid: {', '.join(reasons)} — "
                     + "; ".join(FIXES[r] for r in reasons if r in FIXES))
    else:
        lines.append("measurement valid")
    return Validation(not reasons, reasons, lines)


def _requests_input(doc: Mapping[str, Any], report_path: Path, root: Path) -> Path | None:
    """The per-request file the report attributed energy to (`telemetry_data.requests.input.file`): beside the
    report, else the first of that name below ARTIFACT_DIR; None when the report has none (or it is gone: the
    rebuild then lacks `requests` and the difference names it)."""
    held = doc["telemetry_data"].get("requests")
    given = held.get("input") if isinstance(held, Mapping) else None
    name = given.get("file") if isinstance(given, Mapping) else None
    if not isinstance(name, str) or not name or Path(name).name != name:
        return None
    beside = report_path.parent / name
    if beside.is_file():
        return beside
    return next((p for p in sorted(root.rglob(name)) if p.is_file()), None)


def _check_hashes(verdict: Mapping[str, Any], rebuilt: Report, files: Mapping[str, tuple[str, Path]],
                  lines: list[str]) -> list[str]:
    """The reasons (`no_hash`, `hash_mismatch`) the SHA-256 the report stores of each file (`files`: its key in the
    verdict → what it is, its path) gives against the one the rebuild read; its lines appended to `lines`."""
    reasons = []
    for key, (what, path) in files.items():
        lines.append(f"{what}: {path}")
        stored, read = _sha256_in(verdict, key), _sha256_in(rebuilt.telemetry_data.get("measurement", {}), key)
        if not stored:
            reasons.append("no_hash")
            lines.append(f"  the report stores no SHA-256 of the {what}")
        elif stored != read:
            reasons.append("hash_mismatch")
            lines.append(f"  SHA-256 differs from the one the report stores ({_show(stored)} vs {_show(read)})")
        else:
            lines.append("  SHA-256 matches the report's")
    return reasons


def _sha256_in(verdict: Mapping[str, Any], key: str) -> Any:
    held = verdict.get(key)
    return held.get("sha256") if isinstance(held, dict) else None


def _shown(differ: list[str]) -> list[str]:
    """The first `SHOWN` differences, the first of each part (`telemetry_data`, each energy metric, the CSV, each
    phase file) ahead of the rest, in their order, so that every part that differs is named."""
    firsts: dict[str, int] = {}
    for i, line in enumerate(differ):
        parts = line.split("/", 3)
        firsts.setdefault("/".join(parts[1:3] if parts[1:2] == ["phases"] else parts[1:2]), i)
    order = [*firsts.values(), *(i for i in range(len(differ)) if i not in firsts.values())][:SHOWN]
    return [differ[i] for i in sorted(order)]


def _window_text(window: Any) -> str:
    if not isinstance(window, Mapping):
        return "none stored"
    return f"start_ns {window.get('start_ns')!r}, end_ns {window.get('end_ns')!r}, grace_ns {window.get('grace_ns')!r}"


def compare_report(report_path: Path, doc: Mapping[str, Any], rebuilt: Report, skip: tuple[str, ...] = _APART
                   ) -> tuple[int, list[str]]:
    """(values compared, differences): `telemetry_data` and the energy metrics of `doc` (any `nvidia_*`, `amd_*`
    key), the CSV section beside `report_path` and the per-phase files below its folder, each against `rebuilt` as
    `report` writes it; the paths `skip` names are left out."""
    import orjson

    from bridge.report.energy import ENERGY_TAGS
    from bridge.report.write import energy_for

    energy = energy_for(rebuilt, doc, doc)
    fresh = _as_written({"telemetry_data": rebuilt.telemetry_data, **energy})
    held = {"telemetry_data": doc["telemetry_data"],
            **{k: v for k, v in doc.items() if k in ENERGY_TAGS or k.startswith(("nvidia_", "amd_"))}}
    diff = _Diff(skip)
    diff.compare(held, fresh, "")
    csv_path = report_path.with_suffix(".csv")
    if os.path.lexists(csv_path):
        diff.compare_csv(csv_path, rebuilt, fresh)
    if rebuilt.writes_phase_files:
        for phase_file in rebuilt.phase_files:
            path = report_path.parent / phase_file.relpath
            try:
                stored_phase: Any = orjson.loads(read_output(path))
            except FileNotFoundError:
                diff.found.append(f"/{phase_file.relpath}: absent, rebuilt: a phase file")
                continue
            except (OSError, orjson.JSONDecodeError) as exc:
                diff.found.append(f"/{phase_file.relpath}: unreadable ({_reason(exc)}), rebuilt: a phase file")
                continue
            diff.compare(stored_phase, _as_written(phase_file.document), f"/{phase_file.relpath}")
    return diff.leaves, diff.found


def _as_written(doc: Mapping[str, Any]) -> Any:
    """`doc` as the report file holds it (orjson's encoding: numpy numbers, NaN as null)."""
    import orjson

    return orjson.loads(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY))


def _differences(held: Any, fresh: Any, path: str) -> list[str]:
    diff = _Diff()
    diff.compare(held, fresh, path)
    return diff.found


class _Diff:
    """A recursive comparison of two JSON values, by type: paths are JSON Pointers (RFC 6901: `/` between keys,
    `~1` for a `/` in one)."""

    def __init__(self, skip: tuple[str, ...] = ()) -> None:
        self.skip = skip
        self.leaves = 0
        self.found: list[str] = []

    def compare(self, held: Any, fresh: Any, path: str) -> None:
        if path in self.skip:
            return
        if isinstance(held, dict) and isinstance(fresh, dict):
            for key in (k for k in held if k not in fresh):
                self.leaves += 1
                self.found.append(f"{_pointer(path, key)}: {_show(held[key])}, rebuilt: absent (an extra key)")
            for key in fresh:
                if key not in held:
                    self.leaves += 1
                    self.found.append(f"{_pointer(path, key)}: absent, rebuilt: {_show(fresh[key])} (a missing key)")
                else:
                    self.compare(held[key], fresh[key], _pointer(path, key))
        elif isinstance(held, list) and isinstance(fresh, list):
            if len(held) != len(fresh):
                self.leaves += 1
                self.found.append(f"{path}: {len(held)} items, rebuilt: {len(fresh)} items")
            for i, (a, b) in enumerate(zip(held, fresh, strict=False)):
                self.compare(a, b, f"{path}/{i}")
        else:
            self.leaves += 1
            if not _same(held, fresh):
                self.found.append(f"{path}: {_show(held)}, rebuilt: {_show(fresh)}")

    def compare_csv(self, path: Path, rebuilt: Report, fresh: Mapping[str, Any]) -> None:
        """The telemetry section's rows, keyed by endpoint, GPU UUID and metric, cell by cell as the writer
        formats them; and the energy rows in AIPerf's `Metric,Value` section when the file has one."""
        from bridge.report.energy import ENERGY_FAMILY
        from bridge.report.write import CSV_HEADER, csv_section, energy_row

        try:
            text = read_output(path).decode("utf-8", errors="replace")
        except OSError as exc:
            self.found.append(f"/{path.name}: unreadable ({_reason(exc)})")
            return
        lines = text.splitlines()
        header = ",".join(CSV_HEADER) + ","
        start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
        if start is None:  # a CSV `report` was not asked to write into (AIPerf's own): nothing of ours to check
            return
        base = f"/{path.name}"
        try:  # a cell beyond csv's field limit: the file is not one the writer wrote
            held = _csv_rows(lines[start:])
            rows = _by_key((row[0], row[1:]) for row in csv.reader(lines[:start]) if len(row) >= 2)
        except csv.Error as exc:
            self.found.append(f"{base}: unreadable as CSV ({exc})")
            return
        self._compare_rows(held, _csv_rows(csv_section(rebuilt).lstrip("\r\n").splitlines()), base)
        energy = {tag: value for tag, value in fresh.items() if tag != "telemetry_data"}
        if not any(line == "Metric,Value" for line in lines[:start]):
            return
        written = {energy_row(tag, result)[0] for tag, result in energy.items()}
        family = {energy_row(tag, {"unit": unit, "avg": 0.0})[0] for tag, _, unit in ENERGY_FAMILY} | written
        for name in rows:
            if name.replace(" (again)", "") in family and name not in written:
                self.leaves += 1
                self.found.append(f"{base}/Metric,Value/{name}: {_show(rows[name][0])}, rebuilt: absent (an extra row)")
        for tag, result in energy.items():
            name, value = energy_row(tag, result)
            self.leaves += 1
            cells = rows.get(name)
            if cells != [value]:
                self.found.append(f"{base}/Metric,Value/{name}: {_show(cells[0] if cells else None)}, rebuilt: "
                                  f"{_show(value)}")

    def _compare_rows(self, held: tuple[list[str], dict[str, list[str]]],
                      fresh: tuple[list[str], dict[str, list[str]]], base: str) -> None:
        held_header, held_rows = held
        fresh_header, fresh_rows = fresh
        self.compare(held_header, fresh_header, f"{base}/header")
        for key in (k for k in held_rows if k not in fresh_rows):
            self.leaves += 1
            self.found.append(f"{base}/{key}: a row, rebuilt: absent (an extra row)")
        for key, row in fresh_rows.items():
            if key not in held_rows:
                self.leaves += 1
                self.found.append(f"{base}/{key}: absent, rebuilt: a row (a missing row)")
                continue
            stored = held_rows[key]
            for i, title in enumerate(fresh_header):
                self.leaves += 1
                cell = stored[i] if i < len(stored) else None
                if cell != row[i]:
                    self.found.append(f"{base}/{key}/{title}: {_show(cell)}, rebuilt: {_show(row[i])}")


def _csv_rows(lines: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(header, rows by `endpoint/GPU UUID/metric`) of a telemetry section's lines (header first)."""
    rows = [row for row in csv.reader(lines) if any(cell.strip() for cell in row)]
    if not rows:
        return [], {}
    header = rows[0]
    metric = header.index("Metric") if "Metric" in header else 5
    return header, _by_key(("/".join(_escape(row[i]) for i in (0, 3, metric) if i < len(row)), row)
                           for row in rows[1:])


def _by_key(rows: Iterable[tuple[str, list[str]]]) -> dict[str, list[str]]:
    """Rows by key; a key again is kept as `key (again)`, so a row written twice is a difference, not hidden."""
    out: dict[str, list[str]] = {}
    for key, row in rows:
        while key in out:
            key += " (again)"
        out[key] = row
    return out


def _reason(exc: Exception) -> str:
    return str(exc.strerror) if isinstance(exc, OSError) and exc.strerror else str(exc)


def _pointer(path: str, key: object) -> str:
    return f"{path}/{_escape(str(key))}"


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _same(held: Any, fresh: Any) -> bool:
    """Equal as JSON values: integers exactly (1e-9 of a time in ns is more than a second), other numbers (not
    booleans) to 1e-9 relative, everything else of the same type and equal."""
    if isinstance(held, int) and isinstance(fresh, int):
        return type(held) is type(fresh) and held == fresh
    if _is_number(held) and _is_number(fresh):
        return bool(held == fresh or abs(held - fresh) <= RELATIVE * max(abs(held), abs(fresh)))
    return type(held) is type(fresh) and held == fresh


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _show(value: Any) -> str:
    import orjson

    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() if _plain(value) else repr(value)
    return text if len(text) <= 80 else text[:77] + "…"


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


def _written_zone(stored: Any, rebuilt: dict[str, Any]) -> tzinfo | None:
    """The time zone the stored summary's times were written in, where it is not this machine's: AIPerf writes them as
    naive local time, so a report validated on a machine set to another zone (a CI runner in UTC) would differ by the
    offset. The offset is read from the stored start time against the rebuilt window's start (whole quarter hours, as
    every zone's offset is); None where the times agree or cannot be read."""
    from datetime import datetime, timedelta, timezone

    try:
        written = datetime.fromisoformat(stored["summary"]["start_time"])
        start_ns = rebuilt["measurement"]["window"]["start_ns"]
        if written.tzinfo is not None or written.isoformat() == rebuilt["summary"]["start_time"]:
            return None
        utc = datetime.fromtimestamp(start_ns // 1_000_000_000, UTC).replace(tzinfo=None)
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        return None
    quarters = round((written - utc).total_seconds() / 900)
    if abs(quarters) > 14 * 4:  # no zone is further than ±14 h from UTC
        return None
    return timezone(timedelta(minutes=15 * quarters))


def _first(root: Path, name: str) -> Path:
    """`root/name`, else the shallowest `name` below `root`."""
    direct = root / name
    if direct.is_file():
        return direct
    found = sorted(root.rglob(name), key=lambda p: (len(p.parts), str(p)))
    if not found:
        raise ReportInputError(f"validate: no {name} at or below {root}: not a dcgm-bridge artifact directory")
    return found[0]


def _find_reports(root: Path, log_name: str) -> list[tuple[Path, dict[str, Any]]]:
    """The report JSONs below `root` that hold `telemetry_data`, the one to check first: the shallowest whose
    verdict names `log_name`, else the shallowest (a report merged into AIPerf's folder is found there too)."""
    import orjson

    candidates: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(root.rglob("*.json"), key=lambda p: (len(p.parts), str(p))):
        if {"phases", PROFILE_RUNS} & set(path.relative_to(root).parts):  # (a run's phases; AIPerf's runs: apart)
            continue
        try:
            doc = orjson.loads(read_output(path))  # a link is none of ours (the writer never makes one): skipped
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("telemetry_data"), dict):
            candidates.append((path, doc))
    if not candidates:
        raise ReportInputError(f"validate: no report (a JSON file with telemetry_data) at or below {root}; "
                               "rebuild it with `dcgm-bridge report`")
    first = next((i for i, (_, doc) in enumerate(candidates) if _names_log(doc, log_name)), 0)
    return [candidates[first], *candidates[:first], *candidates[first + 1:]]


def _names_log(doc: Mapping[str, Any], log_name: str) -> bool:
    verdict = doc["telemetry_data"].get("measurement")
    held = verdict.get("record_log") if isinstance(verdict, dict) else None
    return isinstance(held, dict) and held.get("file") == log_name
