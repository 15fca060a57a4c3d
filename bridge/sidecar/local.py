"""Local sources: a reader on this node (NVML, AMD SMI) on a thread of its own, on the collection clock.

A local reader writes a Prometheus text page with DCGM field names itself (no exporter, no HTTP), under a
source name such as `pynvml://localhost`. `LocalSourceLoop` reads it at every tick of the collection
interval and hands the page to the pipeline exactly as the scrape loop hands a fetched one
(`Pipeline.on_page(name, page)`, bridge/samples.py `SourcePage`): parse, normalise, select (a local reader
and a local exporter that see the same GPUs are one source: bridge/select.py) and every sink are the same.
A failed read is a `FetchError` to `Pipeline.on_failure`, as a failed GET is.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

from bridge.errors import FetchError
from bridge.samples import LocalPage, SourcePage

logger = logging.getLogger(__name__)


class LocalReader(Protocol):
    """What a local source offers (bridge/sources/: NVML, AMD SMI)."""

    @property
    def name(self) -> str: ...  # the source name, e.g. "pynvml://localhost": its records' telemetry_source_url

    def read(self, sample_ns: int) -> bytes:
        """A Prometheus text page of the GPUs' values now (`sample_ns`: the wall-clock sample time); a read that
        fails raises FetchError with the reason."""
        ...

    def close(self) -> None: ...


PageHandler = Callable[[str, SourcePage], object]
FailureHandler = Callable[[str, FetchError, int], None]


class LocalSourceLoop:
    """One local reader, read on the ticks origin + k × interval (k = 0, 1, …) on a thread of its own; a tick
    that finds the previous read still running is skipped. `tick` is one read, for tests and boundaries."""

    def __init__(self, reader: LocalReader, interval_s: float, on_page: PageHandler, on_failure: FailureHandler,
                 *, monotonic: Callable[[], float] = time.monotonic, now_ns: Callable[[], int] = time.time_ns) -> None:
        self.reader = reader
        self.url = reader.name  # (the scrape loop's name for its source)
        self.interval_s = interval_s
        self.on_page = on_page
        self.on_failure = on_failure
        self.monotonic = monotonic
        self.now_ns = now_ns
        self.retired: str | None = None  # why it is read no more (a duplicate source: bridge/select.py)
        self.reads = 0
        self.failures = 0
        self._stop = threading.Event()
        self._alone = threading.Lock()
        self._thread: threading.Thread | None = None

    def tick(self) -> bool:
        """One read now, handed to the pipeline; True when it gave a page."""
        if self.retired is not None:
            return False
        with self._alone:
            start_ns = self.now_ns()
            try:
                body = self.reader.read(start_ns)
            except FetchError as exc:
                self.failures += 1
                self.on_failure(self.url, exc, start_ns)
                return False
            self.reads += 1
            self.on_page(self.url, LocalPage(body, start_ns, self.now_ns()))
            return True

    def retire(self, reason: str) -> None:
        self.retired = reason

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"source {self.url}", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.reader.close()

    def _run(self) -> None:
        origin = self.monotonic()
        tick = 0
        while not self._stop.wait(max(0.0, origin + tick * self.interval_s - self.monotonic())):
            if self.retired is not None:
                return
            try:
                self.tick()
            except Exception:  # a reader or handler bug must not end the source's thread; logged with its traceback
                logger.exception("reading %s failed", self.url)
            tick = max(tick + 1, math.floor((self.monotonic() - origin) / self.interval_s) + 1)  # late: skip ticks
