"""`report` reads a record log once: the series, the SHA-256 that `validate` checks and the run ids all come from
the one pass (report/runs.py `read_log`), by the compiled reader and the pure-Python one alike."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import kernel
from bridge.record_log import record_to_line
from bridge.report.runs import read_log
from bridge.report.series import SeriesAccumulator
from tests.report.helpers import MS, T0, S, rec

PATHS = ["compiled", "python"]


@contextlib.contextmanager
def reader(which: str) -> Iterator[None]:
    if which == "compiled":
        assert kernel.running(), "the C extension is not built: `make .venv/.test`"
        yield
    else:
        with kernel.python_path():
            yield


def lines(run_id: str | None, count: int, start: int = 0) -> bytes:
    return b"".join(record_to_line(dataclasses.replace(
        rec(T0 + (start + i) * S, {"nvidia_power_usage": 100.0 + i % 7, "nvidia_temperature": 60 + i % 3}),
        run_id=run_id)) for i in range(count))


@pytest.mark.parametrize("which", PATHS)
def test_the_hash_is_of_the_file_as_stored_plain_or_gzip(tmp_path: Path, which: str) -> None:
    body = lines("r1", 3000)
    plain = tmp_path / "gpu_telemetry_export.jsonl"
    plain.write_bytes(body)
    members = tmp_path / "members.jsonl.gz"  # one gzip member per writer session
    members.write_bytes(gzip.compress(body[:100_000]) + gzip.compress(body[100_000:]))
    with reader(which):
        for path in (plain, members):
            read = read_log(path)
            assert read.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
            assert read.records == 3000 and read.errors == []


@pytest.mark.parametrize("which", PATHS)
def test_a_gzip_log_of_two_writer_sessions_is_read_to_its_end(tmp_path: Path, which: str) -> None:
    """The first member ends in a read cut short by the reader's size limit (this log's did): the reader once
    took the input after it from the decoder's unconsumed tail, which an ended member never empties, forever."""
    body = lines("r1", 300)
    assert len(body) > 100_000
    path = tmp_path / "gpu_telemetry_export.jsonl.gz"
    path.write_bytes(gzip.compress(body[:100_000]) + gzip.compress(body[100_000:]))
    with reader(which):
        assert read_log(path).records == 300


@pytest.mark.parametrize("which", PATHS)
def test_a_gzip_stream_that_breaks_off_is_hashed_to_the_end_of_the_file(tmp_path: Path, which: str) -> None:
    """Reading stops at corrupt gzip data; the hash still covers every byte after it (it is the file's)."""
    path = tmp_path / "gpu_telemetry_export.jsonl.gz"
    path.write_bytes(gzip.compress(lines("r1", 50)) + b"\x1f\x8b\x08\x00 not deflate at all" + b"\0" * 300_000)
    with reader(which):
        read = read_log(path)
    assert read.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert read.records == 50


@pytest.mark.parametrize("which", PATHS)
def test_run_ids_come_in_the_order_they_first_appear_whoever_reads_the_line(tmp_path: Path, which: str) -> None:
    """Thousands of lines of one shape: the compiled reader takes all but the first few without decoding them, and
    the run id is part of a shape's literal text, so a run appended later is still told apart."""
    path = tmp_path / "gpu_telemetry_export.jsonl"
    path.write_bytes(lines("older", 2000) + lines(None, 10, 2000) + lines("newer", 2000, 2010)
                     + lines("older", 5, 4010) + b'{"run_id":"not-a-record"}\n')
    with reader(which):
        read = read_log(path)
    assert read.run_ids == ["older", "newer", "not-a-record"]
    assert read.records == 4015 and len(read.errors) == 1  # the object without a timestamp


@pytest.mark.parametrize("which", PATHS)
def test_a_log_without_run_ids_has_none(tmp_path: Path, which: str) -> None:
    path = tmp_path / "aiperf.jsonl"  # AIPerf's own log carries no run id
    path.write_bytes(lines(None, 500))
    with reader(which):
        assert read_log(path).run_ids == []


def test_pods_of_a_log_of_two_runs_are_read_from_the_log(tmp_path: Path) -> None:
    """`--gpu-pods` reads the pods' timelines from the log file; for a log of several runs it was once handed the
    chosen run's records instead, and `report` ended in a traceback."""
    from click.testing import CliRunner

    from bridge.cli import main

    def run(run_id: str, start: int) -> bytes:
        return b"".join(record_to_line(dataclasses.replace(
            rec(T0 + (start + i) * S, {"nvidia_power_usage": 100.0, "nvidia_energy_consumption": 1.0 + i / 10_000},
                namespace="team", pod_name="trainer-0"), run_id=run_id)) for i in range(30))

    path = tmp_path / "gpu_telemetry_export.jsonl"
    path.write_bytes(run("r0", 0) + run("r1", 100))
    result = CliRunner().invoke(main, ["report", "--jsonl", str(path), "--start-ns", str(T0 + 101 * S),
                                       "--end-ns", str(T0 + 128 * S), "--gpu-pods", "team/trainer-*"])
    assert result.exit_code == 0, result.output
    assert "reporting run r1" in result.output and "pods: 1 GPU" in result.output


