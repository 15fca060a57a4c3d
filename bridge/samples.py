"""The records that cross the pipeline's stages.

scrape ──bytes──▶ parse ──ParsedPage(samples)──▶ normalize ──GpuRecord──▶ record log / report

Everything here is immutable. Label mappings are read-only views shared between
scrapes (the parser caches them by their raw bytes), so no stage may mutate them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, Literal, NamedTuple, Protocol, get_args


class Sample(NamedTuple):
    """One exposition line as written: the parser neither renames nor drops sentinels."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None = None


class SourcePage(Protocol):
    """A page as a source hands it to the pipeline (sidecar/pipeline.py `Pipeline.on_page(source, page)`): the
    bytes of a Prometheus text page (DCGM field names) and its sample time. An HTTP exporter's is fetch.py's
    `FetchedPage`; a local reader (NVML, AMD SMI) hands one too, through sources/runner.py's `SourceFetcher`,
    under a source name such as `pynvml://localhost`. Everything after this point is the same for every kind of
    source."""

    @property
    def body(self) -> bytes: ...
    @property
    def start_ns(self) -> int: ...  # wall clock when the sample was taken: the sample time
    @property
    def end_ns(self) -> int: ...  # wall clock when the page was complete
    @property
    def content_type(self) -> str: ...


class Dropped(NamedTuple):
    """A line the parser could not read; the rest of the page survives it."""

    line: int  # 1-based line number in the page
    text: str
    reason: str


class ParsedPage(NamedTuple):
    samples: list[Sample]
    types: Mapping[str, str]  # family name -> "gauge" | "counter" | "untyped" | ...
    helps: Mapping[str, str]  # family name -> HELP text (escapes resolved)
    dropped: list[Dropped]


class MetricKind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    CODE = "code"  # a value that is a code, not a quantity (DCGM_FI_DEV_XID_ERRORS): last value wins


@dataclass(frozen=True, slots=True)
class GpuMeta:
    """What a GPU (or MIG instance) is, from its series' labels (bridge/normalize.py `meta_of`): the metadata
    fields of every `GpuRecord`, defined here once.

    AIPerf's record (`TelemetryRecord`, AIPerf 0.13.0, ai-dynamo/aiperf
    `src/aiperf/common/models/telemetry_models.py`) has the first eight, in this order; the MIG instance is ours.
    """

    gpu_index: int | None
    gpu_uuid: str
    gpu_model_name: str | None
    pci_bus_id: str | None
    device: str | None
    hostname: str | None
    namespace: str | None
    pod_name: str | None
    gpu_instance_id: str | None = None
    gpu_instance_profile: str | None = None
    platform: str = "nvidia"  # "amd" for AMD's exporter and amdsmi
    # The device's own UUID where the source has one and `gpu_uuid`, the identity, may be another name: an AMD GPU
    # is keyed by its board serial (a local amdsmi and the exporter name it alike), the report shows the device
    # UUID (normalize.amd_identity).
    device_uuid: str | None = None

    @property
    def identity(self) -> tuple[str, str | None]:
        """GPU UUID plus MIG instance: never the index alone."""
        return (self.gpu_uuid, self.gpu_instance_id)


GPU_META_FIELDS = tuple(f.name for f in fields(GpuMeta))


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuRecord(GpuMeta):
    """One GPU (or MIG instance) in one scrape: a line of gpu_telemetry_export.jsonl (bridge/record_log.py
    writes AIPerf's keys in AIPerf's order, then ours): its metadata, then what the scrape read."""

    timestamp_ns: int
    telemetry_source_url: str  # redacted
    telemetry_data: Mapping[str, float]  # report key -> value in report units
    run_id: str | None = None
    phase: str | None = None
    scrape_start_ns: int | None = None
    scrape_end_ns: int | None = None

    @classmethod
    def of(cls, meta: GpuMeta, **scrape: Any) -> GpuRecord:
        """A record of the GPU `meta` describes; `scrape`: the fields past the metadata, by name."""
        return cls(*[getattr(meta, name) for name in GPU_META_FIELDS], **scrape)


# The kinds, defined once: the events file (events.py), the config, the report and the sidecar use these.
CounterMode = Literal["interpolated", "aiperf"]  # DECISIONS.md "Counters"
COUNTER_MODES: tuple[CounterMode, ...] = get_args(CounterMode)
DEFAULT_COUNTER_MODE: CounterMode = "interpolated"
PhaseKind = Literal["warmup", "profiling", "cooldown"]
PHASE_KINDS: tuple[PhaseKind, ...] = get_args(PhaseKind)
PhaseEvent = Literal["start", "end"]
PHASE_EVENTS: tuple[PhaseEvent, ...] = get_args(PhaseEvent)
FetchErrorKind = Literal["connect", "timeout", "http_status", "content_type", "too_large", "truncated", "empty"]
# a failed scrape, a page whose lines could not be read, a value contradicting its name's unit (issue 14), or a
# page holding one series twice with different values (issue 27; not a failed scrape: its page was used)
FailureKind = Literal[FetchErrorKind, "parse", "unit", "duplicate_series"]
FAILURE_KINDS: tuple[FailureKind, ...] = (*get_args(FetchErrorKind), "parse", "unit", "duplicate_series")
NOT_FAILED_SCRAPES: frozenset[str] = frozenset({"duplicate_series"})  # kinds whose scrape brought its sample
EndpointStateKind = Literal["up", "down", "duplicate"]  # duplicate: serves the same GPUs as another (select.py)
ENDPOINT_STATES: tuple[EndpointStateKind, ...] = get_args(EndpointStateKind)
SessionState = Literal["created", "configured", "collecting", "completed"]


class PhaseMark(NamedTuple):
    """A phase boundary as the benchmark saw it: `time_ns` is its own wall-clock boundary time."""

    name: str
    kind: PhaseKind
    event: PhaseEvent
    time_ns: int


class ScrapeFailure(NamedTuple):
    """A failed scrape: an event that reaches the report's error_summary; the loop goes on."""

    endpoint: str  # redacted URL
    time_ns: int
    kind: FailureKind
    message: str
