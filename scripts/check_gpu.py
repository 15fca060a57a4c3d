"""scripts/check-gpu.sh's driver: our energy per phase against NVML's own counter, on this machine's GPUs.

    check_gpu.py [--fake] [--phase-s 18] [--out DIR]      the check (dcgm-bridge profile around the load)
    check_gpu.py --load PHASES_JSON --phase-s S            the benchmark profile runs: three load levels

It checks our windowing and pipeline against NVML's counter read directly at each phase's edges, not NVML's
absolute accuracy. It never changes clocks, power limits or MIG: the load is matrix products (torch or CuPy
where importable; otherwise the phases are idle, said so).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

LEVELS = (("idle", 0.0), ("half", 0.5), ("full", 1.0))


def energy_mj(nvml) -> int:  # type: ignore[no-untyped-def]
    """Σ of every GPU's total-energy counter (mJ), read now."""
    return sum(nvml.nvmlDeviceGetTotalEnergyConsumption(nvml.nvmlDeviceGetHandleByIndex(i))
               for i in range(nvml.nvmlDeviceGetCount()))


def update_period_s(nvml, seconds: float = 1.5) -> float | None:  # type: ignore[no-untyped-def]
    """The energy counter's update period: the median time between the changes a tight poll sees."""
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    changes: list[float] = []
    last = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        if value != last:
            changes.append(time.monotonic())
            last = value
        time.sleep(0.0005)
    gaps = [b - a for a, b in zip(changes, changes[1:], strict=False)]
    return statistics.median(gaps) if gaps else None


def _matmul_driver():  # type: ignore[no-untyped-def]
    """(name, one unit of work that blocks until the GPU has done it) or None."""
    try:
        import torch

        if torch.cuda.is_available():
            a = torch.randn(4096, 4096, device="cuda")

            def work() -> None:
                a @ a
                torch.cuda.synchronize()

            return "torch", work
    except ImportError:
        pass
    try:
        import cupy

        b = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32)

        def work_cupy() -> None:
            b @ b
            cupy.cuda.Stream.null.synchronize()

        return "cupy", work_cupy
    except ImportError:
        return None


def run_load(out: Path, phase_s: float) -> None:
    """The benchmark: three phases at 0, 50 and 100 % duty cycle; NVML's counter read at each edge."""
    import pynvml as nvml

    nvml.nvmlInit()
    driver = _matmul_driver()
    phases = []
    for name, duty in LEVELS:
        start_ns, before = time.time_ns(), energy_mj(nvml)
        end = time.monotonic() + phase_s
        while time.monotonic() < end:
            slot_end = time.monotonic() + 0.1
            busy_until = time.monotonic() + 0.1 * duty
            while driver is not None and time.monotonic() < busy_until:
                driver[1]()
            time.sleep(max(0.0, slot_end - time.monotonic()))
        after, end_ns = energy_mj(nvml), time.time_ns()
        phases.append({"name": name, "duty": duty, "start_ns": start_ns, "end_ns": end_ns,
                       "nvml_delta_j": (after - before) / 1000})
    nvml.nvmlShutdown()
    out.write_text(json.dumps({"driver": driver[0] if driver else None, "phases": phases}))


def power_integral_j(records: list[dict], start_ns: int, end_ns: int) -> float:
    """Σ over GPUs of the trapezoidal integral of the records' power over [start, end] (their own estimate)."""
    total = 0.0
    for uuid in {r["gpu_uuid"] for r in records}:
        points = sorted((r["timestamp_ns"], r["telemetry_data"].get("nvidia_power_usage")) for r in records
                        if r["gpu_uuid"] == uuid and r.get("gpu_instance_id") is None)
        points = [(t, p) for t, p in points if p is not None and start_ns <= t <= end_ns]
        total += sum((t2 - t1) / 1e9 * (p1 + p2) / 2 for (t1, p1), (t2, p2) in zip(points, points[1:], strict=False))
    return total


def our_energy(bridge: list[str], log: Path, start_ns: int, end_ns: int, out: Path, env: dict[str, str]) -> dict:
    subprocess.run([*bridge, "report", "--jsonl", str(log), "--start-ns", str(start_ns), "--end-ns", str(end_ns),
                    "--counter-mode", "interpolated", "--grace-ns", "0", "-o", str(out)],
                   check=True, env=env, capture_output=True, text=True)
    return json.loads(out.read_text()).get("nvidia_total_gpu_energy", {})


