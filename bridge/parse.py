"""Prometheus text 0.0.4 / OpenMetrics text → samples, leniently and fast.

A bad line is dropped and counted with its line number and reason; it never costs the rest of the
page (AIPerf loses the whole scrape, aiperf-compat.md §13.2). Samples come out exactly as written:
no `_total` renaming (prometheus_client renames counter samples), values as float, DCGM's blank
sentinels still present (the normaliser decides what they mean).

Speed: a dcgm-exporter page repeats the same label sets scrape after scrape, so each distinct raw
label string is parsed once and its read-only mapping cached (performance.md: the biggest single
win). The per-line fast path is str.find / rfind / split plus one dict lookup.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from bridge.samples import Dropped, ParsedPage, Sample

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)', re.DOTALL)
_ESCAPE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_HELP_ESCAPE = re.compile(r"\\[\\n]")
_EMPTY: Mapping[str, str] = MappingProxyType({})
_MAX_TEXT = 200  # characters of a dropped line kept for the report
_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created", "_info")


class LabelError(ValueError):
    pass


class PageParser:
    """Parses pages; keeps its caches (and so the label mapping objects) across pages.

    One parser per endpoint: its caches hold that exporter's series heads (`name{labels}`), label
    sets and HELP/TYPE lines, which repeat scrape after scrape. `max_cached` bounds them against an
    exporter whose labels never repeat (pod churn); past it they start over.
    """

    def __init__(self, max_cached: int = 50_000) -> None:
        self._labels: dict[str, Mapping[str, str] | str] = {}
        self._heads: dict[str, tuple[str, Mapping[str, str]] | str] = {}
        self._comments: dict[str, tuple[str, str, str] | str | None] = {}
        self.max_cached = max_cached

    def parse(self, body: bytes | str, *, openmetrics: bool | None = None) -> ParsedPage:
        text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
        if openmetrics is None:
            openmetrics = text.startswith("# EOF") or "\n# EOF" in text
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        if len(self._heads) > self.max_cached or len(self._labels) > self.max_cached:
            self._heads.clear()
            self._labels.clear()
            self._comments.clear()
        samples: list[Sample] = []
        types: dict[str, str] = {}
        helps: dict[str, str] = {}
        dropped: list[Dropped] = []
        heads = self._heads
        append = samples.append
        for number, line in enumerate(text.split("\n"), 1):
            if not line:
                continue
            if line[0] in " \t" or line[-1] in " \t\r":
                line = line.strip()
                if not line:
                    continue
            if line[0] == "#":
                if openmetrics and line == "# EOF":
                    break
                self._comment(line, number, types, helps, dropped)
                continue
            close = line.rfind("}")
            if close >= 0:
                key, rest = line[: close + 1], line[close + 1 :]
            else:
                key, _, rest = line.partition(" ")
                if "\t" in key:
                    key, _, tail = key.partition("\t")
                    rest = f"{tail} {rest}"
            head = heads.get(key)
            if head is None:
                head = heads[key] = self._head(key)
            if isinstance(head, str):
                dropped.append(_drop(number, line, head))
                continue
            name, labels = head
            tokens = rest.split()
            if len(tokens) == 1 and "_" not in tokens[0]:
                try:
                    append(Sample(name, labels, float(tokens[0]), None))
                    continue
                except ValueError:
                    pass
            if openmetrics and len(tokens) > 2 and tokens[2] == "#":
                tokens = tokens[:2]  # an OpenMetrics exemplar follows " # "
            if not tokens or len(tokens) > 2:
                reason = "no value" if not tokens else "unexpected text after the timestamp"
                dropped.append(_drop(number, line, reason))
                continue
            try:
                value = _number(tokens[0])
                timestamp = None if len(tokens) == 1 else _timestamp_ms(tokens[1], openmetrics)
            except ValueError as exc:
                dropped.append(_drop(number, line, str(exc)))
                continue
            append(Sample(name, labels, value, timestamp))
        return ParsedPage(samples, types, helps, dropped)

    def _head(self, key: str) -> tuple[str, Mapping[str, str]] | str:
        """`name{labels}` (or a bare name) → (name, read-only labels), or the reason it is bad."""
        brace = key.find("{")
        if brace < 0:
            name, labels = key, _EMPTY
        else:
            name = key[:brace].rstrip()
            if not key.endswith("}"):
                return "no closing '}' in the label set"
            raw = key[brace + 1 : -1]
            cached = self._labels.get(raw)
            if cached is None:
                cached = self._labels[raw] = _labels_or_reason(raw)
            if isinstance(cached, str):
                return cached
            labels = cached
        if not _NAME.fullmatch(name):
            return f"invalid metric name {name[:60]!r}"
        return name, labels

    def _comment(self, line: str, number: int, types: dict[str, str], helps: dict[str, str],
                 dropped: list[Dropped]) -> None:
        if line in self._comments:
            entry = self._comments[line]
        else:
            entry = self._comments[line] = _read_comment(line)
        if entry is None:
            return
        if isinstance(entry, str):
            dropped.append(_drop(number, line, entry))
            return
        kind, name, text = entry
        (helps if kind == "HELP" else types)[name] = text


def parse_page(body: bytes | str, *, openmetrics: bool | None = None) -> ParsedPage:
    """Parse one page with a fresh cache (tools and tests; the scrape loop keeps a PageParser)."""
    return PageParser().parse(body, openmetrics=openmetrics)


def family_type(types: Mapping[str, str], sample_name: str) -> str:
    """The TYPE that governs a sample: its own name's, else its family's (`x_total` → `x`)."""
    found = types.get(sample_name)
    if found is not None:
        return found
    for suffix in _SUFFIXES:
        if sample_name.endswith(suffix):
            found = types.get(sample_name[: -len(suffix)])
            if found is not None:
                return found
    return "untyped"


def _number(token: str) -> float:
    # Python's float() accepts "1_000"; the exposition format does not (nor does prometheus_client).
    if "_" in token:
        raise ValueError(f"invalid value {token[:40]!r}")
    try:
        return float(token)
    except ValueError:
        raise ValueError(f"invalid value {token[:40]!r}") from None


def _timestamp_ms(token: str, openmetrics: bool) -> int:
    try:
        stamp = _number(token)
    except ValueError:
        raise ValueError(f"invalid timestamp {token[:40]!r}") from None
    if stamp != stamp or stamp in (float("inf"), float("-inf")):
        raise ValueError(f"invalid timestamp {token[:40]!r}")
    # Prometheus text carries milliseconds; OpenMetrics carries seconds.
    return int(stamp * 1000) if openmetrics else int(stamp)


def _labels_or_reason(raw: str) -> Mapping[str, str] | str:
    try:
        return MappingProxyType(parse_labels(raw))
    except LabelError as exc:
        return f"invalid labels: {exc}"


def parse_labels(raw: str) -> dict[str, str]:
    """`gpu="0", UUID="GPU-…"` → dict. A space after commas and a trailing comma are accepted;
    an unescaped `"` inside a value (dcgm-exporter does not escape pod labels) is an error."""
    labels: dict[str, str] = {}
    position, end = 0, len(raw)
    while position < end:
        if raw[position:].strip() == "":
            break
        match = _LABEL.match(raw, position)
        if match is None:
            raise LabelError(f"cannot read a name=\"value\" pair at {raw[position:position + 40]!r}")
        name, value = match.group(1), match.group(2)
        if name in labels:
            raise LabelError(f"duplicate label {name!r}")
        labels[name] = _ESCAPE.sub(_unescape, value) if "\\" in value else value
        position = match.end()
    return labels


def _unescape(match: re.Match[str]) -> str:
    return _ESCAPES[match.group(0)]


def _read_comment(line: str) -> tuple[str, str, str] | str | None:
    """A HELP/TYPE line → (kind, name, text); a bad one → its reason; any other comment → None."""
    parts = line.split(None, 3)
    if len(parts) < 3 or parts[0] != "#" or parts[1] not in ("TYPE", "HELP"):
        return None  # a plain comment (or # UNIT, which dcgm-exporter never writes)
    name = parts[2]
    if not _NAME.fullmatch(name):
        return f"invalid metric name {name[:60]!r} in {parts[1]}"
    if parts[1] == "HELP":
        text = parts[3] if len(parts) == 4 else ""
        return "HELP", name, _HELP_ESCAPE.sub(_unescape, text) if "\\" in text else text
    if len(parts) < 4:
        return "TYPE without a type"
    return "TYPE", name, parts[3].strip()


def _drop(number: int, line: str, reason: str) -> Dropped:
    return Dropped(number, line[:_MAX_TEXT], reason)
