"""A disaggregated serving setup: one prefill pod's GPU and one decode pod's GPU under a seeded request schedule.

Power follows the requests, piecewise constant between their events:

    prefill GPU   P = idle + a × (input tokens per second in prefill)    (each request: ISL / its prefill time)
    decode GPU    P = idle + b × (requests decoding)

with `idle`, `a` and `b` drawn per seed. A request's prefill runs from its start to its first token, its decode
from the first token to its end. The run gives what a sidecar would record (each GPU's energy counter, in whole mJ,
and its power, read at scrapes every `interval_ms` with a few ms of jitter: fresh values, as the local NVML reader
gives them), AIPerf 0.13's per-request records (`profile_export.jsonl`, its `MetricRecordInfo` shape), and the
ground truth: each GPU's energy over the window, and each request's share by the per-request rule applied to the
exact power (bridge/report/requests.py; computed here from the model alone, segment by segment).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import orjson

from bridge.samples import GpuRecord

NS = 1_000_000_000
_T0 = 1_800_000_000 * NS
_COUNTER_ORIGIN_MJ = 4_100_000_000  # the counter counts from boot, long before


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: str
    start_ns: int
    first_token_ns: int
    end_ns: int
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class DisaggRun:
    records: tuple[GpuRecord, ...]
    aiperf_records: bytes  # profile_export.jsonl
    requests: tuple[SimRequest, ...]
    start_ns: int
    end_ns: int
    a_w_per_token_s: float
    b_w_per_request: float
    idle_w: tuple[float, float]  # prefill GPU, decode GPU
    gpu_energy_j: dict[str, float]  # by role: the true energy over [start, end]
    request_energy_j: dict[str, float]  # the rule on the exact power
    unattributed_j: float
    uuids: dict[str, str]  # role → GPU UUID


def _schedule(rng: random.Random, start: int, seconds: float) -> list[SimRequest]:
    """Poisson arrivals (about 2 a second) over the run, with a quiet gap in the middle and quiet edges."""
    out: list[SimRequest] = []
    t = 1.0
    gap = (seconds * 0.45, seconds * 0.45 + rng.uniform(3, 6))
    while True:
        t += rng.expovariate(2.0)
        if gap[0] <= t < gap[1]:
            t = gap[1]
        if t > seconds - 16:
            break
        isl = rng.randint(200, 3000)
        osl = rng.randint(50, 400)
        prefill_s = 0.15 + isl / rng.uniform(4000, 8000)
        decode_s = osl * rng.uniform(0.015, 0.03)
        s0 = start + round(t * NS)
        first = s0 + round(prefill_s * NS)
        out.append(SimRequest(f"req-{len(out):05d}", s0, first, first + round(decode_s * NS), isl, osl))
    return out


def _segments(requests: list[SimRequest], start: int, end: int, *window: int) -> list[int]:
    cuts = {start, end, *window}
    for r in requests:
        cuts.update((r.start_ns, r.first_token_ns, r.end_ns))
    return sorted(c for c in cuts if start <= c <= end)


def _rate(r: SimRequest) -> float:
    return r.input_tokens / ((r.first_token_ns - r.start_ns) / NS)


class _Power:
    """One GPU's piecewise-constant power and its exact integral."""

    def __init__(self, cuts: list[int], watts: list[float]) -> None:
        self.cuts, self.watts = cuts, watts
        self.cum = [0.0]
        for i, w in enumerate(watts):
            self.cum.append(self.cum[-1] + w * (cuts[i + 1] - cuts[i]) / NS)

    def energy_to(self, t: int) -> float:
        """J since cuts[0] (flat beyond the ends: the power at the edges)."""
        import bisect

        if t <= self.cuts[0]:
            return self.watts[0] * (t - self.cuts[0]) / NS
        i = min(bisect.bisect_right(self.cuts, t) - 1, len(self.watts) - 1)
        return self.cum[i] + self.watts[i] * (t - self.cuts[i]) / NS

    def at(self, t: int) -> float:
        import bisect

        i = min(max(bisect.bisect_right(self.cuts, t) - 1, 0), len(self.watts) - 1)
        return self.watts[i]


