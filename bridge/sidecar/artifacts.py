"""One run, one record: what a new run does with the files it finds in its artifact directory.

The events file's first line names the run that wrote it (its `configured` event), and a `complete`
event near its end says that run finished. A new run id moves the earlier run's files into a subfolder
named after that run (one line says so) and starts fresh files, so `make demo` twice, a reused `out/`
and a sweep into one folder never mix two runs' records. The same run id carries on: a sidecar restarted
inside its run appends; one restarted after its run completed leaves the finished files alone.

Before any of that the directory must be writable: a benchmark must not run for an hour into a folder
that cannot take its telemetry.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

from bridge.digest import same_secret
from bridge.errors import ConfigError
from bridge.record_log import EVENTS_FILE, EXPORT_FILE, MAX_LINE_BYTES
from bridge.sidecar.folder_lock import FolderLock

logger = logging.getLogger(__name__)

Disposition = Literal["fresh", "resume", "finished"]
_TAIL_BYTES = 64 * 1024  # the complete event is the last line, or close to it
SPOOL_PREFIX = ".dcgm-bridge-spool-"
# What a run writes or merges into, besides its record log and events file (report/write.py's names).
_REPORT_FILES = ("profile_export_aiperf.json", "profile_export_aiperf.csv", "gpu_telemetry.html", "phases")


@dataclass(frozen=True)
class EarlierRun:
    run_id: str | None  # None: a record log without our events file (AIPerf's own, or an old one)
    completed: bool


def check_writable(artifact_dir: Path) -> None:
    """Create the directory and a file in it, or stop with the reason."""
    problem = write_problem(artifact_dir)
    if problem is not None:
        raise ConfigError(f"--artifact-dir {artifact_dir}: cannot write there ({problem}); "
                          "give a folder this user can write (or set DCGM_BRIDGE_ARTIFACT_DIR)")


def write_problem(artifact_dir: Path) -> str | None:
    """Why nothing can be written into the directory now (its strerror), or None: create it, write a byte into
    a new file and remove it. Only trying tells — root ignores file modes; a read-only mount, a full disk (an
    empty file needs no data block, hence the byte), a path through a file — at most once a second. The probe
    file is made with O_EXCL under a random name (mkstemp): a link planted under a guessable name is never
    written through."""
    try:
        artifact_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".dcgm-bridge-write-test-", dir=artifact_dir)
        try:
            os.write(fd, b"\n")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def check_outputs(artifact_dir: Path, paths: Iterable[Path]) -> None:
    """Every promised output, the files themselves: inside the folder, not a link (a planted link would have
    root write or merge outside it), and writable when it exists already (another user's file, a read-only
    one). Nothing is created. A ConfigError names the first file that fails."""
    folder = artifact_dir.resolve()
    for path in paths:
        if os.path.realpath(path.parent) != str(folder):
            raise ConfigError(f"{path} is not inside the artifact folder {artifact_dir}: give a file name, not a "
                              "path, for the outputs")
        problem = output_problem(path)
        if problem is not None:
            raise ConfigError(problem)


def output_problem(path: Path) -> str | None:
    """Why an output path cannot be used as it is (None: it can): a link, something not a regular file or
    folder, or a file this process cannot write."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if stat.S_ISLNK(mode):
        return (f"{path} is a symbolic link: remove it (dcgm-bridge never follows a link below the artifact "
                "folder; someone else may have planted it)")
    if stat.S_ISDIR(mode):
        return None if path.name == "phases" else f"{path} is a folder, not a file: remove or rename it"
    if not stat.S_ISREG(mode):
        return f"{path} is not a regular file: remove it"
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        return (f"cannot write {path} ({exc.strerror or exc}): it was made by another user or is read-only; "
                "remove it or give another --artifact-dir")
    return None


def report_paths(directory: Path, names: Iterable[str]) -> list[Path]:
    """The report's files in `directory` (its JSON and CSV, `names`) and its phases/ folder."""
    return [directory / name for name in (*names, "phases")]


def new_spool_dir(artifact_dir: Path, run_id: str) -> Path:
    """This process's report spool: a new folder (mkdtemp: a random name, O_EXCL, mode 0700) inside the artifact
    folder, so no link planted under a name we would use is ever written through."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:64]
    return Path(tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{safe}-", dir=artifact_dir))


def done_marker_is_ours(path: Path, run_id: str, token: str | None = None) -> bool:
    """Whether the benchmark-done marker (`<run id> <exit code> [<control token>]`, kube profile's legacy sidecar)
    is this run's. Where the run has a control token the marker must carry it (the same rule as POST /complete: a
    neighbour who can write the volume must not end the run). Any other one (an earlier run's, one without a run
    id or the token) is removed with one line and ignored: a stale or forged marker must not end the run."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        words: list[bytes] = []
    else:
        with os.fdopen(fd, "rb") as f:
            words = f.read(512).split()
    named = words[0].decode(errors="replace") if words else None
    if named == run_id and (token is None or (len(words) >= 3 and same_secret(words[2], token.encode()))):
        return True
    if named == run_id:
        logger.warning("%s names run %s but not its control token: removed and ignored", path, run_id)
    else:
        logger.warning("%s is not run %s's (it names %s): removed and ignored", path, run_id,
                       repr(named[:64]) if named is not None else "no run")
    with contextlib.suppress(OSError):
        path.unlink()
    return False


