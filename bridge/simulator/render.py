"""A snapshot → the exposition text, exactly as dcgm-exporter writes it (NVIDIA/dcgm-exporter
`internal/pkg/rendermetrics/render_metrics.go`).

Per series `NAME{labels} ` is built once per layout; a request only formats values. Label order is the
exporter's: gpu, UUID, pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID][, Hostname], then the
sorted Labels map (DCGM_FI_DRIVER_VERSION), then the sorted Attributes map (container, err_code, err_msg,
namespace, pod). Values: INT as %d, DOUBLE as %f. Label values are never escaped (neither are they by
the exporter). Families in DCGM field-ID order; a family without samples is not written at all.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from bridge.simulator.model import Entity, NodeModel, Snapshot, Value
from bridge.simulator.schema import (
    AMD_FAMILIES,
    BLANK_FP64,
    BLANK_INT32,
    BLANK_INT64,
    BLANK_STRING,
    DIALECTS,
    FIELDS,
    DialectSpec,
    family_name,
    xid_message,
)

XID = "DCGM_FI_DEV_XID_ERRORS"
GARBAGE_LINE = "garbage injected by the simulator {{{ not a sample\n"
PADDING_FAMILY = "DCGM_FI_SIMULATOR_PADDING"
# The fault "sentinels" leaks one blank value of each kind, as pre-2023 exporters did.
SENTINEL_VALUES = {
    "DCGM_FI_DEV_MEMORY_TEMP": BLANK_INT64,
    "DCGM_FI_DEV_GPU_UTIL": BLANK_INT32,
    "DCGM_FI_DEV_POWER_USAGE": BLANK_FP64,
}
LabelPairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class PageMods:
    """Ways a faulty exporter damages an otherwise good page."""

    sentinels_gpu: int | None = None  # blank values and a <<<NULL>>> label on this GPU's series
    quote_gpu: int | None = None  # an unescaped `"` in this GPU's modelName
    garbage: bool = False  # a line that is no sample, mid-page


NO_MODS = PageMods()


@dataclass(frozen=True, slots=True)
class Family:
    key: str  # legacy field name: the snapshot key
    header: str  # "# HELP …\n# TYPE …\n", or "" without headers
    integer: bool
    scale: int | float
    rows: tuple[tuple[int, str], ...]  # (entity index, "NAME{labels} ")
    sample_name: str  # NAME, or NAME_total for an OpenMetrics counter


@dataclass(frozen=True, slots=True)
class Layout:
    spec: DialectSpec
    families: tuple[Family, ...]
    labels: tuple[LabelPairs, ...]  # per entity
    trailer: str  # "# EOF\n" in OpenMetrics
    overrides: Mapping[int, Mapping[str, str]]  # label values replaced per GPU index (damaged pages)


def entity_labels(model: NodeModel, index: int, spec: DialectSpec, attrs: Mapping[str, str] = {},
                  overrides: Mapping[str, str] = {}) -> LabelPairs:
    """One entity's labels in the exporter's order; `overrides` replaces values by label key."""
    cfg, entity = model.config, model.entities[index]
    gpu = model.gpus[entity.gpu]
    if spec.naming == "amd":
        return amd_labels(model, index, spec, overrides)
    pairs = [("gpu", str(gpu.index)), (spec.uuid_label, gpu.uuid), ("pci_bus_id", gpu.pci_bus_id),
             ("device", gpu.device), ("modelName", cfg.model_name)]
    if entity.instance_id is not None:
        pairs += [("GPU_I_PROFILE", entity.profile or ""), ("GPU_I_ID", str(entity.instance_id))]
    if not cfg.no_hostname:
        pairs.append((spec.host_label, model.hostname))
    labels = {spec.driver_label: cfg.driver_version}
    attributes = dict(attrs)
    if cfg.pod_labels != "none":
        pod_key, ns_key, container_key = spec.pod_keys
        mapped = cfg.pod_labels == "mapped"
        attributes[pod_key] = f"llm-server-{index // cfg.gpus_per_pod}" if mapped else ""
        attributes[ns_key] = cfg.namespace if mapped else ""
        attributes[container_key] = "vllm" if mapped else ""
    pairs += sorted(labels.items()) + sorted(attributes.items())
    pairs = [(k, overrides.get(k, v)) for k, v in pairs]
    return tuple(sorted(pairs) if spec.sort_labels else pairs)


# AMD device-metrics-exporter's label sets as real pages carry them (populateLabelsFromGPU; sorted, as client_golang
# writes them), constant values as captured: 2025 from ROCm/device-metrics-exporter PR #236 (8x MI300X OAM,
# ROCm 7, k8s), 2026 from PR #558 (bare metal MI300X, ROCm 7.14: `deployment_mode`, no gpu_uuid, partition type
# "none"). Serials are 12 digits as real ones ("692407004236"); gpu_uuid has the real ones' shape.
AMD_LABEL_SETS: Mapping[int, Mapping[str, str]] = MappingProxyType({
    2025: MappingProxyType({"card_model": "102-G30211-0C", "card_series": "AMD Instinct MI300X OAM",
                            "card_vendor": "AMD", "cluster_name": "amdgpu-k8s-metrics-exporter", "container": "",
                            "driver_version": "6.14.14", "gpu_compute_partition_type": "spx",
                            "gpu_memory_partition_type": "nps1", "gpu_partition_id": "NA", "job_id": "",
                            "job_partition": "", "job_user": "", "namespace": "", "pod": "",
                            "vbios_version": "022.040.003.042.000001"}),
    2026: MappingProxyType({"card_model": "102-G30211-00", "container": "", "deployment_mode": "baremetal",
                            "gpu_compute_partition_type": "none", "gpu_memory_partition_type": "nps1",
                            "gpu_partition_id": "0", "job_id": "", "job_partition": "", "job_user": "",
                            "namespace": "", "pod": ""}),
})


def amd_labels(model: NodeModel, index: int, spec: DialectSpec, overrides: Mapping[str, str] = {}) -> LabelPairs:
    """One AMD GPU's labels: its label set's constants, its own gpu_id, serial, gpu_uuid (2025) and hostname,
    and the pod's labels where the config maps pods."""
    cfg, gpu = model.config, model.gpus[model.entities[index].gpu]
    h = gpu.uuid.removeprefix("GPU-").replace("-", "")
    labels = dict(AMD_LABEL_SETS[spec.amd_labels])
    labels.update(gpu_id=str(gpu.index), serial_number=f"6924{int(h[:8], 16) % 10**8:08d}")
    if spec.amd_labels == 2025:
        labels["gpu_uuid"] = f"{h[:2]}ff74a1-0000-1000-80{h[2:4]}-{h[4:16]}"
    if not cfg.no_hostname:
        labels["hostname"] = model.hostname
    if cfg.pod_labels == "mapped":
        labels.update(pod=f"llm-server-{index // cfg.gpus_per_pod}", namespace=cfg.namespace, container="vllm")
    labels.update((k, v) for k, v in overrides.items() if k in labels)
    return tuple(sorted(labels.items()))


