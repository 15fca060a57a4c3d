"""Where the sidecar's bytes go (issue 48): the pod's sidecar, run in this process against simulated exporters.

The sidecar as `dcgm-bridge sidecar` builds it (bridge/sidecar/cli.py: build_session, its malloc settings, the
libcurl fetcher, OTLP to a loopback receiver) scrapes `--endpoints` simulated exporters of `--gpus` GPUs at 3 Hz
for `--seconds`; then the Python heap (tracemalloc) grouped by owner: the innermost bridge/ frame of each
allocation, mapped to a part of the pipeline (parse templates, OTLP plans and start times, series state, the
live report's spool, the record log, health, ...), beside the process's RSS split into what tracemalloc sees and
what it does not (the interpreter and its modules, libcurl and thread stacks, glibc's free but kept pages).

    .venv/bin/python bench/bench_memory.py [--endpoints 64] [--gpus 8] [--seconds 60] [--no-otlp] [--frames 4]
        [--no-trace]    (RSS only: tracemalloc's own records inflate the RSS it is beside)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _procs as procs  # noqa: E402

# An allocation's owner: the first of these its innermost bridge/ frame matches (file, or file:function).
OWNERS = [
    ("parse templates", ("bridge/parse/", "bridge/kernel.py")),
    ("OTLP plans, start times", ("bridge/otlp/plan.py", "bridge/otlp/starttime.py", "bridge/otlp/resource.py",
                                 "bridge/otlp/points.py", "bridge/otlp/semconv.py")),
    ("OTLP encode, queue, transport", ("bridge/otlp/",)),
    ("live report spool", ("bridge/sidecar/spool.py", "bridge/report/")),
    ("series state (normalise, records)", ("bridge/normalize.py", "bridge/samples.py", "bridge/fields.py",
                                           "bridge/relabel.py", "bridge/recognize.py", "bridge/views.py")),
    ("pipeline sinks (latest, pull, pods)", ("bridge/sidecar/pipeline.py", "bridge/sidecar/pod_sinks.py",
                                             "bridge/sidecar/pull.py")),
    ("record log", ("bridge/record_log.py", "bridge/events.py")),
    ("health stats", ("bridge/health.py",)),
    ("fetch buffers, libcurl handles", ("bridge/fetch.py", "bridge/scrape.py")),
    ("control server, session", ("bridge/sidecar/",)),
]


def owner_of(frames: list[str]) -> str:
    for name in frames:  # innermost first
        if "/bridge/" in name:
            path = "bridge/" + name.rsplit("/bridge/", 1)[1]
            for owner, prefixes in OWNERS:
                if path.startswith(prefixes):
                    return owner
            return "other bridge/ " + path
    return "outside bridge/ (imports, stdlib)"


def top_maps(n: int = 12) -> list[tuple[str, float]]:
    """The mappings with the most RSS (name or kind, MiB), summed by name."""
    by: dict[str, float] = {}
    name = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
            name = head[5] if len(head) > 5 else f"anonymous {head[0]}"
        elif line.startswith("Rss:"):
            by[name] = by.get(name, 0.0) + int(head[1]) / 1024
    return sorted(by.items(), key=lambda kv: -kv[1])[:n]


def trim_rss() -> float:
    """The RSS once glibc has given back the free pages inside its heaps (malloc_trim(0)): what fragmentation holds."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return procs.rss_mib(os.getpid())


def smaps() -> dict[str, float]:
    """The process's RSS in MiB by kind of mapping: the heap and anonymous maps, file-backed (code, libraries)."""
    out = {"heap and anonymous": 0.0, "files (code, libraries)": 0.0, "stacks": 0.0}
    kind = "heap and anonymous"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
            name = head[5] if len(head) > 5 else ""
            kind = "stacks" if name == "[stack]" else \
                "files (code, libraries)" if name.startswith("/") else "heap and anonymous"
        elif line.startswith("Rss:"):
            out[kind] += int(head[1]) / 1024
    return out


