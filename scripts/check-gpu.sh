#!/usr/bin/env bash
# The first measurement on a real GPU (issue 30 item 6): on a machine with an NVIDIA GPU and its driver (NVML),
# no network and no dcgm-exporter needed, `dcgm-bridge profile --gpu-telemetry pynvml` runs around three load
# levels (about a minute), and each phase's energy from our report is compared with NVML's own total-energy
# counter read at the phase's edges, beside the power-integral estimate and our stated bound. It checks our
# windowing and pipeline, not NVML's accuracy. It never changes clocks, power limits or MIG.
#
#   scripts/check-gpu.sh [--fake] [--wheels DIR] [--venv DIR] [--phase-s S] [--out DIR]
#
#   --fake        rehearse here against the fake pynvml (tests/fakes), no GPU needed
#   --wheels DIR  install offline from DIR (this project's missing dependencies as wheels: nvidia-ml-py, …)
#   --venv DIR    the environment to use or make (default .venv-gpu; --fake reuses .venv when it exists)
#
# Python 3.11+ (3.12 on the GPU machines). Where the C extension cannot be built, the source tree runs on the
# pure-Python path (said so). Exit 0 when every phase's energy is within our stated bound (±) of NVML's counter
# delta (plus the counter's own read lag at the two edges: two update periods of the phase's mean power).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FAKE=0 WHEELS="" VENV="" PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fake) FAKE=1; PASS+=("--fake"); shift ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) PASS+=("$1"); shift ;;
  esac
done
if [ -z "${PYTHON:-}" ]; then  # the first interpreter that runs (a pyenv shim may exist and fail)
  for candidate in python3.12 python3; do
    if "$candidate" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then PYTHON=$candidate; break; fi
  done
fi
[ -n "${PYTHON:-}" ] || { echo "check-gpu: needs Python 3.11+ (3.12 on the GPU machines)" >&2; exit 2; }
if [ -z "$VENV" ]; then
  if [ "$FAKE" = 1 ] && [ -x .venv/bin/python ]; then VENV=.venv; else VENV=.venv-gpu; fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "== making $VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q)
[ -n "$WHEELS" ] && PIP+=(--no-index --find-links "$WHEELS")
if ! "$VENV/bin/python" -c "import bridge.cli" 2>/dev/null; then
  if "${PIP[@]}" -e ".[nvml]" 2>"$VENV/install.log"; then
    echo "== installed dcgm-bridge into $VENV"
  else
    # No compiler (or no headers) for the C extension: install the dependencies only and run the source tree,
    # which takes the pure-Python path when bridge._kernel is missing.
    echo "== the package (its C extension) could not be built ($(tail -1 "$VENV/install.log")); running the source tree on the pure-Python path"
    DEPS=$("$VENV/bin/python" -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(d["dependencies"] + d["optional-dependencies"]["nvml"]))')
    mapfile -t DEPS_ARRAY <<<"$DEPS"
    "${PIP[@]}" "${DEPS_ARRAY[@]}"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
if [ "$FAKE" = 0 ] && ! "$VENV/bin/python" -c "import pynvml" 2>/dev/null; then
  echo "check-gpu: the pynvml module (nvidia-ml-py) is missing: pip install 'dcgm-bridge[nvml]' or pass --wheels DIR" >&2
  exit 2
fi
exec "$VENV/bin/python" scripts/check_gpu.py "${PASS[@]}"
