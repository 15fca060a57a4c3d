"""The floor the sidecar is measured against: a bare scrape loop on the same endpoints, in its own process.

One thread, libcurl's multi interface (as bridge/scrape.py uses it), a GET of every endpoint at each
absolute tick, the body split into lines, and nothing else: no parse, no records, no OTLP. What the sidecar
costs above this is the work it does with the pages (issue 18 asks for at most 1.5x this).

    python bench/_bare_scrape.py INTERVAL_S URL [URL ...]      (runs until SIGTERM)
"""

from __future__ import annotations

import io
import signal
import sys
import time

import pycurl


def main(argv: list[str]) -> int:
    interval, urls = float(argv[0]), argv[1:]
    stop = False

    def _stop(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    multi = pycurl.CurlMulti()
    handles = []
    for url in urls:
        handle = pycurl.Curl()
        handle.setopt(pycurl.URL, url)
        handle.setopt(pycurl.ENCODING, "gzip")
        handle.setopt(pycurl.TIMEOUT_MS, int(interval * 1000))
        handles.append(handle)
    lines = 0
    tick = time.monotonic()
    while not stop:
        buffers = []
        for handle in handles:
            buffer = io.BytesIO()
            handle.setopt(pycurl.WRITEDATA, buffer)
            buffers.append(buffer)
            multi.add_handle(handle)
        running = len(handles)
        while running:
            multi.select(0.1)
            while True:
                status, running = multi.perform()
                if status != pycurl.E_CALL_MULTI_PERFORM:
                    break
        for handle, buffer in zip(handles, buffers, strict=True):
            multi.remove_handle(handle)
            lines += len(buffer.getvalue().split(b"\n"))
        tick += interval
        time.sleep(max(0.0, tick - time.monotonic()))
    print(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
