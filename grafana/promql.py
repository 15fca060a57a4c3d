"""The PromQL the dashboards are made of: the recorded series (grafana/rules.py), one function per pattern.

The recording rules (rules/dcgm-bridge.rules.yml) already settle what made the old queries long, once, in
one place: both host-label spellings (dcgm-exporter #655), `_total` on OTLP-fed counters, MIG device
fields repeated on every instance (#317, #353), every dialect's names and units (DCGM 4.7 names in 4.9+,
`-o` 1.x names), and the series a GPU has moved on from (other phase). What is left for a panel is to
select a `dcgm_bridge:gpu_*` series by the dashboard's variables and aggregate it:

    max by (host, UUID, gpu) (dcgm_bridge:gpu_power_watts{run_id="$run_id", phase=~"$phase", UUID=~"$gpu"})

`max by` the GPU (or its `slot`: GPU index, MIG profile and instance) merges a GPU's per-phase series
into one line per GPU; only one of them is current at a time, the rules record the fresh one only.

Everything here returns strings; grafana/generate.py assembles them into panels.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "dcgm_bridge:gpu_"
GPU = "host, UUID, gpu"  # one physical GPU: the legend's {{host}} gpu {{gpu}}
SLOT = GPU + ", slot"  # one GPU or MIG instance: {{host}} gpu {{slot}}
PRESENT = "fb_used_bytes"  # a series every kind of GPU has (vGPU too, #236): lists runs, hosts and GPUs


@dataclass(frozen=True)
class Scope:
    """The matchers every selector of a dashboard carries (e.g. run, phase, host, GPU)."""

    matchers: str  # e.g. 'run_id="$run_id", phase=~"$phase", host=~"$host", UUID=~"$gpu"'

    def sel(self, series: str) -> str:
        """The recorded series `dcgm_bridge:gpu_<series>` within the dashboard's selection."""
        return f"{PREFIX}{series}{{{self.matchers}}}" if self.matchers else f"{PREFIX}{series}"

    def per_gpu(self, series: str) -> str:
        return f"max by ({GPU}) ({self.sel(series)})"

    def per_slot(self, series: str) -> str:
        return f"max by ({SLOT}) ({self.sel(series)})"

    def rate_per_gpu(self, series: str) -> str:
        return f"max by ({GPU}) (rate({self.sel(series)}[$__rate_interval]))"

    def over_range(self, fn: str, series: str) -> str:
        return f"{fn}({self.sel(series)}[$__range])"

    def total_power(self, by: str = "") -> str:
        grouping = f" by ({by})" if by else ""
        return f"sum{grouping} ({self.per_gpu('power_watts')})"

    def mean_total_power(self) -> str:
        """Sum over GPUs of each GPU's sample mean over the range, whatever the phases' lengths."""
        total = self.over_range("sum_over_time", "power_watts")
        count = self.over_range("count_over_time", "power_watts")
        return f"sum(sum by (UUID) ({total}) / sum by (UUID) ({count}))"

    def energy_joules_per_gpu(self) -> str:
        """Joules per GPU over the range, across phases: the GPU's per-phase series merged into one (`max by`)
        and `increase` over that as a subquery (reset-aware). Summing `increase` per phase series instead would
        miss the energy between two phases' samples."""
        return f"increase(({self.per_gpu('energy_joules_total')})[$__range:$__interval])"

    def energy_joules_per_phase(self) -> str:
        """Joules per phase over the selected GPUs: a phase is one stretch of time, its series one per GPU."""
        return f"sum by (phase) ({self.over_range('increase', 'energy_joules_total')})"

    def mean(self, series: str, by: str = "") -> str:
        """Sample mean over the range (each sample of each selected series weighs the same)."""
        grouping = f" by ({by})" if by else ""
        return (f"sum{grouping} ({self.over_range('sum_over_time', series)}) / "
                f"sum{grouping} ({self.over_range('count_over_time', series)})")

    def variable(self, label: str) -> str:
        """A variable's query: the label's values over the dashboard's time range."""
        return f"label_values({self.sel(PRESENT)}, {label})"
