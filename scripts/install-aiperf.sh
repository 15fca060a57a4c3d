#!/usr/bin/env bash
# AIPerf 0.13.0 from PyPI, in its own venv in the cache (keyed by version), for the real-AIPerf tests
# (tests/sidecar/test_profile_aiperf.py, marker `aiperf`) and the benchmarks: the same venv as
# bench/aiperf_setup.sh, which does the work. Idempotent; warm, it touches no network.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="$(bash "$here/../bench/aiperf_setup.sh" | tail -n 1)"
printf 'install-aiperf: %s\n' "$python" >&2