def format_labels(pairs: LabelPairs, spec: DialectSpec) -> str:
    return spec.separator.join(f'{k}="{v}"' for k, v in pairs)


def build_layout(model: NodeModel, overrides: Mapping[int, Mapping[str, str]] = {}) -> Layout:
    """Everything about a page that does not change between requests. `overrides`: per GPU index."""
    cfg = model.config
    spec = DIALECTS[cfg.dialect]
    labels = tuple(entity_labels(model, i, spec, overrides=overrides.get(e.gpu, {}))
                   for i, e in enumerate(model.entities))
    families = []
    for field in FIELDS:
        name = family_name(field, spec.naming)
        if name is None or (cfg.counters == "default" and not field.default):
            continue
        name = spec.prefix + name
        si = spec.naming in ("si", "si410")
        amd = AMD_FAMILIES.get(field.key) if spec.naming == "amd" else None
        if amd is not None:  # every AMD family is a gauge; the scale takes the value to its unit
            header = f"# HELP {name} {amd[2]}\n# TYPE {name} gauge\n"
            rows = tuple((i, f"{name}{{{format_labels(labels[i], spec)}}} ") for i in range(len(model.entities)))
            families.append(Family(field.key, header, field.integer and amd[1] in (1, 1000), amd[1], rows, name))
            continue
        header = ""
        if spec.headers:
            header = f"# HELP {name} {field.si_help if si else field.help}\n# TYPE {name} {field.prom_type}\n"
        counter_suffix = "_total" if spec.openmetrics and field.prom_type == "counter" else ""
        sample_name = name + counter_suffix
        rows = tuple(
            (i, f"{sample_name}{{{format_labels(labels[i], spec)}}} ")
            for i, entity in enumerate(model.entities)
            if _has_field(entity, field.mig)
        )
        families.append(Family(
            field.key, header, field.si_integer if si else field.integer, field.si_scale if si else 1, rows,
            sample_name,
        ))
    return Layout(spec, tuple(families), labels, "# EOF\n" if spec.openmetrics else "", overrides)


def _has_field(entity: Entity, mig: str) -> bool:
    return entity.instance_id is None or mig != "whole-gpu"


