"""The scrape loop: every endpoint on one thread, on absolute ticks, never more than one scrape in flight
per endpoint.

At each tick every idle endpoint's GET starts at once (libcurl's multi interface: bridge/fetch.py) and the
tick's pages are handed to their callbacks on this thread together once its GETs have ended (or HOLD_S after
the first ended), so a slow or dead exporter never holds up the others and a tick costs one wake-up for all
endpoints, not one per endpoint (DECISIONS.md "Performance").
A tick that finds an endpoint's previous scrape still running is counted as missed for it, not queued
(AIPerf fires every tick without awaiting, so a stalled exporter piles up ~90 overlapping scrapes, §13.13).
Boundary scrapes (phase marks, completion) wake the loop at once: a scrape already in flight that
started at or after the boundary serves as the boundary sample, otherwise one starts as soon as the
in-flight one ends.

The loop only schedules and fetches: what the endpoints' answers say about them (up, down, unreadable, the
refresh cadence) is bridge/health.py's, fed by the pipeline; the loop reports its own schedule there (missed
ticks, lateness, scrape duration).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable

from bridge.fetch import FetchedPage, Fetcher, FetchError, Outcome, Transfers, transfers_of
from bridge.health import EndpointStats, Health

logger = logging.getLogger(__name__)


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
# would have cleared (measured in bench/NOTES.md); a slow endpoint holds the others' pages up for that long
# at most, never a tick.
HOLD_S = 0.02
_MS = 1_000_000

PageHandler = Callable[[str, FetchedPage], None]
FailureHandler = Callable[[str, FetchError, int], None]
TransfersFactory = Callable[[Fetcher], Transfers]


class _HeldPages:
    """The ended GETs of a tick whose pages wait for the tick's other GETs (see HOLD_S)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.outcomes: list[Outcome] = []
        self.since: float | None = None  # when the first of them ended

    def add(self, ended: list[Outcome], now: float) -> None:
        if ended:
            self.outcomes += ended
            if self.since is None:
                self.since = now

    def deadline(self) -> float:
        """When the held pages must be handed over even if other GETs are still in flight."""
        return math.inf if self.since is None else self.since + self.hold_s

    def due(self, now: float, *, in_flight: bool, woken: bool) -> bool:
        """Hand them over now: the tick's last GET has ended, the hold is over, or a wake-up (a boundary, the
        stop) asks for them at once."""
        if self.since is None:
            return False
        return not in_flight or woken or now >= self.deadline()

    def take(self) -> list[Outcome]:
        outcomes, self.outcomes, self.since = self.outcomes, [], None
        return outcomes