@pytest.mark.parametrize("which", PATHS)
def test_a_scrapes_end_reaches_its_series_whoever_reads_the_line(tmp_path: Path, which: str) -> None:
    """`scrape_end_ns` rides beside each record's values: `Series.ends` holds it (its start where a record lacks one,
    and never before an earlier scrape's end), no telemetry key shows it, and a log without any has none."""
    ends = [T0 + 5 * MS, None, T0 + 2 * S + 900 * MS, T0 + 3 * S + 1 * MS, T0 + 4 * S + 7 * MS] + [None] * 20
    records = [dataclasses.replace(rec(T0 + i * S, {"nvidia_power_usage": 100.0 + i}), scrape_end_ns=end)
               for i, end in enumerate(ends)]
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"".join(record_to_line(r) for r in [*records[3:], *records[:3]]))  # (out of order)
    with reader(which):
        (series,) = SeriesAccumulator().add_path(log).finish()
        (plain,) = SeriesAccumulator().add_path(_without_ends(tmp_path, records)).finish()
    assert series.ends is not None and list(series.values) == ["nvidia_power_usage"]
    expected = [T0 + 5 * MS, T0 + S, T0 + 2 * S + 900 * MS, T0 + 3 * S + 1 * MS, T0 + 4 * S + 7 * MS]
    assert _near(series.ends.tolist(), expected + [T0 + i * S for i in range(5, 25)])  # (float64 holds them: ±256 ns)
    assert series.values["nvidia_power_usage"].tolist() == [100.0 + i for i in range(25)]
    assert plain.ends is None
    (direct,) = SeriesAccumulator().add_all(records).finish()
    assert direct.ends is not None and direct.ends.tolist() == series.ends.tolist()
    late = dataclasses.replace(records[1], timestamp_ns=T0 + S, scrape_end_ns=T0 + S + 10)
    (earlier,) = SeriesAccumulator().add_all([records[0], late, dataclasses.replace(records[2], scrape_end_ns=T0)]
                                             ).finish()
    assert earlier.ends is not None and _near(earlier.ends.tolist(), [T0 + 5 * MS, T0 + S + 10, T0 + 2 * S])


def _near(ends: list[int], expected: list[int]) -> bool:
    return len(ends) == len(expected) and all(abs(a - b) <= 256 for a, b in zip(ends, expected, strict=True))


def _without_ends(tmp_path: Path, records: list) -> Path:
    path = tmp_path / "plain.jsonl"
    path.write_bytes(b"".join(record_to_line(dataclasses.replace(r, scrape_end_ns=None)) for r in records))
    return path


@pytest.mark.parametrize("which", PATHS)
def test_an_end_a_writer_could_not_have_given_is_read_within_what_it_can_be(tmp_path: Path, which: str) -> None:
    """A hand-edited log's ends (before the start, beyond int64, not a number) never fail the read or the report: an
    end is never before its start nor an earlier end, and a report over it still states its energy."""
    from bridge.report import build_report
    from bridge.report.window import explicit_window

    good = [dataclasses.replace(rec(T0 + i * S, {"nvidia_energy_consumption": 1.0 + 0.0003 * i,
                                                 "nvidia_power_usage": 300.0}), scrape_end_ns=T0 + i * S + 4 * MS)
            for i in range(30)]
    text = b"".join(record_to_line(r) for r in good).decode()
    text = text.replace(f'"scrape_end_ns":{T0 + 5 * S + 4 * MS}', '"scrape_end_ns":1e30', 1)
    text = text.replace(f'"scrape_end_ns":{T0 + 9 * S + 4 * MS}', f'"scrape_end_ns":{T0 - 10 * S}', 1)
    text = text.replace(f'"scrape_end_ns":{T0 + 12 * S + 4 * MS}', '"scrape_end_ns":"soon"', 1)
    log = tmp_path / "edited.jsonl"
    log.write_text(text)
    with reader(which):
        (series,) = SeriesAccumulator().add_path(log).finish()
    assert series.ends is not None and len(series.ends) == 30
    assert (series.ends >= series.timestamps).all() and (series.ends[1:] >= series.ends[:-1]).all()
    assert _near(series.ends[:5].tolist(), [T0 + i * S + 4 * MS for i in range(5)])
    assert series.ends[5] > T0 + 10**9 * S  # (as late as it goes: the readings after it are late too)
    built = build_report([dataclasses.replace(r, scrape_end_ns=int(e)) for r, e in zip(good, series.ends, strict=True)],
                         window=explicit_window(T0 + 3 * S, T0 + 20 * S, 0))
    assert built.energy.total_energy_j is not None and built.energy.uncertainty_j is not None
