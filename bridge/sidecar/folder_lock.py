"""One owner per artifact folder: an advisory lock held by the run for as long as it writes there.

The lock is `flock(2)` on `.dcgm-bridge.lock` in the folder; the file also holds the holder's pid, run id
and host, so a second run can say who holds it. The kernel drops an flock when its holder dies (even by
SIGKILL), so a dead holder never blocks: the next run takes the lock and says whose it was. On a volume
without flock (ENOLCK/EOPNOTSUPP: some NFS and FUSE mounts) the lock is the file's existence instead,
created atomically with link(2) (`O_EXCL` semantics that also hold on NFS); such a file left by a process
that is no longer running on this host, or by an earlier process of the same run (a restarted sidecar,
whose pid may be the dead one's in a new container), is taken over.

A second run refuses at start, whatever its run id, while the holder lives (ConfigError: exit 2).

The lock file is mode 0600. Anyone who can open a file can flock it, so a neighbour who opened a 0644 lock file
could hold a shared lock past the run's death and keep its restarted process out; now only the owner opens it. A
run of another user therefore cannot read who holds the folder: it is told the holder's uid instead of its run
id and pid.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import orjson

from bridge.errors import ConfigError

logger = logging.getLogger(__name__)

LOCK_FILE = ".dcgm-bridge.lock"
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS)
_MAX_LOCK_BYTES = 4096


@dataclass(frozen=True)
class Holder:
    """Who the lock file says holds the folder (fields None when it does not say)."""

    pid: int | None = None
    run_id: str | None = None
    host: str | None = None

    def describe(self) -> str:
        where = f" on {self.host}" if self.host and self.host != socket.gethostname() else ""
        return f"run {self.run_id or '(unknown)'} (pid {self.pid if self.pid is not None else 'unknown'}{where})"


class FolderLock:
    """The lock of one folder, held from `acquire` until `release` (or the process ends)."""

    def __init__(self, folder: Path, run_id: str, *, use_flock: bool = True) -> None:
        self.folder = folder
        self.path = folder / LOCK_FILE
        self.run_id = run_id
        self.use_flock = use_flock  # False: the link(2) lock file (tests of volumes without flock)
        self._fd: int | None = None
        self._linked = False

    @property
    def held(self) -> bool:
        return self._fd is not None or self._linked

    def acquire(self) -> None:
        """Hold the folder, or a ConfigError naming the live holder. Taking over a dead holder's lock is one
        warning line."""
        if self.held:
            return
        if self.use_flock:
            try:
                self._acquire_flock()
                return
            except _FlockUnsupported:
                logger.info("%s: the volume does not support flock; using a lock file instead", self.folder)
        self._acquire_linked()

    def release(self) -> None:
        """Remove the lock file and let go (unlinked while still held, so no one locks a file on its way out)."""
        if self._fd is not None:
            _unlink_if_same(self.path, os.fstat(self._fd))
            os.close(self._fd)
            self._fd = None
        elif self._linked:
            if _read_holder(self.path) == self._me():
                self.path.unlink(missing_ok=True)
            self._linked = False

    def _me(self) -> Holder:
        return Holder(os.getpid(), self.run_id, socket.gethostname())

    def _content(self) -> bytes:
        me = self._me()
        return orjson.dumps({"pid": me.pid, "run_id": me.run_id, "host": me.host}) + b"\n"

    # -- flock ---------------------------------------------------------------------------------------
    def _acquire_flock(self) -> None:
        for _ in range(10):  # a holder that releases unlinks the file: lock the one now at the path
            fd = _open_nofollow(self.path, os.O_RDWR | os.O_CREAT, self.folder)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _holder_of_fd(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    raise _in_use(self.folder, holder) from None
                if exc.errno in _NO_FLOCK:
                    raise _FlockUnsupported from None
                raise ConfigError(f"--artifact-dir {self.folder}: cannot lock {self.path} "
                                  f"({exc.strerror or exc})") from None
            try:
                same = os.fstat(fd).st_ino == os.lstat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self._note_takeover(_holder_of_fd(fd))
            with contextlib.suppress(OSError):  # a lock file of an older version (0644): others could flock it
                os.fchmod(fd, 0o600)
            os.ftruncate(fd, 0)
            os.pwrite(fd, self._content(), 0)
            self._fd = fd
            return
        raise ConfigError(f"--artifact-dir {self.folder}: its lock file {self.path} keeps changing; "
                          "is another run starting there?")

    # -- link(2) lock file -----------------------------------------------------------------------------
    def _acquire_linked(self) -> None:
        temp = self.folder / f"{LOCK_FILE}.{os.getpid()}.tmp"
        fd = _open_nofollow(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.folder)
        try:
            os.write(fd, self._content())
        finally:
            os.close(fd)
        try:
            try:
                os.link(temp, self.path)
            except FileExistsError:
                owner = _unreadable_owner(self.path)
                if owner is not None:  # another user's live lock cannot be judged stale from here
                    raise _locked_by(self.folder, owner) from None
                holder = _read_holder(self.path)
                if holder is not None and not self._stale(holder):
                    raise _in_use(self.folder, holder) from None
                self._note_takeover(holder)
                os.replace(temp, self.path)  # over the stale one, in one step
                if _read_holder(self.path) != self._me():  # another run took it over at the same moment
                    raise _in_use(self.folder, _read_holder(self.path) or Holder()) from None
            except OSError as exc:
                raise ConfigError(f"--artifact-dir {self.folder}: cannot create the lock file {self.path} "
                                  f"({exc.strerror or exc})") from None
            self._linked = True
        finally:
            temp.unlink(missing_ok=True)

    def _stale(self, holder: Holder) -> bool:
        """A lock file's holder that cannot be running any more (or is this run's earlier process)."""
        if holder.run_id == self.run_id:
            return True
        if holder.host != socket.gethostname() or holder.pid is None:
            return False  # another host's process: cannot be checked from here
        return not _alive(holder.pid)

    def _note_takeover(self, holder: Holder | None) -> None:
        if holder is None or holder.pid is None:
            return
        if holder.run_id == self.run_id:
            logger.warning("%s: run %s restarted; it takes back the folder's lock from its earlier process (pid %s)",
                           self.folder, self.run_id, holder.pid)
        else:
            logger.warning("%s: %s ended without releasing the folder's lock; run %s takes it over",
                           self.folder, holder.describe(), self.run_id)


class _FlockUnsupported(Exception):
    pass


def _in_use(folder: Path, holder: Holder) -> ConfigError:
    return ConfigError(f"--artifact-dir {folder} is in use by {holder.describe()}: wait for that run to finish, "
                       "or give this run another folder")


def _locked_by(folder: Path, uid: int) -> ConfigError:
    return ConfigError(f"--artifact-dir {folder} is locked by uid {uid} (another user's run; its run id and pid are "
                       "readable only by that user): wait for that run to finish, or give this run another folder")


def _unreadable_owner(path: Path) -> int | None:
    """The owner of a lock file this process may not open (another user's, mode 0600), else None."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC))
    except PermissionError:
        try:
            return os.lstat(path).st_uid
        except OSError:
            return None
    except OSError:
        return None
    return None


def _open_nofollow(path: Path, flags: int, folder: Path) -> int:
    """The lock file, mode 0600: no other user may open it, so none can hold a shared flock on it and keep the run's
    restarted process out (an open for reading is enough to flock)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link: remove it (dcgm-bridge never follows a link below "
                              "the artifact folder)") from None
        if exc.errno == errno.EACCES and (owner := _unreadable_owner(path)) is not None and owner != os.geteuid():
            raise _locked_by(folder, owner) from None
        raise ConfigError(f"cannot open {path} ({exc.strerror or exc}); give a folder this user can write") from None


def _holder_of_fd(fd: int) -> Holder:
    try:
        return _parse_holder(os.pread(fd, _MAX_LOCK_BYTES, 0)) or Holder()
    except OSError:
        return Holder()


def _read_holder(path: Path) -> Holder | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _parse_holder(os.read(fd, _MAX_LOCK_BYTES))
    finally:
        os.close(fd)


def _parse_holder(raw: bytes) -> Holder | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    pid, run_id, host = data.get("pid"), data.get("run_id"), data.get("host")
    return Holder(pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                  str(run_id) if isinstance(run_id, str) else None, host if isinstance(host, str) else None)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OverflowError:
        return False
    return True


def _unlink_if_same(path: Path, held: os.stat_result) -> None:
    try:
        if os.lstat(path).st_ino == held.st_ino:
            path.unlink()
    except OSError:
        pass
