"""How often the scrape thread drives libcurl: drives (`perform` calls) per wake-up over ticks of three GETs.

Each drive looks at every transfer in flight, so `CurlTransfers.wait` drives libcurl after its poll, and before
it only when GETs were added since the last drive: at most one drive per wait plus one per tick. A cost
tactic, not a behaviour a user sees, so it is measured here rather than pinned by a test (it was a test that
counted `perform` through a patched private attribute: tests/test_fetch.py before issue 29).

The server answers the tick's GETs 20, 40 and 60 ms after they arrive (further apart than the settle), so
each answer is a wake-up of its own.
"""

from __future__ import annotations

import os
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from _procs import verdict  # noqa: E402

from bridge.fetch import FetchError, FetchSettings, make_fetcher  # noqa: E402
from tests.loopback import LoopbackServer, send  # noqa: E402

PAGE = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 41\n' * 40
TICKS, GETS = 5, 3


class CountingMulti:
    """A libcurl multi handle that counts its drives (`perform`)."""

    def __init__(self, multi: object) -> None:
        self._multi = multi
        self.performs = 0

    def perform(self) -> tuple[int, int]:
        self.performs += 1
        return self._multi.perform()  # type: ignore[attr-defined, no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._multi, name)


def slow(handler: BaseHTTPRequestHandler) -> None:
    time.sleep(0.02 + 0.02 * int(handler.path.rpartition("=")[2]))
    send(handler, PAGE)


def main() -> None:
    with LoopbackServer(slow) as server:
        fetcher = make_fetcher(FetchSettings())
        transfers = fetcher.transfers()
        counting = transfers._multi = CountingMulti(transfers._multi)  # type: ignore[assignment]
        wake_read, wake_write = os.pipe()
        waits = pages = 0
        try:
            for _ in range(TICKS):
                for n in range(GETS):
                    transfers.begin(f"{server.url}?n={n}")
                ended = 0
                while ended < GETS:
                    waits += 1
                    got = transfers.wait(2.0, wake_read)
                    ended += len(got)
                    pages += sum(not isinstance(outcome, FetchError) for _, outcome in got)
        finally:
            transfers.cancel()
            fetcher.close()
            os.close(wake_read)
            os.close(wake_write)
    budget = waits + TICKS
    print(f"libcurl drives: {counting.performs} over {waits} waits and {TICKS} ticks of {GETS} GETs "
          f"({pages} pages); at most one per wait plus one per tick ({budget}): {verdict(counting.performs <= budget)}")


if __name__ == "__main__":
    main()
