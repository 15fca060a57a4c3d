"""`dcgm-bridge kube …`: profile, estimate, status, delete, results.

Only click and our own small modules are imported at start-up; PyYAML and the kubernetes client are
imported inside the commands that need them (`--dry-run` never imports the client).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from bridge.endpoints import expand_telemetry_args
from bridge.kube.jobset import DEFAULT_IMAGE, DEFAULT_SIDECAR_IMAGE


class _VariadicCommand(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, expand_telemetry_args(args))


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    raise click.exceptions.Exit(code)


def _cluster_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--context", help="kubeconfig context (default: the current one)")(f)
    f = click.option("--kubeconfig", type=click.Path(dir_okay=False),
                     help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")(f)
    f = click.option("-n", "--namespace", default="default", show_default=True,
                     help="namespace of the JobSet")(f)
    return f


def _estimate_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--duration", type=float, default=600.0, show_default=True,
                     help="expected run length in seconds (sizes the estimates and the shutdown grace)")(f)
    f = click.option("--gpus-per-endpoint", type=int, default=8, show_default=True,
                     help="GPUs behind each exporter URL (for the estimates)")(f)
    f = click.option("--no-gpu-telemetry", is_flag=True, help="no gpu-telemetry-manager container at all")(f)
    f = click.option("--gpu-telemetry", multiple=True, metavar="ITEM…",
                     help="DCGM exporter URLs (host:9400, http://…/metrics), k8s://NAMESPACE/SERVICE[:PORT] "
                          "(expanded at submit time to one URL per ready endpoint), or a custom-metrics .csv")(f)
    f = click.option("--request-count", type=int, help="passed to `aiperf profile --request-count`")(f)
    f = click.option("--concurrency", type=int, help="passed to `aiperf profile --concurrency` (sizes the "
                                                      "estimate)")(f)
    f = click.option("--streaming", is_flag=True, help="passed to `aiperf profile --streaming`")(f)
    return f


@click.group(help="Run benchmarks on Kubernetes as a JobSet with the gpu-telemetry-manager sidecar.")
def kube() -> None:
    pass


@kube.command(cls=_VariadicCommand)
@click.option("--model", required=True, help="model name, passed to `aiperf profile --model`")
@click.option("--url", required=True, help="inference server URL as the benchmark pod sees it")
@click.option("--endpoint-type", default="chat", show_default=True,
              help="passed to `aiperf profile --endpoint-type` (chat, completions, embeddings, …)")
@click.option("--endpoint", help="API path, e.g. /v1/chat/completions")
@_estimate_options
@click.option("--legacy-sidecar", is_flag=True,
              help="run the sidecar as a regular container that exits after the benchmark (k8s < 1.29)")
@_cluster_options
@click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="benchmark image (runs `aiperf profile`)")
@click.option("--sidecar-image", default=DEFAULT_SIDECAR_IMAGE, show_default=True,
              help="dcgm-bridge image (deploy/Dockerfile)")
@click.option("--job-id", help="JobSet name and aiperf.nvidia.com/job-id label (default: bench-<random>)")
@click.option("--artifacts-pvc", metavar="CLAIM", help="PersistentVolumeClaim for the artifacts (subPath = job id)")
@click.option("--results-hold", type=int, metavar="SECONDS",
              help="keep the controller alive this long after the benchmark for `kube results` "
                   "[default: 300, or 0 with --artifacts-pvc]")
@click.option("--ttl", type=int, default=300, show_default=True,
              help="seconds the finished JobSet is kept (ttlSecondsAfterFinished)")
@click.option("--service-account", help="the pods' ServiceAccount (default: the namespace's default)")
@click.option("--node-selector", multiple=True, metavar="KEY=VALUE", help="run the pods on nodes with this label; "
              "repeatable")
@click.option("--toleration", multiple=True, metavar="KEY[=VALUE][:EFFECT]",
              help="let the pods run on nodes with this taint; repeatable")
@click.option("--image-pull-secret", multiple=True, metavar="NAME",
              help="Secret to pull the images with; repeatable")
@click.option("--queue", help="Kueue LocalQueue (the JobSet is created suspended)")
@click.option("--otlp-headers-secret", metavar="SECRET[:KEY]",
              help="Secret key holding OTEL_EXPORTER_OTLP_HEADERS (key default: headers)")
@click.option("--exporter-token-secret", metavar="SECRET[:KEY]",
              help="Secret key holding a bearer token for the DCGM exporters (key default: token)")
@click.option("--benchmark-cpu", default="2", show_default=True, help="control-plane CPU request")
@click.option("--benchmark-memory", help="control-plane memory (default: the estimate)")
@click.option("--gpu-pods", multiple=True, metavar="NAMESPACE/GLOB",
              help="count only the GPUs the exporter attributes to matching pods (repeatable)")
@click.option("--gpu-pod-selector", multiple=True, metavar="NAMESPACE/SELECTOR",
              help="the sidecar finds these pods, their nodes and the exporters there through the API "
                   "(a generated ServiceAccount with get/list/watch on pods and EndpointSlices)")
@click.option("--role", "role", multiple=True, metavar="NAME=NAMESPACE/GLOB",
              help="a serving role over the pods the exporter names on each GPU, in the report with its energy "
                   "(repeatable; passed to the sidecar)")
@click.option("--dry-run", is_flag=True, help="print the JobSet (and RBAC objects) as YAML; submit nothing")
@click.option("--wait", is_flag=True, help="follow the JobSet to its end; exit 0 completed, 1 failed, "
                                           "2 timed out, 3 deleted")
@click.option("--timeout", type=float, default=86400.0, show_default=True, help="--wait limit in seconds")
def profile(**kw: Any) -> None:
    """Submit `aiperf profile` as a JobSet with GPU telemetry (or print it with --dry-run).

    One run per JobSet (no --repeat): for repeats, submit it N times and put each run's artifact folder in
    run_0001/ … run_000N/ of one folder, which `dcgm-bridge compare` reads as repeats."""
    from bridge.kube.profile import ProfileOptions, resolve
    from bridge.kube.validate import ValidationError

    cluster = {k: kw.pop(k) for k in ("kubeconfig", "context", "dry_run", "wait", "timeout")}
    tuples = ("gpu_telemetry", "node_selector", "toleration", "image_pull_secret", "gpu_pods", "gpu_pod_selector",
              "role")
    values: dict[str, Any] = {k: tuple(v) if k in tuples else v for k, v in kw.items()}
    options = ProfileOptions(**values)
    try:
        resolved = resolve(options, os.environ)
    except ValidationError as exc:
        _fail("invalid options:\n  " + "\n  ".join(exc.problems), 2)
    for warning in resolved.warnings:
        click.echo(f"warning: {warning}", err=True)
    if cluster["dry_run"]:
        from bridge.kube.jobset import build_jobset

        spec = _dry_run_spec(resolved, cluster) if resolved.discovery else resolved.spec
        jobset = build_jobset(spec)
        _refuse_webhook_problems(jobset)
        click.echo(to_yaml([*_rbac_objects(resolved.spec), jobset], header=resolved.estimate.all_lines()), nl=False)
        return
    _submit(resolved, cluster)


def _submit(resolved: Any, cluster: Mapping[str, Any]) -> None:
    from bridge.kube import submit
    from bridge.kube.jobset import build_jobset

    try:
        clients = submit.connect(cluster["kubeconfig"], cluster["context"])
        spec = _expanded(resolved, clients) if resolved.discovery else resolved.spec
        jobset = build_jobset(spec)
        _refuse_webhook_problems(jobset)
        for obj in _rbac_objects(spec):
            submit.create_rbac_object(clients, obj)
        submit.create_jobset(clients.custom, jobset)
        click.echo(f"jobset.jobset.x-k8s.io/{spec.job_id} created in namespace {spec.namespace}")
        click.echo(f"  status:  dcgm-bridge kube status {spec.job_id} -n {spec.namespace}")
        click.echo(f"  pods:    kubectl -n {spec.namespace} get pod -l aiperf.nvidia.com/job-id={spec.job_id}")
        if spec.results_hold_seconds:
            click.echo(f"  results: dcgm-bridge kube results {spec.job_id} -n {spec.namespace} "
                       f"(within {spec.results_hold_seconds}s of the benchmark's end)")
        if cluster["wait"]:
            state = _follow(clients.custom, spec.namespace, spec.job_id, cluster["timeout"])
            raise click.exceptions.Exit(state.exit_code)
    except submit.KubeError as exc:
        _fail(str(exc), exc.exit_code)


def _rbac_objects(spec: Any) -> list[dict[str, Any]]:
    """The sidecar's ServiceAccount, Roles and RoleBindings when it discovers pods (--gpu-pod-selector)."""
    from bridge.kube.jobset import object_labels
    from bridge.kube.rbac import rbac_objects

    exporter_namespace = spec.telemetry.exporter_namespace
    if not exporter_namespace:
        return []
    return rbac_objects(spec.job_id, spec.namespace, exporter_namespace, object_labels(spec.job_id))


