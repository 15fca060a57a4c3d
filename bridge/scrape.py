"""The scrape loop: one thread per endpoint, on absolute ticks, never more than one scrape in flight.

A tick that finds the previous scrape still running is counted as missed, not queued (AIPerf fires
every tick without awaiting, so a stalled exporter piles up ~90 overlapping scrapes, §13.13).
Boundary scrapes (phase marks, completion) wake the loop at once: a scrape already in flight that
started at or after the boundary serves as the boundary sample, otherwise one starts as soon as the
in-flight one ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.endpoints import redact_url
from bridge.fetch import FetchedPage, Fetcher, FetchError

logger = logging.getLogger(__name__)


@dataclass
class EndpointStats:
    url: str  # redacted
    scrapes: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    missed_ticks: int = 0
    last_success_ns: int | None = None
    last_error: str | None = None
    last_error_ns: int | None = None
    state: str = "pending"  # pending | up | down | stopped
    last_duration_s: float | None = None
    lateness_s: list[float] = field(default_factory=list)  # recent tick lateness (bounded ring)

    def as_json(self) -> dict[str, object]:
        late = sorted(self.lateness_s)
        return {
            "url": self.url, "state": self.state, "scrapes": self.scrapes, "failures": dict(self.failures),
            "missed_ticks": self.missed_ticks, "last_success_ns": self.last_success_ns,
            "last_error": self.last_error, "last_error_ns": self.last_error_ns,
            "last_scrape_duration_s": self.last_duration_s,
            "tick_lateness_p99_s": late[min(len(late) - 1, int(len(late) * 0.99))] if late else None,
        }


class _Boundary:
    """A requested boundary scrape: done when a scrape started at or after `time_ns` has finished."""

    def __init__(self, time_ns: int) -> None:
        self.time_ns = time_ns
        self.done = threading.Event()
        self.error: str | None = None


PageHandler = Callable[[str, FetchedPage], None]
FailureHandler = Callable[[str, FetchError, int], None]


class ScrapeLoop:
    """Scrapes one endpoint every `interval_s` until stopped; hands pages and failures to callbacks."""

    def __init__(self, url: str, fetcher: Fetcher, interval_s: float, on_page: PageHandler,
                 on_failure: FailureHandler, *, monotonic: Callable[[], float] = time.monotonic,
                 now_ns: Callable[[], int] = time.time_ns) -> None:
        self.url = url
        self.fetcher = fetcher
        self.interval_s = interval_s
        self.on_page = on_page
        self.on_failure = on_failure
        self.stats = EndpointStats(redact_url(url))
        self._monotonic = monotonic
        self._now_ns = now_ns
        self._cond = threading.Condition()
        self._pending: list[_Boundary] = []
        self._in_flight_served: list[_Boundary] = []
        self._in_flight_start_ns: int | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.tick_lateness_s = self.stats.lateness_s  # bounded ring of recent lateness samples (bench, /status)

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"scrape {self.stats.url}", daemon=True)
        self._thread.start()

    def request_boundary(self, time_ns: int) -> _Boundary:
        boundary = _Boundary(time_ns)
        with self._cond:
            running = self._thread is not None and self._thread.is_alive() and not self._stopping
            if self._in_flight_start_ns is not None and self._in_flight_start_ns >= time_ns:
                self._in_flight_served.append(boundary)  # the scrape in flight started after the boundary
            else:
                self._pending.append(boundary)
                self._cond.notify()
        if not running:
            self._scrape_once()
        return boundary

    def stop(self, timeout: float | None = None) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        self.stats.state = "stopped" if self.stats.state != "down" else "down"

    def scrape_now(self) -> bool:
        """One synchronous scrape outside the loop (baseline); True when it succeeded."""
        return self._scrape_once()

    # -- loop ------------------------------------------------------------------------------------
    def _run(self) -> None:
        interval = self.interval_s
        origin = self._monotonic()
        tick = 0
        while True:
            with self._cond:
                boundary_due = False
                while not self._stopping:
                    delay = origin + tick * interval - self._monotonic()
                    if self._pending:
                        now_ns = self._now_ns()
                        boundary_due = any(b.time_ns <= now_ns for b in self._pending)
                        if boundary_due:
                            break
                        delay = min(delay, min(b.time_ns - now_ns for b in self._pending) / 1e9)
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
                if self._stopping:
                    return
                scheduled = origin + tick * interval
            lateness = self._monotonic() - scheduled
            if not boundary_due and lateness >= 0:
                self._record_lateness(lateness)
            self._scrape_once()
            # Ticks that passed while this scrape ran are missed, never queued. A boundary scrape
            # serves the ticks that came due while it ran.
            next_tick = int((self._monotonic() - origin) // interval) + 1
            if boundary_due:
                tick = max(tick, next_tick)
                continue
            if next_tick > tick + 1:
                self.stats.missed_ticks += next_tick - tick - 1
            tick = max(next_tick, tick + 1)

    def _record_lateness(self, lateness: float) -> None:
        if len(self.tick_lateness_s) >= 4096:
            del self.tick_lateness_s[:2048]
        self.tick_lateness_s.append(lateness)

    def _scrape_once(self) -> bool:
        start_ns = self._now_ns()
        began = self._monotonic()
        with self._cond:
            self._in_flight_start_ns = start_ns
            served = [b for b in self._pending if b.time_ns <= start_ns]
            self._pending = [b for b in self._pending if b.time_ns > start_ns]
            self._in_flight_served = served
        error: str | None = None
        try:
            page = self.fetcher.fetch(self.url)
        except FetchError as exc:
            error = exc.message
            self.stats.failures[exc.kind] += 1
            self.stats.last_error, self.stats.last_error_ns = exc.message, start_ns
            if self.stats.state != "down":
                logger.warning("endpoint %s is down: %s", self.stats.url, exc.message)
            self.stats.state = "down"
            self._safe(self.on_failure, exc, start_ns)
        else:
            self.stats.scrapes += 1
            self.stats.last_success_ns = page.start_ns
            if self.stats.state == "down":
                logger.warning("endpoint %s is up again", self.stats.url)
            self.stats.state = "up"
            self._safe_page(page)
        finally:
            self.stats.last_duration_s = self._monotonic() - began
            with self._cond:
                self._in_flight_start_ns = None
                served, self._in_flight_served = self._in_flight_served, []
        for boundary in served:
            boundary.error = error
            boundary.done.set()
        return error is None

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
