"""The control API's token: who may mark phases and end the run (README "Security on a shared machine")."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from bridge.digest import token_urlsafe
from bridge.errors import ConfigError

logger = logging.getLogger(__name__)

TOKEN_ENV = "DCGM_BRIDGE_CONTROL_TOKEN"  # how `profile` hands the benchmark its run's token


def new_token() -> str:
    return token_urlsafe(32)


def token_from_file(path: Path) -> str:
    """The control token in `path`; when it has none yet, a new one written there (mode 0600, never through a
    link): the sidecar makes it at start, and the benchmark container, which mounts the same memory emptyDir,
    reads it. A ConfigError names a file that cannot be read or made."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise ConfigError(f"DCGM_BRIDGE_CONTROL_TOKEN_FILE {path}: {exc.strerror or exc}") from None
    try:
        if mode is not None:
            if not stat.S_ISREG(mode):
                raise ConfigError(f"DCGM_BRIDGE_CONTROL_TOKEN_FILE {path} is not a regular file (a link?): remove it")
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                _check_owner(path, os.fstat(f.fileno()))  # of the file read, not of what the path named before
                token = f.read(4096).decode("utf-8").strip()
            if token:
                return token
            path.unlink()
        token = new_token()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token + "\n")
        return token
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ConfigError(f"DCGM_BRIDGE_CONTROL_TOKEN_FILE {path}: cannot read or write it ({reason}); "
                          "mount a writable folder there (kube profile: a memory emptyDir)") from None


def _check_owner(path: Path, info: os.stat_result) -> None:
    """A token file someone else made (a neighbour first to a shared folder, with a token of their choosing) or
    that others may read or change is no secret: refused with the fix, as ssh refuses a private key others can
    read. The file this module makes is already the running user's, mode 0600."""
    me = os.geteuid()
    if info.st_uid != me:
        raise ConfigError(f"DCGM_BRIDGE_CONTROL_TOKEN_FILE {path} belongs to uid {info.st_uid}, not to this user "
                          f"(uid {me}): someone else may have made it; remove it (a new one is made, mode 0600) or "
                          f"chown {me} it")
    if info.st_mode & 0o077:
        raise ConfigError(f"DCGM_BRIDGE_CONTROL_TOKEN_FILE {path} is readable or writable by others (mode "
                          f"{info.st_mode & 0o777:04o}): chmod 600 {path}, or remove it (a new one is made, mode 0600)")


def sidecar_token(config: Any) -> str | None:
    """The `sidecar` command's token: DCGM_BRIDGE_CONTROL_TOKEN_FILE's (made when absent), or None with one
    warning line (loopback stays the only rule)."""
    if config.control_token_file:
        return token_from_file(Path(config.control_token_file))
    if config.control_protect_reads:  # reads protected by nothing would be a promise not kept
        raise ConfigError("DCGM_BRIDGE_CONTROL_PROTECT_READS=true needs a token to protect the reads with: set "
                          "DCGM_BRIDGE_CONTROL_TOKEN_FILE too (README \"Security\"), or leave reads open")
    logger.warning("control API: no DCGM_BRIDGE_CONTROL_TOKEN_FILE, so POST /phases and /complete need no token: "
                   "any process that reaches %s (every container of a pod) can mark phases and end the run; "
                   "set it to require one (README \"Security\")", ", ".join(config.control_allow))
    return None
