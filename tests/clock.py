"""A clock the test moves: monotonic seconds and the wall clock in ns, for code that takes both injected."""

from __future__ import annotations


class FakeClock:
    def __init__(self, epoch_ns: int = 1_700_000_000_000_000_000) -> None:
        self.epoch_ns = epoch_ns  # the wall clock at now == 0
        self.now = 0.0  # seconds, moved by the test

    def monotonic(self) -> float:
        return self.now

    def now_ns(self) -> int:
        return self.epoch_ns + round(self.now * 1e9)
