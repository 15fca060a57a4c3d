"""Custom-metrics CSV in dcgm-exporter's own format: `DCGM_FIELD, type, help`.

Unlike AIPerf (aiperf-compat.md §9, §13.6) the type column is honoured (a counter gets a delta, a gauge
stats), the unit is read from "(in X)" and the value is *scaled* to the report unit (mJ → MJ, MiB → GB,
ns → µs, Hz → MHz, a 0-1 ratio → %), and a bad line is an error naming its line number.
"""

from __future__ import annotations

import re
from pathlib import Path

from bridge.fields import FieldSpec, FieldTable
from bridge.samples import MetricKind

_UNIT = re.compile(r"\(in\s+([^\s)]+)\)", re.I)
_ACRONYMS = {"Gpu": "GPU", "Xid": "XID", "Sm": "SM", "Nvlink": "NVLINK", "Pci": "PCI", "Pcie": "PCIE", "Cpu": "CPU",
             "Ram": "RAM", "Vram": "VRAM", "Ecc": "ECC"}
# "(in X)" → (report unit, scale from X). Units outside this table are kept as written, unscaled.
_UNITS: dict[str, tuple[str, float]] = {
    "w": ("W", 1.0), "mw": ("W", 1e-3),
    "%": ("%", 1.0), "percent": ("%", 1.0), "ratio": ("%", 100.0), "0-1": ("%", 100.0),
    "gb": ("GB", 1.0), "gib": ("GB", 1.073741824), "mb": ("GB", 1e-3), "mib": ("GB", 1.048576e-3),
    "kb": ("GB", 1e-6), "kib": ("GB", 1.024e-6), "b": ("GB", 1e-9), "bytes": ("GB", 1e-9),
    "mhz": ("MHz", 1.0), "ghz": ("MHz", 1e3), "hz": ("MHz", 1e-6),
    "c": ("°C", 1.0), "°c": ("°C", 1.0), "celsius": ("°C", 1.0),
    "mj": ("MJ", 1e-9), "j": ("MJ", 1e-6), "kj": ("MJ", 1e-3),
    "ns": ("us", 1e-3), "us": ("us", 1.0), "usec": ("us", 1.0), "ms": ("ms", 1.0), "s": ("s", 1.0),
    "count": ("count", 1.0),
}
_KINDS = {"gauge": MetricKind.GAUGE, "counter": MetricKind.COUNTER}


class CustomMetricsError(ValueError):
    pass


def key_for(field: str) -> str:
    """AIPerf's key rule: `DCGM_FI_DEV_SM_CLOCK` → `nvidia_sm_clock`."""
    suffix = field
    for prefix in ("DCGM_FI_DEV_", "DCGM_FI_PROF_", "DCGM_FI_"):
        if suffix.startswith(prefix):
            suffix = suffix[len(prefix):]
            break
    return "nvidia_" + suffix.lower()


def display_for(help_text: str, field: str) -> str:
    text = help_text.split("(", 1)[0].strip().rstrip(".") or field
    return " ".join(_ACRONYMS.get(word, word) for word in text.title().split())


def parse_custom_metrics(text: str, source: str, defaults: FieldTable) -> list[FieldSpec]:
    specs: list[FieldSpec] = []
    errors: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3:
            errors.append(f"{source}:{number}: expected 'DCGM_FIELD, type, help', got {line[:80]!r}")
            continue
        field, kind_text, help_text = parts
        if not field.startswith("DCGM_"):
            errors.append(f"{source}:{number}: field {field!r} does not start with DCGM_")
            continue
        kind = _KINDS.get(kind_text.lower())
        if kind is None:
            if kind_text.lower() in ("label", "histogram", "summary"):
                continue  # valid for dcgm-exporter, nothing to report on
            errors.append(f"{source}:{number}: type {kind_text!r} is not gauge or counter")
            continue
        if field in defaults.by_name:
            continue  # already mapped by default (AIPerf skips these too)
        match = _UNIT.search(help_text)
        written = match.group(1) if match else "count"
        unit, scale = _UNITS.get(written.lower(), (written, 1.0))
        specs.append(FieldSpec(field, key_for(field), display_for(help_text, field), unit, scale, kind))
    if errors:
        raise CustomMetricsError("invalid custom-metrics CSV:\n  " + "\n  ".join(errors))
    return specs


def load_custom_metrics(path: Path | str, defaults: FieldTable) -> list[FieldSpec]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CustomMetricsError(f"custom-metrics CSV {path}: cannot read it ({exc.strerror or exc})") from None
    return parse_custom_metrics(text, str(path), defaults)


def table_with_custom(defaults: FieldTable, paths: list[str]) -> FieldTable:
    custom: list[FieldSpec] = []
    for path in paths:
        custom.extend(load_custom_metrics(path, defaults))
    return defaults.with_custom(custom) if custom else defaults
