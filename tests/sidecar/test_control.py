"""The control API over real HTTP on loopback."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import session_for


@pytest.fixture
def control(tmp_path):
    from bridge.sidecar.control import ControlServer

    with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
        session = session_for([exporter.url], tmp_path)
        session.configure()
        session.start()
        server = ControlServer(session, "127.0.0.1", 0, ["127.0.0.1/8"])
        server.start()
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
            yield session, client
        session.complete()
        server.stop()


def test_probes_status_and_phase_marks_through_the_control_api(control):
    session, client = control
    assert client.get("/healthz").json() == {"status": "alive"}
    assert client.get("/readyz").status_code == 200
    mark = {"name": "profiling", "kind": "profiling", "event": "start", "time_ns": 1_700_000_000_000_000_000}
    response = client.post("/phases", json=mark)
    assert response.status_code == 200 and response.json()["accepted"] == mark
    status = client.get("/status").json()
    assert status["state"] == "collecting" and status["phase"] == "profiling" and status["marks"] == [mark]
    from bridge.kernel import COMPILED

    assert status["per_page_path"] == ("compiled kernel" if COMPILED else "pure Python (bridge._kernel not built)")
    threads = status["cpu_s_by_thread"]  # where the CPU goes: the scrape thread has worked, this one too
    assert threads["scrape"] > 0 and threads[threading.current_thread().name] > 0
    completed = client.post("/complete", json={"requests_end_ns": 1_700_000_001_000_000_000})
    assert completed.status_code == 200 and completed.json()["completed"]
    assert any(f.endswith("profile_export_aiperf.json") for f in completed.json()["files"])


@pytest.mark.parametrize(("method", "path", "body", "status", "message"), [
    ("POST", "/phases", b"{not json", 400, "not valid JSON"),
    ("POST", "/phases", b"[1]", 400, "JSON object"),
    ("POST", "/phases", json.dumps({"name": "x", "kind": "training", "event": "start", "time_ns": 1}).encode(),
     400, "kind must be one of"),
    ("POST", "/phases", json.dumps({"name": "x", "kind": "warmup", "event": "begin", "time_ns": 1}).encode(),
     400, "event must be"),
    ("POST", "/phases", json.dumps({"name": "x", "kind": "warmup", "event": "start"}).encode(), 400, "time_ns"),
    ("POST", "/complete", json.dumps({"requests_end_ns": "soon"}).encode(), 400, "requests_end_ns"),
    ("POST", "/phases", b"x" * (65 * 1024), 413, "larger than"),
    ("GET", "/phases", None, 405, "takes POST"),
    ("POST", "/status", b"{}", 405, "takes GET"),
    ("DELETE", "/status", None, 405, "use GET"),
    ("GET", "/nope", None, 404, "no such endpoint"),
])
def test_bad_control_requests_get_a_4xx_that_says_what_is_wrong(control, method, path, body, status, message):
    _session, client = control
    response = client.request(method, path, content=body)
    assert response.status_code == status and message in response.json()["error"]


def test_posts_from_outside_the_allowed_networks_are_refused(tmp_path):
    from bridge.sidecar.control import ControlServer

    session = session_for([], tmp_path)
    server = ControlServer(session, "127.0.0.1", 0, ["10.0.0.0/8"])
    server.start()
    try:
        response = httpx.post(f"http://127.0.0.1:{server.port}/complete", json={})
        assert response.status_code == 403 and "DCGM_BRIDGE_CONTROL_ALLOW" in response.json()["error"]
        assert httpx.get(f"http://127.0.0.1:{server.port}/healthz").status_code == 200
    finally:
        server.stop()


# -- parse command ------------------------------------------------------------------------------------
