"""A local NVML reader's energy counter holds each value for its update period (100 ms, measured on an H200 by
scripts/check-gpu.sh: bench/RESULTS.md), so every read lags the read's own time by up to that. The stated
uncertainty of a `pynvml://` source covers the lag; a source with no known update period carries no such term.

Ground truth: an analytic power curve with a closed-form integral; the counter is that integral in whole mJ,
updated every 100 ms at a random phase and read (held) at AIPerf's 0.333 s interval with jitter; the power gauge
is NVML's one-second trailing average, also closed-form.
"""

from __future__ import annotations

import math
import random

import numpy as np

from bridge.report import build_report
from bridge.report.window import explicit_window
from bridge.sources import COUNTER_HOLD_S, NVML_SOURCE
from tests.report.helpers import MS, S, rec

BASE = 1_800_000_000 * S
UPDATE_S = COUNTER_HOLD_S


def energy_j(t_s: float) -> float:
    """∫₀ᵗ P: P(t) = 400 + 250·sin(2πt/9) + 60·sin(2πt/2.3) W, a serving load's slow swing and its batches."""
    return (400.0 * t_s - 250.0 * 9 / (2 * math.pi) * (math.cos(2 * math.pi * t_s / 9) - 1)
            - 60.0 * 2.3 / (2 * math.pi) * (math.cos(2 * math.pi * t_s / 2.3) - 1))


def records(rng: random.Random, url: str, length_s: float) -> list:
    phase = rng.uniform(0, UPDATE_S)
    out, t = [], rng.uniform(0.0, 0.3)
    while t < length_s + 1.5:
        updated = phase + math.floor((t - phase) / UPDATE_S) * UPDATE_S  # the counter's last update before t
        out.append(rec(BASE + round(t * 1e9), {
            "nvidia_energy_consumption": math.floor(energy_j(100 + updated) * 1e3) * 1e-9,  # whole mJ, as MJ
            "nvidia_power_usage": energy_j(100 + t) - energy_j(99 + t)}, url=url))  # the trailing 1 s average
        t += 0.333 + rng.uniform(-0.02, 0.02)
    return out


def errors_and_uncertainties(url: str, windows: int = 120) -> list[tuple[float, float]]:
    rng = random.Random(7)
    out = []
    for _ in range(windows):
        log = records(rng, url, 12.0)
        start_s = rng.uniform(1.0, 4.0)
        end_s = start_s + rng.uniform(3.0, 7.0)
        built = build_report(log, window=explicit_window(BASE + round(start_s * 1e9), BASE + round(end_s * 1e9),
                                                          666 * MS))
        total = built.energy.total_energy_j
        assert total is not None and built.energy.uncertainty_j is not None
        out.append((abs(total - (energy_j(100 + end_s) - energy_j(100 + start_s))), built.energy.uncertainty_j))
    return out


def test_a_pynvml_sources_uncertainty_covers_its_counters_lag() -> None:
    found = errors_and_uncertainties(NVML_SOURCE)
    covered = sum(error <= stated for error, stated in found) / len(found)
    assert covered >= 0.95, covered


def step_records(url: str, lag_s: float) -> list:
    """Steady 100 W, then steady 600 W from 5.05 s; read every 0.5 s (a steady tick at a multiple of the update
    period, so every read lags by the same `lag_s`): nothing in the readings shows the lag."""
    def energy(t_s: float) -> float:
        return 100.0 * t_s + 500.0 * max(0.0, t_s - 5.05)

    return [rec(BASE + round(t * 1e9), {"nvidia_energy_consumption": math.floor(energy(t - lag_s) * 1e3) * 1e-9,
                                        "nvidia_power_usage": 100.0 if t < 5.05 else 600.0}, url=url)
            for t in (k * 0.5 for k in range(21))]


def test_a_lag_the_readings_cannot_show_is_covered_by_the_term_alone() -> None:
    """Edges in the steady stretches (power flat around each): the shape terms are ~0, and the window's error comes
    from the lag times the power's change across it, up to 80 ms × 500 W = 40 J. No reading shows a lag every read
    shares, so an exporter's readings (a refresh up to their spacing, and the counter's hold) state it as a pynvml
    source's (the hold) does (issue 42: no reading is taken as fresher than its source allows)."""
    start, end = BASE + 2_250 * MS, BASE + 8_250 * MS
    truth = 100.0 * 6.0 + 500.0 * 3.2
    for url in (NVML_SOURCE, "http://127.0.0.1:19401/metrics"):
        log = step_records(url, 0.08)
        ts = np.array([r.timestamp_ns for r in log], dtype=np.float64)
        joules = np.array([r.telemetry_data["nvidia_energy_consumption"] * 1e6 for r in log])
        timed_by_scrape = float(np.interp(end, ts, joules) - np.interp(start, ts, joules))
        assert abs(abs(timed_by_scrape - truth) - 40.0) < 1.0  # the lag's error, read at the scrapes' own times
        built = build_report(log, window=explicit_window(start, end, 666 * MS))
        total, stated = built.energy.total_energy_j, built.energy.uncertainty_j
        assert total is not None and stated is not None
        assert abs(total - truth) <= stated, (url, total - truth, stated)


def test_a_pynvml_counters_held_values_are_its_hold_not_a_refresh_grid() -> None:
    """Reads faster than the counter's update see it hold: for NVML that is the known 100 ms hold (timed by
    scrape, the lag term covering it); the same readings from an exporter are a DCGM refresh to be timed."""
    import numpy as np

    from bridge.report.refresh import source_cadence

    ts = np.array([BASE + k * 50 * MS for k in range(40)], dtype=np.int64)
    energy = np.array([math.floor(k / 2) * 5e-6 for k in range(40)])  # a new value every other read
    values = {"nvidia_energy_consumption": energy, "nvidia_power_usage": np.full(40, 100.0)}
    assert source_cadence(NVML_SOURCE, ts, values).fresh
    assert not source_cadence("http://127.0.0.1:19401/metrics", ts, values).fresh
