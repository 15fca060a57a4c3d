"""Rules a JobSet must pass that no schema checks, and the user inputs that feed them.

The JobSet CRD's structural schema is checked by the API server, but the JobSet *webhook* runs in the
controller (kubernetes-sigs/jobset `pkg/webhooks/jobset_webhook.go`) and core PodSpec semantics are
only checked by kube-apiserver when the controller creates the Jobs — minutes later, as an event nobody reads. So the
client checks them before submitting, and every message names the flag (or variable) that produced the bad value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from bridge.errors import KubeError

DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+\Z")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
# apimachinery's resource.Quantity grammar: a signed decimal and one suffix (binary SI, decimal SI or
# a decimal exponent). "0.5", "250m", "192Mi", "1e3" are quantities; "lots", "1.5.2", "10MB" are not.
QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?\Z")
_SUFFIX = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal("1e3"),
    "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}
MAX_NAME = 63
# The JobSet webhook checks the pod name with a 5-character random suffix: `<js>-<rjob>-<j>-<p>-abcde`.
POD_SUFFIX = "-abcde"
POD_RESTART_POLICIES = ("Always", "OnFailure", "Never")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


class ValidationError(KubeError, ValueError):
    """One or more inputs that would make an invalid JobSet; the message lists them all, sorted."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = sorted(problems)
        super().__init__("\n".join(self.problems))


def quantity_value(text: str) -> Decimal:
    """`250m` → 0.25, `192Mi` → 201326592. Raises ValueError for what the API server would reject."""
    text = text.strip() if isinstance(text, str) else ""
    match = QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (examples: 25m, 0.5, 192Mi, 1Gi)")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if text.startswith("-"):
        number = -number
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return number * (Decimal(10) ** int(suffix[1:]))
    return number * _SUFFIX[suffix]


def check_quantity(source: str, text: str, *, minimum: Decimal, unit: str) -> list[str]:
    """Problems with a CPU/memory quantity given by `source` (a flag or variable name)."""
    try:
        value = quantity_value(text)
    except ValueError as exc:
        return [f"{source}: {exc}"]
    if value < minimum:
        return [f"{source}: {text} is below the minimum of {_format(minimum, unit)}"]
    return []


def _format(value: Decimal, unit: str) -> str:
    if unit == "cpu":
        return f"{(value * 1000).normalize():f}m CPU"
    return f"{(value / 2**20).normalize():f}Mi"


def check_job_id(job_id: str, *, flag: str = "--job-id", replicated_job: str = "controller",
                 replicas: int = 1) -> list[str]:
    """The webhook's name rules for a JobSet named `job_id` holding one Indexed replicated job."""
    problems: list[str] = []
    if not DNS1035_LABEL.fullmatch(job_id):
        problems.append(
            f"{flag} {job_id!r}: must be a DNS-1035 label (lower-case letters, digits and '-', starting with a "
            "letter and ending with a letter or digit), because it names the JobSet, its Jobs, pods and Service"
        )
    job_name = f"{job_id}-{replicated_job}-{replicas - 1}"
    pod_name = f"{job_name}-0{POD_SUFFIX}"
    budget = MAX_NAME - (len(pod_name) - len(job_id))
    if len(job_name) > MAX_NAME:
        problems.append(f"{flag} {job_id!r}: the Job name {job_name!r} is {len(job_name)} characters; "
                        f"the JobSet webhook allows {MAX_NAME} (keep {flag} to {budget} characters)")
    elif len(pod_name) > MAX_NAME:
        problems.append(f"{flag} {job_id!r}: the pod name {pod_name!r} is {len(pod_name)} characters; "
                        f"the JobSet webhook allows {MAX_NAME} (keep {flag} to {budget} characters)")
    return problems


def check_dns_label(source: str, value: str) -> list[str]:
    if len(value) > MAX_NAME or not DNS1123_LABEL.fullmatch(value):
        return [f"{source} {value!r}: must be a DNS-1123 label (lower-case letters, digits and '-', at most 63)"]
    return []


def check_dns_subdomain(source: str, value: str) -> list[str]:
    if len(value) > 253 or not DNS1123_SUBDOMAIN.fullmatch(value):
        return [f"{source} {value!r}: must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')"]
    return []


def check_label_value(source: str, value: str) -> list[str]:
    if len(value) > MAX_NAME or not LABEL_VALUE.fullmatch(value):
        return [f"{source} {value!r}: must be a label value (at most 63 of A-Z a-z 0-9 - _ ., alphanumeric ends)"]
    return []