def _expanded(resolved: Any, clients: Any) -> Any:
    """The spec with its k8s:// items expanded to one URL per ready endpoint (a discovery failure exits 1)."""
    from bridge.discovery import DiscoveryError, expand

    try:
        urls = expand(resolved.discovery, clients.discovery)
    except DiscoveryError as exc:
        _fail(str(exc))
    click.echo(f"discovered {len(urls)} exporter URL(s): {', '.join(urls)}", err=True)
    return resolved.with_urls(urls)


def _dry_run_spec(resolved: Any, cluster: Mapping[str, Any]) -> Any:
    """--dry-run with k8s:// items: expanded from the cluster the kubeconfig names (only reads), or refused (exit
    2). Left unexpanded, the printed sidecar would have no --gpu-telemetry and try only the localhost defaults."""
    from bridge.kube import submit

    try:
        clients = submit.connect(cluster["kubeconfig"], cluster["context"])
    except submit.KubeError as exc:
        _fail(f"--dry-run cannot expand {', '.join(resolved.discovery)} without a cluster ({exc}); give the "
              "exporter URLs instead (host:9400 …), or a --kubeconfig that reaches the cluster", 2)
    try:
        return _expanded(resolved, clients)
    except submit.KubeError as exc:  # the API server did not answer
        _fail(f"--dry-run cannot expand {', '.join(resolved.discovery)}: {exc}", exc.exit_code)


