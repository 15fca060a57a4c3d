"""`import pynvml` for a process run with tests/fakes/modules on PYTHONPATH (the README test, scripts/check-gpu.sh
--fake): tests/fakes/nvml.py's fake on the wall clock, two GPUs (an H100 with GPM, a GA100 without), the known power
curve starting when the module is imported (or at DCGM_BRIDGE_FAKE_NVML_T0, Unix seconds).
DCGM_BRIDGE_FAKE_NVML_ENERGY_PERIOD_S sets the counter's update period, DCGM_BRIDGE_FAKE_NVML_GAUGE_PERIOD_S the power
readings' (0, the default: continuous; 0.1 with the counter's 0.1: the H200's, as scripts/check-gpu.sh --record
--fake runs it).
"""

import os
import time

from tests.fakes.nvml import FakeGpu, FakeNvml, module_attributes

# a shared zero, so that several processes (scripts/check-gpu.sh --fake: the driver, the benchmark, dcgm-bridge) see
# one curve
_START = float(os.environ.get("DCGM_BRIDGE_FAKE_NVML_T0") or time.time())
_PERIOD = float(os.environ.get("DCGM_BRIDGE_FAKE_NVML_ENERGY_PERIOD_S", "0.02"))
_GAUGE = float(os.environ.get("DCGM_BRIDGE_FAKE_NVML_GAUGE_PERIOD_S", "0"))
FAKE = FakeNvml(lambda: time.time() - _START, [
    FakeGpu("GPU-0fa4e5b2-0000-4000-8000-000000000001", energy_period_s=_PERIOD, gauge_update_s=_GAUGE,
            wall_zero_s=_START),
    FakeGpu("GPU-0fa4e5b2-0000-4000-8000-000000000002", name="NVIDIA A100-SXM4-80GB", ampere_or_newer=False,
            gpm=False, energy_period_s=_PERIOD, pci_bus_id="00000000:3B:00.0", gauge_update_s=_GAUGE,
            wall_zero_s=_START),
])
globals().update(module_attributes(FAKE))
