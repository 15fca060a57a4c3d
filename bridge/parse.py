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
    """Parses pages; keeps the label cache (and so the mapping objects) across pages.

    One parser per endpoint: its cache holds that exporter's label sets. `max_cached` bounds it
    against an exporter whose labels never repeat (pod churn); past it the cache starts over.
    """

    def __init__(self, max_cached: int = 50_000) -> None:
        self._labels: dict[str, Mapping[str, str] | str] = {}
        self._names: set[str] = set()
        self.max_cached = max_cached

    def parse(self, body: bytes | str, *, openmetrics: bool | None = None) -> ParsedPage:
        text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
        if openmetrics is None:
            openmetrics = text.startswith("# EOF") or "\n# EOF" in text
        if len(self._labels) > self.max_cached:
            self._labels.clear()
        samples: list[Sample] = []
        types: dict[str, str] = {}
        helps: dict[str, str] = {}
        dropped: list[Dropped] = []
        labels_cache = self._labels
        names = self._names
        append = samples.append
        for number, raw in enumerate(text.split("\n"), 1):
            line = raw.strip()
            if not line:
                continue
            if line[0] == "#":
                if openmetrics and line == "# EOF":
                    break
                _comment(line, number, types, helps, dropped)
                continue
            brace = line.find("{")
            if brace >= 0:
                name = line[:brace].rstrip()
                close = line.rfind("}")
                if close < brace:
                    dropped.append(_drop(number, line, "no closing '}' in the label set"))
                    continue
                raw_labels = line[brace + 1 : close]
                labels = labels_cache.get(raw_labels)
                if labels is None:
                    labels = _labels_or_reason(raw_labels)
                    labels_cache[raw_labels] = labels
                if isinstance(labels, str):
                    dropped.append(_drop(number, line, labels))
                    continue
                rest = line[close + 1 :].split()
            else:
                parts = line.split()
                name, rest, labels = parts[0], parts[1:], _EMPTY
            if name not in names:
                if not _NAME.fullmatch(name):
                    dropped.append(_drop(number, line, f"invalid metric name {name[:60]!r}"))
                    continue
                names.add(name)
            if openmetrics and len(rest) > 2 and rest[2] == "#":
                rest = rest[:2]  # an OpenMetrics exemplar follows " # "
            if not rest or len(rest) > 2:
                reason = "no value" if not rest else "unexpected text after the timestamp"
                dropped.append(_drop(number, line, reason))
                continue
            try:
                value = _number(rest[0])
                timestamp = None if len(rest) == 1 else _timestamp_ms(rest[1], openmetrics)
            except ValueError as exc:
                dropped.append(_drop(number, line, str(exc)))
                continue
            append(Sample(name, labels, value, timestamp))
        return ParsedPage(samples, types, helps, dropped)


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


def _comment(line: str, number: int, types: dict[str, str], helps: dict[str, str],
             dropped: list[Dropped]) -> None:
    parts = line.split(None, 3)
    if len(parts) < 3 or parts[0] != "#" or parts[1] not in ("TYPE", "HELP"):
        return  # a plain comment (or # UNIT, which dcgm-exporter never writes)
    name = parts[2]
    if not _NAME.fullmatch(name):
        dropped.append(_drop(number, line, f"invalid metric name {name[:60]!r} in {parts[1]}"))
        return
    if parts[1] == "HELP":
        text = parts[3] if len(parts) == 4 else ""
        helps[name] = _HELP_ESCAPE.sub(_unescape, text) if "\\" in text else text
    elif len(parts) < 4:
        dropped.append(_drop(number, line, "TYPE without a type"))
    else:
        types[name] = parts[3].strip()


def _drop(number: int, line: str, reason: str) -> Dropped:
    return Dropped(number, line[:_MAX_TEXT], reason)
