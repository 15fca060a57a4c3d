"""ProfileSpec → a `jobset.x-k8s.io/v1alpha2` JobSet, as plain dicts (no client models, no I/O).

Shape (AIPerf's controller job, ai-dynamo/aiperf `src/aiperf/kubernetes/jobset_builder.py`, with the
telemetry container made a native sidecar):

    JobSet <job-id>                        successPolicy All on [controller], ttlSecondsAfterFinished
    └─ replicatedJob controller            1 replica, Indexed, backoffLimit 0, pod restartPolicy Never
       ├─ initContainers[gpu-telemetry-manager]   restartPolicy Always (native sidecar, k8s >= 1.29)
       │    or containers[gpu-telemetry-manager]  with legacy_sidecar: exits after a done-marker file
       └─ containers[control-plane]       `aiperf profile … --no-gpu-telemetry`, artifacts on /artifacts

A Job completes only when its regular containers have exited; a native sidecar is stopped by the
kubelet with SIGTERM after that, which is when ours takes its final scrape, writes the report and
merges `telemetry_data` into AIPerf's profile_export_aiperf.json. A legacy (regular) container must
exit by itself, so the control-plane command writes DCGM_BRIDGE_DONE_FILE when the benchmark ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from bridge import __version__
from bridge.kube import rbac
from bridge.kube.validate import quantity_value

API_VERSION = "jobset.x-k8s.io/v1alpha2"
KIND = "JobSet"
JOB_ID_LABEL = "aiperf.nvidia.com/job-id"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MODE_ANNOTATION = "dcgm-bridge/gpu-telemetry"
HOLD_ANNOTATION = "dcgm-bridge/results-hold-seconds"
CONTROLLER = "controller"
CONTROL_PLANE = "control-plane"
SIDECAR = "gpu-telemetry-manager"
HEALTH_PORT = 8086
ARTIFACTS = "/artifacts"
DONE_FILE = f"{ARTIFACTS}/.dcgm-bridge-benchmark-done"
FETCHED_FILE = f"{ARTIFACTS}/.dcgm-bridge-results-fetched"
# The control API's token: the sidecar makes it at start into a memory emptyDir that only it and the benchmark
# container mount (no Secret to create, nothing on a disk); POST /phases and /complete need it.
CONTROL_TOKEN_DIR = "/run/dcgm-bridge"
CONTROL_TOKEN_FILE = f"{CONTROL_TOKEN_DIR}/control-token"
_TOKEN_VOLUME = {"name": "control-token", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
_TOKEN_MOUNT = {"name": "control-token", "mountPath": CONTROL_TOKEN_DIR}
_TOKEN_ENV = {"name": "DCGM_BRIDGE_CONTROL_TOKEN_FILE", "value": CONTROL_TOKEN_FILE}
METRICS_CSV_PATH = "/tmp/dcgm-bridge-metrics.csv"
DEFAULT_IMAGE = "nvcr.io/nvidia/aiperf:latest"
DEFAULT_SIDECAR_IMAGE = f"dcgm-bridge:{__version__}"
DEFAULT_CPU = "25m"
DEFAULT_MEMORY = "192Mi"
RUN_AS = 1000

# Start-up and shutdown budgets of the sidecar, in CPU-seconds. Under a CFS limit of L cores a task
# needing C CPU-seconds takes C / L wall seconds: 25m turns 1 CPU-second into 40 s. The probes and the
# grace period are sized from these with a 2x margin, so raising the CPU override shortens them.
# Measured (tests/kube/test_sidecar_budget.py, and under a real 25m cgroup): 0.31 CPU-s to /readyz
# (13 s wall at 25m), 0.22-0.31 CPU-s to shut down after a short run; the budgets keep ~5x headroom.
SIDECAR_START_CPU_SECONDS = 1.5
SIDECAR_SHUTDOWN_CPU_SECONDS = 1.5
# The final report's statistics run over every record the sidecar spooled during the run (sidecar/spool.py):
# bench/bench_report.py measured 0.62 CPU-s for a 1-hour 64-GPU run (691,200 records, ~9e-7 per record)
# and 0.17 for a 90 s one (the fixed part, within SIDECAR_SHUTDOWN_CPU_SECONDS); rounded up, so long runs
# get a longer grace. (If the spool could not be kept, the report re-reads the log at ~2e-5 per record and
# may need the grace of a longer run, or `dcgm-bridge report` afterwards.)
REPORT_CPU_SECONDS_PER_RECORD = 1e-6
# And per GPU, whatever the run's length: the readings' ages (report/ages.py) fit the counter's hold grid on at most
# 300 readings, ~0.05 CPU-s, or ~0.6 where the grid's clock drifts and its period is searched (bench_longrun,
# an hour at 3 Hz, on this project's 2-CPU machine); the drifting case is budgeted, with a quarter to spare.
REPORT_CPU_SECONDS_PER_GPU = 0.75
PROBE_PERIOD_SECONDS = 5
MARGIN = 2


@dataclass(frozen=True)
class SecretRef:
    """A key of a Secret in the JobSet's namespace: the only way a credential enters the JobSet."""

    name: str
    key: str

    @classmethod
    def parse(cls, text: str, default_key: str) -> SecretRef:
        name, _, key = text.partition(":")
        return cls(name, key or default_key)


