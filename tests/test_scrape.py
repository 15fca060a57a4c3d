"""The scrape loop's tick, hold and boundary rules: on a fake clock with scripted GETs (`ScrapeGroup`'s
`transfers` seam), with blocking fetchers, and on the running scrape thread over real HTTP."""

from __future__ import annotations

import math
import select
import threading
import time
from collections.abc import Callable

import pytest

from bridge.fetch import FetchedPage, Fetcher, Outcome
from bridge.record_log import read_records
from bridge.scrape import HOLD_S, ScrapeGroup, ScrapeLoop
from bridge.simulator import Fault, SimulatedExporter, SimulatorConfig
from tests.clock import FakeClock
from tests.conftest import wait_until
from tests.sidecar.helpers import session_for

# -- the loop's rules on a fake clock ------------------------------------------------------------------
Durations = dict[str, float | list[float]]  # url -> every GET's duration, or each GET's in turn


class ScriptedTransfers:
    """GETs that take `duration_s[url]` of the fake clock: a wait moves the clock to the next GET's end (or to
    its timeout) and returns the GETs that ended by then. The group is stopped once `stop_after` GETs ended."""

    def __init__(self, clock: FakeClock, duration_s: Durations, stop_after: int) -> None:
        self.clock, self.duration_s, self.stop_after = clock, duration_s, stop_after
        self.group: ScrapeGroup | None = None
        self.stopped = threading.Event()
        self.begun: list[tuple[str, float]] = []  # (url, clock) of every GET's start
        self.ends: dict[str, float] = {}  # url -> when its GET in flight ends
        self.ended = 0

    def begin(self, url: str) -> None:
        self.begun.append((url, self.clock.now))
        duration = self.duration_s[url]
        self.ends[url] = self.clock.now + (duration.pop(0) if isinstance(duration, list) else duration)

    @property
    def active(self) -> bool:
        return bool(self.ends)

    def wait(self, timeout_s: float, wake_fd: int) -> list[Outcome]:
        assert self.group is not None
        if self.ended >= self.stop_after and not self.group.stopped:
            self.group.stop()  # (from the scrape thread: it sets the flag and wakes the loop)
            self.stopped.set()
        if select.select([wake_fd], [], [], 0)[0]:
            return []  # a wake-up: the loop looks at once
        assert math.isfinite(timeout_s) or self.ends, "the loop would wait forever"
        self.clock.now = min([self.clock.now + timeout_s, *self.ends.values()])
        ended = [url for url, end in self.ends.items() if end <= self.clock.now]
        for url in ended:
            del self.ends[url]
        self.ended += len(ended)
        start = self.clock.now_ns()
        return [(url, FetchedPage(b"m 1\n", start, start, "text/plain")) for url in ended]

    def cancel(self) -> None:
        self.ends.clear()


PageHook = Callable[[ScrapeLoop, FakeClock], None]


def run_scripted(duration_s: Durations, interval_s: float, stop_after: int, on_page: PageHook = lambda *_: None,
                 ) -> tuple[ScriptedTransfers, dict[str, ScrapeLoop], list[tuple[str, float]]]:
    """Scrape `duration_s`'s endpoints on a fake clock until `stop_after` GETs ended; the loops, and every page
    handed over as (url, the fake clock then). `on_page` runs after each page is noted, on the scrape thread."""
    clock = FakeClock()
    transfers = ScriptedTransfers(clock, duration_s, stop_after)

    def scripted(fetcher: Fetcher) -> ScriptedTransfers:
        return transfers

    group = ScrapeGroup(Unused(), interval_s, monotonic=clock.monotonic, now_ns=clock.now_ns, transfers=scripted)
    transfers.group = group
    handed: list[tuple[str, float]] = []

    def page(url: str, _page: FetchedPage) -> None:
        handed.append((url, clock.now))
        on_page(loops[url], clock)

    loops = {url: ScrapeLoop(url, group.fetcher, interval_s, page, lambda *_: None, group=group) for url in duration_s}
    group.start()
    assert transfers.stopped.wait(10)
    group.stop(10)  # (waits for the thread, closes its wake-up pipe)
    assert not group.running
    return transfers, loops, handed


class Unused:
    def fetch(self, url: str) -> FetchedPage:
        raise AssertionError("the scripted transfers fetch")

    def close(self) -> None:
        pass


def test_ticks_that_pass_during_a_slow_scrape_are_missed_not_queued() -> None:
    transfers, loops, handed = run_scripted({"http://x/metrics": 0.35}, interval_s=0.1, stop_after=5)
    # Each GET spans 3.5 ticks: the next starts at the first tick after it ended, the three it covered are missed.
    assert [round(at, 6) for _, at in transfers.begun] == [0.0, 0.4, 0.8, 1.2, 1.6]
    assert len(handed) == 5
    assert loops["http://x/metrics"].stats.missed_ticks == 5 * 3


def test_ticks_keep_to_the_grid_when_scrapes_are_quick() -> None:
    transfers, loops, handed = run_scripted({"http://x/metrics": 0.01}, interval_s=0.5, stop_after=4)
    assert [round(at, 6) for _, at in transfers.begun] == [0.0, 0.5, 1.0, 1.5]
    assert loops["http://x/metrics"].stats.missed_ticks == 0 and len(handed) == 4


