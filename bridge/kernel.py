"""The compiled per-page kernel's one face: the only module of bridge/ that imports the C extension.

`bridge._kernel` (bridge/_kernel.c) is optional: `pip install` builds it with the machine's C compiler, and
where there is none the pure-Python code beside each call runs instead (the reference: tests/test_kernel.py
feeds both the same pages and compares the results). A caller asks `running()` once per page or batch, never
per point, and calls the kernel's function only when it says so:

    if kernel.running():
        raw = kernel.values_of_bytes(text, lengths, body)
    else:
        values = template.values_of_bytes_python(body)

`COMPILED` says whether the extension was built (`dcgm-bridge --version`, /status, the sidecar's warning).
`python_path()` runs the pure-Python path while it is open, built or not: the one switch tests use to
compare the two paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

try:
    from bridge._kernel import blank_at, line_shape, points_of, records_of, scan_lines, sums_of, values_of_bytes
except ImportError:  # built without a compiler: the same results, slower
    COMPILED = False
else:
    COMPILED = True

__all__ = ["COMPILED", "blank_at", "line_shape", "points_of", "python_path", "records_of", "running", "scan_lines",
           "sums_of", "values_of_bytes"]

_python_only = False  # set while `python_path()` is open


def running() -> bool:
    """True when the kernel's functions are to be called: built, and no `python_path()` open."""
    return COMPILED and not _python_only


@contextmanager
def python_path() -> Iterator[None]:
    """Every caller takes the pure-Python path while this is open (process-wide: tests compare the paths)."""
    global _python_only
    before = _python_only
    _python_only = True
    try:
        yield
    finally:
        _python_only = before
