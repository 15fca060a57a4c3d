"""No tracebacks for user errors (issue 12 items 6, 8, 9, 12): one line naming the input and what to do,
exit 2; a runtime failure exits 1; `profile` passes the benchmark's code through. Each case runs the
command as a user would (through bridge.cli.main, the one place errors become messages)."""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import struct
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.sidecar.control import ControlServer
from bridge.sidecar.finish import SessionOutputs, run_exit_code
from tests.loopback import LoopbackServer, send
from tests.sidecar.helpers import session_for

DATA = Path(__file__).parent / "data"
PAGE = DATA / "k8s-ai-conformance_kops_l4.txt"
QUIET = {"AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "[]", "AIPERF_GPU_SHUTDOWN_DELAY": "1",
         "DCGM_BRIDGE_CONNECT_TIMEOUT": "0.3", "DCGM_BRIDGE_HEALTH_PORT": "0"}


def run(args: list[str], env: dict[str, str] | None = None, stdin: bytes | None = None):
    result = CliRunner().invoke(main, args, env={**QUIET, **(env or {})}, input=stdin)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.mark.parametrize(("args", "message"), [
    (["parse", "http//host:9400/metrics"], "Error: parse 'http//host:9400/metrics': malformed scheme; "
                                           "expected http://host:9400/metrics or host:9400"),
    (["parse", ":19400"], "Error: parse ':19400': no host in the URL (did you mean localhost:19400?)"),
    (["parse", "htp://x:9400"], "Error: parse 'htp://x:9400': unsupported scheme 'htp'; expected http:// or "
                                "https://"),
    (["parse", "no-such-file"], "Error: parse 'no-such-file': no such file, and not a URL"),
    (["sidecar", "--gpu-telemetry", "htp://x:9400"], "--gpu-telemetry 'htp://x:9400': unsupported scheme 'htp'"),
    (["profile", "--gpu-telemetry", "http:/x:9400", "--", "true"], "--gpu-telemetry 'http:/x:9400': malformed"),
    (["sidecar", "--gpu-telemetry", "localhost:1", "--otlp-endpoint", "x:4318", "--attribute", "novalue"],
     "Error: --attribute 'novalue': expected KEY=VALUE"),
])
def test_a_bad_url_or_flag_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = run(args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_custom_metrics_csv_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "metrics.csv"
    bad.write_bytes(b"\xff\xfeDCGM_FI_DEV_GPU_TEMP, gauge, temp\n")
    result = run(["parse", str(PAGE), "--metrics-csv", str(bad)])
    assert result.exit_code == 2
    assert f"Error: custom-metrics CSV {bad}: not UTF-8 text (byte 0xff at offset 0)" in result.output


def test_a_missing_token_file_is_a_configuration_error(tmp_path: Path) -> None:
    result = run(["sidecar", "--gpu-telemetry", "localhost:1"],
                 env={"DCGM_BRIDGE_BEARER_TOKEN_FILE": str(tmp_path / "token")})
    assert result.exit_code == 2
    assert f"DCGM_BRIDGE_BEARER_TOKEN_FILE / --bearer-token-file {tmp_path / 'token'}: cannot read it" in result.output


def test_a_health_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(["sidecar", "--gpu-telemetry", "localhost:1", "--artifact-dir", str(tmp_path / "runs" / "a"),
                      "--health-port", str(port)])
    assert result.exit_code == 2
    assert f"Error: --health-port {port}: cannot listen on 0.0.0.0:{port} (Address already in use)" in result.output
    assert list(tmp_path.iterdir()) == []  # no empty artifact folder left behind


def test_parse_reads_stdin() -> None:
    result = run(["parse", "-"], stdin=PAGE.read_bytes())
    assert result.exit_code == 0, result.output
    assert result.output.startswith("<stdin>: ") and "1 GPU" in result.output.splitlines()[0]


def test_parse_fetches_with_the_sidecars_tls_settings_and_names_them_when_verification_fails(
        certificate: tuple[Path, Path]) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    with LoopbackServer(lambda h: send(h, PAGE.read_bytes()), tls=context) as server:
        refused = run(["parse", server.url])
        trusted = run(["parse", server.url], env={"DCGM_BRIDGE_CA_FILE": str(certificate[0])})
    assert refused.exit_code == 1
    assert "set DCGM_BRIDGE_CA_FILE (ca_file) to that CA's PEM file, or DCGM_BRIDGE_INSECURE_SKIP_VERIFY=true" \
        in refused.output
    assert trusted.exit_code == 0 and "1 GPU" in trusted.output


def test_parse_sends_the_sidecars_bearer_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with LoopbackServer(lambda h: send(h, PAGE.read_bytes())) as server:
        result = run(["parse", server.url], env={"DCGM_BRIDGE_BEARER_TOKEN_FILE": str(token)})
    assert result.exit_code == 0
    assert server.requests[0].get("Authorization") == "Bearer s3cret"


# -- the control API ---------------------------------------------------------------------------------
@pytest.fixture
def control(tmp_path: Path):
    session = session_for([], tmp_path)
    server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"], metrics_text=lambda: b"x" * (8 << 20))
    server.start()
    yield server
    server.stop()
    session.complete()


def test_post_complete_with_no_body_completes(control: ControlServer) -> None:
    with socket.create_connection(("127.0.0.1", control.port), timeout=10) as client:
        client.sendall(b"POST /complete HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b'"completed": true' in answer


def test_a_client_that_stops_reading_metrics_is_not_an_error(control: ControlServer,
                                                            caplog: pytest.LogCaptureFixture,
                                                            capfd: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.DEBUG, "bridge.sidecar.control"):
        for _ in range(3):
            client = socket.create_connection(("127.0.0.1", control.port), timeout=5)
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            client.recv(1024)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, as curl | head
            client.close()
        deadline = time.monotonic() + 5
        while "went away" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "went away" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "Traceback" not in capfd.readouterr().err
    conn = http.client.HTTPConnection("127.0.0.1", control.port, timeout=5)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200  # still serving
    conn.close()


# -- exit codes ----------------------------------------------------------------------------------------
def test_the_benchmarks_failure_wins_and_a_signal_gives_128_plus_its_number(tmp_path: Path) -> None:
    failed = run(["profile", "--gpu-telemetry", "127.0.0.1:1", "--artifact-dir", str(tmp_path / "a"), "--",
                  sys.executable, "-c", "raise SystemExit(3)"])
    killed = run(["profile", "--gpu-telemetry", "127.0.0.1:1", "--artifact-dir", str(tmp_path / "b"), "--",
                  sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert (failed.exit_code, killed.exit_code) == (3, 128 + 15)


def test_a_benchmark_that_succeeded_while_the_report_was_lost_gives_1() -> None:
    lost = SessionOutputs(Path("."), problems=["the report was not written: disk full"])
    assert run_exit_code(0, lost) == 1
    assert run_exit_code(0, SessionOutputs(Path("."))) == 0
    assert run_exit_code(5, lost) == 5


def test_a_benchmark_command_that_does_not_exist_stops_profile_before_anything_starts(tmp_path: Path) -> None:
    result = run(["profile", "--artifact-dir", str(tmp_path / "out"), "--", "no-such-benchmark", "--flag"])
    assert result.exit_code == 2
    assert "Error: profile: cannot run 'no-such-benchmark': no such program" in result.output
    assert not (tmp_path / "out").exists()


# -- the exit-code table, command by command (issue 33 items 2 and 3) --------------------------------------------
def _record_log(tmp_path: Path) -> str:
    from tests.report.helpers import T0, S, rec, write_log

    return str(write_log(tmp_path / "gpu_telemetry_export.jsonl",
                         [rec(T0 + i * S, {"nvidia_power_usage": 300.0}) for i in range(5)]))


def _taken_port(tmp_path: Path) -> str:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    _HELD.append(taken)
    return str(taken.getsockname()[1])


def _no_nvml(tmp_path: Path) -> list[str]:
    """`profile --gpu-telemetry pynvml` where NVML cannot start (no nvidia-ml-py, no driver, no GPU)."""
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]

        pynvml.nvmlInit()
    except Exception:  # not installed, or NVML does not start: the case this is about
        return ["profile", "--gpu-telemetry", "pynvml", "--artifact-dir", str(tmp_path / "a"), "--", "touch",
                str(tmp_path / "ran")]
    pynvml.nvmlShutdown()
    pytest.skip("NVML starts on this machine: no failed start to check")


_HELD: list[socket.socket] = []
_KUBE = ["kube", "profile", "--model", "m", "--url", "http://frontend:8000", "--job-id", "bench-1"]
USAGE_AND_CONFIG_ERRORS = {
    "report: end before start": (lambda t: ["report", "--jsonl", _record_log(t), "--start-ns", "1796201308411830000",
                                            "--end-ns", "1796201298411830000"], "--end-ns"),
    "report: no record source": (lambda t: ["report", "--start-ns", "1"], "give one record source"),
    "report: --html unwritable": (lambda t: ["report", "--jsonl", _record_log(t), "--start-ns", "1796201298411830000",
                                             "--end-ns", "1796201308411830000", "--html", "/proc/no/x.html"],
                                  "--html /proc/no/x.html: cannot write there"),
    "report: unknown counter mode": (lambda t: ["report", "--counter-mode", "fancy"], "--counter-mode"),
    "kube profile: no kubeconfig": (lambda t: [*_KUBE, "--kubeconfig", str(t / "none")], "cannot load kubeconfig"),
    "kube status: no kubeconfig": (lambda t: ["kube", "status", "x", "--kubeconfig", str(t / "none")],
                                   "cannot load kubeconfig"),
    "kube profile --dry-run k8s:// without a cluster": (
        lambda t: [*_KUBE, "--dry-run", "--kubeconfig", str(t / "none"), "--gpu-telemetry", "k8s://gpu/dcgm"],
        "--dry-run cannot expand k8s://gpu/dcgm without a cluster"),
    "simulate: port in use": (lambda t: ["simulate", "--port", _taken_port(t)], "cannot listen on 127.0.0.1:"),
    "simulate: unknown fault": (lambda t: ["simulate", "--fault", "meltdown"], "meltdown"),
    "parse: a folder": (lambda t: ["parse", str(t)], "is a folder"),
    "parse: no such file": (lambda t: ["parse", "no-such-file"], "no such file, and not a URL"),
    "demo: --out not writable": (lambda t: ["demo", "--out", "/proc/no/demo"], "--out /proc/no/demo: cannot make"),
    "profile: --gpu-telemetry takes nothing": (
        lambda t: ["profile", "--gpu-telemetry", "--artifact-dir", str(t / "a"), "--", "true"],
        "--gpu-telemetry is followed by --artifact-dir, not an exporter"),
    "sidecar: --gpu-telemetry takes nothing": (
        lambda t: ["sidecar", "--gpu-telemetry", "--artifact-dir", str(t / "a")],
        "--gpu-telemetry is followed by --artifact-dir, not an exporter"),
    "profile: no -- before the command": (lambda t: ["profile", "--gpu-telemetry", "host:9400", "sleep", "2"],
                                          "put -- before the benchmark command"),
    "profile: --html unwritable": (lambda t: ["profile", "--html", "/proc/no/x.html", "--artifact-dir",
                                              str(t / "a"), "--", "touch", str(t / "ran")],
                                   "--html /proc/no/x.html: cannot write there"),
    "profile: no NVML (a failed start leaves no lock, spool or folder)": (_no_nvml, "--gpu-telemetry pynvml: "),
    "profile: misspelt option": (lambda t: ["profile", "--artfact-dir", "x", "--", "true"], "--artfact-dir"),
    "no such command": (lambda t: ["reprot"], "No such command 'reprot'"),
    "report: --role without a pattern": (lambda t: ["report", "--jsonl", _record_log(t), "--start-ns",
                                                    "1796201298411830000", "--end-ns", "1796201308411830000",
                                                    "--role", "prefill"], "--role 'prefill'"),
    "report: --requests not AIPerf's records": (
        lambda t: ["report", "--jsonl", _record_log(t), "--start-ns", "1796201298411830000", "--end-ns",
                   "1796201308411830000", "--requests", _record_log(t)], "no line is an AIPerf request record"),
    "profile: --idle-window not a duration": (lambda t: ["profile", "--idle-window", "soon", "--artifact-dir",
                                                         str(t / "a"), "--", "touch", str(t / "ran")],
                                              "--idle-window 'soon'"),
    "profile: --role bad namespace": (lambda t: ["profile", "--role", "decode=Bad/x", "--artifact-dir",
                                                 str(t / "a"), "--", "touch", str(t / "ran")], "--role"),
}


@pytest.mark.parametrize("case", sorted(USAGE_AND_CONFIG_ERRORS))
def test_every_usage_and_configuration_error_exits_2_in_one_line(case: str, tmp_path: Path) -> None:
    make_args, fragment = USAGE_AND_CONFIG_ERRORS[case]
    try:
        result = run(make_args(tmp_path), env={"KUBECONFIG": str(tmp_path / "none"), "KUBERNETES_SERVICE_HOST": ""})
    finally:
        while _HELD:
            _HELD.pop().close()
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: ") and fragment in lines[0], result.output
    assert not (tmp_path / "ran").exists() and not (tmp_path / "a").exists()  # nothing started, no folder left


def test_the_benchmarks_own_gpu_telemetry_flag_is_not_the_bridges(tmp_path: Path) -> None:
    """Without `--`, the command starts at its first word on PATH: what follows is the benchmark's."""
    result = run(["profile", "--artifact-dir", str(tmp_path / "a"), sys.executable, "-c", "pass", "--gpu-telemetry"])
    assert result.exit_code == 0, result.output
