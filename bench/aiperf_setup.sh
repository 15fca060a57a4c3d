#!/usr/bin/env bash
# AIPerf 0.13.0 from PyPI, in its own venv in the bench cache, keyed by version and reused when present.
# bench/bench_scrape.py and bench/bench_report.py measure its parse-and-record path and its accumulator
# side by side with ours. Prints the venv's python on the last line.
#
#   bash bench/aiperf_setup.sh            # install if missing
#   DCGM_BRIDGE_CACHE=/somewhere bash bench/aiperf_setup.sh
set -euo pipefail

VERSION=0.13.0
CACHE="${DCGM_BRIDGE_CACHE:-$HOME/.cache/dcgm-bridge}"
VENV="$CACHE/bench-aiperf-$VERSION"
PYTHON="${PYTHON:-python3}"

if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.complete" ]; then
    echo "$VENV/bin/python"
    exit 0
fi
rm -rf "$VENV"
mkdir -p "$CACHE"
"$PYTHON" -m venv "$VENV" >&2
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
# The whole wheel with its pinned dependencies (prometheus-client~=0.23.1, pydantic 2, orjson, numpy):
# the measured path is AIPerf's as users install it.
"$VENV/bin/python" -m pip install -q "aiperf==$VERSION" >&2
"$VENV/bin/python" -c "import aiperf.gpu_telemetry.dcgm_collector" >&2
touch "$VENV/.complete"
echo "$VENV/bin/python"
