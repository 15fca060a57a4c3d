"""Webhook, name, quantity and URL rules: what no schema checks, caught before submission."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from bridge.kube import validate
from bridge.kube.jobset import build_jobset
from tests.kube.test_jobset import make_spec


@pytest.mark.parametrize("text,value", [
    ("25m", Decimal("0.025")), ("0.5", Decimal("0.5")), ("2", Decimal(2)), ("192Mi", Decimal(192 * 2**20)),
    ("1Gi", Decimal(2**30)), ("1e3", Decimal(1000)), ("1E", Decimal("1e18")), ("500k", Decimal(500_000)),
    (".5", Decimal("0.5")), ("+1", Decimal(1)),
])
def test_kubernetes_quantities_parse_to_their_values(text: str, value: Decimal) -> None:
    assert validate.quantity_value(text) == value


@pytest.mark.parametrize("text", ["lots", "", "1.5.2", "10MB", "25 m", "m", "1e", "Mi", "0x10", "1mi"])
def test_strings_the_api_server_rejects_are_not_quantities(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        validate.quantity_value(text)


def test_a_quantity_problem_names_its_source_and_the_minimum() -> None:
    assert validate.check_quantity("AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU", "lots", minimum=Decimal("0.01"),
                                   unit="cpu") == [
        "AIPERF_K8S_GPU_TELEMETRY_MANAGER_CPU: 'lots' is not a Kubernetes quantity (examples: 25m, 0.5, 192Mi, 1Gi)"]
    (problem,) = validate.check_quantity("X", "1m", minimum=Decimal("0.01"), unit="cpu")
    assert problem == "X: 1m is below the minimum of 10m CPU"


@pytest.mark.parametrize("job_id,fragment", [
    ("Bench", "must be a DNS-1035 label"),
    ("1bench", "must be a DNS-1035 label"),
    ("bench_1", "must be a DNS-1035 label"),
    ("bench-", "must be a DNS-1035 label"),
    ("b" * 43, "the pod name 'bbb"),
    ("b" * 52, "the Job name 'bbb"),
])
def test_job_ids_the_jobset_webhook_would_reject_are_named_with_the_flag(job_id: str, fragment: str) -> None:
    problems = validate.check_job_id(job_id)
    assert problems and all(p.startswith(f"--job-id {job_id!r}") for p in problems)
    assert any(fragment in p for p in problems)


def test_the_longest_job_id_leaves_a_63_character_pod_name() -> None:
    assert validate.check_job_id("b" * 42) == []
    assert "keep --job-id to 42 characters" in validate.check_job_id("b" * 43)[0]


@pytest.mark.parametrize("url,fragment", [
    ("http://", "expected http[s]://host"),
    ("ftp://host/x", "expected http[s]://host"),
    ("host:99999", "Port out of range"),
    ("http://user:pw@host:8000", "carries credentials"),
])
def test_bad_urls_are_named_with_their_flag(url: str, fragment: str) -> None:
    (problem,) = validate.check_http_url("--url", url)
    assert problem.startswith("--url") and fragment in problem
    assert "pw" not in problem


@pytest.mark.parametrize("text,ok", [
    ("dedicated=bench:NoSchedule", True), ("gpu", True), ("gpu:NoExecute", True),
    ("gpu:Sometimes", False), (":NoSchedule", False), ("bad key:NoSchedule", False),
])
def test_tolerations_follow_kubectl_taint_syntax(text: str, ok: bool) -> None:
    assert (validate.check_toleration("--toleration", text) == []) is ok


def _mutated(change: Any) -> dict[str, Any]:
    jobset = copy.deepcopy(build_jobset(make_spec()))
    change(jobset)
    return jobset


def _pod(js: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return pod


# Things the CRD schema (and so the API server) accepts, but the JobSet webhook or the Job/Pod
# validation later rejects (kubernetes-sigs/jobset `pkg/webhooks/jobset_webhook.go`).
WEBHOOK_CASES = {
    "pod restartPolicy Sometimes": (lambda js: _pod(js).update(restartPolicy="Sometimes"), "restartPolicy 'Sometimes'"),
    "container without image": (lambda js: _pod(js)["containers"][0].pop("image"), "image is required"),
    "port 70000": (lambda js: _pod(js)["initContainers"][0]["ports"][0].update(containerPort=70000),
                   "containerPort 70000"),
    "container name Bad_Name": (lambda js: _pod(js)["containers"][0].update(name="Bad_Name"),
                                "container name must be a DNS-1123 label"),
    "restartPolicy on a regular container": (lambda js: _pod(js)["containers"][0].update(restartPolicy="Always"),
                                             "only 'Always' on an init container"),
    "unknown success target": (lambda js: js["spec"]["successPolicy"].update(targetReplicatedJobs=["workers"]),
                               "'workers' is not a replicated job"),
    "groupName with underscore": (lambda js: js["spec"]["replicatedJobs"][0].update(groupName="my_group"),
                                  "groupName 'my_group'"),
    "subdomain with dots": (lambda js: js["spec"].update(network={"subdomain": "a.b"}), "network.subdomain 'a.b'"),
    "long name": (lambda js: js["metadata"].update(name="x" * 50), "the pod name"),
    "duplicate container": (lambda js: _pod(js)["containers"].append(dict(_pod(js)["containers"][0])),
                            "duplicate container name"),
    "port name too long": (lambda js: _pod(js)["initContainers"][0]["ports"][0].update(name="health-and-more-x"),
                           "port name 'health-and-more-x'"),
    "bad cpu": (lambda js: _pod(js)["initContainers"][0]["resources"]["limits"].update(cpu="lots"),
                "resources.limits.cpu"),
}


@pytest.mark.parametrize("case", sorted(WEBHOOK_CASES))
def test_webhook_rules_catch_what_the_crd_schema_lets_through(case: str) -> None:
    change, fragment = WEBHOOK_CASES[case]
    problems = validate.webhook_problems(_mutated(change))
    assert any(fragment in p for p in problems), problems


def test_a_validation_error_lists_every_problem_sorted() -> None:
    error = validate.ValidationError(["b: two", "a: one"])
    assert str(error) == "a: one\nb: two"


# Issue 28 item 7: `^…$` lets a trailing newline through (`$` matches before a final "\n"); every kube name flag
# matches the whole string.
_HOSTILE_FLAGS = [
    ("job_id", "bench-x", "--job-id"), ("namespace", "bench", "--namespace"),
    ("service_account", "runner", "--service-account"), ("queue", "team-a", "--queue"),
    ("image_pull_secret", ("regcred",), "--image-pull-secret"), ("artifacts_pvc", "bench-artifacts", "--artifacts-pvc"),
    ("node_selector", ("gpu=h100",), "--node-selector"), ("node_selector", ("nvidia.com/gpu=h100",), "--node-selector"),
    ("otlp_headers_secret", "otlp-auth", "--otlp-headers-secret"),
    ("exporter_token_secret", "exporter-token:token", "--exporter-token-secret"),
]


@pytest.mark.parametrize("field,good,flag", _HOSTILE_FLAGS)
@pytest.mark.parametrize("tail", ["\n", "\r\n", "\nkind: Secret", "\x00"])
def test_a_kube_name_with_a_hostile_tail_is_refused_naming_its_flag(field: str, good: Any, flag: str,
                                                                      tail: str) -> None:
    from bridge.kube.profile import ProfileOptions, resolve
    from tests.kube.test_profile_options import OPTS, problems_of

    resolve(ProfileOptions(**{**OPTS.__dict__, field: good}), {})  # the name itself is fine
    hostile = tuple(v + tail for v in good) if isinstance(good, tuple) else good + tail
    problems = problems_of(ProfileOptions(**{**OPTS.__dict__, field: hostile}))
    assert any(p.startswith(flag) for p in problems), problems


@pytest.mark.parametrize("pattern", [validate.DNS1035_LABEL, validate.DNS1123_LABEL, validate.DNS1123_SUBDOMAIN,
                                     validate.LABEL_VALUE, validate.QUALIFIED_NAME, validate.SECRET_KEY,
                                     validate.ENV_NAME, validate.QUANTITY])
def test_no_name_pattern_accepts_a_trailing_newline(pattern: Any) -> None:
    assert pattern.fullmatch("a1") or pattern.fullmatch("1")
    assert not pattern.fullmatch("a1\n") and not pattern.fullmatch("1\n")
    assert not pattern.match("a1\n") and not pattern.match("1\n")
