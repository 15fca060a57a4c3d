"""The page template: the fast path of the parser, for a page whose structure repeats.

An exporter's page repeats its whole structure: the same lines in the same order, only the values
differ. After a page is read line by line (lines.py), its `PageTemplate` (every line but the values)
is kept; the next page is checked against it with C-level operations only (split, map startswith,
map float) and, when it matches, comes out as a `TemplatedPage`: the shared template plus a column of
values, ~4× cheaper than the line loop. Any difference (a new GPU, a timestamp, a bad value, a
changed HELP line) sends the page through the line loop, which is the definition of the result; the
fast path only ever reproduces it (tests/test_parse.py compares the two on every page they read).

Both are immutable: the normaliser and the OTLP encoder key their plans on the template's identity,
and a page's values do not change. With the compiled kernel (bridge/_kernel.c) the values come as one
buffer of native float64 (`TemplatedPage.raw`), which the kernel's later stages (the record lines, the OTLP
points) read as they are; the Python path's tuple of floats is made from it only when something asks.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import getitem
from types import MappingProxyType
from typing import Any, NoReturn

from bridge import kernel  # the compiled kernel (bridge/_kernel.c); the Python below is the reference
from bridge.samples import Dropped, ParsedPage, Sample

SAMPLE_BYTES = 120  # a Sample tuple, its float and its list slot (its name and labels are the template's)


class PageTemplate:
    """A page's structure: its lines but the sample values, the heads of its samples, its HELP/TYPE.

    Compared by identity downstream: the normaliser and the OTLP encoder compile a plan per template,
    so a page that matches the template costs them no per-sample lookups either.
    """

    __slots__ = ("nlines", "literal_at", "literals", "sample_at", "_prefixes", "names", "labels",
                 "types", "helps", "dropped", "openmetrics", "detected", "flat", "__weakref__")

    nlines: int
    literal_at: tuple[int, ...]
    literals: tuple[str, ...]
    sample_at: tuple[int, ...]
    _prefixes: tuple[str, ...] | None  # with `flat`: None until the text path first reads them (`prefixes`)
    names: tuple[str, ...]
    labels: tuple[Mapping[str, str], ...]
    types: Mapping[str, str]
    helps: Mapping[str, str]
    dropped: tuple[Dropped, ...]
    openmetrics: bool  # how its page was read
    detected: bool  # whether its page had a `# EOF` line (what auto-detection finds)
    flat: tuple[bytes, bytes] | None  # `segments` as the kernel reads them: one text, their lengths (int32)

    def __init__(self, lines: list[str], sample_at: Sequence[int], prefixes: Sequence[str], names: Sequence[str],
                 labels: Sequence[Mapping[str, str]], types: Mapping[str, str], helps: Mapping[str, str],
                 dropped: Sequence[Dropped], openmetrics: bool, detected: bool) -> None:
        samples = set(sample_at)
        literal_at = tuple(i for i in range(len(lines)) if i not in samples)
        fields: dict[str, Any] = {
            "nlines": len(lines), "literal_at": literal_at, "literals": tuple(lines[i] for i in literal_at),
            "sample_at": tuple(sample_at), "names": tuple(names),
            "labels": tuple(labels), "types": MappingProxyType(dict(types)), "helps": MappingProxyType(dict(helps)),
            "dropped": tuple(dropped), "openmetrics": openmetrics, "detected": detected,
        }
        segments = _segments(lines, sample_at, prefixes)  # kept once, joined (`flat`): one copy of the page a template
        fields["flat"] = None if segments is None else (b"".join(segments), pack_ints(map(len, segments)))
        # Each sample line's text before its value ends each segment: kept twice it was ~5 MiB at 64 endpoints.
        fields["_prefixes"] = tuple(prefixes) if segments is None else None
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"a PageTemplate is immutable (setting {name!r})")

    __delattr__ = __setattr__  # type: ignore[assignment]

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Each sample line's text before its value (what `values_of` reads). When the template has `flat` they are
        cut from it (the end of each segment after its last newline) the first time the text path reads them, and
        kept from then on: only a page the byte path cannot take (text, \\r\\n) does, and then at every scrape."""
        if self._prefixes is None:
            segments = self.segments
            assert segments is not None
            object.__setattr__(self, "_prefixes",
                               tuple(segment.rpartition(b"\n")[2].decode() for segment in segments[:-1]))
        assert self._prefixes is not None
        return self._prefixes

    @property
    def segments(self) -> tuple[bytes, ...] | None:
        """The page's bytes between its values, cut from `flat` (what the Python path reads)."""
        if self.flat is None:
            return None
        text, lengths = self.flat
        out, at = [], 0
        for length in array("i", lengths):
            out.append(text[at: at + length])
            at += length
        return tuple(out)

    def page_of_bytes(self, body: bytes) -> TemplatedPage | None:
        """`values_of` on the raw bytes, without decoding or splitting the page: the bytes between the
        values must be the template's, and each value runs to the end of its line. Touching the page
        once instead of three times matters more than the instruction count (caches are cold between
        scrapes). The kernel gives the values as native float64 bytes (`TemplatedPage.raw`), not as 320 float
        objects that every later stage would chase through memory."""
        flat = self.flat
        if flat is None:
            return None
        if kernel.running():
            raw: bytes | None = kernel.values_of_bytes(flat[0], flat[1], body)
            return None if raw is None else TemplatedPage(self, raw=raw)
        values = self.values_of_bytes_python(body)
        return None if values is None else TemplatedPage(self, values)

    def values_of_bytes_python(self, body: bytes) -> tuple[float, ...] | None:
        """`page_of_bytes`'s values in Python: the reference the compiled kernel is tested against."""
        segments = self.segments
        if segments is None:
            return None
        tokens: list[bytes] = []
        append = tokens.append
        starts, find = body.startswith, body.find
        position = 0
        last = len(segments) - 1
        for index, segment in enumerate(segments):
            if not starts(segment, position):
                return None
            position += len(segment)
            if index == last:
                break
            end = find(b"\n", position)
            if end < 0:
                return None
            append(body[position:end])
            position = end
        if position != len(body) or b"_" in b"".join(tokens):
            return None
        try:
            return tuple(map(float, tokens))
        except ValueError:
            return None

    def values_of(self, lines: list[str]) -> tuple[float, ...] | None:
        """The values of a page whose lines follow this template, or None when they do not."""
        if len(lines) != self.nlines or tuple(map(lines.__getitem__, self.literal_at)) != self.literals:
            return None
        sample_lines = list(map(lines.__getitem__, self.sample_at))
        prefixes = self.prefixes
        if not all(map(str.startswith, sample_lines, prefixes)):
            return None
        cuts = (slice(len(prefix), None) for prefix in prefixes)  # (rare: a text page, or one with \r\n)
        tokens: list[str] = list(map(getitem, sample_lines, cuts))
        if "_" in "".join(tokens):  # float() reads "1_000"; the exposition format does not
            return None
        try:
            return tuple(map(float, tokens))  # a timestamp or an exemplar after the value fails here
        except ValueError:
            return None


