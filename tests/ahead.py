"""CPU-bound grids judged on two processes, and judged ahead of the tests that read them.

A test module's `AHEAD` maps a test's name to the grids it reads, each a (function, items) pair; tests/conftest.py
starts those of the selected tests once the session's tests are collected, on one pool of two processes at the lowest
priority (nice 19). They take only the CPU the rest of the suite leaves idle while it waits on real seconds (AIPerf,
the stores, the sidecars' runs), and `on_two_processes` hands a test what was judged, waiting for what is left of it.
Unread results are dropped with the pool at the session's end.
"""

from __future__ import annotations

import multiprocessing.pool
from collections.abc import Callable, Sequence
from typing import TypeVar

A, B = TypeVar("A"), TypeVar("B")

_AHEAD: dict[tuple[Callable[..., object], tuple[object, ...]], multiprocessing.pool.AsyncResult[list[object]]] = {}
_AHEAD_POOL: list[multiprocessing.pool.Pool] = []


def on_two_processes(f: Callable[[A], B], items: Sequence[A]) -> list[B]:
    """`[f(x) for x in items]`, on two processes (this machine's cores, and CI's): for runs judged one by one. Taken
    from `judge_ahead` where it started them."""
    ahead = _AHEAD.pop((f, tuple(items)), None)
    if ahead is not None:
        return ahead.get()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        return pool.map(f, items, chunksize=8)


def judge_ahead(f: Callable[[A], B], items: Sequence[A]) -> None:
    import os

    key = (f, tuple(items))
    if key in _AHEAD:
        return
    if not _AHEAD_POOL:
        _AHEAD_POOL.append(multiprocessing.get_context("fork").Pool(2, initializer=os.nice, initargs=(19,)))
    _AHEAD[key] = _AHEAD_POOL[0].map_async(f, items, chunksize=8)


def stop_judging_ahead() -> None:
    """At the session's end: whatever no test read (an interrupted or narrowed run) is dropped with its processes."""
    _AHEAD.clear()
    while _AHEAD_POOL:
        pool = _AHEAD_POOL.pop()
        pool.terminate()
        pool.join()
