"""Real receivers on loopback for the OTLP tests: VictoriaMetrics, Prometheus, rotel; and helpers.

Each server is started from the binary `make servers` installed (tests/conftest.py `require_binary`)
or, for rotel, from the wheel in the venv, on a free 127.0.0.1 port with a temporary data directory,
polled until it answers (bounded deadline, no fixed sleeps), and stopped by its own process handle.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import urllib3

from tests.conftest import free_port, require_binary, unavailable
from tests.conftest import wait_until as poll

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = ROOT / "collector"
_HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(total=5.0))


def wait_until(check: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    """tests/conftest.py's, a server that does not answer yet counting as not yet."""
    poll(check, timeout_s, what, ignore=(urllib3.exceptions.HTTPError, OSError, ValueError, KeyError))


def http_ok(url: str) -> bool:
    return bool(_HTTP.request("GET", url).status == 200)


class Server:
    """One child process; `stop()` / `start()` keep the port and data directory (outage tests)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        ready_url: str,
        log: Path,
        env: dict[str, str] | None = None,
        *,
        any_answer: bool = False,  # ready when ready_url answers at all (rotel has no health endpoint)
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.ready_url = ready_url
        self.log = log
        self.env = env
        self.any_answer = any_answer
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        try:
            wait_until(self._ready, 20.0, f"{self.name} at {self.ready_url}")
        except AssertionError:
            self.stop()
            raise AssertionError(f"{self.name} did not start; log:\n{self.log.read_text()[-3000:]}") from None

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
        if self.any_answer:
            _HTTP.request("GET", self.ready_url)
            return True
        return http_ok(self.ready_url)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class VictoriaMetrics(Server):
    def __init__(self, binary: Path, data: Path, *, prometheus_naming: bool = False) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        argv = [
            str(binary),
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-storageDataPath={data}",
            "-retentionPeriod=100y",
            "-search.latencyOffset=0s",
            "-loggerLevel=WARN",
        ]
        argv += vm_flags_from_collector()
        if prometheus_naming:
            argv.append("-opentelemetry.usePrometheusNaming")
        super().__init__("victoria-metrics", argv, f"{self.base}/health", data.parent / f"vm-{self.port}.log")
        self.otlp_url = f"{self.base}/opentelemetry/v1/metrics"

    def flush(self) -> None:
        assert http_ok(f"{self.base}/internal/force_flush")

    def query(self, promql: str, at_s: float) -> list[dict[str, Any]]:
        return prom_query(self.base, promql, at_s)


def vm_flags_from_collector() -> list[str]:
    """The ingest flags of collector/victoriametrics/victoria-metrics.flags (the shipped drop-in)."""
    path = COLLECTOR / "victoriametrics" / "victoria-metrics.flags"
    flags = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and not line.startswith(("-httpListenAddr", "-storageDataPath")):
            flags.append(line)
    return flags


def prom_query(base: str, promql: str, at_s: float) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": promql, "time": f"{at_s:.3f}"})
    response = _HTTP.request("GET", f"{base}/api/v1/query?{query}")
    body = json.loads(response.data)
    assert body.get("status") == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.fixture(scope="module")
def victoria_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    """VictoriaMetrics with its default OTLP naming (names as sent, resource attributes as labels)."""
    binary = require_binary("victoria-metrics")
    server = VictoriaMetrics(binary, tmp_path_factory.mktemp("vm") / "data")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def victoria_metrics_prom_naming(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    """VictoriaMetrics translating names as Prometheus' OTLP receiver does (counters get `_total`)."""
    binary = require_binary("victoria-metrics")
    server = VictoriaMetrics(binary, tmp_path_factory.mktemp("vmp") / "data", prometheus_naming=True)
    server.start()
    yield server
    server.stop()


def rotel_binary() -> Path:
    """rotel's Rust agent ships inside its wheel (a test extra); same CI rule as require_binary."""
    spec = importlib.util.find_spec("rotel")
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / "rotel-agent"
        if path.exists():
            return path
    unavailable("rotel is not installed", "pip install rotel==0.0.1a15 (in the test extras: make .venv/.test)")


def load_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


@pytest.fixture
def rotel_to_vm(victoria_metrics: VictoriaMetrics, tmp_path: Path) -> Iterator[Server]:
    """rotel with collector/rotel/rotel.env, receiving OTLP/gRPC and forwarding to VictoriaMetrics."""
    binary = rotel_binary()
    grpc_port, http_port = free_port(), free_port()
    env = {**os.environ, **load_env_file(COLLECTOR / "rotel" / "rotel.env")}
    env.update(
        {
            "ROTEL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
            "ROTEL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
            "ROTEL_OTLP_EXPORTER_ENDPOINT": f"{victoria_metrics.base}/opentelemetry",
            "ROTEL_OTLP_EXPORTER_METRICS_ENDPOINT": victoria_metrics.otlp_url,
            "ROTEL_PID_FILE": str(tmp_path / "rotel.pid"),
            "ROTEL_LOG_FILE": str(tmp_path / "rotel.log"),
        }
    )
    # rotel has no health endpoint: its OTLP/HTTP receiver answering (405 on GET) means it is up.
    server = Server("rotel", [str(binary), "start"], f"http://127.0.0.1:{http_port}/v1/metrics",
                    tmp_path / "rotel-stdout.log", env, any_answer=True)
    server.port = grpc_port
    server.start()
    yield server
    server.stop()



def forwarding_session(store: VictoriaMetrics, exporter_url: str, out: Path, run_id: str, interval: float) -> Any:
    """A started sidecar session scraping `exporter_url` and forwarding to `store` over OTLP/HTTP."""
    from bridge.config import Config
    from bridge.endpoints import TelemetryItems
    from bridge.fields import default_table
    from bridge.otlp import OtlpForwarder, resolve_config
    from bridge.sidecar.session import Session

    otlp = resolve_config({}, endpoint=store.otlp_url, export_interval_s=0.2)
    forwarder = OtlpForwarder(otlp, base_resource={"service.name": "dcgm-exporter"})
    config = Config(telemetry=TelemetryItems(urls=[exporter_url]), default_endpoints=[], artifact_dir=str(out),
                    collection_interval=interval, run_id=run_id, shutdown_delay=10.0)
    session = Session(config, default_table(), forwarder=forwarder)
    session.configure()
    session.start()
    return session
