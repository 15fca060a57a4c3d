"""Shared test helpers. Real servers run on 127.0.0.1 only; binaries come from scripts/install-*.sh."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
REAL_PAGES = sorted(DATA.glob("*.txt"))
CACHE = Path(os.environ.get("DCGM_BRIDGE_CACHE", Path.home() / ".cache" / "dcgm-bridge"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_binary(name: str) -> Path:
    """The path of a server binary installed by `make servers` into the cache's bin/.

    Missing: in CI (CI=true) the test fails, because CI installs everything; on a developer machine
    it skips with the command that installs it.
    """
    path = CACHE / "bin" / name
    if path.exists():
        return path
    message = f"{path} is missing: run `make servers`"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and key for 127.0.0.1 (TLS exporters on loopback)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key
