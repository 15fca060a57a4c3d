"""What the simulated exporter emits: the field table, the dialects, the MIG profiles, XID texts.

Everything here is static data. Sources: dcgm-exporter etc/default-counters.csv (names, types, help),
DCGM dcgm_fields.h (field IDs: the exporter orders families by them), etc/1.x-compatibility-metrics.csv
(old names), NVIDIA's field table (NVIDIA/go-dcgm pkg/dcgm/const_fields.go, dcgm_fields.h: the DCGM 4.7 names
that dcgm-exporter 4.9+ writes, with their units), dcgm-exporter 4.9.0 / 4.10.0 release notes (FB capacity in
bytes; the PROF byte rates renamed ..._BYTES_PER_SECOND), internal/pkg/collector/xid_errors.go (err_msg).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, cast

# How a field behaves on a MIG GPU-instance series (dcgm-exporter §2.6, #317, #353, #216):
# "device": the parent GPU's value repeated on every instance; "instance": the instance's own value;
# "whole-gpu": not supported per instance, so absent when MIG is on (GPU_UTIL and friends).
MigScope = Literal["device", "instance", "whole-gpu"]


@dataclass(frozen=True, slots=True)
class FieldDef:
    key: str  # the field's name in dcgm-exporter <= 4.8 (and the model's value key)
    field_id: int  # DCGM field ID: the family order on a page
    prom_type: Literal["gauge", "counter"]
    help: str
    integer: bool  # DCGM INT64 (printed %d) or DOUBLE (printed %f)
    mig: MigScope
    default: bool  # an active row of etc/default-counters.csv
    old_name: str | None  # `-o` / 1.x name; None: not in 1.x-compatibility-metrics.csv
    si_name: str  # dcgm-exporter 4.9+ (DCGM 4.7) name
    si_help: str
    si_scale: int | float  # value in the <= 4.8 unit x si_scale = value in the SI unit
    si_integer: bool  # printed %d in the SI dialect
    si_only: bool  # emitted only by 4.9+ (FB capacity is collected by default there)


# One row per family, in DCGM field-ID order (the exporter's family order). Columns: name after
# "DCGM_FI_" | field ID | type | INT or DOUBLE | MIG scope | in default-counters.csv | `-o` name |
# 4.9+ name, DCGM 4.7's from NVIDIA's field table ("=" keeps it, "+NAME": emitted by 4.9+ only) |
# 4.9+ scale (legacy unit -> the table's unit) | help. Indented lines continue
# the row.
# About 40 families per GPU, as on a real 8-GPU H100 node with some optional counters enabled.
_TABLE = """
DEV_SM_CLOCK | 100 | gauge | int | device | y | dcgm_sm_clock | DEV_SM_CLOCK_HERTZ | 1000000 |
  SM clock frequency (in MHz).
DEV_MEM_CLOCK | 101 | gauge | int | device | y | dcgm_memory_clock | DEV_MEMORY_CLOCK_HERTZ | 1000000 |
  Memory clock frequency (in MHz).
DEV_MEMORY_TEMP | 140 | gauge | int | device | y | dcgm_memory_temp | DEV_MEMORY_TEMP_CELSIUS | 1 |
  Memory temperature (in C).
DEV_GPU_TEMP | 150 | gauge | int | device | y | dcgm_gpu_temp | DEV_GPU_TEMP_CELSIUS | 1 |
  GPU temperature (in C).
DEV_POWER_USAGE | 155 | gauge | dbl | device | y | dcgm_power_usage | DEV_BOARD_POWER_WATTS | 1 |
  Power draw (in W).
DEV_TOTAL_ENERGY_CONSUMPTION | 156 | counter | int | device | y | dcgm_total_energy_consumption |
  DEV_GPU_ENERGY_JOULES_TOTAL | 0.001 |
  Total energy consumption since boot (in mJ).
