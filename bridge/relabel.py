"""Prometheus-style relabelling of exporter series, and an allowlist for pod labels.

The rules are Prometheus' `metric_relabel_configs` subset `keep`, `drop`, `replace`, `labeldrop`,
`labelkeep`, with Prometheus' defaults (separator `;`, regex `(.*)` fully anchored, replacement
`$1`) and `__name__` readable and writable. They let users stay under backend label limits (Mimir
rejects series with more than 30 labels; dcgm-exporter with pod labels on hits it, dcgm-exporter#585).

File (YAML):

    pod_label_allowlist: [app, "team_.*"]  # regexes; labels dcgm-exporter does not own are pod labels
    metric_relabel_configs:                # or the list of rules alone as the whole document
      - source_labels: [__name__]
        regex: DCGM_FI_PROF_.*
        action: drop
      - action: labeldrop
        regex: DCGM_FI_(SYSTEM_)?DRIVER_VERSION   # <= 4.8 and 4.9+ (DCGM 4.7) spellings

The allowlist applies first (it decides which pod labels exist), then the rules in order; labels a
rule creates are kept. Everything here is a pure function over immutable values, so the OTLP
encoder and the pull endpoint can cache results per series.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bridge.errors import ConfigError

Action = Literal["keep", "drop", "replace", "labeldrop", "labelkeep"]
ACTIONS: tuple[Action, ...] = ("keep", "drop", "replace", "labeldrop", "labelkeep")
NAME_LABEL = "__name__"

# Labels dcgm-exporter writes itself (NVIDIA/dcgm-exporter `internal/pkg/rendermetrics/render_metrics.go`,
# every dialect: `-o` old names, 4.6 lowercase `hostname`, NvLink/NvSwitch/CPU entities, exporter-owned families). Any
# other label is a sanitised Kubernetes pod label, which `pod_label_allowlist` filters.
EXPORTER_LABELS = frozenset(
    [
        "gpu", "UUID", "uuid", "pci_bus_id", "device", "modelName", "model_name", "Hostname", "hostname",
        "GPU_I_PROFILE", "GPU_I_ID", "container", "namespace", "pod", "pod_uid", "pod_name", "pod_namespace",
        "container_name", "vgpu", "err_code", "err_msg", "hpc_job", "window_size_in_ms", "xid", "clock_event",
        "health_watch", "health_error_code", "peer_gpu", "link_status", "nvswitch", "nvlink", "gpu_uuid",
        "cpu", "cpucore",
    ]
)
_EXPORTER_PREFIXES = ("DCGM_FI_", "dra_")


class RelabelConfigError(ConfigError):
    """The relabel file is invalid; the message lists every problem, sorted."""


@dataclass(frozen=True)
class Rule:
    action: Action
    source_labels: tuple[str, ...] = ()
    separator: str = ";"
    regex: re.Pattern[str] = field(default_factory=lambda: re.compile("(?:(.*))\\Z"))
    target_label: str = ""
    replacement: str = "$1"


@dataclass(frozen=True)
class RelabelConfig:
    rules: tuple[Rule, ...] = ()
    pod_label_allowlist: tuple[re.Pattern[str], ...] | None = None  # None: keep every pod label

    @property
    def empty(self) -> bool:
        return not self.rules and self.pod_label_allowlist is None


NO_RELABEL = RelabelConfig()


def is_pod_label(name: str) -> bool:
    return name not in EXPORTER_LABELS and not name.startswith(_EXPORTER_PREFIXES)


def relabel(
    config: RelabelConfig, name: str, labels: Mapping[str, str]
) -> tuple[str, Mapping[str, str]] | None:
    """(name, labels) after the allowlist and the rules, or None when a rule drops the series.

    The input mapping is never modified; without any change it is returned as is.
    """
    if config.empty:
        return name, labels
    work: dict[str, str] = dict(labels)
    allow = config.pod_label_allowlist
    if allow is not None:
        for key in [k for k in work if is_pod_label(k) and not any(p.fullmatch(k) for p in allow)]:
            del work[key]
    work[NAME_LABEL] = name
    for rule in config.rules:
        if not _apply(rule, work):
            return None
    new_name = work.pop(NAME_LABEL, "")
    if not new_name:
        return None  # a rule removed the name: nothing to forward (Prometheus drops it too)
    if new_name == name and work == labels:
        return name, labels
    return new_name, work


def _apply(rule: Rule, work: dict[str, str]) -> bool:
    """Apply one rule to `work` in place; False when the series is dropped."""
    if rule.action in ("labeldrop", "labelkeep"):
        keep_matching = rule.action == "labelkeep"
        for key in [k for k in work if k != NAME_LABEL and bool(rule.regex.match(k)) != keep_matching]:
            del work[key]
        return True
    value = rule.separator.join(work.get(label, "") for label in rule.source_labels)
    match = rule.regex.match(value)
    if rule.action == "keep":
        return match is not None
    if rule.action == "drop":
        return match is None
    if match is not None:  # replace
        target = _expand(match, rule.target_label)
        result = _expand(match, rule.replacement)
        if not target:
            return True
        if result:
            work[target] = result
        else:
            work.pop(target, None)  # Prometheus: an empty replacement removes the label
    return True


_TEMPLATE = re.compile(r"\$(?:\$|\{(\w+)\}|(\w+))")


def _expand(match: re.Match[str], template: str) -> str:
    """Go's `regexp.Expand`: `$1`, `${1}`, `$name`, `${name}`, `$$`; an unknown group expands to ""."""
    if "$" not in template:
        return template

    def group(m: re.Match[str]) -> str:
        ref = m.group(1) or m.group(2)
        if ref is None:
            return "$"
        try:
            got = match.group(int(ref) if ref.isdigit() else ref)
        except IndexError:  # no such group
            return ""
        return got or ""

    return _TEMPLATE.sub(group, template)


