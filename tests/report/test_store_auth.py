"""`report --prometheus` sends the headers and credentials a multi-tenant or protected store needs (Mimir's
X-Scope-OrgID, a bearer token, Grafana Cloud's basic auth), from flags, environment and secret files, as the OTLP
side takes them (bridge/headers.py), and never prints them nor the URL's userinfo. The store is a real
VictoriaMetrics holding the run; in front of it, a real HTTP gateway on 127.0.0.1 that answers 401 unless the
request carries what it requires, as a Mimir or Grafana Cloud gateway does (issue 44)."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import main
from tests.conftest import require_binary
from tests.loopback import LoopbackServer, send
from tests.otlp.conftest import VictoriaMetrics

T0_S = 1_780_000_000
RUN = "auth-run"
TENANT, TOKEN, USER, PASSWORD = "tenant-44", "t0ken-s3cret-44", "123456", "glc_p4ssw0rd-44"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    """VictoriaMetrics holding one GPU of one run: 300 W and its energy counter, a scrape a second for 20 s."""
    server = VictoriaMetrics(require_binary("victoria-metrics"), tmp_path_factory.mktemp("vm") / "data")
    server.start()
    labels = f'run_id="{RUN}",gpu="0",UUID="GPU-44",modelName="NVIDIA H100 80GB HBM3",instance="127.0.0.1:9400"'
    lines = []
    for k in range(21):
        ms = (T0_S + k) * 1000
        lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 300 {ms}")
        lines.append(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {1_000_000 + 300_000 * k} {ms}")
    request = urllib.request.Request(f"{server.base}/api/v1/import/prometheus", data="\n".join(lines).encode(),
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 204
    server.flush()
    yield server
    server.stop()


def gateway(store: VictoriaMetrics, required: dict[str, str]) -> LoopbackServer:
    """A gateway that forwards a query to the store only with every `required` header, else 401."""
    def respond(handler: BaseHTTPRequestHandler) -> None:
        if any(handler.headers.get(name) != value for name, value in required.items()):
            send(handler, b'{"status":"error","error":"authentication required"}', status=401,
                 content_type="application/json")
            return
        with urllib.request.urlopen(f"{store.base}{handler.path}", timeout=10) as answer:
            send(handler, answer.read(), content_type="application/json")

    return LoopbackServer(respond)


def base(server: LoopbackServer) -> str:
    return server.url.removesuffix("/metrics")


def report_args(url: str, out: Path, *extra: str) -> list[str]:
    return ["report", "--prometheus", url, "--run-id", RUN, "--start-ns", str((T0_S + 5) * 10**9),
            "--end-ns", str((T0_S + 15) * 10**9), "--grace-ns", "0", "-o", str(out / "report.json"), *extra]


def energy_of(out: Path) -> float:
    doc = json.loads((out / "report.json").read_text())
    return float(doc["nvidia_total_gpu_energy"]["avg"])


def test_mimirs_tenant_header_and_a_bearer_token_file_are_sent(store: VictoriaMetrics, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with gateway(store, {"X-Scope-OrgID": TENANT, "Authorization": f"Bearer {TOKEN}"}) as gate:
        result = CliRunner().invoke(main, report_args(base(gate), tmp_path, "--prometheus-headers",
                                                      f"X-Scope-OrgID={TENANT}", "--prometheus-bearer-token-file",
                                                      str(token)))
    assert result.exit_code == 0, result.output
    assert energy_of(tmp_path) == pytest.approx(300 * 10)  # 300 W over the 10 s window, from the store
    assert TOKEN not in result.output and TENANT not in result.output


def test_basic_auth_and_a_headers_file_come_from_the_environment(store: VictoriaMetrics, tmp_path: Path) -> None:
    password, headers = tmp_path / "password", tmp_path / "headers"
    password.write_text(PASSWORD)
    headers.write_text(f"# Mimir tenant\nX-Scope-OrgID={TENANT}\n")
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    env = {"DCGM_BRIDGE_PROMETHEUS_USER": USER, "DCGM_BRIDGE_PROMETHEUS_PASSWORD_FILE": str(password),
           "DCGM_BRIDGE_PROMETHEUS_HEADERS_FILE": str(headers)}
    with gateway(store, {"X-Scope-OrgID": TENANT, "Authorization": basic}) as gate:
        result = CliRunner().invoke(main, report_args(base(gate), tmp_path), env=env)
    assert result.exit_code == 0, result.output
    assert energy_of(tmp_path) == pytest.approx(300 * 10)
    assert PASSWORD not in result.output


def test_a_refused_query_says_what_to_give_and_prints_no_secret(store: VictoriaMetrics, tmp_path: Path) -> None:
    with gateway(store, {"Authorization": f"Bearer {TOKEN}"}) as gate:
        url = base(gate).replace("http://", f"http://{USER}:{PASSWORD}@")  # credentials in the URL: never printed
        result = CliRunner().invoke(main, report_args(url, tmp_path, "--prometheus-headers",
                                                      "Authorization=Bearer%20wr0ng-t0ken-44"))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "401" in result.output and "--prometheus-bearer-token-file" in result.output
    assert PASSWORD not in result.output and "wr0ng-t0ken-44" not in result.output


@pytest.mark.parametrize(("extra", "message"), [
    (["--prometheus-headers", "no-equals-sign"], "--prometheus-headers headers: an item is not key=value"),
    (["--prometheus-user", USER], "--prometheus-user and --prometheus-password-file go together"),
    (["--prometheus-bearer-token-file", "/nonexistent/token"], "--prometheus-bearer-token-file /nonexistent/token"),
])
def test_bad_credentials_stop_the_report_in_one_line_before_any_query(extra: list[str], message: str,
                                                                      tmp_path: Path) -> None:
    result = CliRunner().invoke(main, report_args("http://127.0.0.1:9/", tmp_path, *extra))
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
