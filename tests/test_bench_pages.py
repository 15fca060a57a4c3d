"""bench/_pages.py: the benches' pre-rendered pages are the simulator's, their counters keep growing past the ring,
and its page server serves them over keep-alive HTTP as dcgm-exporter would (what bench_peers' scrapers read)."""

from __future__ import annotations

import http.client
import runpy
import time
from pathlib import Path

from bridge.parse.lines import parse_page
from bridge.simulator import NodeModel, SimulatorConfig, render_page

BENCH = Path(__file__).parents[1] / "bench"
PAGES = runpy.run_path(str(BENCH / "_pages.py"), run_name="bench_pages")
PROCS = runpy.run_path(str(BENCH / "_procs.py"), run_name="bench_procs")
NS = 1_000_000_000
START = 1_750_000_000 * NS
STEP = NS // 3


def simulated(seed: int, gpus: int, k: int) -> bytes:
    """The simulator's own page of node `seed` at the k-th step (the truth the ring must reproduce)."""
    return render_page(NodeModel(SimulatorConfig(gpus=gpus, seed=seed), now_ns=lambda: START), START + k * STEP)


def series(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, float]]:
    page = parse_page(body)
    return {(s.name, tuple(sorted(s.labels.items()))): (page.types.get(s.name, "untyped"), s.value)
            for s in page.samples}


def test_the_first_cycle_is_the_simulators_pages_byte_for_byte() -> None:
    ring = PAGES["render_ring"](3, 2, START, STEP, 4)
    assert len(ring) == 4
    assert [ring.body(k) for k in range(4)] == [simulated(3, 2, k) for k in range(4)]


def test_past_the_ring_counters_grow_by_a_whole_ring_and_gauges_repeat() -> None:
    size = 4
    ring = PAGES["render_ring"](0, 2, START, STEP, size)
    first, after_ring = series(simulated(0, 2, 0)), series(simulated(0, 2, size))
    counters = [key for key, (kind, _) in first.items() if kind == "counter"]
    growing = [key for key in counters if after_ring[key][1] > first[key][1]]
    assert growing, "the simulator's energy counters grow over a ring"
    for n in (size + 1, 2 * size + 3, 7 * size + 2):
        cycles, k = divmod(n, size)
        truth, got = series(simulated(0, 2, k)), series(ring.body(n))
        assert got.keys() == truth.keys()
        for key, (kind, value) in truth.items():
            expected = value + cycles * (after_ring[key][1] - first[key][1]) if kind == "counter" else value
            assert got[key][1] == expected, key
    previous = series(ring.body(0))
    for n in range(1, 3 * size + 1):  # no counter ever goes back (no reset at the ring's seam)
        now = series(ring.body(n))
        assert all(now[key][1] >= previous[key][1] for key in counters)
        previous = now


def test_the_page_server_serves_each_node_its_pages_on_one_keep_alive_connection() -> None:
    proc, urls = PROCS["start_page_server"](2, 2)
    try:
        for seed, url in enumerate(urls):
            host, port = url.split("/")[2].split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            bodies = []
            deadline = time.monotonic() + 30
            while len(bodies) < 2 or bodies[-1] == bodies[0]:  # until the 100 ms tick has moved on
                assert time.monotonic() < deadline, "the page never changed"
                conn.request("GET", "/metrics")
                response = conn.getresponse()
                assert response.status == 200
                assert response.getheader("Content-Type") == "text/plain; charset=utf-8"  # as the simulator's
                bodies.append(response.read())
            assert conn.sock is not None  # still the first connection: keep-alive
            truth = series(simulated(seed, 2, 0))
            for body in (bodies[0], bodies[-1]):
                got = series(body)
                assert got.keys() == truth.keys()  # this node's GPUs (its seed's UUIDs), every family
            conn.request("GET", "/nope")
            response = conn.getresponse()
            assert response.status == 404 and response.read() == b"404 page not found\n"
            conn.close()
    finally:
        PROCS["stop"](proc)