def earlier_run(events: Path, record_log: Path) -> EarlierRun | None:
    """The run whose files are in the directory, or None when there are none."""
    if events.exists():
        return EarlierRun(_first_run_id(events), _completed(events))
    if record_log.exists() and record_log.stat().st_size:
        return EarlierRun(None, True)
    return None


def prepare_artifact_dir(artifact_dir: Path, run_id: str, record_log: Path, report_names: tuple[str, ...] = (),
                         lock: FolderLock | None = None, outputs: Iterable[Path] = ()) -> Disposition:
    """Make the directory ready for run `run_id`; see the module docstring for the three cases. With `lock`,
    the folder is locked first (folder_lock.py): nothing is moved while another live run holds it. Then every
    promised output in `outputs` is checked (`check_outputs`) unless the run already finished. A ConfigError
    leaves the folder unlocked."""
    check_writable(artifact_dir)
    if lock is not None:
        lock.acquire()
    try:
        disposition = _dispose_of_earlier_run(artifact_dir, run_id, record_log, report_names)
        if disposition != "finished":
            check_outputs(artifact_dir, outputs)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return disposition


def _dispose_of_earlier_run(artifact_dir: Path, run_id: str, record_log: Path, report_names: tuple[str, ...],
                            ) -> Disposition:
    events = artifact_dir / EVENTS_FILE
    earlier = earlier_run(events, record_log)
    if earlier is None:
        return "fresh"
    if earlier.run_id == run_id:
        if earlier.completed:
            logger.warning("run %s already completed in %s: its files are left as they are; nothing more is "
                           "collected (give a new --run-id to start another run)", run_id, artifact_dir)
            return "finished"
        logger.warning("run %s carries on in %s (restarted before it completed)", run_id, artifact_dir)
        return "resume"
    folder = _free_folder(artifact_dir, earlier.run_id or _stamp(record_log))
    pages = _pages_of(artifact_dir, earlier.run_id)
    moved = _move_run_files(artifact_dir, folder, record_log, (*report_names, *pages))
    logger.warning("%s held the files of an earlier run%s: moved %d of them into %s/",
                   artifact_dir, f" ({earlier.run_id})" if earlier.run_id else "", moved, folder)
    return "fresh"


def _first_run_id(events: Path) -> str | None:
    try:
        with events.open("rb") as stream:
            for _ in range(50):  # (readline's bound: a file of one endless line is not read whole)
                line = stream.readline(MAX_LINE_BYTES)
                if not line:
                    break
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(event, dict) and event.get("type") == "configured" and event.get("run_id"):
                    return str(event["run_id"])
    except OSError:
        return None
    return None


def _completed(events: Path) -> bool:
    try:
        with events.open("rb") as stream:
            stream.seek(max(0, events.stat().st_size - _TAIL_BYTES))
            tail = stream.read()
    except OSError:
        return False
    return b'"type":"complete"' in tail


def _stamp(path: Path) -> str:
    return "earlier-" + time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))


def _free_folder(artifact_dir: Path, name: str) -> Path:
    base = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "earlier"
    folder, n = artifact_dir / base, 1
    while folder.exists():
        n += 1
        folder = artifact_dir / f"{base}-{n}"
    return folder


def _pages_of(artifact_dir: Path, run_id: str | None) -> list[str]:
    """The HTML pages in the folder that name `run_id` (`profile --html` into the folder, under any name)."""
    from bridge.report.html import page_run_id

    if run_id is None:
        return []
    pages = []
    for path in artifact_dir.glob("*.html"):
        try:
            with path.open("rb") as page:
                head = page.read(2048)
        except OSError:
            continue
        if page_run_id(head) == run_id:
            pages.append(path.name)
    return pages


def _move_run_files(artifact_dir: Path, folder: Path, record_log: Path, report_names: tuple[str, ...]) -> int:
    names = {EVENTS_FILE, EXPORT_FILE, f"{EXPORT_FILE}.gz", record_log.name, f"{record_log.name}.gz",
             *_REPORT_FILES, *report_names}
    moved = 0
    try:
        for path in sorted(artifact_dir.iterdir()):
            if path.name in names:
                folder.mkdir(exist_ok=True)
                shutil.move(str(path), str(folder / path.name))
                moved += 1
            elif path.name.startswith(SPOOL_PREFIX):  # a killed run's report spool: never read again
                shutil.rmtree(path, ignore_errors=True)
    except OSError as exc:
        raise ConfigError(f"--artifact-dir {artifact_dir}: cannot move the earlier run's files into {folder} "
                          f"({exc.strerror or exc}); move or delete them, or give another folder") from None
    return moved