class ScrapeGroup:
    """The scrape thread: drives the GETs of all its endpoints (`ScrapeLoop`s) on one shared tick grid.

    `transfers` makes what drives the GETs from the fetcher (tests inject a scripted one)."""

    def __init__(self, fetcher: Fetcher, interval_s: float, *, monotonic: Callable[[], float] = time.monotonic,
                 now_ns: Callable[[], int] = time.time_ns, transfers: TransfersFactory = transfers_of) -> None:
        self.fetcher = fetcher
        self.interval_s = interval_s
        self.monotonic = monotonic
        self.now_ns = now_ns
        self.loops: dict[str, ScrapeLoop] = {}
        self.cond = threading.Condition()
        self.origin: float | None = None  # monotonic time of tick 0, once running
        self._transfers_of = transfers
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
        transfers = self._transfers_of(self.fetcher)
        try:
            self._loop(transfers)
        finally:
            transfers.cancel()  # GETs still in flight at stop are abandoned, their handles released

    def _loop(self, transfers: Transfers) -> None:
        """Until stopped: start the scrapes that are due, wait for GETs to end, hand their pages over by tick."""
        self.origin = self.monotonic()
        held = _HeldPages(min(HOLD_S, self.interval_s / 10))
        look_at = -math.inf  # when the schedule is next due a look: a tick, a start gap, a boundary
        woken = True
        while True:
            # (most wake-ups are a GET's bytes, with nothing to schedule)
            if woken or self.monotonic() >= look_at:
                looked = self._start_due(transfers)
                if looked is None:  # stopping
                    self._hand_over(held.take())  # pages that ended before the stop are kept
                    return
                look_at = looked
            until = min(look_at, held.deadline())
            # (no local keeps the ended GETs: their pages, 80 KB each, would stay until the next wake-up, a tick)
            held.add(transfers.wait(max(0.0, until - self.monotonic()), self._wake_read), self.monotonic())
            woken = self._take_wake_up()
            if held.due(self.monotonic(), in_flight=transfers.active, woken=woken):
                look_at = min(look_at, self._hand_over(held.take()))

    def _take_wake_up(self) -> bool:
        """Whether a wake-up (a boundary, the stop) came since the last look; empties the pipe if so (most
        returns from a wait are a GET's bytes or a tick: no syscall to find the pipe empty)."""
        if not self._woken:
            return False
        self._woken = False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_read, 4096):
                pass
        return True

    def _start_due(self, transfers: Transfers) -> float | None:
        """Begin the scrapes that are due; when to look again, or None once stopping."""
        starts: list[ScrapeLoop] = []
        interval = self.interval_s
        origin = self.origin
        assert origin is not None
        with self.cond:
            if self._stopping:
                return None
            now, now_ns = self.monotonic(), self.now_ns()
            current = math.floor((now - origin) / interval)
            look_at = now + interval
            for loop in self.loops.values():
                if loop.in_flight is not None or loop.retired is not None:
                    continue  # its tick is reckoned when its GET ends; a retired endpoint is not scraped
                if now - loop.began < MIN_START_GAP_S:  # its previous scrape started under a millisecond ago
                    look_at = min(look_at, loop.began + MIN_START_GAP_S)
                elif loop.boundary_due(now_ns):
                    loop.begin(now_ns, boundary=True)
                    starts.append(loop)
                elif loop.next_tick <= current:
                    loop.begin_tick(current, now - (origin + current * interval), now_ns)
                    starts.append(loop)
                else:
                    look_at = min(look_at, loop.due_at(origin, interval, now, now_ns))
        for loop in starts:
            transfers.begin(loop.url)
        return look_at

    def _hand_over(self, ended: list[Outcome]) -> float:
        """The ended GETs' pages and failures to their endpoints; when the earliest of those endpoints is due
        again (its next tick or a boundary that came while it was in flight: the last look skipped it)."""
        for url, outcome in ended:
            self.loops[url].end(outcome)
        if not ended or self.origin is None:
            return math.inf
        with self.cond:
            now, now_ns = self.monotonic(), self.now_ns()
            return min(self.loops[url].due_at(self.origin, self.interval_s, now, now_ns) for url, _ in ended)


class _InFlight:
    """An endpoint's scrape in flight: when it started, and the boundaries it serves."""

    __slots__ = ("start_ns", "boundary", "serves")

    def __init__(self, start_ns: int, boundary: bool, serves: list[_Boundary]) -> None:
        self.start_ns = start_ns
        self.boundary = boundary  # a boundary scrape (not a tick's): the ticks that pass meanwhile are not missed
        self.serves = serves


