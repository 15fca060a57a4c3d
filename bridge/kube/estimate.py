"""Memory of the controller pod by component (a display heuristic for the benchmark, like AIPerf's estimator),
and the sidecar's CPU and memory from a model fitted to bench measurements (`sidecar_model`).

The GPU-telemetry component follows the seed's rule: it is 0 when telemetry is disabled *or* when no
`--gpu-telemetry` URL was given, because the built-in localhost defaults never count (in a pod they
point at the pod itself, which runs no exporter). That is display only: with telemetry enabled and no
URL the sidecar still runs and still tries the defaults; `--no-gpu-telemetry` is what removes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bridge.kube.validate import quantity_value

MIB = 2**20
# AIPerf runs a controller, dataset, timing, records and worker processes: ~10 interpreters with
# numpy/pydantic/zmq loaded, measured at 100-180 MiB RSS each.
BENCHMARK_BASE_MIB = 1536
INFLIGHT_KIB_STREAMING = 256  # SSE chunks are kept per request until the response completes
INFLIGHT_KIB_TEXT = 64
RECORD_KIB = 4  # one parsed request record held by the records manager
DEFAULT_GPUS_PER_ENDPOINT = 8
DEFAULT_DURATION_S = 600.0
# The sidecar's resources: a model fitted to bench measurements at 8 and 64 endpoints x 8 GPUs at 3 Hz, with and
# without OTLP (CPU: bench/bench_scale.py, bench/NOTES.md "Issue 34"; memory: issue 48's bench/bench_memory.py,
# bench_scale.py and bench_peers.py, bench/RESULTS.md). Its memory does not grow with the run's length: the live
# report's series are spooled to disk, the OTLP queue is a byte budget, no page body outlives its scrape. Refit when
# bench/RESULTS.md's scale row moves.
MODEL_SOURCE = "bench/bench_scale.py, 2026-12-04 and 2026-12-05 (bench/NOTES.md, issue 34); memory 2026-12-07 (#48)"
MEMORY_BASE_MIB = 38.0  # the interpreter, its modules and libraries (one OpenSSL, libcurl's), the threads
MEMORY_MIB_PER_GPU = 0.07  # a GPU (or MIG instance) on a page: parse template, record lines, spool rows
MEMORY_MIB_PER_GPU_OTLP = 0.04  # with OTLP on: the encoder's series and frame, its share of the chunk buffers
OTLP_QUEUE_MIB = 16.0  # the OTLP queue's byte budget (otlp/config.py), full only while the receiver is away
MEMORY_HEADROOM = 1.2
MEMORY_STEP_MIB = 8
SIDECAR_MEMORY_FLOOR_MIB = 192  # AIPerf's default limit
CPU_BASE_M = 2.5  # wake-ups, the control server, the record log's flusher
CPU_MS_PER_GPU_SCRAPE = 0.028  # all the sidecar's work per GPU a scrape (GET, parse, records, live series, OTLP)
CPU_OTLP_SHARE = 0.18  # the part of it that OTLP is (its export thread)
CPU_HEADROOM = 1.3
CPU_WARN_FRACTION = 0.8
# Never below AIPerf's 25m (the start-up and shutdown budgets in jobset.py assume at least that).
SIDECAR_CPU_FLOOR_M = 25
SIDECAR_CPU_STEP_M = 5


@dataclass(frozen=True)
class SidecarModel:
    """The sidecar's modelled use and the requests/limits given for it (before any override)."""

    gpus: int  # GPUs (MIG instances counted each) on all pages
    scrapes_per_s: float
    otlp: bool
    cpu_m: float  # modelled use, millicores
    memory_mib: float  # modelled peak RSS, MiB (the OTLP queue full included when OTLP is on)

    @property
    def cpu_quantity(self) -> str:
        sized = math.ceil(self.cpu_m * CPU_HEADROOM / SIDECAR_CPU_STEP_M) * SIDECAR_CPU_STEP_M
        return f"{max(SIDECAR_CPU_FLOOR_M, sized)}m"

    @property
    def memory_quantity(self) -> str:
        sized = math.ceil(self.memory_mib * MEMORY_HEADROOM / MEMORY_STEP_MIB) * MEMORY_STEP_MIB
        return f"{max(SIDECAR_MEMORY_FLOOR_MIB, sized)}Mi"

    def line(self) -> str:
        return (f"gpu-telemetry sidecar model: {self.gpus} GPUs, {self.scrapes_per_s:.0f} pages/s, OTLP "
                f"{'on' if self.otlp else 'off'}: {self.cpu_m:.0f}m CPU, {self.memory_mib:.0f} MiB peak -> "
                f"{self.cpu_quantity}, {self.memory_quantity} (x{CPU_HEADROOM:g} / x{MEMORY_HEADROOM:g} headroom, "
                f"floors {SIDECAR_CPU_FLOOR_M}m / {SIDECAR_MEMORY_FLOOR_MIB}Mi; fitted to {MODEL_SOURCE})")


