"""The DCGM field → report key table (data in bridge/data/fields.csv), the blank sentinels, and the
custom-metrics CSVs (dcgm-exporter's own format) that extend the table."""

from __future__ import annotations

import csv
import functools
import io
import re
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from bridge.errors import ConfigError
from bridge.samples import MetricKind

Level = Literal["device", "instance"]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str  # exporter family name, exactly as written
    key: str  # report key (nvidia_power_usage)
    display: str  # display name (NVIDIA GPU Power Usage)
    unit: str  # report unit (W)
    scale: float  # exporter value × scale = report value
    kind: MetricKind
    level: Level = "instance"
    # which exporters write this name: any | <=4.8 | <=4.9 | 4.9+ | 4.10+ | 1.x (`-o`) | custom (a metrics CSV)
    dialect: str = "custom"

    @property
    def label(self) -> str:
        """`"<display> (<unit>)"`, as AIPerf's CSV and console show a metric."""
        return f"{self.display} ({self.unit})"


@dataclass(frozen=True)
class FieldTable:
    """Lookups by exporter name and by report key; keys keep the table's order (the report order)."""

    by_name: Mapping[str, FieldSpec]
    by_key: Mapping[str, FieldSpec]

    @classmethod
    def of(cls, specs: Iterable[FieldSpec]) -> FieldTable:
        by_name: dict[str, FieldSpec] = {}
        by_key: dict[str, FieldSpec] = {}
        for spec in specs:
            by_name.setdefault(spec.name, spec)
            by_key.setdefault(spec.key, spec)
        return cls(by_name, by_key)

    def with_custom(self, custom: Iterable[FieldSpec]) -> FieldTable:
        """Custom fields come after the defaults; a name already mapped keeps its default mapping."""
        return FieldTable.of([*self.by_name.values(), *custom])

    def kind_of(self, key: str) -> MetricKind:
        spec = self.by_key.get(key)
        return spec.kind if spec else MetricKind.GAUGE


