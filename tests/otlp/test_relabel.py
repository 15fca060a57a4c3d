"""Relabel rules behave like Prometheus' metric_relabel_configs; the pod-label allowlist trims labels."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.relabel import NO_RELABEL, RelabelConfigError, is_pod_label, load_config, parse_config, relabel

LABELS = MappingProxyType(
    {
        "gpu": "0",
        "UUID": "GPU-1",
        "modelName": "NVIDIA H100",
        "Hostname": "node-1",
        "DCGM_FI_DRIVER_VERSION": "580.1",
        "pod": "vllm-0",
        "app": "vllm",
        "team": "infra",
    }
)


def rules(*raw):
    return parse_config({"metric_relabel_configs": list(raw)})


def test_no_rules_return_the_very_same_mapping():
    assert relabel(NO_RELABEL, "X", LABELS) == ("X", LABELS)
    assert relabel(NO_RELABEL, "X", LABELS)[1] is LABELS


def test_keep_forwards_only_matching_series_and_the_regex_is_anchored():
    config = rules({"source_labels": ["__name__"], "regex": "DCGM_FI_DEV_.*", "action": "keep"})
    assert relabel(config, "DCGM_FI_DEV_GPU_UTIL", LABELS) is not None
    assert relabel(config, "X_DCGM_FI_DEV_GPU_UTIL", LABELS) is None


def test_drop_removes_matching_series_using_joined_source_labels():
    config = rules(
        {"source_labels": ["gpu", "modelName"], "separator": "/", "regex": "0/NVIDIA.*", "action": "drop"}
    )
    assert relabel(config, "X", LABELS) is None
    assert relabel(config, "X", {**LABELS, "gpu": "1"}) is not None


def test_replace_writes_the_expanded_replacement_and_an_empty_result_removes_the_label():
    config = rules(
        {
            "source_labels": ["Hostname"],
            "regex": "node-(.*)",
            "target_label": "node",
            "replacement": "n${1}x",
        },
        {
            "source_labels": ["missing"],
            "target_label": "team",
        },  # regex (.*) matches "", replacement "" removes
    )
    name, labels = relabel(config, "X", LABELS)
    assert labels["node"] == "n1x" and "team" not in labels
    assert dict(LABELS)["team"] == "infra"  # the input is never modified


def test_replace_can_rename_the_metric_through_the_name_label():
    config = rules(
        {
            "source_labels": ["__name__"],
            "regex": "DCGM_FI_DEV_(.*)",
            "target_label": "__name__",
            "replacement": "gpu_$1",
        }
    )
    assert relabel(config, "DCGM_FI_DEV_POWER_USAGE", LABELS)[0] == "gpu_POWER_USAGE"


def test_labeldrop_and_labelkeep_match_label_names():
    dropped = relabel(rules({"action": "labeldrop", "regex": "DCGM_FI_.*|pod"}), "X", LABELS)[1]
    assert set(dropped) == set(LABELS) - {"DCGM_FI_DRIVER_VERSION", "pod"}
    kept = relabel(rules({"action": "labelkeep", "regex": "gpu|UUID"}), "X", LABELS)
    assert kept == ("X", {"gpu": "0", "UUID": "GPU-1"})


def test_the_pod_label_allowlist_keeps_exporter_labels_and_only_listed_pod_labels():
    config = parse_config({"pod_label_allowlist": ["app"]})
    assert set(relabel(config, "X", LABELS)[1]) == set(LABELS) - {"team"}
    assert (
        is_pod_label("team") and not is_pod_label("DCGM_FI_DRIVER_VERSION") and not is_pod_label("hostname")
    )
    # dcgm-exporter 4.9+ writes the driver label under its DCGM 4.7 name: still the exporter's own (issue 14)
    assert not is_pod_label("DCGM_FI_SYSTEM_DRIVER_VERSION") and not is_pod_label("Hostname")


def test_the_rules_may_be_the_whole_document(tmp_path):
    path = tmp_path / "relabel.yaml"
    path.write_text("- source_labels: [__name__]\n  regex: DCGM_FI_PROF_.*\n  action: drop\n")
    assert relabel(load_config(path), "DCGM_FI_PROF_SM_ACTIVE", LABELS) is None


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"metric_relabel_configs": [{"action": "hashmod"}]}, "action 'hashmod' is not one of"),
        ({"metric_relabel_configs": [{"action": "keep"}]}, "keep needs source_labels"),
        ({"metric_relabel_configs": [{"source_labels": ["a"]}]}, "replace needs target_label"),
        ({"metric_relabel_configs": [{"action": "labeldrop", "regex": "("}]}, "is invalid"),
        (
            {"metric_relabel_configs": [{"action": "labeldrop", "regex": "a", "target_label": "b"}]},
            "takes only regex",
        ),
        (
            {"metric_relabel_configs": [{"source_labels": "gpu", "action": "drop"}]},
            "must be a list of label names",
        ),
        ({"pod_label_allowlist": "app"}, "pod_label_allowlist must be a list"),
        ({"relabel": []}, "unknown key 'relabel'"),
        (
            {"metric_relabel_configs": [{"action": "drop", "source_labels": ["a"], "regexp": "x"}]},
            "unknown key",
        ),
        ("text", "expected a mapping or a list"),
    ],
)
def test_invalid_configs_are_refused_with_a_message_naming_the_problem(document, message):
    with pytest.raises(RelabelConfigError, match=message):
        parse_config(document)


def test_every_problem_is_reported_at_once_sorted():
    with pytest.raises(RelabelConfigError) as info:
        parse_config({"metric_relabel_configs": [{"action": "keep"}, {"action": "nope"}], "x": 1})
    lines = str(info.value).splitlines()
    assert len(lines) == 3 and lines == sorted(lines)


names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True)


@settings(deadline=None)
@given(
    labels=st.dictionaries(names, st.text(max_size=10), max_size=8),
    regex=st.sampled_from(["a.*", ".*_.*", "x"]),
)
def test_labeldrop_never_adds_labels_and_labelkeep_keeps_a_subset(labels, regex):
    kept = relabel(rules({"action": "labelkeep", "regex": regex}), "X", labels)
    dropped = relabel(rules({"action": "labeldrop", "regex": regex}), "X", labels)
    assert kept is not None and dropped is not None
    assert set(kept[1]) | set(dropped[1]) == set(labels)
    assert not set(kept[1]) & set(dropped[1])