def _segments(lines: list[str], sample_at: Sequence[int], prefixes: Sequence[str]) -> tuple[bytes, ...] | None:
    """The page's bytes between its values: the text from each value's line end to the next value."""
    try:
        encoded = [line.encode() for line in lines]
    except UnicodeEncodeError:
        return None
    starts = [0]
    for line in encoded:
        starts.append(starts[-1] + len(line) + 1)
    page = b"\n".join(encoded)
    segments: list[bytes] = []
    cursor = 0
    for at, prefix in zip(sample_at, prefixes, strict=True):
        value_start = starts[at] + len(prefix.encode())
        segments.append(page[cursor:value_start])
        cursor = starts[at + 1] - 1  # the value runs to its line's end; the next segment starts at "\n"
    segments.append(page[cursor:])
    return tuple(segments)


def pack_ints(numbers: Iterable[int]) -> bytes:
    """Numbers as the kernel reads a plan's (lengths, offsets, positions): native int32."""
    return array("i", numbers).tobytes()


@dataclass(slots=True, init=False, eq=False)
class TemplatedPage:
    """A parsed page that follows a PageTemplate: the template plus one value per sample line. Immutable; reads
    as a ParsedPage does (`samples`, `types`, `helps`, `dropped`), so the stages take either (`AnyPage`).

    The values are held as the kernel gives them, `raw` (native float64 bytes, what the kernel's later stages
    read), or as the Python path gives them, `values` (a tuple); each is made from the other on first use.
    `samples` is built on first use too (the pull endpoint, listeners, the slow paths): the sidecar's own
    stages read `template` and the values and never need 320 Sample tuples per scrape. Those three are caches
    of pure functions of the page (`_remember`): filling one changes nothing a reader can see. Not
    `frozen=True`: CPython 3.11's frozen `__setattr__` on a slots dataclass fails with a TypeError for a name
    that is not a field (`page.values = ...`); this one refuses every name with an AttributeError.
    """

    template: PageTemplate
    _values: tuple[float, ...] | None
    _raw: bytes | None
    _samples: list[Sample] | None

    def __init__(self, template: PageTemplate, values: tuple[float, ...] | None = None, *,
                 raw: bytes | None = None, samples: list[Sample] | None = None) -> None:
        if (values is None) == (raw is None):
            raise TypeError("a TemplatedPage takes its values or its raw values")
        setattr_ = object.__setattr__  # (this class refuses its own __setattr__: it is immutable)
        setattr_(self, "template", template)
        setattr_(self, "_values", values)
        setattr_(self, "_raw", raw)
        setattr_(self, "_samples", samples)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"a TemplatedPage is immutable (setting {name!r})")

    __delattr__ = __setattr__  # type: ignore[assignment]

    def _remember(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # a cache (see the class docstring), not a change

    @property
    def types(self) -> Mapping[str, str]:
        return self.template.types

    @property
    def helps(self) -> Mapping[str, str]:
        return self.template.helps

    @property
    def dropped(self) -> list[Dropped]:
        """The template's dropped lines, as a list of the reader's own (a ParsedPage's type)."""
        return list(self.template.dropped)

    @property
    def values(self) -> tuple[float, ...]:
        values = self._values
        if values is None:
            assert self._raw is not None
            values = tuple(memoryview(self._raw).cast("d"))
            self._remember("_values", values)
        return values

    @property
    def raw(self) -> bytes:
        raw = self._raw
        if raw is None:
            raw = array("d", self.values).tobytes()
            self._remember("_raw", raw)
        return raw

    @property
    def value_count(self) -> int:
        """How many values (sample lines) the page has."""
        raw = self._raw
        return len(self.values) if raw is None else len(raw) >> 3

    @property
    def held_bytes(self) -> int:
        """About what the page holds of its own (its template is shared): its values in whichever forms are
        filled (8 bytes each as the kernel gives them, 32 as Python floats in a tuple), its samples once built."""
        count = self.value_count
        held = 0 if self._raw is None else len(self._raw)
        if self._values is not None:
            held += 32 * count
        if self._samples is not None:
            held += SAMPLE_BYTES * count
        return held

    def value_getter(self) -> Callable[[int], float]:
        """values[i] from whichever form the page holds (a few values: no tuple of all of them built)."""
        raw = self._raw
        return self.values.__getitem__ if raw is None else memoryview(raw).cast("d").__getitem__

    @property
    def samples(self) -> list[Sample]:
        samples = self._samples
        if samples is None:
            t = self.template
            samples = list(map(tuple.__new__, repeat(Sample), zip(t.names, t.labels, self.values, repeat(None))))
            self._remember("_samples", samples)
        return samples


AnyPage = ParsedPage | TemplatedPage
"""What the parser gives: a page read line by line, or one that followed the previous page's template."""
