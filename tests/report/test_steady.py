"""Issue 46, item 3: the steady state, found on the power trace and the request concurrency together, with its own
energy per output token; "no steady state" when the load never holds still.

Truth: requests placed by hand (concurrency in closed form) and a GPU whose power follows it (100 W + 50 W per
request in flight), its counter the exact integral."""

from __future__ import annotations

import pytest

from bridge.report import build_report
from bridge.report.requests import read_requests
from bridge.report.window import explicit_window
from bridge.simulator.disagg import SimRequest, aiperf_lines
from tests.report.helpers import MS, T0, S, rec

STEP = 10 * MS


def _run(tmp_path, starts_s: list[float], length_s: float, seconds: float):
    requests = [SimRequest(f"r{i}", T0 + round(t * S), T0 + round((t + 0.2) * S), T0 + round((t + length_s) * S),
                           100, 50) for i, t in enumerate(starts_s)]

    def watts(t: int) -> float:
        return 100.0 + 50.0 * sum(r.start_ns <= t < r.end_ns for r in requests)

    out, joules, t = [], 1e6, T0 - S
    while t <= T0 + round((seconds + 1) * S):  # the counter integrates the power every 10 ms, scraped every 100 ms
        if (t - T0) % (100 * MS) == 0:
            out.append(rec(t, {"nvidia_power_usage": watts(t), "nvidia_energy_consumption": joules * 1e-6}))
        joules += watts(t) * STEP / S
        t += STEP
    path = tmp_path / "profile_export.jsonl"
    path.write_bytes(aiperf_lines(requests))
    return build_report(out, window=explicit_window(T0, T0 + round(seconds * S), 0), requests=read_requests(path))


def test_a_held_load_is_the_steady_state_with_its_own_energy_per_output_token(tmp_path):
    # A request every 0.5 s, each 2 s long, from 0 to 27.5 s: 4 in flight from 2 s to 28 s, ramps either side.
    built = _run(tmp_path, [0.5 * k for k in range(56)], 2.0, 30.0)
    steady = built.telemetry_data["steady_state"]
    assert steady["found"] is True
    assert 2.0 <= (steady["start_ns"] - T0) / 1e9 <= 3.0 and 27.0 <= (steady["end_ns"] - T0) / 1e9 <= 28.0
    assert steady["concurrency"] == pytest.approx(4.0, rel=1e-6)
    assert steady["power_w"] == pytest.approx(300.0, rel=1e-3)
    # Two requests a second, 50 output tokens each: 100 tokens a second at 300 W.
    assert steady["j_per_output_token"] == pytest.approx(300.0 / 100.0, rel=0.01)
    assert steady["window_j_per_output_token"] == pytest.approx(built.energy.total_energy_j / (56 * 50), rel=1e-9)


def test_a_load_that_never_holds_still_has_no_steady_state(tmp_path):
    # Ever more requests in flight: 1 s apart, each lasting until the end.
    built = _run(tmp_path, [float(k) for k in range(30)], 40.0, 30.0)
    steady = built.telemetry_data["steady_state"]
    assert steady["found"] is False and steady["reasons"] == ["no_steady_state"]


def test_the_steady_state_line_is_tagged_for_the_console_and_the_html(tmp_path):
    from bridge.report.console import serving_lines
    from bridge.report.html import render_html

    built = _run(tmp_path, [0.5 * k for k in range(56)], 2.0, 30.0)
    lines = serving_lines(built.telemetry_data)
    steady = [line for line in lines if line.kind == "steady"]
    assert len(steady) == 1 and steady[0].text.startswith("Steady state: ") and steady[0].role is None
    assert [line.kind for line in lines] == ["steady", "requests"]
    page = render_html(built)
    assert page.count('data-steady="1"') == 1 and page.count('data-requests="1"') == 1 and "data-role=" not in page
