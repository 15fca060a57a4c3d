"""An accelerated 1-hour run of the sidecar's pipeline: 8 endpoints × 8 GPUs at 3 Hz, OTLP on, gzip record log.

A Session on a manual clock scrapes each endpoint 10,800 times (one simulated hour) as fast as the CPU
allows (held back only while the OTLP queue is over half its bound, which the pod's real time never
fills): the same scrape loops, parser, normaliser, record log, live report series and OTLP forwarder
(sending to a receiver in another process) as in the pod; only the HTTP GET is replaced by a fetcher that
hands out pages the simulator rendered beforehand (30 per endpoint, cycled: the simulator renders a page
in ~5 ms, which for 86,400 scrapes would be the whole bench; each cycle adds one cycle's energy to the energy
counters, so that they grow as a GPU's do and the report takes a sane counter's path, not a glitch's). RSS is
sampled every 10 simulated minutes;
then completion: final scrapes, flushes, the report from the live series (CPU-s measured).

Targets (issue #7): RSS flat over the hour; completion within 0.75 CPU-s (30 s × 25m).

    .venv/bin/python bench/bench_longrun.py [--minutes 60]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.report.test_ages: the series timed

from _pages import PrerenderedFetcher, render_ring  # noqa: E402
from _procs import rss_mib, start_otlp_sink, stop, verdict  # noqa: E402

from bridge.config import Config  # noqa: E402
from bridge.endpoints import TelemetryItems  # noqa: E402
from bridge.fields import default_table  # noqa: E402
from bridge.kube.jobset import REPORT_CPU_SECONDS_PER_GPU  # noqa: E402
from bridge.otlp import OtlpForwarder, resolve_config  # noqa: E402
from bridge.sidecar.session import Session  # noqa: E402
from bridge.simulator import ManualClock  # noqa: E402

NS = 1_000_000_000
INTERVAL_NS = NS // 3
SHUTDOWN_CPU_S = 0.75
CYCLE = 30  # pages rendered per endpoint


QUEUE_PACE_POINTS = 50_000  # half the forwarder's default queue bound


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--minutes", type=float, default=60.0)
    opts = args.parse_args(argv)
    clock = ManualClock(1_750_000_000 * NS)
    urls = [f"http://10.0.0.{i + 1}:9400/metrics" for i in range(8)]
    rings = {url: render_ring(i, 8, clock(), INTERVAL_NS, CYCLE) for i, url in enumerate(urls)}
    sink, otlp_url = start_otlp_sink()
    out = Path(tempfile.mkdtemp(prefix="bench-longrun-"))
    try:
        forwarder = OtlpForwarder(resolve_config({}, endpoint=otlp_url), base_resource={"service.name": "bench"})
        config = Config(telemetry=TelemetryItems(urls=urls), default_endpoints=[], artifact_dir=str(out),
                        run_id="longrun", record_log_gzip=True, shutdown_delay=30.0)
        session = Session(config, default_table(), fetcher=PrerenderedFetcher(rings, clock), forwarder=forwarder,
                          now_ns=clock, monotonic=lambda: clock() / NS)
        session.configure()
        loops = list(session.loops.values())
        ticks = int(opts.minutes * 60 * NS // INTERVAL_NS)
        samples: list[tuple[float, float]] = []
        began = time.monotonic()
        cpu0 = time.process_time()
        for tick in range(ticks):
            clock.advance(INTERVAL_NS)
            for loop in loops:
                loop.scrape_now()
            # The hour runs ~100x faster than real time; the OTLP export thread, which in the pod has the
            # whole interval, gets the time to send before its queue bound (13 s of real data) would drop.
            while forwarder.stats().queue_depth_points > QUEUE_PACE_POINTS:
                time.sleep(0.002)
            if tick % (10 * 60 * 3) == 0 or tick == ticks - 1:
                samples.append((tick / (60 * 3), rss_mib(os.getpid())))
        run_cpu = time.process_time() - cpu0
        wall = time.monotonic() - began
        cpu1 = time.process_time()
        session.complete()
        shutdown = time.process_time() - cpu1
        written = (out / "profile_export_aiperf.json").exists()
        log_size = session.records.path.stat().st_size
        otlp = session.status()["otlp"] or {}
    finally:
        stop(sink)
        shutil.rmtree(out, ignore_errors=True)
    records = session.records_written
    print(f"accelerated run: {opts.minutes:g} simulated min, 8 endpoints × 8 GPUs at 3 Hz = {ticks * 8:,} scrapes, "
          f"{records:,} records in {wall:.0f} s ({run_cpu / (ticks * 8) * 1000:.2f} ms CPU per scrape, no HTTP); "
          f"gzip log {log_size / 2**20:,.0f} MiB; OTLP {otlp.get('sent_points', 0):,} points sent, "
          f"{otlp.get('dropped_points', 0):,} dropped")
    print("  RSS over the run: " + ", ".join(f"{m:.0f} min {r:.0f} MiB" for m, r in samples))
    base = samples[1][1] if len(samples) > 1 else samples[0][1]
    end = samples[-1][1]
    flat = end - base <= max(5.0, 0.1 * base)
    print(f"  RSS from 10 min to the end: {base:.0f} → {end:.0f} MiB   target flat: {verdict(flat)}")
    print(f"  completion (final scrapes, flush, OTLP close, report from the live series): {shutdown:.2f} CPU-s, "
          f"report {'written' if written else 'MISSING'}   target <= {SHUTDOWN_CPU_S:g}: "
          f"{verdict(shutdown <= SHUTDOWN_CPU_S and written)}")
    print(f"  of which each GPU's age fit, an hour at 3 Hz: {age_fit_s(0.0):.3f} CPU-s on a fixed grid, "
          f"{age_fit_s(2e-3):.3f} on a drifting one   kube's budget {REPORT_CPU_SECONDS_PER_GPU:g} a GPU: "
          f"{verdict(age_fit_s(2e-3) <= REPORT_CPU_SECONDS_PER_GPU)}")
    return 0


def age_fit_s(drift: float) -> float:
    """CPU-s of report/ages.py's fit for one GPU's hour of readings (tests/report/test_ages.py's series: a counter
    held 100 ms on a grid `drift` off the scrapes' clock), the best of three."""
    from bridge.report.ages import fresh_ages
    from tests.report.test_ages import HOLD_S, _held_counter

    ts, energy, _ = _held_counter(10_800, drift, seed=1)
    runs = []
    for _ in range(3):
        began = time.process_time()
        fresh_ages(ts, energy, HOLD_S, 0.0, local=True)
        runs.append(time.process_time() - began)
    return min(runs)


if __name__ == "__main__":
    sys.exit(main())
