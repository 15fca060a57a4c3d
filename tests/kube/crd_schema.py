"""The vendored JobSet CRD's openAPIV3Schema as a strict JSON Schema.

The server prunes unknown fields; here every object with `properties` gets `additionalProperties:
false`, so a misspelt field fails the unit tests instead of vanishing on the cluster.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema

from tests.kube.conftest import load_crd

_DROP = ("description", "format", "default")


def _convert(node: Any) -> Any:
    if isinstance(node, list):
        return [_convert(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _convert(v) for k, v in node.items() if k not in _DROP and not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    out.pop("nullable", None)
    if "properties" in out and not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


@cache
def validator() -> jsonschema.Draft202012Validator:
    crd = load_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    converted = _convert(schema)
    converted["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft202012Validator(converted)


def schema_errors(obj: dict[str, Any]) -> list[str]:
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(obj))
