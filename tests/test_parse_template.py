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
