"""bridge/pods.py: `--gpu-pods` values and the pod a GPU series' labels attribute it to."""

from __future__ import annotations

import pytest

from bridge.errors import ConfigError
from bridge.pods import PodPattern, PodRef, attribution, parse_pod_patterns, pod_of_labels, serves

BENCH = parse_pod_patterns(["bench/llama-*", "bench/vllm-?", "bench/llama-*"])


def test_repeated_values_are_kept_once_in_the_order_given() -> None:
    assert (PodPattern("bench", "llama-*"), PodPattern("bench", "vllm-?")) == BENCH


@pytest.mark.parametrize(("labels", "pod"), [
    ({"gpu": "0", "namespace": "bench", "pod": "llama-0", "container": "server"}, PodRef("bench", "llama-0", "server")),
    ({"gpu": "0", "pod_namespace": "bench", "pod_name": "llama-0", "container_name": "server"},
     PodRef("bench", "llama-0", "server")),
    ({"gpu": "0", "namespace": "", "pod": "", "pod_namespace": "bench", "pod_name": "llama-0"},
     PodRef("bench", "llama-0")),
    ({"gpu": "0", "namespace": "", "pod": "", "container": ""}, None),
    ({"gpu": "0"}, None),
    ({"gpu": "0", "pod": "llama-0"}, None),
])
def test_the_pod_comes_from_the_current_or_the_older_labels_and_empty_strings_mean_none(
        labels: dict[str, str], pod: PodRef | None) -> None:
    assert pod_of_labels(labels) == pod


@pytest.mark.parametrize(("pod", "expected"), [
    (PodRef("bench", "llama-0"), "selected"),
    (PodRef("bench", "vllm-7"), "selected"),
    (PodRef("bench", "vllm-17"), "other_pod"),
    (PodRef("other", "llama-0"), "other_pod"),  # the namespace must match exactly
    (PodRef("bench", "LLAMA-0"), "other_pod"),  # names are case-sensitive
    (None, "unattributed"),
])
def test_a_gpu_is_selected_only_for_a_pod_matching_namespace_and_glob(pod: PodRef | None, expected: str) -> None:
    assert attribution(BENCH, pod) == expected
    assert serves(BENCH, pod) == (expected == "selected")


@pytest.mark.parametrize("value", ["llama-*", "Bench/x", "bench/", "bench/app=llama", "-x/y", "a" * 64 + "/x"])
def test_a_bad_value_is_a_config_error_naming_it(value: str) -> None:
    with pytest.raises(ConfigError, match="--gpu-pods"):
        parse_pod_patterns([value])
