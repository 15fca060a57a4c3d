"""Work started ahead of the tests that read it, once the session's tests are collected (tests/conftest.py).

- CPU-bound grids: a test module's `AHEAD` maps a test's name to the grids it reads, each a (function, items) pair.
  Those of the selected tests run on one pool of two processes at the lowest priority (nice 19). They take only the
  CPU the rest of the suite leaves idle while it waits on real seconds (AIPerf, the stores, the sidecars' runs), and
  `on_two_processes` hands a test what was judged, waiting for what is left of it. Unread results are dropped with
  the pool at the session's end.
- Real seconds: a module's `WAITS_AHEAD` maps a test's name to jobs that spend their time waiting on a child
  process's wall-clock phases (a few CPU-seconds over half a minute), each a function of a fresh folder. Those of
  the selected tests start on threads of this process at normal priority, so their children keep their timing; the
  test takes the job's future from `waited`, which starts it there and then where it was not started ahead.
"""

from __future__ import annotations

import multiprocessing.pool
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from pytest import TempPathFactory

A, B = TypeVar("A"), TypeVar("B")

_AHEAD: dict[tuple[Callable[..., object], tuple[object, ...]], multiprocessing.pool.AsyncResult[list[object]]] = {}
_AHEAD_POOL: list[multiprocessing.pool.Pool] = []


def on_two_processes(f: Callable[[A], B], items: Sequence[A]) -> list[B]:
    """`[f(x) for x in items]`, on two processes (this machine's cores, and CI's): for runs judged one by one. Taken
    from `judge_ahead` where it started them."""
    ahead = _AHEAD.pop((f, tuple(items)), None)
    if ahead is not None:
        return ahead.get()
    # Not started ahead: a fork server's processes, not this one's forks. The suite's jobs ahead run on threads here,
    # and a process forked while one of them holds a lock can hang on it (the suite once hung so, every process idle).
    with multiprocessing.get_context("forkserver").Pool(2) as pool:
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


_WAITS: dict[Callable[[Path], object], Future[object]] = {}
_WAIT_POOL: list[ThreadPoolExecutor] = []


def wait_ahead(f: Callable[[Path], B], folder: Path) -> Future[B]:
    """`f(folder)` started on a thread now (once per function): the future `waited` hands its test."""
    if f not in _WAITS:
        if not _WAIT_POOL:
            _WAIT_POOL.append(ThreadPoolExecutor(max_workers=2, thread_name_prefix="waits-ahead"))
        _WAITS[f] = _WAIT_POOL[0].submit(f, folder)
    return _WAITS[f]  # type: ignore[return-value]


def waited(f: Callable[[Path], B], tmp_path_factory: TempPathFactory) -> Future[B]:
    """The future of `f`'s job: the one started ahead, else one started now in a fresh folder."""
    return _WAITS.get(f) or wait_ahead(f, tmp_path_factory.mktemp(f.__name__))  # type: ignore[return-value]


def stop_waiting_ahead() -> None:
    """At the session's end: jobs not started yet are dropped; a running one ends within its own timeout."""
    _WAITS.clear()
    while _WAIT_POOL:
        _WAIT_POOL.pop().shutdown(wait=False, cancel_futures=True)
