"""A templated page and its template are immutable: plans downstream are keyed on the template's identity."""

from __future__ import annotations

import pytest

from bridge.parse import PageParser, PageTemplate, TemplatedPage
from bridge.samples import Dropped

PAGE = b'# TYPE g gauge\ng{gpu="0"} 1\ng{gpu="1"} 2\n'


def test_a_templated_page_and_its_template_cannot_be_changed() -> None:
    parser = PageParser()
    parser.parse(PAGE)
    page = parser.parse(PAGE.replace(b"} 2", b"} 3"))
    assert isinstance(page, TemplatedPage) and isinstance(page.template, PageTemplate)
    assert page.values == (1.0, 3.0)
    with pytest.raises(AttributeError):
        page.values = (0.0, 0.0)
    with pytest.raises(AttributeError):
        page.template.names = ("h", "h")
    with pytest.raises(TypeError):
        page.template.types["g"] = "counter"  # type: ignore[index]
    page.dropped.append(Dropped(1, "x", "a reader's own note"))
    assert parser.parse(PAGE).dropped == []  # a page's list is its own


def test_a_templates_prefixes_cut_from_its_bytes_are_each_sample_lines_text_before_its_value() -> None:
    """The template keeps its page's bytes once (`flat`); each sample line's text before its value, which the text
    path compares (`values_of`), is cut from them: the same as read from the lines, on every published page here."""
    from pathlib import Path

    pages = sorted(Path(__file__).parent.joinpath("data").glob("*.txt")) + sorted(
        Path(__file__).parent.joinpath("data").glob("*.prom"))
    checked = 0
    for path in pages:
        body = path.read_bytes()
        parser = PageParser()
        first = parser.parse(body)
        page = parser.parse(body)
        if not isinstance(page, TemplatedPage):
            continue
        lines = body.decode().split("\n")
        expected = tuple(lines[at][: lines[at].rfind(repr_value(value, lines[at]))]
                         for at, value in zip(page.template.sample_at, page.values, strict=True))
        assert page.template.prefixes == expected, path.name
        assert page.template.values_of(lines) == page.values
        assert first.samples == page.samples
        checked += 1
    assert checked >= 5


def repr_value(value: float, line: str) -> str:
    """The value's text as it ends `line` (the token after the last space)."""
    return line.rsplit(" ", 1)[1] if " " in line else line
