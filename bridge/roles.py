"""Serving roles: which GPUs prefill, which decode, which serve both (aggregated), by the pod each GPU serves.

`--role NAME=NAMESPACE/GLOB` (repeatable) names a role over the pod names dcgm-exporter puts on each GPU (the same
NAMESPACE/GLOB as `--gpu-pods`, bridge/pods.py); the first rule a GPU's pod matches gives its role. A name that
starts with `prefill` is a prefill role, one that starts with `decode` a decode role, any other an aggregated one.
Where the pods' Kubernetes labels are known (`--gpu-pod-selector` discovery records them), built-in rules read the
serving stacks' own role labels for a pod no `--role` rule matched:

- llm-d: `llm-d.ai/role` = `prefill` | `decode` | `both` (llm-d/llm-d-inference-scheduler, pkg/plugins/filter:
  roleLabel, rolePrefill, roleDecode, roleBoth; KServe's LLMInferenceService sets it on its workload pods).
- NVIDIA Dynamo: `nvidia.com/dynamo-sub-component-type` = `prefill` | `decode` on worker pods, absent on an
  aggregated worker (`nvidia.com/dynamo-component-type` = `worker`) (ai-dynamo/dynamo
  deploy/operator/internal/consts/consts.go, as AIPerf 0.13's Dynamo tests select them).

Pure functions of names and labels: the same decision live and offline.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from bridge.errors import ConfigError
from bridge.pods import PodPattern, PodRef, parse_pod_pattern

FLAG = "--role"
RoleKind = Literal["prefill", "decode", "aggregated"]
_NAME = re.compile(r"[a-z0-9]([-_a-z0-9]{0,61}[a-z0-9])?")
LLMD_ROLE = "llm-d.ai/role"
DYNAMO_SUB_COMPONENT = "nvidia.com/dynamo-sub-component-type"
DYNAMO_COMPONENT = "nvidia.com/dynamo-component-type"
_LLMD_ROLES = {"prefill": "prefill", "decode": "decode", "both": "aggregated"}


@dataclass(frozen=True, slots=True)
class RoleRule:
    name: str
    pattern: PodPattern

    def __str__(self) -> str:
        return f"{self.name}={self.pattern}"


def role_kind(name: str) -> RoleKind:
    """A role's kind from its name: `prefill…`, `decode…`, else aggregated."""
    return "prefill" if name.startswith("prefill") else "decode" if name.startswith("decode") else "aggregated"


def parse_role(value: str) -> RoleRule:
    """`NAME=NAMESPACE/GLOB`; a ConfigError (one line: the value, what is wrong, what to write) otherwise."""
    name, equals, pattern = value.strip().partition("=")
    if not equals or not _NAME.fullmatch(name):
        raise ConfigError(f"{FLAG} {value!r}: expected NAME=NAMESPACE/GLOB, NAME of lowercase letters, digits, '-' "
                          f"and '_' (prefill… or decode… for that kind), e.g. {FLAG} prefill=llm/*-prefill-*")
    try:
        return RoleRule(name, parse_pod_pattern(pattern))
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("--gpu-pods", FLAG, 1)) from None


def parse_roles(values: Iterable[str]) -> tuple[RoleRule, ...]:
    """Every `--role` value in the order given (the first that matches a pod wins), duplicates dropped."""
    return tuple(dict.fromkeys(parse_role(value) for value in values))


def role_of_labels(labels: Mapping[str, str]) -> str | None:
    """The role a pod's own labels give (llm-d's or Dynamo's), None where they give none."""
    llmd = _LLMD_ROLES.get(labels.get(LLMD_ROLE, ""))
    if llmd is not None:
        return llmd
    sub = labels.get(DYNAMO_SUB_COMPONENT, "")
    if sub in ("prefill", "decode"):
        return sub
    if labels.get(DYNAMO_COMPONENT) == "worker":
        return "aggregated"
    return None


def role_of_pod(rules: Iterable[RoleRule], pod: PodRef | None,
                labels: Mapping[tuple[str, str], Mapping[str, str]] | None = None) -> str | None:
    """The role of a GPU serving `pod`: the first `--role` rule it matches, else its labels' (`labels`: pods'
    labels by (namespace, name), as discovery recorded them); None for a GPU no rule places (or no pod's)."""
    if pod is None:
        return None
    for rule in rules:
        if rule.pattern.matches(pod):
            return rule.name
    own = (labels or {}).get((pod.namespace, pod.pod))
    return role_of_labels(own) if own is not None else None