DEV_PCIE_REPLAY_COUNTER | 202 | counter | int | device | y | dcgm_pcie_replay_counter | DEV_PCIE_REPLAY_TOTAL | 1 |
  Total number of PCIe retries.
DEV_GPU_UTIL | 203 | gauge | int | whole-gpu | y | dcgm_gpu_utilization | DEV_GPU_UTIL_RATIO | 0.01 |
  GPU utilization (in %).
DEV_MEM_COPY_UTIL | 204 | gauge | int | whole-gpu | y | dcgm_mem_copy_utilization | = | 1 |
  Memory utilization (in %).
DEV_ENC_UTIL | 206 | gauge | int | whole-gpu | y | dcgm_enc_utilization | = | 1 |
  Encoder utilization (in %).
DEV_DEC_UTIL | 207 | gauge | int | whole-gpu | y | dcgm_dec_utilization | = | 1 |
  Decoder utilization (in %).
DEV_XID_ERRORS | 230 | gauge | int | instance | y | dcgm_xid_errors | DEV_XID_ERROR | 1 |
  Value of the last XID error encountered.
DEV_POWER_VIOLATION | 240 | counter | int | device | n | dcgm_power_violation | = | 1 |
  Throttling duration due to power constraints (in ns).
DEV_THERMAL_VIOLATION | 241 | counter | int | device | n | dcgm_thermal_violation | = | 1 |
  Throttling duration due to thermal constraints (in ns).
DEV_SYNC_BOOST_VIOLATION | 242 | counter | int | device | n | - | = | 1 |
  Throttling duration due to sync-boost constraints (in ns).
DEV_BOARD_LIMIT_VIOLATION | 243 | counter | int | device | n | - | = | 1 |
  Throttling duration due to board limit constraints (in ns).
DEV_LOW_UTIL_VIOLATION | 244 | counter | int | device | n | - | = | 1 |
  Throttling duration due to low utilization (in ns).
DEV_RELIABILITY_VIOLATION | 245 | counter | int | device | n | - | = | 1 |
  Throttling duration due to reliability constraints (in ns).
DEV_FB_TOTAL | 250 | gauge | int | instance | y | - | +DEV_FB_CAPACITY_BYTES | 1048576 |
  Framebuffer memory capacity (in MiB).
DEV_FB_FREE | 251 | gauge | int | instance | y | dcgm_fb_free | = | 1 |
  Framebuffer memory free (in MiB).
DEV_FB_USED | 252 | gauge | int | instance | y | dcgm_fb_used | = | 1 |
  Framebuffer memory used (in MiB).
DEV_FB_RESERVED | 253 | gauge | int | instance | y | - | = | 1 |
  Framebuffer memory reserved (in MiB).
DEV_ECC_SBE_VOL_TOTAL | 310 | counter | int | device | n | - | = | 1 |
  Total number of single-bit volatile ECC errors.
DEV_ECC_DBE_VOL_TOTAL | 311 | counter | int | device | n | - | = | 1 |
  Total number of double-bit volatile ECC errors.
DEV_UNCORRECTABLE_REMAPPED_ROWS | 393 | counter | int | device | y | - | DEV_ROW_REMAP_UNCORRECTABLE_TOTAL | 1 |
  Number of remapped rows for uncorrectable errors
DEV_CORRECTABLE_REMAPPED_ROWS | 394 | counter | int | device | y | - | DEV_ROW_REMAP_CORRECTABLE_TOTAL | 1 |
  Number of remapped rows for correctable errors
DEV_ROW_REMAP_FAILURE | 395 | gauge | int | device | y | - | DEV_ROW_REMAP_FAILED | 1 |
  Whether remapping of rows has failed
DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL | 409 | counter | int | device | n | - | DEV_NVLINK_CRC_FLIT_ERROR_TOTAL | 1 |
  Total number of NVLink flow-control CRC errors.
DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL | 419 | counter | int | device | n | - | DEV_NVLINK_CRC_DATA_ERROR_TOTAL | 1 |
  Total number of NVLink data CRC errors.
DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL | 429 | counter | int | device | n | - | DEV_NVLINK_REPLAY_ERROR_TOTAL | 1 |
  Total number of NVLink retries.
DEV_NVLINK_BANDWIDTH_TOTAL | 449 | counter | int | device | y | dcgm_nvlink_bandwidth_total |
  DEV_NVLINK_THROUGHPUT_TOTAL | 1000000 |
  Total number of NVLink bandwidth counters for all lanes.
DEV_VGPU_LICENSE_STATUS | 526 | gauge | int | device | y | - | = | 1 |
  vGPU License status
PROF_GR_ENGINE_ACTIVE | 1001 | gauge | dbl | instance | y | - | PROF_GR_ENGINE_UTIL_RATIO | 1 |
  Ratio of time the graphics engine is active.
PROF_SM_ACTIVE | 1002 | gauge | dbl | instance | n | - | PROF_SM_UTIL_RATIO | 1 |
  The ratio of cycles an SM has at least 1 warp assigned.
PROF_SM_OCCUPANCY | 1003 | gauge | dbl | instance | n | - | PROF_SM_OCCUPANCY_RATIO | 1 |
  The ratio of number of warps resident on an SM.
PROF_PIPE_TENSOR_ACTIVE | 1004 | gauge | dbl | instance | y | - | PROF_TENSOR_UTIL_RATIO | 1 |
  Ratio of cycles the tensor (HMMA) pipe is active.
PROF_DRAM_ACTIVE | 1005 | gauge | dbl | instance | y | - | PROF_DRAM_UTIL_RATIO | 1 |
  Ratio of cycles the device memory interface is active sending or receiving data.
PROF_PIPE_FP64_ACTIVE | 1006 | gauge | dbl | instance | n | - | PROF_FP64_UTIL_RATIO | 1 |
  Ratio of cycles the fp64 pipes are active.
PROF_PIPE_FP32_ACTIVE | 1007 | gauge | dbl | instance | n | - | PROF_FP32_UTIL_RATIO | 1 |
  Ratio of cycles the fp32 pipes are active.
PROF_PIPE_FP16_ACTIVE | 1008 | gauge | dbl | instance | n | - | PROF_FP16_UTIL_RATIO | 1 |
  Ratio of cycles the fp16 pipes are active.
PROF_PCIE_TX_BYTES | 1009 | gauge | int | device | y | - | = | 1 |
  The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in
  bytes per second.
PROF_PCIE_RX_BYTES | 1010 | gauge | int | device | y | - | = | 1 |
  The rate of data received over the PCIe bus - including both protocol headers and data payloads - in
  bytes per second.
