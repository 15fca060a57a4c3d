"""The real-API tier: etcd + apiextensions-apiserver on loopback, with the vendored JobSet CRD installed.

Binaries come from scripts/install-kube-apiserver.sh. The server is the CRD server
that kube-apiserver embeds: real schema validation, defaulting, pruning, CEL, status subresource,
watch and RBAC-style authorization (only `system:masters` is allowed), but no core API and no
controllers — so the tests play the JobSet controller by patching status themselves.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import re
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import CACHE, free_port, require_binary, unavailable

CRD_PATH = Path(__file__).parents[1] / "data" / "jobset" / "jobset.x-k8s.io_jobsets.v0.12.0.yaml"
UNAVAILABLE_MARKER = CACHE / "kube-apiserver.unavailable"
READY_DEADLINE_S = 60.0
INSTALL = "run `make servers` (scripts/install-kube-apiserver.sh) where a Debian mirror answers"


def load_crd() -> dict[str, Any]:
    # CSafeLoader: 0.07 s for the 824 KB CRD, against 0.6-1.3 s with the pure-Python loader.
    loaded: dict[str, Any] = yaml.load(CRD_PATH.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader)
    return loaded


def tier_unavailable_reason() -> str | None:
    """The install script's recorded reason, when the Debian toolchain could not be obtained."""
    if (CACHE / "bin" / "apiextensions-apiserver").exists():
        return None
    if UNAVAILABLE_MARKER.exists():
        return UNAVAILABLE_MARKER.read_text(encoding="utf-8").strip() or "no reason recorded"
    return None


def pytest_report_header(config: pytest.Config) -> str | None:
    reason = tier_unavailable_reason()
    if not reason:
        return None
    return f"kube-apiserver tier: {'FAILS' if os.environ.get('CI') else 'SKIPPED'} ({reason}; {INSTALL})"


@dataclass(frozen=True)
class KubeAPI:
    url: str
    kubeconfig: Path  # a system:masters client: allowed everything
    nobody_kubeconfig: Path  # authenticated, authorized for nothing: every call is a 403

    def clients(self, kubeconfig: Path | None = None) -> Any:
        from bridge.kube.submit import connect

        return connect(str(kubeconfig or self.kubeconfig), None)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_pki(pki: Path) -> None:
    """EC P-256 (0.1 s; RSA-2048 took up to 2 s): a CA, the server cert, two client certs."""
    pki.mkdir(parents=True)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=pki)
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=dcgm-bridge-test-ca", "-days", "2",
             "-out", "ca.crt", cwd=pki)
    certs = {
        "server": ("/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        "admin": ("/O=system:masters/CN=test-admin", "extendedKeyUsage=clientAuth\n"),
        "nobody": ("/O=benchmarkers/CN=nobody", "extendedKeyUsage=clientAuth\n"),
    }
    for name, (subject, ext) in certs.items():
        (pki / f"{name}.ext").write_text(ext)
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=pki)
        _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=pki)


def _kubeconfig(path: Path, url: str, pki: Path, user: str) -> Path:
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": url, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(f"{user}.crt"),
                                          "client-key-data": b64(f"{user}.key")}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user, "namespace": "default"}}],
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class _DenyingAuthorizer(http.server.BaseHTTPRequestHandler):
    """The authorization webhook the API server delegates to for anyone not in system:masters.

    It answers every SubjectAccessReview with "denied", so the server itself builds its real 403.
    """

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        review = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        review["status"] = {"allowed": False, "reason": "the test authorizer allows only system:masters"}
        body = json.dumps(review).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
        pass


