"""`--gpu-telemetry` grammar, URL normalisation, redaction, and config precedence."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from bridge.config import ConfigError, resolve
from bridge.endpoints import (
    TelemetryItemError,
    candidate_endpoints,
    display_key,
    normalize_url,
    parse_default_endpoints,
    parse_items,
)
from bridge.record_log import LineWriter, read_records, record_to_line
from bridge.redact import redact_url
from bridge.samples import GpuRecord


@pytest.mark.parametrize(("item", "url"), [
    ("node1:9400", "http://node1:9400/metrics"),
    ("http://h:9400/metrics", "http://h:9400/metrics"),
    ("http://h/custom", "http://h/custom/metrics"),
    ("http://h:9400/metrics/", "http://h:9400/metrics"),
    ("h:9400?x=1", "http://h:9400/metrics?x=1"),
    ("https://h:9400/metrics?x=1", "https://h:9400/metrics?x=1"),
    ("[::1]:9400", "http://[::1]:9400/metrics"),
])
def test_urls_are_normalised_and_a_query_string_survives(item, url):
    assert normalize_url(item) == url


def test_items_are_classified_in_order_and_split_on_spaces_and_commas(tmp_path):
    items = parse_items(["a:9400 b:9401,dashboard", "metrics.csv", "k8s://gpu-operator/dcgm:9400", "a:9400"])
    assert items.urls == ["http://a:9400/metrics", "http://b:9401/metrics"]
    assert items.dashboard and items.metrics_files == ["metrics.csv"]
    assert items.discovery == ["k8s://gpu-operator/dcgm:9400"]


def test_local_sources_mix_with_exporter_urls_once_each_in_order():
    items = parse_items(["AMDSMI node2:9400", "pynvml,amdsmi"])
    assert items.local == ["amdsmi", "pynvml"] and items.urls == ["http://node2:9400/metrics"]


def test_an_unrecognised_item_names_itself_and_the_accepted_forms():
    with pytest.raises(TelemetryItemError, match="'node1' is not a DCGM exporter URL.*Accepted forms"):
        parse_items(["node1"])


def test_defaults_come_first_and_duplicates_keep_the_first_position():
    got = candidate_endpoints(["http://localhost:9401/metrics", "http://x:1/metrics"])
    assert got == ["http://localhost:9400/metrics", "http://localhost:9401/metrics", "http://x:1/metrics"]


def test_default_endpoints_from_json_or_comma_list():
    assert parse_default_endpoints('["a:1", "b:2/x"]') == ["http://a:1/metrics", "http://b:2/x/metrics"]
    assert parse_default_endpoints("a:1, b:2") == ["http://a:1/metrics", "http://b:2/metrics"]


def test_display_keys_drop_scheme_metrics_and_userinfo():
    assert display_key("http://user:pw@h:9400/metrics") == "h:9400"
    assert display_key("http://h:9400/custom/metrics?x=1") == "h:9400/custom"


def test_redaction_removes_userinfo_and_every_query_value_keeping_the_names():
    red = redact_url("http://user:s3cret@h:9400/metrics?token=abc&access_key=k&session=x1&empty=&bare#frag")
    assert red == ("http://REDACTED@h:9400/metrics?token=REDACTED&access_key=REDACTED&session=REDACTED&empty="
                   "&REDACTED#REDACTED")
    assert redact_url("http://h:9400/metrics") == "http://h:9400/metrics"


def test_a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("gpu_telemetry:\n  urls: [file:9400]\n  collection_interval: 2.0\n  scrape_timeout: 3\n"
                        "  run_id: from-file\n")
    env = {"AIPERF_GPU_COLLECTION_INTERVAL": "1.5", "DCGM_BRIDGE_RUN_ID": "from-env"}
    config = resolve({"run_id": "from-flag"}, env, cfg_file)
    assert config.run_id == "from-flag" and config.collection_interval == 1.5 and config.scrape_timeout == 3.0
    assert config.telemetry.urls == ["http://file:9400/metrics"]
    assert resolve({}, {}, None).collection_interval == 0.333


def test_every_aiperf_gpu_variable_is_honoured():
    env = {"AIPERF_GPU_COLLECTION_INTERVAL": "0.5", "AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS": "x:1",
           "AIPERF_GPU_EXPORT_BATCH_SIZE": "7", "AIPERF_GPU_FINAL_SCRAPE_GRACE_NS": "1000",
           "AIPERF_GPU_REACHABILITY_TIMEOUT": "3", "AIPERF_GPU_SHUTDOWN_DELAY": "2",
           "AIPERF_HTTP_METRICS_SCRAPE_READ_TIMEOUT": "4"}
    c = resolve({}, env)
    assert (c.collection_interval, c.default_endpoints, c.export_batch_size, c.final_scrape_grace_ns,
            c.reachability_timeout, c.shutdown_delay, c.scrape_timeout) == (
        0.5, ["http://x:1/metrics"], 7, 1000, 3.0, 2.0, 4.0)


def test_all_problems_are_reported_at_once_naming_their_source(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("gpu_telemetry:\n  bogus: 1\n")
    with pytest.raises(ConfigError) as info:
        resolve({"gpu_telemetry": ["nonsense"]}, {"AIPERF_GPU_COLLECTION_INTERVAL": "0"}, cfg_file)
    text = str(info.value)
    assert "AIPERF_GPU_COLLECTION_INTERVAL: 0.0 is below the minimum 0.01" in text
    assert "unknown key gpu_telemetry.bogus" in text and "'nonsense'" in text


def test_gpu_telemetry_and_no_gpu_telemetry_together_is_an_error():
    with pytest.raises(ConfigError, match="give one or the other"):
        resolve({"gpu_telemetry": ["a:1"], "no_gpu_telemetry": True}, {})


def test_an_aiperf_style_yaml_block_is_accepted(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("gpu_telemetry:\n  enabled: false\n  url: a:9400\n  mode: realtime_dashboard\n")
    config = resolve({}, {}, cfg_file)
    assert not config.enabled and config.telemetry.urls == ["http://a:9400/metrics"] and config.telemetry.dashboard


# -- record log --------------------------------------------------------------------------------------
def _record(ts: int) -> GpuRecord:
    return GpuRecord(0, "GPU-x", "H100", "00:18.0", "nvidia0", "node", None, None, platform="nvidia", timestamp_ns=ts,
                     telemetry_source_url="http://h:9400/metrics", telemetry_data={"nvidia_power_usage": 300.5},
                     run_id="r1", phase="profiling", scrape_end_ns=ts + 5)


def test_a_record_line_has_aiperfs_keys_in_order_then_ours():
    line = record_to_line(_record(10)).decode()
    assert line.startswith('{"gpu_index":0,"gpu_uuid":"GPU-x","gpu_model_name":"H100","pci_bus_id":"00:18.0",'
                           '"device":"nvidia0","hostname":"node","platform":"nvidia","timestamp_ns":10,'
                           '"telemetry_source_url":"http://h:9400/metrics","telemetry_data":{"nvidia_power_usage":300.5},'
                           '"run_id":"r1","phase":"profiling"')


@pytest.mark.parametrize("name", ["log.jsonl", "log.jsonl.gz"])
def test_the_record_log_round_trips_plain_or_gzip_and_ignores_a_torn_last_line(tmp_path, name):
    path = tmp_path / name
    writer = LineWriter(path, flush_interval_s=0)
    writer.write_records([_record(1), _record(2)])
    writer.close()
    if name.endswith(".jsonl"):
        with open(path, "ab") as f:
            f.write(b'{"gpu_index":0,"gpu_uu')  # a kill mid-write on a full disk
    got = list(read_records(path))
    assert [r.timestamp_ns for r in got] == [1, 2] and got[0].telemetry_data == {"nvidia_power_usage": 300.5}


def test_a_gzip_log_is_readable_while_it_is_still_being_written(tmp_path):
    path = tmp_path / "live.jsonl.gz"
    writer = LineWriter(path, flush_interval_s=0)
    writer.write_records([_record(1)])
    assert writer.flush()
    assert [r.timestamp_ns for r in read_records(path)] == [1]
    writer.write_records([_record(2)])
    writer.close()
    assert len(gzip.decompress(path.read_bytes()).splitlines()) == 2


def test_a_refused_write_keeps_the_lines_and_reports_the_error(tmp_path):
    class Full:
        def __init__(self):
            self.fail = True
            self.data = b""

        def write(self, data):
            if self.fail:
                raise OSError(28, os.strerror(28))
            self.data += data

        def flush(self):
            pass

        def close(self):
            pass

    target = Full()
    writer = LineWriter(tmp_path / "x.jsonl", flush_interval_s=0, opener=lambda _p: target)
    writer.write_records([_record(1)])
    assert not writer.flush() and "No space left on device" in writer.last_error
    target.fail = False
    writer.write_records([_record(2)])
    assert writer.flush() and writer.last_error is None and target.data.count(b"\n") == 2


def test_aiperfs_own_jsonl_with_the_old_dcgm_url_key_is_read(tmp_path):
    path = tmp_path / "aiperf.jsonl"
    path.write_text('{"gpu_index":0,"gpu_uuid":"GPU-a","gpu_model_name":"H100","platform":"nvidia",'
                    '"timestamp_ns":5,"dcgm_url":"http://h:1/metrics","telemetry_data":{"nvidia_power_usage":1.0}}\n')
    (rec,) = read_records(path)
    assert rec.telemetry_source_url == "http://h:1/metrics" and rec.telemetry_data["nvidia_power_usage"] == 1.0


@pytest.mark.parametrize("run_id", ["x/../../victim", "..", "a/b", "", "-leading-dash", "x" * 129, "a b"])
def test_a_run_id_that_is_not_one_safe_path_component_is_refused_naming_the_flag(run_id: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve({"run_id": run_id}, env={})
    assert "--run-id" in str(caught.value) and "not a usable run id" in str(caught.value)


def test_a_bad_run_id_stops_the_sidecar_before_anything_is_written(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from bridge.cli import main

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, ["sidecar", "--artifact-dir", str(tmp_path / "a" / "b"), "--run-id",
                                       "x/../../../victim", "--gpu-telemetry", "127.0.0.1:1"])
    assert result.exit_code == 2 and "not a usable run id" in result.output and "Traceback" not in result.output
    assert (victim / "keep.txt").read_text() == "mine" and not (tmp_path / "a").exists()