@dataclass(frozen=True)
class Toleration:
    key: str
    value: str | None = None
    effect: str | None = None

    @classmethod
    def parse(cls, text: str) -> Toleration:
        """kubectl-taint syntax: `key=value:NoSchedule`, `key:NoSchedule`, `key`."""
        spec, _, effect = text.partition(":")
        key, eq, value = spec.partition("=")
        return cls(key, value if eq else None, effect or None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": "Equal" if self.value is not None else "Exists"}
        if self.value is not None:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        return out


@dataclass(frozen=True)
class Benchmark:
    """The `aiperf profile` flags the control-plane container runs with."""

    model: str
    url: str
    endpoint_type: str = "chat"
    endpoint: str | None = None
    streaming: bool = False
    concurrency: int | None = None
    request_count: int | None = None
    cpu: str = "2"
    memory: str = "2Gi"

    def aiperf_args(self) -> list[str]:
        args = ["aiperf", "profile", "--model", self.model, "--url", self.url, "--endpoint-type", self.endpoint_type]
        if self.endpoint:
            args += ["--endpoint", self.endpoint]
        if self.streaming:
            args.append("--streaming")
        if self.concurrency is not None:
            args += ["--concurrency", str(self.concurrency)]
        if self.request_count is not None:
            args += ["--request-count", str(self.request_count)]
        # The sidecar does the telemetry; AIPerf's own manager would scrape the same exporters twice.
        return [*args, "--artifact-dir", ARTIFACTS, "--no-gpu-telemetry"]


@dataclass(frozen=True)
class Telemetry:
    """The gpu-telemetry-manager container; `enabled=False` omits it entirely."""

    enabled: bool = True
    urls: tuple[str, ...] = ()  # normalised, k8s:// items already expanded (or kept for --dry-run)
    metrics_csv: str | None = None  # the custom-metrics CSV's text, carried in the environment
    legacy_sidecar: bool = False
    image: str = DEFAULT_SIDECAR_IMAGE
    cpu: str = DEFAULT_CPU
    memory: str = DEFAULT_MEMORY
    env: tuple[tuple[str, str], ...] = ()  # AIPERF_GPU_* and OTEL_* passed through, secrets excluded
    expected_records: int = 0  # GPU records the run should produce (sizes the shutdown grace period)
    expected_gpus: int = 0  # GPUs on the pages (sizes it too)
    otlp_headers_secret: SecretRef | None = None
    exporter_token_secret: SecretRef | None = None
    gpu_pods: tuple[str, ...] = ()  # NAMESPACE/GLOB, passed to the sidecar (issue 31)
    gpu_pod_selectors: tuple[str, ...] = ()  # NAMESPACE/SELECTOR: the sidecar discovers through the API
    exporter_service: str | None = None  # k8s://NS/SERVICE the sidecar discovers exporters in (with selectors)
    roles: tuple[str, ...] = ()  # NAME=NAMESPACE/GLOB, passed to the sidecar (issue 46)

    @property
    def discovers_pods(self) -> bool:
        return self.enabled and bool(self.gpu_pod_selectors)

    @property
    def exporter_namespace(self) -> str | None:
        """The namespace of the exporter Service the sidecar discovers in, when it discovers pods."""
        if not self.discovers_pods or not self.exporter_service:
            return None
        return self.exporter_service.removeprefix("k8s://").split("/")[0]

    @property
    def mode(self) -> str:
        return "disabled" if not self.enabled else "legacy" if self.legacy_sidecar else "native"


@dataclass(frozen=True)
class Placement:
    service_account: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    queue: str | None = None


@dataclass(frozen=True)
class ProfileSpec:
    job_id: str
    namespace: str
    benchmark: Benchmark
    telemetry: Telemetry = field(default_factory=Telemetry)
    placement: Placement = field(default_factory=Placement)
    image: str = DEFAULT_IMAGE
    artifacts_pvc: str | None = None
    ttl_seconds: int = 300
    results_hold_seconds: int = 0


def cpu_cores(cpu: str) -> Decimal:
    return quantity_value(cpu)


def startup_failure_threshold(cpu: str) -> int:
    """Probe failures allowed while the sidecar starts at this CPU limit (25m → 24 × 5 s = 120 s)."""
    wall = SIDECAR_START_CPU_SECONDS / float(cpu_cores(cpu)) * MARGIN
    return max(6, math.ceil(wall / PROBE_PERIOD_SECONDS))


def termination_grace_seconds(telemetry: Telemetry) -> int:
    """Time the kubelet gives the sidecar after SIGTERM for the final scrape, report and merge."""
    if not telemetry.enabled:
        return 30
    cpu_seconds = (SIDECAR_SHUTDOWN_CPU_SECONDS + telemetry.expected_records * REPORT_CPU_SECONDS_PER_RECORD
                   + telemetry.expected_gpus * REPORT_CPU_SECONDS_PER_GPU)
    return max(30, math.ceil(cpu_seconds / float(cpu_cores(telemetry.cpu)) * MARGIN))


def object_labels(job_id: str) -> dict[str, str]:
    """The labels of every object a run creates."""
    return {JOB_ID_LABEL: job_id, "app.kubernetes.io/name": "dcgm-bridge",
            "app.kubernetes.io/managed-by": "dcgm-bridge"}


def build_jobset(spec: ProfileSpec) -> dict[str, Any]:
    labels = object_labels(spec.job_id)
    js_labels = dict(labels)
    if spec.placement.queue:
        js_labels[QUEUE_LABEL] = spec.placement.queue
    annotations = {MODE_ANNOTATION: spec.telemetry.mode, HOLD_ANNOTATION: str(spec.results_hold_seconds)}
    if spec.telemetry.exporter_namespace:
        annotations[rbac.EXPORTER_NAMESPACE_ANNOTATION] = spec.telemetry.exporter_namespace
    pod_spec = _pod_spec(spec)
    job_template = {
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {**labels, "app.kubernetes.io/component": "benchmark"},
                             # `kubectl logs/exec` without -c should reach the benchmark, not the sidecar.
                             "annotations": {**annotations, "kubectl.kubernetes.io/default-container": CONTROL_PLANE}},
                "spec": pod_spec,
            },
        }
    }
    jobset_spec: dict[str, Any] = {
        "replicatedJobs": [{"name": CONTROLLER, "replicas": 1, "template": job_template}],
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [CONTROLLER]},
        "failurePolicy": {"maxRestarts": 0},
        "ttlSecondsAfterFinished": spec.ttl_seconds,
    }
    if spec.placement.queue:
        # Kueue admits a suspended JobSet by un-suspending it once the queue has quota.
        jobset_spec["suspend"] = True
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": spec.job_id, "namespace": spec.namespace, "labels": js_labels,
                     "annotations": annotations},
        "spec": jobset_spec,
    }


