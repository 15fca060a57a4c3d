"""What a page that yields no GPU is, in one line a user can act on: `dcgm-bridge parse` exits 2 with it, and the
sidecar marks the endpoint `unreadable` with it (bridge/health.py).

    a page with a GPU's series (a family the report maps, or a sample whose labels name a GPU)  → None: a GPU page
    samples, none of a GPU                         → the families seen; none is GPU telemetry (another vendor, a
                                                     renamed exporter)
    no sample, families declared (HELP/TYPE)       → the exporter sees no GPU, and the likely causes
    no sample, nothing declared                    → not a metrics page (HTML, JSON, …)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from bridge.fields import AMD_PREFIX, FieldTable, spec_for_family
from bridge.normalize import meta_of
from bridge.parse import AnyPage
from bridge.samples import GpuRecord

# A page's family names shown in a message: the first few, then how many more.
_SHOWN = 6

# NVIDIA/dcgm-exporter issue 222: on a GKE node whose GPUs are time-shared (or held by another device plugin) the
# exporter declares every family and serves no sample, because DCGM sees no GPU it may watch.
NO_GPU_CAUSES = ("no GPU visible to the exporter: its pod not given the GPUs (GKE time-sharing, NVIDIA/dcgm-exporter "
                 "issue 222), a node without GPUs, or the driver not loaded; check the exporter's log")


def names_text(names: Iterable[str]) -> str:
    unique = list(dict.fromkeys(names))
    shown = ", ".join(unique[:_SHOWN])
    return shown + (f", and {len(unique) - _SHOWN} more" if len(unique) > _SHOWN else "")


def page_kind(body: bytes) -> str:
    """What a page that holds no sample looks like, for the one-line error."""
    head = body.lstrip()[:512].lower()
    if head.startswith((b"<!doctype html", b"<html")) or b"<html" in head:
        return "it looks like HTML"
    if head.startswith((b"{", b"[")):
        return "it looks like JSON: a report? `dcgm-bridge report` reads the record log"
    return "no line has the form name{labels} value"


def is_gpu_sample(name: str, labels: Mapping[str, str], table: FieldTable) -> bool:
    """A sample of GPU telemetry: its family is one the report maps, or its labels name a GPU (`gpu`, `gpu_id`)."""
    return spec_for_family(table, name) is not None or meta_of(labels) is not None


def no_gpu_reason(page: AnyPage, body: bytes, table: FieldTable) -> str | None:
    """Why `page` (parsed from `body`) holds no GPU telemetry, or None when it holds some."""
    if any(is_gpu_sample(s.name, s.labels, table) for s in page.samples):
        return None
    if page.samples:
        families = list(dict.fromkeys(s.name for s in page.samples))
        nodes = next((s for s in page.samples if s.name.removeprefix(AMD_PREFIX) == "gpu_nodes_total"), None)
        amd = (f" (AMD's exporter counts {nodes.value:g} GPUs on its node, {nodes.name}, but serves no per-GPU "
               "sample: check its field configuration)") if nodes is not None else ""
        return (f"{len(page.samples)} samples in {len(families)} families, none of them GPU telemetry{amd}; saw "
                f"{names_text(families)}; give a dcgm-exporter or AMD device-metrics-exporter /metrics page, or map "
                "the families with --metrics-csv")
    declared = [*page.types, *(name for name in page.helps if name not in page.types)]
    if declared:
        return (f"the exporter serves no sample: it declares {len(declared)} families ({names_text(declared)}) but "
                f"reports none, so it sees no GPU; likely {NO_GPU_CAUSES}")
    return (f"not a metrics page: no sample in its {len(page.dropped)} lines ({page_kind(body)}); give a "
            "dcgm-exporter /metrics URL or a page it served")


# AMD's exporter writes `gpu_energy_consumed` 0 where the GPU's energy counter is not supported: a consumer RX 7900
# XTX's page reads 0 beside real memory figures (ROCm/device-metrics-exporter issue #259); amdsmi's counter is 0 on
# such parts too. A 0 is "unsupported", never 0 J (the report's verdict: `counter_unsupported`).
AMD_ENERGY_KEY = "amd_energy_consumption"


def unsupported_energy(records: Iterable[GpuRecord]) -> list[str]:
    """One warning per AMD GPU whose energy counter reads 0 (unsupported on that GPU), for `parse`."""
    return [f"{r.gpu_uuid}: gpu_energy_consumed is 0, which AMD's exporter writes where the GPU's energy counter is "
            "not supported (ROCm/device-metrics-exporter issue #259, an RX 7900 XTX); a report says unsupported, "
            "never 0 J" for r in records if r.platform == "amd" and r.telemetry_data.get(AMD_ENERGY_KEY) == 0.0]
