"""Parsed samples → one GpuRecord per GPU (or MIG instance) per scrape.

Rules (NVIDIA/dcgm-exporter's labels: `internal/pkg/rendermetrics/render_metrics.go`; DECISIONS.md "Normalisation"):
- identity is the GPU UUID (`UUID`, or `uuid` under `-o`) plus `GPU_I_ID` for a MIG instance, never the
  index alone; a GPU without UUID or model name is recorded under a fallback identity and never costs
  the other GPUs their data (AIPerf drops the whole scrape);
- blank sentinels and empty label values mean "absent", never zero; NaN/±Inf are absent too;
- under MIG, device-level fields repeat on every instance series: they belong to the parent GPU only;
- NvLink / NvSwitch / CPU entity lines are not GPUs (they are still forwarded as OTLP, not here);
- the same series twice on one page (metric name and label set; an exporter bug, two collectors): `keep="first"`
  (the default) keeps the first, as Prometheus does; `keep="last"` is AIPerf's (compat mode: its dict keeps the
  last). Either way the pages whose duplicates differ are counted (`take_duplicates`); identical ones are not.

Speed: the rules above only depend on a page's structure (names and label sets) and on which values are
absent. So they are compiled once per page template (parse/template.py) into a `_Plan` — per record, its report
keys and the sample positions and scales that fill them — and each page then costs a few C-level
`map`/`zip`/`dict` calls per GPU. The plan is the line loop's result with positions in place of values
(the same code computes both), so a compiled page and a looped page give the same records.

Faster still, with the compiled kernel (bridge/_kernel.c): the record log lays a plan's records out as a line
program — the JSON text of each record around its values (bridge/record_log.py `line_pieces`, its own format) —
and the kernel writes a templated page's record lines and value rows in one call (`Normalizer.compiled`). The
records are then built only when something asks for them (`CompiledRecords.records`: the live view's first
sight of a GPU, listeners); tests/test_kernel.py holds the kernel's lines to `record_to_line`'s, byte for byte.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from itertools import count
from typing import Literal, NamedTuple

from bridge import kernel  # without the compiled kernel every page takes `Normalizer.records`
from bridge.fields import BLANK_VALUES, FieldSpec, FieldTable, is_blank_label, is_blank_value, spec_for_family
from bridge.parse import AnyPage, PageTemplate, TemplatedPage
from bridge.parse.template import pack_ints
from bridge.record_log import LineProgram, line_pieces, line_program
from bridge.samples import CounterMode, GpuMeta, GpuRecord

_BLANKS = tuple(sorted(BLANK_VALUES))

_NOT_GPU_LABELS = ("nvlink", "nvswitch", "cpucore")


class GpuIdentity(NamedTuple):
    uuid: str
    instance_id: str | None


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = labels.get(name)
        if value is not None and not is_blank_label(value):
            return value
    return None


def meta_of(labels: Mapping[str, str]) -> GpuMeta | None:
    """GPU metadata from a series' labels, in every dialect; None for a line that is not a GPU."""
    gpu = labels.get("gpu")
    if gpu is None and "gpu_id" in labels:
        return _amd_meta_of(labels)
    if gpu is None or any(name in labels for name in _NOT_GPU_LABELS):
        return None
    try:
        index: int | None = int(gpu)
    except ValueError:
        index = None
    hostname = _label(labels, "hostname", "Hostname")  # dcgm-exporter 4.6.0-4.8.3 renamed Hostname (#655)
    uuid = _label(labels, "UUID", "uuid")  # `-o/--use-old-namespace` writes `uuid`
    return GpuMeta(
        gpu_index=index,
        gpu_uuid=uuid or f"unknown:{hostname or ''}:{gpu}",
        gpu_model_name=_label(labels, "modelName"),
        pci_bus_id=_label(labels, "pci_bus_id"),
        device=_label(labels, "device"),
        hostname=hostname,
        namespace=_label(labels, "namespace", "pod_namespace"),
        pod_name=_label(labels, "pod", "pod_name"),
        gpu_instance_id=_label(labels, "GPU_I_ID"),
        gpu_instance_profile=_label(labels, "GPU_I_PROFILE"),
    )


