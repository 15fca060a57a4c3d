"""Per-request energy: each GPU's energy over the window shared among the benchmark's requests in flight.

Input: AIPerf 0.13's per-request records, `profile_export.jsonl` (`--export-level records`; one
`MetricRecordInfo` a line: `metadata.request_start_ns` / `request_end_ns` / `x_request_id` / `session_num` /
`benchmark_phase`, `metrics.<tag> = {"value", "unit"}` in display units: `time_to_first_token` in ms,
`input_sequence_length` and `output_sequence_length` in tokens; ai-dynamo/aiperf 0.13
`common/models/record_models.py`, `post_processors/record_export_jsonl_writer.py`). Profiling records only
(warm-up requests are outside the window AIPerf reports); a bad line is counted, never the file.

The rule (one, for every GPU; DESIGN.md "Per-request energy"):
- A GPU's energy is the report's (`energy.gpu_energy`: the counter's increase over exactly the window, or the power
  integral where the counter is unusable), shared over the counter's own intervals: between successive readings
  that changed, in proportion to the counter's increase over each (time-uniformly where the counter shows none).
  Inside an interval the power is taken as flat.
- At each instant that energy goes to the requests the GPU serves then, by the GPU's role: a `prefill` GPU by
  the input tokens each request has in prefill (its input tokens per second of its prefill, start → first
  token); a `decode` GPU equally among the requests decoding (first token → end); an `aggregated` GPU (the
  default) equally among the requests in flight, each request's two stages by their time.
- An instant with no such request is unattributed (idle gaps): reported, never spread. Per-request energies plus
  the unattributed energy equal the GPUs' energy (the report's) to rounding.

A request without a first token (non-streaming, failed) takes its whole span as both stages. Uncertainty per
request: its share of each GPU's stated uncertainty (in quadrature over GPUs), plus, for each of its edges that
falls inside a counter interval, half of what it got from that interval (the power inside an interval is not
seen, so its share there is known only to within about that much).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from bridge.report.energy import GpuEnergy
from bridge.report.refresh import energy_keys
from bridge.report.series import Series
from bridge.roles import RoleKind

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

REQUESTS_FILE = "gpu_telemetry_requests.jsonl"
AIPERF_RECORDS_FILE = "profile_export.jsonl"
# Fewer requests than this in the window: the distribution's tail (p99) rests on too little (verdict reason).
MIN_REQUESTS = 20
_TIME_UNITS_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "sec": 1e9, "s": 1e9}
GpuKey = tuple[str, tuple[str, str | None]]  # (endpoint, identity)


class RequestsInputError(ValueError):
    """The per-request file cannot be read at all (missing, not JSON lines)."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    start_ns: int
    first_token_ns: int | None
    end_ns: int
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class RequestsRead:
    path: Path
    sha256: str
    requests: tuple[RequestRecord, ...]
    skipped: int = 0  # lines that are no profiling request (warm-up) or cannot be read
    errors: tuple[str, ...] = ()  # the first few unreadable lines, said