def test_a_ticks_pages_are_handed_over_together_once_its_last_get_has_ended() -> None:
    """Pages whose GETs end close together reach the pipeline one after another once the tick's last GET has
    ended (bridge/scrape.py HOLD_S), not each as its GET ends."""
    _, _, handed = run_scripted({"http://a/metrics": 0.001, "http://b/metrics": 0.005}, 0.5, stop_after=6)
    assert len(handed) == 6
    for tick in range(3):
        pair = handed[2 * tick:2 * tick + 2]
        assert {url for url, _ in pair} == {"http://a/metrics", "http://b/metrics"}
        assert [round(at, 6) for _, at in pair] == [round(0.5 * tick + 0.005, 6)] * 2


def test_a_slow_get_holds_the_others_pages_up_for_the_hold_at_most() -> None:
    """A GET that takes longer than HOLD_S holds up the pages of the tick's quicker GETs for HOLD_S, no longer;
    its own page follows when it ends."""
    _, _, handed = run_scripted({"http://a/metrics": 0.001, "http://slow/metrics": 0.3}, 0.5, stop_after=4)
    first_tick = [(url, round(at, 6)) for url, at in handed[:2]]
    assert first_tick == [("http://a/metrics", round(0.001 + HOLD_S, 6)), ("http://slow/metrics", 0.3)]


def test_a_boundary_between_ticks_is_scraped_at_once_and_serves_the_tick_that_comes_due_while_it_runs() -> None:
    """A phase mark between ticks wakes the loop: its scrape starts at once, not at the next tick; the tick that
    comes due while it runs is served by it (not missed), and the grid goes on after it."""
    boundaries = []

    def mark_after_the_first_page(loop: ScrapeLoop, clock: FakeClock) -> None:
        if not boundaries:
            boundaries.append(loop.request_boundary(clock.now_ns()))

    transfers, loops, _ = run_scripted({"http://x/metrics": [0.01, 0.6, 0.01]}, 0.5, stop_after=3,
                                       on_page=mark_after_the_first_page)
    assert [round(at, 6) for _, at in transfers.begun] == [0.0, 0.01, 1.0]
    assert boundaries[0].done.is_set() and boundaries[0].error is None
    assert loops["http://x/metrics"].stats.missed_ticks == 0


def test_pages_held_when_the_group_stops_are_handed_over() -> None:
    """The stop comes while the quick GET's page waits for the slow one: that page is handed over, the slow GET
    in flight is abandoned."""
    _, _, handed = run_scripted({"http://a/metrics": 0.001, "http://slow/metrics": 0.3}, 0.5, stop_after=1)
    assert handed == [("http://a/metrics", 0.001)]


def test_two_scrapes_of_an_endpoint_never_start_in_the_same_millisecond():
    """The baseline scrape at start-up is followed at once by tick 0, and boundary scrapes come at any time:
    a store keeps one sample per millisecond, so a second scrape in the same millisecond would be a duplicate
    sample (Prometheus refuses it). Here every fetch is instant."""
    class Instant:
        def fetch(self, url: str) -> FetchedPage:
            return FetchedPage(b"m 1\n", 0, 0, "text/plain")

        def close(self) -> None:
            pass

    starts: list[int] = []
    ref: list[ScrapeLoop] = []
    loop = ScrapeLoop("http://x/metrics", Instant(), 0.02, lambda u, p: starts.append(ref[0].last_start_ns),
                      lambda u, e, t: None)
    ref.append(loop)
    for _ in range(5):
        loop.scrape_now()  # synchronous, back to back
    loop.start()  # tick 0 at once, boundaries requested between ticks
    for _ in range(10):
        loop.request_boundary(time.time_ns()).done.wait(5)
    loop.stop(5)
    millis = [t // 1_000_000 for t in starts]
    assert len(starts) >= 10 and len(set(millis)) == len(millis)


def test_a_scrape_in_flight_that_started_after_the_boundary_serves_it():
    release = threading.Event()
    started = threading.Event()

    fetches = []

    class Blocking:
        def fetch(self, url: str) -> FetchedPage:
            fetches.append(url)
            started.set()
            release.wait(5)
            return FetchedPage(b"m 1\n", 0, 0, "text/plain")

        def close(self) -> None:
            pass

    now = [1000]
    loop = ScrapeLoop("http://x/metrics", Blocking(), 60.0, lambda u, p: None, lambda u, e, t: None,
                      now_ns=lambda: now[0])
    loop.start()
    assert started.wait(5)  # the first tick's scrape is in flight, started at t=1000
    boundary = loop.request_boundary(999)
    assert not boundary.done.is_set()
    release.set()
    assert boundary.done.wait(5) and boundary.error is None
    loop.stop(5)
    assert len(fetches) == 1  # no extra scrape was needed


# -- the one scrape thread, running, over real HTTP ----------------------------------------------------
@pytest.mark.slow
def test_a_slow_endpoint_never_holds_up_the_others_on_the_scrape_thread(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1, seed=1)) as slow, \
            SimulatedExporter(SimulatorConfig(gpus=1, seed=2)) as ok:
        session = session_for([slow.url, ok.url], tmp_path, collection_interval=0.05, scrape_timeout=5.0)
        session.configure()
        slow.add_fault(Fault("slow", delay_s=1.0))
        session.start()
        slow_loop, ok_loop = session.loops[slow.url], session.loops[ok.url]
        assert len({id(slow_loop.group), id(ok_loop.group)}) == 1  # one thread scrapes both
        started = time.monotonic()
        wait_until(lambda: ok_loop.stats.scrapes >= 1 + 20, 30.0, "20 scrapes of the healthy endpoint")
        took_s = time.monotonic() - started
        slow_done = slow_loop.stats.scrapes + sum(slow_loop.stats.failures.values())
        session.complete()  # waits for the slow scrape in flight: its missed ticks are reckoned when it ends
    # While the healthy endpoint was scraped 20 times (~1 s, longer on a busy machine), the slow one finished at
    # most one 1-second scrape per second that took, and the one in flight when the wait began: had it held the
    # thread up, 20 healthy scrapes would have taken 20 s. The ticks that came while it was in flight were missed,
    # not queued.
    assert slow_done <= 1 + math.ceil(took_s) + 1, (slow_done, took_s)
    assert slow_loop.stats.missed_ticks >= 5
    records = list(read_records(session.records.path))
    assert sum(r.telemetry_source_url == ok.url for r in records) >= 21