# Values AMD's exporter writes where it has none (ROCm/device-metrics-exporter, real pages): an all-zero `gpu_uuid` on
# an SR-IOV VF (issue #233), `gpu_partition_id` "NA" on consumer cards and ROCm 7 bare metal (#259, PR #236) or
# 4294967295 (UINT32_MAX, gpuagent's AMDSMI_INVALID_UINT32) on a VF (#233), and empty `card_model`/`serial_number` on
# VFs and consumer cards (#171, #259, #353). A serial of only "x" is one a poster redacted (PR #558, the docs'
# metricslist.md examples): it names no board, and two GPUs' redacted serials may be the same "xxxx".
_AMD_ABSENT = frozenset(["NA", "N/A", "4294967295"])
# Compute partition types that split a package (amdsmi's AMDSMI_COMPUTE_PARTITION_*): "spx" is one partition, and
# the 2026 bare-metal exporter writes "none" for an MI300X that is not partitioned (PR #558), consumer cards too.
_AMD_SPLIT = frozenset(["cpx", "dpx", "tpx", "qpx"])


def _amd_label(labels: Mapping[str, str], name: str) -> str | None:
    """An AMD label's value, None where the exporter wrote an empty, sentinel or redacted one (or an all-zero UUID)."""
    value = _label(labels, name)
    if value is None or value.upper() in _AMD_ABSENT or not value.strip("xX"):
        return None
    if name == "gpu_uuid" and not value.strip("0-"):
        return None
    return value


def amd_identity(labels: Mapping[str, str]) -> tuple[str, str | None, str | None]:
    """An AMD GPU's key, its partition and its device UUID, in the stated order (DESIGN.md "AMD identity"): the key
    is the board serial (what the exporter labels every series with, and amdsmi reads, so both name a GPU alike),
    else the device UUID, else `unknown:<hostname>:<gpu_id>` (which identifies nothing across endpoints,
    select.py); the partition only under a splitting compute partition type (`_AMD_SPLIT`), where it is the
    instance of its package; the device UUID where the source has one (the report shows it, as AIPerf 0.13's
    amdsmi collector does with amdsmi_get_gpu_device_uuid)."""
    gpu = labels.get("gpu_id", "")
    hostname = _label(labels, "hostname")
    split = (_label(labels, "gpu_compute_partition_type") or "").lower() in _AMD_SPLIT
    partition = _amd_label(labels, "gpu_partition_id") if split else None
    serial, uuid = _amd_label(labels, "serial_number"), _amd_label(labels, "gpu_uuid")
    return serial or uuid or f"unknown:{hostname or ''}:{gpu}", partition, uuid


def _amd_meta_of(labels: Mapping[str, str]) -> GpuMeta:
    """AMD device-metrics-exporter's labels (pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go populateLabelsFromGPU):
    `gpu_id`, the identity (`amd_identity`), `card_series` (the product name; ROCm 7's exporter writes the board's
    part number in `card_model`, e.g. `102-G30211-0C` beside `AMD Instinct MI300X OAM`, ROCm/device-metrics-exporter
    #236), else `card_model`, `hostname`, and under compute partitioning (cpx/dpx/qpx) `gpu_partition_id`: each
    partition is an instance of its package, as a MIG instance is of its GPU, so the package's power and energy
    count once. Labels a Prometheus server added (`instance`, `job`, `node`: kaiwo's MI300X lines) are not read."""
    gpu = labels["gpu_id"]
    key, partition, device_uuid = amd_identity(labels)
    return GpuMeta(
        gpu_index=int(gpu) if gpu.isdigit() else None,
        gpu_uuid=key,
        gpu_model_name=_amd_label(labels, "card_series") or _amd_label(labels, "card_model"),
        pci_bus_id=_label(labels, "pci_bus_id"),
        device=f"amd{gpu}",
        hostname=_label(labels, "hostname"),
        namespace=_label(labels, "namespace"),
        pod_name=_label(labels, "pod"),
        gpu_instance_id=partition,
        gpu_instance_profile=_label(labels, "gpu_compute_partition_type") if partition is not None else None,
        platform="amd",
        device_uuid=device_uuid,
    )


class PlanEntry(NamedTuple):
    """One record of a plan: its metadata, report keys, and the sample positions and scales behind them."""

    meta: GpuMeta
    keys: tuple[str, ...]
    positions: tuple[int, ...]
    scaled: tuple[tuple[int, float], ...]  # (index in keys, scale) of the few keys whose scale is not 1

    def scales(self) -> list[float]:
        out = [1.0] * len(self.keys)
        for index, scale in self.scaled:
            out[index] = scale
        return out