def check_label_key(source: str, key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    if (prefix and check_dns_subdomain(source, prefix)) or len(name) > MAX_NAME or not QUALIFIED_NAME.fullmatch(name):
        return [f"{source} {key!r}: not a valid label key ([prefix/]name, name at most 63 characters)"]
    return []


def check_http_url(source: str, value: str) -> list[str]:
    """A URL the benchmark or sidecar will dial: http(s), a host, a valid port, no credentials."""
    if "://" in value and not value.lower().startswith(("http://", "https://")):
        return [f"{source} {value!r}: expected http[s]://host[:port][/path]"]
    url = value if value.lower().startswith(("http://", "https://")) else f"http://{value}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a bad port
    except ValueError as exc:
        return [f"{source} {value!r}: {exc}"]
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [f"{source} {value!r}: expected http[s]://host[:port][/path]"]
    if parts.username is not None or parts.password is not None:
        return [f"{source}: the URL carries credentials; they would be stored in the JobSet in clear text. "
                "Remove them and pass a Secret reference instead"]
    return []


def check_secret_ref(source: str, ref: str) -> list[str]:
    """`NAME` or `NAME:KEY` naming a Secret key (never a value)."""
    name, _, key = ref.partition(":")
    problems = check_dns_subdomain(f"{source} secret name", name)
    if key and not SECRET_KEY.fullmatch(key):
        problems.append(f"{source} {ref!r}: the key {key!r} may hold only letters, digits, '-', '_' and '.'")
    return problems


def check_toleration(source: str, text: str) -> list[str]:
    """kubectl-taint syntax: `key[=value]:Effect` or `key` (any effect, operator Exists)."""
    spec, _, effect = text.partition(":")
    key = spec.partition("=")[0]
    problems = check_label_key(source, key) if key else [f"{source} {text!r}: missing the taint key"]
    if effect and effect not in TAINT_EFFECTS:
        problems.append(f"{source} {text!r}: effect must be one of {', '.join(TAINT_EFFECTS)}")
    return problems


def webhook_problems(jobset: Mapping[str, Any]) -> list[str]:
    """What the JobSet webhook and core Pod validation would reject in a built JobSet.

    Checked on the finished object, so a builder bug is caught here rather than by a cluster.
    """
    problems: list[str] = []
    name = str(jobset.get("metadata", {}).get("name", ""))
    spec = jobset.get("spec", {})
    rjobs = spec.get("replicatedJobs", [])
    names = [str(r.get("name", "")) for r in rjobs]
    for rjob in rjobs:
        rname = str(rjob.get("name", ""))
        if not DNS1035_LABEL.fullmatch(rname):
            problems.append(f"replicatedJobs[{rname}].name: must be a DNS-1035 label")
        problems += check_job_id(name, flag="metadata.name", replicated_job=rname,
                                 replicas=int(rjob.get("replicas", 1)))
        group = rjob.get("groupName")
        if group is not None and not DNS1035_LABEL.fullmatch(str(group)):
            problems.append(f"replicatedJobs[{rname}].groupName {group!r}: must be a DNS-1035 label")
        pod = rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
        problems += _pod_problems(f"replicatedJobs[{rname}]", pod)
    subdomain = spec.get("network", {}).get("subdomain")
    if subdomain is not None and (check_dns_subdomain("network.subdomain", subdomain)
                                  or not DNS1035_LABEL.fullmatch(subdomain)):
        problems.append(f"network.subdomain {subdomain!r}: must be a DNS-1123 subdomain and a DNS-1035 label")
    for target in spec.get("successPolicy", {}).get("targetReplicatedJobs", []):
        if target not in names:
            problems.append(f"successPolicy.targetReplicatedJobs: {target!r} is not a replicated job ({names})")
    if len(set(names)) != len(names):
        problems.append(f"replicatedJobs: duplicate names {names}")
    return sorted(set(problems))


def _pod_problems(where: str, pod: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    policy = pod.get("restartPolicy")
    if policy is not None and policy not in POD_RESTART_POLICIES:
        problems.append(f"{where} pod restartPolicy {policy!r}: must be one of {', '.join(POD_RESTART_POLICIES)}")
    seen: set[str] = set()
    for kind in ("initContainers", "containers"):
        for c in pod.get(kind, []):
            cname = str(c.get("name", ""))
            if not DNS1123_LABEL.fullmatch(cname) or len(cname) > MAX_NAME:
                problems.append(f"{where} {kind}[{cname}]: container name must be a DNS-1123 label")
            if cname in seen:
                problems.append(f"{where} {kind}[{cname}]: duplicate container name")
            seen.add(cname)
            if not c.get("image"):
                problems.append(f"{where} {kind}[{cname}]: image is required")
            cpolicy = c.get("restartPolicy")
            if cpolicy is not None and (kind != "initContainers" or cpolicy != "Always"):
                problems.append(f"{where} {kind}[{cname}] restartPolicy {cpolicy!r}: only 'Always' on an "
                                "init container (a native sidecar) is allowed")
            for port in c.get("ports", []):
                number = port.get("containerPort")
                if not isinstance(number, int) or not 1 <= number <= 65535:
                    problems.append(f"{where} {kind}[{cname}] containerPort {number!r}: must be 1-65535")
                pname = port.get("name")
                if pname is not None and (len(pname) > 15 or not DNS1123_LABEL.fullmatch(pname)):
                    problems.append(f"{where} {kind}[{cname}] port name {pname!r}: at most 15 of a-z 0-9 -")
            for env in c.get("env", []):
                if not ENV_NAME.fullmatch(str(env.get("name", ""))):
                    problems.append(f"{where} {kind}[{cname}] env {env.get('name')!r}: not a valid variable name")
            for key in ("requests", "limits"):
                for res, text in c.get("resources", {}).get(key, {}).items():
                    try:
                        quantity_value(str(text))
                    except ValueError as exc:
                        problems.append(f"{where} {kind}[{cname}] resources.{key}.{res}: {exc}")
    return problems
