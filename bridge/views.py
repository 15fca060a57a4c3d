"""Buffers written in parts: the one place a partial vectored write (`os.writev`, `socket.sendmsg`) moves on.

Both the record log's flush (record_log.py) and the OTLP client's request (otlp/http1.py) hand the kernel a
list of views rather than one joined buffer; a call may take fewer bytes than it was given.
"""

from __future__ import annotations


def advance(views: list[memoryview], done: int) -> None:
    """Drop the first `done` bytes of `views`, in place: the views a partial write took go, and the first one it
    took part of starts where the write stopped."""
    while views and done >= len(views[0]):
        done -= len(views.pop(0))
    if views and done:
        views[0] = views[0][done:]
