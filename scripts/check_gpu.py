"""scripts/check-gpu.sh's driver: our energy per phase against NVML's own counter, on this machine's GPUs.

    check_gpu.py [--fake] [--phase-s 12] [--out DIR]      the check (dcgm-bridge profile around the load)
    check_gpu.py --load PHASES_JSON --phase-s S            the benchmark profile runs: six load phases
    check_gpu.py --burn S                                  the probe's load step: full load for S seconds on "go"
    check_gpu.py --record [--fake] [--record-scale 1]       a corpus of raw NVML reads under known load shapes
                                                           (scripts/gpu_record.py; about 7 minutes)
    check_gpu.py --analyse OUT [--every 1,4,14]            a finished check's record log thinned to every k-th
                                                           read (each offset): our error against NVML per phase
                                                           and how often the stated uncertainty covered it

Before the profile run, a probe polls NVML every ~2 ms through an idle-to-full load step: the update period of the
energy counter and of the power reading (from the changes a tight poll sees, and from the field values' own
timestamps), and how the power readings follow the step (10-90 % rise time: a one-second trailing average rises
in about 0.8 s, an instantaneous reading in one update period). Everything goes to OUT/probe.json and
OUT/summary.json as well as the console.

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

# (name, share of each slot spent in matrix products, slot seconds): steady levels, a square wave, and the cool-down
LEVELS = (("idle", 0.0, 0.1), ("half", 0.5, 0.1), ("full", 1.0, 0.1), ("bursty", 0.5, 1.0), ("quarter", 0.25, 0.1),
          ("cool", 0.0, 0.1))


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


# NVML field ids (nvml.h; pynvml's NVML_FI_* constants): the power readings beside nvmlDeviceGetPowerUsage, and the
# energy counter, each with the driver's own timestamp of its last update
_FIELDS = {"power_average": 185, "power_instant": 186, "energy": 83}


def _call(function, *args):  # type: ignore[no-untyped-def]
    """NVML's answer, or None where this library or GPU has no such call (the fake, an older driver)."""
    try:
        return function(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: the reading is absent, said in the output
        return None


def versions(nvml) -> dict:  # type: ignore[no-untyped-def]
    def text(value):  # type: ignore[no-untyped-def]
        return value.decode() if isinstance(value, bytes) else value

    return {"driver": text(_call(getattr(nvml, "nvmlSystemGetDriverVersion", lambda: None))),
            "nvml": text(_call(getattr(nvml, "nvmlSystemGetNVMLVersion", lambda: None))),
            "cuda_driver": _call(getattr(nvml, "nvmlSystemGetCudaDriverVersion", lambda: None))}


def _fields(nvml, handle) -> dict[str, tuple[float, int] | None]:  # type: ignore[no-untyped-def]
    """Each field's (value, the driver's µs timestamp of its update), or None where the GPU answers no such field."""
    get = getattr(nvml, "nvmlDeviceGetFieldValues", None)
    values = _call(get, handle, list(_FIELDS.values())) if get else None
    out: dict[str, tuple[float, int] | None] = {}
    for i, name in enumerate(_FIELDS):
        value = values[i] if values is not None else None
        if value is None or value.nvmlReturn != 0:
            out[name] = None
            continue
        kind = value.valueType  # NVML_VALUE_TYPE_*: 0 double, 1 uint, 2 ulong, 3 ulonglong, 4 sll, 5 sint
        number = {0: value.value.dVal, 1: value.value.uiVal, 2: value.value.ulVal, 3: value.value.ullVal,
                  4: value.value.sllVal, 5: value.value.siVal}.get(kind, value.value.ullVal)
        out[name] = (float(number), int(value.timestamp))
    return out


def _median_gap(times: list[float]) -> float | None:
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return statistics.median(gaps) if gaps else None


def _changes(polls: list[dict], key: str, since: float, until: float) -> list[float]:
    """The poll times at which a reading changed, inside [since, until]."""
    out, last = [], None
    for poll in polls:
        value = poll[key]
        if value is None:
            continue
        if last is not None and value != last and since <= poll["t"] <= until:
            out.append(poll["t"])
        last = value
    return out


def _rise_time(polls: list[dict], key: str, t_on: float, t_off: float) -> float | None:
    """Seconds from the load step to the reading's first crossing of 90 % of its rise (10-90 % would hide the
    averaging's dead time): about 0.9 s for a one-second trailing average, one update period for an instant one."""
    before = [p[key] for p in polls if p["t"] < t_on and p[key] is not None]
    plateau = [p[key] for p in polls if t_off - 1.0 <= p["t"] < t_off and p[key] is not None]
    if not before or not plateau:
        return None
    base, top = statistics.median(before), statistics.median(plateau)
    if top - base < 0.2 * max(abs(base), 1.0):  # the step did not show (no load driver, or a capped GPU)
        return None
    for poll in polls:
        if poll["t"] >= t_on and poll[key] is not None and poll[key] >= base + 0.9 * (top - base):
            return poll["t"] - t_on
    return None


def probe(nvml, out: Path, burn_s: float = 4.0) -> dict:  # type: ignore[no-untyped-def]
    """Poll GPU 0 every ~2 ms through an idle-to-full load step (a child process runs the matrix products)."""
    import select

    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    child = subprocess.Popen([sys.executable, __file__, "--burn", str(burn_s)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    ready = child.stdout.readline().strip()  # "ready <driver>" once the work has been run once, or "none"
    polls: list[dict] = []
    t0 = time.monotonic()
    t_on = t_off = None
    while True:
        now = time.monotonic() - t0
        if t_on is None and now >= 1.5:
            child.stdin.write("go\n")
            child.stdin.flush()
            t_on = time.monotonic() - t0
        if t_on is not None and t_off is None and select.select([child.stdout], [], [], 0)[0]:
            child.stdout.readline()  # "done": the last product has finished
            t_off = time.monotonic() - t0
        if t_off is not None and now >= t_off + 2.5:
            break
        if now > burn_s + 30:  # the child hung: give up on the step, keep what was polled
            break
        fields = _fields(nvml, handle)
        polls.append({"t": time.monotonic() - t0, "power_mw": _call(nvml.nvmlDeviceGetPowerUsage, handle),
                      "energy_mj": _call(nvml.nvmlDeviceGetTotalEnergyConsumption, handle),
                      **{name: value[0] if value else None for name, value in fields.items()},
                      **{name + "_ts": value[1] if value else None for name, value in fields.items()}})
        time.sleep(0.002)
    child.kill()
    child.wait()
    t_on = t_on or 0.0
    t_off = t_off or polls[-1]["t"]
    result: dict = {"load": ready, "polls": len(polls), "poll_ms": 1e3 * (polls[-1]["t"] - polls[0]["t"]) / len(polls),
                    "step_on_s": t_on, "step_off_s": t_off, "readings": {}}
    for key in ("power_mw", "power_average", "power_instant", "energy_mj", "energy"):
        idle = _median_gap(_changes(polls, key, 0.0, t_on))
        loaded = _median_gap(_changes(polls, key, t_on + 0.5, t_off))
        stamps = sorted({p[key + "_ts"] for p in polls if p.get(key + "_ts")}) if key in _FIELDS else []
        result["readings"][key] = {
            "update_period_idle_ms": idle and idle * 1e3, "update_period_load_ms": loaded and loaded * 1e3,
            "timestamp_period_ms": (_median_gap(stamps) or 0) / 1e3 or None,
            "rise_90_s": _rise_time(polls, key, t_on, t_off) if key.startswith("power") else None,
            "seen": any(p[key] is not None for p in polls)}
    (out / "probe-polls.json").write_text(json.dumps(polls))
    return result


def burn(seconds: float) -> None:
    """The probe's load step: warm up, say "ready", wait for "go", run full load for SECONDS, say "done"."""
    driver = _matmul_driver()
    if driver is not None:
        driver[1]()
    print(f"ready {driver[0] if driver else 'none'}", flush=True)
    sys.stdin.readline()
    end = time.monotonic() + seconds
    while driver is not None and time.monotonic() < end:
        driver[1]()
    print("done", flush=True)


def _matmul_driver():  # type: ignore[no-untyped-def]
    """(name, one unit of work that blocks until the GPU has done it: fp32 4096² products) or None."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_record

    return gpu_record.matmul_driver("full")


def counter_edge(nvml) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """(time ns, Σ energy mJ, ns since the read before) at the moment GPU 0's counter next changes.

    The counter holds its last update (NVML's nvmlDeviceGetTotalEnergyConsumption), so a read at an arbitrary
    instant lags by up to its update period; the first read that sees a new value is fresh to within the poll's
    spacing. Phase edges taken there make NVML's own delta a reference good to that spacing (GPU 0; other GPUs
    lag by up to their update period, allowed for in the check)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    first = last = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    before = now = time.time_ns()
    deadline = now + 500_000_000
    while last == first and now < deadline:
        before = now
        last = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        now = time.time_ns()
    return now, energy_mj(nvml), now - before


def run_load(out: Path, phase_s: float) -> None:
    """The benchmark: LEVELS in turn, each phase's edges at a change of NVML's counter, its delta read there."""
    import pynvml as nvml

    nvml.nvmlInit()
    driver = _matmul_driver()
    if driver is not None:
        driver[1]()  # the library's first product (its set-up) before the phases
    phases = []
    start_ns, before, start_gap = counter_edge(nvml)
    for name, duty, slot_s in LEVELS:
        end = time.monotonic() + phase_s
        while time.monotonic() < end:
            slot_end = time.monotonic() + slot_s
            busy_until = time.monotonic() + slot_s * duty
            while driver is not None and time.monotonic() < busy_until:
                driver[1]()
            time.sleep(max(0.0, min(slot_end, end) - time.monotonic()))
        end_ns, after, end_gap = counter_edge(nvml)
        phases.append({"name": name, "duty": duty, "slot_s": slot_s, "start_ns": start_ns, "end_ns": end_ns,
                       "nvml_delta_j": (after - before) / 1000, "edge_gaps_ns": [start_gap, end_gap]})
        start_ns, before, start_gap = end_ns, after, end_gap
    nvml.nvmlShutdown()
    out.write_text(json.dumps({"driver": driver[0] if driver else None, "gpus": _count(), "phases": phases}))


def _count() -> int:
    import pynvml as nvml

    nvml.nvmlInit()
    try:
        return int(nvml.nvmlDeviceGetCount())
    finally:
        nvml.nvmlShutdown()


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


def _probe_lines(found: dict) -> list[str]:
    names = {"power_mw": "nvmlDeviceGetPowerUsage", "power_average": "field POWER_AVERAGE",
             "power_instant": "field POWER_INSTANT", "energy_mj": "nvmlDeviceGetTotalEnergyConsumption",
             "energy": "field TOTAL_ENERGY_CONSUMPTION"}

    def ms(value: float | None) -> str:
        return f"{value:7.1f} ms" if value else "      — "

    lines = [f"probe: {found['polls']} polls every {found['poll_ms']:.1f} ms, load step ({found['load']}) "
             f"at {found['step_on_s']:.2f}-{found['step_off_s']:.2f} s",
             f"  {'reading':36} {'changes idle':>12} {'under load':>12} {'timestamps':>12} {'90% rise':>9}"]
    for key, reading in found["readings"].items():
        if not reading["seen"]:
            lines.append(f"  {names[key]:36} not answered")
            continue
        rise = reading["rise_90_s"]
        lines.append(f"  {names[key]:36} {ms(reading['update_period_idle_ms']):>12} "
                     f"{ms(reading['update_period_load_ms']):>12} {ms(reading['timestamp_period_ms']):>12} "
                     f"{f'{rise:7.2f} s' if rise is not None else '      —':>9}")
    return lines


def _use_fake(env: dict[str, str]) -> None:
    """This process and its children import the fake pynvml (tests/fakes/modules), on one curve from one zero."""
    root = Path(__file__).resolve().parents[1]
    fakes = [str(root / "tests" / "fakes" / "modules"), str(root)]
    env["PYTHONPATH"] = os.pathsep.join([*fakes, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("DCGM_BRIDGE_FAKE_NVML_T0", str(time.time()))
    os.environ.update({k: v for k, v in env.items() if k == "PYTHONPATH" or k.startswith("DCGM_BRIDGE_FAKE_")})
    sys.path[:0] = fakes


def record(args: argparse.Namespace) -> int:
    """--record: scripts/gpu_record.py's corpus; with --fake on the fake's H200 timing (the counter and the power
    readings updated every 100 ms, the average over the trailing second)."""
    if args.fake:
        env = dict(os.environ)
        env.setdefault("DCGM_BRIDGE_FAKE_NVML_ENERGY_PERIOD_S", "0.1")
        env.setdefault("DCGM_BRIDGE_FAKE_NVML_GAUGE_PERIOD_S", "0.1")
        _use_fake(env)
    if not 0 < args.record_scale <= 1:
        print(f"check-gpu: --record-scale {args.record_scale}: give a share of the full run, in (0, 1]",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_record

    out = Path(args.out if args.out != "artifacts/check-gpu" else "artifacts/gpu-trace").resolve()
    return gpu_record.record(out, args.record_scale, args.fake)


def check(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.fake:
        _use_fake(env)
    env.setdefault("AIPERF_GPU_COLLECTION_INTERVAL", "0.1")
    env["AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS"] = "[]"
    import pynvml as nvml

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    nvml.nvmlInit()
    count = nvml.nvmlDeviceGetCount()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    name = nvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else name
    found_versions = {"driver": "fake"} if args.fake else versions(nvml)
    period = update_period_s(nvml)
    found = probe(nvml, out)
    nvml.nvmlShutdown()
    print(f"GPUs: {count} x {name}, driver {found_versions.get('driver')}, NVML {found_versions.get('nvml')}, "
          f"CUDA driver API {found_versions.get('cuda_driver')}; NVML energy counter update period: "
          f"{'%.1f ms' % (period * 1e3) if period else 'not seen to change'}")
    print("\n".join(_probe_lines(found)))
    (out / "probe.json").write_text(json.dumps(found, indent=1))
    bridge = [sys.executable, "-m", "bridge.cli"]
    load = out / "load.json"
    run = subprocess.run([*bridge, "profile", "--gpu-telemetry", "pynvml", "--artifact-dir", str(out / "run"),
                          "--", sys.executable, __file__, "--load", str(load), "--phase-s", str(args.phase_s)],
                         env=env, capture_output=True, text=True, timeout=args.phase_s * len(LEVELS) + 300)
    (out / "profile.log").write_text(run.stdout + run.stderr)
    if run.returncode != 0:
        print(run.stdout[-2000:] + run.stderr[-2000:], file=sys.stderr)
        return run.returncode
    kernel = "compiled kernel" if subprocess.run([sys.executable, "-c", "import bridge._kernel"], env=env,
                                                 capture_output=True).returncode == 0 else "pure-Python path"
    done = json.loads(load.read_text())
    if done["driver"] is None:
        print(f"no torch or CuPy here: every phase is idle (the check still compares the windows); {kernel}")
    else:
        print(f"load: matrix products with {done['driver']} on GPU 0; {kernel}")
    log = out / "run" / "gpu_telemetry_export.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    print(f"{'phase':7} {'s':>6} {'ours J':>11} {'± J':>8} {'bound J':>8} {'NVML Δ J':>11} {'diff %':>8} "
          f"{'∫P J':>11} {'diff %':>8}  covered")
    failed, rows = [], []
    for phase in done["phases"]:
        start, end = phase["start_ns"], phase["end_ns"]
        ours = our_energy(bridge, log, start, end, out / f"{phase['name']}.json", env)
        value, bound, expected = ours.get("avg"), ours.get("bound"), ours.get("uncertainty")
        nvml_j, integral = phase["nvml_delta_j"], power_integral_j(records, start, end)
        diff = 100 * (value - nvml_j) / nvml_j if value is not None and nvml_j else float("nan")
        diff_p = 100 * (integral - nvml_j) / nvml_j if nvml_j else float("nan")
        # NVML's delta is read where GPU 0's counter changes (counter_edge): good to the poll's spacing at each
        # edge; any other GPU's reads lag by up to its update period. That much more is allowed, at the phase's
        # mean power.
        mean_w = abs(nvml_j) / max((end - start) / 1e9, 1e-9)
        spacing = sum(phase.get("edge_gaps_ns", [0, 0])) / 1e9
        lag = mean_w * (spacing + (2 * (period or 0.0) * (done.get("gpus", 1) - 1) / max(done.get("gpus", 1), 1)))
        error = abs(value - nvml_j) if value is not None else float("inf")
        covered = {"bound": error <= (bound or 0.0) + lag, "uncertainty": error <= (expected or 0.0) + lag}
        if not covered["bound"]:
            failed.append(phase["name"])
        rows.append({**phase, "ours_j": value, "bound_j": bound, "uncertainty_j": expected, "integral_j": integral,
                     "diff_pct": diff, "integral_diff_pct": diff_p, "counter_lag_allowance_j": lag,
                     "covered": covered})
        print(f"{phase['name']:7} {(end - start) / 1e9:6.1f} {value or float('nan'):11.1f} "
              f"{expected if expected is not None else float('nan'):8.2f} "
              f"{bound if bound is not None else float('nan'):8.1f} {nvml_j:11.1f} {diff:8.3f} {integral:11.1f} "
              f"{diff_p:8.3f}  {'±' if covered['uncertainty'] else '-'}{' bound' if covered['bound'] else ''}")
    (out / "summary.json").write_text(json.dumps(
        {"gpus": count, "name": name, **found_versions, "energy_update_period_s": period, "kernel": kernel,
         "load": done["driver"], "probe": found, "phases": rows}, indent=1))
    print("every phase within our stated bound of NVML's counter: ok" if not failed else
          f"outside our stated bound of NVML's counter: {', '.join(failed)}: FAIL")
    return 1 if failed else 0


def analyse(out: Path, every: list[int]) -> int:
    """Offline, on a finished check's folder: the same phases read from a record log thinned to every k-th read of
    each GPU (every offset), as a slower collection interval would have read them; our error against NVML's delta
    and whether the stated uncertainty (and bound) covered it. Writes OUT/analysis.json."""
    summary = json.loads((out / "summary.json").read_text())
    lines = (out / "run" / "gpu_telemetry_export.jsonl").read_text().splitlines()
    uuids = [json.loads(line)["gpu_uuid"] for line in lines]
    first = [json.loads(line)["timestamp_ns"] for line, uuid in zip(lines, uuids, strict=True) if uuid == uuids[0]]
    spacing_s = statistics.median(b - a for a, b in zip(first, first[1:], strict=False)) / 1e9
    bridge, env = [sys.executable, "-m", "bridge.cli"], dict(os.environ)
    rows = []
    print(f"{'every':>5} {'interval':>9} {'windows':>7} {'median |err| J':>14} {'median ± J':>10} {'± / |err|':>9} "
          f"{'± covered':>9} {'bound covered':>13}")
    for k in every:
        windows = []
        for offset in range(k):
            seen: dict[str, int] = {}
            kept = []
            for line, uuid in zip(lines, uuids, strict=True):
                index = seen[uuid] = seen.get(uuid, -1) + 1
                if index % k == offset:
                    kept.append(line)
            log = out / f"thinned-{k}-{offset}.jsonl"
            log.write_text("\n".join(kept) + "\n")
            for phase in summary["phases"]:
                ours = our_energy(bridge, log, phase["start_ns"], phase["end_ns"], out / "thinned.json", env)
                if ours.get("avg") is None:
                    continue
                error = ours["avg"] - phase["nvml_delta_j"]
                allowed = phase["counter_lag_allowance_j"]
                windows.append({"every": k, "offset": offset, "phase": phase["name"], "ours_j": ours["avg"],
                                "error_j": error,
                                "uncertainty_j": ours.get("uncertainty"), "bound_j": ours.get("bound"),
                                "covered": abs(error) <= (ours.get("uncertainty") or 0.0) + allowed,
                                "bound_covered": abs(error) <= (ours.get("bound") or 0.0) + allowed})
            log.unlink()
        (out / "thinned.json").unlink(missing_ok=True)
        if not windows:
            continue
        errors = statistics.median(abs(w["error_j"]) for w in windows)
        stated = statistics.median(w["uncertainty_j"] or 0.0 for w in windows)
        covered = sum(w["covered"] for w in windows) / len(windows)
        bound_covered = sum(w["bound_covered"] for w in windows) / len(windows)
        print(f"{k:5} {f'{k * spacing_s:.3f} s':>9} {len(windows):7} {errors:14.2f} {stated:10.2f} "
              f"{stated / max(errors, 1e-9):9.1f} {covered:9.0%} {bound_covered:13.0%}")
        rows.extend(windows)
    (out / "analysis.json").write_text(json.dumps(rows, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake", action="store_true", help="rehearse against the fake pynvml (tests/fakes)")
    parser.add_argument("--phase-s", type=float, default=12.0, help="seconds per load phase (6 phases)")
    parser.add_argument("--out", default="artifacts/check-gpu", help="where the run and the phase reports go")
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--burn", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--analyse", help="a finished check's --out folder: thin its log, compare per phase")
    parser.add_argument("--every", default="1,4,14", help="with --analyse: keep every k-th read, for each k")
    parser.add_argument("--record", action="store_true", help="record a corpus of raw NVML reads (gpu_record.py)")
    parser.add_argument("--record-scale", type=float, default=1.0, help="with --record: share of full length")
    args = parser.parse_args()
    if args.record:
        return record(args)
    if args.analyse:
        return analyse(Path(args.analyse), [int(k) for k in args.every.split(",")])
    if args.burn is not None:
        burn(args.burn)
        return 0
    if args.load:
        run_load(Path(args.load), args.phase_s)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
