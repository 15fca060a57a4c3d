"""scripts/check-gpu.sh --record: a corpus of raw NVML reads on every GPU while known load shapes run on GPU 0.

    check_gpu.py --record [--fake] [--record-scale 1] [--out DIR]
    gpu_record.py --load --record-scale S [--no-load]          the load child (GPU 0), driven by --record

One run of about 7 minutes (`SHAPES`, 402 s at scale 1, plus the load's warm-up) polls NVML as fast as it answers:
per GPU and per read, `nvmlDeviceGetTotalEnergyConsumption` (mJ), `nvmlDeviceGetPowerUsage` (mW) and one
`nvmlDeviceGetFieldValues` call for the fields NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (83), NVML_FI_DEV_POWER_AVERAGE
(185) and NVML_FI_DEV_POWER_INSTANT (186) with the driver's own timestamp of each (field ids as nvidia-ml-py
13.615.71's pynvml.py defines them), each call timed on the monotonic clock. The load child drives GPU 0 through
`SHAPES` and reports its own marks (every phase's start and end, every on/off edge) on both clocks.

DIR/polls.bin.gz: the reads, one fixed-size little-endian row each (`ROW`, columns `COLUMNS`; -1 or NaN where a call
failed), gzip-compressed; DIR/manifest.json: the format, the machine as found (GPUs, driver, NVML version, clocks,
power limits), the poll spacing achieved, the marks. At most MAX_BYTES compressed (the device tool brings back
files of up to 16 MiB): past that the polls slow to every THROTTLE_S, said in the manifest. Standard library,
pynvml and (for the load) torch or CuPy only: it runs on a bare GPU machine. It never changes clocks, power limits
or MIG; the power-cap shape is bf16 matrix products as large as fit, which reach the cap on an H100/H200.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

# The load on GPU 0, in order: (name, seconds at scale 1, shape). Shapes: "idle"; ("square", half-period s);
# ("ramp",) duty 0 -> 1 in 0.1 s slots; ("bursts", seed) on and off for random 1-3 s each; ("full",); ("cap",) the
# heaviest products (bf16), at the power limit.
SHAPES: tuple[tuple[str, float, tuple], ...] = (
    ("idle", 30, ("idle",)), ("square_1s", 40, ("square", 1.0)), ("square_0.5s", 30, ("square", 0.5)),
    ("ramp", 60, ("ramp",)), ("bursts", 60, ("bursts", 47)), ("long_idle", 90, ("idle",)), ("spike", 2, ("full",)),
    ("cap", 60, ("cap",)), ("cool", 30, ("idle",)))
FIELDS = (83, 185, 186)  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT
ROW = "<BqqIIIqidqdqdq"
COLUMNS = ("gpu", "mono_ns", "wall_ns", "energy_done_ns", "power_done_ns", "fields_done_ns", "energy_mj", "power_mw",
           "field_energy_mj", "field_energy_us", "field_power_average_mw", "field_power_average_us",
           "field_power_instant_mw", "field_power_instant_us")
MAX_BYTES = 14 * (1 << 20)
THROTTLE_S = 0.01
_PACK = struct.Struct(ROW)


def _call(function, *args):  # type: ignore[no-untyped-def]
    try:
        return function(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: the reading is absent (-1/NaN)
        return None


def _field(value) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """(value, the driver's µs timestamp) of one c_nvmlFieldValue_t, or (NaN, -1) where it failed."""
    if value is None or value.nvmlReturn != 0:
        return math.nan, -1
    union = value.value
    number = {0: union.dVal, 1: union.uiVal, 2: union.ulVal, 3: union.ullVal, 4: union.sllVal, 5: union.siVal,
              6: getattr(union, "usVal", 0)}.get(value.valueType, union.ullVal)
    return float(number), int(value.timestamp)


def read_once(nvml, index: int, handle) -> bytes:  # type: ignore[no-untyped-def]
    """One read of one GPU: the three calls, each timed, packed as a ROW."""
    t0, wall = time.monotonic_ns(), time.time_ns()
    energy = _call(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
    t1 = time.monotonic_ns()
    power = _call(nvml.nvmlDeviceGetPowerUsage, handle)
    t2 = time.monotonic_ns()
    values = _call(nvml.nvmlDeviceGetFieldValues, handle, list(FIELDS))
    t3 = time.monotonic_ns()
    fields = [_field(values[i] if values is not None else None) for i in range(len(FIELDS))]
    return _PACK.pack(index, t0, wall, min(t1 - t0, 2**32 - 1), min(t2 - t0, 2**32 - 1), min(t3 - t0, 2**32 - 1),
                      -1 if energy is None else int(energy), -1 if power is None else int(power),
                      *[x for pair in fields for x in pair])


def _text(value):  # type: ignore[no-untyped-def]
    return value.decode() if isinstance(value, bytes) else value


def machine(nvml) -> dict:  # type: ignore[no-untyped-def]
    """The machine as found: versions, and per GPU its identity, clocks and power limits (nothing is changed)."""
    gpus = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        pci = _call(nvml.nvmlDeviceGetPciInfo, h)
        sm, mem = getattr(nvml, "NVML_CLOCK_SM", 1), getattr(nvml, "NVML_CLOCK_MEM", 2)
        gpus.append({
            "index": i, "name": _text(_call(nvml.nvmlDeviceGetName, h)),
            "uuid": _text(_call(nvml.nvmlDeviceGetUUID, h)), "pci_bus_id": _text(getattr(pci, "busId", None)),
            "clocks_mhz": {"sm": _call(nvml.nvmlDeviceGetClockInfo, h, sm),
                           "mem": _call(nvml.nvmlDeviceGetClockInfo, h, mem),
                           "sm_max": _call(getattr(nvml, "nvmlDeviceGetMaxClockInfo", None), h, sm),
                           "mem_max": _call(getattr(nvml, "nvmlDeviceGetMaxClockInfo", None), h, mem)},
            "power_limit_mw": {"enforced": _call(nvml.nvmlDeviceGetEnforcedPowerLimit, h),
                               "management": _call(getattr(nvml, "nvmlDeviceGetPowerManagementLimit", None), h)},
            "mig_mode": _call(getattr(nvml, "nvmlDeviceGetMigMode", None), h)})
    return {"driver": _text(_call(getattr(nvml, "nvmlSystemGetDriverVersion", None))),
            "nvml": _text(_call(getattr(nvml, "nvmlSystemGetNVMLVersion", None))),
            "cuda_driver": _call(getattr(nvml, "nvmlSystemGetCudaDriverVersion", None)), "gpus": gpus}


def _spacing(times: list[int]) -> dict:
    gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
    if not gaps:
        return {"reads": len(times)}
    return {"reads": len(times), "median_ms": gaps[len(gaps) // 2] / 1e6,
            "p95_ms": gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))] / 1e6, "max_ms": gaps[-1] / 1e6}