def read_requests(path: Path) -> RequestsRead:
    """AIPerf's `profile_export.jsonl` → its profiling requests, with the file's SHA-256 as read."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RequestsInputError(f"{path}: cannot be read ({exc.strerror or exc}); give AIPerf's "
                                 f"{AIPERF_RECORDS_FILE} (aiperf profile --export-level records)") from None
    out: list[RequestRecord] = []
    errors: list[str] = []
    skipped = 0
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            doc = None
        record = _request_of(doc) if isinstance(doc, dict) else "not a JSON object"
        if isinstance(record, RequestRecord):
            out.append(record)
            continue
        skipped += 1
        if record and len(errors) < 5:
            errors.append(f"line {number}: {record}")
    if not out and skipped and len(errors) == skipped:
        raise RequestsInputError(f"{path}: no line is an AIPerf request record ({errors[0]}); give AIPerf's "
                                 f"{AIPERF_RECORDS_FILE}")
    return RequestsRead(path, hashlib.sha256(data).hexdigest(), tuple(out), skipped, tuple(errors))


def _request_of(doc: Mapping[str, Any]) -> RequestRecord | str | None:
    """One record, or why it is none (None: a warm-up record, left out without complaint)."""
    meta, metrics = doc.get("metadata"), doc.get("metrics")
    if not isinstance(meta, Mapping):
        return "no metadata"
    if meta.get("benchmark_phase") not in (None, "profiling"):
        return None
    start, end = meta.get("request_start_ns"), meta.get("request_end_ns")
    if not isinstance(start, int) or not isinstance(end, int) or not _is_int(start) or not _is_int(end) \
            or end < start:
        return "no request_start_ns ≤ request_end_ns"
    metrics = metrics if isinstance(metrics, Mapping) else {}
    ttft = _metric(metrics, "time_to_first_token")
    ttft_ns = None if ttft is None else _ns(ttft)
    first = None if ttft_ns is None else min(max(start + round(ttft_ns), start), end)
    rid = meta.get("x_request_id") or meta.get("session_num")
    if not isinstance(rid, str | int) or isinstance(rid, bool):
        return "no x_request_id or session_num"
    tokens_in = _tokens(metrics, "input_sequence_length")
    tokens_out = _tokens(metrics, "output_sequence_length", "output_token_count")
    return RequestRecord(str(rid), int(start), first, int(end), tokens_in, tokens_out)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _metric(metrics: Mapping[str, Any], tag: str) -> Mapping[str, Any] | None:
    entry = metrics.get(tag)
    if not isinstance(entry, Mapping):
        return None
    value = entry.get("value")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        return None
    return entry


def _ns(entry: Mapping[str, Any]) -> float | None:
    scale = _TIME_UNITS_NS.get(str(entry.get("unit", "ms")))
    return None if scale is None else float(entry["value"]) * scale


def _tokens(metrics: Mapping[str, Any], *tags: str) -> int:
    for tag in tags:
        entry = _metric(metrics, tag)
        if entry is not None:
            return int(entry["value"])
    return 0


# -- attribution -------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RequestEnergy:
    request: RequestRecord
    energy_j: float
    uncertainty_j: float
    prefill_j: float  # on prefill GPUs, and the prefill stage's share on aggregated ones
    decode_j: float

    @property
    def j_per_output_token(self) -> float | None:
        return self.energy_j / self.request.output_tokens if self.request.output_tokens > 0 else None


@dataclass(frozen=True, slots=True)
class Attribution:
    requests: tuple[RequestEnergy, ...]
    unattributed_j: float
    total_j: float  # Σ of the GPUs' energy the report states: what was shared
    gpus: int
    by_kind: Mapping[str, int] = field(default_factory=dict)  # GPUs per role kind


def gpu_intervals(s: Series, gpu: GpuEnergy, start: int, end: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(edges, energies): the window cut at the GPU counter's changes, each piece's share of the GPU's energy (J)."""
    import numpy as np

    joules = gpu.joules or 0.0
    counter = s.values.get(energy_keys(s.values)[0])
    edges = np.array([start, end], dtype=np.float64)
    if counter is None or end <= start:
        return edges, np.array([joules])
    ts = s.timestamps
    ok = ~np.isnan(counter)
    t, c = ts[ok].astype(np.float64), counter[ok]
    changed = np.concatenate(([True], np.diff(c) != 0)) if c.size else np.zeros(0, dtype=bool)
    t, c = t[changed], c[changed]
    inside = (t > start) & (t < end)
    if c.size < 2 or not inside.any():
        return edges, np.array([joules])
    edges = np.concatenate(([float(start)], t[inside], [float(end)]))
    readings = np.interp(edges, t, c)
    steps = np.maximum(np.diff(readings), 0.0)  # a reset's drop shares nothing; the total is the report's anyway
    total = float(steps.sum())
    shares = steps / total if total > 0 else np.diff(edges) / (end - start)
    return edges, shares * joules


@dataclass(frozen=True, slots=True)
class _Stages:
    lo: NDArray[np.float64]
    hi: NDArray[np.float64]
    weight: NDArray[np.float64]


