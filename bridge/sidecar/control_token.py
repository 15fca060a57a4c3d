"""The control API's token: who may mark phases and end the run (README "Security on a shared machine")."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from bridge.errors import ConfigError

logger = logging.getLogger(__name__)

TOKEN_ENV = "DCGM_BRIDGE_CONTROL_TOKEN"  # how `profile` hands the benchmark its run's token


def new_token() -> str:
    return secrets.token_urlsafe(32)


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
            token = path.read_text(encoding="utf-8").strip()
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


def sidecar_token(config: Any) -> str | None:
    """The `sidecar` command's token: DCGM_BRIDGE_CONTROL_TOKEN_FILE's (made when absent), or None with one
    warning line (loopback stays the only rule)."""
    if config.control_token_file:
        return token_from_file(Path(config.control_token_file))
    logger.warning("control API: no DCGM_BRIDGE_CONTROL_TOKEN_FILE, so POST /phases and /complete need no token: "
                   "any process that reaches %s (every container of a pod) can mark phases and end the run; "
                   "set it to require one (README \"Security\")", ", ".join(config.control_allow))
    return None
