"""`make bench`: every benchmark script in this folder, one after the other, in one run; what they print is
also written to bench/RESULTS.md with the machine and the date (`--no-results` to leave it alone,
`-k NAME` to run the scripts whose name contains NAME)."""

from __future__ import annotations

import argparse
import io
import os
import platform
import runpy
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
# RESULTS.md from this heading on is kept by every run: the real-GPU figures (scripts/check-gpu.sh on a device),
# and the sections after it (the peers' table: `make bench-peers`).
KEPT = "## A real GPU"
# Too long for `make bench` (10 minutes a load): run on their own, by their make target or `-k`.
SEPARATE = ("bench_peers.py",)


class Tee(io.TextIOBase):
    def __init__(self, *streams: io.TextIOBase) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return (f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} "
            f"{platform.release()}; load average at the start {load}")


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--no-results", action="store_true")
    args.add_argument("-k", default="")
    opts = args.parse_args()
    captured = io.StringIO()
    real_stdout = sys.stdout
    sys.stdout = Tee(real_stdout, captured)  # type: ignore[assignment]
    failed = []
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    about = machine()
    try:
        print(f"# {started} — {about}", flush=True)
        for script in sorted(HERE.glob("bench_*.py")):
            if opts.k not in script.name or (script.name in SEPARATE and not opts.k):
                continue
            print(f"\n== {script.name}", flush=True)
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exit_:
                if exit_.code not in (0, None):
                    failed.append(script.name)
            except Exception as exc:  # noqa: BLE001 - one broken bench must not hide the others' figures
                print(f"   {script.name} failed: {type(exc).__name__}: {exc}")
                failed.append(script.name)
    finally:
        sys.stdout = real_stdout
    if not opts.no_results and not opts.k:
        results = HERE / "RESULTS.md"
        results.write_text(
            "# Benchmark results\n\n"
            f"`make bench` on {started}: {about}.\n\n"
            "Every figure is measured in the run that printed it; ratios compare two implementations measured side "
            "by side in that run. MET / NOT MET is against issue #7's targets; bench/NOTES.md "
            "explains the figures that miss.\n\n```\n" + captured.getvalue() + "```\n" + kept_sections(results))
    return 1 if failed else 0


def kept_sections(results: Path) -> str:
    """What RESULTS.md holds from `KEPT` on: figures no `make bench` here can remeasure (a real GPU's), kept."""
    old = results.read_text() if results.exists() else ""
    at = old.find(KEPT)
    return "" if at < 0 else "\n" + old[at:]


if __name__ == "__main__":
    sys.exit(main())