def record(out: Path, scale: float, fake: bool, max_bytes: int = MAX_BYTES) -> int:
    import pynvml as nvml

    if (out / "manifest.json").exists() or (out / "polls.bin.gz").exists():
        print(f"check-gpu: {out} already holds a corpus: give another --out (nothing recorded is overwritten)",
              file=sys.stderr)
        return 2
    try:
        nvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...: one line, exit 2
        print(f"check-gpu: NVML did not start ({error}): no NVIDIA driver here? (--fake rehearses without one)",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    found = machine(nvml)
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(len(found["gpus"]))]
    child = subprocess.Popen([sys.executable, __file__, "--load", "--record-scale", str(scale),
                              *(["--no-load"] if fake else [])], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})  # CUDA's 0 is NVML's 0
    assert child.stdin is not None and child.stdout is not None
    ready = child.stdout.readline().split()  # "ready <driver>" once the load has run once (its set-up)
    if not fake and ready[1:] in ([], ["none"]):  # say so before the minutes of polling, not after
        child.kill()
        child.wait()
        nvml.nvmlShutdown()
        print("check-gpu: no torch or CuPy with CUDA for this Python: the load cannot run, nothing recorded",
              file=sys.stderr)
        return 2
    marks: list[dict] = []

    def collect() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if line.strip():
                marks.append(json.loads(line))

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    deadline = time.monotonic() + scale * sum(s[1] for s in SHAPES) + 60
    times: list[list[int]] = [[] for _ in handles]
    throttled_at = None
    started = time.monotonic_ns()
    with (out / "polls.bin.gz").open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as gz:
        batch: list[bytes] = []
        tail_until = None
        going = False
        while time.monotonic() < deadline:
            for i, handle in enumerate(handles):
                row = read_once(nvml, i, handle)
                times[i].append(_PACK.unpack_from(row)[1])
                batch.append(row)
            if not going:  # the load starts once every GPU has been read: the reads cover the first mark
                child.stdin.write("go\n")
                child.stdin.flush()
                going = True
            if len(batch) >= 2048:
                gz.write(b"".join(batch))
                batch.clear()
                if throttled_at is None and raw.tell() > max_bytes:
                    throttled_at = time.monotonic_ns()
            if throttled_at is not None:
                time.sleep(THROTTLE_S)
            if tail_until is None and child.poll() is not None:
                tail_until = time.monotonic() + 2 * scale + 0.5  # the cool-down's last updates
            if tail_until is not None and time.monotonic() >= tail_until:
                break
        gz.write(b"".join(batch))
    child.kill()
    child.wait()
    reader.join(timeout=5)
    nvml.nvmlShutdown()
    size = (out / "polls.bin.gz").stat().st_size
    manifest = {
        "format": {"file": "polls.bin.gz", "compression": "gzip", "row_struct": ROW, "columns": list(COLUMNS),
                   "notes": "mono_ns: time.monotonic_ns() before the energy call; wall_ns: time.time_ns() then; "
                            "*_done_ns: ns after mono_ns each call returned (energy, power, the fields); field "
                            "timestamps: the driver's, µs; -1 or NaN: the call or field failed"},
        "fields": {"field_energy": "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (83)",
                   "field_power_average": "NVML_FI_DEV_POWER_AVERAGE (185)",
                   "field_power_instant": "NVML_FI_DEV_POWER_INSTANT (186)"},
        "fake": fake, "python": sys.version.split()[0], **found,
        "load": {"driver": ready[1] if len(ready) > 1 else None, "gpu": 0, "scale": scale,
                 "shapes": [{"name": n, "seconds": s * scale, "shape": list(k)} for n, s, k in SHAPES]},
        "started_mono_ns": started, "duration_s": (time.monotonic_ns() - started) / 1e9,
        "spacing": [_spacing(t) for t in times], "bytes": size, "max_bytes": max_bytes,
        "throttled_from_mono_ns": throttled_at, "throttle_s": THROTTLE_S if throttled_at else None,
        "marks": marks}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"recorded {sum(len(t) for t in times)} reads of {len(handles)} GPU(s) over {manifest['duration_s']:.0f} s "
          f"({size / (1 << 20):.1f} MiB): GPU 0 every {manifest['spacing'][0].get('median_ms', float('nan')):.2f} ms "
          f"(median), load: {manifest['load']['driver']}; {len(marks)} marks; driver {found['driver']}, "
          f"NVML {found['nvml']}; {out}")
    if throttled_at:
        print(f"past {max_bytes >> 20} MiB the polls slowed to every {THROTTLE_S * 1e3:.0f} ms")
    return 0


