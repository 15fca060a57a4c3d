"""The sidecar beside the scrapers a cluster already runs (issue 48): Prometheus 2.53 in agent mode and vmagent 1.112.

At each load (`--loads`, endpoints × `--gpus` GPUs), four scrapers take the same pages at 3 Hz in the same window,
each forwarding what it scraped. The pages are the simulator's, pre-rendered in rings whose counters keep growing
(bench/_pages.py: one process, keep-alive, a new page every 100 ms; `--live-simulator` renders each request
instead, which at 64 endpoints costs more CPU than the four scrapers and starves them on a 2-CPU machine):

- `dcgm-bridge sidecar`, OTLP/HTTP to a loopback receiver (bench/_procs.py's sink, answering 200);
- `prometheus --enable-feature=agent` and `vmagent`, remote write to a loopback sink answering 204, configured by
  bench/peers/*.yml (their documented settings for scrape-and-forward: 333 ms interval, remote write; the bench
  fills in only the targets file and the sink's URL);
- the bare libcurl loop (bench/_bare_scrape.py): GET and split lines, nothing forwarded (the floor).

Each one's CPU (millicores, from its CPU clock, after the first minute or a quarter of the window) and RSS at 1, 5
and 10 minutes (those within `--minutes`), and the sidecar's ratios to each peer. To judge the window: the load
average before and after, the CPU of the bench's own servers (pages, sinks) and the whole machine's busy CPU over
the window (another program's share starves the peers first). Guard (issue 48): the sidecar's
CPU at most 0.3x the cheaper peer's, at every load. The peers are found where `make servers` links them
(~/.cache/dcgm-bridge/bin, scripts/install-metrics-stores.sh).

    .venv/bin/python bench/bench_peers.py [--minutes 10] [--loads 8,64] [--gpus 8] [--live-simulator]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _procs as procs  # noqa: E402

CACHE = Path(os.environ.get("DCGM_BRIDGE_CACHE", Path.home() / ".cache" / "dcgm-bridge"))
CONFIGS = Path(__file__).resolve().parent / "peers"
GUARD_RATIO = 0.3
NAMES = ("sidecar", "prometheus agent", "vmagent", "bare loop")
# What each peer's own /metrics counts: scrapes attempted, scrapes failed (the Prometheus agent's summary counts
# one per scrape after a target's first; it exposes no failure count). The sidecar's are read from /status: its
# /metrics is the pull endpoint, a 6 MB page at 64 x 8 GPUs whose one rendering leaves ~5-10 MiB in its RSS (a
# cost of serving Prometheus, not of forwarding OTLP, which is what this bench compares).
SCRAPE_COUNTERS = (("prometheus_target_interval_length_seconds_count", None),
                   ("vm_promscrape_scrapes_total", "vm_promscrape_scrapes_failed_total"))

# A remote-write receiver in its own process: reads each POST and answers 204 (its CPU is no scraper's).
# On SIGTERM it prints the requests and bytes it received (that the peer did forward what it scraped).
RW_SINK = """
import os, signal, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
got = [0, 0]
lock = threading.Lock()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        with lock:
            got[0] += 1
            got[1] += n
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
def stop(*_):
    print(got[0], got[1], flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def start_rw_sink() -> tuple[subprocess.Popen[bytes], str]:
    port = procs.free_port()
    proc = subprocess.Popen([sys.executable, "-c", RW_SINK, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    procs.wait_for_port(port, proc)
    return proc, f"http://127.0.0.1:{port}/api/v1/write"


def busy_cpus() -> float:
    """The machine's busy CPU-seconds so far, all processes (/proc/stat: everything but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / procs.TICK


def scrape_counts(metrics_urls: list[str]) -> list[tuple[float, float]]:
    """(scrapes, failed scrapes) so far: `metrics_urls` the sidecar's /status, then the Prometheus agent's and vmagent's
    /metrics."""
    endpoints = json.loads(procs.get(metrics_urls[0])[1])["endpoints"]  # the sidecar's, each with its counts
    failed = sum(sum(e["failures"].values()) for e in endpoints)
    counts = [(sum(e["scrapes"] for e in endpoints) + failed, failed)]
    for url, names in zip(metrics_urls[1:], SCRAPE_COUNTERS, strict=True):
        totals = dict.fromkeys(n for n in names if n is not None)
        sums = dict.fromkeys(totals, 0.0)
        for line in procs.get(url)[1].decode(errors="replace").splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in sums:
                sums[name] += float(line.rsplit(" ", 1)[1])
        counts.append((sums[names[0]], sums[names[1]] if names[1] else 0.0))
    return counts


def received(sink: subprocess.Popen[bytes]) -> tuple[int, int]:
    """(requests, bytes) a remote-write sink received, read as it stops."""
    procs.stop(sink)
    words = (sink.stdout.read() if sink.stdout else b"").split()
    return (int(words[0]), int(words[1])) if len(words) == 2 else (0, 0)


def peer_config(name: str, out: Path, targets: Path, rw_url: str) -> Path:
    text = (CONFIGS / name).read_text().replace("TARGETS_FILE", json.dumps(str(targets))) \
        .replace("REMOTE_WRITE_URL", rw_url)
    path = out / name
    path.write_text(text)
    return path


def binary(name: str) -> str:
    path = CACHE / "bin" / name
    if not path.exists():
        sys.exit(f"bench_peers: {path} is missing; run `make servers` (scripts/install-metrics-stores.sh)")
    return str(path)


def start_scrapers(urls: list[str], otlp_url: str, rw_urls: tuple[str, str], out: Path,
                   log: object) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    """The four scrapers, each on every URL: the sidecar, the Prometheus agent, vmagent, the bare loop; and the
    URLs the first three count their scrapes at."""
    targets = out / "targets.json"
    targets.write_text(json.dumps([{"targets": [u.split("/")[2] for u in urls]}]))
    port = procs.free_port()
    env = {**os.environ, "DCGM_BRIDGE_HEALTH_HOST": "127.0.0.1", "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]",
           "AIPERF_GPU_COLLECTION_INTERVAL": "0.333"}
    sidecar = subprocess.Popen([sys.executable, "-m", "bridge.cli", "sidecar", "--health-port", str(port),
                                "--artifact-dir", str(out / "artifacts"), "--run-id", "peers", "--otlp-endpoint",
                                otlp_url, *[a for u in urls for a in ("--gpu-telemetry", u)]],
                               cwd=procs.ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)  # type: ignore[arg-type]
    procs.wait_for(f"http://127.0.0.1:{port}/readyz", 180, sidecar)
    prom_port, vm_port = procs.free_port(), procs.free_port()
    prometheus = subprocess.Popen(
        [binary("prometheus"), "--enable-feature=agent",
         f"--config.file={peer_config('prometheus-agent.yml', out, targets, rw_urls[0])}",
         f"--storage.agent.path={out / 'prometheus-wal'}", f"--web.listen-address=127.0.0.1:{prom_port}",
         "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=log)  # type: ignore[arg-type]
    vmagent = subprocess.Popen(
        [binary("vmagent"), f"-promscrape.config={peer_config('vmagent-scrape.yml', out, targets, rw_urls[1])}",
         f"-remoteWrite.url={rw_urls[1]}", f"-remoteWrite.tmpDataPath={out / 'vmagent-data'}",
         f"-httpListenAddr=127.0.0.1:{vm_port}", "-loggerLevel=WARN"],
        stdout=subprocess.DEVNULL, stderr=log)  # type: ignore[arg-type]
    procs.wait_for(f"http://127.0.0.1:{prom_port}/-/ready", 60, prometheus)
    procs.wait_for(f"http://127.0.0.1:{vm_port}/health", 60, vmagent)
    bare = subprocess.Popen([sys.executable, str(procs.ROOT / "bench" / "_bare_scrape.py"), "0.333", *urls],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = [f"http://127.0.0.1:{port}/status", *(f"http://127.0.0.1:{p}/metrics" for p in (prom_port, vm_port))]
    return [sidecar, prometheus, vmagent, bare], metrics


def run_load(endpoints: int, gpus: int, minutes: float, live: bool = False) -> dict[str, object]:
    load0 = os.getloadavg()
    sims, urls = (procs.start_simulators if live else procs.start_page_server)(endpoints, gpus)
    otlp_sink, otlp_url = procs.start_otlp_sink()
    rw_sinks, rw_urls = zip(start_rw_sink(), start_rw_sink(), strict=True)  # the Prometheus agent's, vmagent's
    out = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    scrapers: list[subprocess.Popen[bytes]] = []
    seconds = minutes * 60.0
    warm_s = min(60.0, seconds / 4)
    marks = sorted({*(m * 60.0 for m in (1, 5, 10) if m * 60.0 <= seconds), seconds})
    cpu: dict[float, list[float]] = {}
    machine: dict[float, float] = {}
    rss: dict[float, list[float]] = {}
    scrapes: dict[float, list[tuple[float, float]]] = {}
    try:
        with (out / "scrapers.log").open("wb") as log:
            scrapers, metrics = start_scrapers(urls, otlp_url, (rw_urls[0], rw_urls[1]), out, log)
            began = time.monotonic()
            for at in sorted({warm_s, *marks}):
                time.sleep(max(0.0, began + at - time.monotonic()))
                cpu[at] = [procs.cpu_seconds(p.pid) for p in (*scrapers, sims, otlp_sink, *rw_sinks)]
                machine[at] = busy_cpus()
                scrapes[at] = scrape_counts(metrics)
                rss[at] = [procs.rss_mib(p.pid) for p in scrapers]
                for p in scrapers:
                    if p.poll() is not None:
                        tail = (out / "scrapers.log").read_text()[-2000:]
                        raise RuntimeError(f"{p.args[0]} exited with {p.returncode}: {tail}")
    finally:
        for p in scrapers:
            procs.stop(p)
        forwarded = [received(sink) for sink in rw_sinks]
        for p in (sims, otlp_sink):
            procs.stop(p)
        shutil.rmtree(out, ignore_errors=True)
    window = seconds - warm_s
    millicores = [(b - a) / window * 1000 for a, b in zip(cpu[warm_s], cpu[seconds], strict=True)]
    return {"endpoints": endpoints, "gpus": gpus, "minutes": minutes, "millicores": millicores[:len(NAMES)],
            "harness": millicores[len(NAMES):], "machine": (machine[seconds] - machine[warm_s]) / window * 1000,
            "rss": {at / 60.0: r for at, r in rss.items() if at in marks}, "load": (load0, os.getloadavg()),
            "warm_s": warm_s, "forwarded": forwarded,
            "scrapes": [((b - a) / window, (bf - af) / window)
                        for (a, af), (b, bf) in zip(scrapes[warm_s], scrapes[seconds], strict=True)]}


def print_table(results: list[dict[str, object]]) -> bool:
    ok = True
    print("| load | " + " | ".join(NAMES) + " | load average |")
    print("| --- |" + " --- |" * (len(NAMES) + 1))
    for r in results:
        m: list[float] = r["millicores"]  # type: ignore[assignment]
        rss: dict[float, list[float]] = r["rss"]  # type: ignore[assignment]
        cells = []
        for i in range(len(NAMES)):
            cells.append(f"{m[i]:.1f} m, " + " / ".join(f"{rss[t][i]:.0f}" for t in sorted(rss)) + " MiB")
        (l0, l1) = r["load"]  # type: ignore[misc]
        cells.append(f"{l0[0]:.2f} → {l1[0]:.2f}")
        print(f"| {r['endpoints']} endpoints × {r['gpus']} GPUs | " + " | ".join(cells) + " |")
    for r in results:
        m = r["millicores"]  # type: ignore[assignment]
        rss = r["rss"]  # type: ignore[assignment]
        cheaper = min(m[1], m[2])
        good = m[0] <= GUARD_RATIO * cheaper
        ok &= good
        last = max(rss)
        (l0, l1) = r["load"]  # type: ignore[misc]
        print(f"{r['endpoints']} × {r['gpus']}: RSS at " + ", ".join(f"{t:g}" for t in sorted(rss)) + " min; CPU after "
              f"the first {r['warm_s']:.0f} s; load average {l0[0]:.2f} before, {l1[0]:.2f} after")
        print(f"  sidecar CPU / Prometheus agent {m[0] / m[1]:.2f}x, / vmagent {m[0] / m[2]:.2f}x, / bare loop "
              f"{m[0] / m[3]:.2f}x; RSS at the end / Prometheus agent {rss[last][0] / rss[last][1]:.2f}x, / vmagent "
              f"{rss[last][0] / rss[last][2]:.2f}x, / bare loop {rss[last][0] / rss[last][3]:.2f}x")
        rates: list[tuple[float, float]] = r["scrapes"]  # type: ignore[assignment]
        asked = 3 * r["endpoints"]  # type: ignore[operator]
        print(f"  scrapes a second in the window, of the {asked} asked (3 Hz × {r['endpoints']}): " + ", ".join(
            f"{name} {got:.1f} ({failed:.1f} failed)" for name, (got, failed) in zip(NAMES, rates, strict=False)))
        (pr, pb), (vr, vb) = r["forwarded"]  # type: ignore[misc]
        print(f"  remote write received: Prometheus agent {pr:,} requests, {pb / 2**20:,.1f} MiB; vmagent {vr:,} "
              f"requests, {vb / 2**20:,.1f} MiB (compressed)")
        h = r["harness"]  # type: ignore[index]
        print(f"  harness CPU (no scraper's): page server {h[0]:.1f} m, OTLP sink {h[1]:.1f} m, remote-write sinks "
              f"{h[2]:.1f} m and {h[3]:.1f} m; the machine busy {r['machine']:.0f} m of {os.cpu_count()} CPUs, "
              f"{r['machine'] - sum(m) - sum(h):.0f} m of it neither the scrapers' nor the harness's")
        print(f"  guard: sidecar CPU <= {GUARD_RATIO:g}x the cheaper peer ({cheaper:.1f} m): "
              f"{m[0]:.1f} m = {m[0] / cheaper:.2f}x: {procs.verdict(good)}")
    return ok


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--minutes", type=float, default=10.0, help="each load's window (default 10)")
    args.add_argument("--loads", default="8,64", help="endpoints per load, comma-separated (default 8,64)")
    args.add_argument("--gpus", type=int, default=8)
    args.add_argument("--live-simulator", action="store_true",
                      help="serve the pages with `dcgm-bridge simulate` (a page rendered per request: at 64 endpoints "
                           "it takes more CPU than the scrapers) instead of bench/_pages.py's pre-rendered rings")
    opts = args.parse_args(argv)
    try:
        loads = [int(x) for x in opts.loads.split(",")]
    except ValueError:
        print(f"bench_peers: --loads {opts.loads!r}: expected endpoint counts separated by commas, e.g. 8,64",
              file=sys.stderr)
        return 2
    for name in ("prometheus", "vmagent"):
        binary(name)
    pages = "the live simulator" if opts.live_simulator else "pre-rendered rings (bench/_pages.py)"
    print(f"peers: {', '.join(map(str, loads))} endpoints × {opts.gpus} GPUs at 3 Hz, {opts.minutes:g} min each, "
          f"pages from {pages}; {os.cpu_count()} CPUs")
    results = [run_load(n, opts.gpus, opts.minutes, opts.live_simulator) for n in loads]
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
