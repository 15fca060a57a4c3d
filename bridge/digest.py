"""Digests, secret comparison and random tokens without Python's OpenSSL (issue 48).

`hashlib`, `hmac` and `secrets` load `_hashlib`, which maps a second OpenSSL beside the one libcurl's wheel
bundles: ~3.6 MiB of the sidecar's RSS for nothing its loop needs. The same functions from what CPython builds
in: BLAKE2 (`_blake2`, what `hashlib.blake2b` is), the constant-time compare `hmac` falls back to
(`_operator._compare_digest`), and `secrets`' own tokens (`os.urandom`). tests/sidecar/test_lean_start.py keeps the
sidecar's start free of OpenSSL.
"""

from __future__ import annotations

import base64
import os

try:  # CPython's own BLAKE2: hashlib.blake2b is this class
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - an interpreter without it
    from hashlib import blake2b

try:  # the constant-time compare hmac.compare_digest falls back to without OpenSSL
    from _operator import _compare_digest as same_secret
except ImportError:  # pragma: no cover
    from hmac import compare_digest as same_secret  # type: ignore[no-redef]

__all__ = ["blake2b", "same_secret", "token_urlsafe"]


def token_urlsafe(nbytes: int) -> str:
    """`secrets.token_urlsafe`: `nbytes` random bytes from the OS, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(os.urandom(nbytes)).rstrip(b"=").decode("ascii")
