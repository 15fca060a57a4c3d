"""API errors explained, JobSet states, and `kube results` against a fake pod exec."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from bridge.kube import submit
from bridge.kube.jobset import CONTROL_PLANE, FETCHED_FILE


def api_error(status: int, body: dict[str, Any] | None = None, reason: str = "") -> ApiException:
    error = ApiException(status=status, reason=reason)
    error.body = json.dumps(body or {})
    return error


def test_a_404_for_a_missing_namespace_is_not_blamed_on_the_crd() -> None:
    error = submit.explain(api_error(404, {"message": 'namespaces "bench" not found',
                                           "details": {"name": "bench", "kind": "namespaces"}}),
                           verb="create", namespace="bench", name="j")
    assert str(error).startswith("404: namespace bench does not exist")
    assert error.status == 404


def test_a_401_says_the_credentials_were_not_accepted() -> None:
    assert "401 Unauthorized" in str(submit.explain(api_error(401), verb="create", namespace="n"))


def test_an_unreachable_server_is_explained_without_an_http_status() -> None:
    from urllib3.exceptions import MaxRetryError

    error = submit.explain(MaxRetryError(None, "https://10.0.0.1:6443"), verb="create", namespace="n")
    assert str(error).startswith("cannot reach the Kubernetes API server")


@pytest.mark.parametrize("obj,phase", [
    ({"status": {"terminalState": "Completed"}}, "Completed"),
    ({"status": {"conditions": [{"type": "Failed", "status": "True", "message": "boom"}]}}, "Failed"),
    ({"spec": {"suspend": True}}, "Suspended"),
    ({"status": {"replicatedJobsStatus": [{"name": "controller", "active": 1}]}}, "Running"),
    ({}, "Pending"),
    ({"status": {"conditions": [{"type": "Completed", "status": "False"}]}}, "Pending"),
])
def test_the_state_of_a_jobset_follows_terminal_state_conditions_and_counts(obj: dict[str, Any], phase: str) -> None:
    assert submit.state_of(obj).phase == phase


def test_exit_codes_by_outcome() -> None:
    codes = {p: submit.JobSetState(p, "").exit_code for p in ("Completed", "Failed", "Timeout", "Deleted")}
    assert codes == {"Completed": 0, "Failed": 1, "Timeout": 2, "Deleted": 3}


class FakeCore:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.selectors: list[str] = []

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        self.selectors.append(label_selector)
        return type("PodList", (), {"items": self.pods})()


def running_pod(mode: str = "native") -> dict[str, Any]:
    return {"metadata": {"name": "bench-1-controller-0-0-abcde", "annotations": {"dcgm-bridge/gpu-telemetry": mode}},
            "status": {"phase": "Running",
                       "container_statuses": [{"name": CONTROL_PLANE, "state": {"running": {"started_at": "x"}}}]}}


def archive(files: dict[str, bytes]) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


class FakeExec:
    def __init__(self, tar_b64: str) -> None:
        self.tar_b64 = tar_b64
        self.commands: list[list[str]] = []
        self.complete_answer = '200 {"completed": true, "files": []}'

    def __call__(self, core: Any, namespace: str, pod: str, container: str, command: list[str]) -> str:
        assert container == CONTROL_PLANE
        self.commands.append(command)
        if command[0] == "python3" and "tarfile" in command[2]:
            return self.tar_b64
        return self.complete_answer if command[0] == "python3" else ""


def test_results_completes_the_native_sidecar_then_copies_then_releases_the_pod(tmp_path: Path) -> None:
    exec_fn = FakeExec(archive({"profile_export_aiperf.json": b'{"telemetry_data": {}}',
                                "gpu_telemetry_export.jsonl": b"{}\n"}))
    core = FakeCore([running_pod()])
    names = submit.fetch_results(core, "bench", "bench-1", tmp_path, exec_fn=exec_fn)
    assert names == ["gpu_telemetry_export.jsonl", "profile_export_aiperf.json"]
    assert (tmp_path / "profile_export_aiperf.json").read_bytes() == b'{"telemetry_data": {}}'
    assert core.selectors == ["aiperf.nvidia.com/job-id=bench-1"]
    assert "/complete" in exec_fn.commands[0][2]  # the merge comes before the copy
    assert exec_fn.commands[-1] == ["touch", FETCHED_FILE]


def test_results_says_when_the_sidecar_answered_complete_with_a_failure(tmp_path: Path, caplog) -> None:
    failed = '500 {"completed": false, "error": "the report was not written: cannot write /artifacts/x: No space"}'
    exec_fn = FakeExec(archive({"gpu_telemetry_export.jsonl": b"{}\n"}))
    exec_fn.complete_answer = failed
    submit.fetch_results(FakeCore([running_pod()]), "bench", "bench-1", tmp_path, exec_fn=exec_fn)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"the sidecar in {running_pod()['metadata']['name']} did not write all its telemetry: {failed}"]


def test_the_complete_script_prints_the_status_and_body_of_a_failed_complete() -> None:
    class Failing(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(500)
            self.send_header("Content-Length", "20")
            self.end_headers()
            self.wfile.write(b'{"completed": false}')

        def log_message(self, *args: object) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Failing) as server:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/complete"
        script = submit._COMPLETE_SCRIPT.replace(f"http://127.0.0.1:{submit.HEALTH_PORT}/complete", url)
        assert script != submit._COMPLETE_SCRIPT
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        server.shutdown()
    assert out.returncode == 0 and out.stdout == '500 {"completed": false}\n', out.stderr


def test_results_from_a_legacy_sidecar_pod_does_not_post_complete(tmp_path: Path) -> None:
    exec_fn = FakeExec(archive({"a.json": b"{}"}))
    submit.fetch_results(FakeCore([running_pod("legacy")]), "bench", "bench-1", tmp_path, exec_fn=exec_fn,
                         release=False)
    assert len(exec_fn.commands) == 1 and "tarfile" in exec_fn.commands[0][2]


def test_results_refuses_an_archive_that_escapes_the_output_folder(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    exec_fn = FakeExec(base64.b64encode(buf.getvalue()).decode())
    with pytest.raises(tarfile.OutsideDestinationError):
        submit.fetch_results(FakeCore([running_pod()]), "bench", "bench-1", tmp_path / "out", exec_fn=exec_fn)
    assert not (tmp_path / "escape.txt").exists()


def test_results_from_a_finished_pod_explains_where_artifacts_live(tmp_path: Path) -> None:
    pod = running_pod()
    pod["status"] = {"phase": "Succeeded", "container_statuses": [{"name": CONTROL_PLANE, "state": {"terminated": {}}}]}
    with pytest.raises(submit.KubeError, match="--artifacts-pvc"):
        submit.fetch_results(FakeCore([pod]), "bench", "bench-1", tmp_path, exec_fn=FakeExec(""))


def test_results_without_a_pod_says_the_run_is_gone_or_not_started(tmp_path: Path) -> None:
    with pytest.raises(submit.KubeError, match="no pod labelled aiperf.nvidia.com/job-id=bench-1"):
        submit.fetch_results(FakeCore([]), "bench", "bench-1", tmp_path, exec_fn=FakeExec(""))
