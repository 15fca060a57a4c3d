"""Endpoint health (bridge/health.py): the one owner of up / down / unreadable, fed by the scrape loop and the
pipeline."""

from __future__ import annotations

import sys

from bridge.errors import FetchError
from bridge.health import Health

NS = 1_000_000_000
URL = "http://alice:s3cret@a:9400/metrics"


def test_an_endpoint_goes_down_once_and_comes_back_up_with_its_next_page() -> None:
    stats = Health().of(URL)
    assert stats.state == "pending"
    assert stats.failed(FetchError("timeout", "a:9400 did not answer"), 1 * NS) is True  # the transition
    assert stats.failed(FetchError("connect", "refused"), 2 * NS) is False  # still down: no second transition
    assert stats.state == "down" and stats.failures == {"timeout": 1, "connect": 1}
    assert stats.last_error == "refused" and stats.last_error_ns == 2 * NS
    assert stats.answered(b"m 1\n", 3 * NS, readable=True) is True  # back up
    assert stats.answered(b"m 2\n", 4 * NS, readable=True) is False
    assert stats.state == "up" and stats.scrapes == 2 and stats.last_success_ns == 4 * NS


def test_a_page_without_a_sample_is_unreadable_not_up_and_a_failure_after_it_takes_the_endpoint_down() -> None:
    stats = Health().of(URL)
    stats.answered(b"<html>hello</html>", 1 * NS, readable=False)
    assert stats.state == "unreadable" and stats.last_error == "no sample could be read from the page"
    assert stats.failed(FetchError("http_status", "HTTP 503"), 2 * NS) is True


def test_the_end_of_the_run_stops_every_endpoint_but_one_that_is_down_stays_down() -> None:
    health = Health()
    up, down = health.of("http://a:9400/metrics"), health.of("http://b:9400/metrics")
    up.answered(b"m 1\n", 1 * NS, readable=True)
    down.failed(FetchError("connect", "refused"), 1 * NS)
    up.stopped()
    down.stopped()
    assert (up.state, down.state) == ("stopped", "down")
    assert health.is_down("http://b:9400/metrics") and not health.is_down("http://a:9400/metrics")
    assert not health.is_down("http://never-configured:9400/metrics")


def test_one_object_per_endpoint_named_without_its_credentials() -> None:
    health = Health()
    assert health.of(URL) is health.of(URL)
    assert "s3cret" not in health.of(URL).url and "alice" not in health.of(URL).url
    assert "s3cret" not in str(health.of(URL).as_json())


def test_the_scrape_loops_reports_are_kept_and_the_lateness_record_stays_bounded() -> None:
    stats = Health().of(URL)
    stats.missed(3)
    stats.missed(2)
    stats.took(0.25)
    stats.late(-0.001)  # (a clock that stepped back: not a lateness)
    assert stats.as_json()["tick_lateness_p99_s"] is None
    stats.late(0.5)
    assert stats.as_json()["tick_lateness_p99_s"] == 0.5  # one sample: the ring's unused slots are not zeros read
    size = sys.getsizeof(stats.lateness_s)
    for i in range(10_000):
        stats.late(i / 1e6)
    status = stats.as_json()
    assert status["missed_ticks"] == 5 and status["last_scrape_duration_s"] == 0.25
    # Flat: the record is as large after 10,000 ticks as after one (8 bytes a tick, 1,024 ticks: 0.5 MiB at 64
    # endpoints), and its p99 is the recent ticks' (the last 1,024: 8.976-9.999 ms), the 0.5 s long gone.
    assert sys.getsizeof(stats.lateness_s) == size <= 1024 * 8 + 1024
    assert status["tick_lateness_p99_s"] is not None and 0.0099 < status["tick_lateness_p99_s"] <= 0.01


def test_the_refresh_watch_sees_a_new_refresh_only_when_the_body_changes() -> None:
    stats = Health().of(URL)
    for t, body in enumerate([b"m 1\n", b"m 1\n", b"m 2\n", b"m 2\n", b"m 3\n", b"m 3\n", b"m 4\n"]):
        stats.answered(body, t * NS, readable=True)
    assert stats.refresh.refreshes == 4 and stats.refresh.last_new_ns == 6 * NS
    assert stats.refresh.period_s == 2.0  # a new body every second scrape, one second apart


def test_a_five_second_refresh_is_told_from_its_second_spacing_on_not_after_fifteen_seconds():
    """Issue 33: /status `refresh_period_s` stayed null for ~14 s on a 5 s refresh."""
    from bridge.health import RefreshWatch

    watch = RefreshWatch()
    told_at = None
    for scrape in range(0, 60):  # 3 Hz for 20 s; DCGM refreshes at 0, 5, 10, 15 s
        t_s = scrape / 3
        watch.observe(f"refresh {int(t_s // 5)}".encode(), int(t_s * 1e9))
        if told_at is None and watch.period_s is not None:
            told_at = t_s
    assert told_at is not None and told_at <= 10.5
    assert abs((watch.period_s or 0) - 5.0) < 0.4
