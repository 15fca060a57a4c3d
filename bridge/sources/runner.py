"""A local reader run like an exporter: `SourceFetcher` is the scrape loop's Fetcher for a source URL
(`pynvml://localhost`), so a `ScrapeGroup` of its own is the reader's thread, ticked on the collection interval
with the session's clocks. Its boundary scrapes (phase marks, the final one), missed ticks, health and /status are
the scrape loop's: nothing is written twice. Vendor calls can block (NVML waits on the driver), and they block
only this thread, never the HTTP endpoints' ticks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from bridge.errors import FetchError
from bridge.fetch import FetchedPage
from bridge.sources import AMDSMI_SOURCE, NVML_SOURCE, SourceError

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4"


class Reader(Protocol):
    source: str

    def read_page(self, now_ns: int) -> bytes: ...

    def close(self) -> None: ...


def open_reader(name: str) -> Reader:
    """`pynvml` or `amdsmi`, opened (its library started, its GPUs found); SourceError: one line naming the fix."""
    if name == "pynvml":
        from bridge.sources.nvml import NvmlReader

        return NvmlReader.open()
    if name == "amdsmi":
        from bridge.sources.amdsmi import AmdSmiReader

        return AmdSmiReader.open()
    raise SourceError(f"--gpu-telemetry {name}: not a local source (pynvml, amdsmi)")


class SourceFetcher:
    """A reader behind the Fetcher interface: `fetch(source URL)` is one page read now."""

    def __init__(self, reader: Reader, now_ns: Callable[[], int] = time.time_ns) -> None:
        self.reader = reader
        self.now_ns = now_ns

    def fetch(self, url: str) -> FetchedPage:
        if url not in (NVML_SOURCE, AMDSMI_SOURCE) or url != self.reader.source:
            raise FetchError("connect", f"{url}: not this reader's source ({self.reader.source})")
        start = self.now_ns()
        try:
            body = self.reader.read_page(start)
        except Exception as exc:  # a vendor library's error (NVMLError, AmdSmiException): the source is down
            raise FetchError("connect", f"{url}: {type(exc).__name__}: {exc}") from None
        return FetchedPage(body, start, self.now_ns(), CONTENT_TYPE)

    def close(self) -> None:
        try:
            self.reader.close()
        except Exception as exc:  # shutting a library down must not lose the run's files
            logger.warning("%s: closing the library failed: %s", self.reader.source, exc)
