"""The PromQL the dashboards are made of: one function per pattern, so every panel reads the same way.

Four problems of dcgm-exporter data shape every query (NVIDIA/dcgm-exporter issues and release notes, cited below):

1. **Two host labels.** dcgm-exporter wrote `Hostname` up to 4.5.x and writes `hostname` since 4.6
   (#655); a fleet has both. A label name cannot be a regex, so every selector is written twice,
   `(M{Hostname=~"$host",…} or M{hostname=~"$host",…})`, and results get one `host` label for the
   legends (`with_host`). With `$host` = All (`.*`) the first half already matches every series
   and `or` adds nothing twice.
2. **`_total` on counters.** A Prometheus-compatible OTLP receiver appends `_total` to monotonic
   sums (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total, …); VictoriaMetrics' default and direct scrapes
   do not. Counters are selected by the name regex `{__name__=~"M(_total)?"}`.
3. **MIG duplicates.** Device-level fields (power, energy, temperature, clocks, PCIe, NVLink,
   violations) repeat on every GPU-instance series of a GPU (#317, #353): they are reduced with
   `max by (<gpu key>)` before any sum.
4. **Series that linger.** `run_id`/`phase` (and pod labels) split one GPU's data into several
   series; a store keeps answering with a series for up to 5 minutes after its last sample when no
   staleness marker ended it (OTLP ingestion, VictoriaMetrics), so a warmup series would still be
   summed or max-ed during profiling. `fresh()` keeps, per GPU, only the series whose latest sample
   is the GPU's newest (`timestamp()` of plain selectors: of an expression it is the evaluation time).

Everything here returns strings; grafana/generate.py assembles them into panels.
"""

from __future__ import annotations

from dataclasses import dataclass

HOST_LABELS = ("Hostname", "hostname")
GPU_KEY = "Hostname, hostname, UUID"  # one physical GPU, whatever the host label's spelling
INSTANCE_KEY = GPU_KEY + ", gpu, GPU_I_ID, GPU_I_PROFILE"  # one GPU or one MIG instance, for legends
DEVICE_KEY = GPU_KEY + ", gpu"

# Families present on every kind of GPU, to list runs, hosts and GPUs: GPU_TEMP (12239's choice) is
# absent on vGPU (#236), GPU_UTIL under MIG and on newer GPU Operator stacks (#430, #634).
PRESENCE = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")


@dataclass(frozen=True)
class Metric:
    name: str
    counter: bool = False  # selected as `{__name__=~"name(_total)?"}`


POWER = Metric("DCGM_FI_DEV_POWER_USAGE")
ENERGY = Metric("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", counter=True)  # mJ
GPU_UTIL = Metric("DCGM_FI_DEV_GPU_UTIL")  # %
GR_ENGINE = Metric("DCGM_FI_PROF_GR_ENGINE_ACTIVE")  # 0-1
GPU_TEMP = Metric("DCGM_FI_DEV_GPU_TEMP")
MEMORY_TEMP = Metric("DCGM_FI_DEV_MEMORY_TEMP")
FB_USED = Metric("DCGM_FI_DEV_FB_USED")
FB_FREE = Metric("DCGM_FI_DEV_FB_FREE")
FB_RESERVED = Metric("DCGM_FI_DEV_FB_RESERVED")
SM_CLOCK = Metric("DCGM_FI_DEV_SM_CLOCK")  # MHz
TENSOR = Metric("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")  # 0-1
PCIE_TX = Metric("DCGM_FI_PROF_PCIE_TX_BYTES")  # B/s (a gauge since dcgm-exporter#88)
PCIE_RX = Metric("DCGM_FI_PROF_PCIE_RX_BYTES")
NVLINK = Metric("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", counter=True)  # unit disputed (DCGM#221)
XID = Metric("DCGM_FI_DEV_XID_ERRORS")  # the last XID code: a gauge, never summed or rated
VIOLATIONS = {  # throttled time, ns (counters; optional rows of default-counters.csv)
    "power": Metric("DCGM_FI_DEV_POWER_VIOLATION", counter=True),
    "thermal": Metric("DCGM_FI_DEV_THERMAL_VIOLATION", counter=True),
    "sync boost": Metric("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", counter=True),
    "board limit": Metric("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", counter=True),
    "low utilisation": Metric("DCGM_FI_DEV_LOW_UTIL_VIOLATION", counter=True),
    "reliability": Metric("DCGM_FI_DEV_RELIABILITY_VIOLATION", counter=True),
}


def _or(parts: list[str]) -> str:
    return "(" + " or ".join(parts) + ")"