def _pod_spec(spec: ProfileSpec) -> dict[str, Any]:
    telemetry = spec.telemetry
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": termination_grace_seconds(telemetry),
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    containers = [_control_plane(spec)]
    volumes = [_artifacts_volume(spec), {"name": "control-plane-tmp", "emptyDir": {}}]
    if telemetry.enabled:
        sidecar = _sidecar(spec)
        volumes += [{"name": "telemetry-tmp", "emptyDir": {"sizeLimit": "64Mi"}}, _TOKEN_VOLUME]
        if telemetry.legacy_sidecar:
            containers.append(sidecar)
        else:
            pod["initContainers"] = [{**sidecar, "restartPolicy": "Always"}]
    pod["containers"] = containers
    pod["volumes"] = volumes
    placement = spec.placement
    if telemetry.discovers_pods:
        # The sidecar alone reads the API (pods, EndpointSlices): its own account, its own projected token.
        pod["serviceAccountName"] = rbac.account_name(spec.job_id)
        pod["automountServiceAccountToken"] = False
        volumes.append(rbac.token_volume())
    elif placement.service_account:
        pod["serviceAccountName"] = placement.service_account
    else:
        # Neither container talks to the Kubernetes API; don't hand them a token.
        pod["automountServiceAccountToken"] = False
    if placement.node_selector:
        pod["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod["tolerations"] = [t.to_dict() for t in placement.tolerations]
    if placement.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in placement.image_pull_secrets]
    return pod