def test_a_phase_mark_between_ticks_scrapes_every_endpoint_at_once(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1, seed=1)) as first, \
            SimulatedExporter(SimulatorConfig(gpus=1, seed=2)) as second:
        session = session_for([first.url, second.url], tmp_path, collection_interval=300.0)
        session.configure()  # the baseline scrape
        session.start()  # tick 0; the next tick is 5 minutes away
        loops = list(session.loops.values())
        wait_until(lambda: all(loop.stats.scrapes == 2 for loop in loops), 30.0, "tick 0 on both endpoints")
        boundaries = [loop.request_boundary(time.time_ns()) for loop in loops]
        assert all(b.done.wait(10) and b.error is None for b in boundaries)
        assert [loop.stats.scrapes for loop in loops] == [3, 3]
        session.complete()


def test_a_phase_mark_after_completion_scrapes_nothing(tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        session.start()
        session.complete()
        loop = session.loops[exporter.url]
        scrapes = loop.stats.scrapes
        late = loop.request_boundary(time.time_ns())
    assert late.done.is_set() and late.error == "collection has stopped" and loop.stats.scrapes == scrapes



class _HeldFetcher:
    """Each GET waits for `release`; notes whether the loop's group had been stopped when one began."""

    def __init__(self) -> None:
        self.loop: ScrapeLoop | None = None
        self.after_stop = 0
        self.calls = 0
        self.fetching = threading.Event()
        self.release = threading.Event()

    def fetch(self, url: str) -> FetchedPage:
        assert self.loop is not None
        self.calls += 1
        self.after_stop += self.loop.group.stopped
        self.fetching.set()
        assert self.release.wait(10)
        return FetchedPage(b"m 1\n", time.time_ns(), time.time_ns(), "text/plain")

    def close(self) -> None:
        pass


def test_scrapes_on_callers_threads_take_turns_serve_every_boundary_and_stop_with_the_group():
    """Before the scrape thread starts (the baseline), a phase mark's boundary is scraped on its own thread while
    another scrape may run: each begin is ended before the next, so no boundary is left waiting, and a scrape
    that was waiting its turn when the group stopped does not run after it (its record would come after the
    report; a flaky CI run showed one)."""
    fetcher = _HeldFetcher()
    fetcher.release.set()
    loop = ScrapeLoop("http://x/metrics", fetcher, 0.1, lambda u, p: None, lambda u, e, t: None)
    fetcher.loop = loop
    boundaries: list = []
    threads = [threading.Thread(target=lambda: boundaries.append(loop.request_boundary(time.time_ns())))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    assert loop.scrape_now()
    for thread in threads:
        thread.join(5)
    assert len(boundaries) == 4 and all(b.done.is_set() and b.error is None for b in boundaries)
    fetcher.release.clear()
    fetcher.fetching.clear()
    late = [threading.Thread(target=lambda: boundaries.append(loop.request_boundary(time.time_ns())))
            for _ in range(3)]
    for thread in late:
        thread.start()
    assert fetcher.fetching.wait(5)  # one of them is scraping; the others wait their turn (or have not come yet)
    stopper = threading.Thread(target=loop.stop, args=(10,))
    stopper.start()
    wait_until(lambda: loop.group.stopped, 10.0, "the stop to be asked")  # (before the scrape in flight ends)
    fetcher.release.set()
    stopper.join(10)
    for thread in late:
        thread.join(5)
    assert fetcher.after_stop == 0
    assert all(b.done.is_set() for b in boundaries[4:]) and len(boundaries) == 7
