"""The simulator's one config object and its scripted faults, validated once at construction."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal, cast, get_args

from bridge.simulator.schema import DIALECTS

Dialect = Literal[
    "legacy", "current", "old-namespace", "dcgm49", "dcgm410", "bare", "openmetrics", "sorted-labels", "spaced",
    "amd",  # AMD device-metrics-exporter: the same GPUs' values under its gpu_* families and labels
    "amd-prefixed",  # the same under amd_gpu_* (the exporter's prefixed names)
    "amd-2026",  # amd_gpu_*, the 2026 bare-metal label set (no gpu_uuid, partition type "none")
]
AMD_DIALECTS = ("amd", "amd-prefixed", "amd-2026")
PodLabels = Literal["none", "mapped", "empty"]
Counters = Literal["full", "default"]
# How the GPU's sensors serve power (bridge/simulator/sensors.py): "h200" as measured on an H200 (a one-second average
# gauge, a counter held for 100 ms), "ideal" the truth at the instant asked.
SensorKind = Literal["ideal", "h200"]
FaultKind = Literal[
    "counter-reset",  # counters restart from 0 (driver reload / GPU reset); ground truth is unaffected
    "xid",  # DCGM_FI_DEV_XID_ERRORS appears with the code, err_code and err_msg from then on
    "http-500",  # gather error
    "empty-body",  # 200 with no body: the registry is nil during a hot reload (server.go)
    "slow",  # the response starts only after delay_s
    "truncated",  # Content-Length promises the whole page, half is sent, then the connection closes
    "garbage-line",  # a line that is no sample, in the middle of the page
    "sentinels",  # blank values leaked as old exporters did, and a <<<NULL>>> label value
    "unescaped-quote",  # a `"` inside a label value, which the exporter never escapes
    "json",  # a JSON body with an application/json Content-Type
    "huge-body",  # size_bytes of valid-looking lines, streamed
    "restart",  # the port refuses connections for a while, then listens again
]
DIALECT_NAMES: tuple[str, ...] = get_args(Dialect)
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
EVENT_KINDS = frozenset(["counter-reset", "xid"])
NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Fault:
    """One scripted misbehaviour, active for some request numbers and/or a window of simulated time.

    `requests` is an inclusive range of 1-based /metrics request numbers; `from_ns`/`until_ns` bound the
    simulated time (until exclusive). With both, both must hold; with neither, the fault always applies.
    Events (counter-reset, xid) happen once: at `from_ns` (or when added) or at the first matching
    request. A restart triggered by a request stays down for `duration_ns` of simulated time; a
    time-window restart is down for [from_ns, until_ns).
    """

    kind: FaultKind
    requests: tuple[int, int] | None = None
    from_ns: int | None = None
    until_ns: int | None = None
    duration_ns: int = 5 * NS
    delay_s: float = 2.0
    size_bytes: int = 16 * 1024 * 1024
    gpu: int | None = None  # counter-reset: None = every GPU; the others: None = GPU 0
    xid: int = 79

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in FAULT_KINDS:
            problems.append(f"unknown fault kind {self.kind!r} (one of: {', '.join(FAULT_KINDS)})")
        if self.requests is not None and not 1 <= self.requests[0] <= self.requests[1]:
            problems.append(f"requests must be 1 <= first <= last, got {self.requests}")
        if self.from_ns is not None and self.until_ns is not None and self.until_ns <= self.from_ns:
            problems.append("until must be later than from")
        if self.kind == "restart" and self.requests is None and self.from_ns is None:
            problems.append("a restart needs requests= or from=")
        if self.duration_ns <= 0 or self.delay_s < 0 or self.size_bytes <= 0:
            problems.append("duration, delay and size must be positive")
        if problems:
            raise ValueError("; ".join(sorted(problems)))

    def matches(self, request: int, t_ns: int) -> bool:
        if self.requests is not None and not self.requests[0] <= request <= self.requests[1]:
            return False
        if self.from_ns is not None and t_ns < self.from_ns:
            return False
        return self.until_ns is None or t_ns < self.until_ns

    @property
    def target_gpu(self) -> int:
        return self.gpu if self.gpu is not None else 0

    def down_window(self) -> tuple[int, int]:
        """A time-window restart's [start, end) in simulated ns."""
        start = self.from_ns if self.from_ns is not None else 0
        return start, self.until_ns if self.until_ns is not None else start + self.duration_ns


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    gpus: int = 8
    seed: int = 0
    model_name: str = "NVIDIA H100 80GB HBM3"
    dialect: Dialect = "legacy"
    counters: Counters = "full"  # "default": only the active rows of etc/default-counters.csv
    mig: int = 0  # GPU instances per GPU (0: MIG off)
    pod_labels: PodLabels = "none"  # "mapped": pod/namespace/container; "empty": the 2022 `pod=""` style
    gpus_per_pod: int = 1
    namespace: str = "llm-bench"
    hostname: str | None = None  # None: a pod-like name derived from the seed
    no_hostname: bool = False  # `-n/--no-hostname`
    driver_version: str = "570.124.06"
    refresh_ms: int = 0  # DCGM's `-c` cadence; 0: every request sees fresh values
    timestamps: bool = False  # sample timestamps (ms; seconds in OpenMetrics)
    # When the counters started. None: a seeded uptime before the clock's reading at construction, so
    # pages are byte-identical for the same seed, config, construction time and request time.
    boot_ns: int | None = None
    port: int = 0  # 0: ephemeral
    faults: tuple[Fault, ...] = field(default=())
    sensors: SensorKind = "ideal"
    # Run-to-run variation (issue 45): None serves the node as ever. A repeat's number redraws the load's randomness
    # (each GPU's second-scale jitter) and scales the node's power by one factor drawn from N(1, run_to_run_cv);
    # the same seed and repeat serve the same run. power_scale: a configuration that draws that much more or less.
    repeat: int | None = None
    run_to_run_cv: float = 0.0
    power_scale: float = 1.0

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.gpus <= 64:
            problems.append(f"gpus must be 1-64, got {self.gpus}")
        if self.dialect not in DIALECTS:
            problems.append(f"unknown dialect {self.dialect!r} (one of: {', '.join(DIALECT_NAMES)})")
        if self.counters not in get_args(Counters):
            problems.append(f"counters must be full or default, got {self.counters!r}")
        if self.dialect in AMD_DIALECTS and self.mig:
            problems.append(f"the {self.dialect} dialect has no MIG (its compute partitions are not simulated)")
        if not 0 <= self.mig <= 7:
            problems.append(f"mig must be 0-7 instances per GPU, got {self.mig}")
        if self.pod_labels not in get_args(PodLabels):
            problems.append(f"pod_labels must be none, mapped or empty, got {self.pod_labels!r}")
        if self.gpus_per_pod < 1:
            problems.append("gpus_per_pod must be >= 1")
        if self.sensors not in get_args(SensorKind):
            problems.append(f"sensors must be ideal or h200, got {self.sensors!r}")
        if not 0 <= self.run_to_run_cv <= 0.2:
            problems.append(f"run_to_run_cv must be 0-0.2, got {self.run_to_run_cv}")
        if self.run_to_run_cv and self.repeat is None:
            problems.append("run_to_run_cv needs a repeat (the run's seed)")
        if not 0.1 <= self.power_scale <= 10:
            problems.append(f"power_scale must be 0.1-10, got {self.power_scale}")
        if self.refresh_ms < 0:
            problems.append("refresh_ms must be >= 0")
        if not 0 <= self.port <= 65535:
            problems.append(f"port must be 0-65535, got {self.port}")
        if problems:
            raise ValueError("invalid simulator config: " + "; ".join(sorted(problems)))


