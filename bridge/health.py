"""Endpoint health: the one place that says whether an endpoint is up, how often its values change, and how
its scrapes keep to their ticks.

    scrape loop (bridge/scrape.py) ──missed ticks, lateness, duration──┐
    pipeline (sidecar/pipeline.py) ──answered (readable or not), failed─┴─▶ EndpointStats ──▶ Session, /status,
                                                                                             /metrics, OTLP

An endpoint is `pending` until its first scrape ends, then `up` (a page with samples), `unreadable` (answered,
but no sample could be read from the page), `down` (the scrape failed) or, once the run is over, `stopped`.
`answered` and `failed` say when the endpoint comes back up or goes down, so the caller writes that
transition once.
"""

from __future__ import annotations

import logging
import zlib
from array import array
from bisect import bisect_left, insort
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Literal

from bridge.errors import FetchError
from bridge.redact import redact_url

logger = logging.getLogger(__name__)

# The bridge's own gauges of each exporter's refresh (`dcgm_bridge_*`): the pull page and OTLP.
REFRESH_PERIOD = "dcgm_bridge_exporter_refresh_period_seconds"
REFRESH_PERIOD_HELP = "How often the DCGM endpoint's values change (dcgm-exporter's collect interval, -c), as scraped."
LAST_REFRESH = "dcgm_bridge_exporter_last_refresh_timestamp_seconds"
LAST_REFRESH_HELP = "When a scrape first saw the DCGM endpoint's current values (Unix seconds): stale when old."

EndpointState = Literal["pending", "up", "down", "unreadable", "duplicate", "stopped"]

_KEEP_BODY = 1 << 20
_LATENESS_KEPT = 1024  # recent tick lateness samples per endpoint (~6 min at 3 Hz), a ring allocated whole


