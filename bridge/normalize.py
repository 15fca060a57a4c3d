"""Parsed samples → one GpuRecord per GPU (or MIG instance) per scrape.

Rules (dcgm-exporter.md §6, aiperf-compat.md §13):
- identity is the GPU UUID (`UUID`, or `uuid` under `-o`) plus `GPU_I_ID` for a MIG instance, never the
  index alone; a GPU without UUID or model name is recorded under a fallback identity and never costs
  the other GPUs their data (AIPerf drops the whole scrape);
- blank sentinels and empty label values mean "absent", never zero; NaN/±Inf are absent too;
- under MIG, device-level fields repeat on every instance series: they belong to the parent GPU only;
- NvLink / NvSwitch / CPU entity lines are not GPUs (they are still forwarded as OTLP, not here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from bridge.fields import FieldSpec, FieldTable, is_blank_label, is_blank_value
from bridge.samples import GpuRecord, ParsedPage

_NOT_GPU_LABELS = ("nvlink", "nvswitch", "cpucore")


class GpuIdentity(NamedTuple):
    uuid: str
    instance_id: str | None


class GpuMeta(NamedTuple):
    gpu_index: int | None
    gpu_uuid: str
    gpu_model_name: str | None
    pci_bus_id: str | None
    device: str | None
    hostname: str | None
    namespace: str | None
    pod_name: str | None
    instance_id: str | None
    instance_profile: str | None


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = labels.get(name)
        if value is not None and not is_blank_label(value):
            return value
    return None


def meta_of(labels: Mapping[str, str]) -> GpuMeta | None:
    """GPU metadata from a series' labels, in every dialect; None for a line that is not a GPU."""
    gpu = labels.get("gpu")
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
        instance_id=_label(labels, "GPU_I_ID"),
        instance_profile=_label(labels, "GPU_I_PROFILE"),
    )


class Normalizer:
    """Keeps, per label set, the GPU metadata it implies (label mappings repeat across scrapes)."""

    def __init__(self, table: FieldTable, max_cached: int = 50_000) -> None:
        self.table = table
        self.max_cached = max_cached
        self._meta: dict[int, tuple[Mapping[str, str], GpuMeta | None]] = {}
        self._specs: dict[str, FieldSpec | None] = {}

    def spec_for(self, name: str) -> FieldSpec | None:
        try:
            return self._specs[name]
        except KeyError:
            # AIPerf looks up `name.removesuffix("_total")`: OpenMetrics-style counter names still map.
            spec = self.table.by_name.get(name) or self.table.by_name.get(name.removesuffix("_total"))
            self._specs[name] = spec
            return spec

    def _meta_for(self, labels: Mapping[str, str]) -> GpuMeta | None:
        entry = self._meta.get(id(labels))
        if entry is not None and entry[0] is labels:
            return entry[1]
        if len(self._meta) > self.max_cached:
            self._meta.clear()
        meta = meta_of(labels)
        self._meta[id(labels)] = (labels, meta)  # holding `labels` keeps its id from being reused
        return meta

    def records(self, page: ParsedPage, *, source_url: str, timestamp_ns: int, run_id: str | None = None,
                phase: str | None = None, scrape_end_ns: int | None = None) -> list[GpuRecord]:
        metas: dict[GpuIdentity, GpuMeta] = {}
        values: dict[GpuIdentity, dict[str, float]] = {}
        parent_fallback: dict[GpuIdentity, dict[str, float]] = {}
        for sample in page.samples:
            spec = self.spec_for(sample.name)
            if spec is None:
                continue
            value = sample.value
            if math.isnan(value) or math.isinf(value) or is_blank_value(value):
                continue
            meta = self._meta_for(sample.labels)
            if meta is None:
                continue
            if meta.instance_id is not None and spec.level == "device":
                # Device-level field repeated on a MIG instance series: the parent's, counted once.
                parent = GpuIdentity(meta.gpu_uuid, None)
                if parent not in metas:
                    parent_fallback.setdefault(parent, {})
                    metas.setdefault(parent, meta._replace(instance_id=None, instance_profile=None))
                parent_fallback[parent].setdefault(spec.key, value * spec.scale)
                continue
            identity = GpuIdentity(meta.gpu_uuid, meta.instance_id)
            if identity not in metas or identity in parent_fallback and identity not in values:
                metas[identity] = meta
            values.setdefault(identity, {})[spec.key] = value * spec.scale
        for identity, fallback in parent_fallback.items():
            merged = values.setdefault(identity, {})
            for key, value in fallback.items():
                merged.setdefault(key, value)
        return [
            _record(metas[identity], data, source_url, timestamp_ns, run_id, phase, scrape_end_ns)
            for identity, data in values.items()
            if data
        ]


def _record(meta: GpuMeta, data: dict[str, float], source_url: str, timestamp_ns: int, run_id: str | None,
            phase: str | None, scrape_end_ns: int | None) -> GpuRecord:
    return GpuRecord(
        gpu_index=meta.gpu_index,
        gpu_uuid=meta.gpu_uuid,
        gpu_model_name=meta.gpu_model_name,
        pci_bus_id=meta.pci_bus_id,
        device=meta.device,
        hostname=meta.hostname,
        namespace=meta.namespace,
        pod_name=meta.pod_name,
        platform="nvidia",
        timestamp_ns=timestamp_ns,
        telemetry_source_url=source_url,
        telemetry_data=data,
        gpu_instance_id=meta.instance_id,
        gpu_instance_profile=meta.instance_profile,
        run_id=run_id,
        phase=phase,
        scrape_start_ns=timestamp_ns,
        scrape_end_ns=scrape_end_ns,
    )