"""
# The units DCGM 4.7 changed (new ids in NVIDIA's table; GPU util per the 4.9.0 notes): MHz -> Hz, mJ -> J,
# % -> ratio, MB/s -> B/s, and FB capacity in bytes. Only rows whose scale is not 1 get the new unit.
_SI_UNITS = {
    "(in MHz).": "(in Hz).", "(in mJ).": "(in J).", "(in %).": "(ratio 0-1).", "(in MiB).": "(in bytes).",
}


def _si_help(help_: str, scale: str) -> str:
    if scale == "1":
        return help_
    for old, new in _SI_UNITS.items():
        help_ = help_.replace(old, new)
    return help_


def _parse_table(text: str) -> tuple[FieldDef, ...]:
    rows: list[str] = []
    for line in text.strip("\n").splitlines():
        if line.startswith(" ") and rows:
            rows[-1] += " " + line.strip()
        else:
            rows.append(line)
    fields = []
    for row in rows:
        key, fid, typ, fmt, mig, default, old, si, scale, help_ = (c.strip() for c in row.split("|", 9))
        key = "DCGM_FI_" + key
        scale_num: int | float = float(scale) if "." in scale else int(scale)
        fields.append(FieldDef(
            key=key,
            field_id=int(fid),
            prom_type="counter" if typ == "counter" else "gauge",
            help=help_,
            integer=fmt == "int",
            mig=cast(MigScope, mig),
            default=default == "y",
            old_name=None if old == "-" else old,
            si_name=key if si == "=" else "DCGM_FI_" + si.lstrip("+"),
            si_help=_si_help(help_, scale),
            si_scale=scale_num,
            si_integer=fmt == "int" and isinstance(scale_num, int),
            si_only=si.startswith("+"),
        ))
    return tuple(fields)


FIELDS: tuple[FieldDef, ...] = _parse_table(_TABLE)
FIELD_BY_KEY: Mapping[str, FieldDef] = MappingProxyType({f.key: f for f in FIELDS})

Naming = Literal["legacy", "old", "si", "si410", "amd"]

# AMD device-metrics-exporter (ROCm/device-metrics-exporter pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go, units from
# docs/configuration/metricslist.md): the families carrying the quantities a DCGM field does, every one a gauge.
# legacy field -> (family, value in the legacy unit x scale = value in the family's unit, help)
AMD_FAMILIES: Mapping[str, tuple[str, float, str]] = MappingProxyType({
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_package_power", 1, "Current socket power in Watts"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("gpu_energy_consumed", 1000,  # mJ -> uJ
                                             "Accumulated energy consumed by the GPU in uJ"),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_junction_temperature", 1, "Current junction/hotspot temperature in Celsius"),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gpu_memory_temperature", 1, "Current memory temperature in Celsius"),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_gfx_activity", 1, "Graphics engine usage in Percentage (0-100)"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_umc_activity", 1, "Memory engine usage in Percentage (0-100)"),
    "DCGM_FI_DEV_FB_TOTAL": ("gpu_total_vram", 1.048576, "Total VRAM memory of the GPU (in MB)"),  # MiB -> MB
    "DCGM_FI_DEV_FB_USED": ("gpu_used_vram", 1.048576, "Used VRAM memory of the GPU (in MB)"),
})

# dcgm-exporter 4.10.0 release notes: the PROF byte rates (ids 1009-1012) are written as ..._BYTES_PER_SECOND.
RENAMED_410: Mapping[str, str] = MappingProxyType({
    f"DCGM_FI_PROF_{bus}_{way}_BYTES": f"DCGM_FI_PROF_{bus}_{way}_BYTES_PER_SECOND"
    for bus in ("PCIE", "NVLINK") for way in ("TX", "RX")
})


@dataclass(frozen=True, slots=True)
class DialectSpec:
    """How one exporter version (or flag, or emulator) writes the same values."""

    naming: Naming
    uuid_label: str = "UUID"
    host_label: str = "Hostname"  # dcgm-exporter <= 4.8.2; `hostname` since #655 (4.6.0-4.8.3)
    driver_label: str = "DCGM_FI_DRIVER_VERSION"
    pod_keys: tuple[str, str, str] = ("pod", "namespace", "container")
    headers: bool = True
    openmetrics: bool = False
    sort_labels: bool = False  # run:ai's emulator sorts every label
    separator: str = ","  # the README example writes `{gpu="0", UUID=...}`
    prefix: str = ""  # AMD's exporter writes `amd_gpu_*` as well as `gpu_*` (render.py AMD_LABEL_SETS)
    amd_labels: int = 2025  # which of AMD's label sets (render.py AMD_LABEL_SETS)

    @property
    def content_type(self) -> str:
        if self.openmetrics:
            return "application/openmetrics-text; version=1.0.0; charset=utf-8"
        return "text/plain; charset=utf-8"  # Go's sniffed type: no `version=0.0.4`


DIALECTS: Mapping[str, DialectSpec] = MappingProxyType({
    "legacy": DialectSpec("legacy"),
    "current": DialectSpec("legacy", host_label="hostname"),
    # `-o/--use-old-namespace` with etc/1.x-compatibility-metrics.csv
    "old-namespace": DialectSpec(
        "old", uuid_label="uuid", pod_keys=("pod_name", "pod_namespace", "container_name")
    ),
    # dcgm-exporter 4.9 (DCGM 4.7 names and units) and 4.10 (the same, PROF byte rates ..._BYTES_PER_SECOND)
    "dcgm49": DialectSpec("si", host_label="hostname", driver_label="DCGM_FI_SYSTEM_DRIVER_VERSION"),
    "dcgm410": DialectSpec("si410", host_label="hostname", driver_label="DCGM_FI_SYSTEM_DRIVER_VERSION"),
    "bare": DialectSpec("legacy", headers=False),
    "openmetrics": DialectSpec("legacy", openmetrics=True),
    "sorted-labels": DialectSpec("legacy", sort_labels=True),
    "spaced": DialectSpec("legacy", separator=", "),
    # AMD device-metrics-exporter as real pages show it (../shared/data/amd, tests/data/amd): its 2025 label set with
    # bare names (ROCm/device-metrics-exporter PR #236) or `amd_` names (issue #233, exporter v1.3.1); its 2026 bare
    # metal label set, `amd_` names, no gpu_uuid (PR #558, ROCm 7.14).
    "amd": DialectSpec("amd", host_label="hostname"),
    "amd-prefixed": DialectSpec("amd", host_label="hostname", prefix="amd_"),
    "amd-2026": DialectSpec("amd", host_label="hostname", prefix="amd_", amd_labels=2026),
})


def family_name(field: FieldDef, naming: Naming) -> str | None:
    """The family's name in a naming scheme, or None when that scheme does not emit it."""
    if naming == "old":
        return field.old_name
    if naming == "si":
        return field.si_name
    if naming == "si410":
        return RENAMED_410.get(field.si_name, field.si_name)
    if naming == "amd":
        amd = AMD_FAMILIES.get(field.key)
        return amd[0] if amd is not None else None
    return None if field.si_only else field.key


