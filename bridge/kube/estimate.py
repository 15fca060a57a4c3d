"""Memory of the controller pod by component: a display heuristic, like AIPerf's estimator.

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
# Our sidecar: one interpreter with httpx, the parser and the accumulator.
TELEMETRY_BASE_MIB = 72
SAMPLE_BYTES = 16  # float64 value + int64 timestamp per metric per GPU per scrape
DEFAULT_GPUS_PER_ENDPOINT = 8
DEFAULT_METRICS = 24
DEFAULT_DURATION_S = 600.0
# The sidecar's cost per GPU on a page, in situ, with room for the tick's burst. bench/bench_sidecar.py measures
# the whole cost of an 8-GPU scrape with OTLP on (GET, parse, normalise, record, live series, OTLP, wake-ups):
# 0.78 ms when this was set, 0.35 ms (~0.044 ms a GPU) in bench/RESULTS.md now. The mean is not what a limit must
# hold: a tick's pages run back to back, and the container's CFS quota is given per 100 ms period, so a limit sized
# to the mean throttles every tick's burst into the next periods. At 0.1 ms a GPU (8 per endpoint, 3 Hz, the
# 0.8 headroom below) a limit holds ~0.3 ms a period per endpoint against a burst of ~0.35 ms per endpoint a
# tick: most of a tick's work runs in the period it starts in. Revisit when the bench moves a lot.
SCRAPE_CPU_SECONDS_PER_GPU = 0.0001
CPU_WARN_FRACTION = 0.8
# The sidecar's default CPU: what scraping needs at the interval, with the warning's headroom, rounded up
# to 5m; never below AIPerf's 25m (the start-up and shutdown budgets in jobset.py assume at least that).
SIDECAR_CPU_FLOOR_M = 25
SIDECAR_CPU_STEP_M = 5


@dataclass(frozen=True)
class SidecarCpu:
    quantity: str  # the container's CPU request and limit, e.g. "165m"
    reason: str  # how it was chosen, for --dry-run and `kube estimate`


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def sidecar_cpu(*, endpoints: int, gpus_per_endpoint: int, collection_interval_s: float,
                override: str | None = None) -> SidecarCpu:
    """The sidecar's CPU: AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU when set, else sized to the scrape work."""
    if override:
        return SidecarCpu(override, "from AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU")
    interval = max(collection_interval_s, 0.01)
    need_m = endpoints * gpus_per_endpoint * SCRAPE_CPU_SECONDS_PER_GPU / interval * 1000
    sized = math.ceil(need_m / CPU_WARN_FRACTION / SIDECAR_CPU_STEP_M) * SIDECAR_CPU_STEP_M
    work = (f"{_count(endpoints, 'endpoint')} x {_count(gpus_per_endpoint, 'GPU')} x "
            f"{SCRAPE_CPU_SECONDS_PER_GPU * 1000:g} ms per GPU-scrape / {collection_interval_s:g} s = "
            f"{need_m:.0f}m of scraping")
    if sized <= SIDECAR_CPU_FLOOR_M:
        return SidecarCpu(f"{SIDECAR_CPU_FLOOR_M}m", f"the {SIDECAR_CPU_FLOOR_M}m floor ({work})")
    return SidecarCpu(f"{sized}m", f"sized to the work: {work}, / {CPU_WARN_FRACTION:g} for headroom; "
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
        """The memory table, then the sidecar's CPU and why (what --dry-run and `kube estimate` print)."""
        out = self.lines()
        if self.telemetry_cpu is not None:
            out.append(f"gpu-telemetry sidecar CPU: {self.telemetry_cpu.quantity} ({self.telemetry_cpu.reason})")
        return out


def estimate_controller(*, concurrency: int | None, request_count: int | None, streaming: bool,
                        telemetry_enabled: bool, telemetry_urls: int,
                        gpus_per_endpoint: int = DEFAULT_GPUS_PER_ENDPOINT, metrics: int = DEFAULT_METRICS,
                        collection_interval_s: float = 0.333, duration_s: float = DEFAULT_DURATION_S,
                        telemetry_memory: str | None = None, telemetry_cpu: str | None = None) -> Estimate:
    """`telemetry_urls` counts only user-given URLs (a k8s:// item not yet expanded counts as one).
    `telemetry_cpu` is the sidecar's CPU when the user set it; otherwise it is sized here."""
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
    if not telemetry_enabled:
        telemetry = Component("gpu-telemetry", 0, "disabled (--no-gpu-telemetry): container not deployed")
    elif telemetry_urls == 0:
        telemetry = Component("gpu-telemetry", 0, "no --gpu-telemetry URL (defaults never count)")
    else:
        records = scrapes * telemetry_urls * gpus_per_endpoint
        series = telemetry_urls * gpus_per_endpoint * metrics
        variable = math.ceil(series * scrapes * SAMPLE_BYTES / MIB)
        telemetry = Component(
            "gpu-telemetry", TELEMETRY_BASE_MIB + variable,
            f"base {TELEMETRY_BASE_MIB} + {_count(telemetry_urls, 'endpoint')} x {_count(gpus_per_endpoint, 'GPU')} x "
            f"{metrics} "
            f"metrics x {scrapes} scrapes ({duration_s:g} s / {collection_interval_s:g} s) x {SAMPLE_BYTES} B",
        )
    limit = None
    if telemetry_enabled and telemetry_memory:
        limit = int(quantity_value(telemetry_memory) / MIB)
    cpu = None
    if telemetry_enabled:
        cpu = sidecar_cpu(endpoints=telemetry_urls, gpus_per_endpoint=gpus_per_endpoint,
                          collection_interval_s=collection_interval_s, override=telemetry_cpu)
    cpu_limit = float(quantity_value(cpu.quantity)) if cpu is not None else None
    need = telemetry_urls * gpus_per_endpoint * SCRAPE_CPU_SECONDS_PER_GPU / max(collection_interval_s, 0.01)
    return Estimate((benchmark, telemetry), limit, records, need if records else 0.0, cpu_limit, cpu)


def benchmark_memory_request(estimate: Estimate) -> str:
    """The control-plane container's memory request: its estimate rounded up to 256 MiB."""
    mib = estimate.component("benchmark").mib
    return f"{math.ceil(mib / 256) * 256}Mi"