class ScrapeLoop:
    """One endpoint: its schedule and its boundaries. Scraped by its `ScrapeGroup`'s thread (its own group when
    none is given); hands pages and failures to callbacks on that thread; its schedule's health (missed ticks,
    lateness, duration) goes to `stats` (bridge/health.py), whose owner feeds the rest."""

    def __init__(self, url: str, fetcher: Fetcher, interval_s: float, on_page: PageHandler,
                 on_failure: FailureHandler, *, monotonic: Callable[[], float] = time.monotonic,
                 now_ns: Callable[[], int] = time.time_ns, group: ScrapeGroup | None = None,
                 stats: EndpointStats | None = None) -> None:
        self.url = url
        self.on_page = on_page
        self.on_failure = on_failure
        self.stats = stats if stats is not None else Health().of(url)
        # The group's fetcher, interval and clocks are the loop's: a given group must have been made with these.
        self.group = group or ScrapeGroup(fetcher, interval_s, monotonic=monotonic, now_ns=now_ns)
        self._monotonic = self.group.monotonic
        self._now_ns = self.group.now_ns
        self.group.loops[url] = self
        self._pending: list[_Boundary] = []  # requested boundaries no scrape has started after yet
        self.in_flight: _InFlight | None = None
        self.began = -math.inf  # monotonic time the latest scrape started
        self.last_start_ns = 0
        self.next_tick = 0  # the next tick of the group's grid this endpoint is scraped at
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
            if self.in_flight is not None and self.in_flight.start_ns >= time_ns:
                self.in_flight.serves.append(boundary)  # the scrape in flight started after the boundary
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
            self.stats.retired()
            pending, self._pending = self._pending, []
        for boundary in pending:
            boundary.finish(reason)

    def stop(self, timeout: float | None = None) -> None:
        """Stops the whole group (every endpoint on its thread)."""
        self.group.stop(timeout)
        self.stats.stopped()

    def scrape_now(self) -> bool:
        """One scrape now, waited for (the baseline: before the loop starts); True when it succeeded."""
        if self.retired is not None:  # a duplicate source is not scraped
            return False
        if self.group.running:  # the group's thread owns the endpoint's connection: ask it
            boundary = self.request_boundary(self._now_ns())
            return boundary.done.wait(600) and boundary.error is None
        return self._scrape_once()

    # -- the group's side (under its lock where noted) ----------------------------------------------
    def boundary_due(self, now_ns: int) -> bool:
        return any(b.time_ns <= now_ns for b in self._pending)

    def due_at(self, origin: float, interval: float, now: float, now_ns: int) -> float:
        """When this endpoint's next scrape is due (monotonic): its next tick, or a waiting boundary before it."""
        return min(origin + self.next_tick * interval, self.next_boundary_at(now, now_ns))

    def next_boundary_at(self, now: float, now_ns: int) -> float:
        if not self._pending:
            return math.inf
        return now + min(b.time_ns - now_ns for b in self._pending) / 1e9

    def begin_tick(self, tick: int, lateness_s: float, start_ns: int) -> None:
        """The scrape of grid tick `tick` starts (under the group's lock), `lateness_s` after the tick; the
        ticks before it since the last scrape were missed (this thread was held up)."""
        if tick > self.next_tick:
            self.stats.missed(tick - self.next_tick)
        self.stats.late(lateness_s)
        self.next_tick = tick + 1
        self.begin(start_ns, boundary=False)

    def begin(self, start_ns: int, *, boundary: bool) -> None:
        """A scrape starts (under the group's lock): the boundaries at or before it are served by it."""
        self.began = self._monotonic()
        self.last_start_ns = start_ns
        served = [b for b in self._pending if b.time_ns <= start_ns]
        self._pending = [b for b in self._pending if b.time_ns > start_ns]
        self.in_flight = _InFlight(start_ns, boundary, served)

    def end(self, outcome: FetchedPage | FetchError) -> bool:
        """The scrape's GET ended: the callbacks, the ticks it covered, its boundaries."""
        in_flight = self.in_flight
        assert in_flight is not None
        error = outcome.message if isinstance(outcome, FetchError) else None
        try:
            if self.retired is not None:
                error = self.retired
            elif isinstance(outcome, FetchError):
                self._safe(self.on_failure, outcome, in_flight.start_ns)
            else:
                self._safe_page(outcome)
        finally:
            now = self._monotonic()
            self.stats.took(now - self.began)
            with self.group.cond:
                self._reckon_ticks(now, in_flight)
                self.in_flight = None
        for boundary in in_flight.serves:
            boundary.finish(error)
        return error is None

    def _reckon_ticks(self, now: float, in_flight: _InFlight) -> None:
        """Ticks that passed while this scrape ran are missed, never queued; a boundary scrape serves the ticks
        that came due while it ran."""
        origin = self.group.origin
        if origin is None:  # (a scrape before the group's thread started: no grid yet)
            return
        first_future = math.floor((now - origin) / self.group.interval_s) + 1
        if first_future > self.next_tick and not in_flight.boundary:
            self.stats.missed(first_future - self.next_tick)
        self.next_tick = max(self.next_tick, first_future)

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