def parse_table(text: str) -> list[FieldSpec]:
    rows = csv.DictReader(io.StringIO("\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))))
    return [
        FieldSpec(
            name=row["name"],
            key=row["key"],
            display=row["display"],
            unit=row["unit"],
            scale=float(row["scale"]),
            kind=MetricKind(row["kind"]),
            level="device" if row["level"] == "device" else "instance",
            dialect=row.get("dialect") or "custom",
        )
        for row in rows
    ]


@functools.cache
def default_table() -> FieldTable:
    """DCGM's rows (fields.csv), then the rows no DCGM table holds (fields_other.csv: AMD's exporter, NVML). Read
    once (every report asks for it; ~7 ms to parse): the table is never changed, `with_custom` makes a new one."""
    data = resources.files("bridge").joinpath("data")
    return FieldTable.of([*parse_table(data.joinpath("fields.csv").read_text(encoding="utf-8")),
                          *parse_table(data.joinpath("fields_other.csv").read_text(encoding="utf-8"))])


DIALECT_NAMES = {
    "any": "every dcgm-exporter", "<=4.8": "dcgm-exporter <= 4.8", "<=4.9": "dcgm-exporter <= 4.9",
    "4.9+": "dcgm-exporter 4.9+ (DCGM 4.7 name)", "4.10+": "dcgm-exporter 4.10+", "1.x": "1.x / -o name",
    "custom": "custom-metrics CSV", "amd": "AMD device-metrics-exporter",
    "nvml": "dcgm-bridge NVML source", "amdsmi": "dcgm-bridge amdsmi source",
}


@dataclass(frozen=True)
class DialectSummary:
    """What a page's family names say about the exporter that wrote them (`dcgm-bridge parse`)."""

    mapped: Mapping[str, tuple[str, str]]  # family -> (dialect, report key), in page order
    unmapped: tuple[str, ...]  # DCGM families with no report key (forwarded as OTLP, not in the report)

    def lines(self, width: int = 80) -> list[str]:
        """The families grouped by dialect, then the unmapped ones, wrapped to `width` columns."""
        groups: dict[str, list[str]] = {}
        for name, (dialect, _key) in self.mapped.items():
            groups.setdefault(DIALECT_NAMES.get(dialect, dialect), []).append(name)
        if self.unmapped:
            groups[f"not mapped, forwarded only ({len(self.unmapped)})"] = list(self.unmapped)
        out: list[str] = []
        for title, names in groups.items():
            out += textwrap.wrap(", ".join(names), width, initial_indent=f"  {title}: ", subsequent_indent="    ",
                                 break_on_hyphens=False)
        return out


# AMD's device-metrics-exporter writes its families bare (`gpu_package_power`: ROCm/device-metrics-exporter #171,
# #259, PR #236) or under an `amd_` prefix (`amd_gpu_package_power`: PR #558 on ROCm 7.14 bare metal, 2026; PR #367
# in Kubernetes; issue #233 on a VF, exporter v1.3.1). Both name the same row; the prefix is taken off only where the
# bare name is an AMD row, so no other vendor's family changes meaning.
AMD_PREFIX = "amd_"


def spec_for_family(table: FieldTable, name: str) -> FieldSpec | None:
    """The row a family name maps to; like AIPerf, `name` without a `_total` suffix (OpenMetrics counters) too; an
    AMD family with or without its `amd_` prefix."""
    spec = table.by_name.get(name) or table.by_name.get(name.removesuffix("_total"))
    if spec is None and name.startswith(AMD_PREFIX):
        bare = spec_for_family(table, name[len(AMD_PREFIX):])
        return bare if bare is not None and bare.dialect == "amd" else None
    return spec


def dialect_summary(families: Iterable[str], table: FieldTable, also_unmapped: Iterable[str] = ()) -> DialectSummary:
    """`also_unmapped`: families beyond DCGM's to list as not mapped (those whose labels name a GPU)."""
    mapped: dict[str, tuple[str, str]] = {}
    unmapped: list[str] = []
    others = set(also_unmapped)
    for name in dict.fromkeys(families):
        spec = spec_for_family(table, name)
        if spec is not None:
            mapped[name] = (spec.dialect, spec.key)
        elif name.upper().startswith("DCGM_") or name in others:
            unmapped.append(name)
    return DialectSummary(mapped, tuple(unmapped))


# go-dcgm pkg/dcgm/const.go: values DCGM uses for "blank / not found / not supported / no permission".
# dcgm-exporter drops them today, older builds leaked them (gpu-monitoring-tools#152). As floats the
# four INT64 sentinels are one value (9.223372036854776e18), which is what a parsed page holds.
BLANK_VALUES = frozenset(
    [float(v) for v in range(2147483632, 2147483636)]
    + [float(v) for v in range(9223372036854775792, 9223372036854775796)]
    + [float(2**47 + i) for i in range(4)]
)
BLANK_STRINGS = frozenset(["<<<NULL>>>", "<<<NOT_FOUND>>>", "<<<NOT_SUPPORTED>>>", "<<<NOT_PERMISSIONED>>>"])


def is_blank_value(value: float) -> bool:
    return value in BLANK_VALUES


def is_blank_label(value: str) -> bool:
    return not value or value in BLANK_STRINGS


# -- custom-metrics CSV ----------------------------------------------------------------------------
# Custom-metrics CSV in dcgm-exporter's own format: `DCGM_FIELD, type, help`.
#
# Unlike AIPerf (ai-dynamo/aiperf `src/aiperf/gpu_telemetry/metrics_config.py`) the type column is
# honoured (a counter gets a delta, a gauge stats), the unit is read from "(in X)" and the value is *scaled* to the
# report unit (mJ → MJ, MiB → GB, ns → µs, Hz → MHz, a 0-1 ratio → %), and a bad line is an error naming its line
# number. A DCGM 4.7 name's unit suffix (_RATIO, _HERTZ, _JOULES_TOTAL, …) comes before the help text's.
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
# A DCGM 4.7 name carries its unit (NVIDIA/go-dcgm dcgm_fields.h): it wins over the help text, whose "(in X)" users
# copy from older files. `_BYTES` alone is not here: DCGM uses it for byte counts and for byte rates alike.
_NAME_UNITS: tuple[tuple[str, tuple[str, float]], ...] = (
    ("_RATIO", ("%", 100.0)), ("_HERTZ", ("MHz", 1e-6)), ("_JOULES_TOTAL", ("MJ", 1e-6)), ("_WATTS", ("W", 1.0)),
    ("_CELSIUS", ("°C", 1.0)), ("_BYTES_PER_SECOND", ("MB/s", 1e-6)),
)
_KINDS = {"gauge": MetricKind.GAUGE, "counter": MetricKind.COUNTER}


class CustomMetricsError(ConfigError):
    """A custom-metrics CSV that cannot be read; the message names the file and line."""


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
        by_name = next((u for suffix, u in _NAME_UNITS if field.endswith(suffix)), None)
        match = _UNIT.search(help_text)
        written = match.group(1) if match else "count"
        unit, scale = by_name or _UNITS.get(written.lower(), (written, 1.0))
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
    except UnicodeDecodeError as exc:
        raise CustomMetricsError(f"custom-metrics CSV {path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                                 f"offset {exc.start}); expected dcgm-exporter's CSV format") from None
    return parse_custom_metrics(text, str(path), defaults)


def table_with_custom(defaults: FieldTable, paths: list[str]) -> FieldTable:
    custom: list[FieldSpec] = []
    for path in paths:
        custom.extend(load_custom_metrics(path, defaults))
    return defaults.with_custom(custom) if custom else defaults
