"""The local AMD GPUs through ROCm's `amdsmi` module, as a page in AMD device-metrics-exporter's names.

AIPerf 0.13's amdsmi readings and probe order (ai-dynamo/aiperf `src/aiperf/gpu_telemetry/amdsmi_collector.py`),
written under the exporter family that carries the same quantity, in that family's unit, so the AMD dialect
(bridge/data/fields_other.csv) turns both into AIPerf's amd_* keys alike:

    amdsmi_get_power_info: socket_power, else current_socket_power, else average_socket_power  W → gpu_package_power
    amdsmi_get_energy_count: energy_accumulator (ROCm 6.x: power) × counter_resolution µJ → gpu_energy_consumed
    amdsmi_get_gpu_activity: gfx/umc/mm_activity %   → gpu_gfx_activity, gpu_umc_activity, gpu_mma_activity
    amdsmi_get_gpu_memory_usage / _total(VRAM)    B  → gpu_used_vram, gpu_total_vram (MB)
    amdsmi_get_temp_metric(JUNCTION, else HOTSPOT)   → gpu_junction_temperature (°C; bindings before 26.x and
                                                       values above 200 are millidegrees, as AIPerf reads them)
    amdsmi_get_gpu_total_ecc_count: uncorrectable_count → gpu_ecc_uncorrect_total
    amdsmi_get_gpu_metrics_info: throttle_status / indep_throttle_status → amdsmi_throttle_status (0/1)

A reading answered with "N/A" or an AmdSmiException is left out of the GPU's lines. The `amdsmi` package on PyPI
must match the installed ROCm (its version follows ROCm's amd-smi library); ROCm also ships the matching wheel
in /opt/rocm/share/amd_smi.
"""

from __future__ import annotations

import contextlib
import importlib
import socket
from collections.abc import Callable
from types import ModuleType
from typing import Any

from bridge.sources import AMDSMI_SOURCE, Library, SourceError, start_library
from bridge.sources.page import Reading, render_page

EXTRA = ("pip install 'dcgm-bridge[amd]' (the amdsmi version must match the installed ROCm), or ROCm's own wheel "
         "from /opt/rocm/share/amd_smi")
LIBRARY = Library("amdsmi", "amdsmi", "AMD", start_fix="is the amdgpu driver loaded and ROCm installed?",
                  remote_fix="pass their device-metrics-exporter URLs")
_HELP = {
    "gpu_package_power": "Current socket power in Watts",
    "gpu_energy_consumed": "Accumulated energy consumed by the GPU in uJ",
    "gpu_gfx_activity": "Graphics engine usage in Percentage (0-100)",
    "gpu_umc_activity": "Memory engine usage in Percentage (0-100)",
    "gpu_mma_activity": "Average MultiMedia (MM) engine usage in Percentage (0-100)",
    "gpu_used_vram": "Used VRAM memory of the GPU (in MB)",
    "gpu_total_vram": "Total VRAM memory of the GPU (in MB)",
    "gpu_junction_temperature": "Current junction/hotspot temperature in Celsius",
    "gpu_ecc_uncorrect_total": "Total Uncorrectable error count",
    "amdsmi_throttle_status": "Throttling now (1) or not (0), from amdsmi's throttle_status",
}


def import_amdsmi() -> ModuleType:
    try:
        return importlib.import_module("amdsmi")
    except ImportError:
        raise SourceError(f"--gpu-telemetry amdsmi: the amdsmi module is not installed; {EXTRA}") from None