@dataclass(frozen=True)
class Scope:
    """The matchers every selector of a dashboard carries besides the host (e.g. run, phase, GPU)."""

    matchers: str  # e.g. 'run_id="$run_id", phase=~"$phase", UUID=~"$gpu"'

    def selectors(self, metric: Metric, extra: str = "") -> list[str]:
        """One selector per host-label spelling."""
        rest = self.matchers + (", " + extra if extra else "")
        if metric.counter:
            return [f'{{__name__=~"{metric.name}(_total)?", {h}=~"$host", {rest}}}' for h in HOST_LABELS]
        return [f'{metric.name}{{{h}=~"$host", {rest}}}' for h in HOST_LABELS]

    def select(self, metric: Metric, extra: str = "") -> str:
        return _or(self.selectors(metric, extra))

    def timestamps(self, metric: Metric, extra: str = "") -> str:
        return _or([f"timestamp({s})" for s in self.selectors(metric, extra)])

    def newest(self, metric: Metric, extra: str = "") -> str:
        """The series of `metric` holding each GPU's newest sample (value: its timestamp)."""
        ts = self.timestamps(metric, extra)
        return f"({ts} == on({GPU_KEY}) group_left() max by ({GPU_KEY}) ({ts}))"

    def fresh(self, metric: Metric, extra: str = "") -> str:
        """`metric`, without the series a GPU has already moved on from (other phase, old pod labels)."""
        return f"({self.select(metric, extra)} and {self.newest(metric, extra)})"

    def over_time(self, fn: str, metric: Metric, window: str, extra: str = "") -> str:
        """`fn(selector[window])` per host-label spelling."""
        return _or([f"{fn}({s}[{window}])" for s in self.selectors(metric, extra)])

    def subquery(self, fn: str, inner: str, metric: Metric, window: str = "$__range",
                 step: str = "$__interval") -> str:
        """`fn((inner)[window:step])` per host-label spelling, `inner` a format string with `{}` for the
        selector. The `or` stays outside the subqueries: inside, VictoriaMetrics evaluates it ~100x slower."""
        return _or([f"{fn}(({inner.format(s)})[{window}:{step}])" for s in self.selectors(metric)])

    def fresh_rate(self, metric: Metric, extra: str = "") -> str:
        """Per-second increase of a counter, only for each GPU's current series."""
        return f"({self.over_time('rate', metric, '$__rate_interval', extra)} and {self.newest(metric, extra)})"

    # -- composite quantities -----------------------------------------------------------------
    def utilisation(self) -> str:
        """Percent per GPU or MIG instance: GPU_UTIL, else GR_ENGINE_ACTIVE × 100 (#216, #430, #634)."""
        return f"({self.fresh(GPU_UTIL)} or 100 * {self.fresh(GR_ENGINE)})"

    def utilisation_sums(self, fn: str, window: str) -> str:
        """`sum_over_time`/`count_over_time` of utilisation, GPU_UTIL where present else GR_ENGINE × 100."""
        scale = "100 * " if fn == "sum_over_time" else ""
        return f"({self.over_time(fn, GPU_UTIL, window)} or {scale}{self.over_time(fn, GR_ENGINE, window)})"

    def power_per_gpu(self) -> str:
        """Watts per physical GPU: MIG duplicates collapsed (max), lingering series dropped (fresh)."""
        return f"max by ({DEVICE_KEY}) ({self.fresh(POWER)})"

    def total_power(self, by: str = "") -> str:
        grouping = f" by ({by})" if by else ""
        return f"sum{grouping} (max by ({GPU_KEY}) ({self.fresh(POWER)}))"

    def mean_total_power(self) -> str:
        """Sum over GPUs of each GPU's mean power over the range: sample means, whatever the phases' lengths
        (MIG duplicates leave a GPU's mean unchanged)."""
        total = self.over_time("sum_over_time", POWER, "$__range")
        count = self.over_time("count_over_time", POWER, "$__range")
        return f"sum (sum by ({GPU_KEY}) ({total}) / sum by ({GPU_KEY}) ({count}))"

    def energy_joules_per_gpu(self) -> str:
        """Joules per GPU over the dashboard's range, across phases.

        The counter is first merged into one series per GPU (`max by`: MIG duplicates are equal, a
        phase's series holds the GPU's latest value), then `increase` runs over that merged series as a
        subquery. Summing `increase` per phase series instead would count the gaps between phases twice:
        `phase="none"` recurs between phases, so its one series spans the whole run.
        """
        return f"{self.subquery('increase', f'max by ({DEVICE_KEY}) ({{}})', ENERGY)} / 1000"

    def energy_joules_per_gpu_phase(self, window: str = "$__range") -> str:
        """Joules per GPU and phase: increase of the mJ counter (reset-aware), MIG duplicates collapsed.

        Right for a phase that is one stretch of time (warmup, profiling), not for `phase="none"`.
        """
        return f"max by ({DEVICE_KEY}, phase) ({self.over_time('increase', ENERGY, window)}) / 1000"

    def memory_used_percent(self) -> str:
        used, free, reserved = self.select(FB_USED), self.select(FB_FREE), self.select(FB_RESERVED)
        ratio = f"100 * {used} / ({used} + {free} + ({reserved} or {used} * 0))"
        return f"(({ratio}) and {self.newest(FB_USED)})"


def with_host(expr: str) -> str:
    """`expr` plus a `host` label from whichever of Hostname/hostname it has (for legends and tables)."""
    inner = f'label_replace({expr}, "host", "$1", "Hostname", "(.+)")'
    return f'label_replace({inner}, "host", "$1", "hostname", "(.+)")'


def with_slot(expr: str) -> str:
    """`expr` plus a `slot` label: the GPU index, and for a MIG instance its profile and GPU_I_ID.

    Legends cannot use {{GPU_I_PROFILE}} directly: Grafana prints the label's name where it is absent.
    """
    joined = f'label_join({expr}, "slot", " ", "gpu", "GPU_I_PROFILE", "GPU_I_ID")'
    return f'label_replace({joined}, "slot", "$1", "slot", "(.*?) *")'


def presence_or(scope: Scope, fn: str, window: str) -> str:
    """`fn(M[window])` over the PRESENCE families, joined with `or` (one label set kept once).

    Functions drop the metric name, so one selector over several names would collide
    ("vector cannot contain metrics with the same labelset"); `or` of single names does not.
    """
    parts = [scope.over_time(fn, Metric(name), window) for name in PRESENCE]
    return "(" + " or ".join(parts) + ")"
