"""Shared set-up for the sidecar tests: a session on loopback with short timeouts."""

from __future__ import annotations

from pathlib import Path

from bridge.config import Config
from bridge.endpoints import TelemetryItems
from bridge.fields import default_table
from bridge.sidecar.session import Session

NS = 1_000_000_000


def session_for(urls: list[str], tmp_path: Path, **overrides) -> Session:
    settings = {"collection_interval": 0.05, "scrape_timeout": 1.0, "connect_timeout": 0.5, "run_id": "test-run",
                "shutdown_delay": 3.0, **overrides}
    config = Config(telemetry=TelemetryItems(urls=urls), default_endpoints=[], artifact_dir=str(tmp_path),
                    **settings)
    return Session(config, default_table())


def scrape_synchronously(session: Session, times: int) -> None:
    for loop in session.loops.values():
        for _ in range(times):
            loop.scrape_now()