def breakdown(frames: int, top: int) -> tuple[float, dict[str, float], list[tuple[str, float]]]:
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    owners: dict[str, float] = {}
    sites: dict[str, float] = {}
    total = 0.0
    for stat in snapshot.statistics("traceback"):
        frames_in = list(reversed(stat.traceback))  # tracemalloc keeps the oldest frame first
        names = [f.filename for f in frames_in]
        mib = stat.size / 2**20
        total += mib
        key = owner_of(names)
        owners[key] = owners.get(key, 0.0) + mib
        for f in frames_in:
            if "/bridge/" in f.filename:
                site = "bridge/" + f.filename.rsplit("/bridge/", 1)[1] + f":{f.lineno}"
                sites[site] = sites.get(site, 0.0) + mib
                break
    return total, owners, sorted(sites.items(), key=lambda kv: -kv[1])[:top]


def report(opts: argparse.Namespace, load0: tuple[float, ...], rss: list[tuple[float, float]],
           maps: dict[str, float], biggest: list[tuple[str, float]], scrapes: int) -> None:
    print(f"memory: {opts.endpoints} endpoints × {opts.gpus} GPUs at 3 Hz, OTLP {'off' if opts.no_otlp else 'on'}, "
          f"{opts.seconds:g} s in this process ({scrapes:,} scrapes); load average "
          f"{', '.join(f'{x:.2f}' for x in load0)} before, {', '.join(f'{x:.2f}' for x in os.getloadavg())} after")
    print("  RSS " + ", ".join(f"{at:g} s {mib:.1f} MiB" if at >= 0 else f"after malloc_trim(0) {mib:.1f} MiB"
                               for at, mib in rss)
          + ("" if opts.no_trace else " (tracemalloc on: its own records included)"))
    print("  by mapping: " + ", ".join(f"{k} {v:.1f}" for k, v in maps.items()))
    print("  largest mappings: " + ", ".join(f"{Path(k).name if k.startswith('/') else k} {v:.1f}"
                                            for k, v in biggest), flush=True)


def print_heap(total: float, owners: dict[str, float], sites: list[tuple[str, float]]) -> None:
    print(f"  Python heap (tracemalloc) {total:.1f} MiB by owner:")
    for name, mib in sorted(owners.items(), key=lambda kv: -kv[1]):
        print(f"    {mib:7.2f} MiB  {name}")
    print("  largest allocation sites (innermost bridge/ frame):")
    for site, mib in sites:
        print(f"    {mib:7.2f} MiB  {site}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--endpoints", type=int, default=64)
    args.add_argument("--gpus", type=int, default=8)
    args.add_argument("--seconds", type=float, default=60.0)
    args.add_argument("--no-otlp", action="store_true")
    args.add_argument("--frames", type=int, default=4, help="tracemalloc frames per allocation")
    args.add_argument("--top", type=int, default=15, help="allocation sites listed")
    args.add_argument("--no-trace", action="store_true", help="RSS only (tracemalloc costs memory of its own)")
    opts = args.parse_args(argv)
    load0 = os.getloadavg()
    sims, urls = procs.start_simulators(opts.endpoints, opts.gpus)
    sink, otlp_url = procs.start_otlp_sink()
    out = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    if not opts.no_trace:
        tracemalloc.start(opts.frames)
    from bridge.sidecar.cli import build_session, resolve_config

    flags = {"gpu_telemetry": tuple(urls), "artifact_dir": str(out / "artifacts"), "run_id": "memory"}
    otlp = {} if opts.no_otlp else {"otlp_endpoint": otlp_url}
    try:
        os.environ.setdefault("AIPERF_GPU_COLLECTION_INTERVAL", "0.333")
        session = build_session(resolve_config(flags), otlp)
        if os.environ.get("BENCH_MALLOPT"):  # experiments: "param=value,..." (glibc mallopt numbers)
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            for pair in os.environ["BENCH_MALLOPT"].split(","):
                param, value = pair.split("=")
                libc.mallopt(int(param), int(value))
        session.prepare_artifacts()
        session.configure()
        session.start()
        began = time.monotonic()
        rss = []
        for at in sorted({min(30.0, opts.seconds), opts.seconds}):
            time.sleep(max(0.0, began + at - time.monotonic()))
            rss.append((at, procs.rss_mib(os.getpid())))
        maps = smaps()
        biggest = top_maps()
        trimmed = trim_rss()
        rss.append((-1.0, trimmed))
        scrapes = sum(e["scrapes"] for e in session.status()["endpoints"])
        report(opts, load0, rss, maps, biggest, scrapes)
        if not opts.no_trace:
            print_heap(*breakdown(opts.frames, opts.top))
        session.complete()
    finally:
        procs.stop(sims)
        procs.stop(sink)
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
