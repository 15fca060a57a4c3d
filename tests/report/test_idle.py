"""Issue 46, item 3: the idle baseline from `profile --idle-window`'s quiet windows, the idle/active split, a baseline
that moved, and a run that starts under load (flagged, never used as idle).

Truths: piecewise-constant power written by hand (its integral in closed form)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import orjson
import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.errors import ConfigError
from bridge.events import IdleWindow, event_from_dict, event_to_line
from bridge.record_log import read_dicts
from bridge.report import build_report
from bridge.report.window import explicit_window
from bridge.sidecar.cli import parse_duration
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.report.helpers import MS, T0, S, rec

BEFORE = IdleWindow("before", T0 - 12 * S, T0 - 2 * S)
AFTER = IdleWindow("after", T0 + 12 * S, T0 + 22 * S)


def _records(watts: Callable[[float], float], util: Callable[[float], float]) -> list:
    """One GPU scraped every 100 ms from T0 − 13 s to T0 + 23 s; the counter (MJ) the exact integral of `watts`
    (constant between scrapes: the power at the interval's start)."""
    out, joules = [], 1e6
    t = T0 - 13 * S
    while t <= T0 + 23 * S:
        s = (t - T0) / S
        out.append(rec(t, {"nvidia_power_usage": watts(s), "nvidia_energy_consumption": joules * 1e-6,
                           "nvidia_gpu_utilization": util(s)}))
        joules += watts(s) * 0.1
        t += 100 * MS
    return out


def _run(before: float, after: float, busy_before: float = 0.0, settling: bool = False) -> dict:
    def watts(s: float) -> float:
        if 0 <= s < 10:
            return 300.0
        if s < 0:
            return before + (150.0 * max(0.0, -2 - s) / 10 if settling else 0.0)
        return after

    built = build_report(_records(watts, lambda s: 90.0 if 0 <= s < 10 else busy_before if s < 0 else 0.0),
                         window=explicit_window(T0, T0 + 10 * S, 0), idle_windows=[BEFORE, AFTER])
    return built.telemetry_data["idle"]


def test_quiet_windows_give_the_idle_power_and_split_the_energy_into_idle_and_active():
    idle = _run(70.0, 70.0)
    gpu = next(iter(idle["gpus"].values()))
    assert gpu["idle_power_w"] == pytest.approx(70.0, rel=1e-3)
    assert gpu["idle_uncertainty_w"] < 0.1
    assert idle["idle_j"] == pytest.approx(700.0, rel=1e-3) and idle["active_j"] == pytest.approx(2300.0, rel=1e-3)
    assert idle["valid"] is True and idle["reasons"] == []


def test_a_run_that_starts_under_load_is_flagged_and_its_before_window_never_used_as_idle():
    idle = _run(280.0, 70.0, busy_before=85.0)
    gpu = next(iter(idle["gpus"].values()))
    before = next(w for w in gpu["windows"] if w["which"] == "before")
    assert before["under_load"] is True and "idle_under_load" in idle["reasons"]
    assert gpu["idle_power_w"] == pytest.approx(70.0, rel=1e-3)  # the after window only


def test_a_gpu_still_settling_from_work_is_under_load_without_a_utilisation_reading():
    idle = _run(70.0, 70.0, settling=True)
    gpu = next(iter(idle["gpus"].values()))
    assert next(w for w in gpu["windows"] if w["which"] == "before")["under_load"] is True
    assert gpu["idle_power_w"] == pytest.approx(70.0, rel=1e-3)


def test_a_baseline_that_moved_beyond_its_uncertainty_is_flagged():
    idle = _run(70.0, 90.0)
    gpu = next(iter(idle["gpus"].values()))
    assert "idle_baseline_moved" in idle["reasons"] and gpu["idle_power_w"] == pytest.approx(80.0, rel=1e-3)
    assert gpu["idle_uncertainty_w"] >= 10.0  # half the move, on top


def test_the_idle_window_event_roundtrips_and_a_bad_one_is_refused():
    assert event_from_dict(orjson.loads(event_to_line(BEFORE))) == BEFORE
    with pytest.raises(ValueError):
        event_from_dict({"type": "idle_window", "which": "during", "start_ns": 1, "end_ns": 2})
    with pytest.raises(ValueError):
        event_from_dict({"type": "idle_window", "which": "after", "start_ns": 2, "end_ns": 2})


@pytest.mark.parametrize(("value", "seconds"), [("10s", 10.0), ("500ms", 0.5), ("1m", 60.0), ("2", 2.0)])
def test_idle_window_durations(value, seconds):
    assert parse_duration(value, "--idle-window") == seconds


@pytest.mark.parametrize("value", ["", "ten", "-1s", "2h", "4000s"])
def test_a_bad_idle_window_is_one_line(value):
    with pytest.raises(ConfigError, match="--idle-window"):
        parse_duration(value, "--idle-window")


def test_profile_keeps_idle_windows_around_the_benchmark_and_reports_the_baseline(tmp_path, monkeypatch):
    out = tmp_path / "out"
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        monkeypatch.setenv("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS", f"127.0.0.1:{exporter.port}")
        monkeypatch.setenv("AIPERF_GPU_COLLECTION_INTERVAL", "0.05")
        result = CliRunner().invoke(main, ["profile", "--artifact-dir", str(out), "--idle-window", "1s", "--html",
                                           str(out / "r.html"), "--",
                                           sys.executable, "-c", "import time; time.sleep(1)"])
    assert result.exit_code == 0, result.output
    # The simulated GPU works at 40-60 % utilisation throughout: its quiet windows are under load, said, not used.
    assert "Idle baseline: none usable [idle_under_load, no_idle_baseline]" in " ".join(result.output.split())
    assert 'data-idle="1"' in (out / "r.html").read_text()
    windows = [e for e in read_dicts(out / "gpu_telemetry_events.jsonl") if e["type"] == "idle_window"]
    assert [w["which"] for w in windows] == ["before", "after"]
    assert all(w["end_ns"] - w["start_ns"] >= 10**9 for w in windows)
    telemetry = orjson.loads((out / "profile_export_aiperf.json").read_bytes())["telemetry_data"]
    idle = telemetry["idle"]
    # No phases: the report's window is the benchmark's, between the idle windows.
    assert telemetry["measurement"]["window"]["start_ns"] == windows[0]["end_ns"]
    assert telemetry["measurement"]["window"]["end_ns"] == windows[1]["start_ns"]
    assert [w["which"] for w in idle["windows"]] == ["before", "after"] and "idle_under_load" in idle["reasons"]
    assert "idle_j" not in idle and idle["valid"] is False
    checked = CliRunner().invoke(main, ["validate", str(out)])
    assert "report_differs" not in checked.output, checked.output
