"""Each scripted fault of the simulated exporter does what it claims, over real HTTP on loopback.

Time is a ManualClock: time-window faults are driven by moving it and calling `poll()`, never by sleeping.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families as parse_text

from bridge.simulator import (
    Fault,
    ManualClock,
    NodeModel,
    SimulatedExporter,
    SimulatorConfig,
    parse_fault_spec,
    render_page,
)
from bridge.simulator.cli import simulate
from bridge.simulator.config import NS

T0 = 1_750_000_020 * NS
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=5) as client:
        yield client


@pytest.fixture
def exporter(clock: ManualClock) -> Iterator[SimulatedExporter]:
    with SimulatedExporter(SimulatorConfig(gpus=2), now_ns=clock) as started:
        yield started


def fresh_get(http: httpx.Client, exporter: SimulatedExporter, timeout: float = 5) -> httpx.Response:
    """A GET on a connection of its own (restarts cut pooled ones)."""
    return http.get(exporter.url, headers={"Connection": "close"}, timeout=timeout)


def energy_of(text: str, gpu: str) -> float:
    for family in parse_text(text):
        for sample in family.samples:
            if family.name == ENERGY and sample.labels["gpu"] == gpu:
                return sample.value
    raise AssertionError(f"no energy sample for GPU {gpu}")


def test_http_500_answers_only_the_scripted_requests(http: httpx.Client, exporter: SimulatedExporter) -> None:
    exporter.add_fault(Fault("http-500", requests=(2, 3)))
    assert [http.get(exporter.url).status_code for _ in range(4)] == [200, 500, 500, 200]
    assert exporter.requests == 4


def test_faults_follow_a_window_of_simulated_time(
    http: httpx.Client, exporter: SimulatedExporter, clock: ManualClock
) -> None:
    exporter.add_fault(Fault("http-500", from_ns=T0 + 10 * NS, until_ns=T0 + 20 * NS))
    statuses = []
    for _ in range(4):
        statuses.append(http.get(exporter.url).status_code)
        clock.advance(7 * NS)
    assert statuses == [200, 200, 500, 200]  # t = 0, 7, 14, 21 s


def test_empty_body_answers_200_with_nothing_as_during_a_hot_reload(
    http: httpx.Client, exporter: SimulatedExporter
) -> None:
    exporter.add_fault(Fault("empty-body", requests=(1, 1)))
    response = http.get(exporter.url)
    assert response.status_code == 200 and response.content == b""
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert len(http.get(exporter.url).content) > 10_000


def test_json_serves_a_json_body_with_a_json_content_type(
    http: httpx.Client, exporter: SimulatedExporter
) -> None:
    exporter.add_fault(Fault("json", requests=(1, 1)))
    response = http.get(exporter.url)
    assert response.headers["content-type"] == "application/json"
    assert response.json()["status"] == "error"


def test_slow_responses_outlast_a_client_timeout(http: httpx.Client, exporter: SimulatedExporter) -> None:
    exporter.add_fault(Fault("slow", requests=(1, 1), delay_s=30))
    with pytest.raises(httpx.ReadTimeout):
        fresh_get(http, exporter, timeout=0.2)
    assert fresh_get(http, exporter).status_code == 200  # stop() wakes the sleeping response at teardown


def test_a_short_delay_still_answers(http: httpx.Client, exporter: SimulatedExporter) -> None:
    exporter.add_fault(Fault("slow", requests=(1, 1), delay_s=0.01))
    assert http.get(exporter.url).status_code == 200


def test_a_truncated_body_makes_the_client_raise(http: httpx.Client, exporter: SimulatedExporter) -> None:
    exporter.add_fault(Fault("truncated", requests=(1, 1)))
    with pytest.raises(httpx.RemoteProtocolError, match="incomplete|complete message body"):
        fresh_get(http, exporter)
    assert fresh_get(http, exporter).status_code == 200


def test_a_garbage_line_breaks_a_strict_parser_but_the_other_lines_survive(
    http: httpx.Client, exporter: SimulatedExporter
) -> None:
    exporter.add_fault(Fault("garbage-line", requests=(1, 1)))
    text = http.get(exporter.url).text
    with pytest.raises(ValueError):
        list(parse_text(text))
    good = [line for line in text.splitlines(keepends=True) if "garbage" not in line]
    assert len(good) == len(text.splitlines()) - 1
    assert sum(len(f.samples) for f in parse_text("".join(good))) == 80


def test_sentinels_leak_blank_values_and_a_null_label_on_one_gpu(
    http: httpx.Client, clock: ManualClock
) -> None:
    config = SimulatorConfig(gpus=2, mig=2, faults=(Fault("sentinels", gpu=1),))
    with SimulatedExporter(config, now_ns=clock) as exporter:
        text = http.get(exporter.url).text
    lines = text.splitlines()
    gpu1 = [line for line in lines if 'gpu="1"' in line]
    assert any(line.startswith("DCGM_FI_DEV_MEMORY_TEMP{") and line.endswith(" 9223372036854775794")
               for line in gpu1)
    assert any(line.startswith("DCGM_FI_DEV_POWER_USAGE{") and line.endswith(" 140737488355328.000000")
               for line in gpu1)
    assert all('DCGM_FI_DRIVER_VERSION="<<<NULL>>>"' in line and 'GPU_I_PROFILE="<<<NULL>>>"' in line
               for line in gpu1)
    assert not [line for line in lines if 'gpu="0"' in line and "<<<NULL>>>" in line]
    samples = [s for f in parse_text(text) for s in f.samples if s.labels["gpu"] == "1"]
    assert 9223372036854775794 in {s.value for s in samples}  # prometheus_client keeps big integers exact


def test_int32_blank_leaks_into_gpu_util_without_mig(http: httpx.Client, exporter: SimulatedExporter) -> None:
    exporter.add_fault(Fault("sentinels", requests=(1, 1)))
    text = http.get(exporter.url).text
    assert any(line.startswith('DCGM_FI_DEV_GPU_UTIL{gpu="0"') and line.endswith(" 2147483632")
               for line in text.splitlines())


def test_an_unescaped_quote_in_a_label_value_is_written_raw(
    http: httpx.Client, exporter: SimulatedExporter
) -> None:
    exporter.add_fault(Fault("unescaped-quote", requests=(1, 1), gpu=1))
    text = http.get(exporter.url).text
    assert 'modelName="NVIDIA "H100 80GB HBM3""' in text
    assert 'gpu="0",UUID=' in text and text.count('"H100') == text.count('gpu="1"')
    with pytest.raises(ValueError):
        list(parse_text(text))


def test_a_huge_body_streams_the_requested_size_of_valid_lines(exporter: SimulatedExporter) -> None:
    exporter.add_fault(Fault("huge-body", requests=(1, 1), size_bytes=1024 * 1024))
    with httpx.stream("GET", exporter.url) as response:
        declared = int(response.headers["content-length"])
        body = b"".join(response.iter_raw())
    assert len(body) == declared and 1024 * 1024 - 300 < declared <= 1024 * 1024
    samples = sum(len(f.samples) for f in parse_text(body.decode()))
    assert samples > 4_000


def test_a_counter_reset_restarts_counters_but_not_ground_truth(
    http: httpx.Client, exporter: SimulatedExporter, clock: ManualClock
) -> None:
    before = energy_of(http.get(exporter.url).text, "0")
    reset_at = T0 + 60 * NS
    exporter.add_fault(Fault("counter-reset", from_ns=reset_at))
    clock.advance(90 * NS)
    after = energy_of(http.get(exporter.url).text, "0")
    truth = exporter.model.energy_joules(0, reset_at, clock())
    assert after < before and abs(after - 1000 * truth) <= 1  # counting from 0 since the reset
    assert exporter.model.counter_origin_ns(0, clock()) == reset_at
    assert exporter.model.energy_joules(0, T0, clock()) > truth  # ground truth ignores the reset


def test_a_counter_reset_can_hit_one_gpu_at_a_request(
    http: httpx.Client, exporter: SimulatedExporter
) -> None:
    exporter.add_fault(Fault("counter-reset", requests=(2, 2), gpu=1))
    first = http.get(exporter.url).text
    second = http.get(exporter.url).text  # same simulated instant: the reset is at this request
    assert energy_of(second, "1") == 0 and energy_of(first, "1") > 1e9
    assert energy_of(second, "0") == energy_of(first, "0")


def test_an_xid_appears_only_after_injection_with_err_code_and_err_msg(
    http: httpx.Client, exporter: SimulatedExporter, clock: ManualClock
) -> None:
    exporter.add_fault(Fault("xid", from_ns=T0 + 5 * NS, gpu=1, xid=79))
    assert "DCGM_FI_DEV_XID_ERRORS" not in http.get(exporter.url).text
    clock.advance(5 * NS)
    xids = [s for f in parse_text(http.get(exporter.url).text) for s in f.samples
            if f.name == "DCGM_FI_DEV_XID_ERRORS"]
    assert [(s.labels["gpu"], s.value, s.labels["err_code"], s.labels["err_msg"]) for s in xids] == [
        ("1", 79, "79", "GPU has fallen off the bus")
    ]
    lines = http.get(exporter.url).text.splitlines()
    line = next(line for line in lines if line.startswith("DCGM_FI_DEV_XID"))
    assert 'DCGM_FI_DRIVER_VERSION="570.124.06",err_code="79",err_msg="GPU has fallen off the bus"}' in line


def test_a_restart_window_refuses_connections_then_listens_on_the_same_port(
    http: httpx.Client, exporter: SimulatedExporter, clock: ManualClock
) -> None:
    port = exporter.port
    exporter.add_fault(Fault("restart", from_ns=T0 + 10 * NS, until_ns=T0 + 20 * NS))
    assert fresh_get(http, exporter).status_code == 200
    clock.advance(10 * NS)
    exporter.poll()
    assert not exporter.listening
    with pytest.raises(httpx.ConnectError):
        fresh_get(http, exporter)
    clock.advance(10 * NS)
    exporter.poll()
    assert fresh_get(http, exporter).status_code == 200 and exporter.port == port


def test_a_restart_at_a_request_drops_it_and_refuses_the_next(
    http: httpx.Client, exporter: SimulatedExporter, clock: ManualClock
) -> None:
    assert http.get(exporter.url).status_code == 200  # a pooled keep-alive connection
    exporter.add_fault(Fault("restart", requests=(2, 2), duration_ns=3 * NS))
    with pytest.raises(httpx.RemoteProtocolError):
        http.get(exporter.url)  # the process "dies" mid-request
    with pytest.raises(httpx.ConnectError):
        fresh_get(http, exporter)
    clock.advance(3 * NS)
    exporter.poll()
    assert fresh_get(http, exporter).status_code == 200 and exporter.requests == 3


def test_fault_specs_parse_from_the_cli_syntax() -> None:
    assert parse_fault_spec("http-500,requests=3-5", 0) == Fault("http-500", requests=(3, 5))
    assert parse_fault_spec("empty-body,requests=7", 0) == Fault("empty-body", requests=(7, 7))
    assert parse_fault_spec("restart,from=30,for=10", T0) == Fault(
        "restart", from_ns=T0 + 30 * NS, until_ns=T0 + 40 * NS, duration_ns=10 * NS)
    assert parse_fault_spec("slow, delay=1.5s, requests=2-", 0).delay_s == 1.5
    assert parse_fault_spec("huge-body,mb=4", 0).size_bytes == 4 * 1024 * 1024
    assert parse_fault_spec("xid,code=48,gpu=3", 0) == Fault("xid", gpu=3, xid=48)


@pytest.mark.parametrize("spec", [
    "melt", "http-500,requests", "http-500,requests=5-2", "slow,delay=soon", "restart", "xid,colour=red",
    "http-500,from=20,until=10",
])
def test_bad_fault_specs_are_refused_with_a_message(spec: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        parse_fault_spec(spec, 0)


def test_an_invalid_config_names_every_problem() -> None:
    with pytest.raises(ValueError, match="dialect.*gpus|gpus.*dialect") as info:
        SimulatorConfig(gpus=0, dialect="klingon", mig=9)  # type: ignore[arg-type]
    assert "mig" in str(info.value)


def test_the_cli_writes_one_deterministic_page() -> None:
    args = ["--once", "--gpus", "2", "--seed", "3", "--at", "1750000020", "--dialect", "current"]
    first = CliRunner().invoke(simulate, args)
    second = CliRunner().invoke(simulate, args)
    assert first.exit_code == 0 and first.stdout_bytes == second.stdout_bytes
    config = SimulatorConfig(gpus=2, seed=3, dialect="current", sensors="h200")  # the CLI serves an H200's sensors
    assert first.stdout_bytes == render_page(NodeModel(config, lambda: T0), T0)


def test_the_cli_serves_until_sigterm() -> None:
    code = "from bridge.simulator.cli import simulate; simulate()"
    with subprocess.Popen([sys.executable, "-c", code, "--port", "0", "--gpus", "1", "--endpoints", "2"],
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        urls = [proc.stdout.readline().split(" at ")[1].strip() for _ in range(2)]
        assert [httpx.get(url).status_code for url in urls] == [200, 200]
        assert httpx.get(urls[0]).text != httpx.get(urls[1]).text  # seeds 0 and 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
