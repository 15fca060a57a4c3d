"""Prometheus text 0.0.4 / OpenMetrics text → samples, leniently and fast.

    lines.py     the line loop (`PageParser`): the definition of the result, and the page's template
    template.py  the fast path: a page that follows the previous page's `PageTemplate` is a
                 `TemplatedPage` (the shared template plus a tuple of values); both immutable
    family.py    the family of a sample (`family_of`), the one rule every consumer uses
"""

from bridge.parse.family import FAMILY_SUFFIXES, Family, family_of, family_type
from bridge.parse.lines import LabelError, PageParser, parse_labels, parse_page
from bridge.parse.template import AnyPage, PageTemplate, TemplatedPage

__all__ = [
    "AnyPage",
    "FAMILY_SUFFIXES",
    "Family",
    "LabelError",
    "PageParser",
    "PageTemplate",
    "TemplatedPage",
    "family_of",
    "family_type",
    "parse_labels",
    "parse_page",
]
