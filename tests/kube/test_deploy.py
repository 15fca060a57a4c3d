"""deploy/: the manifests parse, agree with each other and with the code; the image's contents work.

No Docker engine runs here, so the image is tested by what it is made of: the wheel the Dockerfile
builds, installed into a fresh venv, running the entry point the Dockerfile names.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge import __version__
from bridge.kube import submit

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "kustomize" / "base"


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, doc) for p in sorted(DEPLOY.rglob("*.yaml")) if p.name != "kustomization.yaml" for doc in load(p)]


def test_every_manifest_parses_and_names_its_kind_and_api_version() -> None:
    found = manifests()
    assert {doc["kind"] for _, doc in found} >= {"Deployment", "Service", "NetworkPolicy", "Role", "ServiceAccount"}
    for path, doc in found:
        assert doc.get("apiVersion") and doc["metadata"]["name"], path


def test_the_kustomize_base_lists_existing_files_and_its_generated_config_is_used() -> None:
    (kustomization,) = load(BASE / "kustomization.yaml")
    for resource in kustomization["resources"]:
        assert (BASE / resource).is_file(), resource
    (generator,) = kustomization["configMapGenerator"]
    env_file = BASE / generator["envs"][0]
    assert all("=" in line for line in env_file.read_text().splitlines() if line)
    (deployment,) = load(BASE / "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["envFrom"] == [{"configMapRef": {"name": generator["name"]}}]
    assert container["image"] == kustomization["images"][0]["name"]
    assert kustomization["images"][0]["newTag"] == __version__


def test_selectors_match_the_pod_labels_and_none_is_empty() -> None:
    (deployment,) = load(BASE / "deployment.yaml")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    (service,) = load(BASE / "service.yaml")
    assert service["spec"]["selector"] == labels
    (policy,) = load(BASE / "networkpolicy.yaml")
    assert policy["spec"]["podSelector"]["matchLabels"] == labels  # empty would select every pod


def test_the_standalone_sidecar_runs_like_the_jobset_one() -> None:
    (deployment,) = load(BASE / "deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["ports"] == [{"name": "health", "containerPort": 8086}]
    assert container["resources"]["requests"] == container["resources"]["limits"] == {"cpu": "25m", "memory": "192Mi"}
    assert {container[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")} == {
        "/healthz", "/readyz"}
    secret_envs = [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert [e["name"] for e in secret_envs] == ["OTEL_EXPORTER_OTLP_HEADERS"]


def _egress_ports(policy: dict[str, Any]) -> set[int]:
    return {p["port"] for rule in policy["spec"]["egress"] for p in rule.get("ports", [])}


@pytest.mark.parametrize("path", [BASE / "networkpolicy.yaml",
                                  DEPLOY / "examples" / "networkpolicy-benchmark-pod.yaml"])
def test_network_policies_allow_dns_the_exporters_and_otlp(path: Path) -> None:
    (policy,) = load(path)
    assert {53, 9400, 4317, 4318} <= _egress_ports(policy)
    assert policy["spec"]["podSelector"]["matchLabels"]


NETWORK_POLICIES = [(p, d) for p, d in manifests() if d["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize(("path", "policy"), NETWORK_POLICIES, ids=[p.name for p, _ in NETWORK_POLICIES])
def test_every_network_policy_is_valid_against_the_kubernetes_schema(path: Path, policy: dict[str, Any]) -> None:
    from tests.kube.networkpolicy_schema import networkpolicy_problems

    assert networkpolicy_problems(policy) == []


VALID_POLICY = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "p"},
                "spec": {"podSelector": {"matchLabels": {"a": "b"}}, "policyTypes": ["Ingress"],
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"c": "d"}}}],
                                      "ports": [{"protocol": "TCP", "port": 8086}]}]}}


def _with(change: Any) -> dict[str, Any]:
    import copy

    policy = copy.deepcopy(VALID_POLICY)
    change(policy["spec"])
    return policy


@pytest.mark.parametrize(("policy", "fragment"), [
    (_with(lambda s: None), None),
    (_with(lambda s: s["ingress"][0]["from"][0].update(podSelecter={})), "Extra inputs are not permitted"),
    (_with(lambda s: s["ingress"][0]["from"][0]["podSelector"].update(
        match_labels=s["ingress"][0]["from"][0]["podSelector"].pop("matchLabels"))), "spelt as the API spells it"),
    (_with(lambda s: s["ingress"][0]["ports"][0].update(port=[8086])), "ingress.0.ports.0.port"),
    (_with(lambda s: s["ingress"][0]["ports"][0].update(port=80860)), "not in 1-65535"),
    (_with(lambda s: s["ingress"][0]["ports"][0].update(port="Health")), "neither a number nor a port name"),
    (_with(lambda s: s["ingress"][0]["ports"][0].update(protocol="HTTP")), "protocol 'HTTP'"),
    (_with(lambda s: s["ingress"][0]["from"].append({"ipBlock": {}})), "cidr"),
    (_with(lambda s: s["ingress"][0]["from"].append({"ipBlock": {"cidr": "10.0.0.0/33"}})), "ipBlock"),
    (_with(lambda s: s["ingress"][0]["from"][0].update(ipBlock={"cidr": "10.0.0.0/16"})), "both ipBlock"),
    (_with(lambda s: s.update(policyTypes=["Ingress", "Inbound"])), "spec.policyTypes"),
    (_with(lambda s: s.pop("podSelector")), "spec.podSelector: required"),
])
def test_the_schema_check_refuses_what_the_api_server_would(policy: dict[str, Any], fragment: str) -> None:
    from tests.kube.networkpolicy_schema import networkpolicy_problems

    problems = networkpolicy_problems(policy)
    assert any(fragment in p for p in problems) if fragment else problems == [], problems


def test_the_control_port_admits_only_this_namespaces_prometheus() -> None:
    """Issue 16 item 6: the policy admitted any source to 8086. Now one rule, for Prometheus pods of this
    namespace (a peer without namespaceSelector means the policy's own namespace). The kubelet's probes come
    from the node, which a NetworkPolicy cannot block (the comment in the manifest), so no rule names it."""
    (policy,) = load(BASE / "networkpolicy.yaml")
    spec = policy["spec"]
    assert "Ingress" in spec["policyTypes"]  # without it the ingress rules would not restrict anything
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8086}]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    (deployment,) = load(BASE / "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    probes = {container[p]["httpGet"]["port"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"health"} and container["ports"] == [{"name": "health", "containerPort": 8086}]
    assert "block access from their resident node" in (BASE / "networkpolicy.yaml").read_text()


def test_the_benchmark_pod_policy_selects_the_pods_kube_profile_creates() -> None:
    from bridge.kube.jobset import build_jobset
    from tests.kube.test_jobset import make_spec

    (policy,) = load(DEPLOY / "examples" / "networkpolicy-benchmark-pod.yaml")
    template = build_jobset(make_spec())["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()


def test_the_headless_service_example_gives_one_endpoint_per_exporter_pod() -> None:
    (service,) = load(DEPLOY / "examples" / "dcgm-exporter-headless-service.yaml")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}
    assert service["spec"]["ports"][0]["port"] == 9400


def _rules(path: Path, name: str | None = None) -> dict[tuple[str, str], set[str]]:
    (role,) = [r for r in load(path) if name is None or r["metadata"]["name"] == name]
    return {(group, resource): set(rule["verbs"]) for rule in role["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"]}


def test_the_submitter_role_grants_what_the_kube_commands_call() -> None:
    rules = _rules(DEPLOY / "rbac" / "submitter-role.yaml", "dcgm-bridge-submitter")
    assert rules[(submit.GROUP, submit.PLURAL)] >= {"create", "get", "list", "watch", "delete"}
    assert rules[("", "pods")] >= {"list"}
    assert rules[("", "pods/exec")] == {"create"}


def test_the_submitter_roles_create_the_sidecars_rbac_and_hold_what_its_roles_grant() -> None:
    from bridge.kube.rbac import rbac_objects

    by_namespace = {"bench": _rules(DEPLOY / "rbac" / "submitter-role.yaml", "dcgm-bridge-submitter"),
                    "gpu-operator": _rules(DEPLOY / "rbac" / "submitter-role.yaml", "dcgm-bridge-submitter-exporter")}
    plural = {"ServiceAccount": ("", "serviceaccounts"), "Role": ("rbac.authorization.k8s.io", "roles"),
              "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings")}
    for obj in rbac_objects("bench-1", "bench", "gpu-operator", {}):
        held = by_namespace[obj["metadata"]["namespace"]]
        assert held[plural[obj["kind"]]] >= {"create", "delete"}, obj["kind"]
        for rule in obj.get("rules", []):  # the API server refuses a Role granting more than its creator holds
            for key in [(g, r) for g in rule["apiGroups"] for r in rule["resources"]]:
                assert held[key] >= set(rule["verbs"]), key


def test_the_discovery_role_is_list_on_endpointslices_only() -> None:
    assert _rules(DEPLOY / "rbac" / "discovery-role.yaml") == {("discovery.k8s.io", "endpointslices"): {"list"}}


def test_the_dockerfile_runs_the_sidecar_as_a_numeric_non_root_user() -> None:
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()]
    final_stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")):]
    assert final_stage[0].startswith("FROM python:") and "-slim" in final_stage[0]
    assert "USER 1000:1000" in final_stage
    assert 'ENTRYPOINT ["dcgm-bridge", "sidecar"]' in final_stage
    assert not any("--no-compile" in line for line in lines)  # bytecode must be in the read-only image


def test_the_dockerfile_builds_the_wheel_with_a_c_compiler_so_the_image_gets_the_kernel() -> None:
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()]
    build = lines[:max(i for i, line in enumerate(lines) if line.startswith("FROM "))]
    installs = next(i for i, line in enumerate(build) if "apt-get install" in line and " gcc" in line)
    wheels = next(i for i, line in enumerate(build) if line.startswith("RUN pip wheel"))
    assert installs < wheels


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel the Dockerfile's build stage makes, built from a copy of what it COPYs."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "bridge", src / "bridge", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheels")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    (built,) = out.glob("dcgm_bridge-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_carries_the_package_data_and_the_kube_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "bridge/data/fields.csv" in names
    assert "bridge/kube/cli.py" in names and "bridge/kube/jobset.py" in names
    assert any(n.endswith("entry_points.txt") for n in names)
    assert any(n.startswith("bridge/_kernel") and n.endswith(".so") for n in names), "the compiled kernel is missing"


@pytest.mark.slow
def test_the_entry_point_from_the_wheel_runs_in_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True)
    # Third-party dependencies come from the project's environment (a path entry, so its editable
    # finder for `bridge` is not loaded); `bridge` itself must come from the wheel.
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    origin = subprocess.run([str(py), "-c", "import bridge; print(bridge.__file__)"], capture_output=True,
                            text=True, check=True, env=env, cwd=tmp_path).stdout.strip()
    assert origin.startswith(str(site))
    entry = venv / "bin" / "dcgm-bridge"
    version = subprocess.run([str(entry), "--version"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert version.returncode == 0 and __version__ in version.stdout
    assert "(compiled per-page kernel)" in version.stdout
    sidecar = subprocess.run([str(entry), "sidecar", "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert sidecar.returncode == 0, sidecar.stderr
    assert "--health-port" in sidecar.stdout and "--gpu-telemetry" in sidecar.stdout
    kube = subprocess.run([str(entry), "kube", "profile", "--help"], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert kube.returncode == 0 and "--no-gpu-telemetry" in kube.stdout
