"""Writing a `Report`: merge into profile_export_aiperf.json, the CSV section, the per-phase files.

Every file is written atomically (a temp file in the same directory, fsync, rename), so a reader or a
kill never sees half a report. An existing profile_export_aiperf.json keeps all its other keys and
their order; `telemetry_data` and the energy metrics are replaced in place, or put where AIPerf 0.13
itself puts them with its telemetry on: `telemetry_data` among its declared fields (before
`input_config`), the energy family last, in the analyzer's order. In the CSV the energy rows join
AIPerf's `Metric,Value` section, which it sorts by metric tag.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from bridge.errors import ReportError
from bridge.files import LinkRefused, read_output, write_atomically
from bridge.record_log import output_names as output_names
from bridge.report.energy import ENERGY_FAMILY, ENERGY_TAGS, vendor_energy_metrics

if TYPE_CHECKING:
    from bridge.report.build import Report

CSV_HEADER = ["Endpoint", "GPU_Index", "GPU_Name", "GPU_UUID", "Platform"]
CSV_STATS = ["avg", "min", "max", "sum", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "std"]
_OPTIONAL_COLUMNS = (("hostname", "Hostname"), ("namespace", "Namespace"), ("pod_name", "Pod Name"))


class ReportWriteError(ReportError, OSError):
    """A report file could not be written, or an existing one is not a JSON object we may merge into."""


def write_report(report: Report, artifact_dir: Path, prefix: str | None = None,
                 benchmark_json: Path | Mapping[str, Any] | None = None, *, json_path: Path | None = None,
                 write_csv: bool = True) -> list[Path]:
    """Write or merge the JSON, the CSV section and (2+ phases) the phase files; returns the paths."""
    json_name, csv_name = output_names(prefix)
    json_path = json_path or artifact_dir / json_name
    existing = read_json_object(json_path, output=True) if os.path.lexists(json_path) else None
    benchmark: Mapping[str, Any] | None
    if isinstance(benchmark_json, Path):
        benchmark = read_json_object(benchmark_json)
    else:
        benchmark = benchmark_json if benchmark_json is not None else existing
    energy = energy_for(report, benchmark, existing)
    written = [merge_json(json_path, {"telemetry_data": report.telemetry_data, **energy}, existing)]
    if write_csv:
        written.append(write_csv_section(json_path.parent / csv_name, report, energy, existing or benchmark))
    if report.requests is not None:  # beside AIPerf's profile_export.jsonl, one line per request
        from bridge.report.requests import REQUESTS_FILE, request_lines

        path = json_path.parent / REQUESTS_FILE
        atomic_write(path, request_lines(report.requests))
        written.append(path)
    if report.writes_phase_files:
        for phase_file in report.phase_files:
            path = artifact_dir / phase_file.relpath
            atomic_write(path, orjson.dumps(phase_file.document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
            written.append(path)
    return written


def energy_for(report: Report, benchmark: Mapping[str, Any] | None, existing: Mapping[str, Any] | None
               ) -> dict[str, dict[str, Any]]:
    """The energy metrics written beside `telemetry_data` (`validate` rebuilds them by this same rule)."""
    energy = vendor_energy_metrics(report.energy, report.amd_energy, benchmark)
    if existing is not None and "nvidia_energy_per_user" not in energy:
        _rescale_energy_per_user(existing, energy)
    return energy


def read_json_object(path: Path, *, output: bool = False) -> dict[str, Any]:
    """The JSON object in `path`; `output`: a file about to be merged into, never read through a link."""
    try:
        doc = orjson.loads(read_output(path) if output else path.read_bytes())
    except LinkRefused as exc:
        raise ReportWriteError(str(exc.strerror)) from None
    except OSError as exc:
        raise ReportWriteError(f"cannot read {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise ReportWriteError(f"{path} is not valid JSON ({exc}); not merging into it") from None
    if not isinstance(doc, dict):
        raise ReportWriteError(f"{path} holds a JSON {type(doc).__name__}, not an object; not merging into it")
    return doc


# AIPerf 0.13's JsonExportData declares telemetry_data after these fields and before the next list; a
# model_dump writes declared fields in that order, then the extra metrics (the energy family last).
_DECLARED_BEFORE_TELEMETRY = ("schema_version", "aiperf_version", "benchmark_id", "request_throughput",
                              "request_latency", "request_count", "time_to_first_token", "time_to_second_token",
                              "inter_token_latency", "output_token_throughput", "output_token_throughput_per_user",
                              "output_sequence_length", "input_sequence_length", "goodput", "good_request_count",
                              "output_token_count", "reasoning_token_count", "min_request_timestamp",
                              "max_response_timestamp", "inter_chunk_latency", "total_output_tokens",
                              "total_reasoning_tokens", "benchmark_duration", "total_isl", "total_osl",
                              "error_request_count", "error_isl", "total_error_isl")
_DECLARED_AFTER_TELEMETRY = ("input_config", "run_info", "was_cancelled", "is_complete", "incomplete_reason",
                             "error_summary", "start_time", "end_time", "branch_stats", "warmup_metrics",
                             "pooled_spec_decode_acceptance_histogram")


def merge_json(path: Path, updates: Mapping[str, Any], existing: dict[str, Any] | None = None) -> Path:
    """Put `updates`' keys into the JSON object at `path`, keeping every other key and the order."""
    doc = existing if existing is not None else (read_json_object(path, output=True) if os.path.lexists(path) else {})
    atomic_write(path, orjson.dumps(merged_document(doc, updates), option=orjson.OPT_INDENT_2))
    return path


