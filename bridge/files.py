"""Files root writes or promises: never through a link, never over one of the run's own files.

Every output (the report's JSON, CSV and phase files, the HTML page) is written as `install(1)` and
systemd write theirs: the parent directory is opened once, a temporary file is created in it with
`O_CREAT | O_EXCL | O_NOFOLLOW` relative to that directory's descriptor, written, fsynced and renamed over
the target in the same directory. `O_EXCL` never opens what is there, `rename(2)` replaces a name and never
follows it, so a link a neighbour planted under the output's name (in a shared 0777 folder) is never written
through. The target itself being a link is refused all the same, with its name: the user asked for a file
there and should learn someone put a link instead.

The start-up check tries the same steps without changing anything: the target is opened for writing with
`O_NOFOLLOW` (no `O_TRUNC`, no `O_APPEND`: nothing is written) and a temporary is made and removed in its
folder, since the rename needs a writable folder even where the file is writable.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["LinkRefused", "own_file_problem", "read_output", "same_file", "write_atomically", "write_problem"]

_NEW_FILE_MODE = 0o644


class LinkRefused(OSError):
    """The output path is a symbolic link (or something else no output may replace)."""


def link_message(path: Path) -> str:
    return (f"{path} is a symbolic link: remove it (dcgm-bridge never writes through a link; someone else may "
            "have planted it)")


def write_atomically(path: Path, data: bytes) -> None:
    """`path` replaced by `data` in one step (see the module docstring). Missing parent folders are made. The
    file keeps its mode when it exists (0644 when new). OSError on failure (LinkRefused for a link); a failed
    write leaves the old file and no temporary behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        mode = _existing_mode(folder, path)
        temp = f".{path.name[:200]}.{os.urandom(6).hex()}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=folder)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, mode)  # (the umask narrowed the create mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=folder)
            raise
        with contextlib.suppress(OSError):  # the rename itself durable (what fsync of the folder is for)
            os.fsync(folder)
    finally:
        os.close(folder)


def read_output(path: Path) -> bytes:
    """An output's current bytes (a JSON or CSV merged into), never read through a link: a link planted there would
    otherwise have root read another user's file into the report (LinkRefused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkRefused(errno.ELOOP, link_message(path)) from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise LinkRefused(errno.EINVAL, f"{path} is not a regular file: remove it or give another path")
        return f.read()


def _existing_mode(folder: int, path: Path) -> int:
    try:
        info = os.stat(path.name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return _NEW_FILE_MODE
    if stat.S_ISLNK(info.st_mode):
        raise LinkRefused(errno.ELOOP, link_message(path))
    if not stat.S_ISREG(info.st_mode):
        raise LinkRefused(errno.EINVAL, f"{path} is not a regular file: remove it or give another path")
    return info.st_mode & 0o777


def write_problem(path: Path) -> str | None:
    """Why `path` cannot be written the way `write_atomically` writes it (a sentence naming it), or None. Tried,
    not judged from file modes (root ignores them, a read-only mount does not); nothing is changed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        return f"{path}: cannot write there ({exc.strerror or exc}); give a path you can write"
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            return link_message(path)
        if stat.S_ISDIR(info.st_mode):
            return f"{path} is a folder; give a file path"
        if not stat.S_ISREG(info.st_mode):
            return f"{path} is not a regular file: remove it or give another path"
        try:  # opened for writing, not truncated, not appended to: unchanged
            os.close(os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC))
        except OSError as exc:
            return f"{path}: cannot write there ({exc.strerror or exc}); give a path you can write"
    folder = path.absolute().parent
    while not folder.exists() and folder != folder.parent:  # the writer makes missing folders
        folder = folder.parent
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            probe = f".dcgm-bridge-write-test-{os.urandom(6).hex()}"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=fd))
            os.unlink(probe, dir_fd=fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return f"{path}: cannot write there ({exc.strerror or exc}); give a path you can write"
    return None


def same_file(path: Path, others: Iterable[Path]) -> Path | None:
    """The first of `others` that `path` names (the same path once resolved, or the same file by device and
    inode: a hard link), else None."""
    target = Path(os.path.realpath(path))
    try:
        info: os.stat_result | None = os.stat(path)
    except OSError:
        info = None
    for other in others:
        if Path(os.path.realpath(other)) == target:
            return other
        if info is not None:
            try:
                theirs = os.stat(other)
            except OSError:
                continue
            if (theirs.st_dev, theirs.st_ino) == (info.st_dev, info.st_ino):
                return other
    return None


def own_file_problem(flag: str, path: Path, own: Mapping[str, Path | None]) -> str | None:
    """Why output `path` may not be written: it is one of the run's own inputs or files (`own`: what each is ->
    its path; a folder stands for everything below it), e.g. a tab-completion slip that would replace the
    record log with an HTML page. None when it is none of them."""
    resolved = Path(os.path.realpath(path))
    for what, other in own.items():
        if other is None:
            continue
        if same_file(path, [other]) is not None or (other.is_dir() and Path(os.path.realpath(other)) in
                                                    resolved.parents):
            return (f"{flag} {path} is {what} ({other}): writing there would replace it; give another path for "
                    f"{flag}")
    return None