def sidecar_model(*, endpoints: int, gpus_per_endpoint: int, collection_interval_s: float, otlp: bool = True,
                  mig: int = 0) -> SidecarModel:
    """The sidecar's CPU and memory at `endpoints` pages of `gpus_per_endpoint` GPUs (`mig` instances each, 0:
    MIG off) every `collection_interval_s`."""
    gpus = endpoints * gpus_per_endpoint * max(1, mig)
    rate = 1.0 / max(collection_interval_s, 0.01)
    cpu = CPU_BASE_M + gpus * rate * CPU_MS_PER_GPU_SCRAPE * (1.0 if otlp else 1.0 - CPU_OTLP_SHARE)
    memory = MEMORY_BASE_MIB + gpus * (MEMORY_MIB_PER_GPU + (MEMORY_MIB_PER_GPU_OTLP if otlp else 0.0))
    return SidecarModel(gpus, round(endpoints * rate, 3), otlp, cpu, memory + (OTLP_QUEUE_MIB if otlp else 0.0))


@dataclass(frozen=True)
class SidecarCpu:
    """A sidecar resource (its CPU, or its memory) as given to the container, and why."""

    quantity: str  # the container's request and limit, e.g. "100m", "192Mi"
    reason: str  # how it was chosen, for --dry-run and `kube estimate`


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def sidecar_cpu(*, endpoints: int, gpus_per_endpoint: int, collection_interval_s: float,
                override: str | None = None, otlp: bool = True) -> SidecarCpu:
    """The sidecar's CPU: AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU when set, else the model's, with its headroom."""
    if override:
        return SidecarCpu(override, "from AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU")
    model = sidecar_model(endpoints=endpoints, gpus_per_endpoint=gpus_per_endpoint,
                          collection_interval_s=collection_interval_s, otlp=otlp)
    work = (f"{_count(endpoints, 'endpoint')} x {_count(gpus_per_endpoint, 'GPU')} x "
            f"{CPU_MS_PER_GPU_SCRAPE:g} ms per GPU-scrape / {collection_interval_s:g} s + {CPU_BASE_M:g}m = "
            f"{model.cpu_m:.0f}m")
    if model.cpu_quantity == f"{SIDECAR_CPU_FLOOR_M}m":
        return SidecarCpu(model.cpu_quantity, f"the {SIDECAR_CPU_FLOOR_M}m floor ({work})")
    return SidecarCpu(model.cpu_quantity, f"the model: {work}, x {CPU_HEADROOM:g} headroom; "
                                          "AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU overrides")


@dataclass(frozen=True)
class Component:
    name: str
    mib: int
    formula: str


@dataclass(frozen=True)
class Estimate:
    components: tuple[Component, ...]
    telemetry_limit_mib: int | None = None
    telemetry_records: int = 0  # GPU records the sidecar will write (0 = no URL given)
    telemetry_cpu_need: float = 0.0  # cores the scrape loop needs at the collection interval
    telemetry_cpu_limit: float | None = None
    telemetry_cpu: SidecarCpu | None = None  # the sidecar's CPU and why (None: no sidecar)
    model: SidecarModel | None = None  # the sidecar's modelled use (None: no URL given)
    telemetry_memory: SidecarCpu | None = None  # the sidecar's memory (a quantity and why; None: no sidecar)

    @property
    def total_mib(self) -> int:
        return sum(c.mib for c in self.components)

    def component(self, name: str) -> Component:
        return next(c for c in self.components if c.name == name)

    def warnings(self) -> list[str]:
        out: list[str] = []
        telemetry = self.component("gpu-telemetry")
        if self.telemetry_limit_mib is not None and telemetry.mib > self.telemetry_limit_mib:
            out.append(f"the gpu-telemetry estimate ({telemetry.mib} MiB) exceeds its memory limit "
                       f"({self.telemetry_limit_mib} MiB): raise AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY")
        limit = self.telemetry_cpu_limit
        if limit is not None and self.telemetry_cpu_need > limit * CPU_WARN_FRACTION:
            out.append(f"scraping needs about {self.telemetry_cpu_need * 1000:.0f}m CPU at this collection interval, "
                       f"near or above the sidecar's {limit * 1000:.0f}m limit, so scrapes would fall behind: "
                       "raise AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU or AIPERF_GPU_COLLECTION_INTERVAL")
        return out

    def lines(self) -> list[str]:
        width = max(len(c.name) for c in self.components)
        out = ["controller pod memory estimate (heuristic):"]
        out += [f"  {c.name:<{width}}  {c.mib:>6} MiB  {c.formula}" for c in self.components]
        out.append(f"  {'total':<{width}}  {self.total_mib:>6} MiB")
        out += [f"  warning: {w}" for w in self.warnings()]
        return out

    def all_lines(self) -> list[str]:
        """The memory table, the sidecar's model and where it comes from, then its CPU and memory and why (what
        --dry-run and `kube estimate` print)."""
        out = self.lines()
        if self.model is not None:
            out.append(self.model.line())
        if self.telemetry_cpu is not None:
            out.append(f"gpu-telemetry sidecar CPU: {self.telemetry_cpu.quantity} ({self.telemetry_cpu.reason})")
        if self.telemetry_memory is not None:
            out.append(f"gpu-telemetry sidecar memory: {self.telemetry_memory.quantity} "
                       f"({self.telemetry_memory.reason})")
        return out


