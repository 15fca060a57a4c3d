"""A fake of `pynvml` (nvidia-ml-py) for machines without an NVIDIA GPU: the same functions, return shapes,
units and errors as the library's public API, over GPUs that follow a known power curve (tests/fakes/curve.py).

Timing, as NVML documents it (docs.nvidia.com/deploy/nvml-api, nvmlDeviceGetPowerUsage and
nvmlDeviceGetTotalEnergyConsumption):
- `nvmlDeviceGetPowerUsage` (mW): on Ampere and newer except GA100, power averaged over the trailing second;
  on GA100 and older, the instantaneous power.
- `nvmlDeviceGetTotalEnergyConsumption` (mJ since the driver loaded): a counter that moves only at its own
  update period (`energy_period_s`), holding its value in between.
- `nvmlDeviceGetFieldValues` (pynvml's `c_nvmlFieldValue_t`: fieldId, scopeId, timestamp µs, latencyUsec, valueType,
  nvmlReturn, value union): the fields NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (83, mJ), NVML_FI_DEV_POWER_AVERAGE
  (185, mW, the trailing second) and NVML_FI_DEV_POWER_INSTANT (186, mW), ids as nvidia-ml-py 13.615.71's pynvml.py
  defines them; each field's timestamp is the wall-clock µs of the update it shows. As measured on an H200
  (bench/RESULTS.md "A real GPU", bridge/simulator/sensors.py): the counter moves every 100 ms, the power readings
  every 100 ms on a grid offset by half a period (`gauge_update_s`; 0 reads them continuously, the default), the
  average over the trailing second. Any other field id answers NOT_SUPPORTED in its own `nvmlReturn`.
- Errors are `NVMLError(code)` instances of the per-code subclasses pynvml generates: NOT_SUPPORTED for a reading a
  handle lacks (power, energy, utilisation on a MIG handle), GPU_IS_LOST for every call once a GPU has fallen
  off the bus, LIBRARY_NOT_FOUND from `nvmlInit` without the driver, UNINITIALIZED before `nvmlInit`.

`FakeNvml(clock, gpus)` is the module: pass it where a reader takes `pynvml`. `clock()` is seconds since the
curve's zero (an injected clock: tests advance it, nothing sleeps).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

from tests.fakes.curve import PowerCurve

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
_MESSAGES = {NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_NOT_SUPPORTED: "Not Supported",
             NVML_ERROR_NOT_FOUND: "Not Found", NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
             NVML_ERROR_GPU_IS_LOST: "GPU is lost"}


class NVMLError(Exception):
    """pynvml's: `NVMLError(code)` is an instance of the code's subclass; `.value` is the code."""

    _by_code: ClassVar[dict[int, type[NVMLError]]] = {}

    def __new__(cls, value: int) -> NVMLError:  # noqa: PYI034 - pynvml's own shape
        target = cls._by_code.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"Unknown Error {self.value}")


def _subclass(name: str, code: int) -> type[NVMLError]:
    cls = type(name, (NVMLError,), {})
    NVMLError._by_code[code] = cls
    return cls


NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NotFound = _subclass("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_GpuIsLost = _subclass("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    ampere_or_newer: bool = True  # False: GA100 and older (instantaneous power)
    curve: PowerCurve = field(default_factory=PowerCurve)
    energy_period_s: float = 0.1  # the energy counter's own update period
    energy_offset_mj: int = 86_400_000  # the counter's value at the curve's zero (since the driver loaded)
    gpm: bool = True
    mig_profiles: Sequence[str] = ()  # MIG instances' profiles ("1g.10gb"); MIG mode on when non-empty
    lost_at_s: float | None = None  # GPU_IS_LOST from this time on
    unsupported: frozenset[str] = frozenset()  # functions that answer NOT_SUPPORTED on this GPU
    pci_bus_id: str = "00000000:18:00.0"
    memory_total: int = 80 * (1 << 30)
    power_limit_mw: int = 700_000
    gauge_update_s: float = 0.0  # the power readings' own update period (0: continuous); the H200's: 0.1
    wall_zero_s: float = 0.0  # the wall clock (Unix s) at the curve's zero: the fields' timestamps

    def memory_used(self, t: float) -> int:
        return int(self.memory_total * (0.05 + 0.8 * self.curve.sm_percent(t) / 100))


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    mig_slot: int | None = None  # a MIG device handle: its slot


class FakeNvml:
    """The pynvml module over `gpus`, at `clock()` seconds."""

    NVMLError = NVMLError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_PERF_POLICY_POWER = 0
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
    NVML_FI_DEV_POWER_AVERAGE = 185
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_VALUE_TYPE_DOUBLE = 0
    NVML_VALUE_TYPE_UNSIGNED_INT = 1
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
    DRIVER_VERSION = "580.159.04-fake"
    NVML_VERSION = "13.580.159.04-fake"
    CUDA_DRIVER_VERSION = 13000

    def __init__(self, clock: Callable[[], float], gpus: Sequence[FakeGpu], *, library: bool = True) -> None:
        self.clock = clock
        self.gpus = list(gpus)
        self.library = library
        self.initialized = 0
        self.calls = 0

    # -- expected readings (what a test compares against) ------------------------------------------
    @staticmethod
    def power_mw(gpu: FakeGpu, t: float) -> int:
        if gpu.ampere_or_newer:
            return round((gpu.curve.energy_j(t) - gpu.curve.energy_j(max(0.0, t - 1.0))) / min(1.0, t or 1.0) * 1000)
        return round(gpu.curve.power_w(t) * 1000)

    @staticmethod
    def energy_mj(gpu: FakeGpu, t: float) -> int:
        return gpu.energy_offset_mj + math.floor(gpu.curve.energy_j(FakeNvml.energy_instant(gpu, t)) * 1000)

    @staticmethod
    def energy_instant(gpu: FakeGpu, t: float) -> float:
        """The curve time whose energy the counter shows at `t`: its last update."""
        return math.floor(t / gpu.energy_period_s + 1e-9) * gpu.energy_period_s

    @staticmethod
    def gauge_instant(gpu: FakeGpu, t: float) -> float:
        """The curve time the power readings show at `t`: their last update (half a period off the counter's)."""
        period = gpu.gauge_update_s
        if not period:
            return t
        return max(0.0, (math.floor((t - period / 2) / period + 1e-9) + 0.5) * period)

    @staticmethod
    def power_average_mw(gpu: FakeGpu, t: float) -> int:
        """Field 185: the power averaged over the trailing second, as of the last update."""
        at = FakeNvml.gauge_instant(gpu, t)
        return round((gpu.curve.energy_j(at) - gpu.curve.energy_j(max(0.0, at - 1.0))) / min(1.0, at or 1.0) * 1000)

    @staticmethod
    def power_instant_mw(gpu: FakeGpu, t: float) -> int:
        """Field 186: the power at the last update."""
        return round(gpu.curve.power_w(FakeNvml.gauge_instant(gpu, t)) * 1000)

    # -- library lifetime ---------------------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if not self.library:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._ready()
        self.initialized -= 1

    def _ready(self) -> None:
        self.calls += 1
        if self.initialized <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: _Handle, function: str) -> FakeGpu:
        self._ready()
        gpu = handle.gpu
        if gpu.lost_at_s is not None and self.clock() >= gpu.lost_at_s:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if function in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if handle.mig_slot is not None and function in _NOT_ON_MIG:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # -- discovery ----------------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._ready()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        self._ready()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(self.gpus[index])

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetUUID")
        return gpu.uuid if handle.mig_slot is None else f"MIG-{gpu.uuid[4:-4]}{handle.mig_slot:04d}"

    def nvmlDeviceGetName(self, handle: _Handle) -> str:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetName")
        return gpu.name if handle.mig_slot is None else f"{gpu.name} MIG {gpu.mig_profiles[handle.mig_slot]}"

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=self._gpu(handle, "nvmlDeviceGetPciInfo").pci_bus_id)

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        mode = self.NVML_DEVICE_MIG_ENABLE if gpu.mig_profiles else self.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]  # [current, pending]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:  # noqa: N802
        self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if index >= len(gpu.mig_profiles):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:  # noqa: N802
        self._gpu(handle, "nvmlDeviceGetGpuInstanceId")
        assert handle.mig_slot is not None
        return [7, 8, 9, 11, 12, 13, 14][handle.mig_slot]

    # -- readings -------------------------------------------------------------------------------------
    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetPowerUsage")
        t = self.clock()
        if not gpu.gauge_update_s:
            return self.power_mw(gpu, t)
        return self.power_average_mw(gpu, t) if gpu.ampere_or_newer else self.power_instant_mw(gpu, t)

    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: Sequence[int | tuple[int, int]]  # noqa: N802
                                 ) -> list[SimpleNamespace]:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        t = self.clock()
        out = []
        for entry in field_ids:
            field_id, scope = entry if isinstance(entry, tuple) else (entry, 0)
            value = SimpleNamespace(dVal=0.0, uiVal=0, ulVal=0, ullVal=0, sllVal=0, siVal=0, usVal=0)
            answer = SimpleNamespace(fieldId=field_id, scopeId=scope, timestamp=0, latencyUsec=0,
                                     valueType=self.NVML_VALUE_TYPE_UNSIGNED_INT, nvmlReturn=NVML_SUCCESS, value=value)
            if field_id == self.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION and handle.mig_slot is None:
                answer.valueType, value.ullVal = self.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, self.energy_mj(gpu, t)
                at = self.energy_instant(gpu, t)
            elif field_id == self.NVML_FI_DEV_POWER_AVERAGE and handle.mig_slot is None:
                value.uiVal, at = self.power_average_mw(gpu, t), self.gauge_instant(gpu, t)
            elif field_id == self.NVML_FI_DEV_POWER_INSTANT and handle.mig_slot is None:
                value.uiVal, at = self.power_instant_mw(gpu, t), self.gauge_instant(gpu, t)
            else:
                answer.nvmlReturn, at = NVML_ERROR_NOT_SUPPORTED, t
            answer.timestamp = round((gpu.wall_zero_s + at) * 1e6)
            out.append(answer)
        return out

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._ready()
        return self.DRIVER_VERSION

    def nvmlSystemGetNVMLVersion(self) -> str:  # noqa: N802
        self._ready()
        return self.NVML_VERSION

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._ready()
        return self.CUDA_DRIVER_VERSION

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, kind: int) -> int:  # noqa: N802
        self._gpu(handle, "nvmlDeviceGetMaxClockInfo")
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 3201}[kind]

    def nvmlDeviceGetPowerManagementLimit(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetPowerManagementLimit").power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:  # noqa: N802
        return self.energy_mj(self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption"), self.clock())

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        busy = round(gpu.curve.sm_percent(self.clock()))
        return SimpleNamespace(gpu=busy, memory=busy // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> SimpleNamespace:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        total = gpu.memory_total if handle.mig_slot is None else 10 * (1 << 30)
        used = gpu.memory_used(self.clock()) if handle.mig_slot is None else (handle.mig_slot + 1) << 28
        return SimpleNamespace(total=total, free=total - used, used=used)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 30 + round(gpu.curve.power_w(self.clock()) / 20)

    def nvmlDeviceGetDecoderUtilization(self, handle: _Handle) -> list[int]:  # noqa: N802
        self._gpu(handle, "nvmlDeviceGetDecoderUtilization")
        return [3, 167_000]  # [utilisation %, sampling period µs]

    def nvmlDeviceGetEncoderUtilization(self, handle: _Handle) -> list[int]:  # noqa: N802
        self._gpu(handle, "nvmlDeviceGetEncoderUtilization")
        return [1, 167_000]

    def nvmlDeviceGetJpgUtilization(self, handle: _Handle) -> list[int]:  # noqa: N802
        self._gpu(handle, "nvmlDeviceGetJpgUtilization")
        return [2, 167_000]

    def nvmlDeviceGetViolationStatus(self, handle: _Handle, policy: int) -> SimpleNamespace:  # noqa: N802
        self._gpu(handle, "nvmlDeviceGetViolationStatus")
        assert policy == self.NVML_PERF_POLICY_POWER
        t = self.clock()
        return SimpleNamespace(referenceTime=int(t * 1e6), violationTime=int(t * 1e8))  # throttled 10 % of the time

    def nvmlDeviceGetClockInfo(self, handle: _Handle, kind: int) -> int:  # noqa: N802
        self._gpu(handle, "nvmlDeviceGetClockInfo")
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 2619}[kind]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: _Handle, last_seen: int) -> list[SimpleNamespace]:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetProcessesUtilizationInfo")
        busy = gpu.curve.sm_percent(self.clock())
        return [SimpleNamespace(pid=4242, smUtil=round(busy * 0.75)),
                SimpleNamespace(pid=4243, smUtil=round(busy * 0.25))]

    # -- GPM (Hopper and newer) ---------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: _Handle) -> SimpleNamespace:  # noqa: N802
        gpu = self._gpu(handle, "nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(isSupportedDevice=int(gpu.gpm))

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:  # noqa: N802
        self._ready()
        return SimpleNamespace(time=None, busy=None)

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:  # noqa: N802
        self._ready()

    def nvmlGpmSampleGet(self, handle: _Handle, sample: SimpleNamespace) -> None:  # noqa: N802
        gpu = self._gpu(handle, "nvmlGpmSampleGet")
        sample.time = self.clock()
        sample.busy = gpu.curve.sm_busy_s(sample.time)

    @staticmethod
    def c_nvmlGpmMetricsGet_t() -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                               metrics=[SimpleNamespace(metricId=0, value=0.0) for _ in range(98)])

    def nvmlGpmMetricsGet(self, request: SimpleNamespace) -> None:  # noqa: N802
        self._ready()
        first, second = request.sample1, request.sample2
        for metric in request.metrics[: request.numMetrics]:
            assert metric.metricId == self.NVML_GPM_METRIC_SM_UTIL
            span = second.time - first.time
            metric.value = 100 * (second.busy - first.busy) / span if span > 0 else 0.0


_NOT_ON_MIG = frozenset(["nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
                         "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetEnforcedPowerLimit"])


def module_attributes(fake: FakeNvml) -> dict[str, Any]:
    """The names `import pynvml` gives, bound to `fake` (tests/fakes/modules/pynvml.py)."""
    names = [n for n in dir(fake) if n.startswith(("nvml", "NVML", "c_nvml"))]
    out: dict[str, Any] = {n: getattr(fake, n) for n in names}
    out.update({n: v for n, v in globals().items() if n.startswith("NVMLError")})
    return out
