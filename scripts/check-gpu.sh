#!/usr/bin/env bash
# The first measurement on a real GPU (issue 30 item 6): on a machine with an NVIDIA GPU and its driver (NVML),
# no network and no dcgm-exporter needed, `dcgm-bridge profile --gpu-telemetry pynvml` runs around six load
# phases (about 1.5 minutes: steady levels, a square wave, a cool-down), and each phase's energy from our report
# is compared with NVML's own total-energy counter read where it changes at the phase's edges, beside the
# power-integral estimate and our stated uncertainty and bound. It checks our windowing, pipeline and
# uncertainty model, not NVML's accuracy. It never changes clocks, power limits or MIG.
#
#   scripts/check-gpu.sh [--fake] [--wheels DIR] [--venv DIR | --no-venv] [--phase-s S] [--out DIR]
#   scripts/check-gpu.sh --record [--fake] [--wheels DIR] [--no-venv] [--record-scale F] [--out DIR]
#
#   --record      instead of the check: a corpus of raw NVML reads on every GPU (the energy counter, the power
#                 reading, the average and instant power fields, each timed) while GPU 0 runs known load shapes,
#                 about 7 minutes (scripts/gpu_record.py; DECISIONS.md "GPU trace corpus"); needs only Python,
#                 pynvml and torch or CuPy, not this project's dependencies
#   --fake        rehearse here against the fake pynvml (tests/fakes), no GPU needed
#   --wheels DIR  install offline from DIR (this project's missing dependencies as wheels: nvidia-ml-py, …)
#   --venv DIR    the environment to use or make (default .venv-gpu, which sees the system's packages, so the
#                 load finds torch or CuPy there; --fake reuses .venv when it exists)
#   --no-venv     run the source tree with $PYTHON (or python3) as it is: its packages must hold this project's
#                 dependencies; the C extension is compiled in place when a compiler and Python's headers exist
#
# Python 3.11+ (3.12 on the GPU machines). Where the C extension cannot be built, the source tree runs on the
# pure-Python path (said so). Exit 0 when every phase's energy is within our stated bound (±) of NVML's counter
# delta (plus the counter's own read lag at the two edges: two update periods of the phase's mean power).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FAKE=0 WHEELS="" VENV="" NO_VENV=0 RECORD=0 PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fake) FAKE=1; PASS+=("--fake"); shift ;;
    --record) RECORD=1; PASS+=("--record"); shift ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --no-venv) NO_VENV=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) PASS+=("$1"); shift ;;
  esac
done
if [ -z "${PYTHON:-}" ]; then  # the first interpreter that runs (a pyenv shim may exist and fail)
  for candidate in python3.12 python3; do
    if "$candidate" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then PYTHON=$candidate; break; fi
  done
fi
[ -n "${PYTHON:-}" ] || { echo "check-gpu: needs Python 3.11+ (3.12 on the GPU machines)" >&2; exit 2; }
if [ "$NO_VENV" = 1 ]; then
  if [ -n "$WHEELS" ]; then  # beside the interpreter's own packages, never over them
    SITE="${TMPDIR:-/tmp}/check-gpu-site"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  if [ "$RECORD" = 1 ]; then  # the recording reads NVML and drives the load: none of this project's dependencies
    if [ "$FAKE" = 0 ] && ! "$PYTHON" -c "import pynvml" 2>/dev/null; then
      echo "check-gpu: the pynvml module (nvidia-ml-py) is missing for $PYTHON: pass --wheels DIR" >&2
      exit 2
    fi
    exec "$PYTHON" scripts/check_gpu.py "${PASS[@]}"
  fi
  if ! "$PYTHON" -c "import bridge._kernel" 2>/dev/null; then
    # the extension as setuptools would build it (pyproject.toml's ext-modules), by hand: no build backend needed
    INCLUDE=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    SUFFIX=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    if ${CC:-cc} -O2 -shared -fPIC -I"$INCLUDE" -Ibridge/vendor bridge/_kernel.c -o "bridge/_kernel$SUFFIX" 2>/tmp/check-gpu-cc.log; then
      echo "== compiled bridge._kernel in place"
    else
      echo "== the C extension could not be compiled ($(tail -1 /tmp/check-gpu-cc.log)); the pure-Python path runs"
    fi
  fi
  missing=$("$PYTHON" -c 'import bridge.cli' 2>&1 | tail -1) || { echo "check-gpu: $PYTHON cannot run dcgm-bridge: $missing (pass --wheels DIR, or drop --no-venv)" >&2; exit 2; }
  if [ "$FAKE" = 0 ] && ! "$PYTHON" -c "import pynvml" 2>/dev/null; then
    echo "check-gpu: the pynvml module (nvidia-ml-py) is missing for $PYTHON" >&2
    exit 2
  fi
  exec "$PYTHON" scripts/check_gpu.py "${PASS[@]}"
fi
if [ -z "$VENV" ]; then
  if [ "$FAKE" = 1 ] && [ -x .venv/bin/python ]; then VENV=.venv; else VENV=.venv-gpu; fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "== making $VENV with $("$PYTHON" --version)"
  if [ "$FAKE" = 1 ]; then "$PYTHON" -m venv "$VENV"; else "$PYTHON" -m venv --system-site-packages "$VENV"; fi
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
