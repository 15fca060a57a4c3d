"""Which GPUs serve the benchmark's pods: `--gpu-pods NAMESPACE/GLOB` against dcgm-exporter's pod labels.

dcgm-exporter labels a GPU's series with the pod it is allocated to only when the pod got the GPU through
the device plugin (or a DRA claim) and the exporter reads the kubelet's pod-resources socket in Kubernetes
mode: `namespace`, `pod`, `container` (`pod_namespace`, `pod_name`, `container_name` with `-o` and in older
releases; older releases wrote empty strings for GPUs no pod holds, current ones leave the labels out;
NVIDIA/dcgm-exporter `pkg/dcgmexporter/kubernetes.go`). Everything here is a pure function of those labels:
the same decision live (per scrape) and offline (per record of the record log).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal, NamedTuple

from bridge.errors import ConfigError
from bridge.samples import GpuRecord

FLAG = "--gpu-pods"
# A namespace is a DNS-1123 label; a pod name a DNS-1123 subdomain. A glob adds `*`, `?` and `[...]`.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_GLOB = re.compile(r"[-a-z0-9.*?\[\]!]{1,253}")

# How one GPU record stands to the patterns.
Attribution = Literal["selected", "other_pod", "unattributed"]

FIX = ("dcgm-exporter labels a GPU with its pod only when the pod requests it through the device plugin "
       "(resources.limits nvidia.com/gpu) or a DRA claim, and the exporter runs in Kubernetes mode "
       "(DCGM_EXPORTER_KUBERNETES=true) with the kubelet's pod-resources socket mounted "
       "(/var/lib/kubelet/pod-resources)")


class PodRef(NamedTuple):
    """The pod a GPU (or MIG instance) is allocated to, as the exporter labels it."""

    namespace: str
    pod: str
    container: str | None = None

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class PodPattern:
    """One `--gpu-pods` value: a namespace, exactly, and a glob over pod names in it."""

    namespace: str
    glob: str

    def matches(self, pod: PodRef) -> bool:
        return pod.namespace == self.namespace and fnmatchcase(pod.pod, self.glob)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.glob}"


def parse_pod_pattern(value: str) -> PodPattern:
    """`NAMESPACE/GLOB`; a ConfigError (one line: the value, what is wrong, what to write) otherwise."""
    namespace, slash, glob = value.strip().partition("/")
    if not slash:
        raise ConfigError(f"{FLAG} {value!r}: expected NAMESPACE/GLOB, e.g. {FLAG} bench/llama-*")
    if not _NAMESPACE.fullmatch(namespace):
        raise ConfigError(f"{FLAG} {value!r}: {namespace!r} is not a namespace name (lowercase letters, digits "
                          "and '-', at most 63); write NAMESPACE/GLOB, e.g. bench/llama-*")
    if not _GLOB.fullmatch(glob):
        raise ConfigError(f"{FLAG} {value!r}: {glob!r} is not a pod-name glob (lowercase letters, digits, '-', '.', "
                          "'*', '?', '[...]'); a label selector goes to --gpu-pod-selector")
    return PodPattern(namespace, glob)


def parse_pod_patterns(values: Iterable[str]) -> tuple[PodPattern, ...]:
    """Every `--gpu-pods` value, duplicates dropped, in the order given."""
    patterns: list[PodPattern] = []
    for value in values:
        pattern = parse_pod_pattern(value)
        if pattern not in patterns:
            patterns.append(pattern)
    return tuple(patterns)


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    """The first of `names` that is set and not empty (older exporters wrote "" for a GPU no pod holds)."""
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def pod_of_labels(labels: Mapping[str, str]) -> PodRef | None:
    """The pod a series' labels attribute its GPU to; None when the GPU is unattributed."""
    namespace = _label(labels, "namespace", "pod_namespace")
    pod = _label(labels, "pod", "pod_name")
    if namespace is None or pod is None:
        return None
    return PodRef(namespace, pod, _label(labels, "container", "container_name"))


def pod_of_record(record: GpuRecord) -> PodRef | None:
    """The pod a GPU record is attributed to (the record log keeps `namespace` and `pod_name`)."""
    if not record.namespace or not record.pod_name:
        return None
    return PodRef(record.namespace, record.pod_name)


def attribution(patterns: Iterable[PodPattern], pod: PodRef | None) -> Attribution:
    if pod is None:
        return "unattributed"
    return "selected" if any(p.matches(pod) for p in patterns) else "other_pod"


def serves(patterns: Iterable[PodPattern], pod: PodRef | None) -> bool:
    """Whether a GPU attributed to `pod` serves one of the benchmark's pods."""
    return attribution(patterns, pod) == "selected"


def shared_board(patterns: Iterable[PodPattern], pods: Iterable[PodRef | None]) -> bool:
    """Whether a board (one GPU UUID) whose series name `pods` at one scrape serves a matching pod and another
    pod too (MIG instances, time-slicing, MPS): its energy is the whole board's, so it is not counted."""
    patterns = tuple(patterns)
    kinds = {attribution(patterns, pod) for pod in pods}
    return {"selected", "other_pod"} <= kinds
