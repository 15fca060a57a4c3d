"""Real stores on loopback holding one recorded benchmark run and the mixin's recorded series, for the
dashboards' per-query tests.

`stored_run` (module scope, once per exporter dialect; the selected dialects are recorded side by side, `recordings`)
starts three stores and feeds them the same run, step by step:
- VictoriaMetrics (default OTLP naming) and VictoriaMetrics with `-opentelemetry.usePrometheusNaming`
  (counters get `_total`, as in Prometheus/Mimir via OTLP), both through the session's OTLP forwarder
  (bridge.otlp.OtlpForwarder, HTTP/protobuf; `Session(forwarder=...)` submits every page), each with a
  `vmalert` evaluating grafana/rules/dcgm-bridge.rules.yml against it and writing the recorded series back
  (remote write);
- Prometheus 2.53 scraping the session's pull endpoint (`Session.exposition()`, served over loopback
  HTTP) with the shipped collector/prometheus/prometheus.yml job and the rules file loaded.
The run: two simulated nodes, `gpu-node-a` (2 GPUs × 3 MIG instances) and `gpu-node-b` (2 whole GPUs), in
one of two dialects: `legacy` (node A dcgm-exporter <= 4.5 `Hostname`, node B 4.6+ `hostname`) or `dcgm47`
(DCGM 4.7 names and units: node A dcgm-exporter 4.9, node B 4.10); baseline, warmup, a gap, profiling with
an XID on node A's GPU 1, completion. The simulators' clock follows the wall clock (Prometheus stamps its
own scrape times) and each step waits until every store has the step's page and the rules have been
evaluated over it (a recorded sample newer than the page, by an evaluation that ran after the page was
searchable), and starts over a second after Prometheus scraped the step before: bounded polling, no sleeps.
Store helpers (Server, VictoriaMetrics, wait_until) are the OTLP tier's, imported.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml

from bridge.otlp import ExportStats, OtlpConfig, OtlpForwarder, base_attributes
from bridge.samples import ParsedPage
from bridge.sidecar.pull import CONTENT_TYPE, BridgeHealth, render_exposition
from bridge.sidecar.session import Session
from bridge.simulator import ManualClock, SimulatedExporter, SimulatorConfig
from tests.conftest import free_port, require_binary
from tests.grafana.simrun import RecordedRun, Step, drive_run
from tests.otlp.conftest import COLLECTOR, ROOT, Server, VictoriaMetrics, wait_until

RUN_ID = "bench-7f3a"
XID_NODE, XID_GPU, XID_CODE = 0, 1, 79  # node A (MIG), GPU 1
NODE_A, NODE_B = "gpu-node-a", "gpu-node-b"
SCRAPE_INTERVAL_S = 0.1  # Prometheus' scrapes of the pull endpoint, each allowed the whole interval
# The rules' evaluation interval in Prometheus: its rule group takes ~0.15 s of CPU here, so at 100 ms it kept a CPU
# busy; each step waits for vmalert's next whole second anyway
EVAL_INTERVAL_MS = 500
# vmalert's: it stamps and queries whole seconds, so two evaluations within one second write the same timestamp
VMALERT_INTERVAL = "1s"
AFTER_RUN_S = 0.2
STEP_SPACING_S = 1.0  # the least time between two steps' pages in any store
RULES = ROOT / "grafana" / "rules" / "dcgm-bridge.rules.yml"
# dialect -> (node A's, node B's simulator dialect); node A has MIG
DIALECTS = {"legacy": ("legacy", "current"), "dcgm47": ("dcgm49", "dcgm410")}
ENERGY = {"legacy": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "dcgm47": "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"}
# Recorded at every evaluation: the time of the newest sample of the run's GPUs the rules saw.
RECORDED = f'dcgm_bridge:gpu_last_sample_timestamp_seconds{{run_id="{RUN_ID}"}}'
_HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(total=10.0))


class QueryError(AssertionError):
    pass


@dataclass
class Store:
    """One PromQL store holding the run, and when to look at each step in it."""

    name: str
    base: str
    eval_s: dict[int, float] = field(default_factory=dict)  # step index -> a time showing that step
    flush: Callable[[], None] = lambda: None  # makes what was written searchable (VictoriaMetrics)
    vmalert: bool = False

    def recorded(self, step_s: float, since_s: float) -> float | None:
        """The time of a rule evaluation that saw the step's page (at `step_s`, in the store by `since_s`).

        Prometheus evaluates at the time it stamps: any evaluation at or after `since_s` saw it. vmalert
        stamps (and queries at) its schedule truncated to whole seconds, up to a second before it runs and never
        after (app/vmalert/rule/group.go: `Start` runs each evaluation at or after its scheduled `evalTS`,
        `adjustReqTimestamp` truncates it), so its evaluation is known by what it recorded: the newest sample it
        saw, the step's own (`step_s`), and by its stamp, at or after `since_s` (so every rule of it ran after the
        step's flush: one that ran while only part of the step's points were searchable recorded some GPUs at the
        step before, and failed a total on a busy machine)."""
        self.flush()
        now = time.time()
        stamp = self.instant(f"max(timestamp({RECORDED}))", now)
        newest = self.instant(f"max({RECORDED})", now)
        if not stamp or not newest:
            return None
        at, seen = float(stamp[0]["value"][1]), float(newest[0]["value"][1])
        return at if (seen >= step_s and at >= since_s if self.vmalert else at >= since_s) else None

    def _get(self, path: str, params: list[tuple[str, str]]) -> Any:
        response = _HTTP.request("GET", f"{self.base}{path}?{urllib.parse.urlencode(params)}")
        body = json.loads(response.data)
        if body.get("status") != "success":
            raise QueryError(f"{self.name}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def instant(self, expr: str, at_s: float) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query", [("query", expr), ("time", f"{at_s:.3f}")])
        assert data["resultType"] == "vector", data["resultType"]
        return list(data["result"])

    def range(self, expr: str, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query_range", [("query", expr), ("start", f"{start_s:.3f}"),
                                                 ("end", f"{end_s:.3f}"), ("step", f"{step_s}")])
        return list(data["result"])

    def label_values(self, label: str, match: str, start_s: float, end_s: float) -> list[str]:
        data = self._get(f"/api/v1/label/{label}/values",
                         [("match[]", match), ("start", f"{start_s:.3f}"), ("end", f"{end_s:.3f}")])
        return sorted(data)


@dataclass
class StoredRun:
    run: RecordedRun
    stores: dict[str, Store]
    nodes: list[SimulatedExporter]
    dialect: str  # a key of DIALECTS

    @property
    def energy_family(self) -> str:
        return ENERGY[self.dialect]

    @property
    def start_s(self) -> float:
        return self.run.steps[0].t_ns / 1e9

    def end_s(self, store: Store) -> float:
        """The dashboard's "now": shortly after the run's last sample in `store`."""
        return store.eval_s[len(self.run.steps) - 1] + AFTER_RUN_S

    def range_s(self, store: Store) -> int:
        """Grafana's $__range for a time range from the run's first scrape to `end_s` (whole seconds)."""
        return math.ceil(self.end_s(store) - self.start_s) + 1


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # Prometheus gave up on a scrape (its timeout): it scrapes again 50 ms later


class PullEndpoint:
    """The sidecar's /metrics on loopback: serves whatever text it was last given."""

    def __init__(self) -> None:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                body = endpoint.body
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.body = b""
        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        # poll_interval: shutdown() waits for serve_forever's next look (every 0.5 s by default)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="pull-endpoint", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_prometheus(tmp: Path, target_port: int) -> tuple[Server, str]:
    """Prometheus 2.53 with the shipped dcgm-bridge scrape job pointed at the loopback pull endpoint, and the
    mixin's rules."""
    binary = require_binary("prometheus")
    config = yaml.safe_load((COLLECTOR / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": f"{int(SCRAPE_INTERVAL_S * 1000)}ms",
                        "scrape_timeout": f"{int(SCRAPE_INTERVAL_S * 1000)}ms",
                        "evaluation_interval": f"{EVAL_INTERVAL_MS}ms"}
    config["rule_files"] = [str(RULES)]
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "dcgm-bridge")
    del job["kubernetes_sd_configs"]
    job["relabel_configs"] = []
    job["static_configs"] = [{"targets": [f"127.0.0.1:{target_port}"]}]
    config["scrape_configs"] = [job]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = Server(
        "prometheus",
        [str(binary), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        f"http://127.0.0.1:{port}/-/ready", tmp / "prometheus.log",
    )
    server.start()
    return server, f"http://127.0.0.1:{port}"


def _on_whole_seconds(tmp: Path) -> Path:
    """The mixin's rules with each group evaluated on whole seconds (vmalert's `eval_offset: 0s`, which Prometheus'
    rule files do not know): vmalert stamps an evaluation with its schedule truncated to the interval, so on a
    schedule at an arbitrary offset the first evaluation stamped after a step's flush came up to two seconds later
    (each step of a stored run took ~2 s); on whole seconds it is the next second."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        group["eval_offset"] = "0s"
    path = tmp / "rules-whole-seconds.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def start_vmalert(tmp: Path, store: VictoriaMetrics, rules: Path) -> Server:
    """vmalert evaluating `rules` (the mixin's, `_on_whole_seconds`) against `store` and writing the recorded series
    back into it.

    -rule.evalDelay=0s: the store shows points at once (-search.latencyOffset=0s); the default 30 s would
    evaluate the rules over the run's past."""
    port = free_port()
    server = Server(
        "vmalert",
        [str(require_binary("vmalert")), f"-rule={rules}", f"-datasource.url={store.base}",
         f"-remoteWrite.url={store.base}", f"-evaluationInterval={VMALERT_INTERVAL}", "-rule.evalDelay=0s",
         "-remoteWrite.flushInterval=20ms", "-remoteWrite.concurrency=1", "-notifier.blackhole",
         f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN"],
        f"http://127.0.0.1:{port}/health", tmp / f"vmalert-{port}.log",
    )
    server.start()
    return server


class Tee:
    """One sidecar forwarder feeding two receivers (the session holds one forwarder)."""

    def __init__(self, forwarders: list[OtlpForwarder]) -> None:
        self.forwarders = forwarders

    def submit(self, endpoint: str, page: ParsedPage, *, run_id: str, phase: str, ts_ns: int) -> None:
        for fwd in self.forwarders:
            fwd.submit(endpoint, page, run_id=run_id, phase=phase, ts_ns=ts_ns)

    def mark_stale(self, endpoint: str, *, run_id: str, phase: str, ts_ns: int) -> None:
        for fwd in self.forwarders:
            fwd.mark_stale(endpoint, run_id=run_id, phase=phase, ts_ns=ts_ns)

    def stats(self) -> ExportStats:
        return self.forwarders[0].stats()

    def close(self, timeout_s: float = 5.0) -> ExportStats:
        return [fwd.close(timeout_s) for fwd in self.forwarders][0]


def _records_written(base: str) -> float | None:
    response = _HTTP.request("GET", f"{base}/api/v1/query?" + urllib.parse.urlencode(
        {"query": "dcgm_bridge_records_written_total"}))
    result = json.loads(response.data)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


@contextmanager
def _recorded(dialect: str, tmp: Path) -> Iterator[StoredRun]:
    """`dialect`'s run recorded into its stores (kept until the context ends)."""
    vm_binary = require_binary("victoria-metrics")
    for sub in ("vm", "vmp"):
        (tmp / sub).mkdir()
    vm = VictoriaMetrics(vm_binary, tmp / "vm" / "data")
    vm_prom = VictoriaMetrics(vm_binary, tmp / "vmp" / "data", prometheus_naming=True)
    servers: list[Server] = []
    forwarders: list[OtlpForwarder] = []
    # Prometheus first: it scrapes a new target only after its discovery manager's 5 s tick (not a flag), which the
    # VictoriaMetrics start-ups overlap; the run starts once it has scraped the placeholder page.
    pull = PullEndpoint()
    pull.body = render_exposition([], BridgeHealth(records_written=-1))
    try:
        prometheus, prom_base = start_prometheus(tmp, pull.port)
        servers.append(prometheus)
        rules = _on_whole_seconds(tmp)
        for server in (vm, vm_prom):
            server.start()
            servers.append(server)
            servers.append(start_vmalert(tmp, server, rules))
        wait_until(lambda: _records_written(prom_base) == -1, 30.0, "Prometheus' first scrape of the endpoint")
        stores = {
            "victoria-metrics": Store("victoria-metrics", vm.base, flush=vm.flush, vmalert=True),
            "victoria-metrics-prometheus-naming": Store("victoria-metrics-prometheus-naming", vm_prom.base,
                                                        flush=vm_prom.flush, vmalert=True),
            "prometheus-scrape": Store("prometheus-scrape", prom_base),
        }
        resource = base_attributes({}, service_name="dcgm-exporter", hostname=lambda: "bench-pod-0")
        for server in (vm, vm_prom):
            forwarders.append(OtlpForwarder(OtlpConfig(endpoint=server.otlp_url), base_resource=resource,
                                            start=False))
        clock = ManualClock(time.time_ns())
        dialect_a, dialect_b = DIALECTS[dialect]
        node_a = SimulatedExporter(SimulatorConfig(gpus=2, mig=3, hostname=NODE_A, dialect=dialect_a, seed=21),
                                   now_ns=clock)
        node_b = SimulatedExporter(SimulatorConfig(gpus=2, hostname=NODE_B, dialect=dialect_b, seed=22),
                                   now_ns=clock)
        nodes = [node_a, node_b]

        # The steps are over a second apart in every store (the dashboards' 1 s rate window holds at most one
        # step's move): a step starts more than STEP_SPACING_S after Prometheus scraped the one before.
        next_step_after = [0.0]

        def tick() -> None:
            wait_until(lambda: time.time() > next_step_after[0], 2 * STEP_SPACING_S, "the steps' spacing")
            clock.set(max(time.time_ns(), clock() + 1_000_000))

        def before_step(index: int) -> None:
            if index == 9:  # mid-profiling
                nodes[XID_NODE].model.inject_xid(XID_GPU, XID_CODE, clock() + 1)

        def on_step(step: Step, session: Session) -> None:
            for fwd in forwarders:  # what the sidecar's export thread does every export_interval
                assert fwd.flush(10.0)
            for server in (vm, vm_prom):
                server.flush()
            flushed = time.time()  # both VictoriaMetrics show the step's points from here
            pull.body = session.exposition()
            written = session.records_written
            wait_until(lambda: _records_written(prom_base) == written, 10.0,
                       f"Prometheus to scrape step {step.index}")
            scraped = time.time()  # and Prometheus from here
            step_s = step.t_ns // 1_000_000 / 1000  # VictoriaMetrics keeps ms
            # Every store now holds the step's page: the rules' next evaluation records it.
            for store in stores.values():
                since = flushed if store.vmalert else scraped
                wait_until(lambda store=store, since=since: store.recorded(step_s, since) is not None, 10.0,
                           f"{store.name}'s rules to record step {step.index}")
                store.eval_s[step.index] = store.recorded(step_s, since) or since
            next_step_after[0] = scraped + STEP_SPACING_S

        with node_a, node_b:
            run = drive_run(tmp / "artifacts", nodes, clock, tick=tick, on_step=on_step, run_id=RUN_ID,
                            warmup_steps=3, profiling_steps=6, before_step=before_step,
                            forwarder=Tee(forwarders))
        for fwd in forwarders:  # closed by the session's completion
            stats = fwd.stats()
            assert stats.sent_points > 0 and stats.rejected_points == 0 and stats.dropped_points == 0, stats
        for server in (vm, vm_prom):
            server.flush()
        yield StoredRun(run, stores, nodes, dialect)
    finally:
        for fwd in forwarders:
            fwd.close()
        for server in reversed(servers):
            server.stop()
        pull.close()


class Recording:
    """One dialect's run recorded on a thread of its own, its servers kept until `close`."""

    def __init__(self, dialect: str, tmp: Path, threads: ThreadPoolExecutor) -> None:
        self.stack = ExitStack()
        self.future = threads.submit(self.stack.enter_context, _recorded(dialect, tmp))

    def close(self) -> None:
        wait([self.future])  # a failed recording has stopped its servers and failed its tests already
        self.stack.close()


@pytest.fixture(scope="module")
def recordings(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Recording]]:
    """The selected dialects' runs, recorded side by side: each step waits on real seconds (a second between steps
    for the dashboards' rate window, vmalert's whole-second evaluations) far more than it computes, so two at once
    take the time of one."""
    for binary in ("victoria-metrics", "prometheus", "vmalert"):
        require_binary(binary)
    selected = {item.callspec.params["stored_run"] for item in request.session.items
                if "stored_run" in getattr(getattr(item, "callspec", None), "params", {})}
    with ThreadPoolExecutor(max_workers=max(1, len(selected)), thread_name_prefix="recording") as threads:
        started = {dialect: Recording(dialect, tmp_path_factory.mktemp(f"grafana-run-{dialect}"), threads)
                   for dialect in sorted(selected)}
        try:
            yield started
        finally:
            for recording in started.values():
                recording.close()


@pytest.fixture(scope="module", params=list(DIALECTS))
def stored_run(request: pytest.FixtureRequest, recordings: dict[str, Recording]) -> StoredRun:
    stored: StoredRun = recordings[request.param].future.result()
    return stored
