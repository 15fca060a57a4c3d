"""The local NVIDIA GPUs through NVML (`pynvml`, from the `nvidia-ml-py` package), as a page of DCGM field names.

AIPerf 0.13's pynvml set and units (ai-dynamo/aiperf `src/aiperf/gpu_telemetry/pynvml_collector.py`), plus the
readings NVML answers cheaply (SM and memory clocks, total memory, the enforced power limit), each written in the
unit of the DCGM field whose name it takes, so the field table converts it as it converts dcgm-exporter's:

    nvmlDeviceGetPowerUsage              mW  → DCGM_FI_DEV_POWER_USAGE                 W
    nvmlDeviceGetTotalEnergyConsumption  mJ  → DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION    mJ
    nvmlDeviceGetUtilizationRates        %   → DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_MEM_COPY_UTIL
    nvmlDeviceGetMemoryInfo              B   → DCGM_FI_DEV_FB_USED, _FB_FREE (MiB), DCGM_FI_DEV_FB_CAPACITY_BYTES (B)
    nvmlDeviceGetTemperature(GPU)        °C  → DCGM_FI_DEV_GPU_TEMP
    nvmlDeviceGet{Decoder,Encoder}Utilization % → DCGM_FI_DEV_DEC_UTIL, DCGM_FI_DEV_ENC_UTIL
    nvmlDeviceGetJpgUtilization          %   → DCGM_BRIDGE_NVML_JPG_UTIL (no DCGM field: bridge/data/fields_other.csv)
    GPM SM utilisation, else Σ per-process smUtil  % → DCGM_FI_PROF_SM_ACTIVE (0-1)
    nvmlDeviceGetViolationStatus(POWER)  ns  → DCGM_FI_DEV_POWER_VIOLATION             ns
    nvmlDeviceGetClockInfo(SM, MEM)      MHz → DCGM_FI_DEV_SM_CLOCK, DCGM_FI_DEV_MEM_CLOCK
    nvmlDeviceGetEnforcedPowerLimit      mW  → DCGM_FI_DEV_ENFORCED_POWER_LIMIT        W

No XID: NVML delivers XIDs as events (nvmlEventSetCreate / nvmlEventSetWait), not as a value to poll.
A MIG-enabled GPU's instances are read for their memory only and written with the parent's UUID and their
GPU_I_ID, as dcgm-exporter writes them: NVML answers NOT_SUPPORTED for power, energy and utilisation on a MIG
handle, and the parent carries them. A reading a GPU does not support is left out of its lines; a GPU that
answers GPU_IS_LOST is left out of the page, said once.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from bridge.sources import NVML_SOURCE, Library, SourceError, one_line, start_library
from bridge.sources.page import Reading, render_page

logger = logging.getLogger(__name__)

EXTRA = "pip install 'dcgm-bridge[nvml]'"
LIBRARY = Library("pynvml", "NVML", "NVIDIA", start_fix="is the NVIDIA driver (libnvidia-ml.so.1) installed on this "
                                                       "machine?", remote_fix="pass their dcgm-exporter URLs")
_MIB = 1 << 20
_HELP = {
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "Total energy consumption since boot (in mJ).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": "Framebuffer memory capacity (in B).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_DEC_UTIL": "Decoder utilization (in %).",
    "DCGM_FI_DEV_ENC_UTIL": "Encoder utilization (in %).",
    "DCGM_BRIDGE_NVML_JPG_UTIL": "JPEG decoder utilization from NVML (in %).",
    "DCGM_FI_PROF_SM_ACTIVE": "Ratio of cycles an SM has at least 1 warp assigned (0-1).",
    "DCGM_FI_DEV_POWER_VIOLATION": "Throttling duration due to power constraints (in ns).",
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "Enforced power limit (in W).",
}
_KINDS = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter", "DCGM_FI_DEV_POWER_VIOLATION": "counter"}


def import_pynvml() -> ModuleType:
    """`pynvml` as nvidia-ml-py installs it, or one line naming the extra."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise SourceError(f"--gpu-telemetry pynvml: the pynvml module (package nvidia-ml-py) is not installed; "
                          f"{EXTRA}") from None