def merged_document(doc: Mapping[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """`doc` with `updates`: a key it has is replaced in place; a new `telemetry_data` goes where AIPerf's
    model puts it (before `input_config` and the fields after it), new energy metrics go last in AIPerf's
    order; a stale energy metric `updates` no longer has is dropped."""
    keys = list(doc)
    out = {k: v for k, v in doc.items() if not (k in ENERGY_TAGS and k not in updates)}
    for key, value in updates.items():
        if key in out:
            out[key] = value
    if "telemetry_data" in updates and "telemetry_data" not in doc:
        after = next((i for i, k in enumerate(keys) if k in _DECLARED_AFTER_TELEMETRY), None)
        if after is None:
            before = [i for i, k in enumerate(keys) if k in _DECLARED_BEFORE_TELEMETRY]
            after = before[-1] + 1 if before else len(keys)
        items = [(k, out[k]) for k in keys[:after] if k in out]
        items.append(("telemetry_data", updates["telemetry_data"]))
        items += [(k, out[k]) for k in keys[after:] if k in out]
        out = dict(items)
    for tag, _, _ in ENERGY_FAMILY:
        if tag in updates and tag not in out:
            out[tag] = updates[tag]
    for key, value in updates.items():  # anything else new: appended
        out.setdefault(key, value)
    return out


def _rescale_energy_per_user(existing: Mapping[str, Any], updates: dict[str, Any]) -> None:
    """A file that has AIPerf's energy per user but no input_config (so no concurrency): keep its ratio."""
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
    """`path` replaced by `data` in one step, never through a link (bridge/files.py); one line on failure."""
    try:  # a read-only folder, a full disk, EMFILE, a name too long, a planted link: each the same one-line error
        write_atomically(path, data)
    except LinkRefused as exc:
        raise ReportWriteError(str(exc.strerror)) from None
    except OSError as exc:
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


# OWASP "CSV Injection": a spreadsheet runs a cell that starts with = + - @, a tab or a carriage return as a
# formula (=HYPERLINK(…), @SUM(…)*cmd|…); a single quote before it makes it text. Labels, names and hostnames come
# from the exporter, so every text cell is neutralised; the numbers are our own and stay as AIPerf writes them.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: object) -> str:
    """A text cell that no spreadsheet reads as a formula (OWASP's rule above)."""
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def csv_section(report: Report) -> str:
    """Two blank rows, the header, one row per GPU × metric (as ai-dynamo/aiperf
    `src/aiperf/exporters/metrics_csv_exporter.py` writes them: the optional Hostname, Namespace, Pod Name
    columns come after the statistics)."""
    gpus = [(endpoint, gpu) for endpoint, body in report.telemetry_data["endpoints"].items()
            for gpu in body["gpus"].values()]
    optional = [(field, title) for field, title in _OPTIONAL_COLUMNS if any(field in g for _, g in gpus)]
    buf = io.StringIO()
    writer = csv.writer(buf)  # "\r\n" rows, as AIPerf's csv.writer writes them
    writer.writerow([])
    writer.writerow([])
    writer.writerow(CSV_HEADER + ["Metric"] + CSV_STATS + [title for _, title in optional])
    for endpoint, gpu in gpus:
        ident = [csv_text(endpoint), gpu.get("gpu_index", ""), csv_text(gpu.get("gpu_name", "")),
                 csv_text(gpu.get("gpu_uuid", "")), csv_text(gpu.get("platform", ""))]
        extra = [csv_text(str(gpu.get(field))) for field, _ in optional]  # AIPerf writes str(None) too
        for key, result in gpu["metrics"].items():
            label = report.labels.get(key)
            name = f"{label.display} ({result.get('unit', label.unit)})" if label else f"{key} ({result.get('unit')})"
            writer.writerow(ident + [csv_text(name)] + list(map(format_csv_number, map(result.get, CSV_STATS)))
                            + extra)
    return buf.getvalue()


def write_csv_section(path: Path, report: Report, energy: Mapping[str, Mapping[str, Any]] | None = None,
                      benchmark: Mapping[str, Any] | None = None) -> Path:
    """Append the section to an existing CSV (replacing one a previous report wrote), or create it; the
    energy metrics join its `Metric,Value` rows."""
    text = ""
    if os.path.lexists(path):
        try:
            text = read_output(path).decode("utf-8", errors="replace")  # keep its \r\n
        except LinkRefused as exc:
            raise ReportWriteError(str(exc.strerror)) from None
        except OSError as exc:
            raise ReportWriteError(f"cannot read {path}: {exc.strerror or exc}") from None
        text = _strip_telemetry_section(text)
        if energy and text.strip():
            text = with_energy_rows(text, energy, benchmark)
    section = csv_section(report)
    if not text.strip():  # a CSV of our own: no blank separator rows at its top (they only part AIPerf's from ours)
        text, section = "", section.lstrip("\r\n")
    atomic_write(path, (text + section).encode("utf-8"))
    return path


_HEADERS = {tag: (header, unit) for tag, header, unit in ENERGY_FAMILY}
_PERCENTILE = re.compile(r"p\d+$")


def energy_row(tag: str, result: Mapping[str, Any]) -> list[str]:
    """AIPerf's system-metric row: `<header> (<unit>)` (no unit for count/requests), value `.2f`."""
    header, unit = _HEADERS[tag]
    unit = str(result.get("unit", unit))
    name = header if unit.lower() in ("count", "requests") else f"{header} ({unit})"
    return [name, f"{float(result['avg']):.2f}"]


def with_energy_rows(text: str, energy: Mapping[str, Mapping[str, Any]],
                     benchmark: Mapping[str, Any] | None) -> str:
    """AIPerf's CSV with the energy rows in its `Metric,Value` section, sorted by tag as AIPerf sorts them.

    The rows carry display names, not tags: the tags come from the JSON, whose single-value metrics are
    exactly these rows in tag order. When they do not line up (a hand-edited file), the energy rows go at
    the end of the section. Rows of a previous merge (or of AIPerf's own telemetry) are replaced."""
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if text.endswith("\r\n") or "\r\n" in text else "\n"
    names = {energy_row(tag, {"unit": unit, "avg": 0.0})[0] for tag, _, unit in ENERGY_FAMILY}
    names |= {energy_row(tag, result)[0] for tag, result in energy.items() if tag in _HEADERS}
    start = next((i for i, line in enumerate(lines) if line.rstrip("\r\n") == "Metric,Value"), None)
    if start is None:  # no single-value section: a new one after the existing rows
        body = text if text.endswith(("\n", "\r")) else text + newline
        section = [f"Metric,Value{newline}"] + [_csv_line(energy_row(t, r), newline) for t, r in energy.items()
                                                if t in _HEADERS]
        return body + newline + "".join(section)
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    kept = [line for line in lines[start + 1:end] if next(csv.reader([line]), [""])[0] not in names]
    tags = sorted(tag for tag, value in (benchmark or {}).items()
                  if isinstance(value, Mapping) and "unit" in value and tag not in ENERGY_TAGS
                  and not any(_PERCENTILE.match(k) and value[k] is not None for k in value))
    new = sorted((tag, _csv_line(energy_row(tag, result), newline)) for tag, result in energy.items()
                 if tag in _HEADERS)
    if len(tags) == len(kept):
        rows = sorted([*zip(tags, kept, strict=True), *new], key=lambda item: item[0])
    else:
        rows = [("", line) for line in kept] + new
    if end == len(lines) and lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += newline
    return "".join(lines[:start + 1] + [line for _, line in rows] + lines[end:])


def _csv_line(row: list[str], newline: str) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator=newline).writerow(row)
    return buf.getvalue()


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