def parse_config(document: Any, *, source: str = "relabel config") -> RelabelConfig:
    """Validate a loaded YAML document; every problem is reported at once, sorted."""
    problems: list[str] = []
    allow_raw: Any = None
    if isinstance(document, Mapping):
        unknown = sorted(set(document) - {"metric_relabel_configs", "relabel_configs", "pod_label_allowlist"})
        problems += [f"{source}: unknown key {key!r}" for key in unknown]
        raw_rules = document.get("metric_relabel_configs", document.get("relabel_configs", [])) or []
        allow_raw = document.get("pod_label_allowlist")
    elif isinstance(document, list):
        raw_rules = document
    elif document is None:
        raw_rules = []
    else:
        kind = type(document).__name__
        raise RelabelConfigError(f"{source}: expected a mapping or a list of rules, got {kind}")
    if not isinstance(raw_rules, list):
        problems.append(f"{source}: metric_relabel_configs must be a list")
        raw_rules = []
    rules = []
    for index, raw in enumerate(raw_rules):
        rule = _parse_rule(raw, f"{source}: rule {index + 1}", problems)
        if rule is not None:
            rules.append(rule)
    allowlist: tuple[re.Pattern[str], ...] | None = None
    if allow_raw is not None:
        if not isinstance(allow_raw, list) or not all(isinstance(x, str) for x in allow_raw):
            problems.append(f"{source}: pod_label_allowlist must be a list of label names or regexes")
        else:
            compiled = [_compile(x, f"{source}: pod_label_allowlist", problems) for x in allow_raw]
            allowlist = tuple(p for p in compiled if p is not None)
    if problems:
        raise RelabelConfigError("\n".join(sorted(problems)))
    return RelabelConfig(tuple(rules), allowlist)


def load_config(path: str | Path) -> RelabelConfig:
    import yaml  # lazily: the sidecar only needs it when a relabel file is given

    text = Path(path).read_text(encoding="utf-8")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RelabelConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(document, source=str(path))


def _parse_rule(raw: Any, where: str, problems: list[str]) -> Rule | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping")
        return None
    known = {"action", "source_labels", "separator", "regex", "target_label", "replacement"}
    problems += [f"{where}: unknown key {key!r}" for key in sorted(set(raw) - known)]
    action = raw.get("action", "replace")
    if action not in ACTIONS:
        problems.append(f"{where}: action {action!r} is not one of {', '.join(ACTIONS)}")
        return None
    source_labels = raw.get("source_labels", [])
    if not isinstance(source_labels, Sequence) or isinstance(source_labels, str) or not all(
        isinstance(x, str) for x in source_labels
    ):
        problems.append(f"{where}: source_labels must be a list of label names")
        return None
    separator = str(raw.get("separator", ";"))
    regex = _compile(str(raw.get("regex", "(.*)")), where, problems)
    if regex is None:
        return None
    target = str(raw.get("target_label", ""))
    if action in ("keep", "drop") and not source_labels:
        problems.append(f"{where}: {action} needs source_labels")
    if action == "replace" and not target:
        problems.append(f"{where}: replace needs target_label")
    if action in ("labeldrop", "labelkeep") and (source_labels or target):
        problems.append(f"{where}: {action} takes only regex")
    return Rule(action, tuple(source_labels), separator, regex, target, str(raw.get("replacement", "$1")))


def _compile(pattern: str, where: str, problems: list[str]) -> re.Pattern[str] | None:
    # Prometheus anchors every relabel regex at both ends (`^(?:...)$`).
    try:
        return re.compile(f"(?:{pattern})\\Z")
    except re.error as exc:
        problems.append(f"{where}: regex {pattern!r} is invalid: {exc}")
        return None
