"""`make bench`: every benchmark script in this folder, one after the other, in one run."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

failed = []
for script in sorted(Path(__file__).parent.glob("bench_*.py")):
    print(f"\n== {script.name}", flush=True)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            failed.append(script.name)
sys.exit(1 if failed else 0)
