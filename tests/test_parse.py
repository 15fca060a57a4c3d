"""The parser agrees with prometheus_client wherever prometheus_client can read a line, keeps every
well-formed line of a page whatever else is on it, and says why it dropped the rest."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from bridge.parse import PageParser, family_type, parse_page
from tests.conftest import REAL_PAGES


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def oracle_line(line: str) -> tuple[str, dict[str, str], float, int | None] | None:
    """prometheus_client's reading of one sample line alone, or None when it rejects it."""
    try:
        families = list(text_string_to_metric_families(line))
    except (ValueError, IndexError):
        return None
    samples = [s for f in families for s in f.samples]
    if len(samples) != 1:
        return None
    s = samples[0]
    ts = None if s.timestamp is None else round(float(s.timestamp) * 1000)
    return s.name, dict(s.labels), float(s.value), ts


def assert_agrees_line_by_line(text: str) -> None:
    page = parse_page(text.encode())
    expected = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        # A sample line has whitespace between name and value; without it prometheus_client reads
        # `NAN` as a sample named `NA` (its name search falls off the end), which is not the format.
        reading = oracle_line(stripped) if len(stripped.split()) > 1 else None
        if reading is not None:
            expected.append(reading)
    ours = [(s.name, dict(s.labels), s.value, s.timestamp_ms) for s in page.samples]
    assert len(ours) == len(expected)
    for mine, theirs in zip(ours, expected, strict=True):
        assert mine[0] == theirs[0] and mine[1] == theirs[1] and mine[3] == theirs[3]
        assert _same(mine[2], theirs[2])


@pytest.mark.parametrize("path", REAL_PAGES, ids=lambda p: p.name)
def test_every_real_page_agrees_with_prometheus_client_line_by_line(path):
    assert_agrees_line_by_line(path.read_text(encoding="utf-8"))


# prometheus_client rejects the README page as a whole ('...' lines); the line-by-line test covers it.
WHOLE_PAGES = [p for p in REAL_PAGES if "readme" not in p.name]


def test_only_the_readme_page_is_unreadable_for_prometheus_client():
    for path in REAL_PAGES:
        text = path.read_text(encoding="utf-8")
        if path in WHOLE_PAGES:
            list(text_string_to_metric_families(text))
        else:
            with pytest.raises(ValueError):
                list(text_string_to_metric_families(text))


@pytest.mark.parametrize("path", WHOLE_PAGES, ids=lambda p: p.name)
def test_every_real_page_prometheus_client_reads_whole_gives_the_same_samples(path):
    text = path.read_text(encoding="utf-8")
    families = list(text_string_to_metric_families(text))
    theirs = []
    for family in families:
        for s in family.samples:
            # prometheus_client renames counter samples to `<name>_total`; we keep names as written.
            name = s.name[:-6] if family.type == "counter" and s.name == family.name + "_total" else s.name
            theirs.append((name, dict(s.labels), float(s.value)))
    ours = [(s.name, dict(s.labels), s.value) for s in parse_page(text.encode()).samples]
    assert ours == theirs


def test_the_readme_page_keeps_every_sample_and_drops_only_the_elisions(data_dir):
    page = parse_page((data_dir / "dcgm-exporter_readme_blank_sentinel.txt").read_bytes())
    assert len(page.samples) == 6
    assert [d.text for d in page.dropped] == ["...", "..."]
    assert all("invalid metric name" in d.reason for d in page.dropped)
    assert page.samples[2].value == 9223372036854775794.0  # the sentinel is still there; normalise drops it


BAD_LINES = [
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0",modelName="NVIDIA "H100""} 31', "invalid labels"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0"} ', "no value"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0"}', "no value"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0"} abc', "invalid value"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 1_000', "invalid value"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 31 12x', "invalid timestamp"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 31 1 2', "unexpected text"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0" 31', "no closing"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu=0} 31', "invalid labels"),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0",gpu="1"} 31', "invalid labels"),
    ('DCGM_FI_DEV_GPU_TEMP{0gpu="0"} 31', "invalid labels"),
    ("9metric 1", "invalid metric name"),
    ("metric-name 1", "invalid metric name"),
    ('{gpu="0"} 1', "invalid metric name"),
    ("garbage", "no value"),
    ("# TYPE bad-name gauge", "invalid metric name"),
    ("# TYPE DCGM_FI_DEV_GPU_TEMP", "TYPE without a type"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES)
def test_a_bad_line_is_dropped_with_its_number_and_reason_and_the_rest_survives(line, reason):
    text = f'good_before{{gpu="0"}} 1\n{line}\ngood_after{{gpu="1"}} 2\n'
    page = parse_page(text.encode())
    assert [s.name for s in page.samples] == ["good_before", "good_after"]
    assert len(page.dropped) == 1
    assert page.dropped[0].line == 2 and reason in page.dropped[0].reason


def test_escapes_spaces_after_commas_and_a_trailing_comma_are_read():
    text = 'm{a="x\\"y", b="back\\\\slash",c="new\\nline",} 1\n'
    (sample,) = parse_page(text.encode()).samples
    assert dict(sample.labels) == {"a": 'x"y', "b": "back\\slash", "c": "new\nline"}


