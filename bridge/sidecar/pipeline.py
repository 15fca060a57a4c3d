"""The per-page pipeline: a source's page → parse → normalise → select → every sink, one page at a time.

    SourcePage ─▶ parse ─▶ normalise ─▶ select (select.py) ─▶ Page ─┬─▶ RecordLogSink   (JSONL line per record)
                                                                    ├─▶ LiveSeriesSink  (the report's spool)
                                                                    ├─▶ LatestRecords   (the live view)
                                                                    ├─▶ PullPageSink    (pull /metrics page) ┐ gpu-pods:
                                                                    ├─▶ OtlpSink        (forwarder queue)    ┘ selected
                                                                    └─▶ ListenerSink    (in-process callbacks)

Sources (bridge/samples.py `SourcePage`): the scrape loop's HTTP exporters and local readers, each on a scrape
thread, calling `Pipeline.on_page(source, page)`; pages enter one at a time whichever thread hands them over.
Each sink takes one page at a time (`PageSink.take`). The pipeline also feeds each endpoint's health
(bridge/health.py: up, unreadable, down) and writes what a page or a failure says about its endpoint to the
events file: unreadable lines (`parse` errors), failed scrapes, endpoint down and up, a source found a duplicate.
With `--gpu-pods`, what leaves the sidecar live goes through `PodSelected` (pod_sinks.py, with the sinks that
keep what the report needs of pods): the pull page and OTLP carry the selected GPUs only, OTLP with the pod as
attributes; the record log, the spool and the live view keep every GPU. `Session` (session.py) keeps the state
machine and builds one `Pipeline`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from bridge.endpoints import display_key
from bridge.events import EndpointState
from bridge.fetch import FetchError
from bridge.health import Health
from bridge.normalize import DUPLICATE_SERIES_MESSAGE, CompiledRecords, Normalizer
from bridge.otlp.export import ExportStats
from bridge.otlp.semconv import with_pod_attributes
from bridge.parse import AnyPage, PageParser, TemplatedPage
from bridge.parse.lines import MAX_SERIES
from bridge.recognize import no_gpu_reason
from bridge.record_log import LineWriter
from bridge.redact import redact_url
from bridge.samples import GpuRecord, ScrapeFailure, SourcePage
from bridge.select import Deduplicator, describe, duplicate_reason
from bridge.sidecar.spool import LiveSeries

logger = logging.getLogger(__name__)

PageListener = Callable[[str, AnyPage, int, str | None], None]
"""(url, parsed page, scrape start ns, phase or None): called on the scrape thread for every page."""
DuplicateHandler = Callable[[str], None]
"""(url): the endpoint was found a duplicate of another (bridge/select.py): stop scraping it."""

Identity = tuple[str, str | None]
DROPPED_NOTE_INTERVAL_NS = 60 * 1_000_000_000
MAX_GPUS = 1024  # GPU identities per endpoint and run (DCGM_BRIDGE_MAX_GPUS)


class Page:
    """One scraped page, parsed and normalised: what every sink receives.

    `compiled` is the kernel's work on a templated page (its record lines and rows, bridge/normalize.py
    `CompiledRecords`): the record log and the live series take those, and `records` is built from them only
    when a sink asks (the live view's first sight of a GPU, listeners). Without it, `records` is given."""

    __slots__ = ("url", "endpoint", "display", "parsed", "compiled", "phase", "start_ns", "end_ns", "_records")

    def __init__(self, url: str, endpoint: str, display: str, parsed: AnyPage,
                 records: Sequence[GpuRecord] | CompiledRecords, phase: str | None, start_ns: int,
                 end_ns: int) -> None:
        self.url = url  # as configured (may hold credentials: never logged)
        self.endpoint = endpoint  # the redacted URL
        self.display = display  # host:port, the report's and OTLP's endpoint key
        self.parsed = parsed
        self.compiled: CompiledRecords | None = None
        self._records: Sequence[GpuRecord] | None = None
        if isinstance(records, CompiledRecords):
            self.compiled = records
        else:
            self._records = records
        self.phase = phase
        self.start_ns = start_ns
        self.end_ns = end_ns

    def with_parsed(self, parsed: AnyPage) -> Page:
        """The same scrape with other samples (the pod selection's): for the sinks that read `parsed` only."""
        return Page(self.url, self.endpoint, self.display, parsed, self.records if self.compiled is None else
                    self.compiled, self.phase, self.start_ns, self.end_ns)

    @property
    def records(self) -> Sequence[GpuRecord]:
        records = self._records
        if records is None:
            assert self.compiled is not None
            records = self._records = self.compiled.records()
        return records

    @property
    def record_count(self) -> int:
        return len(self.compiled.entries) if self.compiled is not None else len(self.records)

    @property
    def readable(self) -> bool:
        """At least one sample could be read (an HTML page or garbage answered 200 has none)."""
        parsed = self.parsed
        return bool(parsed.value_count if isinstance(parsed, TemplatedPage) else parsed.samples)


class PageSink(Protocol):
    """One destination of scraped pages: `take` receives each page."""

    def take(self, page: Page) -> None: ...


class Forwarder(Protocol):
    """What the pipeline and the session use of `bridge.otlp.OtlpForwarder`."""

    def submit(self, endpoint: str, page: AnyPage, *, run_id: str, phase: str, ts_ns: int) -> None: ...
    def mark_stale(self, endpoint: str, *, run_id: str, phase: str, ts_ns: int) -> None: ...
    def stats(self) -> ExportStats: ...
    def close(self, timeout_s: float = 5.0) -> ExportStats: ...


class RecordLogSink:
    """gpu_telemetry_export.jsonl: one line per record."""

    def __init__(self, writer: LineWriter) -> None:
        self.writer = writer
        self.records_written = 0

    def take(self, page: Page) -> None:
        if page.compiled is not None:
            self.writer.write_block(page.compiled.lines, len(page.compiled.entries))
        else:
            self.writer.write_records(page.records)
        self.records_written += page.record_count


class LiveSeriesSink:
    """The report's input, kept as the records are written (sidecar/spool.py: no log re-read at the end)."""

    def __init__(self, spool: LiveSeries) -> None:
        self.spool = spool

    def take(self, page: Page) -> None:
        if page.compiled is not None:
            self.spool.add_compiled(page.compiled, page.display)
        else:
            self.spool.add(page.records, page.display)


def plan_of(page: Page | None) -> int | None:
    """The key of a page's kernel plan (pages of one plan have the same GPUs in the same places), None off the
    kernel path."""
    return page.compiled.plan if page is not None and page.compiled is not None else None


class LatestRecords:
    """(display key, identity) → (first, latest) record of every GPU: what the live view shows. The latest is
    kept as its page and place on it, built into a record when the view asks (`latest`). A page of the same plan
    as the endpoint's previous page (the same GPUs in the same places) only replaces that page; when the plan
    changes, that page's GPUs are pointed at it before the new page's are."""

    def __init__(self) -> None:
        self._first: dict[tuple[str, Identity], GpuRecord] = {}
        self._latest: dict[tuple[str, Identity], tuple[Page, int]] = {}
        self._current: dict[str, Page] = {}  # display key -> its latest page
        self._lock = threading.Lock()

    def take(self, page: Page) -> None:
        first, latest = self._first, self._latest
        plan = plan_of(page)
        with self._lock:
            previous = self._current.get(page.display)
            self._current[page.display] = page
            if plan is not None and plan_of(previous) == plan:
                return
            if previous is not None and previous.compiled is not None:
                for index, identity in enumerate(previous.compiled.identities()):
                    latest[(page.display, identity)] = (previous, index)
            identities = page.compiled.identities() if page.compiled is not None else \
                [r.identity for r in page.records]
            for index, identity in enumerate(identities):
                key = (page.display, identity)
                if key not in first:
                    first[key] = page.records[index]
                latest[key] = (page, index)

    @property
    def latest(self) -> dict[tuple[str, Identity], tuple[GpuRecord, GpuRecord]]:
        with self._lock:
            held = list(self._latest.items())
            current = dict(self._current)
            first = dict(self._first)
        out = {}
        for key, (page, index) in held:
            now = current[key[0]]
            if plan_of(now) is not None and plan_of(now) == plan_of(page):
                page = now  # a later page of the same plan: the same GPU at the same place
            out[key] = (first[key], page.records[index])
        return out


class PullPageSink:
    """The latest page of every endpoint, for the pull /metrics page (sidecar/pull.py renders it)."""

    def __init__(self) -> None:
        self.latest: dict[str, tuple[AnyPage, str | None, int]] = {}  # url -> (page, phase, scrape start)

    def take(self, page: Page) -> None:
        self.latest[page.url] = (page.parsed, page.phase, page.start_ns)


class OtlpSink:
    """Every sample to the OTLP forwarder's queue; staleness markers when an endpoint's series end."""

    def __init__(self, forwarder: Forwarder, run_id: str, *, pod_attributes: bool = False) -> None:
        """`pod_attributes`: each attributed series carries its pod as OTel's `k8s.*` attributes (otlp/semconv.py)."""
        self.forwarder = forwarder
        self.run_id = run_id
        self.pod_attributes = pod_attributes
        self.seen: set[str] = set()  # urls that sent at least one page

    def take(self, page: Page) -> None:
        self.seen.add(page.url)
        parsed = with_pod_attributes(page.parsed) if self.pod_attributes else page.parsed
        self.forwarder.submit(page.display, parsed, run_id=self.run_id, phase=page.phase or "none",
                              ts_ns=page.start_ns)

    def mark_stale(self, urls: Iterable[str], phase: str | None, ts_ns: int) -> None:
        """One staleness marker per series of these endpoints, so stores stop showing the last value."""
        for url in urls:
            if url in self.seen:
                self.forwarder.mark_stale(display_key(url), run_id=self.run_id, phase=phase or "none", ts_ns=ts_ns)


class ListenerSink:
    """In-process callbacks (tests, the Grafana simulation run)."""

    def __init__(self, listeners: Sequence[PageListener]) -> None:
        self.listeners = list(listeners)

    def take(self, page: Page) -> None:
        for listener in self.listeners:
            listener(page.url, page.parsed, page.start_ns, page.phase)


class _Notes:
    """What pages say about their endpoint, said at most once a minute per endpoint and kind, or at once when
    it says something new."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[str, int]] = {}  # (url, kind) -> (message, time) last said

    def due(self, url: str, kind: str, time_ns: int, message: str = "") -> bool:
        last = self._last.get((url, kind))
        if last is not None and last[0] == message and time_ns - last[1] < DROPPED_NOTE_INTERVAL_NS:
            return False
        self._last[(url, kind)] = (message, time_ns)
        return True


def content_key(parsed: AnyPage, body: bytes) -> object:
    """What the health's refresh watch knows a page's content by: a templated page by its template and values (the same
    text around the same values), so that no copy of the body outlives its scrape;
    any other page by its body."""
    if isinstance(parsed, TemplatedPage):
        return parsed.template, parsed.raw
    return body


class Pipeline:
    """Parse, normalise and hand each page to the sinks; note what pages and failures say about endpoints.

    Runs on the scrape thread. `phase` is read once per page (the session's current phase)."""

    def __init__(self, normalizer: Normalizer, sinks: Sequence[PageSink], events: LineWriter, *, run_id: str,
                 phase: Callable[[], str | None], otlp: OtlpSink | None = None,
                 max_series: int = MAX_SERIES, max_gpus: int = MAX_GPUS, health: Health | None = None,
                 preference: Sequence[str] = (), on_duplicate: DuplicateHandler | None = None) -> None:
        """`preference`: the sources in the order de-duplication prefers them (bridge/select.py
        `preference_order`); `on_duplicate` is told of each source found a duplicate."""
        self.normalizer = normalizer
        self.max_series = max_series
        self.sinks = list(sinks)
        self.events = events
        self.run_id = run_id
        self.phase = phase
        self.otlp = otlp
        self.health = health if health is not None else Health()
        self._parsers: dict[str, PageParser] = {}
        self._keys: dict[str, tuple[str, str]] = {}  # url -> (redacted, display key)
        self._notes = _Notes()
        self.max_gpus = max_gpus
        self._identities: dict[str, set[tuple[str, str | None]]] = {}  # url -> GPU identities seen (≤ max_gpus)
        self.over_gpu_limit: dict[str, int] = {}  # url -> records dropped past max_gpus
        self._plan_within: dict[str, int] = {}  # url -> the key of the plan last found within the limit
        self.dedup = Deduplicator(preference)
        self.on_duplicate = on_duplicate
        self._lock = threading.Lock()  # sources on threads of their own hand pages over too (`on_page`)

    def on_page(self, url: str, fetched: SourcePage) -> Page:
        """The page callback of every source (the scrape loop's, a local reader's): one page through the whole
        pipeline, one page at a time whichever thread hands it over. A duplicate source's page goes nowhere."""
        with self._lock:
            page = self.read(url, fetched)
            if page.display in self.dedup.dropped:
                return page
            # A page that yields no GPU (another vendor's families; an exporter that declares its families and
            # serves no sample because it sees no GPU) is unreadable too, with the reason `parse` gives (issue 44).
            reason = None if page.record_count else no_gpu_reason(page.parsed, fetched.body, self.normalizer.table)
            if self.health.of(url).answered(content_key(page.parsed, fetched.body), fetched.start_ns,
                                            readable=reason is None, reason=reason):
                self.events.write_event(EndpointState(page.endpoint, page.start_ns, "up", "scrape succeeded"))
            self.take(page)
            if reason is not None and not page.parsed.dropped:
                self._note_unreadable(page, reason)
            return page

    def preview(self, url: str, fetched: SourcePage) -> None:
        """A page read for the selection stage only (a probe's, before collection starts): nothing to the sinks,
        nothing counted against the GPU limit."""
        with self._lock:
            parsed, redacted = self._parse(url, fetched)
            records = self.normalizer.records(parsed, source_url=redacted, timestamp_ns=fetched.start_ns)
            self._select(url, [r.identity for r in records], fetched.start_ns)

    def is_duplicate(self, url: str) -> bool:
        return display_key(redact_url(url)) in self.dedup.dropped

    def _parse(self, url: str, fetched: SourcePage) -> tuple[AnyPage, str]:
        """The page parsed by its source's parser (the template check, the values), and the source's redacted URL."""
        parser = self._parsers.get(url)
        if parser is None:
            parser = self._parsers[url] = PageParser(max_series=self.max_series)
        if url not in self._keys:
            redacted = redact_url(url)
            self._keys[url] = (redacted, display_key(redacted))
        return parser.parse(fetched.body, openmetrics="openmetrics" in fetched.content_type or None), self._keys[url][0]

    def read(self, url: str, fetched: SourcePage) -> Page:
        """Parse and normalise one fetched page (the template check, the values, the records)."""
        parsed, redacted = self._parse(url, fetched)
        display = self._keys[url][1]
        phase = self.phase()
        compiled = self.normalizer.compiled(parsed, source_url=redacted, timestamp_ns=fetched.start_ns,
                                            run_id=self.run_id, phase=phase, scrape_end_ns=fetched.end_ns)
        if compiled is not None:
            within = self._plan_within.get(url) == compiled.plan  # (seen GPUs stay within it all run)
            keep = None if within else self._within_gpu_limit(url, compiled.identities())
            if not within:
                self._select(url, compiled.identities(), fetched.start_ns)
            if keep is None:
                self._plan_within[url] = compiled.plan
                return Page(url, redacted, display, parsed, compiled, phase, fetched.start_ns, fetched.end_ns)
            records = compiled.records()
        else:
            records = self.normalizer.records(parsed, source_url=redacted, timestamp_ns=fetched.start_ns,
                                              run_id=self.run_id, phase=phase, scrape_end_ns=fetched.end_ns)
            keep = self._within_gpu_limit(url, [r.identity for r in records])
            self._select(url, [r.identity for r in records], fetched.start_ns)
        if keep is not None:
            records = self._drop_past_gpu_limit(url, redacted, records, keep, fetched.start_ns)
        return Page(url, redacted, display, parsed, records, phase, fetched.start_ns, fetched.end_ns)

    def _select(self, url: str, identities: Sequence[Identity], time_ns: int) -> None:
        """The selection stage (bridge/select.py): the page's GPUs to de-duplication; each source now found a
        duplicate is said once (the log, an `endpoint_state` event) and dropped from then on: not scraped, not
        recorded, not forwarded (its series end in the OTLP stores)."""
        display = self._keys[url][1]
        for dropped, kept in self.dedup.observe(display, identities).items():
            dropped_url = next((u for u, (_, d) in self._keys.items() if d == dropped), url)
            logger.warning("%s", describe(dropped, kept))
            self.events.write_event(EndpointState(redact_url(dropped_url), time_ns, "duplicate",
                                                  duplicate_reason(kept)))
            if self.otlp is not None:
                self.otlp.mark_stale([dropped_url], self.phase(), time_ns)
            if self.on_duplicate is not None:
                self.on_duplicate(dropped_url)

    def _within_gpu_limit(self, url: str, identities: Sequence[Identity]) -> list[bool] | None:
        """At most `max_gpus` GPU identities (UUID × MIG instance) per endpoint and run: a node has up to 16
        GPUs of 8 series each, while an exporter whose UUIDs change at every scrape would grow every
        per-GPU structure (the live series, the report) without bound. New identities are taken in page order
        while there is room; None when every one of the page's is within the limit, else which to keep."""
        seen = self._identities.setdefault(url, set())
        if len(seen) + len(identities) <= self.max_gpus:  # room for all of them: the common case
            seen.update(identities)
            return None
        for identity in identities:
            if len(seen) >= self.max_gpus:
                break
            seen.add(identity)
        keep = [identity in seen for identity in identities]
        return None if all(keep) else keep

    def _drop_past_gpu_limit(self, url: str, endpoint: str, records: Sequence[GpuRecord], keep: Sequence[bool],
                             time_ns: int) -> list[GpuRecord]:
        """The records of identities past the limit dropped from every sink, counted, and said in a `parse`
        error at most once a minute."""
        kept = [record for record, keeping in zip(records, keep, strict=True) if keeping]
        self.over_gpu_limit[url] = self.over_gpu_limit.get(url, 0) + len(records) - len(kept)
        if self._notes.due(url, "gpu limit", time_ns):  # (the count in it changes: said once a minute)
            message = (f"{self.over_gpu_limit[url]} records of GPUs past the limit of {self.max_gpus} GPU "
                       "identities per endpoint (DCGM_BRIDGE_MAX_GPUS) dropped so far: does the exporter "
                       "change its UUIDs at every scrape?")
            logger.warning("%s: %s", endpoint, message)
            self.events.write_event(ScrapeFailure(endpoint, time_ns, "parse", message))
        return kept

    def take(self, page: Page) -> None:
        """A page: what the normaliser and the parser found wrong in it to the events file, then every sink."""
        for anomaly in self.normalizer.take_anomalies():  # once per family per run: the log and the report
            logger.warning("%s: %s", display_key(anomaly.source_url), anomaly.message())
            time_ns = page.start_ns if page.endpoint == anomaly.source_url else 0
            self.events.write_event(ScrapeFailure(anomaly.source_url, time_ns, "unit", anomaly.message()))
        for duplicate in self.normalizer.take_duplicates():  # one event per page: the report counts them
            if self._notes.due(duplicate.source_url, "duplicate series", page.start_ns):
                logger.warning("%s: %s (%s)", display_key(duplicate.source_url), DUPLICATE_SERIES_MESSAGE,
                               duplicate.name)
            self.events.write_event(ScrapeFailure(duplicate.source_url, page.start_ns, "duplicate_series",
                                                  DUPLICATE_SERIES_MESSAGE))
        if page.parsed.dropped:
            self._note_dropped(page)
        for sink in self.sinks:
            sink.take(page)

    def on_failure(self, url: str, exc: FetchError, start_ns: int) -> None:
        """The scrape loop's failure callback: a `scrape_error` event; the first of a run marks the endpoint down."""
        endpoint = redact_url(url)
        with self._lock:
            self.events.write_event(ScrapeFailure(endpoint, start_ns, exc.kind, exc.message))
            if self.health.of(url).failed(exc, start_ns):
                self.events.write_event(EndpointState(endpoint, start_ns, "down", exc.message))
                if self.otlp is not None:  # its series are gone
                    self.otlp.mark_stale([url], self.phase(), start_ns)

    def _note_unreadable(self, page: Page, reason: str) -> None:
        """A page with no GPU and no bad line reaches the report as a `parse` error, once a minute."""
        if self._notes.due(page.url, "no_gpu", page.start_ns, reason):
            logger.warning("%s: %s", page.endpoint, reason)
            self.events.write_event(ScrapeFailure(page.endpoint, page.start_ns, "parse", reason))

    def _note_dropped(self, page: Page) -> None:
        """Unreadable lines reach the report as `parse` errors: when what is dropped changes, else once a minute
        (an exporter that writes one bad line per page would otherwise add an event per scrape)."""
        parsed = page.parsed
        first = parsed.dropped[0]
        what = f"{len(parsed.dropped)} lines dropped" if page.readable else "no sample could be read"
        message = f"{what} (first: line {first.line}: {first.reason})"
        if not self._notes.due(page.url, "dropped", page.start_ns, message):
            return
        logger.warning("%s: %s", page.endpoint, message)
        self.events.write_event(ScrapeFailure(page.endpoint, page.start_ns, "parse", message))