def _stages(requests: Sequence[RequestRecord], kind: RoleKind) -> _Stages:
    import numpy as np

    start = np.array([r.start_ns for r in requests], dtype=np.float64)
    end = np.array([r.end_ns for r in requests], dtype=np.float64)
    first = np.array([r.first_token_ns if r.first_token_ns is not None else np.nan for r in requests],
                     dtype=np.float64)
    none = np.isnan(first)
    if kind == "aggregated":
        return _Stages(start, end, np.ones_like(start))
    if kind == "decode":
        return _Stages(np.where(none, start, first), end, np.ones_like(start))
    hi = np.where(none, end, first)
    span_s = (hi - start) / 1e9
    tokens = np.array([max(r.input_tokens, 1) for r in requests], dtype=np.float64)
    rate = np.divide(tokens, span_s, out=np.zeros_like(span_s), where=span_s > 0)
    return _Stages(start, hi, rate)


def _share_of_gpu(edges: NDArray[np.float64], energies: NDArray[np.float64], st: _Stages,
                  first: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64], float,
                                                      NDArray[np.float64]]:
    """(each request's energy, its prefill stage's part, unattributed, its edge terms) on one GPU."""
    import numpy as np

    lo_w, hi_w = edges[0], edges[-1]
    lo, hi = np.clip(st.lo, lo_w, hi_w), np.clip(st.hi, lo_w, hi_w)
    live = (hi > lo) & (st.weight > 0)
    cuts = np.unique(np.concatenate((edges, lo[live], hi[live])))
    seg_len = np.diff(cuts)
    k = np.clip(np.searchsorted(edges, cuts[:-1], side="right") - 1, 0, len(energies) - 1)
    widths = np.diff(edges)
    density = np.divide(energies, widths, out=np.zeros_like(energies), where=widths > 0)
    seg_e = density[k] * seg_len
    starts = np.searchsorted(cuts, lo[live])
    ends = np.searchsorted(cuts, hi[live])
    w = st.weight[live]
    weight_d = np.zeros(len(cuts))
    count_d = np.zeros(len(cuts), dtype=np.int64)
    np.add.at(weight_d, starts, w)
    np.add.at(weight_d, ends, -w)
    np.add.at(count_d, starts, 1)
    np.add.at(count_d, ends, -1)
    active = np.cumsum(count_d)[:-1] > 0
    total_w = np.where(active, np.cumsum(weight_d)[:-1], 0.0)
    per_weight = np.divide(seg_e, total_w, out=np.zeros_like(seg_e), where=active & (total_w > 0))
    unattributed = float(seg_e[~active].sum())
    cum = np.concatenate(([0.0], np.cumsum(per_weight)))
    energy = np.zeros(len(st.lo))
    energy[live] = w * (cum[ends] - cum[starts])
    mid = np.searchsorted(cuts, np.clip(first, lo, hi)[live])  # the prefill stage's part (aggregated GPUs)
    prefill = np.zeros(len(st.lo))
    prefill[live] = w * (cum[np.clip(mid, starts, ends)] - cum[starts])
    edge_terms = np.zeros(len(st.lo))
    for at in (lo[live], hi[live]):  # an edge inside a counter interval: half of what that interval gave
        j = np.clip(np.searchsorted(edges, at, side="right") - 1, 0, len(energies) - 1)
        inner = (at > edges[j]) & (at < edges[j + 1])
        a = np.searchsorted(cuts, np.maximum(edges[j], lo[live]))
        b = np.searchsorted(cuts, np.minimum(edges[j + 1], hi[live]))
        got = w * (cum[np.maximum(a, b)] - cum[a])
        edge_terms[live] += np.where(inner, 0.5 * got, 0.0)
    return energy, prefill, unattributed, edge_terms


