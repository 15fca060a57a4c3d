"""The OTLP forwarder: a bounded queue of pages, a batching thread, retries; never in the scrape's way.

    scrape loop ──submit(page)──▶ [queue, bounded in bytes] ───▶ export thread: encode pages of a batch
                                   oldest pages dropped when full      → one request → send, retry
                                                                          (backoff + jitter, Retry-After)

- `submit` only appends to a deque under a lock: no encoding, no I/O, no exception reaches the caller.
- The export thread wakes every `export_interval_s` (or when a batch's worth of points waits), encodes
  up to `max_batch_points` / `max_batch_bytes` of pages (encode.py; per-endpoint series state lives
  on this thread only), and sends them as one ExportMetricsServiceRequest.
- Retryable failures (HTTP 429/502/503/504, connection errors, timeouts; gRPC UNAVAILABLE,
  RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ABORTED, …) are retried with exponential backoff and
  jitter, or after the receiver's Retry-After / RetryInfo. A batch is retried until it succeeds or
  until the queue bound pushes it out: the bound, not a timer, decides what is lost, so a receiver
  outage loses nothing while the data fits in the queue. The bound is a byte budget (`max_queue_bytes`: what
  the waiting pages hold of their own, `held_bytes`), so the queue's memory is the same at 8 or 64 endpoints and
  whatever form the pages are in; `max_queue_points`, when set, bounds the points as well.
- A non-retryable rejection (400, gRPC INVALID_ARGUMENT) drops the batch and logs the receiver's
  message, at most once per `log_interval_s` (with the count of the ones not logged).
- An encoded page may hold a buffer of its endpoint's pool (EncodedPage.lease, points.py): the batch gives
  every page's buffer back when `export_once` is done with it (sent, rejected, given up after its retries,
  or dropped at the queue bound or at close), and `close()` gives back those of pages carried to a next batch.
Counters (`stats()`) feed /status, the `dcgm_bridge_otlp_*` metrics and the report summary.

Transports (HTTP on its own connection, http1.py; gRPC via grpcio) are in transport.py behind the `Sender` seam.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from bridge.otlp.config import OtlpConfig
from bridge.otlp.encode import ContextCache, EndpointEncoder
from bridge.otlp.points import BufferPool, Chunk, EncodedPage
from bridge.otlp.resource import endpoint_attributes
from bridge.otlp.semconv import page_to_semconv
from bridge.otlp.transport import Sender, SendResult, make_sender, secrets_of
from bridge.parse import AnyPage, TemplatedPage
from bridge.parse.template import SAMPLE_BYTES
from bridge.redact import redact_url, scrub
from bridge.relabel import NO_RELABEL, RelabelConfig
from bridge.samples import ParsedPage

logger = logging.getLogger(__name__)

_MAX_RETRY_AFTER_S = 60.0  # a longer Retry-After is capped: the queue bound decides what is lost
_ITEM_BYTES = 256  # a queued page's item and page objects, beside what `held_bytes` counts


def held_bytes(page: AnyPage, points: int) -> int:
    """What a queued page holds of its own, in bytes (what the queue's byte budget counts)."""
    own = page.held_bytes if isinstance(page, TemplatedPage) else points * SAMPLE_BYTES
    return _ITEM_BYTES + own

@dataclass(frozen=True)
class ExportStats:
    queue_depth_points: int = 0  # waiting + in flight
    queue_depth_pages: int = 0
    queue_depth_bytes: int = 0  # what the waiting and in-flight pages hold (the bound: max_queue_bytes)
    sent_points: int = 0
    sent_requests: int = 0
    retried_requests: int = 0  # attempts that failed retryably and were tried again
    dropped_points: int = 0  # pushed out of the full queue (oldest first), or abandoned at close
    dropped_pages: int = 0
    rejected_points: int = 0  # refused by the receiver (non-retryable, or partial success)
    failed_requests: int = 0  # requests given up (rejected or dropped)
    stale_markers: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Item(NamedTuple):
    endpoint: str
    page: AnyPage
    run_id: str
    phase: str
    ts_ns: int
    points: int
    size: int  # held_bytes


def failure_text(status: str, message: str) -> str:
    """A failed export for people: the message when it names the failure itself (`cannot connect to …`), else
    the status first (`503: Service Unavailable`)."""
    if not status or status in ("connect", "timeout"):
        return message[:300]
    return f"{status}: {message}"[:300]


class OtlpForwarder:
    """Forward pages as OTLP. Create once per sidecar (after config validation), `close()` at the end.

    `base_resource`: resource.base_attributes(...); each endpoint adds its `service.instance.id`.
    `start=False` runs no thread: tests call `export_once()` themselves.
    """

    def __init__(
        self,
        config: OtlpConfig,
        *,
        base_resource: Mapping[str, str],
        static_attributes: Mapping[str, str] | None = None,
        relabel_config: RelabelConfig = NO_RELABEL,
        sender: Sender | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        jitter: Callable[[], float] = random.random,
        log_interval_s: float = 30.0,
        start: bool = True,
    ) -> None:
        self.config = config
        self._base_resource = dict(base_resource)
        self._relabel = relabel_config
        self._contexts = ContextCache(static_attributes)
        self._sender = sender if sender is not None else make_sender(config)
        self._secrets = secrets_of(config)
        self._clock = clock
        self._abort = threading.Event()  # close() ran out of time: stop retrying
        self._hurry = threading.Event()  # set at abort, or at close with an unreachable receiver: no more backoff
        self._sleep = sleep if sleep is not None else self._hurry.wait
        self._jitter = jitter
        self._encoders: dict[str, EndpointEncoder] = {}
        # The encoders' chunk buffers, one pool: a page's buffer is needed while its batch is sent, so what is kept
        # idle is bounded by a batch's bytes, whatever the number of endpoints (points.py, BufferPool).
        self._buffers = BufferPool(keep=1 << 16, keep_bytes=config.max_batch_bytes)
        self._queue: deque[_Item] = deque()
        self._carry: list[EncodedPage] = []  # encoded, not yet sent: the first of the next batch
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queued_points = 0
        self._inflight_points = 0
        self._queued_bytes = 0  # (carried pages are counted there too, as the points are)
        self._inflight_bytes = 0
        self._carry_bytes = 0
        self._inflight_pages = 0
        self._drop_inflight = False
        self._counted_at_close = False  # close gave up on the batch in flight and counted it as dropped
        self._closing = False
        self._give_up_at = float("inf")  # time.monotonic() after which close() stops retrying
        self._flush_requested = False
        self._counts: dict[str, int] = dict.fromkeys(
            ["sent_points", "sent_requests", "retried_requests", "dropped_points", "dropped_pages",
             "rejected_points", "failed_requests", "stale_markers"], 0)
        self._last_error: str | None = None
        self._unreachable = False  # the last attempt could not reach the receiver, and none has since
        self._log_interval = log_interval_s
        self._last_log = -float("inf")
        self._suppressed = 0
        self._last_export = clock()
        # Set whenever points are dropped or rejected: a watcher (the sidecar's main thread) then looks at the
        # counters, instead of waking every second to find nothing new.
        self.loss_signal: threading.Event | None = None
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
            self._thread.start()

    # -- the scrape loop's side -------------------------------------------------------------------
    def submit(self, endpoint: str, page: AnyPage, *, run_id: str, phase: str, ts_ns: int) -> None:
        """Queue one scraped page of `endpoint` (its display key, host:port). Never blocks, never raises."""
        try:
            # A templated page's samples are built only on demand (parse/template.py): count its values instead.
            points = page.value_count if isinstance(page, TemplatedPage) else len(page.samples)
            item = _Item(endpoint, page, run_id, phase or "none", ts_ns, points, held_bytes(page, points))
            with self._lock:
                if self._closing:
                    return
                self._queue.append(item)
                self._queued_points += item.points
                self._queued_bytes += item.size
                self._enforce_bound()
                if self._queued_points >= self.config.max_batch_points:
                    self._wake.notify()
        except Exception:  # noqa: BLE001 - the scrape loop must survive a forwarder bug
            logger.exception("OTLP: could not queue a page of %s", endpoint)

    def mark_stale(self, endpoint: str, *, run_id: str, phase: str, ts_ns: int) -> None:
        """The endpoint's series are gone (scrape failed, exporter down): one staleness marker each."""
        self.submit(endpoint, ParsedPage([], {}, {}, []), run_id=run_id, phase=phase, ts_ns=ts_ns)

    def stats(self) -> ExportStats:
        with self._lock:
            return ExportStats(
                queue_depth_points=self._queued_points + self._inflight_points,
                queue_depth_pages=len(self._queue) + self._inflight_pages,
                queue_depth_bytes=self._queued_bytes + self._inflight_bytes,
                last_error=self._last_error,
                **self._counts,
            )

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything queued so far has been sent or given up (tests, phase ends)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._queue and not self._inflight_pages and not self._carry:
                    return True
                self._flush_requested = True  # the thread sends now instead of at its next interval
                self._wake.notify()
            if self._thread is None:
                self.export_once()
            else:
                time.sleep(0.01)  # polling the thread's progress with a deadline
        return False

    def close(self, timeout_s: float = 5.0) -> ExportStats:
        """Send what is queued (within `timeout_s`), then stop. Safe to call twice."""
        with self._lock:
            self._closing = True
            # A receiver that could not be reached at its last attempt (none has succeeded since) is not waited for
            # through backoffs at the end: one attempt now, and a batch that fails it is given up, counted.
            unreachable = self._unreachable
            self._give_up_at = time.monotonic() + (0.0 if unreachable else timeout_s)
            self._wake.notify()
        if unreachable:
            self._hurry.set()  # ends a backoff sleep
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._abort.set()
                self._hurry.set()
                self._thread.join(2.0)
        else:
            deadline = time.monotonic() + timeout_s
            while self._queue_nonempty() and time.monotonic() < deadline:
                self.export_once()
        with self._lock:
            carried, self._carry = self._carry, []
            left = self._queued_points  # (carried pages are counted there too)
            if self._thread is not None and self._thread.is_alive() and self._inflight_points:
                # Still being sent when we stop waiting: lost as far as this run knows (a late answer is ignored).
                self._counts["dropped_points"] += self._inflight_points
                self._counts["dropped_pages"] += self._inflight_pages
                self._inflight_points = self._inflight_pages = self._inflight_bytes = 0
                self._counted_at_close = True
            if left:
                self._counts["dropped_points"] += left
                self._counts["dropped_pages"] += len(self._queue) + len(carried)
                self._queue.clear()
                self._queued_points = self._queued_bytes = self._carry_bytes = 0
        for encoded in carried:
            encoded.release()
        try:
            self._sender.close()
        except Exception:  # noqa: BLE001
            logger.debug("OTLP: closing the sender failed", exc_info=True)
        return self.stats()

    # -- the export thread's side -------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closing and not self._due():
                    wait = self.config.export_interval_s - (self._clock() - self._last_export)
                    self._wake.wait(max(0.001, wait))
                if self._closing and not self._queue and not self._carry:
                    return
            if self._abort.is_set():
                return
            try:
                self.export_once()
            except Exception:  # noqa: BLE001 - keep exporting after a bug in one batch
                logger.exception("OTLP: a batch failed unexpectedly")

    def _due(self) -> bool:
        if not self._queue and not self._carry:
            self._last_export = self._clock()
            return False
        return (
            self._flush_requested
            or self._queued_points >= self.config.max_batch_points
            or self._clock() - self._last_export >= self.config.export_interval_s
        )

    def _queue_nonempty(self) -> bool:
        with self._lock:
            return bool(self._queue or self._carry)

    def buffers_lent(self) -> int:
        """Chunk buffers lent to encoded pages not given back yet (the batch in flight, carried pages)."""
        return self._buffers.lent

    def export_once(self) -> bool:
        """Encode and send one batch (with its retries). False when there was nothing to send."""
        batch = self._next_batch()
        with self._lock:
            self._last_export = self._clock()
            if not self._queue:
                self._flush_requested = False
        if not batch:
            return False
        try:
            self._send_batch([encoded.chunk for encoded in batch], sum(encoded.points for encoded in batch),
                             len(batch))
        finally:  # sent, rejected, given up or dropped: no one reads these chunks again
            for encoded in batch:
                encoded.release()
        return True

    def _send_batch(self, chunks: list[Chunk], points: int, pages: int) -> None:
        """Send one batch until it is sent, rejected or given up (its counts then taken)."""
        attempt = 0
        while True:
            result = self._send(chunks)
            if result.ok:
                self._finish(sent=points, rejected=result.rejected_points, message=result.message)
                return
            with self._lock:
                abandon = self._drop_inflight or self._abort.is_set() or time.monotonic() > self._give_up_at
                self._last_error = failure_text(result.status, result.message)
                self._unreachable = result.status in ("connect", "timeout")
            if not result.retryable:
                self._finish(rejected=points, message=result.message, status=result.status)
                return
            if abandon:
                self._finish(dropped=points, dropped_pages=pages)
                return
            delay = self._backoff(attempt, result.retry_after_s)
            attempt += 1
            with self._lock:
                self._counts["retried_requests"] += 1
            logger.debug("OTLP: %s (%s); retry %d in %.2fs", result.status, result.message[:200], attempt,
                         delay)
            self._sleep(delay)

    def _send(self, parts: list[Chunk]) -> SendResult:
        try:
            return self._sender.send(parts)
        except Exception as exc:  # noqa: BLE001 - a transport bug is a failed, retryable attempt
            return SendResult(False, True, "error", scrub(f"{type(exc).__name__}: {exc}", self._secrets))

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None and retry_after >= 0:
            return min(retry_after, max(_MAX_RETRY_AFTER_S, self.config.retry_max_backoff_s))
        step = self.config.retry_initial_backoff_s * 2 ** min(attempt, 30)
        base = min(self.config.retry_max_backoff_s, step)
        return float(base * (0.5 + 0.5 * self._jitter()))  # "equal jitter": never less than half the step

    def _next_batch(self) -> list[EncodedPage]:
        """Take pages off the queue and encode them until the batch is full; the page that overfills it is
        carried to the next one."""
        carry, self._carry = self._carry, []
        batch = list(carry)
        points = sum(encoded.points for encoded in batch)
        size = sum(len(encoded.chunk) for encoded in batch)
        while points < self.config.max_batch_points and size < self.config.max_batch_bytes:
            with self._lock:
                if not self._queue:
                    break
                item = self._queue.popleft()
                self._queued_points -= item.points
                self._inflight_points += item.points
                self._queued_bytes -= item.size
                self._inflight_bytes += item.size
                self._inflight_pages += 1
            page = page_to_semconv(item.page) if self.config.names == "semconv" else item.page
            encoded = self._encoder(item.endpoint).encode(page, self._contexts.get(item.run_id, item.phase), item.ts_ns)
            over = bool(batch and encoded.chunk) and size + len(encoded.chunk) > self.config.max_batch_bytes
            with self._lock:  # one look at the counters a page
                self._counts["stale_markers"] += encoded.stale
                if not encoded.chunk or over:
                    self._inflight_points -= item.points
                    self._inflight_bytes -= item.size
                    self._inflight_pages -= 1
                    if over:  # carried to the next batch
                        self._queued_points += encoded.points
                        self._queued_bytes += item.size
                        self._carry_bytes += item.size
                else:  # in-flight points are counted as encoded (sentinels out, markers in)
                    self._inflight_points += encoded.points - item.points
            if not encoded.chunk:
                encoded.release()
                continue
            if over:
                self._carry.append(encoded)
                break
            batch.append(encoded)
            points, size = points + encoded.points, size + len(encoded.chunk)
        with self._lock:
            if carry:
                carried = sum(encoded.points for encoded in carry)
                self._queued_points -= carried
                self._inflight_points += carried
                self._queued_bytes -= self._carry_bytes
                self._inflight_bytes += self._carry_bytes
                self._carry_bytes = 0
                self._inflight_pages += len(carry)
            self._drop_inflight = False
        return batch

    def _encoder(self, endpoint: str) -> EndpointEncoder:
        encoder = self._encoders.get(endpoint)
        if encoder is None:
            encoder = self._encoders[endpoint] = EndpointEncoder(
                endpoint_attributes(self._base_resource, endpoint),
                relabel_config=self._relabel,
                units=self.config.units,
                start_time=self.config.start_time,
                buffers=self._buffers,
            )
        return encoder

    def _over_bound(self, points: int, size: int) -> bool:
        bound = self.config.max_queue_points
        return size > self.config.max_queue_bytes or (bound is not None and points > bound)

    def _enforce_bound(self) -> None:
        """Drop the oldest pages while the waiting ones hold more than `max_queue_bytes` (or, when set, more than
        `max_queue_points`) (lock held). The batch in flight is the oldest: it goes first (given up at its next
        failed attempt, counted then), then the queue's head."""
        if self._over_bound(self._queued_points + self._inflight_points, self._queued_bytes + self._inflight_bytes) \
                and self._inflight_pages:
            self._drop_inflight = True
        inflight, inflight_bytes = (0, 0) if self._drop_inflight else (self._inflight_points, self._inflight_bytes)
        while self._over_bound(self._queued_points + inflight, self._queued_bytes + inflight_bytes) and self._queue:
            oldest = self._queue.popleft()
            self._queued_points -= oldest.points
            self._queued_bytes -= oldest.size
            self._counts["dropped_points"] += oldest.points
            self._counts["dropped_pages"] += 1
            self._signal_loss()

    def _signal_loss(self) -> None:
        if self.loss_signal is not None:
            self.loss_signal.set()

    def _finish(
        self, *, sent: int = 0, rejected: int = 0, dropped: int = 0, dropped_pages: int = 0,
        message: str = "", status: str = "",
    ) -> None:
        with self._lock:
            if self._counted_at_close:  # the batch's points were counted as dropped when close gave up on it
                return
            self._inflight_points = self._inflight_bytes = 0
            self._inflight_pages = 0
            self._drop_inflight = False
            counts = self._counts
            if sent:
                counts["sent_requests"] += 1
                counts["sent_points"] += sent - rejected
            counts["rejected_points"] += rejected
            counts["dropped_points"] += dropped
            counts["dropped_pages"] += dropped_pages
            if rejected and not sent or dropped:
                counts["failed_requests"] += 1
            if rejected or dropped:
                self._signal_loss()
            if sent:
                self._unreachable = False
            if sent and not rejected:
                self._last_error = None
        if rejected:
            self._log_rejection(rejected, status, message)

    def _log_rejection(self, points: int, status: str, message: str) -> None:
        now = self._clock()
        if now - self._last_log < self._log_interval:
            self._suppressed += 1
            return
        more = f" ({self._suppressed} more rejections not logged)" if self._suppressed else ""
        self._last_log, self._suppressed = now, 0
        logger.warning(
            "OTLP receiver %s rejected %d points (%s): %s%s",
            redact_url(self.config.endpoint) if "://" in self.config.endpoint else self.config.endpoint,
            points, status or "partial success", message[:500] or "no message", more,
        )
