"""The scrape path's HTTP client, chosen by measurement: CPU per GET of an 8-GPU page (~80 KB).

The simulated exporter runs in another process, as dcgm-exporter would; this process's CPU time
(time.process_time) is what the sidecar would pay. Ratios against libcurl (bridge.fetch.CurlFetcher,
the sidecar's client) come from the same run; urllib3 is the pool the sidecar used before, driven the
way it was (PoolManager, preload_content=False, streamed reads).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import urllib3

from bridge.fetch import FetchSettings, make_fetcher

GETS = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_ms_per_get(run) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        run()
        best = min(best, (time.process_time() - start) / GETS * 1000)
    return best


def main() -> int:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bridge.cli", "simulate", "--port", str(port), "--gpus", "8",
                               "--refresh-ms", "1000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                size = len(httpx.get(url, timeout=2).content)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        fetcher = make_fetcher(FetchSettings())
        ours = cpu_ms_per_get(lambda: [fetcher.fetch(url) for _ in range(GETS)])
        fetcher.close()
        pool = urllib3.PoolManager(maxsize=2, retries=False)

        def urllib3_get() -> bytes:
            response = pool.request("GET", url, headers={"Accept-Encoding": "gzip"}, preload_content=False,
                                    redirect=False)
            body = b"".join(response.stream(256 * 1024, decode_content=True))
            response.release_conn()
            return body

        pooled = cpu_ms_per_get(lambda: [urllib3_get() for _ in range(GETS)])
        with httpx.Client() as client:
            sync = cpu_ms_per_get(lambda: [client.get(url).content for _ in range(GETS)])

        async def async_gets() -> None:
            async with httpx.AsyncClient() as client:
                for _ in range(GETS):
                    (await client.get(url)).content  # noqa: B018 - read the body

        asynchronous = cpu_ms_per_get(lambda: asyncio.run(async_gets()))
    finally:
        server.terminate()
        server.wait(10)
    print(f"page: {size / 1024:.0f} KiB, {GETS} GETs per client, best of 3, CPU of this process")
    print(f"libcurl (pycurl, CurlFetcher, chosen)  {ours:6.3f} ms/GET   1.0x")
    print(f"urllib3 PoolManager                    {pooled:6.3f} ms/GET   {pooled / ours:4.1f}x libcurl")
    print(f"httpx.Client                           {sync:6.3f} ms/GET   {sync / ours:4.1f}x libcurl")
    print(f"httpx.AsyncClient                      {asynchronous:6.3f} ms/GET   {asynchronous / ours:4.1f}x libcurl")
    print(f"at 24 GET/s (8 endpoints at 3 Hz): libcurl {ours * 24:.0f}m CPU, urllib3 {pooled * 24:.0f}m, "
          f"httpx async {asynchronous * 24:.0f}m")
    return 0


if __name__ == "__main__":
    sys.exit(main())
