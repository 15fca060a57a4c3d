"""The family of a sample: the one rule the normaliser, the OTLP encoder and the pull page share.

A sample belongs to its own name's TYPE; else to the TYPE of its name without one of the family
suffixes (`x_total`, `x_created` → `x`; `h_bucket`, `h_count`, `h_sum` → `h`; `i_info` → `i`); else it
is untyped and its own family. `suffix` says how it joined: a `_created` sample is OpenMetrics metadata
of its family (a start time, not a value), which no consumer forwards as a sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

FAMILY_SUFFIXES = ("_bucket", "_count", "_sum", "_created", "_total", "_info")


class Family(NamedTuple):
    name: str  # the TYPE/HELP name
    type: str  # as declared; "untyped" when nothing declares it
    suffix: str  # "" or the suffix that joins the sample to the family


def family_of(sample_name: str, types: Mapping[str, str]) -> Family:
    declared = types.get(sample_name)
    if declared is not None:
        return Family(sample_name, declared, "")
    for suffix in FAMILY_SUFFIXES:
        if sample_name.endswith(suffix):
            stem = sample_name[: -len(suffix)]
            declared = types.get(stem)
            if declared is not None:
                return Family(stem, declared, suffix)
    return Family(sample_name, "untyped", "")


def family_type(types: Mapping[str, str], sample_name: str) -> str:
    """The TYPE that governs a sample (`family_of(...).type`)."""
    return family_of(sample_name, types).type
