"""AIPerf 0.13.0's side of the comparisons; runs inside the AIPerf venv (bench/aiperf_setup.sh), prints JSON.

    python _aiperf_side.py scrape PAGE REPEATS NUMBER    # per scrape: parse + accumulate + JSONL lines
    python _aiperf_side.py report JSONL START_NS END_NS  # the accumulator over a whole record log

`scrape` is AIPerf's own parse-and-record path (ai-dynamo/aiperf `src/aiperf/gpu_telemetry/dcgm_collector.py`):
DCGMTelemetryCollector.
_parse_metrics_to_records (prometheus_client + pydantic), TelemetryHierarchy.add_record per record (the
accumulator's storage) and the JSONL writer's serialisation (model_dump + scrub_non_finite + orjson).
`report` reads a record log as AIPerf's own loader would (orjson + TelemetryRecord validation), feeds
the accumulator and computes telemetry_data with GPUTelemetryAccumulator.export_results.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from types import SimpleNamespace


def scrape(page_path: str, repeats: int, number: int) -> dict[str, float]:
    import orjson
    from aiperf.common.models.telemetry_models import TelemetryHierarchy
    from aiperf.gpu_telemetry.dcgm_collector import DCGMTelemetryCollector

    try:
        from aiperf.common.utils import scrub_non_finite  # type: ignore[attr-defined]
    except ImportError:  # moved between releases
        from aiperf.common.mixins.buffered_jsonl_writer_mixin import scrub_non_finite  # type: ignore

    with open(page_path, encoding="utf-8") as page:
        text = page.read()
    collector = DCGMTelemetryCollector("http://127.0.0.1:9400/metrics")
    hierarchy = TelemetryHierarchy()
    clock = [1_750_000_000_000_000_000]

    def one() -> None:
        records = collector._parse_metrics_to_records(text)
        for record in records:
            clock[0] += 1_000_000
            record.timestamp_ns = clock[0]
            hierarchy.add_record(record)
            orjson.dumps(scrub_non_finite(record.model_dump(exclude_none=True, mode="json")))

    one()
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(number):
            one()
        best = min(best, (time.process_time() - start) / number)
    return {"ms_per_scrape": best * 1000}


def report(jsonl: str, start_ns: int, end_ns: int) -> dict[str, float]:
    import orjson
    from aiperf.common.models.telemetry_models import TelemetryHierarchy, TelemetryRecord
    from aiperf.gpu_telemetry.accumulator import GPUTelemetryAccumulator

    started = time.process_time()
    accumulator = GPUTelemetryAccumulator.__new__(GPUTelemetryAccumulator)  # its storage, without a service
    accumulator._hierarchy = TelemetryHierarchy()
    records = 0
    with open(jsonl, "rb") as f:
        for line in f:
            accumulator._hierarchy.add_record(TelemetryRecord.model_validate(orjson.loads(line)))
            records += 1
    loaded = time.process_time()
    ctx = SimpleNamespace(start_ns=start_ns, end_ns=end_ns, error_summary=[])
    data = asyncio.run(accumulator.export_results(ctx))
    done = time.process_time()
    return {"records": records, "cpu_s": done - started, "load_s": loaded - started, "stats_s": done - loaded,
            "gpus": sum(len(e.gpus) for e in data.endpoints.values()),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


if __name__ == "__main__":
    if sys.argv[1] == "scrape":
        result = scrape(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        result = report(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    print(json.dumps(result))
