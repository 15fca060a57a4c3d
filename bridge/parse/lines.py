"""The line loop: Prometheus text 0.0.4 / OpenMetrics text → samples, leniently, and the page's template.

A bad line is dropped and counted with its line number and reason; it never costs the rest of the
page (AIPerf loses the whole scrape: `_parse_metrics_to_records` in
ai-dynamo/aiperf `src/aiperf/gpu_telemetry/dcgm_collector.py`). Samples come out exactly as written:
no `_total` renaming (prometheus_client renames counter samples), values as float, DCGM's blank
sentinels still present (the normaliser decides what they mean).

Speed: a dcgm-exporter page repeats the same label sets scrape after scrape, so each distinct raw
label string is parsed once and its read-only mapping cached (bench/bench_parse.py: the biggest single
win). The per-line fast path is str.find / rfind / split plus one dict lookup. A page read cleanly
leaves its `PageTemplate` (template.py); `PageParser.parse` checks the next page against it first.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from bridge.parse.template import AnyPage, PageTemplate, TemplatedPage
from bridge.samples import Dropped, ParsedPage, Sample

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)', re.DOTALL)
_ESCAPE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_HELP_ESCAPE = re.compile(r"\\[\\n]")
_EMPTY: Mapping[str, str] = MappingProxyType({})
_MAX_TEXT = 200  # characters of a dropped line kept for the report
# A series' `name{labels}` longer than this is dropped, never cached: dcgm-exporter's are ~300 characters
# (pod and container names are at most 253), and a hostile page of 40 kB label values would otherwise keep
# every one of them in the caches.
MAX_SERIES_KEY = 4096
MAX_SERIES = 20_000  # samples read from one page; the rest are dropped and counted (DCGM_BRIDGE_MAX_SERIES)


class LabelError(ValueError):
    pass


class PageParser:
    """Parses pages; keeps its caches (and so the label mapping objects) across pages.

    One parser per endpoint: its caches hold that exporter's series heads (`name{labels}`), label
    sets and HELP/TYPE lines, which repeat scrape after scrape. `max_cached` bounds them against an
    exporter whose labels never repeat (pod churn); past it they start over.
    """

    def __init__(self, max_cached: int = 50_000, max_series: int = MAX_SERIES) -> None:
        self._labels: dict[str, Mapping[str, str] | str] = {}
        self._heads: dict[str, tuple[str, Mapping[str, str]] | str] = {}
        self._comments: dict[str, tuple[str, str, str] | str | None] = {}
        self._template: PageTemplate | None = None
        self._misses = 0  # pages in a row that did not follow the template
        self.max_cached = max_cached
        self.max_series = max_series
        self.use_templates = True  # False: every page through the line loop (tests compare the two)

    def parse(self, body: bytes | str, *, openmetrics: bool | None = None) -> AnyPage:
        # No copy of the previous body is kept to spot a page that did not change (dcgm-exporter's 30 s default):
        # the template holds the page's text once already, and a page that follows it costs ~8 µs to read, so
        # a second copy (80 KB an endpoint, 5 MiB at 64) bought ~4 µs a scrape (issue 48).
        return self._parse(body, openmetrics)

    def _parse(self, body: bytes | str, openmetrics: bool | None) -> AnyPage:
        template = self._template
        walked = False
        if template is not None and isinstance(body, bytes) and b"\r" not in body \
                and template.openmetrics == (template.detected if openmetrics is None else openmetrics):
            walked = True
            page = template.page_of_bytes(body)
            if page is not None:
                self._misses = 0
                return page
        text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
        detected = None
        if openmetrics is None:
            detected = text.startswith("# EOF") or "\n# EOF" in text
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        lines = text.split("\n")
        # A page whose lines match the template has its `# EOF` lines, so auto-detection needs no search.
        if template is not None and not walked \
                and template.openmetrics == (template.detected if openmetrics is None else openmetrics):
            values = template.values_of(lines)
            if values is not None:
                self._misses = 0
                return TemplatedPage(template, values)
        if detected is None:
            detected = text.startswith("# EOF") or "\n# EOF" in text
        # An exporter whose structure changes at every scrape would pay for a template it never uses:
        # after three misses in a row, one is built every 20 pages only.
        build = self._misses < 3 or self._misses % 20 == 0
        self._misses += 1
        return self._parse_lines(lines, detected if openmetrics is None else openmetrics, detected, build)

    def _parse_lines(self, all_lines: list[str], openmetrics: bool, detected: bool, build: bool = True) -> AnyPage:
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
        # What a template needs: where each sample line is and its text up to the value.
        sample_at: list[int] = []
        prefixes: list[str] = []
        repeatable = self.use_templates and build
        over, first_over = 0, 0  # samples past `max_series`
        for number, line in enumerate(all_lines, 1):
            if not line:
                continue
            raw = line
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
            if len(key) > MAX_SERIES_KEY:
                dropped.append(_drop(number, line, f"name and labels longer than {MAX_SERIES_KEY} characters"))
                repeatable = False  # (a template would keep the whole page's text)
                continue
            if len(samples) >= self.max_series:
                over, first_over = over + 1, first_over or number
                continue
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
                except ValueError:
                    pass
                else:
                    if repeatable:
                        sample_at.append(number - 1)
                        prefixes.append(raw[: raw.rfind(tokens[0])])
                    continue
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
            repeatable = False  # timestamps and exemplars: this page has no template
            append(Sample(name, labels, value, timestamp))
        if over:
            dropped.append(Dropped(first_over, "", f"{over} samples past the limit of {self.max_series} per page "
                                                   "(DCGM_BRIDGE_MAX_SERIES) were not read"))
            repeatable = False  # a page cut short is no template for the next
        if not repeatable:
            self._template = None
            return ParsedPage(samples, types, helps, dropped)
        template = PageTemplate(all_lines, sample_at, prefixes, [s.name for s in samples],
                                [s.labels for s in samples], types, helps, dropped, openmetrics, detected)
        self._template = template
        # The template holds every head now: the keys (a copy of the page's text) go until a page misses it. The
        # label cache stays, so a page read again line by line hands out the same label mappings.
        self._heads.clear()
        return TemplatedPage(template, tuple(s.value for s in samples), samples=samples)

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


def parse_page(body: bytes | str, *, openmetrics: bool | None = None) -> AnyPage:
    """Parse one page with a fresh cache (tools and tests; the scrape loop keeps a PageParser)."""
    return PageParser().parse(body, openmetrics=openmetrics)


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