class PageRenderer:
    """Renders pages for one model; holds the layout caches (plain and per damage)."""

    def __init__(self, model: NodeModel) -> None:
        self.model = model
        self.layout = build_layout(model)
        self._layouts: dict[tuple[int | None, int | None], Layout] = {(None, None): self.layout}
        self._xid_prefixes: dict[tuple[int, int, int | None, int | None], str] = {}
        self._last: tuple[tuple[int, int], bytes] | None = None
        self._lock = threading.Lock()

    def page(self, t_ns: int, mods: PageMods = NO_MODS) -> bytes:
        """The page a request at `t_ns` gets. Undamaged pages are cached per DCGM refresh instant."""
        version = self.model.version  # read first: an event landing meanwhile must not be cached as old
        snap = self.model.snapshot(t_ns)
        key = (snap.t_ns, version)
        last = self._last
        if mods == NO_MODS and last is not None and last[0] == key:
            return last[1]
        body = self.render(snap, mods).encode()
        if mods == NO_MODS:
            self._last = (key, body)
        return body

    def render(self, snap: Snapshot, mods: PageMods = NO_MODS) -> str:
        layout = self._layout_for(mods)
        values = snap.values
        ts = _timestamp(snap.t_ns, layout.spec) if self.model.config.timestamps else ""
        blanks: dict[tuple[str, int], str] = {}
        if mods.sentinels_gpu is not None:
            blanks = {(key, i): text for i, e in enumerate(self.model.entities)
                      if e.gpu == mods.sentinels_gpu for key, text in SENTINEL_VALUES.items()}
        parts: list[str] = []
        for family in layout.families:
            key, scale = family.key, family.scale
            rows = self._xid_rows(family, layout, values, mods) if key == XID else family.rows
            if blanks:
                lines = [f"{prefix}{blanks.get((key, i)) or _format(values[i][key], family)}{ts}\n"
                         for i, prefix in rows if key in values[i]]
            elif family.integer:
                lines = [f"{prefix}{values[i][key] * scale:d}{ts}\n"
                         for i, prefix in rows if key in values[i]]
            else:
                lines = [f"{prefix}{values[i][key] * scale:f}{ts}\n"
                         for i, prefix in rows if key in values[i]]
            if lines:
                parts.append(family.header + "".join(lines))
        if mods.garbage:
            parts.insert(len(parts) // 2, GARBAGE_LINE)
        parts.append(layout.trailer)
        return "".join(parts)

    def _layout_for(self, mods: PageMods) -> Layout:
        key = (mods.sentinels_gpu, mods.quote_gpu)
        with self._lock:
            layout = self._layouts.get(key)
            if layout is None:
                overrides: dict[int, dict[str, str]] = {}
                if mods.sentinels_gpu is not None:
                    # A blank string field leaks as <<<NULL>>> (GPU_I_PROFILE in gpu-monitoring-tools#193).
                    blank = {DIALECTS[self.model.config.dialect].driver_label: BLANK_STRING}
                    if self.model.config.mig:
                        blank["GPU_I_PROFILE"] = BLANK_STRING
                    overrides[mods.sentinels_gpu] = blank
                if mods.quote_gpu is not None:
                    quoted = self.model.config.model_name.replace(" ", ' "', 1) + '"'
                    overrides.setdefault(mods.quote_gpu, {})["modelName"] = quoted
                layout = self._layouts[key] = build_layout(self.model, overrides)
            return layout

    def _xid_rows(self, family: Family, layout: Layout, values: tuple[dict[str, Value], ...],
                  mods: PageMods) -> list[tuple[int, str]]:
        """XID series carry err_code/err_msg attributes (#309), so their labels depend on the code."""
        rows = []
        for i, _ in family.rows:
            code = values[i].get(XID)
            if code is None:
                continue
            cache_key = (i, int(code), mods.sentinels_gpu, mods.quote_gpu)
            prefix = self._xid_prefixes.get(cache_key)
            if prefix is None:
                attrs = {"err_code": str(code), "err_msg": xid_message(int(code))}
                overrides = layout.overrides.get(self.model.entities[i].gpu, {})
                pairs = entity_labels(self.model, i, layout.spec, attrs, overrides)
                labels = format_labels(pairs, layout.spec)
                prefix = self._xid_prefixes[cache_key] = f"{family.sample_name}{{{labels}}} "
            rows.append((i, prefix))
        return rows


def _format(value: Value, family: Family) -> str:
    scaled = value * family.scale
    return f"{scaled:d}" if family.integer else f"{scaled:f}"


def _timestamp(t_ns: int, spec: DialectSpec) -> str:
    ms = t_ns // 1_000_000
    return f" {ms // 1000}.{ms % 1000:03d}" if spec.openmetrics else f" {ms}"


def padded_page(
    page: bytes, size_bytes: int, layout: Layout, chunk_lines: int = 512
) -> tuple[int, Iterator[bytes]]:
    """The page grown to about `size_bytes` with valid-looking padding samples, as (length, chunks).

    Lines have a fixed width so the length is known up front and nothing large is ever built.
    """
    trailer = layout.trailer.encode()
    head = page[: len(page) - len(trailer)] if trailer else page
    labels = format_labels(layout.labels[0], layout.spec)
    width = len(f'{PADDING_FAMILY}{{{labels},pad="000000000"}} 0\n'.encode())
    count = max(0, (size_bytes - len(page)) // width)

    def chunks() -> Iterator[bytes]:
        yield head
        for start in range(0, count, chunk_lines):
            stop = min(count, start + chunk_lines)
            lines = (f'{PADDING_FAMILY}{{{labels},pad="{n:09d}"}} 0\n' for n in range(start, stop))
            yield "".join(lines).encode()
        yield trailer

    return len(head) + count * width + len(trailer), chunks()


def render_page(model: NodeModel, t_ns: int, mods: PageMods = NO_MODS) -> bytes:
    """One page at simulated time `t_ns`, without a server (`simulate --once`, tests, benches)."""
    return PageRenderer(model).page(t_ns, mods)