def _start_authorizer(pki: Path) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DenyingAuthorizer)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.crt", pki / "server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def kube_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeAPI]:
    reason = tier_unavailable_reason()
    if reason:  # the install script exited 0 having written why: CI still fails (require_binary's rule)
        unavailable(f"kube-apiserver tier unavailable ({reason})", INSTALL)
    etcd = require_binary("etcd")
    apiserver = require_binary("apiextensions-apiserver")
    state = tmp_path_factory.mktemp("kubeapi")
    pki = state / "pki"
    _make_pki(pki)
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    url = f"https://127.0.0.1:{api_port}"
    admin = _kubeconfig(state / "kubeconfig", url, pki, "admin")
    nobody = _kubeconfig(state / "nobody.kubeconfig", url, pki, "nobody")
    authorizer = _start_authorizer(pki)
    authz = _kubeconfig(state / "authz.kubeconfig", f"https://127.0.0.1:{authorizer.server_address[1]}", pki, "admin")
    env = {**os.environ, "ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")}
    etcd_log, api_log = state / "etcd.log", state / "apiserver.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with etcd_log.open("wb") as log:
            procs.append(subprocess.Popen(
                [str(etcd), "--name", "test", "--data-dir", str(state / "etcd"),
                 "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                 "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-cluster", f"test=http://127.0.0.1:{peer_port}",
                 "--unsafe-no-fsync", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, env=env))
        with api_log.open("wb") as log:
            # The standalone server wants a "core" kubeconfig for itself and for delegated authn/authz.
            # Client certs are checked locally; system:masters is always allowed and anyone else is
            # asked of our denying webhook (this server can't answer SubjectAccessReviews itself).
            # Admission plugins and APF need core informers this server can't serve: off.
            procs.append(subprocess.Popen(
                [str(apiserver), "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
                 "--bind-address", "127.0.0.1", "--secure-port", str(api_port),
                 "--tls-cert-file", str(pki / "server.crt"), "--tls-private-key-file", str(pki / "server.key"),
                 "--client-ca-file", str(pki / "ca.crt"),
                 "--kubeconfig", str(admin), "--authentication-kubeconfig", str(admin),
                 "--authorization-kubeconfig", str(authz), "--authentication-skip-lookup",
                 "--enable-priority-and-fairness=false", "--profiling=false",
                 "--disable-admission-plugins", "NamespaceLifecycle,MutatingAdmissionPolicy,MutatingAdmissionWebhook,"
                 "ValidatingAdmissionPolicy,ValidatingAdmissionWebhook"],
                stdout=log, stderr=subprocess.STDOUT, env=env))
        api = KubeAPI(url, admin, nobody)
        _wait_ready(api, procs, {"etcd": etcd_log, "apiextensions-apiserver": api_log})
        _install_crd(api)
        yield api
    finally:
        for proc in reversed(procs):
            _stop(proc)
        authorizer.shutdown()
        authorizer.server_close()


def _wait_ready(api: KubeAPI, procs: list[subprocess.Popen[bytes]], logs: dict[str, Path]) -> None:
    """Poll (bounded) until the server lists CRDs. Its /readyz never passes here:
    a Services informer can't list on a server without the core API."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api.clients().api_client)
    deadline = time.monotonic() + READY_DEADLINE_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        for proc, (name, log) in zip(procs, logs.items(), strict=True):
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode} during start-up:\n{_tail(log)}")
        try:
            ext.list_custom_resource_definition(limit=1, _request_timeout=2, _preload_content=False)
            return
        except Exception as exc:  # noqa: BLE001 - connection refused / TLS not up yet: poll again
            last = exc
            time.sleep(0.1)
    log = _tail(logs["apiextensions-apiserver"])
    pytest.fail(f"API server not ready after {READY_DEADLINE_S:g} s ({last}):\n{log}")


def _install_crd(api: KubeAPI) -> None:
    install_crd(api, load_crd())


def install_crd(api: KubeAPI, crd: dict[str, Any]) -> None:
    """Create a CRD and wait (bounded) until it is Established."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api.clients().api_client)
    # _preload_content=False: don't deserialise the 824 KB schema back into models.
    ext.create_custom_resource_definition(crd, _preload_content=False)
    deadline = time.monotonic() + READY_DEADLINE_S
    name = crd["metadata"]["name"]
    while time.monotonic() < deadline:
        raw = json.loads(ext.read_custom_resource_definition(name, _preload_content=False).data)
        conditions = (raw.get("status") or {}).get("conditions") or []  # null right after create
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        time.sleep(0.05)
    pytest.fail(f"CRD {name} not Established after {READY_DEADLINE_S:g} s")


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A namespace per test (this server doesn't check that namespaces exist), so tests can't collide."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    return f"t-{name[:40].strip('-')}-{digest}"
