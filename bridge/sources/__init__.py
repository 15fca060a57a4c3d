"""Local GPU sources: the machine's own GPUs read through their vendor library, as a Prometheus text page.

    nvml.py     NVIDIA, through NVML (`nvidia-ml-py`'s `pynvml`): DCGM's field names, `pynvml://localhost`
    amdsmi.py   AMD, through ROCm's `amdsmi`: device-metrics-exporter's names, `amdsmi://localhost`
    runner.py   the thread that reads one on the collection clock and hands its pages on
    page.py     the page writer both use

A reader's page enters the pipeline where an exporter's does (endpoint id, sample time in ns, page bytes), so
records, the report, per-phase files, OTLP and the pull `/metrics` page need nothing of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from bridge.errors import ConfigError

GpuT = TypeVar("GpuT")

NVML_SOURCE = "pynvml://localhost"
AMDSMI_SOURCE = "amdsmi://localhost"
SOURCES = {"pynvml": NVML_SOURCE, "amdsmi": AMDSMI_SOURCE}
LOCAL_SOURCES = frozenset(SOURCES.values())
# How long a GPU's energy counter holds one value: a read returns the last update, lagging by up to this.
# NVML's nvmlDeviceGetTotalEnergyConsumption updates every 100 ms, measured on an H200 (driver 580.159.04) by
# scripts/check-gpu.sh: bench/RESULTS.md, "A real GPU"; DCGM's energy field reads it. AMD's counters are not
# measured: the same is assumed, since no reading may be taken as fresher than the counter's own update.
COUNTER_HOLD_S = 0.1


class SourceError(ConfigError):
    """A local source that cannot start: its library is missing or sees no GPU. One line, naming the fix."""


def one_line(exc: BaseException) -> str:
    """A vendor library's message as one line (amdsmi's span lines: "Error code:\n\t48")."""
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclass(frozen=True, slots=True)
class Library:
    """What a local reader's start-up errors say: the `--gpu-telemetry` item, the library's name, the vendor,
    the fix when the library does not start, and where remote GPUs of that vendor are read instead."""

    item: str
    name: str
    vendor: str
    start_fix: str
    remote_fix: str


def start_library(library: Library, error: type[BaseException], start: Callable[[], object],
                  find: Callable[[], list[GpuT]], close: Callable[[], None]) -> list[GpuT]:
    """Start a vendor library and find its GPUs; each way it can fail is one SourceError naming the fix (the
    library shut down again where it had started)."""
    item, name = library.item, library.name
    try:
        start()
    except error as exc:
        raise SourceError(f"--gpu-telemetry {item}: {name} did not start ({one_line(exc)}): {library.start_fix}"
                          ) from None
    try:
        gpus = find()
    except error as exc:
        close()
        raise SourceError(f"--gpu-telemetry {item}: {name} cannot list the GPUs ({one_line(exc)})") from None
    if not gpus:
        close()
        raise SourceError(f"--gpu-telemetry {item}: {name} sees no {library.vendor} GPU on this machine; for remote "
                          f"GPUs {library.remote_fix}")
    return gpus
