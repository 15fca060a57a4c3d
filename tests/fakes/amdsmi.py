"""A fake of ROCm's `amdsmi` Python module: the functions AIPerf's amdsmi collector calls, with the library's
return shapes (dicts, "N/A" for a sensor a part lacks) and units, over GPUs following a known power curve.

- `amdsmi_get_power_info`: `socket_power` (ROCm 7) / `current_socket_power` (MI300+) in W, instantaneous;
  `average_socket_power` "N/A" on MI300+.
- `amdsmi_get_energy_count`: `energy_accumulator` in ticks of `counter_resolution` µJ (15.259 µJ on MI300X),
  moving at its own update period; ROCm 6.x names the accumulator `power` (`rocm6=True`).
- `amdsmi_get_temp_metric`: °C from the 26.x bindings (`__version__`), millidegrees before.
- Errors: `AmdSmiLibraryException` (an `AmdSmiException`) with the library's status code, e.g. NOT_SUPPORTED (2);
  `amdsmi_init` raises AMDSMI_STATUS_DRIVER_NOT_LOADED (48)-style errors when `driver=False`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.curve import PowerCurve

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_DRIVER_NOT_LOADED = 48


class AmdSmiException(Exception):  # noqa: N818 - amdsmi's name
    pass


class AmdSmiLibraryException(AmdSmiException):  # noqa: N818
    def __init__(self, err_code: int) -> None:
        super().__init__(f"Error code:\n\t{err_code}")
        self.err_code = err_code

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiMemoryType(enum.IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0


@dataclass
class FakeAmdGpu:
    uuid: str
    serial: str
    name: str = "AMD Instinct MI300X"
    curve: PowerCurve = field(default_factory=PowerCurve)
    # amdsmi_get_energy_count's counter_resolution on a real MI100 (ROCm/amdsmi#22: 15.300000190734863 µJ per tick)
    # and a counter at what amd-smi shows on a real MI210 after days of uptime (ROCm/amdsmi#38: 20909145.914 J)
    resolution_uj: float = 15.300000190734863
    energy_period_s: float = 0.001
    energy_offset_j: float = 20909145.914
    rocm6: bool = False
    unsupported: frozenset[str] = frozenset()
    vram_total: int = 192 * 10**9

    def ticks(self, t: float) -> int:
        latched = math.floor(t / self.energy_period_s + 1e-9) * self.energy_period_s
        return math.floor((self.energy_offset_j + self.curve.energy_j(latched)) * 1e6 / self.resolution_uj)

    def vram_used(self, t: float) -> int:
        return int(self.vram_total * (0.1 + 0.8 * self.curve.sm_percent(t) / 100))


class FakeAmdSmi:
    """The amdsmi module over `gpus` at `clock()` seconds."""

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiMemoryType = AmdSmiMemoryType
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric

    def __init__(self, clock: Callable[[], float], gpus: Sequence[FakeAmdGpu], *, driver: bool = True,
                 version: str = "26.2.1") -> None:
        self.clock = clock
        self.gpus = list(gpus)
        self.driver = driver
        self.__version__ = version
        self.up = False

    def _gpu(self, handle: FakeAmdGpu, function: str) -> FakeAmdGpu:
        if not self.up:
            raise AmdSmiLibraryException(32)  # AMDSMI_STATUS_NOT_INIT
        if function in handle.unsupported:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return handle

    def amdsmi_init(self) -> None:
        if not self.driver:
            raise AmdSmiLibraryException(AMDSMI_STATUS_DRIVER_NOT_LOADED)
        self.up = True

    def amdsmi_shut_down(self) -> None:
        self.up = False

    def amdsmi_get_processor_handles(self) -> list[FakeAmdGpu]:
        if not self.up:
            raise AmdSmiLibraryException(32)
        return list(self.gpus)

    def amdsmi_get_gpu_device_uuid(self, h: FakeAmdGpu) -> str:
        return self._gpu(h, "amdsmi_get_gpu_device_uuid").uuid

    def amdsmi_get_gpu_board_info(self, h: FakeAmdGpu) -> dict[str, Any]:
        gpu = self._gpu(h, "amdsmi_get_gpu_board_info")
        return {"model_number": "102-G30211-00", "product_serial": gpu.serial, "fru_id": "N/A",
                "product_name": gpu.name, "manufacturer_name": "AMD"}

    def amdsmi_get_gpu_device_bdf(self, h: FakeAmdGpu) -> str:
        self._gpu(h, "amdsmi_get_gpu_device_bdf")
        return f"0000:{0x0c + self.gpus.index(h) * 0x10:02x}:00.0"

    def amdsmi_get_power_info(self, h: FakeAmdGpu) -> dict[str, Any]:
        gpu = self._gpu(h, "amdsmi_get_power_info")
        watts = round(gpu.curve.power_w(self.clock()))
        return {"current_socket_power": watts, "average_socket_power": "N/A", "gfx_voltage": "N/A",
                "soc_voltage": "N/A", "mem_voltage": "N/A", "power_limit": 750_000_000}

    def amdsmi_get_energy_count(self, h: FakeAmdGpu) -> dict[str, Any]:
        gpu = self._gpu(h, "amdsmi_get_energy_count")
        name = "power" if gpu.rocm6 else "energy_accumulator"
        return {name: gpu.ticks(self.clock()), "counter_resolution": gpu.resolution_uj,
                "timestamp": int(self.clock() * 1e9)}

    def amdsmi_get_gpu_activity(self, h: FakeAmdGpu) -> dict[str, Any]:
        gpu = self._gpu(h, "amdsmi_get_gpu_activity")
        busy = round(gpu.curve.sm_percent(self.clock()))
        return {"gfx_activity": busy, "umc_activity": busy // 3, "mm_activity": "N/A"}

    def amdsmi_get_gpu_memory_usage(self, h: FakeAmdGpu, kind: AmdSmiMemoryType) -> int:
        gpu = self._gpu(h, "amdsmi_get_gpu_memory_usage")
        assert kind == AmdSmiMemoryType.VRAM
        return gpu.vram_used(self.clock())

    def amdsmi_get_gpu_memory_total(self, h: FakeAmdGpu, kind: AmdSmiMemoryType) -> int:
        return self._gpu(h, "amdsmi_get_gpu_memory_total").vram_total

    def amdsmi_get_temp_metric(self, h: FakeAmdGpu, kind: AmdSmiTemperatureType,
                               metric: AmdSmiTemperatureMetric) -> int:
        gpu = self._gpu(h, "amdsmi_get_temp_metric")
        celsius = 35 + round(gpu.curve.power_w(self.clock()) / 20)
        return celsius if int(self.__version__.split(".")[0]) >= 26 else celsius * 1000

    def amdsmi_get_gpu_total_ecc_count(self, h: FakeAmdGpu) -> dict[str, Any]:
        self._gpu(h, "amdsmi_get_gpu_total_ecc_count")
        return {"correctable_count": 4, "uncorrectable_count": 0, "deferred_count": 0}

    def amdsmi_get_gpu_metrics_info(self, h: FakeAmdGpu) -> dict[str, Any]:
        gpu = self._gpu(h, "amdsmi_get_gpu_metrics_info")
        return {"throttle_status": "N/A", "indep_throttle_status": int(gpu.curve.power_w(self.clock()) > 640)}


def module_attributes(fake: FakeAmdSmi) -> dict[str, Any]:
    """The names `import amdsmi` gives, bound to `fake` (tests/fakes/modules/amdsmi.py)."""
    out: dict[str, Any] = {n: getattr(fake, n) for n in dir(fake) if n.startswith(("amdsmi_", "AmdSmi"))}
    out["__version__"] = fake.__version__
    return out
