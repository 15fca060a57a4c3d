"""pyproject.toml declares what bridge/ imports: no runtime dependency that nothing imports, no import
that is not declared (the gRPC transport's grpcio is the `grpc` extra)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from bridge.otlp.config import OtlpConfig, OtlpConfigError
from bridge.otlp.transport import GrpcSender

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = {"grpc": "grpc"}  # extra -> the one top-level module it serves


def imported_modules() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "bridge").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return {m for m in found if m != "bridge" and m not in sys.stdlib_module_names}


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return canonical(match.group(0))


def declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = {requirement_name(r) for r in project["dependencies"]}
    extras = {extra: {requirement_name(r) for r in reqs}
              for extra, reqs in project["optional-dependencies"].items()}
    return runtime, extras


def distribution_of(module: str) -> str:
    dists = packages_distributions().get(module)
    assert dists, f"bridge/ imports {module!r}, which no installed distribution provides"
    return canonical(dists[0])


@pytest.mark.slow
def test_every_runtime_dependency_is_imported_by_bridge() -> None:
    runtime, _ = declared()
    imported = {distribution_of(m) for m in imported_modules()}
    assert runtime - imported == set(), "declared but never imported by bridge/"


@pytest.mark.slow
def test_everything_bridge_imports_is_a_runtime_dependency_or_its_extra() -> None:
    runtime, extras = declared()
    missing = []
    for module in sorted(imported_modules()):
        dist = distribution_of(module)
        extra = next((e for e, m in OPTIONAL.items() if m == module), None)
        if dist not in runtime and (extra is None or dist not in extras[extra]):
            missing.append(f"{module} ({dist})")
    assert not missing, "imported by bridge/ but not declared: " + ", ".join(missing)


def test_the_test_extra_holds_the_oracles_that_bridge_does_not_import() -> None:
    runtime, extras = declared()
    oracles = {"httpx", "opentelemetry-sdk", "opentelemetry-exporter-otlp", "opentelemetry-proto", "grpcio"}
    assert oracles <= extras["test"] and not oracles & runtime


def test_grpc_without_grpcio_is_a_one_line_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # what `import grpc` finds when grpcio is not installed
    with pytest.raises(OtlpConfigError, match=r"^OTLP over gRPC needs grpcio: pip install 'dcgm-bridge\[grpc\]'"):
        GrpcSender(OtlpConfig(endpoint="127.0.0.1:4317", protocol="grpc", insecure=True))
