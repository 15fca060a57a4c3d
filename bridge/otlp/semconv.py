"""`--otlp-names semconv`: the GPU metrics under OpenTelemetry's hardware semantic conventions.

For stacks that standardise on OpenTelemetry names (semantic conventions, "Semantic conventions for hardware
metrics": `hw.*`, hw.type `gpu`), a page's GPU families are renamed and scaled before encoding; the default
(`exporter`) forwards the exporter's own names, which the recording rules and dashboards in grafana/ read.

The mapping is `SEMCONV` below, and DECISIONS.md's table ("OTLP forwarding").

Every renamed point gets `hw.type=gpu`, `hw.id` (the GPU's UUID; a MIG instance keeps its `GPU_I_ID` beside it)
and `hw.vendor=NVIDIA`; the exporter's labels stay. `hw.gpu.memory.*` are UpDownCounters in the conventions and
go out as gauges (their values are levels, not increments). Other families keep the exporter's names.

With `--gpu-pods` (either naming), every point of a GPU the exporter attributes to a pod also carries the pod as
the conventions name it (`with_pod_attributes`): `k8s.namespace.name`, `k8s.pod.name` and `k8s.container.name`
(OpenTelemetry semantic conventions, Kubernetes attributes: https://opentelemetry.io/docs/specs/semconv/resource/k8s/).
The conventions define them as resource attributes; here they go on the data points, as the exporter's own
`pod` label does, because one exporter (one resource, its `service.instance.id`) serves the GPUs of many pods.
"""

from __future__ import annotations

from typing import NamedTuple

from bridge.parse import AnyPage
from bridge.pods import pod_of_labels
from bridge.samples import ParsedPage, Sample

K8S_NAMESPACE_NAME = "k8s.namespace.name"
K8S_POD_NAME = "k8s.pod.name"
K8S_CONTAINER_NAME = "k8s.container.name"


class SemconvMetric(NamedTuple):
    name: str
    unit: str
    kind: str  # the Prometheus type the encoder maps: gauge | counter
    scale: float  # exporter value × scale = value in `unit`
    task: str = ""  # hw.gpu.task


_UTIL = ("hw.gpu.utilization", "1", "gauge")
_MEM_UTIL = ("hw.gpu.memory.utilization", "1", "gauge")
_USAGE, _LIMIT = ("hw.gpu.memory.usage", "By", "gauge"), ("hw.gpu.memory.limit", "By", "gauge")
_POWER, _ENERGY = ("hw.power", "W", "gauge"), ("hw.energy", "J", "counter")
MIB = 1048576.0

SEMCONV: dict[str, SemconvMetric] = {
    "DCGM_FI_DEV_GPU_UTIL": SemconvMetric(*_UTIL, 0.01, "general"),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": SemconvMetric(*_UTIL, 1.0, "general"),
    "dcgm_gpu_utilization": SemconvMetric(*_UTIL, 0.01, "general"),
    "DCGM_FI_DEV_DEC_UTIL": SemconvMetric(*_UTIL, 0.01, "decoder"),
    "dcgm_dec_utilization": SemconvMetric(*_UTIL, 0.01, "decoder"),
    "DCGM_FI_DEV_ENC_UTIL": SemconvMetric(*_UTIL, 0.01, "encoder"),
    "dcgm_enc_utilization": SemconvMetric(*_UTIL, 0.01, "encoder"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": SemconvMetric(*_MEM_UTIL, 0.01),
    "dcgm_mem_copy_utilization": SemconvMetric(*_MEM_UTIL, 0.01),
    "DCGM_FI_DEV_FB_USED": SemconvMetric(*_USAGE, MIB),
    "dcgm_fb_used": SemconvMetric(*_USAGE, MIB),
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": SemconvMetric(*_LIMIT, 1.0),
    "DCGM_FI_DEV_POWER_USAGE": SemconvMetric(*_POWER, 1.0),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": SemconvMetric(*_POWER, 1.0),
    "dcgm_power_usage": SemconvMetric(*_POWER, 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": SemconvMetric(*_ENERGY, 0.001),
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": SemconvMetric(*_ENERGY, 1.0),
    "dcgm_total_energy_consumption": SemconvMetric(*_ENERGY, 0.001),
}
UNITS = {m.name: m.unit for m in SEMCONV.values()}
HELP = {
    "hw.gpu.utilization": "Fraction of time spent in a specific task (hw.gpu.task).",
    "hw.gpu.memory.utilization": "Fraction of time spent accessing memory.",
    "hw.gpu.memory.usage": "GPU memory used.",
    "hw.gpu.memory.limit": "Size of the GPU memory.",
    "hw.power": "Instantaneous power consumed by the component.",
    "hw.energy": "Energy consumed by the component.",
}


def page_to_semconv(page: AnyPage) -> ParsedPage:
    """`page` with its GPU families renamed, scaled and attributed as the conventions say; others as they were."""
    samples: list[Sample] = []
    types = dict(page.types)
    helps = dict(page.helps)
    for sample in page.samples:
        # A counter may come suffixed (`_total` from an exposition that appends it); the table has bare names.
        metric = SEMCONV.get(sample.name) or SEMCONV.get(sample.name.removesuffix("_total"))
        if metric is None:
            samples.append(sample)
            continue
        labels = dict(sample.labels)
        uuid = labels.get("UUID") or labels.get("uuid")
        labels["hw.type"] = "gpu"
        labels["hw.vendor"] = "NVIDIA"
        if uuid:
            labels["hw.id"] = uuid
        if metric.task:
            labels["hw.gpu.task"] = metric.task
        samples.append(Sample(metric.name, labels, sample.value * metric.scale, sample.timestamp_ms))
        types[metric.name] = metric.kind
        helps[metric.name] = HELP[metric.name]
    return ParsedPage(samples, types, helps, list(page.dropped))


def with_pod_attributes(page: AnyPage) -> ParsedPage:
    """`page` with the pod of each attributed series as the Kubernetes conventions' attributes (module docstring)."""
    samples: list[Sample] = []
    for sample in page.samples:
        pod = pod_of_labels(sample.labels)
        if pod is None:
            samples.append(sample)
            continue
        labels = {**sample.labels, K8S_NAMESPACE_NAME: pod.namespace, K8S_POD_NAME: pod.pod}
        if pod.container:
            labels[K8S_CONTAINER_NAME] = pod.container
        samples.append(sample._replace(labels=labels))
    return ParsedPage(samples, page.types, page.helps, list(page.dropped))
