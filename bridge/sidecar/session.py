"""The run's lifecycle: configure → start → phase marks → complete (the seed's sequence).

`Session` is the Python API for in-process use; the control API (control.py) and the CLI drive the
same object. Records go to gpu_telemetry_export.jsonl (AIPerf's readers keep reading it); everything
else that happens — configuration, phase marks, failed scrapes, endpoint state, completion — goes to
gpu_telemetry_events.jsonl, from which the report is built.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from bridge.config import Config
from bridge.endpoints import REFRESH_FIX, candidate_endpoints, display_key, local_source_url
from bridge.errors import BridgeError, SequenceError
from bridge.errors import LifecycleError as LifecycleError
from bridge.events import Complete, Configured, IdleWindow, PodsResolved, Refresh, event_to_line
from bridge.fetch import FetchedPage, Fetcher, FetchError, FetchSettings, make_fetcher
from bridge.fields import FieldTable
from bridge.health import LAST_REFRESH, LAST_REFRESH_HELP, REFRESH_PERIOD, REFRESH_PERIOD_HELP, Health
from bridge.kernel import COMPILED
from bridge.normalize import Normalizer, duplicate_rule
from bridge.pods import parse_pod_patterns
from bridge.record_log import EVENTS_FILE, EXPORT_FILE, LineWriter, output_names
from bridge.redact import redact_url
from bridge.relabel import RelabelConfig
from bridge.samples import GpuRecord, PhaseMark, SessionState
from bridge.scrape import ScrapeGroup, ScrapeLoop
from bridge.select import preference_order
from bridge.sidecar.artifacts import Disposition, new_spool_dir, prepare_artifact_dir, report_paths, write_problem
from bridge.sidecar.finish import ReportTarget, adopted_phases, marks_of_phases, write_session_report
from bridge.sidecar.finish import SessionOutputs as SessionOutputs
from bridge.sidecar.folder_lock import FolderLock
from bridge.sidecar.marks import check_sequence, checked_mark, checked_requests_end, phase_after
from bridge.sidecar.pipeline import (
    Forwarder,
    LatestRecords,
    ListenerSink,
    LiveSeriesSink,
    OtlpSink,
    Page,
    PageListener,
    PageSink,
    Pipeline,
    PullPageSink,
    RecordLogSink,
)
from bridge.sidecar.pod_sinks import PodSelected, PodTimelineSink, SharedGpuNotes
from bridge.sidecar.spool import LiveSeries, remove_stale_spools, spool_dir
from bridge.sources.runner import SourceFetcher, open_reader

if TYPE_CHECKING:
    from bridge.report.window import Phase

__all__ = ["LifecycleError", "PageListener", "Probe", "Session", "SessionOutputs"]

logger = logging.getLogger(__name__)
STILL_WARN_S = 5.0  # values unchanged this long (before a refresh period is known): said at once


def log_scrape(page: Page, fetched: FetchedPage) -> None:
    """`-v`: one line per endpoint scrape; `-vv`: the page's details (families, dropped lines and why)."""
    parsed = page.parsed
    logger.info("scrape %s: %d bytes in %.0f ms, %d samples, %d lines dropped", page.display, len(fetched.body),
                (fetched.end_ns - fetched.start_ns) / 1e6, len(parsed.samples), len(parsed.dropped))
    if logger.isEnabledFor(logging.DEBUG):
        families = len({s.name for s in parsed.samples})
        logger.debug("page %s: %d families, content type %r, phase %s", page.display, families,
                     fetched.content_type, page.phase or "-")
        for dropped in parsed.dropped[:5]:
            logger.debug("page %s: line %d dropped: %s: %.100r", page.display, dropped.line, dropped.reason,
                         dropped.text)

KERNEL_MISSING = ("the compiled per-page kernel (bridge._kernel) is not built, so the pure-Python path runs, "
                  "at about twice the CPU: reinstall on a machine with a C compiler (gcc) to build it")
SELF_METRICS_EVERY_NS = 10_000_000_000  # the refresh gauges go to OTLP at least this often (and when they move)
_WRITE_CHECK_S = 1.0  # /readyz tries the artifact folder at most once a second (the kubelet probes every few)


@dataclass
class Probe:
    url: str
    reachable: bool
    reason: str | None = None
    page: FetchedPage | None = None  # what it answered (its GPUs go to de-duplication before any scrape)


