"""The scrape loop: every endpoint on one thread, on absolute ticks, never more than one scrape in flight
per endpoint.

At each tick every idle endpoint's GET starts at once (libcurl's multi interface: bridge/fetch.py) and
each page is handled on this thread as it arrives, so a slow or dead exporter never holds up the others
and a tick costs one wake-up for all endpoints, not one per endpoint (DESIGN.md "Performance").
A tick that finds an endpoint's previous scrape still running is counted as missed for it, not queued
(AIPerf fires every tick without awaiting, so a stalled exporter piles up ~90 overlapping scrapes, §13.13).
Boundary scrapes (phase marks, completion) wake the loop at once: a scrape already in flight that
started at or after the boundary serves as the boundary sample, otherwise one starts as soon as the
in-flight one ends.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
import zlib
from bisect import bisect_left, insort
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.fetch import FetchedPage, Fetcher, FetchError, Outcome, Transfers, transfers_of
from bridge.redact import redact_url

logger = logging.getLogger(__name__)


REFRESH_PERIOD = "dcgm_bridge_exporter_refresh_period_seconds"
REFRESH_PERIOD_HELP = "How often the DCGM endpoint's values change (dcgm-exporter's collect interval, -c), as scraped."
LAST_REFRESH = "dcgm_bridge_exporter_last_refresh_timestamp_seconds"
LAST_REFRESH_HELP = "When a scrape first saw the DCGM endpoint's current values (Unix seconds): stale when old."


_KEEP_BODY = 1 << 20


class RefreshWatch:
    """Which scrapes brought a new DCGM refresh, and the period between refreshes, as the scrapes see it.

    dcgm-exporter serves DCGM's latest samples of fields DCGM watches every collect interval (`-c` ms,
    30 000 by default: NVIDIA/dcgm-exporter `pkg/cmd/app.go`, `collect-interval`, the collectors'
    `WatchDeviceFields(..., CollectInterval*1000)`), so between two samples the body is the same bytes: a body
    unlike the previous one is a new refresh, sampled after the previous scrape started and before this one
    did. The period is the median spacing of the recent brackets' midpoints (the report fits the whole run's:
    bridge/report/refresh.py).
    """

    __slots__ = ("_body", "_start_ns", "_mid", "_gaps", "_ordered", "refreshes", "last_new_ns", "period_s")

    def __init__(self) -> None:
        self._body: bytes | tuple[int, int] | None = None
        self._start_ns: int | None = None
        self._mid: float | None = None  # the latest bracket's midpoint
        self._gaps: deque[float] = deque(maxlen=32)  # between the recent midpoints
        self._ordered: list[float] = []  # the same gaps in order (kept so, not sorted at every scrape)
        self.refreshes = 0
        self.last_new_ns: int | None = None  # start of the scrape that first saw the latest refresh
        self.period_s: float | None = None  # median spacing of the recent refreshes; None before three

    def slower_than(self, interval_s: float) -> bool:
        """The exporter's values change less often than every second scrape at `interval_s`: not fresh."""
        return self.period_s is not None and self.period_s > 2 * interval_s

    def observe(self, body: bytes, start_ns: int) -> bool:
        """One successful scrape; True when it brought a new refresh. A page over 1 MiB is remembered by its
        length and CRC, not kept (the parser keeps a normal page anyway: the same object, no extra memory)."""
        seen: bytes | tuple[int, int] = body if len(body) <= _KEEP_BODY else (len(body), zlib.crc32(body))
        new = seen != self._body
        if new:
            self.refreshes += 1
            if self._start_ns is not None:
                mid = (self._start_ns + start_ns) / 2
                if self._mid is not None:
                    gaps, ordered = self._gaps, self._ordered
                    if len(gaps) == gaps.maxlen:
                        del ordered[bisect_left(ordered, gaps[0])]  # the oldest leaves both
                    gap = mid - self._mid
                    gaps.append(gap)
                    insort(ordered, gap)
                    if len(ordered) >= 2:
                        self.period_s = ordered[len(ordered) // 2] / 1e9
                self._mid = mid
            self.last_new_ns = start_ns
            self._body = seen
        self._start_ns = start_ns
        return new


@dataclass
class EndpointStats:
    url: str  # redacted
    scrapes: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    missed_ticks: int = 0
    last_success_ns: int | None = None
    last_error: str | None = None
    last_error_ns: int | None = None
    state: str = "pending"  # pending | up | down | unreadable (answered, no sample in it) | stopped
    last_duration_s: float | None = None
    lateness_s: list[float] = field(default_factory=list)  # recent tick lateness (bounded ring)
    refresh: RefreshWatch = field(default_factory=RefreshWatch)

    def as_json(self) -> dict[str, object]:
        late = sorted(self.lateness_s)
        return {
            "url": self.url, "state": self.state, "scrapes": self.scrapes, "failures": dict(self.failures),
            "missed_ticks": self.missed_ticks, "last_success_ns": self.last_success_ns,
            "last_error": self.last_error, "last_error_ns": self.last_error_ns,
            "last_scrape_duration_s": self.last_duration_s,
            "tick_lateness_p99_s": late[min(len(late) - 1, int(len(late) * 0.99))] if late else None,
            "refreshes": self.refresh.refreshes, "refresh_period_s": self.refresh.period_s,
            "last_refresh_ns": self.refresh.last_new_ns,
        }


class _Boundary:
    """A requested boundary scrape: done when a scrape started at or after `time_ns` has finished."""

    def __init__(self, time_ns: int) -> None:
        self.time_ns = time_ns
        self.done = threading.Event()
        self.error: str | None = None

    def finish(self, error: str | None) -> None:
        """Served (`error` None) or given up, with why."""
        self.error = error
        self.done.set()


# Two scrapes of one endpoint never start within the same millisecond: stores keep samples at millisecond
# resolution, and a second value at the same millisecond is a duplicate sample (Prometheus refuses it,
# VictoriaMetrics keeps one). It happened when the baseline scrape at start-up was followed at once by tick 0.
MIN_START_GAP_S = 0.001
# The pages of a tick are handed over together: an ended GET's page waits until the tick's other GETs have
# ended too, for at most HOLD_S (or a tenth of the interval). Run back to back, the pages' Python and the
# kernel find each other's code and data in the caches that a libcurl call between every two pages
# would have cleared (bench/NOTES.md: ~0.3-0.5 millicores of ~10 at 8 endpoints); a slow endpoint holds the
# others' pages up for that long at most, never a tick.
HOLD_S = 0.02
_MS = 1_000_000

PageHandler = Callable[[str, FetchedPage], None]
FailureHandler = Callable[[str, FetchError, int], None]


class ScrapeGroup:
    """The scrape thread: drives the GETs of all its endpoints (`ScrapeLoop`s) on one shared tick grid."""

    def __init__(self, fetcher: Fetcher, interval_s: float, *, monotonic: Callable[[], float] = time.monotonic,
                 now_ns: Callable[[], int] = time.time_ns) -> None:
        self.fetcher = fetcher
        self.interval_s = interval_s
        self.monotonic = monotonic
        self.now_ns = now_ns
        self.loops: dict[str, ScrapeLoop] = {}
        self.cond = threading.Condition()
        self.origin: float | None = None  # monotonic time of tick 0, once running
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._wake_read, self._wake_write = os.pipe()
        self._woken = False  # a wake-up was written to the pipe since the thread last emptied it
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)

    @property
    def stopped(self) -> bool:
        return self._stopping

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        with self.cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="scrape", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        with self.cond:
            self._stopping = True
            self.wake()
        end = None if timeout is None else time.monotonic() + timeout
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        for loop in list(self.loops.values()):  # a scrape on a caller's thread ends before the run's files close
            if loop.alone.acquire(timeout=-1 if end is None else max(0.0, end - time.monotonic())):
                loop.alone.release()
        with self.cond:
            if not self._closed and (thread is None or not thread.is_alive()):
                self._closed = True
                os.close(self._wake_read)
                os.close(self._wake_write)

    def wake(self) -> None:
        """Called under `cond`: the thread looks at its endpoints again now."""
        if not self._closed:
            self._woken = True
            with contextlib.suppress(BlockingIOError):  # the pipe is full of wake-ups already
                os.write(self._wake_write, b"!")

    def _run(self) -> None:
        transfers = transfers_of(self.fetcher)
        try:
            self._loop(transfers)
        finally:
            transfers.cancel()  # GETs still in flight at stop are abandoned, their handles released

    def _loop(self, transfers: Transfers) -> None:
        interval = self.interval_s
        self.origin = origin = self.monotonic()
        wake_at = -math.inf  # when the schedule is due a look: a tick, a start gap, a boundary, a GET's end
        look = True  # a wake-up asked for a look (a boundary, stop)
        held: list[Outcome] = []  # ended GETs whose pages wait for the tick's other GETs (see HOLD_S)
        held_since: float | None = None
        hold = min(HOLD_S, interval / 10)
        while True:
            starts: list[ScrapeLoop] = []
            if look or self.monotonic() >= wake_at:  # (most wake-ups are a GET's bytes: nothing to schedule)
                due = self._look(origin, starts)
                if due is None:  # stopping
                    self._hand_over(held)  # pages that ended before the stop are kept
                    return
                wake_at = due
            for loop in starts:
                transfers.begin(loop.url)
            until = wake_at if held_since is None else min(wake_at, held_since + hold)
            ended = transfers.wait(max(0.0, until - self.monotonic()), self._wake_read)
            look = self._woken
            if look:  # (most wake-ups are a GET's bytes or a tick: no syscall to find the pipe empty)
                self._woken = False
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_read, 4096):
                        pass
            if ended:
                held += ended
                if held_since is None:
                    held_since = self.monotonic()
            if held_since is None or transfers.active and self.monotonic() - held_since < hold and not look:
                continue  # (a wake-up, for a boundary or the stop, hands them over at once)
            ended, held, held_since = held, [], None
            self._hand_over(ended)
            with self.cond:  # an ended endpoint's next tick or waiting boundary, which the last look skipped
                now, now_ns = self.monotonic(), self.now_ns()
                wake_at = min(wake_at, *(self.loops[url].due_at(origin, interval, now, now_ns) for url, _ in ended))

    def _look(self, origin: float, starts: list[ScrapeLoop]) -> float | None:
        """Begin the scrapes that are due (appended to `starts`); when to look again, or None once stopping."""
        interval = self.interval_s
        with self.cond:
            if self._stopping:
                return None
            now, now_ns = self.monotonic(), self.now_ns()
            current = math.floor((now - origin) / interval)
            wake_at = now + interval
            for loop in self.loops.values():
                if loop.in_flight_start_ns is not None or loop.retired is not None:
                    continue  # its tick is reckoned when its GET ends; a retired endpoint is not scraped
                if now - loop.began < MIN_START_GAP_S:  # its previous scrape started under a millisecond ago
                    wake_at = min(wake_at, loop.began + MIN_START_GAP_S)
                    continue
                if loop.boundary_due(now_ns):
                    loop.begin(now_ns, boundary=True)
                    starts.append(loop)
                elif loop.next_tick <= current:
                    if current > loop.next_tick:  # this thread was held up: those ticks are missed
                        loop.stats.missed_ticks += current - loop.next_tick
                    loop.record_lateness(now - (origin + current * interval))
                    loop.next_tick = current + 1
                    loop.begin(now_ns, boundary=False)
                    starts.append(loop)
                else:
                    wake_at = min(wake_at, loop.due_at(origin, interval, now, now_ns))
        return wake_at

    def _hand_over(self, ended: list[Outcome]) -> None:
        for url, outcome in ended:
            self.loops[url].end(outcome)


