"""The record-log reader parses runs of lines as one JSON array; it must read exactly what parsing line by
line reads: the same objects, the same skipped lines, the same error messages, plain or gzip."""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge import kernel, record_log
from bridge.record_log import read_dicts, record_to_line
from bridge.report.series import SeriesAccumulator
from tests.report.helpers import T0, URL, S, rec


def read_line_by_line(raw: bytes, path: Path, errors: list[str]) -> list[dict[str, Any]]:
    """The reader as it was: every complete line through orjson on its own."""
    out = []
    for number, line in enumerate(raw.split(b"\n")[:-1], 1):
        if not line:
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            errors.append(f"{path}:{number}: not JSON ({exc})")
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


GOOD = [record_to_line(rec(T0 + i * S, {"nvidia_power_usage": 100.0 + i, "nvidia_temperature": 60})).rstrip()
        for i in range(3)]
# Lines that are not one JSON object, among them pairs that would read as valid JSON if a line boundary could
# fall inside a value: an array split over two lines, a string split over two lines, a line with two objects.
ODD = [
    b"", b"   ", b"not json", b"42", b'"a string"', b"null", b"[1, 2]", b"{}", b'{"a": 1} ', b' {"a": 1}',
    b'{"a": 1}\r', b'{"a":1},{"b":2}', b'{"a":[1', b'2]}', b'{"k":"}', b'{","b":1}', b'{"a":1', b'"b":2}',
    b",0,", b'{"a":1},0,{"b":2}', b'{"a": NaN}', b"\xef\xbb\xbf{}", b'{"a":"\xff"}', b"{" * 2000, b"}" * 2000,
    b'{"telemetry_data": {"x": 1e999}}', b'{"deep":' * 300 + b"1" + b"}" * 300,
]


def _check(tmp_path: Path, lines: list[bytes], tail: bytes = b"", name: str = "log.jsonl") -> list[dict[str, Any]]:
    raw = b"".join(line + b"\n" for line in lines) + tail
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    expected_errors: list[str] = []
    expected = read_line_by_line(raw, path, expected_errors)
    errors: list[str] = []
    assert list(read_dicts(path, errors)) == expected
    assert errors == expected_errors
    return expected


@pytest.mark.parametrize("name", ["log.jsonl", "log.jsonl.gz"])
def test_a_log_reads_the_same_in_runs_as_line_by_line_with_every_odd_line(tmp_path: Path, name: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_log, "_BATCH_BYTES", 512)  # many runs, so odd lines land everywhere in them
    lines = [GOOD[i % 3] for i in range(400)]
    for k, odd in enumerate(ODD):
        lines.insert(7 + 13 * k, odd)
    got = _check(tmp_path, lines, tail=b'{"torn": "last li', name=name)
    assert len(got) == 400 + 5  # the good lines, `{}`, `{"a": 1} `, `{"a": 1}\r`, 1e999 (inf) and the nested one


def test_lines_that_would_balance_out_in_one_array_are_still_read_one_by_one(tmp_path: Path) -> None:
    # An array split over two lines reads as one value with a separator inside; two lines holding two objects
    # each make up the count. Without the rule "no `[` in a run" the run would parse, values out of place.
    got = _check(tmp_path, [GOOD[0], b'{"a":[1', b'2]}', b'{"x":1},{"y":2}', b'{"x":1},{"y":2}', GOOD[1]])
    assert got == [orjson.loads(GOOD[0]), orjson.loads(GOOD[1])]
    # An object carried on over a line break (`,` then a key) would too, but for the `0` after each comma; a
    # string carried on over a line break cannot parse (a raw newline).
    for odd in ([b'{"a":1', b'"b":2}'], [b'{"k":"}', b'{","b":1}']):
        got = _check(tmp_path, [GOOD[0], *odd, b'{"x":1},{"y":2}', GOOD[1]])
        assert got == [orjson.loads(GOOD[0]), orjson.loads(GOOD[1])]


def test_a_line_longer_than_a_run_is_a_run_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_log, "_BATCH_BYTES", 256)
    long = orjson.dumps({"x": "y" * 5000})
    _check(tmp_path, [GOOD[0], long, GOOD[1], long, long, GOOD[2]])


