"""Local GPU sources: the machine's own GPUs read through their vendor library, as a Prometheus text page.

    nvml.py     NVIDIA, through NVML (`nvidia-ml-py`'s `pynvml`): DCGM's field names, `pynvml://localhost`
    amdsmi.py   AMD, through ROCm's `amdsmi`: device-metrics-exporter's names, `amdsmi://localhost`
    runner.py   the thread that reads one on the collection clock and hands its pages on
    page.py     the page writer both use

A reader's page enters the pipeline where an exporter's does (endpoint id, sample time in ns, page bytes), so
records, the report, per-phase files, OTLP and the pull `/metrics` page need nothing of their own.
"""

from __future__ import annotations

from bridge.errors import ConfigError

NVML_SOURCE = "pynvml://localhost"
AMDSMI_SOURCE = "amdsmi://localhost"
SOURCES = {"pynvml": NVML_SOURCE, "amdsmi": AMDSMI_SOURCE}


class SourceError(ConfigError):
    """A local source that cannot start: its library is missing or sees no GPU. One line, naming the fix."""