def _number(value: Any) -> float | None:
    """amdsmi answers "N/A" for a sensor a part lacks; a bool is a flag, not a reading."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class AmdSmiReader:
    """One page per `read_page` call. Not thread-safe: one runner owns it."""

    source = AMDSMI_SOURCE

    def __init__(self, smi: ModuleType, hostname: str) -> None:
        self.smi = smi
        self.hostname = hostname
        self._gpus: list[tuple[Any, dict[str, str]]] = []

    @classmethod
    def open(cls, smi: ModuleType | None = None, hostname: str | None = None) -> AmdSmiReader:
        reader = cls(smi or import_amdsmi(), hostname or socket.gethostname())
        reader._gpus = start_library(LIBRARY, reader.smi.AmdSmiException, reader.smi.amdsmi_init, reader._find,
                                     reader.close)
        return reader

    def _find(self) -> list[tuple[Any, dict[str, str]]]:
        return [(handle, self._labels(i, handle)) for i, handle in enumerate(self.smi.amdsmi_get_processor_handles())]

    def close(self) -> None:
        with contextlib.suppress(self.smi.AmdSmiException):
            self.smi.amdsmi_shut_down()
        self._gpus = []

    def _labels(self, index: int, handle: Any) -> dict[str, str]:
        smi = self.smi
        uuid = self._call(lambda: smi.amdsmi_get_gpu_device_uuid(handle)) or f"GPU-unknown-{index}"
        board = self._call(lambda: smi.amdsmi_get_gpu_board_info(handle)) or {}
        labels = {"gpu_id": str(index), "gpu_uuid": str(uuid), "card_model": str(board.get("product_name") or
                                                                                 "Unknown AMD GPU"),
                  "hostname": self.hostname}
        serial = board.get("product_serial")
        if isinstance(serial, str) and serial and serial != "N/A":
            labels["serial_number"] = serial
        bdf = self._call(lambda: smi.amdsmi_get_gpu_device_bdf(handle))
        if isinstance(bdf, str):
            labels["pci_bus_id"] = bdf
        return labels

    def _call(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self.smi.AmdSmiException:
            return None

    def read_page(self, now_ns: int) -> bytes:
        readings: list[Reading] = []
        for handle, labels in self._gpus:
            readings += [(family, labels, value) for family, value in self._read_gpu(handle) if value is not None]
        return render_page(readings, _HELP, {})

    def _read_gpu(self, handle: Any) -> list[tuple[str, float | None]]:
        smi = self.smi
        out: list[tuple[str, float | None]] = []
        power = self._call(lambda: smi.amdsmi_get_power_info(handle)) or {}
        watts = next((v for v in map(_number, (power.get("socket_power"), power.get("current_socket_power"),
                                                power.get("average_socket_power"))) if v is not None), None)
        out.append(("gpu_package_power", watts))
        energy = self._call(lambda: smi.amdsmi_get_energy_count(handle)) or {}
        ticks = _number(energy.get("energy_accumulator"))
        ticks = ticks if ticks is not None else _number(energy.get("power"))  # ROCm 6.x's name for it
        resolution = _number(energy.get("counter_resolution"))
        out.append(("gpu_energy_consumed", ticks * resolution if ticks is not None and resolution is not None
                    else None))
        activity = self._call(lambda: smi.amdsmi_get_gpu_activity(handle)) or {}
        out += [("gpu_gfx_activity", _number(activity.get("gfx_activity"))),
                ("gpu_umc_activity", _number(activity.get("umc_activity"))),
                ("gpu_mma_activity", _number(activity.get("mm_activity")))]
        vram = smi.AmdSmiMemoryType.VRAM
        used = _number(self._call(lambda: smi.amdsmi_get_gpu_memory_usage(handle, vram)))
        total = _number(self._call(lambda: smi.amdsmi_get_gpu_memory_total(handle, vram)))
        out += [("gpu_used_vram", used / 1e6 if used is not None else None),
                ("gpu_total_vram", total / 1e6 if total is not None else None)]
        out.append(("gpu_junction_temperature", self._temperature(handle)))
        ecc = self._call(lambda: smi.amdsmi_get_gpu_total_ecc_count(handle)) or {}
        out.append(("gpu_ecc_uncorrect_total", _number(ecc.get("uncorrectable_count"))))
        metrics = self._call(lambda: smi.amdsmi_get_gpu_metrics_info(handle)) or {}
        flags = [metrics.get("throttle_status"), metrics.get("indep_throttle_status")]
        if any(isinstance(v, bool | int | float) for v in flags):
            out.append(("amdsmi_throttle_status", float(any(isinstance(v, bool | int | float) and v for v in flags))))
        return out

    def _temperature(self, handle: Any) -> float | None:
        smi = self.smi
        for kind in ("JUNCTION", "HOTSPOT"):
            sensor = getattr(smi.AmdSmiTemperatureType, kind)
            try:
                value = _number(smi.amdsmi_get_temp_metric(handle, sensor, smi.AmdSmiTemperatureMetric.CURRENT))
            except smi.AmdSmiException:
                continue
            if value is None:
                continue
            version = str(getattr(smi, "__version__", "26"))
            major = version.split(".", 1)[0]
            if (major.isdigit() and int(major) < 26) or value > 200:  # millidegrees (AIPerf's rule)
                value /= 1000
            return value
        return None