def test_gzip_members_are_read_one_after_the_other_and_a_cut_member_up_to_its_last_flush(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl.gz"
    cut = gzip.compress(b"".join(line + b"\n" for line in GOOD))
    path.write_bytes(gzip.compress(GOOD[0] + b"\n") + gzip.compress(GOOD[1] + b"\n") + cut[: len(cut) // 2])
    got = list(read_dicts(path))
    assert got[:2] == [orjson.loads(GOOD[0]), orjson.loads(GOOD[1])]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(GOOD + ODD), max_size=60), st.sampled_from([64, 200, 1 << 16]),
       st.sampled_from(["log.jsonl", "log.jsonl.gz"]))
def test_any_mix_of_lines_reads_the_same_in_runs_as_line_by_line(tmp_path_factory: pytest.TempPathFactory,
                                                                 lines: list[bytes], run_bytes: int, name: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(record_log, "_BATCH_BYTES", run_bytes)
        _check(tmp_path_factory.mktemp("mix"), lines, name=name)


# -- the report's reader on top of it ------------------------------------------------------------------------
def _series_one_by_one(path: Path) -> tuple[SeriesAccumulator, list[str]]:
    """Every line through SeriesAccumulator.add_dict: the reader's slow path, for every record."""
    errors: list[str] = []
    acc = SeriesAccumulator()
    for number, obj in enumerate(read_dicts(path, errors), 1):
        try:
            acc.add_dict(obj)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            errors.append(f"{path}: record {number}: {exc!r}")
    return acc, errors


def _same_series(a: SeriesAccumulator, b: SeriesAccumulator) -> None:
    assert a.records == b.records
    left, right = a.finish(), b.finish()
    assert [(s.endpoint, s.source_url, s.meta) for s in left] == [(s.endpoint, s.source_url, s.meta) for s in right]
    for x, y in zip(left, right, strict=True):
        assert np.array_equal(x.timestamps, y.timestamps)
        assert list(x.values) == list(y.values)
        for key in x.values:
            assert np.array_equal(x.values[key], y.values[key], equal_nan=True), key


def test_the_reports_reader_reads_every_kind_of_line_as_the_record_by_record_path(tmp_path: Path) -> None:
    data = {"nvidia_power_usage": 300.0, "nvidia_energy_consumption": 1.5, "nvidia_temperature": 61}
    lines = []
    for i in range(2000):  # past the first row buffer of a series (64 KiB), so the rows grow
        lines.append(record_to_line(rec(T0 + i * S, {**data, "nvidia_power_usage": 300.0 + i % 7})))
        lines.append(record_to_line(rec(T0 + i * S, data, uuid="GPU-mig", gi="3")))
    aiperf = {"gpu_index": 1, "gpu_model_name": "NVIDIA H100 80GB HBM3", "hostname": "node-b", "dcgm_url": URL,
              "telemetry_data": {"gpu_power_usage": 120.0, "xid_errors": 0}}
    odd = [
        {**aiperf, "timestamp_ns": T0},  # AIPerf before 0.12: dcgm_url, no UUID, pre-0.13 keys
        {**aiperf, "timestamp_ns": T0 + S},
        {"gpu_uuid": "GPU-0000aaaa-bbbb-cccc-dddd-000000000000", "gpu_index": 0, "timestamp_ns": T0 + 5 * S + 1,
         "telemetry_source_url": URL, "telemetry_data": {**data, "nvidia_power_usage": "n/a"}},  # not a number
        {"gpu_uuid": "GPU-0000aaaa-bbbb-cccc-dddd-000000000000", "gpu_index": 0, "timestamp_ns": T0 + 6 * S + 1,
         "telemetry_source_url": URL, "telemetry_data": {**data, "nvidia_power_usage": True}},  # a bool is 1.0
        {"gpu_uuid": "GPU-0000aaaa-bbbb-cccc-dddd-000000000000", "gpu_index": 0, "timestamp_ns": T0 - 9 * S,
         "telemetry_source_url": URL, "telemetry_data": {"nvidia_temperature": 50}},  # earlier; fewer keys
        {"gpu_uuid": "GPU-0000aaaa-bbbb-cccc-dddd-000000000000", "timestamp_ns": float(T0 + 7 * S),
         "telemetry_source_url": URL, "telemetry_data": data},  # a float time
        {"gpu_uuid": "GPU-x", "timestamp_ns": T0, "telemetry_source_url": URL, "telemetry_data": [1, 2]},
        {"gpu_uuid": "GPU-x", "telemetry_source_url": URL, "telemetry_data": data},  # no time
        {"gpu_uuid": "GPU-x", "timestamp_ns": T0, "telemetry_source_url": URL, "gpu_instance_id": [1],
         "telemetry_data": data},
    ]
    raw_lines = [  # numbers orjson reads as floats: a time beyond int64, an int beyond it; and one beyond float64
        b'{"gpu_uuid":"GPU-0000aaaa-bbbb-cccc-dddd-000000000000","timestamp_ns":18446744073709551616,'
        b'"telemetry_source_url":"' + URL.encode() + b'","telemetry_data":{"nvidia_temperature":1}}',
        b'{"gpu_uuid":"GPU-0000aaaa-bbbb-cccc-dddd-000000000000","timestamp_ns":' + str(T0 + 9 * S).encode() +
        b',"telemetry_source_url":"' + URL.encode() + b'","telemetry_data":{"nvidia_temperature":1e999}}',
        b'{"gpu_uuid":"GPU-0000aaaa-bbbb-cccc-dddd-000000000000","timestamp_ns":' + str(T0 + 10 * S).encode() +
        b',"telemetry_source_url":"' + URL.encode() + b'","telemetry_data":{"nvidia_temperature":1' + b"0" * 30 + b"}}",
    ]
    for k, line in enumerate([orjson.dumps(obj) for obj in odd] + raw_lines):
        lines.insert(50 + 97 * k, line + b"\n")
    for name in ("log.jsonl", "log.jsonl.gz"):
        path = tmp_path / name
        raw = b"".join(lines) + b'{"partial'
        path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
        errors: list[str] = []
        fast = SeriesAccumulator().add_path(path, errors)
        slow, slow_errors = _series_one_by_one(path)
        assert errors == slow_errors and len(errors) == 5  # list data, no time, a list id, time > int64, 1e999
        _same_series(fast, slow)
        (aiperf_series,) = [s for s in fast.finish() if s.meta.gpu_uuid == "unknown:node-b:1"]
        assert list(aiperf_series.values) == ["nvidia_power_usage", "nvidia_xid_errors"]


def test_series_handed_out_by_finish_stay_as_they_were_while_more_records_arrive() -> None:
    acc = SeriesAccumulator()
    for i in range(3):
        acc.add(rec(T0 + i * S, {"nvidia_power_usage": float(i)}))
    (before,) = acc.finish()
    for i in range(3, 5000):  # the row buffer grows (and moves) under the first series' views
        acc.add(rec(T0 + i * S, {"nvidia_power_usage": float(i)}))
    (after,) = acc.finish()
    assert list(before.values["nvidia_power_usage"]) == [0.0, 1.0, 2.0]
    assert after.values["nvidia_power_usage"][-1] == 4999.0 and len(after) == 5000
    assert not math.isnan(after.values["nvidia_power_usage"].sum())


def test_a_line_written_after_close_is_written_and_its_file_closed_again(tmp_path):
    from bridge.events import Complete
    from bridge.record_log import LineWriter, read_dicts

    writer = LineWriter(tmp_path / "events.jsonl", flush_interval_s=60.0)
    writer.write_event(Complete(1, None, True, (), None, {}))
    assert writer.close()
    writer.write_event(Complete(2, None, True, (), None, {}))  # a scrape that ended after completion
    assert writer._file is None  # not left open for the garbage collector
    assert [d["time_ns"] for d in read_dicts(tmp_path / "events.jsonl")] == [1, 2]


# -- the kernel's line reader (bridge/_kernel.c scan_lines) against orjson -----------------------------------

NUMBERS = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**63), 2**64 - 1),
                    st.sampled_from([0.0, -0.0, 1e-7, 1e16, 5e-324, 1.7976931348623157e308, 2**53 + 1, 10**18]))


