"""The accumulator: streaming, identities, out-of-order records, odd lines, memory per record."""

from __future__ import annotations

import gzip
import math
import tracemalloc
from pathlib import Path

import orjson

from bridge.record_log import record_to_line
from bridge.report.series import SeriesAccumulator
from tests.report.helpers import T0, URL, S, rec

DATA = {"nvidia_power_usage": 300.0, "nvidia_energy_consumption": 1.0, "nvidia_gpu_utilization": 50.0,
        "nvidia_memory_utilization": 40.0, "nvidia_memory_used": 70.0, "nvidia_temperature": 60.0,
        "nvidia_sm_utilization": 80.0, "nvidia_decoder_utilization": 0.0, "nvidia_encoder_utilization": 0.0,
        "nvidia_xid_errors": 0.0, "nvidia_power_violation": 5.0}


def test_series_are_keyed_by_endpoint_uuid_and_mig_instance_never_by_index() -> None:
    acc = SeriesAccumulator()
    acc.add(rec(T0, DATA, uuid="GPU-a"))
    acc.add(rec(T0, DATA, uuid="GPU-b"))  # same index 0
    acc.add(rec(T0, DATA, uuid="GPU-a", gi="3"))
    acc.add(rec(T0, DATA, uuid="GPU-a", url="http://other:9400/metrics"))
    keys = sorted((s.endpoint, s.meta.gpu_uuid, s.meta.gpu_instance_id or "") for s in acc.finish())
    assert keys == [("127.0.0.1:19401", "GPU-a", ""), ("127.0.0.1:19401", "GPU-a", "3"),
                    ("127.0.0.1:19401", "GPU-b", ""), ("other:9400", "GPU-a", "")]


def test_a_key_that_appears_late_or_goes_missing_is_nan_filled() -> None:
    acc = SeriesAccumulator()
    acc.add(rec(T0, {"a": 1.0}))
    acc.add(rec(T0 + S, {"a": 2.0, "b": 20.0}))
    acc.add(rec(T0 + 2 * S, {"b": 30.0}))
    (series,) = acc.finish()
    assert [None if math.isnan(x) else x for x in series.values["a"]] == [1.0, 2.0, None]
    assert [None if math.isnan(x) else x for x in series.values["b"]] == [None, 20.0, 30.0]


def test_out_of_order_records_come_out_sorted_with_their_values() -> None:
    acc = SeriesAccumulator()
    for t, v in ((3, 30.0), (1, 10.0), (2, 20.0)):
        acc.add(rec(T0 + t * S, {"a": v}))
    (series,) = acc.finish()
    assert list(series.timestamps - T0) == [S, 2 * S, 3 * S] and list(series.values["a"]) == [10.0, 20.0, 30.0]


def test_a_log_is_read_plain_or_gzipped_and_bad_lines_are_skipped_and_described(tmp_path: Path) -> None:
    lines = [record_to_line(rec(T0 + i * S, DATA)) for i in range(3)]
    lines.insert(1, b"not json\n")
    lines.insert(2, orjson.dumps({"gpu_uuid": "GPU-x", "telemetry_data": {}}) + b"\n")  # no timestamp
    lines.append(orjson.dumps({"gpu_uuid": "GPU-0000aaaa-bbbb-cccc-dddd-000000000000", "gpu_index": 0,
                               "timestamp_ns": T0 + 9 * S, "telemetry_source_url": URL,
                               "telemetry_data": {"nvidia_power_usage": "n/a", "nvidia_temperature": 61}}) + b"\n")
    body = b"".join(lines)
    for path in (tmp_path / "log.jsonl", tmp_path / "log.jsonl.gz"):
        path.write_bytes(gzip.compress(body) if path.suffix == ".gz" else body)
        errors: list[str] = []
        acc = SeriesAccumulator().add_path(path, errors)
        (series,) = acc.finish()
        assert acc.records == 4 and len(errors) == 2
        assert math.isnan(series.values["nvidia_power_usage"][-1]) and series.values["nvidia_temperature"][-1] == 61


def test_an_aiperf_line_reads_the_same_as_our_record_reader_would() -> None:
    line = {"gpu_index": 0, "gpu_model_name": "NVIDIA H100 80GB HBM3", "hostname": "node-a",
            "timestamp_ns": T0, "dcgm_url": URL, "telemetry_data": {"nvidia_power_usage": 100.0}}
    acc = SeriesAccumulator()
    acc.add_dict(line)
    (series,) = acc.finish()
    assert series.meta.gpu_uuid == "unknown:node-a:0" and series.endpoint == "127.0.0.1:19401"


def test_a_record_costs_a_few_array_slots_not_a_dict() -> None:
    records = [rec(T0 + k * S // 3, DATA, uuid=f"GPU-{g}", index=g) for k in range(300) for g in range(64)]
    acc = SeriesAccumulator()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    acc.add_all(records)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per_record = grown / len(records)
    # 12 arrays x 8 bytes, plus the arrays' over-allocation; a dict per record would be > 600 bytes.
    assert per_record < 250, per_record