class ScrapeLoop:
    """One endpoint: its schedule, its boundaries and its stats. Scraped by its `ScrapeGroup`'s thread (its
    own group when none is given); hands pages and failures to callbacks on that thread."""

    def __init__(self, url: str, fetcher: Fetcher, interval_s: float, on_page: PageHandler,
                 on_failure: FailureHandler, *, monotonic: Callable[[], float] = time.monotonic,
                 now_ns: Callable[[], int] = time.time_ns, group: ScrapeGroup | None = None) -> None:
        self.url = url
        self.on_page = on_page
        self.on_failure = on_failure
        self.stats = EndpointStats(redact_url(url))
        # The group's fetcher, interval and clocks are the loop's: a given group must have been made with these.
        self.group = group or ScrapeGroup(fetcher, interval_s, monotonic=monotonic, now_ns=now_ns)
        self._monotonic = self.group.monotonic
        self._now_ns = self.group.now_ns
        self.group.loops[url] = self
        self._pending: list[_Boundary] = []
        self._in_flight_served: list[_Boundary] = []
        self.in_flight_start_ns: int | None = None
        self._in_flight_boundary = False
        self.began = -math.inf  # monotonic time the latest scrape started
        self.last_start_ns = 0
        self.next_tick = 0  # the next tick of the group's grid this endpoint is scraped at
        self.tick_lateness_s = self.stats.lateness_s  # bounded ring of recent lateness samples (bench, /status)
        self.alone = threading.RLock()  # held by a scrape on a caller's thread (`_scrape_once`)
        self.retired: str | None = None  # why it is scraped no more (`retire`)

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.group.start()

    def request_boundary(self, time_ns: int) -> _Boundary:
        boundary = _Boundary(time_ns)
        group = self.group
        with group.cond:
            if group.stopped or self.retired is not None:  # the run is complete: a late phase mark gets no scrape
                boundary.finish(self.retired or "collection has stopped")
                return boundary
            running = group.running
            if self.in_flight_start_ns is not None and self.in_flight_start_ns >= time_ns:
                self._in_flight_served.append(boundary)  # the scrape in flight started after the boundary
            else:
                self._pending.append(boundary)
                group.wake()
        if not running:
            self._scrape_once()
        return boundary

    def retire(self, reason: str) -> None:
        """This endpoint is scraped no more (a duplicate source: bridge/select.py); the group goes on without it,
        a scrape in flight is discarded when it ends, and boundaries are answered at once with `reason`."""
        with self.group.cond:
            self.retired = reason
            self.stats.state = "duplicate"
            pending, self._pending = self._pending, []
        for boundary in pending:
            boundary.finish(reason)

    def stop(self, timeout: float | None = None) -> None:
        """Stops the whole group (every endpoint on its thread)."""
        self.group.stop(timeout)
        self.stats.state = "stopped" if self.stats.state not in ("down", "duplicate") else self.stats.state

    def scrape_now(self) -> bool:
        """One scrape now, waited for (the baseline: before the loop starts); True when it succeeded."""
        if self.group.running:  # the group's thread owns the endpoint's connection: ask it
            boundary = self.request_boundary(self._now_ns())
            return boundary.done.wait(600) and boundary.error is None
        return self._scrape_once()

    # -- the group's side (under its lock where noted) ----------------------------------------------
    def boundary_due(self, now_ns: int) -> bool:
        return bool(self._pending) and any(b.time_ns <= now_ns for b in self._pending)

    def due_at(self, origin: float, interval: float, now: float, now_ns: int) -> float:
        """When this endpoint's next scrape is due (monotonic): its next tick, or a waiting boundary before it."""
        return min(origin + self.next_tick * interval, self.next_boundary_at(now, now_ns))

    def next_boundary_at(self, now: float, now_ns: int) -> float:
        if not self._pending:
            return math.inf
        return now + min(b.time_ns - now_ns for b in self._pending) / 1e9

    def record_lateness(self, lateness: float) -> None:
        if lateness < 0:
            return
        if len(self.tick_lateness_s) >= 4096:
            del self.tick_lateness_s[:2048]
        self.tick_lateness_s.append(lateness)

    def begin(self, start_ns: int, *, boundary: bool) -> None:
        """A scrape starts (under the group's lock): the boundaries at or before it are served by it."""
        self.began = self._monotonic()
        self.last_start_ns = start_ns
        self.in_flight_start_ns = start_ns
        self._in_flight_boundary = boundary
        self._in_flight_served = [b for b in self._pending if b.time_ns <= start_ns]
        self._pending = [b for b in self._pending if b.time_ns > start_ns]

    def end(self, outcome: FetchedPage | FetchError) -> bool:
        """The scrape's GET ended: stats, the callbacks, the ticks it covered, its boundaries."""
        start_ns = self.in_flight_start_ns or 0
        error: str | None = None
        try:
            if self.retired is not None:
                error = self.retired
            elif isinstance(outcome, FetchError):
                error = outcome.message
                self.stats.failures[outcome.kind] += 1
                self.stats.last_error, self.stats.last_error_ns = outcome.message, start_ns
                if self.stats.state != "down":
                    logger.warning("endpoint %s is down: %s", self.stats.url, outcome.message)
                self.stats.state = "down"
                self._safe(self.on_failure, outcome, start_ns)
            else:
                self.stats.scrapes += 1
                self.stats.last_success_ns = outcome.start_ns
                self.stats.refresh.observe(outcome.body, outcome.start_ns)
                if self.stats.state == "down":
                    logger.warning("endpoint %s is up again", self.stats.url)
                self.stats.state = "up"
                self._safe_page(outcome)
        finally:
            now = self._monotonic()
            self.stats.last_duration_s = now - self.began
            with self.group.cond:
                origin = self.group.origin
                if origin is not None:
                    # Ticks that passed while this scrape ran are missed, never queued; a boundary scrape
                    # serves the ticks that came due while it ran.
                    first_future = math.floor((now - origin) / self.group.interval_s) + 1
                    if not self._in_flight_boundary and first_future > self.next_tick:
                        self.stats.missed_ticks += first_future - self.next_tick
                    self.next_tick = max(self.next_tick, first_future)
                self.in_flight_start_ns = None
                served, self._in_flight_served = self._in_flight_served, []
        for boundary in served:
            boundary.finish(error)
        return error is None

    def _scrape_once(self) -> bool:
        """A scrape on the caller's thread while the group's thread does not run (the baseline before start, a
        phase mark's boundary meanwhile). One at a time per endpoint, so each begin is ended before the next and
        every boundary is served by a scrape that started after it; none once the group is stopped (the run's
        files are being closed: its record would come after the report)."""
        with self.alone:
            if self.group.stopped:
                with self.group.cond:
                    pending, self._pending = self._pending, []
                for boundary in pending:
                    boundary.finish("collection has stopped")
                return False
            if self._now_ns() // _MS == self.last_start_ns // _MS:  # (see MIN_START_GAP_S)
                time.sleep(MIN_START_GAP_S)
            with self.group.cond:
                self.begin(self._now_ns(), boundary=True)
            try:
                outcome: FetchedPage | FetchError = self.group.fetcher.fetch(self.url)
            except FetchError as exc:
                outcome = exc
            return self.end(outcome)

    def _safe(self, handler: FailureHandler, exc: FetchError, start_ns: int) -> None:
        try:
            handler(self.url, exc, start_ns)
        except Exception:  # a handler bug must not stop the loop; it is logged with its traceback
            logger.exception("failure handler raised for %s", self.stats.url)

    def _safe_page(self, page: FetchedPage) -> None:
        try:
            self.on_page(self.url, page)
        except Exception:
            logger.exception("page handler raised for %s", self.stats.url)
