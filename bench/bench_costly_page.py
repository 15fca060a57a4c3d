"""A costly page must not hold up the other endpoints (issue 18 item 2): the bound, measured.

`dcgm-bridge sidecar` at 3 Hz with OTLP on against two simulated exporters: a healthy one (8 GPUs) and a
costly one (64 GPUs × 7 MIG instances: ~15,000 samples a page, new values at every scrape). Every endpoint is
scraped by one thread, so the costly page's parse, normalisation, records and OTLP encoding delay the healthy
endpoint's next GET. Printed: the healthy endpoint's missed ticks and tick lateness p99 over the window, and the
costly page's own cost in situ; the bound is one costly page's processing time per tick.

    .venv/bin/python bench/bench_costly_page.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _procs import ROOT, free_port, get, start_otlp_sink, start_simulators, stop, verdict, wait_for  # noqa: E402

INTERVAL_S = 0.333


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--seconds", type=float, default=20.0)
    opts = args.parse_args(argv)
    healthy_sim, (healthy,) = start_simulators(1, 8)
    costly_sim, (costly,) = start_simulators(1, 64, "--mig", "7", "--seed", "1")  # (other GPUs than the healthy one)
    sink, otlp_url = start_otlp_sink()
    out = Path(tempfile.mkdtemp(prefix="bench-costly-"))
    port = free_port()
    env = {**os.environ, "DCGM_BRIDGE_HEALTH_HOST": "127.0.0.1", "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]",
           "AIPERF_GPU_COLLECTION_INTERVAL": str(INTERVAL_S)}
    proc = subprocess.Popen([sys.executable, "-m", "bridge.cli", "sidecar", "--health-port", str(port),
                             "--artifact-dir", str(out), "--run-id", "bench", "--otlp-endpoint", otlp_url,
                             "--gpu-telemetry", healthy, costly], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(base + "/readyz", 120, proc)
        time.sleep(3.0)  # templates and plans built
        status = json.loads(get(base + "/status")[1])
        before, cpu_before = {e["display"]: e for e in status["endpoints"]}, status["cpu_s_by_thread"]["scrape"]
        time.sleep(opts.seconds)
        status = json.loads(get(base + "/status")[1])
        after, cpu_after = {e["display"]: e for e in status["endpoints"]}, status["cpu_s_by_thread"]["scrape"]
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    finally:
        stop(proc)
        for p in (healthy_sim, costly_sim, sink):
            stop(p)
        shutil.rmtree(out, ignore_errors=True)
    key_h, key_c = healthy.split("//")[1].removesuffix("/metrics"), costly.split("//")[1].removesuffix("/metrics")
    ticks = opts.seconds / INTERVAL_S
    missed = after[key_h]["missed_ticks"] - before[key_h]["missed_ticks"]
    scrapes_c = after[key_c]["scrapes"] - before[key_c]["scrapes"]
    print(f"costly page: one endpoint of 64 GPUs × 7 MIG beside a healthy one of 8 GPUs, 3 Hz, OTLP on, "
          f"{opts.seconds:.0f} s")
    late_ms = (after[key_h]["tick_lateness_p99_s"] or 0) * 1e3
    tick_ms = (cpu_after - cpu_before) / max(1, scrapes_c) * 1e3  # the scrape thread's work a tick: both pages
    print(f"  healthy endpoint: {missed} missed ticks of {ticks:.0f}, tick lateness p99 {late_ms:.1f} ms")
    print(f"  costly endpoint: {scrapes_c} scrapes, last GET {after[key_c]['last_scrape_duration_s'] * 1e3:.1f} ms, "
          f"{after[key_c]['missed_ticks'] - before[key_c]['missed_ticks']} missed ticks")
    print("  bound: a healthy endpoint's GET starts at most one costly page's processing late (one scrape thread);"
          " it misses a tick only when that exceeds the interval")
    print(f"  the scrape thread's CPU a tick (the costly page's processing and the healthy page's): {tick_ms:.1f} ms; "
          f"healthy lateness p99 within it: {'yes' if late_ms <= tick_ms else 'no'}; missed ticks 0: "
          f"{verdict(missed == 0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
