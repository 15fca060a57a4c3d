"""Writing a `Report`: merge into profile_export_aiperf.json, the CSV section, the per-phase files.

Every file is written atomically (a temp file in the same directory, fsync, rename), so a reader or a
kill never sees half a report. An existing profile_export_aiperf.json keeps all its other keys and
their order; `telemetry_data` and the energy metrics are replaced in place or appended.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from bridge.errors import ReportError
from bridge.report.energy import energy_metrics

if TYPE_CHECKING:
    from bridge.report.build import Report

JSON_FILE = "profile_export_aiperf.json"
CSV_FILE = "profile_export_aiperf.csv"
CSV_HEADER = ["Endpoint", "GPU_Index", "GPU_Name", "GPU_UUID", "Platform"]
CSV_STATS = ["avg", "min", "max", "sum", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "std"]
_OPTIONAL_COLUMNS = (("hostname", "Hostname"), ("namespace", "Namespace"), ("pod_name", "Pod Name"))


class ReportWriteError(ReportError, OSError):
    """A report file could not be written, or an existing one is not a JSON object we may merge into."""


def output_names(prefix: str | None = None) -> tuple[str, str]:
    """(json, csv) file names; `--profile-export-prefix foo` gives foo.json and foo.csv."""
    if not prefix:
        return JSON_FILE, CSV_FILE
    return f"{prefix}.json", f"{prefix}.csv"


def write_report(report: Report, artifact_dir: Path, prefix: str | None = None,
                 benchmark_json: Path | Mapping[str, Any] | None = None, *, json_path: Path | None = None,
                 write_csv: bool = True) -> list[Path]:
    """Write or merge the JSON, the CSV section and (2+ phases) the phase files; returns the paths."""
    json_name, csv_name = output_names(prefix)
    json_path = json_path or artifact_dir / json_name
    existing = read_json_object(json_path) if json_path.exists() else None
    benchmark: Mapping[str, Any] | None
    if isinstance(benchmark_json, Path):
        benchmark = read_json_object(benchmark_json)
    else:
        benchmark = benchmark_json if benchmark_json is not None else existing
    updates: dict[str, Any] = {"telemetry_data": report.telemetry_data}
    updates.update(energy_metrics(report.energy, benchmark))
    if existing is not None:
        _rescale_energy_per_user(existing, updates)
    written = [merge_json(json_path, updates, existing)]
    if write_csv:
        written.append(write_csv_section(json_path.parent / csv_name, report))
    if report.writes_phase_files:
        for phase_file in report.phase_files:
            path = artifact_dir / phase_file.relpath
            atomic_write(path, orjson.dumps(phase_file.document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
            written.append(path)
    return written


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ReportWriteError(f"cannot read {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise ReportWriteError(f"{path} is not valid JSON ({exc}); not merging into it") from None
    if not isinstance(doc, dict):
        raise ReportWriteError(f"{path} holds a JSON {type(doc).__name__}, not an object; not merging into it")
    return doc


def merge_json(path: Path, updates: Mapping[str, Any], existing: dict[str, Any] | None = None) -> Path:
    """Replace `updates`' keys in the JSON object at `path` (keeping every other key and the order)."""
    doc = existing if existing is not None else (read_json_object(path) if path.exists() else {})
    doc = dict(doc)
    doc.update(updates)
    atomic_write(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return path


def _rescale_energy_per_user(existing: Mapping[str, Any], updates: dict[str, Any]) -> None:
    """AIPerf's energy-per-user needs the concurrency, which only it knows: keep its ratio, our energy."""
    old_user = existing.get("nvidia_energy_per_user")
    old_energy = existing.get("nvidia_total_gpu_energy")
    new_energy = updates.get("nvidia_total_gpu_energy")
    if not (isinstance(old_user, Mapping) and isinstance(old_energy, Mapping) and new_energy):
        return
    try:
        ratio = float(old_user["avg"]) / float(old_energy["avg"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return
    updates["nvidia_energy_per_user"] = {**old_user, "avg": ratio * float(new_energy["avg"])}


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ReportWriteError(f"cannot write {path}: {exc.strerror or exc}") from None


# -- CSV ------------------------------------------------------------------------------------------------
def format_csv_number(value: Any) -> str:
    """AIPerf's `.2f`, except where it would print 0.00 for a non-zero value (MJ of a short run)."""
    if type(value) is float:  # nearly every cell: checked first
        return f"{value:.4g}" if value != 0 and -0.005 < value < 0.005 else f"{value:.2f}"
    if value is None:
        return ""
    if isinstance(value, bool | int):
        return str(value)
    number = float(value)
    if number != 0 and abs(number) < 0.005:
        return f"{number:.4g}"
    return f"{number:.2f}"


def csv_section(report: Report) -> str:
    """Two blank rows, the header, one row per GPU × metric (aiperf-compat.md §10)."""
    gpus = [(endpoint, gpu) for endpoint, body in report.telemetry_data["endpoints"].items()
            for gpu in body["gpus"].values()]
    optional = [(field, title) for field, title in _OPTIONAL_COLUMNS if any(field in g for _, g in gpus)]
    buf = io.StringIO()
    writer = csv.writer(buf)  # "\r\n" rows, as AIPerf's csv.writer writes them
    writer.writerow([])
    writer.writerow([])
    writer.writerow(CSV_HEADER + [title for _, title in optional] + ["Metric"] + CSV_STATS)
    for endpoint, gpu in gpus:
        ident = [endpoint, gpu.get("gpu_index", ""), gpu.get("gpu_name", ""), gpu.get("gpu_uuid", ""),
                 gpu.get("platform", "")] + [gpu.get(field, "") for field, _ in optional]
        for key, result in gpu["metrics"].items():
            label = report.labels.get(key)
            name = f"{label.display} ({result.get('unit', label.unit)})" if label else f"{key} ({result.get('unit')})"
            writer.writerow(ident + [name] + list(map(format_csv_number, map(result.get, CSV_STATS))))
    return buf.getvalue()


def write_csv_section(path: Path, report: Report) -> Path:
    """Append the section to an existing CSV (replacing one a previous report wrote), or create it."""
    text = ""
    if path.exists():
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")  # keep its \r\n
        except OSError as exc:
            raise ReportWriteError(f"cannot read {path}: {exc.strerror or exc}") from None
        text = _strip_telemetry_section(text)
    section = csv_section(report)
    if not text.strip():  # a CSV of our own: no blank separator rows at its top (they only part AIPerf's from ours)
        text, section = "", section.lstrip("\r\n")
    atomic_write(path, (text + section).encode("utf-8"))
    return path


def _strip_telemetry_section(text: str) -> str:
    """The CSV without a telemetry section a previous report appended (two blank rows + our header)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if i == 0 and line.startswith(",".join(CSV_HEADER) + ","):
            return ""  # the whole file is a section we wrote
        if line.startswith(",".join(CSV_HEADER) + ",") and i >= 2 and not lines[i - 1].strip() \
                and not lines[i - 2].strip():
            return "".join(lines[: i - 2])
    return text if not text or text.endswith("\n") else text + "\r\n"