class _Plan(NamedTuple):
    key: int  # the plan's number, unique within its Normalizer: what caches and sinks key a plan's pages by
    candidates: tuple[int, ...]  # positions of GPU samples with a report key: where absence matters
    candidate_at: bytes  # the same, as the kernel reads them (int32)
    entries: tuple[PlanEntry, ...]
    ratios: tuple[tuple[int, str], ...] = ()  # (position, family) of present `_RATIO` samples: 0-1 by name
    duplicates: tuple[tuple[int, int, str], ...] = ()  # (first, later position, name): one series twice on a page


class CompiledRecords(NamedTuple):
    """A templated page's records as the kernel wrote them: their lines and rows (each record's values as
    native float64, in its entry's key order); `records()` builds the GpuRecords themselves, equal to what
    `Normalizer.records` returns for the page. `plan`: its plan's key (pages of one plan have the same GPUs in
    the same places, the same `entries`)."""

    plan: int
    entries: tuple[PlanEntry, ...]
    lines: bytes
    rows: bytes
    source_url: str
    timestamp_ns: int
    run_id: str | None
    phase: str | None
    scrape_end_ns: int | None

    def identities(self) -> list[tuple[str, str | None]]:
        return [(e.meta.gpu_uuid, e.meta.gpu_instance_id) for e in self.entries]

    def row_views(self) -> list[tuple[PlanEntry, memoryview]]:
        """Each record's entry and its row of values."""
        view = memoryview(self.rows)
        out = []
        offset = 0
        for entry in self.entries:
            width = 8 * len(entry.keys)
            out.append((entry, view[offset: offset + width]))
            offset += width
        return out

    def record(self, entry: PlanEntry, row: memoryview) -> GpuRecord:
        return _record(entry.meta, dict(zip(entry.keys, row.cast("d").tolist(), strict=True)), self.source_url,
                       self.timestamp_ns, self.run_id, self.phase, self.scrape_end_ns)

    def records(self) -> list[GpuRecord]:
        return [self.record(entry, row) for entry, row in self.row_views()]


class UnitAnomaly(NamedTuple):
    """A value its family's name says it cannot have: a `_RATIO` above 1 (a percentage under a DCGM 4.7 name)."""

    family: str
    value: float
    gpu_uuid: str
    source_url: str

    def message(self) -> str:
        return (f"{self.family} = {self.value:g} on {self.gpu_uuid}: a _RATIO field is 0-1 (NVIDIA's field table), "
                f"so this exporter does not write the unit the name says; reported as written (x100), not rescaled "
                f"(said once per family per run)")


DUPLICATE_SERIES_MESSAGE = ("the page holds a series (metric name and labels) twice with different values: the "
                            "first is kept (AIPerf's compat mode keeps the last); check the exporter's collectors")


class DuplicateSeries(NamedTuple):
    """A page that held one series (metric name and label set) twice with different values."""

    source_url: str
    differing: int  # the differing duplicates on the page
    name: str  # the first of them


def duplicate_rule(mode: CounterMode) -> Literal["first", "last"]:
    """Which of a series found twice on a page a run keeps: the first (as Prometheus), the last in AIPerf's mode."""
    return "last" if mode == "aiperf" else "first"


def _differ(a: float, b: float) -> bool:
    return a != b and not (math.isnan(a) and math.isnan(b))


def _present(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value) or is_blank_value(value))


