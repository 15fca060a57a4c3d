"""HTTP headers and credentials a user gives for a remote store: the one parser the OTLP exporter
(`OTEL_EXPORTER_OTLP_HEADERS`) and `report --prometheus` share, and the secret files they read.

Header text is `k=v,k2=v2`, percent-decoded, as the OpenTelemetry spec has it ("OTLP Exporter configuration");
a headers file holds the same, one or more items a line (`#` lines are comments). A value is never echoed in a
message: it may hold a token.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote

from bridge.errors import ConfigError

# RFC 9110 §5.1 field names (tokens) and §5.5 field values: a line break or a control character in a value
# (percent-decoded: `%0D%0A`) would end the header and start another on the client's request.
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]|[^\x00-\xff]")

Pairs = tuple[tuple[str, str], ...]


def header_pairs(text: str | Mapping[str, str] | None, problems: list[str], what: str = "OTLP") -> Pairs:
    """`k=v,k2=v2` (or a mapping) as lower-case (name, value) pairs; each bad item or header adds a problem."""
    if isinstance(text, Mapping):
        pairs = tuple((str(k).lower(), str(v)) for k, v in text.items())
    else:
        found = []
        for item in (text or "").split(","):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                problems.append(f"{what} headers: an item is not key=value (the value is not shown)")
                continue
            found.append((unquote(key.strip()).lower(), unquote(value.strip())))
        pairs = tuple(found)
    for name, value in pairs:
        if not _FIELD_NAME.fullmatch(name):
            problems.append(f"{what} header {name!r}: not a valid HTTP header name (letters, digits, !#$%&'*+-.^_`|~)")
        elif _BAD_VALUE.search(value):
            problems.append(f"{what} header {name!r}: its value holds a line break, a control character or a "
                            "character outside Latin-1 (the value is not shown)")
    return pairs


def read_secret(path: str | Path, what: str) -> str:
    """A secret file's text, stripped of its trailing line break; a file that cannot be read is a ConfigError
    naming the file and the flag or variable (`what`), never its content."""
    try:
        return Path(path).read_text(encoding="utf-8").strip("\r\n")
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path}: not UTF-8 text") from None


def headers_of_file(path: str | Path, what: str, problems: list[str]) -> Pairs:
    """A headers file: `k=v` items, comma- or line-separated, `#` lines skipped."""
    lines = [ln for ln in read_secret(path, what).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return header_pairs(",".join(lines), problems, what)


def bearer(token: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {token.strip()}")


def basic(user: str, password: str) -> tuple[str, str]:
    """RFC 7617: `Basic base64(user:password)`, UTF-8."""
    return ("authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii"))