def _artifacts_volume(spec: ProfileSpec) -> dict[str, Any]:
    if spec.artifacts_pvc:
        return {"name": "artifacts", "persistentVolumeClaim": {"claimName": spec.artifacts_pvc}}
    return {"name": "artifacts", "emptyDir": {}}


def _artifacts_mount(spec: ProfileSpec) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": "artifacts", "mountPath": ARTIFACTS}
    if spec.artifacts_pvc:
        mount["subPath"] = spec.job_id  # one folder per run, so runs can share a claim
    return mount


def _security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def control_plane_script(spec: ProfileSpec) -> str:
    """The shell the control-plane container runs around `aiperf profile` (passed as "$@")."""
    telemetry = spec.telemetry
    lines = ["set -u"]
    if telemetry.enabled and telemetry.legacy_sidecar:
        # A regular container has no start ordering: wait (bounded) for the sidecar's /readyz so the
        # baseline scrape precedes the benchmark. Python is there because AIPerf is Python.
        budget = startup_failure_threshold(telemetry.cpu) * PROBE_PERIOD_SECONDS
        lines.append(
            "python3 -c 'import sys, time, urllib.request\n"
            f"deadline = time.monotonic() + {budget}\n"
            "while time.monotonic() < deadline:\n"
            "    try:\n"
            f"        urllib.request.urlopen(\"http://127.0.0.1:{HEALTH_PORT}/readyz\", timeout=5); sys.exit(0)\n"
            "    except Exception:\n"
            "        time.sleep(2)\n"
            "print(\"gpu-telemetry-manager not ready; benchmarking without waiting\", file=sys.stderr)' || true"
        )
    lines += ['"$@"', "rc=$?", 'echo "benchmark exited with status $rc"']
    if telemetry.enabled and telemetry.legacy_sidecar:
        # The run id first: the sidecar ignores (and removes) a marker an earlier run left on the volume. The
        # control token last, from the volume only the two containers share: a marker without it ends no run.
        # umask 077: the marker carries a secret, so only this user may read it.
        lines.append(f'(umask 077; printf "%s %s %s\\n" "$DCGM_BRIDGE_RUN_ID" "$rc" "$(cat {CONTROL_TOKEN_FILE})" '
                     f'> {DONE_FILE})')
    if spec.results_hold_seconds > 0:
        lines += [
            f'echo "artifacts in {ARTIFACTS} for up to {spec.results_hold_seconds}s: '
            f'dcgm-bridge kube results {spec.job_id}"',
            "waited=0",
            f"while [ ! -e {FETCHED_FILE} ] && [ $waited -lt {spec.results_hold_seconds} ]; do "
            "sleep 5; waited=$((waited + 5)); done",
        ]
    lines.append('exit "$rc"')
    return "\n".join(lines)


def _control_plane(spec: ProfileSpec) -> dict[str, Any]:
    bench = spec.benchmark
    env = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "DCGM_BRIDGE_RUN_ID", "value": spec.job_id},
    ]
    if spec.telemetry.enabled:
        # A benchmark other than AIPerf can post phase marks here (POST /phases, /complete).
        env += [{"name": "DCGM_BRIDGE_CONTROL_URL", "value": f"http://127.0.0.1:{HEALTH_PORT}"}, _TOKEN_ENV]
    mounts = [_artifacts_mount(spec), {"name": "control-plane-tmp", "mountPath": "/tmp"}]
    return {
        "name": CONTROL_PLANE,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", control_plane_script(spec), CONTROL_PLANE],
        "args": bench.aiperf_args(),
        "env": env,
        "resources": {"requests": {"cpu": bench.cpu, "memory": bench.memory}, "limits": {"memory": bench.memory}},
        "securityContext": _security_context(),
        "volumeMounts": mounts + [_TOKEN_MOUNT] if spec.telemetry.enabled else mounts,
    }