def cpu_by_thread() -> dict[str, float]:
    """CPU-seconds of each live thread by its name (the scrape thread, the OTLP export, the record log's flusher,
    the control API...): where the sidecar's CPU goes, to size its limit. Threads of one name are summed."""
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident or 0))
        except (OSError, AttributeError):  # ended meanwhile, or no per-thread clock on this platform
            continue
        out[thread.name] = out.get(thread.name, 0.0) + seconds
    return {name: round(seconds, 6) for name, seconds in out.items()}


class Session:
    """One benchmark run's telemetry. Thread-safe; every method may be called from any thread."""

    def __init__(self, config: Config, table: FieldTable, *, fetcher: Fetcher | None = None,
                 now_ns: Callable[[], int] = time.time_ns, monotonic: Callable[[], float] = time.monotonic,
                 listeners: Sequence[PageListener] = (), forwarder: Forwarder | None = None,
                 relabel_config: RelabelConfig | None = None,
                 opener: Callable[[Path], IO[bytes]] | None = None) -> None:
        """`opener` opens the record log and the events file for appending (tests inject a failing one);"""
        self.config = config
        self.table = table
        self.run_id = config.effective_run_id()
        self.artifact_dir = Path(config.artifact_dir)
        self.fetcher = fetcher or make_fetcher(fetch_settings(config), now_ns=now_ns)
        self._now_ns = now_ns
        self._monotonic = monotonic
        self.forwarder = forwarder  # None when OTLP export is off
        self.relabel_config = relabel_config  # for the pull endpoint
        self.state: SessionState = "created"
        self.probes: list[Probe] = []
        self._unchanged: dict[str, int] = {}  # url -> scrapes since its values last changed (before a period)
        self._refresh_noted: dict[str, float] = {}  # url -> the refresh period last written to the events
        self._refresh_sent_ns = 0  # when the refresh gauges last went to OTLP
        # Each endpoint's labels for them, one mapping for the run: the OTLP encoder keeps a series per mapping
        # it is handed (a new one each time would be 128 new series every page at 64 endpoints, bench/NOTES.md).
        self._refresh_labels: dict[str, dict[str, str]] = {}
        self.self_metric_points = 0  # the bridge's own points handed to OTLP (the refresh gauges)
        self.loops: dict[str, ScrapeLoop] = {}
        self.health = Health()  # every endpoint's, fed by its scrape loop and the pipeline
        self.marks: list[PhaseMark] = []
        self.phase: str | None = None
        self.requests_end_ns: int | None = None
        self.outputs: SessionOutputs | None = None
        self.report_target: ReportTarget | None = None  # the benchmark's files (profile -- aiperf …)
        self._lock = threading.RLock()
        export_name = EXPORT_FILE if not config.profile_export_prefix else \
            f"{config.profile_export_prefix}_gpu_telemetry.jsonl"
        if config.record_log_gzip:
            export_name += ".gz"
        self.records = LineWriter(self.artifact_dir / export_name, flush_interval_s=config.flush_interval,
                                  monotonic=monotonic, opener=opener)
        self.events = LineWriter(self.artifact_dir / EVENTS_FILE, flush_interval_s=0.0, monotonic=monotonic,
                                 opener=opener)
        self.live_series: LiveSeries | None = LiveSeries(spool_dir(self.artifact_dir, self.run_id))
        self._record_log = RecordLogSink(self.records)
        self._latest = LatestRecords()
        self._pull = PullPageSink()
        self._otlp = OtlpSink(forwarder, self.run_id, pod_attributes=bool(config.gpu_pods)) \
            if forwarder is not None else None
        self._live_sink = LiveSeriesSink(self.live_series)
        sinks: list[PageSink] = [self._record_log, self._live_sink, self._latest, SharedGpuNotes(self.events)]
        leaving: list[PageSink] = [self._pull] if self._otlp is None else [self._pull, self._otlp]
        self._pod_selected = PodSelected(parse_pod_patterns(config.gpu_pods), leaving) if config.gpu_pods else None
        sinks += [self._pod_selected] if self._pod_selected is not None else leaving
        self.pod_timelines = PodTimelineSink() if config.gpu_pods else None  # the report's pods (--gpu-pods)
        if self.pod_timelines is not None:
            sinks.append(self.pod_timelines)
        if listeners:
            sinks.append(ListenerSink(listeners))
        self.disposition: Disposition | None = None  # what the artifact directory held (prepare_artifacts)
        self.started_ns: int | None = None  # when configure began: a phase manifest older than this is not ours
        self.preference = preference_order([*config.telemetry.urls, *map(local_source_url, config.telemetry.local)],
                                           candidate_endpoints([], config.default_endpoints))
        normalizer = Normalizer(table, keep=duplicate_rule(config.counter_mode))  # a series twice on one page
        self.pipeline = Pipeline(normalizer, sinks, self.events, run_id=self.run_id,
                                 phase=lambda: self.phase, otlp=self._otlp, max_series=config.max_series,
                                 max_gpus=config.max_gpus, health=self.health, preference=self.preference,
                                 on_duplicate=self._retire)
        self._write_check = threading.Lock()  # not self._lock: a probe must answer while completion runs
        self._pages = threading.Lock()  # the pipeline takes one page at a time (several scrape threads)
        self._write_checked: tuple[float, str | None] | None = None  # (when, the problem)
        self.folder_lock = FolderLock(self.artifact_dir, self.run_id)  # held from prepare_artifacts to complete

    @property
    def records_written(self) -> int:
        return self._record_log.records_written

    # -- artifact directory ------------------------------------------------------------------------
    def prepare_artifacts(self) -> None:
        """Check the artifact directory can be written and move an earlier run's files out of the way
        (sidecar/artifacts.py); raises ConfigError. Called by configure, and before a benchmark starts."""
        with self._lock:
            if self.disposition is not None:
                return
            names = output_names(self.config.profile_export_prefix)
            promised = [self.records.path, self.events.path, *report_paths(self.artifact_dir, names)]
            self.disposition = prepare_artifact_dir(self.artifact_dir, self.run_id, self.records.path, names,
                                                    self.folder_lock, promised)
            remove_stale_spools(self.artifact_dir)  # before this run spools anything: every one there is dead
            # Restarted inside the run: the spool (a dead process's, just removed) lacks what came before, so the
            # report reads the log; with no log yet, nothing came before and a new spool has it all.
            if self.disposition == "finished" or (self.disposition == "resume" and self.records.path.exists()):
                self.live_series = None
                self.pipeline.sinks.remove(self._live_sink)  # nothing spools a series the report will not read
                if self.pod_timelines is not None:  # (nor keeps pods: the report reads them from the log)
                    self.pipeline.sinks.remove(self.pod_timelines)
                    self.pod_timelines = None
            if self.live_series is not None:
                self.live_series.spool_dir = new_spool_dir(self.artifact_dir, self.run_id)
            if self.disposition == "resume":
                self._resume_marks()
            if self.disposition == "finished":
                self.folder_lock.release()  # writes nothing more
                self.state = "completed"
                self.outputs = SessionOutputs(self.artifact_dir, [self.records.path, self.events.path])

    def abandon(self) -> None:
        """A start that failed before anything was collected (the control port taken, no NVML): the folder is let go
        and this run's empty spool removed, so nothing of the attempt stays behind."""
        with self._lock:
            if self.state != "created":
                return
            for loop in self.loops.values():  # the local readers a failed configure had opened
                if isinstance(loop.group.fetcher, SourceFetcher):
                    loop.group.fetcher.close()
            self.loops.clear()
            spool = self.live_series.spool_dir if self.live_series is not None else None
            if spool is not None:
                with contextlib.suppress(OSError):  # only while empty: nothing was spooled yet
                    spool.rmdir()
            self.folder_lock.release()

    def _resume_marks(self) -> None:
        """Restarted inside the run: the marks in the events file are this run's, so the next mark follows
        them (the end the benchmark sends closes the phase the earlier process saw start)."""
        from bridge.report.events import load_events

        self.marks = list(load_events(self.events.path).marks)
        for mark in self.marks:
            self.phase = phase_after(self.phase, mark)

    # -- configure ---------------------------------------------------------------------------------
    def configure(self) -> list[Probe]:
        with self._lock:
            if self.state == "created":
                self.prepare_artifacts()
            if self.state != "created":
                return self.probes
            try:
                return self._configure()
            except BaseException:  # no NVML, no GPU, …: a start that fails leaves nothing behind (DESIGN.md)
                self.abandon()
                raise

    def _configure(self) -> list[Probe]:
        with self._lock:
            self.started_ns = self._now_ns()
            local = self.config.telemetry.local  # this machine's GPUs: no exporter defaults probed beside them
            urls = candidate_endpoints(self.config.telemetry.urls, () if local else self.config.default_endpoints)
            defaults = set(candidate_endpoints([], self.config.default_endpoints))
            self.probes = sorted(self._probe_all(urls), key=lambda p: self.preference.index(p.url))
            for probe in self.probes:
                if probe.page is not None:  # the first scrapes: which endpoints serve the same GPUs (select.py)
                    self.pipeline.preview(probe.url, probe.page)
                    probe.page = None  # read: a page an endpoint held for the whole run was 80 KB each (issue 48)
            group = self._group = ScrapeGroup(self.fetcher, self.config.collection_interval,
                                              monotonic=self._monotonic, now_ns=self._now_ns)  # one thread for all
            for probe in self.probes:
                # Defaults are only scraped when they answer; a user URL is scraped even when the probe
                # failed, so an exporter that comes up late is still collected (and shown as down).
                if probe.reachable or probe.url not in defaults:
                    self.loops[probe.url] = ScrapeLoop(probe.url, self.fetcher, self.config.collection_interval,
                                                       self._take_page, self.pipeline.on_failure,
                                                       monotonic=self._monotonic, now_ns=self._now_ns, group=group,
                                                       stats=self.health.of(probe.url))
            for name in local:  # bridge/sources: read like an exporter, on a thread (a ScrapeGroup) of its own
                source = SourceFetcher(open_reader(name), self._now_ns)  # SourceError: one line, exit 2
                url = source.reader.source
                own = ScrapeGroup(source, self.config.collection_interval, monotonic=self._monotonic,
                                  now_ns=self._now_ns)
                self.loops[url] = ScrapeLoop(url, source, self.config.collection_interval, self._take_page,
                                             self.pipeline.on_failure, monotonic=self._monotonic, now_ns=self._now_ns,
                                             group=own, stats=self.health.of(url))
                probe = self._probe_with(source, url)
                if probe.page is not None:  # its first read: which GPUs it serves (select.py)
                    self.pipeline.preview(url, probe.page)
                    probe.page = None
                self.probes.append(probe)
            for url in self.loops:
                if self.pipeline.is_duplicate(url):  # never scraped (shown in /status as `duplicate`)
                    self._retire(url)
            scraped = set(self.loops)
            configured = tuple(redact_url(u) for u in self.preference if u in scraped)  # (the report's preference)
            successful = tuple(redact_url(p.url) for p in self.probes if p.reachable)
            self.events.write_event(Configured(self._now_ns(), self.run_id, configured, successful,
                                               self.config.counter_mode, self.config.final_scrape_grace_ns))
            if not successful:
                logger.warning("no exporter answered (%s): collecting nothing until one does; check the URLs with "
                               "`dcgm-bridge parse URL`", ", ".join(configured) or "no endpoint configured")
            for probe in self.probes:
                loop = self.loops.get(probe.url)
                if probe.reachable and loop is not None and loop.retired is None:
                    loop.scrape_now()  # the baseline scrape
                elif loop is not None and not probe.reachable:
                    logger.warning("endpoint %s is not reachable: %s", redact_url(probe.url), probe.reason)
            self.events.flush()
            self.state = "configured"
            return self.probes

    def _probe_all(self, urls: Sequence[str]) -> list[Probe]:
        """Every endpoint probed at once (`fetch` is thread-safe): start-up takes one probe's time, not the
        sum of every hanging endpoint's timeout (and so does a SIGTERM that arrives meanwhile)."""
        if len(urls) <= 1:
            return [self._probe(url) for url in urls]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(16, len(urls)), thread_name_prefix="probe") as pool:
            return list(pool.map(self._probe, urls))

    def _probe(self, url: str) -> Probe:
        return self._probe_with(self.fetcher, url)

    @staticmethod
    def _probe_with(fetcher: Fetcher, url: str) -> Probe:
        try:
            page = fetcher.fetch(url)
        except FetchError as exc:
            reachable = exc.kind not in ("connect", "timeout", "http_status")
            return Probe(url, reachable, exc.message)
        return Probe(url, True, page=page)

    def _retire(self, url: str) -> None:
        """A source found a duplicate of another (the pipeline said so, in the log and the events): not scraped
        any more. Called on the scrape thread: no session lock (completion holds it while it waits for scrapes)."""
        loop = self.loops.get(url)
        if loop is not None:
            loop.retire("a duplicate of another endpoint: not scraped")

    # -- start -------------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self.state == "created":
                self.configure()
            if self.state != "configured":
                return
            if not COMPILED:
                logger.warning(KERNEL_MISSING)
            for loop in self.loops.values():
                loop.start()
            self.state = "collecting"
            # The report's modules (numpy, the builder, the writers) are imported when the report is built, not
            # now: held for the whole run they were 17 MiB of RSS, a quarter of a small sidecar's (issue 48);
            # at the end they cost ~0.12 CPU-s of the 0.75 CPU-s a 25m limit's grace period gives.

    def record_idle(self, event: IdleWindow) -> None:
        """A quiet stretch `profile --idle-window` kept (the report's idle baseline), to the events file."""
        with self._lock:
            if self.state == "collecting":
                self.events.write_event(event)

    def follow_pods(self, urls: Sequence[str], pods: Sequence[str], event: PodsResolved) -> list[str]:
        """What the pod watch found (sidecar/pod_watch.py): `pods` (NAMESPACE/NAME) join the selection, live and the
        report's; exporter endpoints not scraped yet are from now on; the pods go to the events file. The URLs
        added."""
        with self._lock:
            if self.state not in ("configured", "collecting"):
                return []
            self.events.write_event(event)
            new = [pod for pod in pods if pod not in self.config.gpu_pods]
            if new and self._pod_selected is not None:
                self.config = replace(self.config, gpu_pods=(*self.config.gpu_pods, *new))
                self._pod_selected.patterns = parse_pod_patterns(self.config.gpu_pods)
            added = [url for url in dict.fromkeys(urls) if url not in self.loops]
            with self._group.cond:  # (its thread reads its endpoints under it)
                for url in added:
                    self.loops[url] = ScrapeLoop(url, self.fetcher, self.config.collection_interval, self._take_page,
                                                 self.pipeline.on_failure, monotonic=self._monotonic,
                                                 now_ns=self._now_ns, group=self._group, stats=self.health.of(url))
                self._group.wake()
            return added

    # -- phase marks -------------------------------------------------------------------------------
    def mark_phase(self, name: Any, kind: Any, event: Any, time_ns: Any) -> PhaseMark:
        """Validates its arguments itself (they come straight from a POST body), all of them before anything is
        applied (sidecar/marks.py): a refused mark leaves no trace in the records, the events or the status."""
        mark = checked_mark(name, kind, event, time_ns, self._now_ns(), self.started_ns)
        line = event_to_line(mark)  # encoded before the state changes: it cannot fail half-way
        with self._lock:
            if self.state == "completed":
                raise SequenceError("the run is already complete")
            check_sequence(self.marks, mark)
            self.events.write_lines([line])
            self.marks.append(mark)
            self.phase = phase_after(self.phase, mark)
            self.events.flush()
            loops = list(self.loops.values())
        threading.Thread(target=self._boundary, args=(mark, loops), daemon=True,
                         name=f"boundary {mark.name} {mark.event}").start()
        return mark

    def _boundary(self, mark: PhaseMark, loops: list[ScrapeLoop]) -> None:
        waits = [(loop, loop.request_boundary(mark.time_ns)) for loop in loops]
        for loop, boundary in waits:
            finished = boundary.done.wait(self.config.scrape_timeout + self.config.connect_timeout + 1)
            reason = boundary.error if finished else "timed out waiting for the boundary scrape"
            if reason:
                logger.warning("Baseline capture failed for phase '%s' %s: %s (%s)", mark.name, mark.kind,
                               reason, loop.stats.url)

    # -- complete ----------------------------------------------------------------------------------
    def complete(self, requests_end_ns: Any = None, *, await_refresh: bool = False) -> SessionOutputs:
        """End the run: a final scrape of every endpoint, then (`await_refresh`) the next refresh of a slow
        exporter, then the files and the report. SIGTERM does not await: the kubelet's grace is short.
        `requests_end_ns` is checked first (it may come straight from a POST body): a bad one completes nothing
        (a LifecycleError)."""
        with self._lock:
            if self.outputs is not None:
                return self.outputs
            requests_end_ns = checked_requests_end(requests_end_ns, self._now_ns(), self.marks)
            if self.state == "created":
                self.configure()
            now = self._now_ns()
            self.requests_end_ns = requests_end_ns
            deadline = self._monotonic() + self.config.shutdown_delay
            # A final scrape of every endpoint brackets the window's end; only those of endpoints that are up are
            # waited for (a hanging one would only delay the end by its timeout; a down one that answers in
            # time still gives its sample).
            up = {url for url, loop in self.loops.items() if loop.stats.state == "up"}
            finals = [(url, loop.request_boundary(now)) for url, loop in self.loops.items()]
            for url, boundary in finals:
                if url in up:
                    boundary.done.wait(max(0.0, deadline - self._monotonic()))
            if await_refresh:
                self._await_refresh(now)
                deadline = self._monotonic() + self.config.shutdown_delay
            for loop in self.loops.values():
                loop.stop(timeout=max(0.1, deadline - self._monotonic()))
                if isinstance(loop.group.fetcher, SourceFetcher):
                    loop.group.fetcher.close()
            otlp = self._close_forwarder(deadline)
            self.records.close()
            phases = adopted_phases(self)  # the benchmark's own (AIPerf's files, a manifest) when it posted no marks
            for mark in marks_of_phases(phases):  # recorded, so the events file holds the window the report takes
                self.events.write_event(mark)
            self.events.write_event(Complete(self._now_ns(), requests_end_ns, True,
                                             tuple(loop.stats.as_json() for loop in self.loops.values()),
                                             otlp, self._record_log_status()))
            self.events.close()
            self.fetcher.close()
            self.state = "completed"
            self.outputs = SessionOutputs(self.artifact_dir)
            self.outputs.files = [p for p in (self.records.path, self.events.path) if p.exists()]  # written ones
            self._write_report(self.outputs, phases)
            if self.live_series is not None:
                self.live_series.remove()
            self.folder_lock.release()
            for writer in (self.records, self.events):
                lost = writer.lines_dropped + len(writer.pending())
                if lost or writer.last_error:  # still refused, or dropped from a full buffer before there was room
                    reason = writer.last_error or f"cannot write {writer.path}: its buffer overflowed"
                    logger.error("%s; %d lines could not be written: the run's files are incomplete", reason, lost)
                    self.outputs.problems.append(f"{writer.path}: {lost} lines could not be written ({reason})")
            return self.outputs

    def _await_refresh(self, final_ns: int) -> None:
        """Keep scraping until every slow exporter (one whose values change less often than every second
        scrape) has shown values newer than the final scrape, at most `final_refresh_wait` seconds: the
        report then reads the window's end between two refreshes instead of extrapolating past the last one
        (bridge/report/refresh.py). An exporter refreshing every 30 s (its default) costs up to 30 s here."""
        limit = self.config.final_refresh_wait
        interval = self.config.collection_interval
        waiting = {url: loop for url, loop in self.loops.items()
                   if loop.stats.state == "up" and loop.stats.refresh.slower_than(interval)}
        if not waiting or limit <= 0:
            return
        longest = max(loop.stats.refresh.period_s or 0 for loop in waiting.values())
        budget = min(limit, 1.2 * longest + 2 * interval)
        logger.info("waiting up to %.0f s for the next DCGM refresh of %s (every %.0f s), so that it brackets "
                    "the window's end (final_refresh_wait; dcgm-exporter -c 100 makes this unnecessary)",
                    budget, ", ".join(display_key(u) for u in waiting), longest)
        stop_at = self._monotonic() + budget
        while waiting and self._monotonic() < stop_at:
            for url, loop in list(waiting.items()):
                seen = loop.stats.refresh.last_new_ns
                later = seen is not None and seen > final_ns + interval * 5e8  # seen by a later scrape
                if loop.stats.state != "up" or later:
                    del waiting[url]
            if waiting:
                time.sleep(min(0.05, max(0.0, stop_at - self._monotonic())))
        if waiting:
            logger.warning("no new DCGM refresh from %s within %.0f s: the window's end is extrapolated",
                           ", ".join(display_key(u) for u in waiting), budget)

    def _take_page(self, url: str, fetched: FetchedPage) -> None:
        """Pages of every scrape thread (the exporters' and each local source's) one at a time: the pipeline keeps
        its own order (its lock; failures go straight to it), this one the refresh bookkeeping after it."""
        with self._pages:
            self._on_page(url, fetched)

    def _on_page(self, url: str, fetched: FetchedPage) -> None:
        """A page: the pipeline, then its exporter's refresh period to the events file (and a warning when slow)."""
        page = self.pipeline.on_page(url, fetched)
        if logger.isEnabledFor(logging.INFO):
            log_scrape(page, fetched)
        loop = self.loops.get(url)
        period = loop.stats.refresh.period_s if loop is not None else None
        noted = self._refresh_noted.get(url)
        moved = period is not None and (noted is None or abs(period / noted - 1) > 0.2)
        if self.forwarder is not None and (moved or fetched.start_ns - self._refresh_sent_ns >= SELF_METRICS_EVERY_NS):
            self._send_refresh_metrics(fetched.start_ns)
        if loop is not None and period is not None and moved:
            self._refresh_noted[url] = period
            self.events.write_event(Refresh(redact_url(url), fetched.start_ns, period, loop.stats.refresh.refreshes,
                                            loop.stats.scrapes))
            if loop.stats.refresh.slower_than(self.config.collection_interval):
                logger.warning("%s: the exporter's values change every %.1f s, not at every scrape: an energy window "
                               "shorter than %.0f s rests on too few refreshes; %s", display_key(url), period,
                               2 * period, REFRESH_FIX)
        if loop is not None and period is None:
            self._warn_if_unchanged(url, loop.stats.refresh.last_new_ns == fetched.start_ns)

    def _warn_if_unchanged(self, url: str, new: bool) -> None:
        """Before an exporter's refresh period is known (three refreshes: 60 s at dcgm-exporter's default 30 s),
        one warning as soon as its values have stood still for 5 s of scrapes, so a short run hears it too."""
        unchanged = self._unchanged.get(url, 0)
        if unchanged < 0:  # said once for this endpoint; the refresh period's own warning follows when known
            return
        unchanged = 0 if new else unchanged + 1
        still_s = unchanged * self.config.collection_interval
        self._unchanged[url] = -1 if unchanged >= 3 and still_s >= STILL_WARN_S else unchanged
        if self._unchanged[url] < 0:
            logger.warning("%s: the exporter's values have not changed for %.0f s (%d scrapes): DCGM refreshes at most "
                           "once in %.0f s, so short windows rest on few refreshes; %s", display_key(url), still_s,
                           unchanged, still_s, REFRESH_FIX)

    def _send_refresh_metrics(self, ts_ns: int) -> None:
        """The exporters' refresh as OTLP gauges, from the resource `dcgm-bridge` (a page of its own: the
        exporters' pages keep their templates): what the mixin's stale-exporter alert reads."""
        from bridge.samples import ParsedPage, Sample

        assert self.forwarder is not None
        self._refresh_sent_ns = ts_ns
        samples: list[Sample] = []
        for url, loop in list(self.loops.items()):
            labels = self._refresh_labels.setdefault(url, {"endpoint": display_key(url)})
            watch = loop.stats.refresh
            if watch.period_s is not None:
                samples.append(Sample(REFRESH_PERIOD, labels, watch.period_s))
            if watch.last_new_ns is not None:
                samples.append(Sample(LAST_REFRESH, labels, watch.last_new_ns / 1e9))
        if samples:
            self.self_metric_points += len(samples)
            page = ParsedPage(samples, {REFRESH_PERIOD: "gauge", LAST_REFRESH: "gauge"},
                              {REFRESH_PERIOD: REFRESH_PERIOD_HELP, LAST_REFRESH: LAST_REFRESH_HELP}, [])
            self.forwarder.submit("dcgm-bridge", page, run_id=self.run_id, phase=self.phase or "none", ts_ns=ts_ns)

    def _record_log_status(self) -> dict[str, Any]:
        return {"path": str(self.records.path), "lines_written": self.records.lines_written,
                "lines_dropped": self.records.lines_dropped, "error": self.records.last_error}

    def _close_forwarder(self, deadline: float) -> dict[str, Any] | None:
        if self.forwarder is None or self._otlp is None:
            return None
        up = [url for url in self._otlp.seen if not self.health.is_down(url)]
        self._otlp.mark_stale(up, self.phase, self._now_ns())  # the run is over: its series end here
        stats: dict[str, Any] = self.forwarder.close(max(0.5, deadline - self._monotonic())).as_dict()
        warn_otlp_losses(stats)
        return stats

    def exposition(self) -> bytes:
        """The pull endpoint's page: the latest relabelled samples of every endpoint plus our own health."""
        from bridge.sidecar.pull import BridgeHealth, EndpointHealth, LatestPage, render_exposition

        latest = [LatestPage(display_key(url), page, self.run_id, phase or "none", ts)
                  for url, (page, phase, ts) in list(self._pull.latest.items())]
        health = BridgeHealth(
            [EndpointHealth(display_key(url), loop.stats.scrapes, loop.stats.last_duration_s,
                            dict(loop.stats.failures), loop.stats.refresh.period_s, loop.stats.refresh.last_new_ns)
             for url, loop in self.loops.items()],
            self.records_written,
            self.forwarder.stats().as_dict() if self.forwarder is not None else None,
        )
        if self.relabel_config is not None:
            return render_exposition(latest, health, relabel_config=self.relabel_config)
        return render_exposition(latest, health)

    def _write_report(self, outputs: SessionOutputs, phases: list[Phase] | None) -> None:
        rebuild = f"rebuild it with `dcgm-bridge report --jsonl {self.records.path} --events {self.events.path}`"
        try:
            write_session_report(self, outputs, phases)
        except BridgeError as exc:  # a file that cannot be written, a manifest that cannot be read: its message
            logger.error("the report was not written: %s; %s", exc, rebuild)
            outputs.problems.append(f"the report was not written: {exc}")
        except OSError as exc:  # the spool or a file the builder reads (EMFILE, ENOSPC, EROFS): one line, no traceback
            reason = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc.strerror or exc)
            logger.error("the report was not written: %s; %s", reason, rebuild)
            outputs.problems.append(f"the report was not written: {reason}")
        except Exception as exc:  # the record log is already safe; a report bug must not lose it
            logger.exception("building the report failed; %s", rebuild)
            outputs.problems.append(f"building the report failed: {exc!r}")

    # -- status ------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """A snapshot, taken without the session's lock: configure (probing hanging endpoints) and complete
        (waiting for a final refresh) hold it for seconds, and /status must answer meanwhile."""
        probes, loops, marks = list(self.probes), list(self.loops.items()), list(self.marks)
        return {
            "state": self.state,
            "run_id": self.run_id,
            "per_page_path": "compiled kernel" if COMPILED else "pure Python (bridge._kernel not built)",
            "phase": self.phase,
            "artifact_dir": str(self.artifact_dir),
            "records_written": self.records_written,
            "record_log": self._record_log_status(),
            "endpoints": [
                {**loop.stats.as_json(), "display": display_key(url),
                 "reachable_at_configure": any(p.url == url and p.reachable for p in probes)}
                for url, loop in loops
            ],
            "marks": [m._asdict() for m in marks],
            "otlp": self.forwarder.stats().as_dict() if self.forwarder is not None else None,
            "cpu_s_by_thread": cpu_by_thread(),
        }

    def latest_records(self) -> dict[tuple[str, tuple[str, str | None]], tuple[GpuRecord, GpuRecord]]:
        """(display key, identity) → (first, latest) record: what the live view shows."""
        return dict(self._latest.latest)

    @property
    def ready(self) -> bool:
        return self.not_ready() is None

    def not_ready(self) -> str | None:
        """Why /readyz says 503 (None: ready): not collecting yet (or any more), or the artifact folder cannot
        be written now (a read-only or full volume loses everything). The exporters are not waited for."""
        if self.state not in ("configured", "collecting"):
            return f"the run is {self.state}"
        refused = self.records.last_error or self.events.last_error  # the last write of a file failed
        problem = self.write_problem(fresh=refused is not None)
        if problem:
            return f"cannot write {self.artifact_dir}: {problem}"
        return refused  # a file refused while the folder takes new ones (another user's, a read-only bind)

    def write_problem(self, fresh: bool = False) -> str | None:
        """Why the artifact folder cannot be written now (None: it can), tried at most once a second (`fresh`:
        now)."""
        with self._write_check:
            now = self._monotonic()
            if fresh or self._write_checked is None or now - self._write_checked[0] >= _WRITE_CHECK_S:
                self._write_checked = (now, write_problem(self.artifact_dir))
            return self._write_checked[1]


def warn_otlp_losses(stats: dict[str, Any]) -> None:
    dropped, rejected = stats.get("dropped_points", 0), stats.get("rejected_points", 0)
    if dropped or rejected:
        logger.warning("OTLP: %d points dropped and %d rejected, %d sent (last error: %s)", dropped, rejected,
                       stats.get("sent_points", 0), stats.get("last_error") or "-")


def fetch_settings(config: Config) -> FetchSettings:
    token = config.bearer_token
    if token is None and config.bearer_token_file:
        token = Path(config.bearer_token_file).read_text(encoding="utf-8").strip()
    basic = None
    if config.basic_auth_user and config.basic_auth_password_file:
        basic = (config.basic_auth_user, Path(config.basic_auth_password_file).read_text(encoding="utf-8").strip())
    return FetchSettings(connect_timeout=config.connect_timeout, read_timeout=config.scrape_timeout,
                         max_body_bytes=config.max_body_bytes, ca_file=config.ca_file,
                         insecure_skip_verify=config.insecure_skip_verify, bearer_token=token, basic_auth=basic,
                         no_credentials=config.uncredentialed_urls())