def _seconds_to_ns(text: str) -> int:
    return round(float(text.rstrip("s")) * NS)


def parse_fault_spec(spec: str, origin_ns: int) -> Fault:
    """`KIND[,key=value...]` (the CLI's --fault) → Fault. Times are seconds after `origin_ns`.

    Keys: requests=N | N-M | N- (1-based, inclusive), from=S, until=S, for=S (restart duration),
    delay=S (slow), mb=N (huge-body), gpu=N, code=N (xid). Example: `restart,from=30,for=10`.
    """
    kind, *items = [part.strip() for part in spec.split(",") if part.strip()]
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r} in {spec!r} (one of: {', '.join(FAULT_KINDS)})")
    requests: tuple[int, int] | None = None
    from_ns: int | None = None
    until_ns: int | None = None
    duration_ns: int | None = None
    delay_s, size_bytes, gpu, xid = _DEFAULT.delay_s, _DEFAULT.size_bytes, None, _DEFAULT.xid
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError(f"option {item!r} is not key=value")
            if key == "requests":
                first, dash, last = value.partition("-")
                requests = (int(first), int(last) if last else (sys.maxsize if dash else int(first)))
            elif key == "from":
                from_ns = origin_ns + _seconds_to_ns(value)
            elif key == "until":
                until_ns = origin_ns + _seconds_to_ns(value)
            elif key == "for":
                duration_ns = _seconds_to_ns(value)
            elif key == "delay":
                delay_s = float(value.rstrip("s"))
            elif key == "mb":
                size_bytes = round(float(value) * 1024 * 1024)
            elif key == "gpu":
                gpu = int(value)
            elif key == "code":
                xid = int(value)
            else:
                raise ValueError(f"unknown option {key!r}")
        except ValueError as exc:
            raise ValueError(f"bad fault spec {spec!r}: {exc}") from exc
    if from_ns is not None and until_ns is None and duration_ns is not None:
        until_ns = from_ns + duration_ns
    return Fault(
        cast(FaultKind, kind), requests, from_ns, until_ns, duration_ns or _DEFAULT.duration_ns,
        delay_s, size_bytes, gpu, xid,
    )


_DEFAULT = Fault("slow")
