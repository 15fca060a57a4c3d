"""`telemetry_data.roles`: each serving role's GPUs, energy ± uncertainty, average power and efficiency.

A GPU's role is that of the pod its series names (its first record's `namespace`/`pod_name`; bridge/roles.py: the
`--role` rules, else the pod's llm-d or Dynamo labels). A role's energy is the sum of its GPUs' (the report's per-GPU
energy, energy.py), its uncertainty and bound the sums of theirs, as the run's total sums them. Efficiency from
AIPerf's token counts (its per-request records, the profiling requests): J per input token for a prefill role, J per
output token for a decode role, J per token (input + output) for an aggregated one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bridge.pods import PodRef
from bridge.report.energy import GpuEnergy
from bridge.report.requests import GpuKey, RequestRecord
from bridge.report.series import Series
from bridge.roles import RoleKind, RoleRule, role_kind, role_of_pod

PodLabels = Mapping[tuple[str, str], Mapping[str, str]]


def gpu_roles(series: Sequence[Series], rules: Sequence[RoleRule], labels: PodLabels | None) -> dict[GpuKey, str]:
    """Each GPU's role name, for the GPUs a rule or a pod's labels place."""
    out: dict[GpuKey, str] = {}
    for s in series:
        pod = PodRef(s.meta.namespace, s.meta.pod_name) if s.meta.namespace and s.meta.pod_name else None
        role = role_of_pod(rules, pod, labels)
        if role is not None:
            out[(s.endpoint, s.meta.identity)] = role
    return out


def role_kinds(roles: Mapping[GpuKey, str]) -> dict[GpuKey, RoleKind]:
    return {key: role_kind(name) for key, name in roles.items()}


_EFFICIENCY = {"prefill": ("j_per_input_token", "input"), "decode": ("j_per_output_token", "output"),
               "aggregated": ("j_per_token", "total")}


def roles_block(series: Sequence[Series], gpus: Sequence[GpuEnergy], roles: Mapping[GpuKey, str],
                duration_s: float, requests: Sequence[RequestRecord] | None) -> dict[str, Any]:
    """One entry per role, by name: kind, GPUs, pods, energy_j ± uncertainty_j (bound_j), average_power_w, the
    token counts and the kind's efficiency; `valid` and `reasons` (no_token_counts, no_role_energy)."""
    tokens = None if requests is None else {"input": sum(r.input_tokens for r in requests),
                                            "output": sum(r.output_tokens for r in requests)}
    members: dict[str, list[tuple[Series, GpuEnergy]]] = {}
    for s, g in zip(series, gpus, strict=True):
        name = roles.get((s.endpoint, s.meta.identity))
        if name is not None:
            members.setdefault(name, []).append((s, g))
    out: dict[str, Any] = {}
    for name in sorted(members):
        used = [(s, g) for s, g in members[name] if g.joules is not None]
        kind = role_kind(name)
        energy = sum(g.joules or 0.0 for _, g in used) if used else None
        entry: dict[str, Any] = {
            "kind": kind,
            "gpus": [f"{s.endpoint} {s.meta.gpu_uuid}" for s, _ in members[name]],
            "pods": sorted({f"{s.meta.namespace}/{s.meta.pod_name}" for s, _ in members[name]}),
            "energy_j": energy,
            "uncertainty_j": sum(g.uncertainty_j or 0.0 for _, g in used) if used else None,
            "bound_j": sum(g.bound_j or 0.0 for _, g in used) if used else None,
            "average_power_w": energy / duration_s if energy is not None and duration_s > 0 else None,
        }
        reasons = [] if used else ["no_role_energy"]
        if tokens is None:
            reasons.append("no_token_counts")
        else:
            entry["input_tokens"], entry["output_tokens"] = tokens["input"], tokens["output"]
            key, which = _EFFICIENCY[kind]
            count = tokens["input"] + tokens["output"] if which == "total" else tokens[which]
            entry[key] = energy / count if energy is not None and count > 0 else None
            if not count:
                reasons.append("no_token_counts")
        entry["valid"] = not reasons
        entry["reasons"] = reasons
        out[name] = entry
    return out
