"""A small mutation check (`make mutate`, not in CI): deliberate faults in the report, the parser, the verdict and
the dashboards, each of which the suite must catch.

Each fault is applied to a temporary copy of the source tree, one at a time, and only the tests that should catch
it run there (the copy comes first on PYTHONPATH, so they import the faulty code); the fault is caught when they
fail. Prints one line per fault and exits 1 when any was missed, 2 when a fault no longer applies (the code it
changes moved: update FAULTS).

    scripts/mutate.py [--only WORD ...]

The dashboard faults need the real servers (`make servers`): without them those tests skip, and the fault is
reported missed with the reason.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IGNORED = (".git", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", "__pycache__", "artifacts",
           "*.egg-info", ".hypothesis")


@dataclass(frozen=True)
class Fault:
    name: str
    path: str  # relative to the repository root
    old: str  # replaced once; must occur exactly once
    new: str
    tests: tuple[str, ...]  # pytest arguments: the files (and -k) that must catch it
    why: str  # what let it through before the suite caught it


# The legacy NVLink counter's branch of its rule, up to the MB-to-bytes factor.
_NVLINK_LEGACY = ('DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL(_total)?"})))), "host", "$1", "Hostname", "(.+)"), "host", "$1", '
                  '"hostname", "(.+)"))')
FAULTS = (
    Fault("report: the refreshed counter reads 20 % high", "bridge/report/refresh.py",
          "return RefreshedDelta(float(max(at1 - at0, 0.0)),",
          "return RefreshedDelta(float(max(at1 - at0, 0.0)) * 1.2,",
          ("tests/report/test_energy_accuracy.py", "-k", "exact_refresh_instants"),
          "the exact-refresh-instant oracle held only a lower bound"),
    Fault("report: the power integral forgets the gauge's averaging", "bridge/report/uncertainty.py",
          "return steps + abs(float(curve_w[-1] - curve_w[0])) * GAUGE_AVERAGING_S", "return steps",
          ("tests/report/test_stats.py", "-k", "power_integrals_uncertainty"),
          "the uncertainty test restated uncertainty.py's formula"),
    Fault("report: the HTML energy card shows twice the energy", "bridge/report/html.py",
          "text = _joules(energy.total_energy_j)", "text = _joules(2 * energy.total_energy_j)",
          ("tests/report/test_amd_totals.py", "-k", "nvidia_only_page"),
          "the NVIDIA-only card was checked for its title alone"),
    Fault("parser: an escaped quote in a label value becomes an apostrophe", "bridge/parse/lines.py",
          """'\\\\"': '"'}""", """'\\\\"': "'"}""",
          ("tests/test_parse.py",), "caught before too: prometheus_client is the oracle"),
    Fault("verdict: a counter that disagrees with the gauge passes", "bridge/report/verdict.py",
          "if energy.agrees is False:", "if energy.agrees is None:",
          ("tests/report/test_verdict.py",), "caught before too: the verdict's reasons are checked by name"),
    Fault("dashboard: the temperature panel shows min by (100 * ...)", "grafana/dashboards/benchmark-run.json",
          "max by (host, UUID, gpu) (dcgm_bridge:gpu_temperature_celsius{",
          "min by (host, UUID, gpu) (100 * dcgm_bridge:gpu_temperature_celsius{",
          ("tests/grafana/test_dashboard_queries.py", "-k",
           "gauge_panel_shows and benchmark and Temperature and legacy"),
          "the query tests checked only that values were finite"),
    Fault("dashboard: the hottest GPU is the coolest", "grafana/dashboards/gpu-fleet.json",
          "max(dcgm_bridge:gpu_temperature_celsius{", "min(dcgm_bridge:gpu_temperature_celsius{",
          ("tests/grafana/test_dashboard_queries.py", "-k", "gauge_panel_shows and Hottest and legacy"),
          "a stat panel's value was never compared"),
    Fault("rules: NVLink traffic recorded in MB, not bytes", "grafana/rules/dcgm-bridge.rules.yml",
          _NVLINK_LEGACY + " * 1000000)", _NVLINK_LEGACY + ")",
          ("tests/grafana/test_dashboard_queries.py", "-k", "rate_panel_shows and NVLink and legacy"),
          "a rate panel's value was never compared"),
)


def _copy(to: Path) -> Path:
    tree = to / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*IGNORED), symlinks=True)
    return tree


def _run(tree: Path, fault: Fault) -> tuple[str, str]:
    """(verdict, pytest's summary line) for the fault applied to `tree`; the tree is restored after."""
    path = tree / fault.path
    original = path.read_text(encoding="utf-8")
    if original.count(fault.old) != 1:
        return "STALE", f"{fault.path}: the text to change occurs {original.count(fault.old)} times (update FAULTS)"
    path.write_text(original.replace(fault.old, fault.new), encoding="utf-8")
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep)}
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o",
                               "addopts=--strict-markers -ra", *fault.tests],
                              cwd=tree, env=env, capture_output=True,
                              text=True)
    finally:
        path.write_text(original, encoding="utf-8")
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else done.stderr.strip()[-200:]
    caught = done.returncode == 1 and " failed" in summary
    return ("caught" if caught else "MISSED"), summary


def _imports_the_copy(tree: Path) -> bool:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", "import bridge; print(bridge.__file__)"], cwd=tree, env=env,
                         capture_output=True, text=True).stdout.strip()
    return Path(out).resolve().is_relative_to(tree.resolve())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="faults whose name contains one of these words")
    args = parser.parse_args()
    faults = [f for f in FAULTS if not args.only or any(w in f.name for w in args.only)]
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="dcgm-bridge-mutate-") as scratch:
        tree = _copy(Path(scratch))
        if not _imports_the_copy(tree):
            print("the copy's tests would import the original bridge/, not the copy: cannot check", file=sys.stderr)
            return 2
        for fault in faults:
            t0 = time.monotonic()
            verdict, summary = _run(tree, fault)
            results.append(verdict)
            tests = " ".join(a if re.fullmatch(r"[\w./-]+", a) else repr(a) for a in fault.tests)
            print(f"{verdict:7} {fault.name} ({time.monotonic() - t0:.0f} s; before: {fault.why})\n"
                  f"        by {tests}: {summary}", flush=True)
    caught = results.count("caught")
    print(f"{caught}/{len(results)} faults caught in {time.monotonic() - started:.0f} s")
    if "STALE" in results:
        return 2
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