def estimate_controller(*, concurrency: int | None, request_count: int | None, streaming: bool,
                        telemetry_enabled: bool, telemetry_urls: int,
                        gpus_per_endpoint: int = DEFAULT_GPUS_PER_ENDPOINT, collection_interval_s: float = 0.333,
                        duration_s: float = DEFAULT_DURATION_S, otlp: bool = False,
                        telemetry_memory: str | None = None, telemetry_cpu: str | None = None) -> Estimate:
    """`telemetry_urls` counts only user-given URLs (a k8s:// item not yet expanded counts as one).
    `telemetry_memory` and `telemetry_cpu` are the sidecar's when the user set them; otherwise they are the
    model's (`sidecar_model`) with its headroom."""
    conc = concurrency or 1
    requests = request_count or 0
    per_request = INFLIGHT_KIB_STREAMING if streaming else INFLIGHT_KIB_TEXT
    inflight = math.ceil(conc * per_request / 1024)
    held = math.ceil(requests * RECORD_KIB / 1024)
    benchmark = Component(
        "benchmark", BENCHMARK_BASE_MIB + inflight + held,
        f"base {BENCHMARK_BASE_MIB} + {conc} in flight x {per_request} KiB "
        f"({'streaming' if streaming else 'text'}) + {requests} records x {RECORD_KIB} KiB",
    )
    scrapes = math.ceil(duration_s / max(collection_interval_s, 0.01))
    records = 0
    model = sidecar_model(endpoints=telemetry_urls, gpus_per_endpoint=gpus_per_endpoint,
                          collection_interval_s=collection_interval_s, otlp=otlp)
    if not telemetry_enabled:
        telemetry = Component("gpu-telemetry", 0, "disabled (--no-gpu-telemetry): container not deployed")
    elif telemetry_urls == 0:
        telemetry = Component("gpu-telemetry", 0, "no --gpu-telemetry URL (defaults never count)")
    else:
        records = scrapes * telemetry_urls * gpus_per_endpoint
        otlp_part = f" + {MEMORY_MIB_PER_GPU_OTLP:g} OTLP) + {OTLP_QUEUE_MIB:g} OTLP queue" if otlp else ")"
        telemetry = Component(
            "gpu-telemetry", math.ceil(model.memory_mib),
            f"model: base {MEMORY_BASE_MIB:g} + {_count(telemetry_urls, 'endpoint')} x "
            f"{_count(gpus_per_endpoint, 'GPU')} x ({MEMORY_MIB_PER_GPU:g}{otlp_part}; not the run's length",
        )
    limit = None
    cpu = None
    memory = None
    if telemetry_enabled:
        sized = (f"the model's peak x {MEMORY_HEADROOM:g}, at least {SIDECAR_MEMORY_FLOOR_MIB}Mi; "
                 "AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY overrides")
        memory = SidecarCpu(telemetry_memory, "from AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY") if telemetry_memory \
            else SidecarCpu(model.memory_quantity, sized)
        limit = int(quantity_value(memory.quantity) / MIB)
        cpu = sidecar_cpu(endpoints=telemetry_urls, gpus_per_endpoint=gpus_per_endpoint,
                          collection_interval_s=collection_interval_s, override=telemetry_cpu, otlp=otlp)
    cpu_limit = float(quantity_value(cpu.quantity)) if cpu is not None else None
    need = model.cpu_m / 1000 if records else 0.0
    return Estimate((benchmark, telemetry), limit, records, need, cpu_limit, cpu,
                    model if records else None, memory)


def benchmark_memory_request(estimate: Estimate) -> str:
    """The control-plane container's memory request: its estimate rounded up to 256 MiB."""
    mib = estimate.component("benchmark").mib
    return f"{math.ceil(mib / 256) * 256}Mi"