def _line(i: int, values: list[float], *, uuid: str = "GPU-0000aaaa-bbbb-cccc-dddd-000000000000",
          keys: tuple[str, ...] = ("nvidia_power_usage", "nvidia_energy_consumption", "nvidia_temperature"),
          phase: str = "profiling") -> bytes:
    import dataclasses

    record = rec(T0 + i * S, dict(zip(keys, values, strict=False)), uuid=uuid)
    return record_to_line(dataclasses.replace(record, run_id="run-1", phase=phase, scrape_start_ns=T0 + i * S,
                                              scrape_end_ns=T0 + i * S + 3_000_000)).rstrip()


def _both(tmp_path: Path, lines: list[bytes], name: str = "log.jsonl") -> SeriesAccumulator:
    raw = b"".join(line + b"\n" for line in lines)
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    errors: list[str] = []
    compiled = SeriesAccumulator().add_path(path, errors)
    plain_errors: list[str] = []
    plain = SeriesAccumulator()
    with kernel.python_path():
        plain.add_path(path, plain_errors)
    assert errors == plain_errors
    _same_series(compiled, plain)
    slow, slow_errors = _series_one_by_one(path)
    assert errors == slow_errors
    _same_series(compiled, slow)
    return compiled


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ours", "ours", "ours", "other gpu", "fewer keys", "odd", "phase"]),
                          st.lists(NUMBERS, min_size=3, max_size=3), st.sampled_from(ODD)), max_size=120),
       st.sampled_from([256, 1024, 1 << 16]), st.sampled_from(["log.jsonl", "log.jsonl.gz"]))