def _refuse_webhook_problems(jobset: dict[str, Any]) -> None:
    from bridge.kube.validate import webhook_problems

    problems = webhook_problems(jobset)
    if problems:  # a builder bug, not a user error: refuse rather than let the controller fail later
        _fail("the built JobSet breaks JobSet webhook rules:\n  " + "\n  ".join(problems))


def _follow(custom: Any, namespace: str, name: str, timeout: float) -> Any:
    from bridge.kube import submit

    start = time.monotonic()

    def show(state: submit.JobSetState) -> None:
        click.echo(f"{time.monotonic() - start:7.1f}s  {state.phase:<9}  {state.detail}")

    return submit.wait_for(custom, namespace, name, timeout_s=timeout, on_change=show)


@kube.command(cls=_VariadicCommand)
@_estimate_options
@click.option("--legacy-sidecar", is_flag=True, hidden=True)
def estimate(**kw: Any) -> None:
    """Controller pod memory by component (the GPU-telemetry share is 0 without a --gpu-telemetry URL)."""
    from bridge.kube.profile import ProfileOptions, resolve
    from bridge.kube.validate import ValidationError

    options = ProfileOptions(model="-", url="http://estimate", gpu_telemetry=tuple(kw.pop("gpu_telemetry")), **kw)
    try:
        resolved = resolve(options, os.environ, job_id="estimate")
    except ValidationError as exc:
        _fail("invalid options:\n  " + "\n  ".join(exc.problems), 2)
    click.echo("\n".join(resolved.estimate.all_lines()))


@kube.command()
@click.argument("job_id")
@_cluster_options
@click.option("--wait", is_flag=True, help="follow it to its end (exit 0 completed, 1 failed, 2 timeout, 3 deleted)")
@click.option("--timeout", type=float, default=86400.0, show_default=True, help="--wait limit in seconds")
def status(job_id: str, namespace: str, kubeconfig: str | None, context: str | None, wait: bool,
           timeout: float) -> None:
    """The JobSet's state, conditions and job counts."""
    from bridge.kube import submit

    try:
        clients = submit.connect(kubeconfig, context)
        if wait:
            raise click.exceptions.Exit(_follow(clients.custom, namespace, job_id, timeout).exit_code)
        obj = submit.get_jobset(clients.custom, namespace, job_id)
    except submit.KubeError as exc:
        _fail(str(exc), exc.exit_code)
    state = submit.state_of(obj)
    click.echo(f"{job_id}  {state.phase}  {state.detail}")
    for cond in (obj.get("status") or {}).get("conditions") or []:
        click.echo(f"  {cond.get('type')}={cond.get('status')}  {cond.get('reason', '')}  {cond.get('message', '')}")


@kube.command()
@click.argument("job_id")
@_cluster_options
def delete(job_id: str, namespace: str, kubeconfig: str | None, context: str | None) -> None:
    """Delete the JobSet (its Jobs and pods follow)."""
    from bridge.kube import submit

    try:
        clients = submit.connect(kubeconfig, context)
        removed = submit.delete_rbac_objects(clients, namespace, job_id)
        submit.delete_jobset(clients.custom, namespace, job_id)
    except submit.KubeError as exc:
        _fail(str(exc), exc.exit_code)
    for line in removed:
        click.echo(line)
    click.echo(f"jobset.jobset.x-k8s.io/{job_id} deleted from namespace {namespace}")


@kube.command()
@click.argument("job_id")
@_cluster_options
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="default: artifacts/<job-id>")
@click.option("--keep-running", is_flag=True, help="don't let the controller exit after the copy")
def results(job_id: str, namespace: str, kubeconfig: str | None, context: str | None, out: Path | None,
            keep_running: bool) -> None:
    """Copy the run's artifacts from the controller pod while it is holding them."""
    from bridge.kube import submit

    target = out or Path("artifacts") / job_id
    try:
        clients = submit.connect(kubeconfig, context)
        names = submit.fetch_results(clients.core, namespace, job_id, target, release=not keep_running)
    except submit.KubeError as exc:
        _fail(str(exc), exc.exit_code)
    click.echo(f"{len(names)} file(s) copied to {target}")
    for name in names:
        click.echo(f"  {name}")


def to_yaml(objects: Sequence[Mapping[str, Any]], header: Sequence[str] = ()) -> str:
    """Multi-document YAML; multi-line strings (the control-plane script) as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, represent_str)
    body = yaml.dump_all(objects, Dumper=Dumper, sort_keys=False, explicit_start=True, width=120)
    comments = "".join(f"# {line}\n" for line in header)
    return comments + body