def disagg_run(seed: int, seconds: float = 90.0, interval_ms: float = 100.0) -> DisaggRun:
    rng = random.Random(f"dcgm-sim-disagg:{seed}")
    a = rng.uniform(0.01, 0.04)  # W per input token per second in prefill
    b = rng.uniform(10.0, 40.0)  # W per request decoding
    idle = (rng.uniform(60, 80), rng.uniform(60, 80))
    start, end = _T0, _T0 + round(seconds * NS)
    requests = _schedule(rng, start, seconds)
    margin = 5 * NS  # the power model runs a little beyond the window, for the scrapes that bracket it
    cuts = _segments(requests, start - margin, end + margin, start, end)  # (the window's edges cut too)
    prefill_w, decode_w, truth = [], [], {r.request_id: 0.0 for r in requests}
    unattributed = 0.0
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        mid = (lo + hi) // 2
        prefilling = [r for r in requests if r.start_ns <= mid < r.first_token_ns]
        decoding = [r for r in requests if r.first_token_ns <= mid < r.end_ns]
        rates = [_rate(r) for r in prefilling]
        p_w, d_w = idle[0] + a * sum(rates), idle[1] + b * len(decoding)
        prefill_w.append(p_w)
        decode_w.append(d_w)
        if lo < start or hi > end:
            continue
        span = (hi - lo) / NS
        for r, rate in zip(prefilling, rates, strict=True):
            truth[r.request_id] += p_w * span * rate / sum(rates)
        for r in decoding:
            truth[r.request_id] += d_w * span / len(decoding)
        unattributed += (0 if prefilling else p_w * span) + (0 if decoding else d_w * span)
    powers = {"prefill": _Power(cuts, prefill_w), "decode": _Power(cuts, decode_w)}
    uuids = {role: f"GPU-{seed:08x}-4600-0000-0000-{i:012x}" for i, role in enumerate(powers)}
    records = _scrapes(rng, powers, uuids, start - 2 * NS, end + 2 * NS, interval_ms)
    energy = {role: p.energy_to(end) - p.energy_to(start) for role, p in powers.items()}
    return DisaggRun(tuple(records), aiperf_lines(requests), tuple(requests), start, end, a, b, idle, energy, truth,
                     unattributed, uuids)


def _scrapes(rng: random.Random, powers: dict[str, _Power], uuids: dict[str, str], t0: int, t1: int,
             interval_ms: float) -> list[GpuRecord]:
    out = []
    step = round(interval_ms * 1e6)
    t = t0
    while t <= t1:
        at = t + round(rng.uniform(-3, 3) * 1e6)
        for index, (role, power) in enumerate(powers.items()):
            mj = _COUNTER_ORIGIN_MJ + math.floor(1000 * (power.energy_to(at) - power.energy_to(t0)))
            out.append(GpuRecord(
                gpu_index=index, gpu_uuid=uuids[role], gpu_model_name="NVIDIA H200",
                pci_bus_id=f"00000000:{18 + index}:00.0", device=f"nvidia{index}", hostname="node-a",
                namespace="llm", pod_name=f"{role}-0", platform="nvidia",
                timestamp_ns=at, telemetry_source_url="http://127.0.0.1:9400/metrics",
                telemetry_data={"nvidia_energy_consumption": mj / 1e9, "nvidia_power_usage": round(power.at(at), 3)},
            ))
        t += step
    return out


def aiperf_lines(requests: list[SimRequest]) -> bytes:
    """The requests as AIPerf 0.13 writes `profile_export.jsonl` (`MetricRecordInfo`: display units, ms)."""
    lines = []
    for i, r in enumerate(requests):
        lines.append(orjson.dumps({
            "metadata": {"session_num": i, "x_request_id": r.request_id, "request_start_ns": r.start_ns,
                         "request_end_ns": r.end_ns, "worker_id": "worker_0", "record_processor_id": "rp_0",
                         "benchmark_phase": "profiling"},
            "metrics": {
                "time_to_first_token": {"value": (r.first_token_ns - r.start_ns) / 1e6, "unit": "ms"},
                "request_latency": {"value": (r.end_ns - r.start_ns) / 1e6, "unit": "ms"},
                "input_sequence_length": {"value": r.input_tokens, "unit": "tokens"},
                "output_sequence_length": {"value": r.output_tokens, "unit": "tokens"},
            },
            "error": None,
        }))
    return b"\n".join(lines) + b"\n"