def test_any_log_reads_the_same_with_and_without_the_kernel(tmp_path_factory: pytest.TempPathFactory,
                                                            steps: list[tuple[str, list[float], bytes]],
                                                            run_bytes: int, name: str) -> None:
    """Our lines with any numbers (floats, huge and negative ints, subnormals), a second GPU, a series whose
    key set changes and changes back, a phase that changes, and every odd line, in runs of any size: the
    kernel reads exactly the series and the errors that orjson and the record-by-record path read."""
    lines = []
    for i, (kind, values, odd) in enumerate(steps):
        if kind == "odd":
            lines.append(odd)
        elif kind == "other gpu":
            lines.append(_line(i, values, uuid="GPU-1111aaaa-bbbb-cccc-dddd-000000000000"))
        elif kind == "fewer keys":
            lines.append(_line(i, values, keys=("nvidia_temperature", "nvidia_power_usage")))
        elif kind == "phase":
            lines.append(_line(i, values, phase="cooldown"))
        else:
            lines.append(_line(i, values))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(record_log, "_BATCH_BYTES", run_bytes)
        _both(tmp_path_factory.mktemp("kernel"), lines, name)


@pytest.mark.skipif(not kernel.COMPILED, reason="the kernel is not built here (no C compiler)")
def test_the_kernel_reads_nearly_every_line_of_our_own_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shapes are learnt from the first run of lines; the rest of the log is read by the kernel (counted)."""
    taken = []
    scan = kernel.scan_lines

    def counting(batch: bytes, position: int, shapes: dict) -> tuple[int, int]:  # type: ignore[type-arg]
        result = scan(batch, position, shapes)
        taken.append(result[1])
        return result

    monkeypatch.setattr(kernel, "scan_lines", counting)
    lines = [_line(i, [300.0 + i % 7, 1.5 + i * 1e-6, 61]) for i in range(3000)]
    lines += [_line(3000 + i, [300.0, 2.0, 61], uuid="GPU-1111aaaa-bbbb-cccc-dddd-000000000000") for i in range(3000)]
    compiled = _both(tmp_path, lines)
    assert compiled.records == 6000 and sum(taken) > 0.95 * 6000  # all but the first run of lines of each GPU


def test_an_aiperf_log_is_not_given_shapes_and_reads_as_before(tmp_path: Path) -> None:
    """AIPerf's own lines (pydantic's JSON, with nulls) are not ours: no shape, every line decoded as before."""
    lines = [orjson.dumps({"timestamp_ns": T0 + i * S, "dcgm_url": URL, "gpu_index": 0, "gpu_uuid": "GPU-a",
                           "gpu_model_name": "H100", "telemetry_data": {"gpu_power_usage": 100.0 + i,
                                                                        "xid_errors": None}}, option=orjson.OPT_INDENT_2
                          ).replace(b"\n", b"") for i in range(200)]
    assert _both(tmp_path, lines).records == 200
