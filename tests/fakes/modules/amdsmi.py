"""`import amdsmi` for a process run with tests/fakes/modules on PYTHONPATH: tests/fakes/amdsmi.py's fake on the wall
clock, two MI300X GPUs following the known power curve from import time."""

import time

from tests.fakes.amdsmi import FakeAmdGpu, FakeAmdSmi, module_attributes

_START = time.time()
FAKE = FakeAmdSmi(lambda: time.time() - _START, [FakeAmdGpu("uuid-mi300x-0", "692251009001"),
                                                 FakeAmdGpu("uuid-mi300x-1", "692251009002")])
globals().update(module_attributes(FAKE))
