"""Warnings where a user would want one (issue 12 item 10): every config problem at once, inside or beside
gpu_telemetry:; phase times in the wrong unit; no reachable exporter; OTLP points lost."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from bridge.config import ConfigError, resolve
from bridge.sidecar.marks import checked_mark, checked_time
from bridge.sidecar.session import LifecycleError, warn_otlp_losses
from tests.sidecar.helpers import session_for


def test_every_unknown_key_inside_and_beside_the_block_and_an_invalid_mode_are_reported_at_once(
        tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("collection_interval: 1\nextra: 2\ngpu_telemetry:\n  urls: [a:9400]\n  mode: fancy\n"
                      "  colection_interval: 2\n  bogus: 1\n")
    with pytest.raises(ConfigError) as caught:
        resolve({}, env={}, config_file=config)
    lines = str(caught.value).splitlines()[1:]
    assert [line.strip().split(": ", 1)[1] for line in lines] == [
        "gpu_telemetry.mode 'fancy' is not one of summary, realtime_dashboard",
        "unknown key 'collection_interval' beside gpu_telemetry: (settings go inside the block)",
        "unknown key 'extra' beside gpu_telemetry: (settings go inside the block)",
        "unknown key gpu_telemetry.bogus",
        "unknown key gpu_telemetry.colection_interval",
    ]


@pytest.mark.parametrize(("value", "unit"), [(1_796_234_392, "seconds"), (1_796_234_392_000, "milliseconds"),
                                            (1_796_234_392_000_000, "microseconds")])
def test_a_phase_time_in_the_wrong_unit_is_refused(value: int, unit: str) -> None:
    with pytest.raises(LifecycleError, match=f"time_ns {value} looks like {unit}; send wall-clock nanoseconds"):
        checked_time("time_ns", value, time.time_ns())


def test_a_phase_time_a_day_before_the_run_is_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    now = time.time_ns()
    with caplog.at_level(logging.WARNING):
        checked_mark("p", "warmup", "start", now - 2 * 86_400 * 10**9, now, now)
    assert "more than a day before the run started" in caplog.text


def test_no_reachable_exporter_is_said_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    session = session_for(["http://127.0.0.1:1/metrics"], tmp_path)
    with caplog.at_level(logging.WARNING, "bridge.sidecar.session"):
        session.configure()
    session.complete()
    assert "no exporter answered (http://127.0.0.1:1/metrics): collecting nothing until one does" in caplog.text


def test_lost_otlp_points_are_counted_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        warn_otlp_losses({"dropped_points": 2880, "rejected_points": 0, "sent_points": 0,
                          "last_error": "cannot connect"})
        warn_otlp_losses({"dropped_points": 0, "rejected_points": 0, "sent_points": 10})
    assert caplog.messages == ["OTLP: 2880 points dropped and 0 rejected, 0 sent (last error: cannot connect)"]


def test_an_unreachable_otlp_receiver_is_said_during_the_run_once_a_minute_at_most(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bridge.otlp import ExportStats
    from bridge.sidecar.cli import OtlpLossWatch

    clock = [0.0]
    watch = OtlpLossWatch(monotonic=lambda: clock[0])
    assert watch.check(ExportStats(dropped_points=0, sent_points=5)) is None
    first = watch.check(ExportStats(dropped_points=100, rejected_points=20, sent_points=5, last_error="cannot connect"))
    clock[0] = 30.0
    assert watch.check(ExportStats(dropped_points=240)) is None  # within the minute
    clock[0] = 61.0
    later = watch.check(ExportStats(dropped_points=2880, sent_points=5))
    assert first == ("warning: OTLP receiver is losing data: 120 points dropped or rejected so far, 5 sent "
                     "(last error: cannot connect)")
    assert later is not None and "2880 points" in later
    assert capsys.readouterr().err.count("warning: OTLP receiver is losing data") == 2


def test_a_loss_held_back_by_the_minute_says_when_it_is_due(capsys: pytest.CaptureFixture[str]) -> None:
    """The sidecar looks at the counters when the forwarder signals a loss: growth within the minute after a line
    is held, and the watch says when it is due, so a loss that stopped meanwhile is still said during the run."""
    from bridge.otlp import ExportStats
    from bridge.sidecar.cli import OtlpLossWatch

    clock = [0.0]
    watch = OtlpLossWatch(monotonic=lambda: clock[0])
    assert watch.due_in() is None
    assert watch.check(ExportStats(dropped_points=100)) is not None
    assert watch.due_in() is None  # (said: nothing held)
    clock[0] = 20.0
    assert watch.check(ExportStats(dropped_points=300)) is None
    assert watch.due_in() == 40.0
    clock[0] = 60.0
    assert watch.due_in() == 0.0
    later = watch.check(ExportStats(dropped_points=300))
    assert later is not None and "300 points" in later
    assert watch.due_in() is None
    assert capsys.readouterr().err.count("warning: OTLP receiver is losing data") == 2


@pytest.mark.slow
def test_profile_says_during_the_run_that_the_otlp_receiver_is_losing_data(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from bridge.simulator import SimulatedExporter, SimulatorConfig
    from tests.conftest import free_port

    closed = free_port()
    env = {**os.environ, "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "AIPERF_GPU_COLLECTION_INTERVAL": "0.1"}
    benchmark = [sys.executable, "-c", "import time; time.sleep(3)"]
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        result = subprocess.run(
            [sys.executable, "-m", "bridge.cli", "profile", "--gpu-telemetry", exporter.url, "--artifact-dir",
             str(tmp_path / "out"), "--otlp-endpoint", f"http://127.0.0.1:{closed}", "--otlp-max-queue-points", "100",
             "--", *benchmark], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    during = [line for line in result.stderr.splitlines() if line.startswith("warning: OTLP receiver is losing data")]
    assert len(during) == 1 and "points dropped or rejected so far" in during[0]  # once: the run lasts < 1 min
    assert "(last error: cannot connect to " in during[0]  # not "connect cannot connect"
    assert "OTLP: " in result.stderr and " points dropped and 0 rejected" in result.stderr  # and the total at the end


@pytest.mark.slow
def test_the_sidecar_says_during_the_run_that_the_otlp_receiver_is_losing_data(tmp_path: Path) -> None:
    """The sidecar's main thread sleeps until the forwarder says it lost points (no look every second), and then
    says so at once; SIGTERM still ends the run."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    from bridge.simulator import SimulatedExporter, SimulatorConfig
    from tests.conftest import free_port

    closed = free_port()
    env = {**os.environ, "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "AIPERF_GPU_COLLECTION_INTERVAL": "0.1",
           "DCGM_BRIDGE_HEALTH_HOST": "127.0.0.1"}
    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bridge.cli", "sidecar", "--gpu-telemetry", exporter.url, "--health-port",
             str(free_port()), "--artifact-dir", str(tmp_path / "out"), "--otlp-endpoint",
             f"http://127.0.0.1:{closed}", "--otlp-max-queue-points", "100"],
            stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stderr is not None
        lines: list[str] = []
        said = threading.Event()

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)
                if line.startswith("warning: OTLP receiver is losing data"):
                    said.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert said.wait(30), "".join(lines)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
            reader.join(10)
            proc.stderr.close()
    assert "points dropped or rejected so far" in "".join(lines)
    assert code in (0, 1), "".join(lines)  # (1: the run's problems are said at the end, OTLP losses among them)


