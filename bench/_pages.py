"""Pre-rendered dcgm-exporter pages for the benches: a ring per endpoint whose counters keep growing.

The simulator renders an 8-GPU page in milliseconds of Python; a bench that needs hundreds of pages a second
(bench_peers at 64 × 8 GPUs: four scrapers at 3 Hz, 768 pages a second) or a simulated hour of them
(bench_longrun) renders a ring of pages once and hands them out in turn. Each page is the simulator's own
rendering (bridge.simulator.render_page) at consecutive instants; after the ring it starts again with every
counter (the families the page TYPEs `counter`) grown by what one ring adds, so the counters grow as a GPU's do
(no reset each cycle) and the gauges repeat.

- `PageRing`: one endpoint's ring; `body(n)` is its n-th page.
- `PrerenderedFetcher`: the sidecar's fetch seam over rings, stamped with a (manual) clock (the accelerated
  benches: no HTTP).
- `python bench/_pages.py PORT ENDPOINTS GPUS`: one process, one thread, serving `ENDPOINTS` rings on ports
  PORT.. over HTTP/1.1 keep-alive (asyncio), the page of the current `STEP_MS` tick, so every scraper reads the
  same changing page at the same instant, as from one dcgm-exporter (bench_peers: the page server's CPU must not
  starve the scrapers it serves).
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bridge.fetch import FetchedPage  # noqa: E402
from bridge.simulator import NodeModel, SimulatorConfig, render_page  # noqa: E402
from bridge.simulator.schema import DIALECTS  # noqa: E402

NS = 1_000_000_000
STEP_MS = 100  # the server's page changes every 100 ms (DCGM's own update cadence), under any scraper's interval
RING = 10  # pages per endpoint in the server's ring
COUNTER_TYPE = re.compile(rb"^# TYPE (\S+) counter$", re.MULTILINE)


def render_ring(seed: int, gpus: int, start_ns: int, step_ns: int, size: int, mig: int = 0) -> PageRing:
    """`size` pages of the simulator's node `seed`, `step_ns` apart from `start_ns` (and one more, which measures
    what a ring adds to each counter)."""
    config = SimulatorConfig(gpus=gpus, seed=seed, mig=mig)
    model = NodeModel(config, now_ns=lambda: start_ns)
    return PageRing([render_page(model, start_ns + k * step_ns) for k in range(size + 1)],
                    DIALECTS[config.dialect].content_type)


class PageRing:
    """Pages `bodies[:-1]` in turn, then again with each counter grown by `bodies[-1]`'s value less `bodies[0]`'s.

    Each page is held as its text between counter values (`parts`) and those values (`values`): a page after the
    first cycle is the parts joined around the values plus the cycles' growth."""

    def __init__(self, bodies: list[bytes], content_type: str) -> None:
        self.content_type = content_type  # the simulator's (Go's sniffed `text/plain; charset=utf-8`)
        counters = set(COUNTER_TYPE.findall(bodies[0]))
        split = [_split(body, counters) for body in bodies]
        self.parts = [parts for parts, _, _ in split[:-1]]
        self.values = [values for _, values, _ in split[:-1]]
        first, last = dict(zip(split[0][2], split[0][1], strict=True)), dict(zip(split[-1][2], split[-1][1],
                                                                                strict=True))
        self.growth = [[last.get(key, value) - first.get(key, value) for key, value in zip(keys, values,
                                                                                           strict=True)]
                       for _, values, keys in split[:-1]]

    def __len__(self) -> int:
        return len(self.parts)

    @property
    def nbytes(self) -> int:
        """The bytes of text the ring holds (what a bench takes off its own RSS figures)."""
        return sum(len(part) for parts in self.parts for part in parts)

    def body(self, n: int) -> bytes:
        cycle, page = divmod(n, len(self.parts))
        parts, values, growth = self.parts[page], self.values[page], self.growth[page]
        out = [parts[0]]
        for part, value, added in zip(parts[1:], values, growth, strict=True):
            out.append(b"%d" % (value + cycle * added))
            out.append(part)
        return b"".join(out)


def _split(body: bytes, counters: set[bytes]) -> tuple[list[bytes], list[int], list[bytes]]:
    """(the text between counter values, the values, each value's series: its line up to the value)."""
    parts: list[bytes] = []
    values: list[int] = []
    keys: list[bytes] = []
    at = 0
    line_start = 0
    while line_start < len(body):
        end = body.find(b"\n", line_start)
        end = len(body) if end < 0 else end
        line = body[line_start:end]
        name = re.split(rb"[{ ]", line, maxsplit=1)[0]
        if name in counters and not line.startswith(b"#"):
            space = body.rfind(b" ", line_start, end)
            value = body[space + 1:end]
            if value.isdigit():
                parts.append(body[at:space + 1])
                values.append(int(value))
                keys.append(body[line_start:space])
                at = end
        line_start = end + 1
    parts.append(body[at:])
    return parts, values, keys


class PrerenderedFetcher:
    """The sidecar's fetcher over rings: each endpoint's next page, stamped with `clock` (no HTTP)."""

    def __init__(self, rings: dict[str, PageRing], clock: Callable[[], int]) -> None:
        self.rings = rings
        self.clock = clock
        self.count = dict.fromkeys(rings, 0)

    def fetch(self, url: str) -> FetchedPage:
        n = self.count[url]
        self.count[url] = n + 1
        now = self.clock()
        return FetchedPage(self.rings[url].body(n), now, now + 2_000_000, "text/plain; version=0.0.4")

    def close(self) -> None:
        pass


# -- the page server -----------------------------------------------------------------------------------------
HEAD = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nX-Content-Type-Options: nosniff\r\nContent-Length: %d\r\n\r\n"


class _Endpoint:
    """One ring behind one port: the page of the current tick, rendered once for every scraper of that tick."""

    def __init__(self, ring: PageRing, origin_ns: int, step_ns: int) -> None:
        self.ring, self.origin_ns, self.step_ns = ring, origin_ns, step_ns
        self.last: tuple[int, bytes] = (-1, b"")

    def page(self) -> bytes:
        tick = (time.monotonic_ns() - self.origin_ns) // self.step_ns
        if self.last[0] != tick:
            body = self.ring.body(tick)
            self.last = (tick, HEAD % (200, b"OK", self.ring.content_type.encode(), len(body)) + body)
        return self.last[1]


class _Http(asyncio.Protocol):
    def __init__(self, endpoint: _Endpoint) -> None:
        self.endpoint = endpoint
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            request, self.buffer = self.buffer[:end], self.buffer[end + 4:]
            line = request.split(b"\r\n", 1)[0].split()
            path = line[1].split(b"?", 1)[0] if len(line) > 1 else b""
            assert self.transport is not None
            if path == b"/metrics":
                self.transport.write(self.endpoint.page())
            else:
                self.transport.write(HEAD % (404, b"Not Found", b"text/plain; charset=utf-8", 19)
                                     + b"404 page not found\n")
            if b"\r\nconnection: close" in request.lower():
                self.transport.close()
                return


async def serve(port: int, endpoints: int, gpus: int) -> None:
    step_ns = STEP_MS * 1_000_000
    rings = [render_ring(seed, gpus, time.time_ns(), step_ns, RING) for seed in range(endpoints)]
    origin = time.monotonic_ns()
    loop = asyncio.get_running_loop()
    for i, ring in enumerate(rings):
        endpoint = _Endpoint(ring, origin, step_ns)
        await loop.create_server(lambda e=endpoint: _Http(e), "127.0.0.1", port + i)  # type: ignore[misc]
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