class Normalizer:
    """Keeps, per label set, the GPU metadata it implies (label mappings repeat across scrapes), and one
    compiled plan per page template (and set of absent values)."""

    def __init__(self, table: FieldTable, max_cached: int = 50_000, keep: Literal["first", "last"] = "first") -> None:
        self.table = table
        self.max_cached = max_cached
        self.keep = keep  # which of a series found twice on a page fills its key (module doc)
        self._duplicates: list[DuplicateSeries] = []
        self._meta: dict[frozenset[tuple[str, str]], GpuMeta | None] = {}  # a label set's items -> its GPU
        self._specs: dict[str, FieldSpec | None] = {}
        self._plans: dict[tuple[PageTemplate, frozenset[int]], _Plan] = {}
        self._plan_numbers = count()
        # (plan key, source, run, phase, with an end time or not) -> the record log's line program for its records
        self._programs: dict[tuple[int, str, str | None, str | None, bool], LineProgram] = {}
        # Units come from the names (NVIDIA's table), never from the values: a value that contradicts its
        # name is said once per family per run (`take_anomalies`), and reported as the name says.
        self._anomalous: set[str] = set()
        self._anomalies: list[UnitAnomaly] = []

    def take_anomalies(self) -> list[UnitAnomaly]:
        """The unit anomalies found since the last call (each family at most once per Normalizer, i.e. per run)."""
        out, self._anomalies = self._anomalies, []
        return out

    def take_duplicates(self) -> list[DuplicateSeries]:
        """The pages with differing duplicate series since the last call."""
        out, self._duplicates = self._duplicates, []
        return out

    def _check_duplicates(self, plan: _Plan, value: Callable[[int], float], source_url: str) -> None:
        differing = [name for first, later, name in plan.duplicates if _differ(value(first), value(later))]
        if differing:
            self._duplicates.append(DuplicateSeries(source_url, len(differing), differing[0]))

    def _check_ratios(self, plan: _Plan, value: Callable[[int], float], source_url: str) -> None:
        for position, family in plan.ratios:
            if value(position) > 1.0 and family not in self._anomalous:
                self._anomalous.add(family)
                uuid = next((e.meta.gpu_uuid for e in plan.entries if position in e.positions), "?")
                self._anomalies.append(UnitAnomaly(family, value(position), uuid, source_url))

    def spec_for(self, name: str) -> FieldSpec | None:
        try:
            return self._specs[name]
        except KeyError:
            # AIPerf looks up `name.removesuffix("_total")`: OpenMetrics-style counter names still map.
            spec = spec_for_family(self.table, name)
            self._specs[name] = spec
            return spec

    def _meta_for(self, labels: Mapping[str, str]) -> GpuMeta | None:
        key = frozenset(labels.items())  # (by value: a fraction of `meta_of`'s cost, bench/NOTES.md)
        if key in self._meta:
            return self._meta[key]
        if len(self._meta) > self.max_cached:
            self._meta.clear()
        meta = self._meta[key] = meta_of(labels)
        return meta

    def records(self, page: AnyPage, *, source_url: str, timestamp_ns: int, run_id: str | None = None,
                phase: str | None = None, scrape_end_ns: int | None = None) -> list[GpuRecord]:
        if isinstance(page, TemplatedPage):
            values: Sequence[float] = page.values
            plan = self._plan_for(page)
        else:
            values = [s.value for s in page.samples]
            names = [s.name for s in page.samples]
            labels = [s.labels for s in page.samples]
            plan = self._compile(names, labels, lambda i: _present(values[i]))
        if plan.ratios:
            self._check_ratios(plan, values.__getitem__, source_url)
        if plan.duplicates:
            self._check_duplicates(plan, values.__getitem__, source_url)
        get = values.__getitem__
        out = []
        for entry in plan.entries:
            data = list(map(get, entry.positions))
            for index, scale in entry.scaled:  # most report keys are the exporter's value as is
                data[index] *= scale
            out.append(_record(entry.meta, dict(zip(entry.keys, data, strict=True)), source_url, timestamp_ns,
                               run_id, phase, scrape_end_ns))
        return out

    def compiled(self, page: AnyPage, *, source_url: str, timestamp_ns: int, run_id: str | None = None,
                 phase: str | None = None, scrape_end_ns: int | None = None) -> CompiledRecords | None:
        """`records` by the compiled kernel, for a templated page: its record lines and rows in one C call, the
        records built only when asked. None without the kernel or for a page it does not take (then `records`)."""
        if not kernel.running() or not isinstance(page, TemplatedPage):
            return None
        plan = self._plan_for(page)
        key = (plan.key, source_url, run_id, phase, scrape_end_ns is not None)
        program = self._programs.get(key)
        if program is None:
            if len(self._programs) > 256:
                self._programs.clear()
            program = self._programs[key] = self._line_program(plan, *key[1:])
        if plan.ratios:
            self._check_ratios(plan, page.value_getter(), source_url)
        if plan.duplicates:
            self._check_duplicates(plan, page.value_getter(), source_url)
        lines, rows = kernel.records_of(*program, page.raw, timestamp_ns, scrape_end_ns)
        return CompiledRecords(plan.key, plan.entries, lines, rows, source_url, timestamp_ns, run_id, phase,
                               scrape_end_ns)

    @staticmethod
    def _line_program(plan: _Plan, source_url: str, run_id: str | None, phase: str | None,
                      has_end: bool) -> LineProgram:
        """The record log's line program for a plan's records (bridge/record_log.py lays the lines out)."""
        def shape(entry: PlanEntry) -> GpuRecord:  # (its times and values are not read)
            return _record(entry.meta, dict.fromkeys(entry.keys, 0.0), source_url, 0, run_id, phase,
                           0 if has_end else None)

        return line_program((line_pieces(shape(e)), e.positions, e.scales()) for e in plan.entries)

    def _plan_for(self, page: TemplatedPage) -> _Plan:
        template = page.template
        plans = self._plans
        plan = plans.get((template, frozenset()))
        if plan is None:
            if len(plans) > 256:
                plans.clear()
            plan = plans[(template, frozenset())] = self._compile(template.names, template.labels, lambda i: True)
        if kernel.running():
            blanks = kernel.blank_at(page.raw, plan.candidate_at, _BLANKS, True)
            if not blanks:
                return plan
            absent = frozenset(blanks)
        else:
            values = page.values
            candidates = list(map(values.__getitem__, plan.candidates))
            total = sum(candidates)
            if total - total == 0.0 and BLANK_VALUES.isdisjoint(candidates):  # all finite, none a sentinel
                return plan
            absent = frozenset(i for i in plan.candidates if not _present(values[i]))
        found = plans.get((template, absent))
        if found is None:
            found = plans[(template, absent)] = self._compile(template.names, template.labels,
                                                              lambda i: i not in absent)
        return found

    def _compile(self, names: Sequence[str], labels: Sequence[Mapping[str, str]],
                 present: Callable[[int], bool]) -> _Plan:
        """The rules, over sample positions: which sample fills which key of which record."""
        metas: dict[GpuIdentity, GpuMeta] = {}
        slots: dict[GpuIdentity, dict[str, tuple[int, float]]] = {}
        parent_fallback: dict[GpuIdentity, dict[str, tuple[int, float]]] = {}
        candidates: list[int] = []
        ratios: list[tuple[int, str]] = []
        first_of: dict[tuple[str, frozenset[tuple[str, str]]], int] = {}
        duplicates: list[tuple[int, int, str]] = []
        for position, (name, label_set) in enumerate(zip(names, labels, strict=True)):
            spec = self.spec_for(name)
            if spec is None:
                continue
            meta = self._meta_for(label_set)
            if meta is None:
                continue
            candidates.append(position)
            if not present(position):
                continue
            first = first_of.setdefault((name, frozenset(label_set.items())), position)
            if first != position:
                duplicates.append((first, position, name))
                if self.keep == "first":
                    continue
            if name.endswith("_RATIO"):
                ratios.append((position, name))
            slot = (position, spec.scale)
            if meta.gpu_instance_id is not None and spec.level == "device":
                # Device-level field repeated on a MIG instance series: the parent's, counted once.
                parent = GpuIdentity(meta.gpu_uuid, None)
                if parent not in metas:
                    metas[parent] = replace(meta, gpu_instance_id=None, gpu_instance_profile=None, device_uuid=None)
                fallback = parent_fallback.setdefault(parent, {})
                if meta.gpu_instance_id == "0":  # AMD partition 0 carries the package's sensors, the others 0
                    fallback[spec.key] = slot
                else:
                    fallback.setdefault(spec.key, slot)
                continue
            identity = GpuIdentity(meta.gpu_uuid, meta.gpu_instance_id)
            if identity not in metas or identity in parent_fallback and identity not in slots:
                metas[identity] = meta
            slots.setdefault(identity, {})[spec.key] = slot
        for identity, fallback in parent_fallback.items():
            merged = slots.setdefault(identity, {})
            for key, slot in fallback.items():
                merged.setdefault(key, slot)
        entries = tuple(
            PlanEntry(metas[identity], tuple(data), tuple(p for p, _ in data.values()),
                   tuple((k, scale) for k, (_, scale) in enumerate(data.values()) if scale != 1.0))
            for identity, data in slots.items()
            if data
        )
        return _Plan(next(self._plan_numbers), tuple(candidates), pack_ints(candidates), entries, tuple(ratios),
                     tuple(duplicates))


def _record(meta: GpuMeta, data: dict[str, float], source_url: str, timestamp_ns: int, run_id: str | None,
            phase: str | None, scrape_end_ns: int | None) -> GpuRecord:
    return GpuRecord.of(meta, timestamp_ns=timestamp_ns, telemetry_source_url=source_url,
                        telemetry_data=data, run_id=run_id, phase=phase, scrape_start_ns=timestamp_ns,
                        scrape_end_ns=scrape_end_ns)
