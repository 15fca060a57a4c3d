"""An OTLP receiver that loses data is said during the run, not only in the events file (`sidecar`, `profile`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from bridge.otlp.export import ExportStats


class OtlpLossWatch:
    """During the run: one line when the OTLP receiver starts losing points, then at most one a minute while
    the count grows (the events file and /status have the details)."""

    def __init__(self, every_s: float = 60.0, monotonic: Callable[[], float] | None = None) -> None:
        self._monotonic = monotonic or time.monotonic
        self.every_s = every_s
        self._reported = 0
        self._last = -every_s
        self._held = False  # the count grew within a minute of the last line: said when the minute is over

    def check(self, stats: ExportStats) -> str | None:
        """The forwarder's counters as they are (the sidecar calls it when the forwarder signals a loss, `profile`
        once a second)."""
        lost = stats.dropped_points + stats.rejected_points
        now = self._monotonic()
        if lost <= self._reported:
            return None
        if now - self._last < self.every_s and self._reported:
            self._held = True
            return None
        self._reported, self._last, self._held = lost, now, False
        line = (f"warning: OTLP receiver is losing data: {lost} points dropped or rejected so far, "
                f"{stats.sent_points} sent (last error: {stats.last_error or '-'})")
        print(line, file=sys.stderr, flush=True)
        return line

    def due_in(self) -> float | None:
        """Seconds until a growth held back by the one-a-minute limit may be said (None: nothing held): a caller
        that looks only when the forwarder signals a loss looks again then, or a loss that stopped within the
        minute would go unsaid."""
        if not self._held:
            return None
        return max(0.0, self._last + self.every_s - self._monotonic())