def check(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    if args.fake:
        fakes = [str(root / "tests" / "fakes" / "modules"), str(root)]
        env["PYTHONPATH"] = os.pathsep.join([*fakes, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.setdefault("DCGM_BRIDGE_FAKE_NVML_T0", str(time.time()))
        os.environ.update({k: env[k] for k in ("PYTHONPATH", "DCGM_BRIDGE_FAKE_NVML_T0")})
        sys.path[:0] = fakes
    env.setdefault("AIPERF_GPU_COLLECTION_INTERVAL", "0.1")
    env["AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS"] = "[]"
    import pynvml as nvml

    nvml.nvmlInit()
    count = nvml.nvmlDeviceGetCount()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    name, driver = nvml.nvmlDeviceGetName(handle), "fake" if args.fake else nvml.nvmlSystemGetDriverVersion()
    period = update_period_s(nvml)
    nvml.nvmlShutdown()
    print(f"GPUs: {count} x {name}, driver {driver}; NVML energy counter update period: "
          f"{'%.1f ms' % (period * 1e3) if period else 'not seen to change'}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    bridge = [sys.executable, "-m", "bridge.cli"]
    load = out / "load.json"
    run = subprocess.run([*bridge, "profile", "--gpu-telemetry", "pynvml", "--artifact-dir", str(out / "run"),
                          "--", sys.executable, __file__, "--load", str(load), "--phase-s", str(args.phase_s)],
                         env=env, capture_output=True, text=True, timeout=args.phase_s * 3 + 300)
    if run.returncode != 0:
        print(run.stdout[-2000:] + run.stderr[-2000:], file=sys.stderr)
        return run.returncode
    kernel = "compiled kernel" if subprocess.run([sys.executable, "-c", "import bridge._kernel"], env=env,
                                                 capture_output=True).returncode == 0 else "pure-Python path"
    done = json.loads(load.read_text())
    if done["driver"] is None:
        print(f"no torch or CuPy here: the three phases are idle (the check still compares the windows); {kernel}")
    else:
        print(f"load: matrix products with {done['driver']} on GPU 0; {kernel}")
    log = out / "run" / "gpu_telemetry_export.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    print(f"{'phase':6} {'s':>6} {'ours J':>11} {'± J':>8} {'NVML Δ J':>11} {'diff %':>8} {'∫P J':>11} {'diff %':>8}")
    failed = []
    for phase in done["phases"]:
        start, end = phase["start_ns"], phase["end_ns"]
        ours = our_energy(bridge, log, start, end, out / f"{phase['name']}.json", env)
        value, bound = ours.get("avg"), ours.get("bound")
        nvml_j, integral = phase["nvml_delta_j"], power_integral_j(records, start, end)
        diff = 100 * (value - nvml_j) / nvml_j if value is not None and nvml_j else float("nan")
        diff_p = 100 * (integral - nvml_j) / nvml_j if nvml_j else float("nan")
        # within our stated bound of NVML's counter (the counter itself is read at the edges, lagging by up to
        # its update period: that much more is allowed)
        allowed = (bound or 0.0) + (period or 0.0) * abs(nvml_j) / max((end - start) / 1e9, 1e-9) * 2
        if value is None or abs(value - nvml_j) > allowed:
            failed.append(phase["name"])
        print(f"{phase['name']:6} {(end - start) / 1e9:6.1f} {value or float('nan'):11.1f} "
              f"{bound if bound is not None else float('nan'):8.1f} {nvml_j:11.1f} {diff:8.3f} {integral:11.1f} "
              f"{diff_p:8.3f}")
    print("every phase within our stated bound of NVML's counter: ok" if not failed else
          f"outside our stated bound of NVML's counter: {', '.join(failed)}: FAIL")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake", action="store_true", help="rehearse against the fake pynvml (tests/fakes)")
    parser.add_argument("--phase-s", type=float, default=18.0, help="seconds per load level (3 levels)")
    parser.add_argument("--out", default="artifacts/check-gpu", help="where the run and the phase reports go")
    parser.add_argument("--load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        run_load(Path(args.load), args.phase_s)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
