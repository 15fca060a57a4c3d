"""Issue 46, item 1: GPUs grouped by serving role (`--role NAME=NAMESPACE/GLOB`, or llm-d's and Dynamo's role labels
where discovery recorded the pods' labels), each role's energy ± uncertainty, average power and efficiency.

Truths: constant power in closed form, token counts written by hand."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.errors import ConfigError
from bridge.pods import PodRef
from bridge.report import build_report
from bridge.report.requests import read_requests
from bridge.report.window import explicit_window
from bridge.roles import parse_role, parse_roles, role_kind, role_of_labels, role_of_pod
from bridge.simulator.disagg import SimRequest, aiperf_lines
from tests.report.helpers import MS, T0, S, rec, write_events, write_log

UUIDS = [f"GPU-0000aaaa-bbbb-cccc-dddd-00000000000{i}" for i in range(3)]


def _gpus(pods: list[str], watts: list[float], seconds: float = 10) -> list:
    """One GPU per pod at constant power, scraped every 100 ms from 1 s before T0; counters (MJ) from 1 MJ."""
    out = []
    t = T0 - S
    while t <= T0 + round((seconds + 1) * S):
        for i, (pod, w) in enumerate(zip(pods, watts, strict=True)):
            joules = 1e6 + w * (t - (T0 - S)) / S
            out.append(rec(t, {"nvidia_power_usage": w, "nvidia_energy_consumption": joules * 1e-6}, uuid=UUIDS[i],
                           index=i, namespace="llm", pod_name=pod))
        t += 100 * MS
    return out


def _requests(tmp_path, tokens: list[tuple[int, int]]):
    requests = [SimRequest(f"r{i}", T0 + i * S, T0 + i * S + 200 * MS, T0 + (i + 2) * S, isl, osl)
                for i, (isl, osl) in enumerate(tokens)]
    path = tmp_path / "profile_export.jsonl"
    path.write_bytes(aiperf_lines(requests))
    return read_requests(path)


def test_each_role_has_its_gpus_energy_power_and_the_efficiency_of_its_kind(tmp_path):
    # prefill: two GPUs at 300 W and 100 W for 10 s = 4000 J; decode: one at 200 W = 2000 J.
    records = _gpus(["sglang-prefill-0", "sglang-prefill-1", "sglang-decode-0"], [300.0, 100.0, 200.0])
    built = build_report(records, window=explicit_window(T0, T0 + 10 * S, 0),
                         requests=_requests(tmp_path, [(1000, 100), (3000, 300)]),
                         role_rules=parse_roles(["prefill=llm/*-prefill-*", "decode=llm/*-decode-*"]))
    roles = built.telemetry_data["roles"]
    assert roles["prefill"]["kind"] == "prefill" and len(roles["prefill"]["gpus"]) == 2
    assert roles["prefill"]["energy_j"] == pytest.approx(4000, rel=1e-6)
    assert roles["prefill"]["average_power_w"] == pytest.approx(400, rel=1e-6)
    assert roles["prefill"]["j_per_input_token"] == pytest.approx(4000 / 4000, rel=1e-6)
    assert roles["decode"]["energy_j"] == pytest.approx(2000, rel=1e-6)
    assert roles["decode"]["j_per_output_token"] == pytest.approx(2000 / 400, rel=1e-6)
    assert roles["decode"]["pods"] == ["llm/sglang-decode-0"] and roles["decode"]["valid"] is True
    gpus = {g.identity[0]: g for g in built.energy.gpus}
    assert roles["prefill"]["uncertainty_j"] == pytest.approx(gpus[UUIDS[0]].uncertainty_j
                                                              + gpus[UUIDS[1]].uncertainty_j)


def test_an_aggregated_role_is_j_per_token_and_without_token_counts_says_so():
    built = build_report(_gpus(["vllm-0"], [250.0]), window=explicit_window(T0, T0 + 10 * S, 0),
                         role_rules=parse_roles(["serve=llm/vllm-*"]))
    role = built.telemetry_data["roles"]["serve"]
    assert role["kind"] == "aggregated" and role["energy_j"] == pytest.approx(2500, rel=1e-6)
    assert role["valid"] is False and role["reasons"] == ["no_token_counts"] and "j_per_token" not in role


def test_llm_d_and_dynamo_labels_give_roles_where_discovery_recorded_them(tmp_path):
    labels = {("llm", "a-0"): {"llm-d.ai/role": "prefill"}, ("llm", "b-0"): {"llm-d.ai/role": "both"},
              ("llm", "c-0"): {"nvidia.com/dynamo-component-type": "worker",
                               "nvidia.com/dynamo-sub-component-type": "decode"}}
    built = build_report(_gpus(["a-0", "b-0", "c-0"], [100.0, 100.0, 100.0]),
                         window=explicit_window(T0, T0 + 10 * S, 0), pod_labels=labels,
                         requests=_requests(tmp_path, [(10, 10)]))
    assert {name: r["kind"] for name, r in built.telemetry_data["roles"].items()} == \
        {"prefill": "prefill", "aggregated": "aggregated", "decode": "decode"}
    # A --role rule beats the labels.
    assert role_of_pod(parse_roles(["decode=llm/a-*"]), PodRef("llm", "a-0"), labels) == "decode"
    assert role_of_labels({"nvidia.com/dynamo-component-type": "worker"}) == "aggregated"
    assert role_of_labels({"nvidia.com/dynamo-component-type": "frontend"}) is None


@pytest.mark.parametrize("value", ["prefill", "Prefill=llm/a", "prefill=llm", "prefill=LLM/a", "prefill=llm/a b"])
def test_a_bad_role_value_is_one_line_naming_it(value):
    with pytest.raises(ConfigError, match="--role"):
        parse_role(value)


def test_role_kinds_follow_the_name():
    assert [role_kind(n) for n in ("prefill", "prefill-fast", "decode-2", "both")] == \
        ["prefill", "prefill", "decode", "aggregated"]


def test_report_role_flag_refuses_a_bad_value_with_exit_2(tmp_path):
    write_log(tmp_path / "log.jsonl", _gpus(["a-0"], [100.0], 3))
    done = CliRunner().invoke(main, ["report", "--jsonl", str(tmp_path / "log.jsonl"), "--start-ns", str(T0),
                                     "--end-ns", str(T0 + 2 * S), "--role", "prefill"])
    assert done.exit_code == 2 and "--role 'prefill'" in done.output and "Traceback" not in done.output


def test_the_console_and_the_html_show_a_row_per_role_and_the_requests(tmp_path):
    write_log(tmp_path / "log.jsonl", _gpus(["x-prefill-0", "x-decode-0"], [300.0, 200.0]))
    requests = _requests(tmp_path, [(1000, 100), (3000, 300)])
    done = CliRunner().invoke(main, ["report", "--jsonl", str(tmp_path / "log.jsonl"), "--start-ns", str(T0),
                                     "--end-ns", str(T0 + 10 * S), "--grace-ns", "0", "--requests",
                                     str(requests.path), "--role", "prefill=llm/*-prefill-*", "--role",
                                     "decode=llm/*-decode-*", "--console", "--html", str(tmp_path / "r.html")],
                              env={"COLUMNS": "160"})
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert "Role prefill (prefill, 1 GPU): 3.00 kJ ±" in text and "0.75 J/input token" in text
    assert "Role decode (decode, 1 GPU): 2.00 kJ ±" in text and "5 J/output token" in text
    assert "Requests: 2 attributed" in text and "[too_few_requests]" in text
    page = (tmp_path / "r.html").read_text()
    assert 'data-role="prefill"' in page and 'data-role="decode"' in page and 'data-requests="1"' in page


def test_validate_rebuilds_the_roles_given_the_same_role_flags(tmp_path):
    write_log(tmp_path / "gpu_telemetry_export.jsonl", _gpus(["x-prefill-0", "x-decode-0"], [300.0, 200.0]))
    write_events(tmp_path / "gpu_telemetry_events.jsonl", [
        {"type": "configured", "time_ns": T0 - 2 * S, "run_id": "r1", "counter_mode": "interpolated", "grace_ns": 0},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "start", "time_ns": T0},
        {"type": "phase", "name": "profiling", "kind": "profiling", "event": "end", "time_ns": T0 + 10 * S},
        {"type": "complete", "time_ns": T0 + 11 * S, "requests_end_ns": T0 + 10 * S, "collection_complete": True}])
    roles = ["--role", "prefill=llm/*-prefill-*", "--role", "decode=llm/*-decode-*"]
    cli = CliRunner()
    done = cli.invoke(main, ["report", "--jsonl", str(tmp_path / "gpu_telemetry_export.jsonl"), "--events",
                             str(tmp_path / "gpu_telemetry_events.jsonl"), *roles])
    assert done.exit_code == 0, done.output
    assert "report_differs" not in cli.invoke(main, ["validate", str(tmp_path), *roles]).output
    without = cli.invoke(main, ["validate", str(tmp_path)])
    assert without.exit_code == 1 and "/telemetry_data/roles" in without.output
