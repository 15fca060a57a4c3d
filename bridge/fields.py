"""The DCGM field → report key table (data in bridge/data/fields.csv) and the blank sentinels."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Literal

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
        )
        for row in rows
    ]


def default_table() -> FieldTable:
    text = resources.files("bridge").joinpath("data/fields.csv").read_text(encoding="utf-8")
    return FieldTable.of(parse_table(text))


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