def matmul_driver(kind: str):  # type: ignore[no-untyped-def]
    """One unit of work on GPU 0 that blocks until done: fp32 4096² products ("full") or bf16 8192² ("cap")."""
    try:
        import torch

        if torch.cuda.is_available():
            a = torch.randn(4096, 4096, device="cuda")
            b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

            def work() -> None:
                (b @ b) if kind == "cap" else (a @ a)
                torch.cuda.synchronize()

            return "torch", work
    except ImportError:
        pass
    try:
        import cupy

        c = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32)
        d = cupy.random.standard_normal((8192, 8192), dtype=cupy.float32).astype(cupy.float16)

        def work_cupy() -> None:
            (d @ d) if kind == "cap" else (c @ c)
            cupy.cuda.Stream.null.synchronize()

        return "cupy", work_cupy
    except ImportError:
        return None


def load(scale: float, no_load: bool) -> None:
    """The load child: warm up, say "ready <driver>", wait for "go", run SHAPES, each mark a JSON line."""
    drivers = {} if no_load else {kind: matmul_driver(kind) for kind in ("full", "cap")}
    for found in drivers.values():
        if found is not None:
            found[1]()
    name = next((d[0] for d in drivers.values() if d is not None), "none")
    print(f"ready {name}", flush=True)
    sys.stdin.readline()

    def mark(**what: object) -> None:
        print(json.dumps({**what, "mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}), flush=True)

    def run_until(until: float, kind: str = "full") -> None:
        work = drivers.get(kind)
        while work is not None and time.monotonic() < until:
            work[1]()
        time.sleep(max(0.0, until - time.monotonic()))

    for name, seconds, shape in SHAPES:
        mark(phase=name, event="start")
        end = time.monotonic() + seconds * scale
        if shape[0] in ("full", "cap"):
            mark(edge="on")
            run_until(end, shape[0])
            mark(edge="off")
        elif shape[0] == "square":
            while time.monotonic() < end:
                mark(edge="on")
                run_until(min(end, time.monotonic() + shape[1] * max(scale, 0.05)))
                mark(edge="off")
                run_until(min(end, time.monotonic() + shape[1] * max(scale, 0.05)), "none")
        elif shape[0] == "ramp":
            begin = time.monotonic()
            while time.monotonic() < end:
                duty = (time.monotonic() - begin) / (end - begin)
                slot = time.monotonic()
                run_until(min(end, slot + 0.1 * duty))
                run_until(min(end, slot + 0.1), "none")
        elif shape[0] == "bursts":
            rng = random.Random(shape[1])
            while time.monotonic() < end:
                mark(edge="on")
                run_until(min(end, time.monotonic() + rng.uniform(1, 3) * max(scale, 0.05)))
                mark(edge="off")
                run_until(min(end, time.monotonic() + rng.uniform(1, 3) * max(scale, 0.05)), "none")
        else:
            run_until(end, "none")
        mark(phase=name, event="end")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--load", action="store_true")
    parser.add_argument("--no-load", action="store_true")
    parser.add_argument("--record-scale", type=float, default=1.0)
    arguments = parser.parse_args()
    load(arguments.record_scale, arguments.no_load)
    os._exit(0)
