"""`telemetry_data.steady_state`: the stretch of the window where the load held still, on the power trace and the
request concurrency together, with its own energy per output token beside the whole window's.

The window is cut into bins (1 s, or 1/200 of the window when that is longer). Per bin: the requests in flight
(their time inside the bin ÷ its length, from AIPerf's per-request records) and the GPUs' summed power (each GPU's
gauge at the bin's middle). The reference level of each is its median over the window's middle half (past a ramp
up, before a ramp down); a bin is steady when both lie within `TOLERANCE` of their reference. The steady state is
the longest run of steady bins, when it lasts at least `MIN_STEADY_S` and `MIN_SHARE` of the window; else the
report says there is none. Its energy is the report's per-GPU energy over exactly that stretch (energy.gpu_energy),
± the sum of their stated uncertainties; its output tokens are each request's, shared out over its decode (first
token → end) by time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bridge.report.energy import gpu_energy
from bridge.report.refresh import energy_keys
from bridge.report.requests import RequestRecord
from bridge.report.series import Series
from bridge.report.window import Window, explicit_window

TOLERANCE = 0.10
MIN_STEADY_S = 10.0
MIN_SHARE = 0.2


def _in_flight(requests: Sequence[RequestRecord], edges: Any) -> Any:
    """Mean requests in flight per bin (exact: each request's overlap with the bin ÷ its length)."""
    import numpy as np

    width = np.diff(edges)
    total = np.zeros(len(width))
    for r in requests:
        overlap = np.clip(np.minimum(edges[1:], r.end_ns) - np.maximum(edges[:-1], r.start_ns), 0, None)
        total += overlap
    return total / width


def _decode_tokens(requests: Sequence[RequestRecord], start: int, end: int) -> float:
    tokens = 0.0
    for r in requests:
        first = r.first_token_ns if r.first_token_ns is not None else r.start_ns
        span = r.end_ns - first
        if span <= 0:
            tokens += r.output_tokens if start <= r.end_ns <= end else 0
            continue
        tokens += r.output_tokens * max(0, min(end, r.end_ns) - max(start, first)) / span
    return tokens


def _longest(steady: Any) -> tuple[int, int]:
    """[i, j) of the longest run of True."""
    best, run_start = (0, 0), None
    for i, ok in enumerate([*steady.tolist(), False]):
        if ok and run_start is None:
            run_start = i
        elif not ok and run_start is not None:
            if i - run_start > best[1] - best[0]:
                best = (run_start, i)
            run_start = None
    return best


def steady_block(series: Sequence[Series], window: Window, requests: Sequence[RequestRecord],
                 total_j: float | None) -> dict[str, Any] | None:
    """The steady state (or `found: false` with its reason) and the energy per output token of it and of the whole
    window; None without a resolved window."""
    import numpy as np

    if window.start_ns is None or window.end_ns is None or window.end_ns <= window.start_ns:
        return None
    start, end = window.start_ns, window.end_ns
    tokens_all = float(sum(r.output_tokens for r in requests))
    out: dict[str, Any] = {"window_j_per_output_token": total_j / tokens_all if total_j and tokens_all else None}
    bin_ns = max(1e9, (end - start) / 200)
    count = max(int((end - start) // bin_ns), 1)
    edges = start + (np.arange(count + 1, dtype=np.int64) * (end - start)) // count  # whole ns: [start, end]
    middle = ((edges[:-1] + edges[1:]) // 2).astype(np.float64)
    concurrency = _in_flight(requests, edges)
    power = np.zeros(count)
    for s in series:
        gauge = s.values.get(energy_keys(s.values)[1])
        ok = ~np.isnan(gauge) if gauge is not None else None
        if gauge is not None and ok is not None and ok.any():
            power += np.interp(middle, s.timestamps[ok].astype(np.float64), gauge[ok])
    core = slice(count // 4, max(count * 3 // 4, count // 4 + 1))
    c_ref, p_ref = float(np.median(concurrency[core])), float(np.median(power[core]))
    steady = (np.abs(concurrency - c_ref) <= TOLERANCE * c_ref) & (np.abs(power - p_ref) <= TOLERANCE * p_ref) \
        if c_ref > 0 and p_ref > 0 else np.zeros(count, dtype=bool)
    i, j = _longest(steady)
    a, b = int(edges[i]), int(edges[j]) if j > i else int(edges[i])
    length_s = (b - a) / 1e9
    if length_s < max(MIN_STEADY_S, MIN_SHARE * (end - start) / 1e9):
        out.update(found=False, reasons=["no_steady_state"], longest_s=length_s)
        return out
    gpus = [gpu_energy(s, explicit_window(a, b, 0)) for s in series]
    used = [g for g in gpus if g.joules is not None]
    energy = sum(g.joules or 0.0 for g in used) if used else None
    tokens = _decode_tokens(requests, a, b)
    out.update(found=True, start_ns=a, end_ns=b, duration_s=length_s, concurrency=float(np.mean(concurrency[i:j])),
               power_w=energy / length_s if energy is not None else None, energy_j=energy,
               uncertainty_j=sum(g.uncertainty_j or 0.0 for g in used) if used else None, output_tokens=tokens,
               j_per_output_token=energy / tokens if energy is not None and tokens > 0 else None, reasons=[])
    return out
