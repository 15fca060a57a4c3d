"""dcgm-exporter-shaped pages made on demand (seeded), for tests and bench/bench_otlp.py.

The shape follows NVIDIA/dcgm-exporter `internal/pkg/rendermetrics/render_metrics.go`: HELP/TYPE per
family, families in field order, one row per GPU, `%f` doubles and `%d` integers, the 7 bare-metal
labels plus the 3 pod-mapping ones.
"""

from __future__ import annotations

import random

# (name, type, help): dcgm-exporter's default-counters.csv, then DCP/extra fields up to 40.
FAMILIES: list[tuple[str, str, str]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus in bytes per second.",
    ),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM."),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active."),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active."),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active."),
    (
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over NVLink in bytes per second.",
    ),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "The rate of data received over NVLink in bytes per second."),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W)."),
    ("DCGM_FI_DEV_MAX_SM_CLOCK", "gauge", "Maximum SM clock (in MHz)."),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "gauge", "Slowdown temperature (in C)."),
    ("DCGM_FI_DEV_SHUTDOWN_TEMP", "gauge", "Shutdown temperature (in C)."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in us)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in us)."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
]
COUNTERS = frozenset(name for name, kind, _ in FAMILIES if kind == "counter")


def gpu_labels(gpu: int, host: str = "gpu-node-01", pod_labels: bool = True) -> str:
    uuid = f"GPU-{gpu:08x}-7953-256e-8f33-1343419b1a1c"
    text = (
        f'gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",device="nvidia{gpu}",'
        f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",DCGM_FI_DRIVER_VERSION="580.105.08"'
    )
    if pod_labels:
        text += ',container="vllm",namespace="bench",pod="vllm-0"'
    return text


def dcgm_page(
    *,
    gpus: int = 8,
    families: int = 40,
    step: int = 0,
    seed: int = 0,
    host: str = "gpu-node-01",
    counter_base: float = 0.0,
    missing: frozenset[tuple[str, int]] = frozenset(),
    pod_labels: bool = True,
) -> str:
    """Page number `step` of a run: counters grow by a seeded amount per step from `counter_base`."""
    rng = random.Random(seed * 1_000_003 + step)
    lines = []
    labels = [gpu_labels(g, host, pod_labels) for g in range(gpus)]
    for name, kind, help_text in FAMILIES[:families]:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for gpu in range(gpus):
            if (name, gpu) in missing:
                continue
            if kind == "counter":
                value = f"{int(counter_base + 1000 * (step + 1) * (gpu + 1))}"
            else:
                value = f"{rng.uniform(0, 100):f}"
            lines.append(f"{name}{{{labels[gpu]}}} {value}")
    return "\n".join(lines) + "\n"
