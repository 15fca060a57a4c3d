"""The import graph of `bridge/` follows DESIGN.md's module map: no cycle, nothing imports upward.

Every import counts, the lazy ones inside functions and the type-only ones under TYPE_CHECKING too: a
cycle hidden behind a lazy import is still a cycle a reader has to untangle.
"""

from __future__ import annotations

import ast
from pathlib import Path

BRIDGE = Path(__file__).resolve().parent.parent / "bridge"

# DESIGN.md "Module map": lowest first. A module may import the layers below its own, and the modules
# of its own package; never a module of its own layer outside its package, never one above.
LAYERS: list[set[str]] = [
    {"bridge", "bridge.samples", "bridge._kernel", "bridge.kernel", "bridge.views", "bridge.digest"},
    {"bridge.errors", "bridge.redact", "bridge.files"},
    {"bridge.endpoints", "bridge.fields", "bridge.simulator", "bridge.pods", "bridge.headers"},
    {"bridge.config", "bridge.roles", "bridge.fetch", "bridge.parse", "bridge.relabel", "bridge.events",
     "bridge.discovery"},
    {"bridge.record_log", "bridge.health", "bridge.sources"},
    {"bridge.scrape", "bridge.normalize", "bridge.select"},
    {"bridge.otlp", "bridge.report", "bridge.recognize"},
    {"bridge.sidecar", "bridge.kube"},
    {"bridge.cli"},
]

# A C extension is one unit with the module that wraps it (bridge/kernel.py is the face of bridge/_kernel.c).
WRAPPED_BY = {"bridge._kernel": "bridge.kernel"}


def module_name(path: Path) -> str:
    parts = path.relative_to(BRIDGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "bridge")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "bridge":
            found.add(node.module)
            # `from bridge import __version__` names an attribute; `from bridge.report import spool` a module
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if (BRIDGE.parent / dotted.replace(".", "/")).with_suffix(".py").exists():
                    found.add(dotted)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in BRIDGE.rglob("*.py")}
    return {name: {i for i in imports_of(path) if i != name} for name, path in modules.items()}


def unit_of(module: str) -> str:
    """The layered unit a module belongs to: its package for packages, else itself."""
    module = WRAPPED_BY.get(module, module)
    for layer in LAYERS:
        for unit in sorted(layer, key=len, reverse=True):
            if module == unit or (unit != "bridge" and module.startswith(unit + ".")):
                return unit
    raise AssertionError(f"{module} is in no layer of DESIGN.md's module map: add it there and to LAYERS")


def layer_of(module: str) -> int:
    unit = unit_of(module)
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def test_every_module_has_a_layer() -> None:
    for module in graph():
        layer_of(module)


def test_nothing_imports_upward_or_across_its_layer() -> None:
    wrong = []
    for module, imported in sorted(graph().items()):
        for target in sorted(imported):
            if unit_of(target) == unit_of(module) or unit_of(target) == "bridge":
                continue
            if layer_of(target) >= layer_of(module):
                wrong.append(f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})")
    assert not wrong, "\n".join(wrong)


def test_only_bridge_kernel_imports_the_c_extension() -> None:
    """bridge/kernel.py is the kernel's one face: it alone knows whether the extension was built. (Counted from
    the syntax tree: `from bridge import _kernel` names no .py file, so `imports_of` alone would miss it.)"""
    importers = set()
    for path in BRIDGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            if "bridge._kernel" in names:
                importers.add(module_name(path))
    assert importers == {"bridge.kernel"}


def test_the_import_graph_has_no_cycle() -> None:
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in edges:
                continue
            if state.get(nxt) == 1:
                cycles.append(" → ".join([*stack[stack.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(cycles)


def test_design_md_names_every_module_in_its_module_map() -> None:
    design = (BRIDGE.parent / "DESIGN.md").read_text(encoding="utf-8")
    start = design.index("## Module map")
    section = design[start:design.index("\n## ", start)]
    missing = []
    for path in sorted(BRIDGE.rglob("*.py")):
        relative = path.relative_to(BRIDGE).as_posix()
        if path.name == "__init__.py":
            relative = relative.removesuffix("__init__.py")
        if relative and f"`{relative}`" not in section and f"`{path.name}`" not in section:
            missing.append(relative)
    assert not missing, f"DESIGN.md's module map does not name: {missing}"