def _sidecar(spec: ProfileSpec) -> dict[str, Any]:
    telemetry = spec.telemetry
    args = ["--run-id", spec.job_id, "--artifact-dir", ARTIFACTS, "--health-port", str(HEALTH_PORT)]
    items = list(telemetry.urls)
    if telemetry.metrics_csv is not None:
        items.append(METRICS_CSV_PATH)
    if telemetry.discovers_pods and telemetry.exporter_service:
        items.append(telemetry.exporter_service)
    if items:
        args += ["--gpu-telemetry", ",".join(items)]
    for flag, values in (("--gpu-pods", telemetry.gpu_pods), ("--gpu-pod-selector", telemetry.gpu_pod_selectors),
                         ("--role", telemetry.roles)):
        for value in values:
            args += [flag, value]
    command = ["dcgm-bridge", "sidecar"]
    if telemetry.metrics_csv is not None:
        # No ConfigMap: the CSV rides in the environment and is written to the container's /tmp
        # before exec, so signals still reach dcgm-bridge directly.
        command = ["/bin/sh", "-c",
                   f'printf "%s\\n" "$DCGM_BRIDGE_METRICS_CSV" > {METRICS_CSV_PATH} && exec dcgm-bridge sidecar "$@"',
                   SIDECAR]
    threshold = startup_failure_threshold(telemetry.cpu)
    probe_timeout = 5  # a 25m container answers an HTTP GET in well under this; probes share the CPU
    return {
        "name": SIDECAR,
        "image": telemetry.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "args": args,
        "env": _sidecar_env(spec),
        "ports": [{"containerPort": HEALTH_PORT, "name": "health"}],
        # Guaranteed QoS: requests == limits, like AIPerf's manager.
        "resources": {"requests": {"cpu": telemetry.cpu, "memory": telemetry.memory},
                      "limits": {"cpu": telemetry.cpu, "memory": telemetry.memory}},
        # The startup probe gates the benchmark (native sidecar) on the first scrape being configured;
        # it is sized from the CPU limit because start-up is CPU-bound (see SIDECAR_START_CPU_SECONDS).
        "startupProbe": _probe("/readyz", PROBE_PERIOD_SECONDS, probe_timeout, threshold),
        "livenessProbe": _probe("/healthz", 10, probe_timeout, 6),
        "readinessProbe": _probe("/readyz", PROBE_PERIOD_SECONDS, probe_timeout, 3),
        "securityContext": _security_context(),
        "volumeMounts": [_artifacts_mount(spec), {"name": "telemetry-tmp", "mountPath": "/tmp"}, _TOKEN_MOUNT,
                         *([rbac.token_mount()] if telemetry.discovers_pods else [])],
    }


def _probe(path: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "health"}, "periodSeconds": period,
            "timeoutSeconds": timeout, "failureThreshold": failures}


def _sidecar_env(spec: ProfileSpec) -> list[dict[str, Any]]:
    telemetry = spec.telemetry
    env: list[dict[str, Any]] = [
        {"name": "DCGM_BRIDGE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "DCGM_BRIDGE_POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "DCGM_BRIDGE_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "DCGM_BRIDGE_RUN_ID", "value": spec.job_id},
        _TOKEN_ENV,
        # AIPerf may write below the folder it is given; the sidecar searches a folder for the manifest.
        {"name": "DCGM_BRIDGE_PHASE_MANIFEST", "value": ARTIFACTS},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if telemetry.legacy_sidecar:
        env.append({"name": "DCGM_BRIDGE_DONE_FILE", "value": DONE_FILE})
    else:
        # A native sidecar that exits is restarted by the kubelet (restartPolicy Always), and the new
        # run would write over the finished one; after POST /complete it must wait for SIGTERM.
        env.append({"name": "DCGM_BRIDGE_EXIT_ON_COMPLETE", "value": "false"})
    passed = dict(telemetry.env)
    for name in sorted(passed):
        if name == "OTEL_RESOURCE_ATTRIBUTES":
            continue
        env.append({"name": name, "value": passed[name]})
    # $(VAR) is expanded by the kubelet from variables defined earlier in this list.
    resource = "k8s.pod.name=$(DCGM_BRIDGE_POD_NAME),k8s.namespace.name=$(DCGM_BRIDGE_POD_NAMESPACE)"
    user_resource = passed.get("OTEL_RESOURCE_ATTRIBUTES")
    env.append({"name": "OTEL_RESOURCE_ATTRIBUTES",
                "value": f"{user_resource},{resource}" if user_resource else resource})
    if telemetry.otlp_headers_secret:
        env.append(_secret_env("OTEL_EXPORTER_OTLP_HEADERS", telemetry.otlp_headers_secret))
    if telemetry.exporter_token_secret:
        env.append(_secret_env("DCGM_BRIDGE_BEARER_TOKEN", telemetry.exporter_token_secret))
    if telemetry.metrics_csv is not None:
        env.append({"name": "DCGM_BRIDGE_METRICS_CSV", "value": telemetry.metrics_csv})
    return env


def _secret_env(name: str, ref: SecretRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