def attribute(requests: Sequence[RequestRecord], gpus: Iterable[tuple[Series, GpuEnergy]], start_ns: int, end_ns: int,
              roles: Mapping[GpuKey, RoleKind] | None = None) -> Attribution:
    """Share each GPU's energy over [start, end] among `requests` by the module's rule; `roles`: each GPU's role
    kind by (endpoint, identity), `aggregated` where not given."""
    import numpy as np

    roles = roles or {}
    n = len(requests)
    energy, prefill = np.zeros(n), np.zeros(n)
    spread = np.zeros(n)
    squares = np.zeros(n)
    unattributed = total = 0.0
    count = 0
    by_kind: dict[str, int] = {}
    stages: dict[RoleKind, _Stages] = {}
    first = np.array([r.first_token_ns if r.first_token_ns is not None else r.start_ns for r in requests],
                     dtype=np.float64)
    for s, gpu in gpus:
        if gpu.joules is None:
            continue
        kind = roles.get((s.endpoint, s.meta.identity), "aggregated")
        by_kind[kind] = by_kind.get(kind, 0) + 1
        count += 1
        total += gpu.joules
        edges, pieces = gpu_intervals(s, gpu, start_ns, end_ns)
        if not n:
            unattributed += gpu.joules
            continue
        st = stages.setdefault(kind, _stages(requests, kind))
        got, pre, idle, edge = _share_of_gpu(edges, pieces, st, first)
        energy += got
        prefill += got if kind == "prefill" else 0.0 if kind == "decode" else pre
        unattributed += idle
        spread += edge
        if gpu.joules > 0 and gpu.uncertainty_j:
            squares += (got / gpu.joules * gpu.uncertainty_j) ** 2
    uncertainty = np.sqrt(squares) + spread
    out = tuple(RequestEnergy(r, float(e), float(u), float(p), float(e - p))
                for r, e, u, p in zip(requests, energy, uncertainty, prefill, strict=True))
    return Attribution(out, unattributed, total, count, by_kind)


# -- the report's block and the file ---------------------------------------------------------------------------

def _percentiles(values: Sequence[float]) -> dict[str, float] | None:
    import numpy as np

    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    return {"avg": float(arr.mean()), "p50": float(np.percentile(arr, 50)), "p90": float(np.percentile(arr, 90)),
            "p99": float(np.percentile(arr, 99))}


def requests_block(attribution: Attribution, read: RequestsRead) -> dict[str, Any]:
    """`telemetry_data.requests`: what was read (file, SHA-256, requests, skipped lines), the energy shared, the
    unattributed part, and the per-request distribution (J; J per output token), with the verdict's reasons."""
    attributed = [r for r in attribution.requests if r.energy_j > 0]
    per_token = [t for r in attributed if (t := r.j_per_output_token) is not None]
    attributed_j = math.fsum(r.energy_j for r in attribution.requests)
    block: dict[str, Any] = {
        "input": {"file": read.path.name, "sha256": read.sha256, "requests": len(read.requests),
                  "skipped_lines": read.skipped},
        "rule": "prefill GPUs: by input tokens in prefill; decode GPUs: by requests decoding; aggregated GPUs: "
                "by requests in flight; idle instants unattributed",
        "gpus": attribution.gpus,
        "roles": dict(sorted(attribution.by_kind.items())),
        "requests_attributed": len(attributed),
        "energy_j": attribution.total_j,
        "attributed_j": attributed_j,
        "unattributed_j": attribution.unattributed_j,
        "energy_per_request_j": _percentiles([r.energy_j for r in attributed]),
        "energy_per_output_token_j": _percentiles(per_token),
        "uncertainty_per_request_j": _percentiles([r.uncertainty_j for r in attributed]),
    }
    reasons = []
    if len(attributed) < MIN_REQUESTS:
        reasons.append("too_few_requests")
    if not per_token and attributed:
        reasons.append("no_output_tokens")
    block["valid"] = not reasons
    block["reasons"] = reasons
    block["file"] = REQUESTS_FILE
    return block


def request_lines(attribution: Attribution) -> bytes:
    """`gpu_telemetry_requests.jsonl`: one line per request id, in AIPerf's record order."""
    return b"".join(orjson.dumps({
        "request_id": r.request.request_id,
        "request_start_ns": r.request.start_ns,
        "request_end_ns": r.request.end_ns,
        "input_tokens": r.request.input_tokens,
        "output_tokens": r.request.output_tokens,
        "energy_j": r.energy_j,
        "uncertainty_j": r.uncertainty_j,
        "prefill_energy_j": r.prefill_j,
        "decode_energy_j": r.decode_j,
        "energy_per_output_token_j": r.j_per_output_token,
    }) + b"\n" for r in attribution.requests)