# -- issue 33 item 5: said when it matters, and only then ------------------------------------------------------
def _profile(tmp_path: Path, *args: str, code: int = 0) -> Any:
    import os
    import subprocess
    import sys

    from bridge.simulator import SimulatedExporter, SimulatorConfig

    env = {**os.environ, "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "AIPERF_GPU_COLLECTION_INTERVAL": "0.2",
           "COLUMNS": "80"}
    with SimulatedExporter(SimulatorConfig(gpus=1)) as exporter:
        return subprocess.run([sys.executable, "-m", "bridge.cli", *args, "profile", "--gpu-telemetry", exporter.url,
                               "--artifact-dir", str(tmp_path / "out"), "--", sys.executable, "-c",
                               f"import time; time.sleep(1); raise SystemExit({code})"],
                              capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.slow
def test_a_plain_profile_run_warns_about_nothing_and_a_failed_benchmark_is_named(tmp_path: Path) -> None:
    result = _profile(tmp_path, code=3)
    assert result.returncode == 3
    assert "WARNING" not in result.stderr, result.stderr  # no phase_manifest.json is the normal case
    assert "dcgm-bridge: exit 3, the benchmark's (it exited 3)" in result.stderr


@pytest.mark.slow
def test_v_adds_a_line_per_endpoint_scrape_and_vv_the_pages_details(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:  # three independent runs, each mostly its benchmark's 1 s sleep
        quiet, verbose, debug = pool.map(lambda n, flags: _profile(tmp_path / str(n), *flags), range(3),
                                         [(), ("-v",), ("-vv",)])
    assert "scrape 127.0.0.1:" not in quiet.stderr
    scrapes = [line for line in verbose.stderr.splitlines()
               if " INFO bridge.sidecar.session: scrape 127.0.0.1:" in line]
    assert len(scrapes) >= 3 and " samples, 0 lines dropped" in scrapes[-1]
    assert "page 127.0.0.1:" not in verbose.stderr
    assert " DEBUG bridge.sidecar.session: page 127.0.0.1:" in debug.stderr
    assert " families, content type " in debug.stderr


@pytest.mark.parametrize(("refresh_ms", "warned"), [(30_000, True), (0, False)])
def test_values_that_stand_still_are_said_during_a_short_run_before_the_refresh_period_is_known(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, refresh_ms: int, warned: bool) -> None:
    from bridge.simulator import ManualClock, SimulatedExporter, SimulatorConfig
    from tests.sidecar.helpers import NS, scrape_synchronously

    clock = ManualClock()
    with SimulatedExporter(SimulatorConfig(gpus=1, refresh_ms=refresh_ms), now_ns=clock) as exporter, \
            caplog.at_level(logging.WARNING, "bridge.sidecar.session"):
        session = session_for([exporter.url], tmp_path, collection_interval=0.5)
        session.configure()
        for _ in range(24):  # 12 s of scrapes at 0.5 s: a 30 s exporter refreshes at most once
            clock.advance(NS // 2)
            scrape_synchronously(session, 1)
        session.complete()
    said = [r.getMessage() for r in caplog.records if "values have not changed for" in r.getMessage()]
    assert len(said) == (1 if warned else 0), said
    if warned:
        assert "values have not changed for 5 s (10 scrapes)" in said[0] and "-c 100" in said[0]