def test_crlf_utf8_help_and_missing_type_are_fine():
    text = "# HELP t GPU temperature (in °C).\r\nt{gpu=\"0\"} 31\r\n"
    page = parse_page(text.encode())
    assert page.helps["t"] == "GPU temperature (in °C)."
    assert page.samples[0].value == 31.0 and family_type(page.types, "t") == "untyped"


def test_nan_infinities_and_integers_beyond_2_to_53_are_floats():
    text = "a NaN\nb +Inf\nc -Inf\nd 9223372036854775794\ne 18446744073709551615\n"
    values = [s.value for s in parse_page(text.encode()).samples]
    assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf
    assert values[3] == float(9223372036854775794) and values[4] == float(18446744073709551615)


def test_openmetrics_eof_ends_the_page_and_timestamps_are_seconds():
    text = "# TYPE e counter\ne_total 5 1700000000.5\n# EOF\nafter 1\n"
    page = parse_page(text.encode())
    assert [(s.name, s.timestamp_ms) for s in page.samples] == [("e_total", 1700000000500)]
    assert family_type(page.types, "e_total") == "counter"


def test_prometheus_text_timestamps_are_milliseconds():
    (sample,) = parse_page(b"m 1 1700000000123\n").samples
    assert sample.timestamp_ms == 1700000000123


def test_an_empty_body_is_an_empty_page():
    page = parse_page(b"")
    assert page.samples == [] and page.dropped == []


def test_help_and_type_without_samples_and_repeated_families_are_accepted():
    text = ("# HELP x X\n# TYPE x gauge\n# HELP y Y\n# TYPE y counter\n"
            'y{gpu="0"} 1\n# HELP x X\n# TYPE x gauge\nx{nvlink="0"} 2\n')
    page = parse_page(text.encode())
    assert [(s.name, s.value) for s in page.samples] == [("y", 1.0), ("x", 2.0)]
    assert page.types == {"x": "gauge", "y": "counter"}


def test_the_same_label_set_is_one_shared_read_only_mapping_across_pages():
    parser = PageParser()
    first = parser.parse(b'm{gpu="0"} 1\n').samples[0].labels
    second = parser.parse(b'm{gpu="0"} 2\n').samples[0].labels
    assert first is second
    with pytest.raises(TypeError):
        first["gpu"] = "1"  # type: ignore[index]


# -- generated pages ---------------------------------------------------------------------------------
_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,15}", fullmatch=True).filter(
    lambda n: not n.endswith(("_total", "_count", "_sum", "_bucket", "_created", "_info", "_gcount", "_gsum")))
_label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True).filter(lambda n: not n.startswith("__"))
_label_values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x85\u2028\u2029"),
                        max_size=12)
_values = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "0.000000", "16.365000"]),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def pages(draw: st.DrawFn) -> str:
    lines: list[str] = []
    names = draw(st.lists(_names, min_size=1, max_size=6, unique=True))
    for name in names:
        kind = draw(st.sampled_from(["gauge", "counter", "untyped", None]))
        if draw(st.booleans()):
            lines.append(f"# HELP {name} {_escape(draw(st.text(max_size=20)))}".rstrip())
        if kind:
            lines.append(f"# TYPE {name} {kind}")
        for _ in range(draw(st.integers(0, 4))):
            labels = draw(st.dictionaries(_label_names, _label_values, max_size=4))
            sep = draw(st.sampled_from([",", ", "]))
            label_text = sep.join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            stamp = draw(st.one_of(st.none(), st.integers(0, 2 * 10**12)))
            line = f"{name}{{{label_text}}} {draw(_values)}" if labels or draw(st.booleans()) else \
                f"{name} {draw(_values)}"
            lines.append(line if stamp is None else f"{line} {stamp}")
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    return ending.join(lines) + ending


@settings(max_examples=200, deadline=None)
@given(pages())
@pytest.mark.slow
def test_generated_pages_give_prometheus_clients_samples(text):
    families = list(text_string_to_metric_families(text))
    theirs = []
    for family in families:
        for s in family.samples:
            name = s.name[:-6] if family.type == "counter" and s.name.endswith("_total") else s.name
            ts = None if s.timestamp is None else round(float(s.timestamp) * 1000)
            theirs.append((name, dict(s.labels), float(s.value), ts))
    page = parse_page(text.encode())
    ours = [(s.name, dict(s.labels), s.value, s.timestamp_ms) for s in page.samples]
    assert page.dropped == []
    assert len(ours) == len(theirs)
    for mine, other in zip(ours, theirs, strict=True):
        assert mine[:2] == other[:2] and mine[3] == other[3] and _same(mine[2], other[2])


@settings(max_examples=200, deadline=None)
@given(pages(), st.lists(st.text(max_size=30), max_size=5), st.randoms(use_true_random=False))
@pytest.mark.slow
def test_garbage_mixed_into_a_page_never_costs_a_well_formed_line(text, garbage, rnd):
    lines = text.splitlines()
    for junk in garbage:
        lines.insert(rnd.randint(0, len(lines)), junk.replace("\n", " ").replace("\r", " "))
    mixed = "\n".join(lines) + "\n"
    assert_agrees_line_by_line(mixed)
