"""record_log.LineWriter under pressure: a bounded buffer in bytes, a flush that takes what fits, and lines
written within the flush interval even when no new line comes (issue 16, items 4 and 6)."""

from __future__ import annotations

import errno
import io
import time
from pathlib import Path

import pytest

from bridge.record_log import LineWriter
from tests.conftest import wait_until


class _SmallDisk(io.RawIOBase):
    """A file on a disk with `room` bytes left: a write past it raises ENOSPC (after taking what fits, as a
    real disk does), a truncate frees space again."""

    def __init__(self, room: int) -> None:
        self.data = bytearray()
        self.room = room
        self.written_at: list[float] = []  # time.monotonic() of each write

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return len(self.data)

    def truncate(self, size: int | None = None) -> int:
        del self.data[size or 0:]
        return len(self.data)

    def write(self, data) -> int:  # type: ignore[override]
        free = self.room - len(self.data)
        if free <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken = bytes(data[:free])
        self.data += taken
        self.written_at.append(time.monotonic())
        return len(taken)


def _line(i: int, size: int = 1000) -> bytes:
    return (f'{{"i":{i},"pad":"' + "x" * (size - 30)).encode()[: size - 3] + b'"}\n'


def test_the_buffer_is_bounded_in_bytes_and_drops_the_oldest(tmp_path: Path) -> None:
    def refuse(_path: Path):
        raise OSError(errno.EROFS, "Read-only file system")

    writer = LineWriter(tmp_path / "x.jsonl", flush_interval_s=0, max_buffered_bytes=100_000, opener=refuse)
    writer.write_lines(_line(i) for i in range(1000))  # 1 MB against a 100 kB cap
    pending = writer.pending()
    assert sum(map(len, pending)) <= 100_000 and writer.lines_dropped == 1000 - len(pending)
    assert pending[-1] == _line(999)  # the newest are kept
    assert writer.last_error is not None and "Read-only" in writer.last_error


def test_a_flush_takes_what_fits_in_whole_lines_and_the_rest_when_room_comes(tmp_path: Path) -> None:
    disk = _SmallDisk(room=int(1.5 * LineWriter.CHUNK_BYTES))
    writer = LineWriter(tmp_path / "x.jsonl", flush_interval_s=0, opener=lambda _p: disk)  # type: ignore[arg-type]
    lines = [_line(i) for i in range(3000)]  # ~3 MB
    writer.write_lines(lines)
    assert 0 < writer.lines_written < 3000  # what fits went to disk, not nothing
    assert bytes(disk.data) == b"".join(lines[: writer.lines_written])  # whole lines, in order
    disk.room = 10 * LineWriter.CHUNK_BYTES
    assert writer.flush() and writer.lines_written == 3000 and bytes(disk.data) == b"".join(lines)


def test_lines_reach_the_file_within_the_interval_with_no_later_line() -> None:
    disk = _SmallDisk(10**6)
    writer = LineWriter(Path("unused"), flush_interval_s=0.2, opener=lambda _: disk)
    writer.write_lines([_line(0)])
    writer.write_lines([_line(1)])  # buffered: the interval has not passed
    wait_until(lambda: bytes(disk.data) == _line(0) + _line(1), 5.0, "the flusher to write both lines")
    writer.close()  # no third write was needed: the flusher wrote them


def test_a_block_of_lines_is_counted_as_its_lines_when_written_dropped_or_pending() -> None:
    """The kernel hands a page's record lines over as one block: the counts stay in lines, and what waits for
    a full disk is given back line by line."""
    disk = _SmallDisk(0)
    writer = LineWriter(Path("unused"), flush_interval_s=0, max_buffered_bytes=60, opener=lambda _: disk)
    blocks = [b"".join(b"%d-%d\n" % (n, k) for k in range(3)) for n in range(10)]  # 12 bytes each
    for n, block in enumerate(blocks):
        writer.write_block(block, 3 if n % 2 else None)  # the caller's count, or counted here
    assert writer.lines_dropped == 3 * 5  # the oldest blocks past 60 bytes, in lines
    assert writer.pending() == [line for block in blocks[5:] for line in block.splitlines(keepends=True)]
    disk.room = 10**6
    assert writer.flush() and writer.lines_written == 15 and bytes(disk.data) == b"".join(blocks[5:])


@pytest.mark.slow
def test_no_line_waits_longer_than_the_interval_for_the_flusher() -> None:
    """The record log's promise: a kill loses at most `flush_interval` of lines. The flusher once slept until the
    last flush was 1.5 intervals old, and a sidecar killed 1.1 intervals after its last record had none on disk."""
    disk, interval = _SmallDisk(10**6), 2.0
    writer = LineWriter(Path("unused"), flush_interval_s=interval, opener=lambda _: disk)
    written = time.monotonic()
    writer.write_lines([_line(0)])  # buffered: the writer itself flushes only once the interval has passed
    wait_until(lambda: bytes(disk.data) == _line(0), 3 * interval, "the flusher to write the line")
    writer.close()
    waited = disk.written_at[0] - written  # when the line was written, not when this test looked
    assert waited < interval + 0.5, f"the line reached the file after {waited:.2f} s (flush interval {interval} s)"


def test_a_plain_file_takes_the_blocks_in_one_writev_and_a_short_write_goes_on_where_it_stopped(
        tmp_path: Path, monkeypatch) -> None:
    """The record log hands a second's blocks to the kernel as they are (no join); a write the kernel takes only
    part of (a disk filling up, a signal) goes on from the byte it stopped at, so every line lands once, whole."""
    import os

    calls: list[int] = []
    real = os.writev

    def short(fd: int, buffers: list) -> int:
        calls.append(len(buffers))
        data = b"".join(bytes(b) for b in buffers)[:7]  # at most 7 bytes a call
        return real(fd, [data])

    writer = LineWriter(tmp_path / "r.jsonl", flush_interval_s=3600)  # flushed when asked
    blocks = [b'{"a":1}\n{"a":2}\n', b'{"b":3}\n', b'{"c":44444444}\n{"c":5}\n']
    for block in blocks:
        writer.write_block(block)
    monkeypatch.setattr(os, "writev", short)
    assert writer.flush()
    assert (tmp_path / "r.jsonl").read_bytes() == b"".join(blocks)
    assert writer.lines_written == 5 and calls[0] == 3 and len(calls) > 3
    monkeypatch.undo()
    writer.write_block(b'{"d":6}\n')
    writer.write_block(b'{"d":7}\n')
    assert writer.close()
    assert (tmp_path / "r.jsonl").read_bytes().endswith(b'{"d":6}\n{"d":7}\n')
