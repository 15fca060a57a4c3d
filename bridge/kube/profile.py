"""`kube profile` options + environment → one validated ProfileSpec (flag > variable > default).

Everything is checked here, once, and every problem is reported together, sorted, naming the flag or
variable to fix — before anything is built or sent. The environment is passed in, never read here.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path

from bridge.discovery import DEFAULT_EXPORTER_SERVICE, DiscoveryError, ServiceRef, pod_selector_problems
from bridge.endpoints import TelemetryItemError, parse_default_endpoints, parse_items
from bridge.errors import ConfigError
from bridge.kube import validate
from bridge.kube.estimate import Estimate, benchmark_memory_request, estimate_controller
from bridge.kube.jobset import (
    DEFAULT_CPU,
    DEFAULT_IMAGE,
    DEFAULT_MEMORY,
    DEFAULT_SIDECAR_IMAGE,
    Benchmark,
    Placement,
    ProfileSpec,
    SecretRef,
    Telemetry,
    Toleration,
)
from bridge.pods import parse_pod_patterns
from bridge.redact import has_credentials, redact_url
from bridge.roles import parse_roles

CPU_ENV = "AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU"
MEMORY_ENV = "AIPERF_K8S_GPU_TELEMETRY_MANAGER_MEMORY"
INTERVAL_ENV = "AIPERF_GPU_COLLECTION_INTERVAL"
DEFAULTS_ENV = "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS"
# OTEL_* variables that hold credentials: never copied into the JobSet, only referenced from a Secret.
_SECRET_OTEL = ("HEADERS", "CLIENT_KEY", "PASSWORD", "TOKEN")
MAX_CSV_BYTES = 64 * 1024  # an env value is one execve string: Linux allows 128 KiB; keep well below
MIN_SIDECAR_CPU = Decimal("0.01")
MIN_SIDECAR_MEMORY = Decimal(64 * 2**20)


@dataclass(frozen=True)
class ProfileOptions:
    """The flags as given (None = not given)."""

    model: str
    url: str
    endpoint_type: str = "chat"
    endpoint: str | None = None
    streaming: bool = False
    concurrency: int | None = None
    request_count: int | None = None
    gpu_telemetry: tuple[str, ...] = ()
    no_gpu_telemetry: bool = False
    legacy_sidecar: bool = False
    namespace: str = "default"
    image: str = DEFAULT_IMAGE
    sidecar_image: str = DEFAULT_SIDECAR_IMAGE
    job_id: str | None = None
    artifacts_pvc: str | None = None
    results_hold: int | None = None
    ttl: int = 300
    service_account: str | None = None
    node_selector: tuple[str, ...] = ()
    toleration: tuple[str, ...] = ()
    image_pull_secret: tuple[str, ...] = ()
    queue: str | None = None
    otlp_headers_secret: str | None = None
    exporter_token_secret: str | None = None
    benchmark_cpu: str = "2"
    benchmark_memory: str | None = None
    gpus_per_endpoint: int = 8
    duration: float = 600.0
    gpu_pods: tuple[str, ...] = ()
    gpu_pod_selector: tuple[str, ...] = ()
    role: tuple[str, ...] = ()  # --role NAME=NAMESPACE/GLOB, passed to the sidecar (issue 46)


@dataclass(frozen=True)
class Resolved:
    spec: ProfileSpec
    discovery: tuple[str, ...]  # k8s:// items still to expand (at submit time)
    estimate: Estimate
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def with_urls(self, urls: Sequence[str]) -> ProfileSpec:
        """The spec with the discovered URLs appended (after the user's own)."""
        merged = tuple(dict.fromkeys([*self.spec.telemetry.urls, *urls]))
        return replace(self.spec, telemetry=replace(self.spec.telemetry, urls=merged))


def new_job_id() -> str:
    return f"bench-{secrets.token_hex(4)}"


def resolve(opts: ProfileOptions, env: Mapping[str, str], *, job_id: str | None = None) -> Resolved:
    problems: list[str] = []
    warnings: list[str] = []
    job = opts.job_id or job_id or new_job_id()
    problems += validate.check_job_id(job)
    problems += validate.check_dns_label("--namespace", opts.namespace)
    problems += validate.check_http_url("--url", opts.url)
    for flag, image in (("--image", opts.image), ("--sidecar-image", opts.sidecar_image)):
        if not image or any(ch.isspace() for ch in image):
            problems.append(f"{flag} {image!r}: not a container image reference")
    if opts.concurrency is not None and opts.concurrency < 1:
        problems.append(f"--concurrency {opts.concurrency}: must be at least 1")
    if opts.request_count is not None and opts.request_count < 1:
        problems.append(f"--request-count {opts.request_count}: must be at least 1")
    if opts.ttl < 0:
        problems.append(f"--ttl {opts.ttl}: must be 0 or more (seconds the finished JobSet is kept)")
    if opts.results_hold is not None and opts.results_hold < 0:
        problems.append(f"--results-hold {opts.results_hold}: must be 0 or more")
    if opts.endpoint is not None and not opts.endpoint.startswith("/"):
        problems.append(f"--endpoint {opts.endpoint!r}: must be a path starting with '/'")

    telemetry, discovery = _telemetry(opts, env, problems, warnings)
    telemetry, discovery = _pods(opts, telemetry, discovery, problems)
    placement = _placement(opts, problems)
    if opts.artifacts_pvc:
        problems += validate.check_dns_subdomain("--artifacts-pvc", opts.artifacts_pvc)
    problems += validate.check_quantity("--benchmark-cpu", opts.benchmark_cpu, minimum=Decimal("0.001"), unit="cpu")
    if opts.benchmark_memory:
        problems += validate.check_quantity("--benchmark-memory", opts.benchmark_memory,
                                            minimum=Decimal(256 * 2**20), unit="memory")
    if problems:
        raise validate.ValidationError(problems)

    interval = float(env.get(INTERVAL_ENV, "0.333"))
    estimate = estimate_controller(
        concurrency=opts.concurrency, request_count=opts.request_count, streaming=opts.streaming,
        telemetry_enabled=telemetry.enabled, telemetry_urls=len(telemetry.urls) + len(discovery),
        gpus_per_endpoint=opts.gpus_per_endpoint, collection_interval_s=interval, duration_s=opts.duration,
        otlp=any(name.startswith("OTEL_EXPORTER_OTLP") and name.endswith("ENDPOINT") for name, _ in telemetry.env),
        telemetry_memory=env.get(MEMORY_ENV) if telemetry.enabled else None,
        telemetry_cpu=env.get(CPU_ENV) if telemetry.enabled else None)
    if estimate.telemetry_cpu is not None and estimate.telemetry_memory is not None:
        telemetry = replace(telemetry, cpu=estimate.telemetry_cpu.quantity, memory=estimate.telemetry_memory.quantity)
    warnings += estimate.warnings()
    benchmark = Benchmark(
        model=opts.model, url=opts.url, endpoint_type=opts.endpoint_type, endpoint=opts.endpoint,
        streaming=opts.streaming, concurrency=opts.concurrency, request_count=opts.request_count,
        cpu=opts.benchmark_cpu, memory=opts.benchmark_memory or benchmark_memory_request(estimate))
    # Without a PVC the artifacts die with the pod, so by default the container waits 5 minutes for
    # `kube results`; with a PVC there is nothing to wait for.
    hold = opts.results_hold if opts.results_hold is not None else (0 if opts.artifacts_pvc else 300)
    # Only URLs the user named count, like the memory estimate: the defaults in a pod are dead.
    telemetry = replace(telemetry, expected_records=estimate.telemetry_records,
                        expected_gpus=estimate.model.gpus if estimate.model else 0)
    spec = ProfileSpec(job_id=job, namespace=opts.namespace, benchmark=benchmark, telemetry=telemetry,
                       placement=placement, image=opts.image, artifacts_pvc=opts.artifacts_pvc,
                       ttl_seconds=opts.ttl, results_hold_seconds=hold)
    return Resolved(spec, discovery, estimate, tuple(warnings))


def _telemetry(opts: ProfileOptions, env: Mapping[str, str], problems: list[str],
               warnings: list[str]) -> tuple[Telemetry, tuple[str, ...]]:
    if opts.no_gpu_telemetry:
        if opts.gpu_telemetry:
            problems.append("--gpu-telemetry and --no-gpu-telemetry: give one or the other")
        if opts.legacy_sidecar:
            problems.append("--legacy-sidecar and --no-gpu-telemetry: there is no sidecar to run")
        return Telemetry(enabled=False), ()
    try:
        items = parse_items(opts.gpu_telemetry)
    except TelemetryItemError as exc:
        problems.append(str(exc))
        return Telemetry(), ()
    for name in items.local:  # the sidecar container is given no GPU: NVML/amdsmi would see none
        problems.append(f"--gpu-telemetry {name}: not on Kubernetes (the sidecar container holds no GPU); pass "
                        "the node's exporter, e.g. --gpu-telemetry k8s://gpu-operator/nvidia-dcgm-exporter:9400")
    for url in items.urls:
        if has_credentials(url):
            problems.append(f"--gpu-telemetry {redact_url(url)}: the URL carries credentials, which would be "
                            "stored in the JobSet in clear text; remove them and pass "
                            "--exporter-token-secret NAME[:KEY] (a Secret holding a bearer token)")
        elif redact_url(url) != url:
            warnings.append(f"--gpu-telemetry {redact_url(url)}: its query values are stored in the JobSet in "
                            "clear text (the sidecar shows them nowhere); keep secrets out of the URL")
    if items.dashboard:
        warnings.append("--gpu-telemetry dashboard: ignored on Kubernetes (the sidecar has no terminal)")
    cpu: str = env.get(CPU_ENV) or DEFAULT_CPU  # the floor until resolve() sizes it to the endpoints
    memory: str = env.get(MEMORY_ENV) or DEFAULT_MEMORY  # the floor too, until resolve() sizes it
    problems += validate.check_quantity(CPU_ENV, cpu, minimum=MIN_SIDECAR_CPU, unit="cpu")
    problems += validate.check_quantity(MEMORY_ENV, memory, minimum=MIN_SIDECAR_MEMORY, unit="memory")
    passed: dict[str, str] = {}
    if INTERVAL_ENV in env:
        try:
            interval = float(env[INTERVAL_ENV])
            if not 0.01 <= interval <= 300:
                raise ValueError(f"{interval} is outside 0.01-300 seconds")
            passed[INTERVAL_ENV] = env[INTERVAL_ENV]
        except ValueError as exc:
            problems.append(f"{INTERVAL_ENV}: {exc}")
    if DEFAULTS_ENV in env:
        try:
            parse_default_endpoints(env[DEFAULTS_ENV])
            passed[DEFAULTS_ENV] = env[DEFAULTS_ENV]
        except TelemetryItemError as exc:
            problems.append(str(exc))
    for name in sorted(env):
        if not name.startswith("OTEL_"):
            continue
        if any(word in name for word in _SECRET_OTEL):
            flag = "--otlp-headers-secret" if "HEADERS" in name else "a Secret"
            warnings.append(f"{name} is set but not copied into the JobSet (it holds credentials); "
                            f"pass {flag} to give the sidecar its value from a Secret")
            continue
        value = env[name]
        if "://" in value and has_credentials(value):
            problems.append(f"{name}: the URL carries credentials; remove them (use --otlp-headers-secret)")
            continue
        passed[name] = value
    csv_text = _metrics_csv(items.metrics_files, problems)
    refs: dict[str, SecretRef | None] = {}
    for flag, given, default_key in (("--otlp-headers-secret", opts.otlp_headers_secret, "headers"),
                                     ("--exporter-token-secret", opts.exporter_token_secret, "token")):
        refs[flag] = None
        if given:
            problems += validate.check_secret_ref(flag, given)
            refs[flag] = SecretRef.parse(given, default_key)
    for item in items.discovery:
        try:
            ref = ServiceRef.parse(item)
            problems += validate.check_dns_label(f"--gpu-telemetry {item} namespace", ref.namespace)
            problems += validate.check_dns_label(f"--gpu-telemetry {item} service", ref.service)
        except DiscoveryError as exc:
            problems.append(str(exc))
    telemetry = Telemetry(
        enabled=True, urls=tuple(items.urls), metrics_csv=csv_text, legacy_sidecar=opts.legacy_sidecar,
        image=opts.sidecar_image, cpu=cpu, memory=memory, env=tuple(sorted(passed.items())),
        otlp_headers_secret=refs["--otlp-headers-secret"], exporter_token_secret=refs["--exporter-token-secret"])
    return telemetry, tuple(items.discovery)


def _pods(opts: ProfileOptions, telemetry: Telemetry, discovery: tuple[str, ...],
          problems: list[str]) -> tuple[Telemetry, tuple[str, ...]]:
    """--gpu-pods, --gpu-pod-selector and --role go to the sidecar; with a selector, the sidecar (not the submitter)
    discovers the exporters, in the first k8s:// item's Service or the GPU Operator's."""
    if opts.role:
        try:
            telemetry = replace(telemetry, roles=tuple(str(r) for r in parse_roles(opts.role)))
        except ConfigError as exc:
            problems.append(str(exc))
    if not (opts.gpu_pods or opts.gpu_pod_selector):
        return telemetry, discovery
    if opts.no_gpu_telemetry:
        problems.append("--gpu-pods/--gpu-pod-selector and --no-gpu-telemetry: there is no sidecar to select GPUs")
        return telemetry, discovery
    try:
        pods = tuple(str(p) for p in parse_pod_patterns(opts.gpu_pods))
    except ConfigError as exc:
        problems.append(str(exc))
        pods = ()
    for value in opts.gpu_pod_selector:
        problems += pod_selector_problems(value)
    telemetry = replace(telemetry, gpu_pods=pods, gpu_pod_selectors=tuple(dict.fromkeys(opts.gpu_pod_selector)))
    if not opts.gpu_pod_selector:
        return telemetry, discovery
    if opts.service_account:
        problems.append("--service-account and --gpu-pod-selector: the sidecar gets a generated ServiceAccount "
                        "with exactly the access discovery needs; drop --service-account")
    return replace(telemetry, exporter_service=discovery[0] if discovery else DEFAULT_EXPORTER_SERVICE), discovery[1:]


def _metrics_csv(paths: Sequence[str], problems: list[str]) -> str | None:
    if not paths:
        return None
    from bridge.fields import CustomMetricsError, default_table, parse_custom_metrics

    texts: list[str] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            problems.append(f"--gpu-telemetry {path}: cannot read the custom-metrics CSV ({exc.strerror or exc})")
            continue
        try:
            parse_custom_metrics(text, path, default_table())
        except CustomMetricsError as exc:
            problems.append(f"--gpu-telemetry {path}: {exc}")
            continue
        texts.append(f"# from {Path(path).name}\n{text.rstrip()}")
    joined = "\n".join(texts)
    if len(joined.encode()) > MAX_CSV_BYTES:
        problems.append(f"--gpu-telemetry CSV: {len(joined.encode())} bytes; at most {MAX_CSV_BYTES} travel "
                        "in the sidecar's environment (drop comments or unused fields)")
    return joined if texts else None


def _placement(opts: ProfileOptions, problems: list[str]) -> Placement:
    selector: list[tuple[str, str]] = []
    for item in opts.node_selector:
        key, eq, value = item.partition("=")
        if not eq:
            problems.append(f"--node-selector {item!r}: expected key=value")
            continue
        problems += validate.check_label_key("--node-selector", key)
        problems += validate.check_label_value("--node-selector", value)
        selector.append((key, value))
    for item in opts.toleration:
        problems += validate.check_toleration("--toleration", item)
    for name in opts.image_pull_secret:
        problems += validate.check_dns_subdomain("--image-pull-secret", name)
    if opts.service_account:
        problems += validate.check_dns_subdomain("--service-account", opts.service_account)
    if opts.queue:
        problems += validate.check_label_value("--queue", opts.queue)
    return Placement(service_account=opts.service_account, node_selector=tuple(selector),
                     tolerations=tuple(Toleration.parse(t) for t in opts.toleration),
                     image_pull_secrets=tuple(opts.image_pull_secret), queue=opts.queue)