class RefreshWatch:
    """Which scrapes brought a new DCGM refresh, and the period between refreshes, as the scrapes see it.

    dcgm-exporter serves DCGM's latest samples of fields DCGM watches every collect interval (`-c` ms,
    30 000 by default: NVIDIA/dcgm-exporter `pkg/cmd/app.go`, `collect-interval`, the collectors'
    `WatchDeviceFields(..., CollectInterval*1000)`), so between two samples the body is the same bytes: a body
    unlike the previous one is a new refresh, sampled after the previous scrape started and before this one
    did. The period is the median spacing of the recent brackets' midpoints (the report fits the whole run's:
    bridge/report/refresh.py).
    """

    __slots__ = ("_body", "_start_ns", "_mid", "_gaps", "_ordered", "refreshes", "last_new_ns", "period_s")

    def __init__(self) -> None:
        self._body: Hashable | None = None
        self._start_ns: int | None = None
        self._mid: float | None = None  # the latest bracket's midpoint
        self._gaps: deque[float] = deque(maxlen=32)  # between the recent midpoints
        self._ordered: list[float] = []  # the same gaps in order (kept so, not sorted at every scrape)
        self.refreshes = 0
        self.last_new_ns: int | None = None  # start of the scrape that first saw the latest refresh
        self.period_s: float | None = None  # median spacing of the recent refreshes; None before two brackets

    def slower_than(self, interval_s: float) -> bool:
        """The exporter's values change less often than every second scrape at `interval_s`: not fresh."""
        return self.period_s is not None and self.period_s > 2 * interval_s

    def observe(self, body: bytes | Hashable, start_ns: int) -> bool:
        """One successful scrape; True when it brought a new refresh. `body` is the page, or what its content is
        known by (the pipeline gives a templated page's template and values: `content_key`, so that no copy of
        the page is kept); a page over 1 MiB is remembered by its length and CRC, not kept."""
        seen = body if not isinstance(body, bytes) or len(body) <= _KEEP_BODY else (len(body), zlib.crc32(body))
        new = seen != self._body
        if new:
            self.refreshes += 1
            if self._start_ns is not None:
                mid = (self._start_ns + start_ns) / 2
                if self._mid is not None:
                    self._add_gap(mid - self._mid)
                self._mid = mid
            self.last_new_ns = start_ns
            self._body = seen
        self._start_ns = start_ns
        return new

    def _add_gap(self, gap: float) -> None:
        gaps, ordered = self._gaps, self._ordered
        if len(gaps) == gaps.maxlen:
            del ordered[bisect_left(ordered, gaps[0])]  # the oldest leaves both
        gaps.append(gap)
        insort(ordered, gap)
        # From the first spacing on (a 5 s refresh is told after ~10 s, not ~15: issue 33); the median of the
        # recent ones once there are more.
        self.period_s = ordered[len(ordered) // 2] / 1e9


@dataclass
class EndpointStats:
    """One endpoint's health. Written on the scrape thread; read from any thread (each field is replaced whole,
    the lateness ring a slot at a time)."""

    url: str  # redacted
    scrapes: int = 0  # scrapes that brought a page (readable or not)
    failures: Counter[str] = field(default_factory=Counter)  # FetchError.kind -> count
    missed_ticks: int = 0
    last_success_ns: int | None = None
    last_error: str | None = None
    last_error_ns: int | None = None
    state: EndpointState = "pending"
    last_duration_s: float | None = None
    # Recent tick lateness: a ring of float64s allocated whole at the start, so the sidecar's memory is flat from
    # its first minute (8 KiB an endpoint; a growing record rose ~0.1 MiB a minute at 64 endpoints, issue 48).
    lateness_s: array[float] = field(default_factory=lambda: array("d", bytes(8 * _LATENESS_KEPT)))
    late_ticks: int = 0  # lateness samples ever taken; the ring holds the last _LATENESS_KEPT
    refresh: RefreshWatch = field(default_factory=RefreshWatch)

    # -- fed by the scrape loop ------------------------------------------------------------------
    def missed(self, ticks: int) -> None:
        """Ticks that passed while the endpoint's previous scrape was in flight (or the thread was held up)."""
        self.missed_ticks += ticks

    def late(self, seconds: float) -> None:
        """How long after its tick a scheduled scrape started."""
        if seconds < 0:
            return
        self.lateness_s[self.late_ticks % _LATENESS_KEPT] = seconds
        self.late_ticks += 1

    def took(self, seconds: float) -> None:
        self.last_duration_s = seconds

    def stopped(self) -> None:
        """The run is over: an endpoint that was down (or a duplicate) stays shown as such."""
        if self.state not in ("down", "duplicate"):
            self.state = "stopped"

    def retired(self) -> None:
        """It serves the same GPUs as another endpoint and is scraped no more (bridge/select.py)."""
        self.state = "duplicate"

    # -- fed by the pipeline -----------------------------------------------------------------------
    def answered(self, body: bytes | Hashable, start_ns: int, *, readable: bool, reason: str | None = None) -> bool:
        """A scrape brought a page (`readable`: a GPU's sample in it; else `reason` says why not, bridge/recognize.py).
        True when the endpoint was down."""
        was_down = self.state == "down"
        self.scrapes += 1
        self.last_success_ns = start_ns
        self.refresh.observe(body, start_ns)
        if readable:
            self.state = "up"
        else:  # answered, but nothing in it is a sample: not up
            self.state = "unreadable"
            self.last_error, self.last_error_ns = reason or "no sample could be read from the page", start_ns
        if was_down:
            logger.warning("endpoint %s is up again", self.url)
        return was_down

    def failed(self, error: FetchError, start_ns: int) -> bool:
        """A scrape failed. True when this failure takes the endpoint down (it was not down before)."""
        self.failures[error.kind] += 1
        self.last_error, self.last_error_ns = error.message, start_ns
        went_down = self.state != "down"
        self.state = "down"
        if went_down:
            logger.warning("endpoint %s is down: %s", self.url, error.message)
        return went_down

    def as_json(self) -> dict[str, object]:
        late = sorted(self.lateness_s[:min(self.late_ticks, _LATENESS_KEPT)])
        return {
            "url": self.url, "state": self.state, "scrapes": self.scrapes, "failures": dict(self.failures),
            "missed_ticks": self.missed_ticks, "last_success_ns": self.last_success_ns,
            "last_error": self.last_error, "last_error_ns": self.last_error_ns,
            "last_scrape_duration_s": self.last_duration_s,
            "tick_lateness_p99_s": late[min(len(late) - 1, int(len(late) * 0.99))] if late else None,
            "refreshes": self.refresh.refreshes, "refresh_period_s": self.refresh.period_s,
            "last_refresh_ns": self.refresh.last_new_ns,
        }


class Health:
    """Every endpoint's `EndpointStats`, by URL as configured (one object per endpoint, made on first use)."""

    def __init__(self) -> None:
        self._endpoints: dict[str, EndpointStats] = {}

    def of(self, url: str) -> EndpointStats:
        stats = self._endpoints.get(url)
        if stats is None:
            stats = self._endpoints[url] = EndpointStats(redact_url(url))
        return stats

    def is_down(self, url: str) -> bool:
        stats = self._endpoints.get(url)
        return stats is not None and stats.state == "down"