@dataclass
class _Gpu:
    index: int
    handle: Any
    labels: dict[str, str]
    gpm: list[Any] | None = None  # [previous sample, current sample] where GPM is supported
    instances: list[tuple[Any, dict[str, str]]] = field(default_factory=list)  # MIG handles and their labels
    unsupported: set[str] = field(default_factory=set)  # readings that answered NOT_SUPPORTED: not asked again


class NvmlReader:
    """One page per `read_page` call, every GPU's readings in DCGM's names. Not thread-safe: one runner owns it."""

    source = NVML_SOURCE

    def __init__(self, nvml: ModuleType, hostname: str) -> None:
        self.nvml = nvml
        self.hostname = hostname
        self.lost: set[str] = set()  # UUIDs that answered GPU_IS_LOST
        self._gpus: list[_Gpu] = []

    @classmethod
    def open(cls, nvml: ModuleType | None = None, hostname: str | None = None) -> NvmlReader:
        """Initialise NVML and find the GPUs; SourceError (one line) when the library or a GPU is missing."""
        reader = cls(nvml or import_pynvml(), hostname or socket.gethostname())
        reader._gpus = start_library(LIBRARY, reader.nvml.NVMLError, reader.nvml.nvmlInit, reader._find, reader.close)
        return reader

    def _find(self) -> list[_Gpu]:
        return [self._discover(index) for index in range(self.nvml.nvmlDeviceGetCount())]

    def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            for gpu in self._gpus:
                for sample in gpu.gpm or ():
                    self.nvml.nvmlGpmSampleFree(sample)
            self.nvml.nvmlShutdown()
        self._gpus = []

    def _discover(self, index: int) -> _Gpu:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _str(nvml.nvmlDeviceGetUUID(handle))
        labels = {"gpu": str(index), "UUID": uuid, "pci_bus_id": _str(nvml.nvmlDeviceGetPciInfo(handle).busId),
                  "device": f"nvidia{index}", "modelName": _str(nvml.nvmlDeviceGetName(handle)),
                  "Hostname": self.hostname}
        gpu = _Gpu(index, handle, labels)
        with contextlib.suppress(nvml.NVMLError):
            if nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                gpu.gpm = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
                nvml.nvmlGpmSampleGet(handle, gpu.gpm[0])  # the first interval starts now
        with contextlib.suppress(nvml.NVMLError):
            if nvml.nvmlDeviceGetMigMode(handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE:
                gpu.instances = list(self._instances(gpu))
        return gpu

    def _instances(self, gpu: _Gpu) -> Iterator[tuple[Any, dict[str, str]]]:
        nvml = self.nvml
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
            except nvml.NVMLError:  # NOT_FOUND: an empty slot
                continue
            name = _str(nvml.nvmlDeviceGetName(mig))
            profile = name.rsplit("MIG ", 1)[1] if "MIG " in name else ""
            yield mig, {**gpu.labels, "GPU_I_PROFILE": profile,
                        "GPU_I_ID": str(nvml.nvmlDeviceGetGpuInstanceId(mig))}

    # -- reading ----------------------------------------------------------------------------------
    def read_page(self, now_ns: int) -> bytes:
        """Every GPU's readings now (`now_ns` is the caller's sample time; NVML reads its own clock)."""
        readings: list[Reading] = []
        for gpu in self._gpus:
            uuid = gpu.labels["UUID"]
            if uuid in self.lost:
                continue
            try:
                readings += self._read_gpu(gpu)
            except self.nvml.NVMLError as exc:
                if _code(exc) != self.nvml.NVML_ERROR_GPU_IS_LOST:
                    raise
                self.lost.add(uuid)
                logger.warning("pynvml: GPU %s (%s) is lost (%s): its series end here", gpu.index, uuid, one_line(exc))
        return render_page(readings, _HELP, _KINDS)

    def _read_gpu(self, gpu: _Gpu) -> list[Reading]:
        nvml, handle, labels = self.nvml, gpu.handle, gpu.labels
        out: list[Reading] = []

        def add(family: str, call: Callable[[], float | None]) -> None:
            if family in gpu.unsupported:
                return
            try:
                value = call()
            except nvml.NVMLError as exc:
                if _code(exc) == nvml.NVML_ERROR_GPU_IS_LOST:
                    raise
                if _code(exc) == nvml.NVML_ERROR_NOT_SUPPORTED:
                    gpu.unsupported.add(family)
                return
            if value is not None:
                out.append((family, labels, float(value)))

        add("DCGM_FI_DEV_POWER_USAGE", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000)
        add("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        util = _or_none(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            out += [("DCGM_FI_DEV_GPU_UTIL", labels, float(util.gpu)),
                    ("DCGM_FI_DEV_MEM_COPY_UTIL", labels, float(util.memory))]
        if not gpu.instances:
            out += self._memory(handle, labels)
        add("DCGM_FI_DEV_GPU_TEMP", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        add("DCGM_FI_DEV_DEC_UTIL", lambda: nvml.nvmlDeviceGetDecoderUtilization(handle)[0])
        add("DCGM_FI_DEV_ENC_UTIL", lambda: nvml.nvmlDeviceGetEncoderUtilization(handle)[0])
        add("DCGM_BRIDGE_NVML_JPG_UTIL", lambda: nvml.nvmlDeviceGetJpgUtilization(handle)[0])
        add("DCGM_FI_PROF_SM_ACTIVE", lambda: self._sm_ratio(gpu))
        add("DCGM_FI_DEV_POWER_VIOLATION",
            lambda: nvml.nvmlDeviceGetViolationStatus(handle, nvml.NVML_PERF_POLICY_POWER).violationTime)
        add("DCGM_FI_DEV_SM_CLOCK", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        add("DCGM_FI_DEV_MEM_CLOCK", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))
        add("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000)
        for mig, mig_labels in gpu.instances:
            out += self._memory(mig, mig_labels)
        return out

    def _memory(self, handle: Any, labels: dict[str, str]) -> list[Reading]:
        memory = _or_none(self.nvml, lambda: self.nvml.nvmlDeviceGetMemoryInfo(handle))
        if memory is None:
            return []
        return [("DCGM_FI_DEV_FB_USED", labels, memory.used / _MIB),
                ("DCGM_FI_DEV_FB_FREE", labels, memory.free / _MIB),
                ("DCGM_FI_DEV_FB_CAPACITY_BYTES", labels, float(memory.total))]

    def _sm_ratio(self, gpu: _Gpu) -> float:
        """SM activity as a 0-1 ratio: GPM's SM utilisation over the interval since the last read where the GPU
        supports GPM (Hopper and newer), else the sum of the processes' smUtil capped at 100 % (AIPerf's fallback)."""
        nvml = self.nvml
        if gpu.gpm is not None:
            previous, current = gpu.gpm
            nvml.nvmlGpmSampleGet(gpu.handle, current)
            gpu.gpm = [current, previous]
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.sample1, request.sample2, request.numMetrics = previous, current, 1
            request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
            nvml.nvmlGpmMetricsGet(request)
            return min(float(request.metrics[0].value), 100.0) / 100
        processes = nvml.nvmlDeviceGetProcessesUtilizationInfo(gpu.handle, 0)
        return min(float(sum(p.smUtil for p in processes)), 100.0) / 100


def _or_none(nvml: ModuleType, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except nvml.NVMLError as exc:
        if _code(exc) == nvml.NVML_ERROR_GPU_IS_LOST:
            raise
        return None


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _str(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
