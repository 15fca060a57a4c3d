"""Shared test helpers. Real servers run on 127.0.0.1 only; binaries come from scripts/install-*.sh."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import HealthCheck, settings

from bridge.simulator import SimulatorConfig

# Property tests judge what the code does, not how fast examples come on a loaded machine: no per-example
# deadline and no "input generation is slow" failure (both flaked under CPU burners). Per-test @settings
# inherit this and still set their example counts.
settings.register_profile("dcgm-bridge", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dcgm-bridge")

DATA = Path(__file__).parent / "data"
REAL_PAGES = sorted(DATA.glob("*.txt"))
CACHE = Path(os.environ.get("DCGM_BRIDGE_CACHE", Path.home() / ".cache" / "dcgm-bridge"))


def _ahead(item: pytest.Item, name: str) -> dict[str, list]:
    """The module's `AHEAD` or `WAITS_AHEAD` (tests/ahead.py), {} where it has none."""
    return getattr(getattr(item, "module", None), name, None) or {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules whose work starts ahead (tests/ahead.py) run late, each in its own order: the jobs that wait on real
    seconds (`WAITS_AHEAD`) before the modules whose grids are judged ahead (`AHEAD`), which run last: the grids then
    have the whole suite's idle CPU (~225 CPU-s of them; run where the modules fall by name, the acceptance test
    waited 35 s for its grid)."""
    items.sort(key=lambda item: 2 if _ahead(item, "AHEAD") else 1 if _ahead(item, "WAITS_AHEAD") else 0)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The selected tests' grids start on tests/ahead.py's background pool once the tests are collected, and their
    jobs that wait on real seconds on its threads, each in a fresh folder of the session's temporary ones."""
    from tests.ahead import judge_ahead, wait_ahead

    for item in session.items:  # (the grids' pool first: forked before any job's thread exists)
        for f, items in _ahead(item, "AHEAD").get(getattr(item, "originalname", None), ()):
            judge_ahead(f, items)
    for item in session.items:
        name = getattr(item, "originalname", None)
        for job in _ahead(item, "WAITS_AHEAD").get(name, ()):
            # the factory behind the tmp_path_factory fixture (pytest's tmpdir plugin keeps it on the config)
            wait_ahead(job, session.config._tmp_path_factory.mktemp(job.__name__))  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.ahead import stop_judging_ahead, stop_waiting_ahead

    stop_judging_ahead()
    stop_waiting_ahead()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unavailable(reason: str, remedy: str) -> NoReturn:
    """A tier this test needs is missing: in CI (CI=true), which installs every tier and runs as root, the test
    fails with the reason; on a developer machine it skips, naming what makes the tier available."""
    message = f"{reason}: {remedy}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@contextmanager
def simulated_exporter_process(config: SimulatorConfig) -> Iterator[str]:
    """`dcgm-bridge simulate --port 0` serving `config` in a process of its own, as a user runs it (nothing of it
    waits on this process's interpreter): its address (127.0.0.1:PORT, as `--gpu-telemetry` and
    AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS take it), served until the context ends. `config` sets only what the command's
    flags below carry (the truth is `NodeModel(config)`'s)."""
    flags = {"gpus": config.gpus, "seed": config.seed, "dialect": config.dialect, "refresh_ms": config.refresh_ms,
             "sensors": config.sensors}
    assert config == SimulatorConfig(**flags), f"{config} sets more than simulate's flags here carry"
    argv = [str(Path(sys.executable).with_name("dcgm-bridge")), "simulate", "--port", "0",
            *(arg for name, value in flags.items() for arg in (f"--{name.replace('_', '-')}", str(value)))]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()  # "simulated dcgm-exporter (...) at URL"; "" where it could not start
            url = line.rsplit(" at ", 1)[-1].strip()
            assert url.startswith("http://127.0.0.1:"), f"{argv}: {line!r}"
            yield url.removeprefix("http://").removesuffix("/metrics")
        finally:
            process.terminate()


def wait_until(check: Callable[[], object], timeout_s: float = 15.0, what: str = "condition",
               ignore: tuple[type[BaseException], ...] = ()) -> None:
    """Poll `check` until it returns something true, failing after `timeout_s` (the only kind of waiting the
    tests do: never a fixed sleep); exceptions of the `ignore` types count as not yet."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except ignore:
            pass
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


MOUNT_REMEDY = "run the tests as root, as CI does (`sudo .venv/bin/pytest ...`)"


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at `path` with `options` (`ro,size=1m`: a read-only folder, which chmod cannot make for
    root; `size=64k`: a disk that fills up); where mounting is not permitted, `unavailable` (CI fails)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        unavailable(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}", MOUNT_REMEDY)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


@contextmanager
def failing_ext4(path: Path) -> Iterator[tuple[Path, Callable[[], None]]]:
    """An 8 MB ext4 volume mounted at `path` with `errors=remount-ro`, and what turns it read-only under the
    files open in it: an ext4 error (/sys/fs/ext4/<dev>/trigger_fs_error, Linux's
    Documentation/ABI/testing/sysfs-fs-ext4), as an I/O error does to a real volume. (`mount -o remount,ro`
    is refused while a file is open for writing.) Where loop devices or mounting are not permitted,
    `unavailable` (CI fails)."""
    image = path.with_suffix(".img")
    with image.open("wb") as f:
        f.truncate(8 << 20)
    path.mkdir(parents=True, exist_ok=True)
    for argv in (["mkfs.ext4", "-q", "-F", str(image)],
                 ["mount", "-o", "loop,errors=remount-ro", str(image), str(path)]):
        done = subprocess.run(argv, capture_output=True)
        if done.returncode != 0:
            unavailable(f"cannot make an ext4 volume here ({argv[0]}): {done.stderr.decode().strip()}", MOUNT_REMEDY)
    source = subprocess.run(["findmnt", "-no", "SOURCE", str(path)], capture_output=True, text=True).stdout
    trigger = Path("/sys/fs/ext4") / Path(source.strip()).name / "trigger_fs_error"

    def fail() -> None:
        trigger.write_text("test: the volume fails\n")

    try:
        yield path, fail
    finally:
        subprocess.run(["umount", str(path)], check=False)


def require_binary(name: str) -> Path:
    """The path of a server binary installed by `make servers` into the cache's bin/.

    Missing: in CI (CI=true) the test fails, because CI installs everything; on a developer machine
    it skips with the command that installs it.
    """
    path = CACHE / "bin" / name
    if path.exists():
        return path
    unavailable(f"{path} is missing", "run `make servers`")


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