# H100 80GB MIG profiles: (name, compute slices, memory MiB, NVML GPU-instance IDs in creation order).
MIG_PROFILES: Mapping[str, tuple[int, int, tuple[int, ...]]] = MappingProxyType({
    "7g.80gb": (7, 80_896, (0,)),
    "3g.40gb": (3, 40_448, (1, 2)),
    "2g.20gb": (2, 19_968, (3, 4, 5)),
    "1g.10gb": (1, 9_856, (7, 8, 9, 10, 11, 12, 13)),
})


def mig_profile_for(instances: int) -> str:
    """The largest H100 profile that fits `instances` times on one GPU."""
    if instances == 1:
        return "7g.80gb"
    if instances == 2:
        return "3g.40gb"
    if instances == 3:
        return "2g.20gb"
    return "1g.10gb"


# internal/pkg/collector/xid_errors.go (codes 0-172); the ones seen on LLM nodes. Codes missing
# here render as "Unknown Error", which the exporter itself writes only beyond 172.
XID_MESSAGES: Mapping[int, str] = MappingProxyType({
    0: "No Error",
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    140: "Unrecovered ECC Error",
    154: "GPU Recovery Action Changed",
})


def xid_message(code: int) -> str:
    return XID_MESSAGES.get(code, "Unknown Error")


# go-dcgm pkg/dcgm/const.go blank values, as old exporters leaked them (README, gpu-monitoring-tools#152).
BLANK_INT64 = "9223372036854775794"  # DCGM_FT_INT64_NOT_SUPPORTED
BLANK_INT32 = "2147483632"  # DCGM_FT_INT32_BLANK
BLANK_FP64 = "140737488355328.000000"  # DCGM_FT_FP64_BLANK (2^47), printed %f
BLANK_STRING = "<<<NULL>>>"
