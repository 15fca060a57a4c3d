"""Run 1, a recorded AIPerf 0.13.0 run, rebuilt as a record log: its timeline, and values chosen so that
AIPerf's rules give exactly the numbers its `telemetry_data` reported (power stats, energy, temperature,
XID, power violation) and its profiling phase file's (9 samples and 0.002097 MJ).

The power values are the 11 in-window readings solved from those stats (min, max, percentiles and sum pin
seven of them exactly; the other four fit the std to 2e-11). The first line is that run's real first line.
"""

from __future__ import annotations

from typing import Any

from bridge.samples import GpuRecord
from tests.report.helpers import MS, T0, URL, rec

__all__ = ["EXPECTED_POWER", "EXPECTED_SUMMARY", "REQUESTS_END", "T0", "URL", "WARMUP_START", "manifest", "records"]

REQUESTS_END = T0 + 2_284_607_000  # end_time 08:48:21.362437 = requests end + 666 ms
WARMUP_START = T0 - 198_700_000

# ms relative to the profiling start: configure baseline, first tick, warmup START scrape, profiling START
# scrape, warmup END scrape, 7 loop ticks, profiling END scrape, PROFILE_COMPLETE scrape.
TIMES_MS = [-7644.8, -201.9, -162.8, 11.8, 33.8, 130.9, 465.2, 799.4, 1133.7, 1468.0, 1802.3, 2136.5,
            2292.2, 2302.8]
POWER = [384.147, 150.0, 151.0,  # before the window
         249.872, 200.105, 390.93, 206.376, 312.086, 204.108, 372.309, 219.39, 347.753, 225.715, 279.548]
ENERGY = [1.000699, 1.0007, 1.000701,
          1.000712, 1.000735, 1.00085, 1.0011, 1.0014, 1.0017, 1.002, 1.0024, 1.002798, 1.0031, 1.003264]
TEMPERATURE = [103.0, 99.0, 99.0, 100.0, 100.0, 101.0, 102.0, 103.0, 103.0, 103.0, 104.0, 104.0, 105.0, 105.0]
VIOLATION = [5003.0, 5003.0, 5003.0, 5004.0, 5004.0, 5005.0, 5006.0, 5007.0, 5008.0, 5009.0, 5010.0, 5011.0,
             5013.0, 5014.0]

FIRST_LINE = {"nvidia_power_usage": 384.147, "nvidia_energy_consumption": 1.000699, "nvidia_gpu_utilization": 61.0,
              "nvidia_memory_utilization": 61.0, "nvidia_memory_used": 73.403465728, "nvidia_temperature": 103.0,
              "nvidia_sm_utilization": 89.8998, "nvidia_decoder_utilization": 103.0,
              "nvidia_encoder_utilization": 103.0, "nvidia_xid_errors": 0.0, "nvidia_power_violation": 5003.0}


def records() -> list[GpuRecord]:
    out = [rec(1796201290767069497, FIRST_LINE)]
    for i in range(1, len(TIMES_MS)):
        data = {"nvidia_power_usage": POWER[i], "nvidia_energy_consumption": ENERGY[i],
                "nvidia_temperature": TEMPERATURE[i], "nvidia_xid_errors": 0.0,
                "nvidia_power_violation": VIOLATION[i]}
        out.append(rec(T0 + round(TIMES_MS[i] * MS), data))
    return out


def manifest() -> dict[str, Any]:
    common = {"total_request_count": 10, "successful_request_count": 10, "error_request_count": 0,
              "error_summary": [], "was_cancelled": False}
    return {"phases": [
        {"phase_index": 0, "phase_kind": "warmup", "phase_name": "warmup", "profiling_index": None,
         "start_ns": WARMUP_START, "end_ns": T0, **common,
         "metrics_json": "phases/warmup/metrics.json", "metrics_csv": "phases/warmup/metrics.csv",
         "gpu_telemetry_json": "phases/warmup/gpu_telemetry.json"},
        {"phase_index": 1, "phase_kind": "profiling", "phase_name": "profiling", "profiling_index": 0,
         "start_ns": T0, "end_ns": REQUESTS_END, **common,
         "metrics_json": "phases/profiling/metrics.json", "metrics_csv": "phases/profiling/metrics.csv",
         "gpu_telemetry_json": "phases/profiling/gpu_telemetry.json"},
    ], "schema_version": 1}


# Run 1's telemetry_data, verbatim.
EXPECTED_POWER = {"unit": "W", "avg": 273.472, "p1": 200.50529999999998, "p5": 202.10649999999998,
                  "p10": 204.108, "p25": 212.88299999999998, "p50": 249.872, "p75": 329.91949999999997,
                  "p90": 372.309, "p95": 381.6195, "p99": 389.0679, "min": 200.105, "max": 390.93,
                  "std": 71.46276529914023, "count": 11, "sum": 3008.192}
EXPECTED_SUMMARY = {"endpoints_configured": [URL], "endpoints_successful": [URL],
                    "start_time": "2026-12-02T08:48:18.411830", "end_time": "2026-12-02T08:48:21.362437"}
