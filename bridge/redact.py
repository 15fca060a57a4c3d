"""Credential redaction, in one place: what of a URL or a header is a secret, and how text loses it.

- `redact_url`: a URL safe for logs and files (the record log, the events file, `/status`, the report):
  userinfo and every query value replaced by `REDACTED`, the parameter names kept. A query value can be a
  secret under any name (`?session=`, `?sig=`, a presigned URL's `X-Amz-Signature`), so none is shown.
- `has_credentials`: userinfo or a parameter named like a secret, what must never be stored in clear text.
- `url_secrets`, `scrub`: for text the bridge does not write itself (libcurl's error messages, a
  receiver's reply), every known secret is replaced by `<redacted>`, longest first so a secret that
  contains another is not half-replaced.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit, urlunsplit

# Query parameters named like secrets (exporter-toolkit and proxies use several spellings): `has_credentials`.
_SECRET_PARAMS = re.compile(r"(token|secret|password|passwd|pwd|key|auth|signature|sig|credential)", re.I)
REDACTED = "REDACTED"
_MIN_SECRET = 4  # shorter strings would replace ordinary text (ports, "http")

def redact_url(url: str) -> str:
    """The URL with userinfo, every query value and the fragment replaced, safe for logs and files."""
    parts = urlsplit(url)
    netloc = netloc_without_userinfo(parts)
    if parts.username is not None or parts.password is not None:
        netloc = f"{REDACTED}@{netloc}"
    query = "&".join(_redact_parameter(p) for p in parts.query.split("&")) if parts.query else ""
    return urlunsplit(parts._replace(netloc=netloc, query=query, fragment=REDACTED if parts.fragment else ""))


def _redact_parameter(parameter: str) -> str:
    """`name=value` → `name=REDACTED` (the name as written); a bare word may itself be the secret."""
    name, equals, value = parameter.partition("=")
    if not equals:
        return REDACTED if parameter else ""
    return f"{name}={REDACTED if value else ''}"


def has_credentials(url: str) -> bool:
    """Userinfo, or a query parameter named like a secret (`token`, `sig`, `api_key`, …)."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return True
    return any(_SECRET_PARAMS.search(name) for name, _ in parse_qsl(parts.query, keep_blank_values=True))


def netloc_without_userinfo(parts: SplitResult) -> str:
    return parts.netloc.rpartition("@")[2]


def url_secrets(url: str) -> list[str]:
    """What of a URL may be a secret: its userinfo, its query and each query value (quoted and not)."""
    parts = urlsplit(url if "://" in url else f"//{url}")
    found = [unquote(v) for v in (parts.username, parts.password) if v]
    if parts.query:
        found += [parts.query, unquote(parts.query)] + [unquote(v) for v in parts.query.replace(";", "&").split("&")]
    return found


def secret_list(found: Iterable[str]) -> tuple[str, ...]:
    """The secrets worth replacing, longest first, each once."""
    return tuple(sorted({s for s in found if len(s) >= _MIN_SECRET}, key=len, reverse=True))


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with every secret (a `secret_list`) replaced: a receiver may echo a header, an error may quote
    the URL."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "<redacted>")
    return text

