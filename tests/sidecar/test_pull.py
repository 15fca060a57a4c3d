"""The pull endpoint's text: the latest relabelled samples with run_id/phase, plus dcgm_bridge_* health."""

from __future__ import annotations

import subprocess

from prometheus_client.parser import text_string_to_metric_families

from bridge.parse import parse_page
from bridge.relabel import parse_config
from bridge.sidecar.pull import BridgeHealth, EndpointHealth, LatestPage, render_exposition
from tests.conftest import REAL_PAGES, require_binary
from tests.otlp.pages import dcgm_page

HEALTH = BridgeHealth(
    endpoints=[
        EndpointHealth("a:9400", scrapes=10, last_duration_s=0.004, errors={"timeout": 2, "http_status": 1})
    ],
    records_written=80,
    otlp={
        "queue_depth_points": 640,
        "sent_points": 3200,
        "sent_requests": 10,
        "retried_requests": 1,
        "dropped_points": 0,
        "rejected_points": 0,
    },
)


def families(text: bytes) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def samples(text: bytes) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value) for f in text_string_to_metric_families(text.decode()) for s in f.samples
    ]


def test_every_sample_gets_run_id_phase_and_its_endpoint():
    page = parse_page(dcgm_page(gpus=2, families=5))
    text = render_exposition([LatestPage("a:9400", page, "run-7", "profiling")], BridgeHealth())
    got = [s for s in samples(text) if s[0].startswith("DCGM")]
    assert len(got) == 10
    for _, labels, _ in got:
        assert (labels["run_id"], labels["phase"], labels["dcgm_endpoint"]) == (
            "run-7",
            "profiling",
            "a:9400",
        )
        assert labels["modelName"] == "NVIDIA H100 80GB HBM3"


def test_the_same_family_from_several_endpoints_is_written_under_one_type_line():
    pages = [
        LatestPage(ep, parse_page(dcgm_page(gpus=1, families=3, host=ep)), "r", "none")
        for ep in ("a:9400", "b:9400")
    ]
    text = render_exposition(pages, BridgeHealth()).decode()
    assert text.count("# TYPE DCGM_FI_DEV_SM_CLOCK gauge") == 1
    assert len([line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_SM_CLOCK{")]) == 2


def test_sentinels_are_left_out_and_relabel_rules_apply():
    (readme,) = [p for p in REAL_PAGES if "sentinel" in p.name]
    rules = parse_config([{"action": "labeldrop", "regex": "UUID"}])
    text = render_exposition(
        [LatestPage("a:9400", parse_page(readme.read_bytes()), "r", "warmup")],
        BridgeHealth(),
        relabel_config=rules,
    )
    got = samples(text)
    assert not [s for s in got if s[0] == "DCGM_FI_DEV_MEMORY_TEMP"]
    assert all("UUID" not in labels and "pod" not in labels for _, labels, _ in got)


def test_values_keep_their_precision_and_label_values_are_escaped():
    page = parse_page('A{model="a\\"b\\\\c"} 35.686\nB 5551899580\nC NaN\n')
    text = render_exposition([LatestPage("a:9400", page, "r", "none")], BridgeHealth())
    assert b'A{model="a\\"b\\\\c",run_id="r",phase="none",dcgm_endpoint="a:9400"} 35.686' in text
    assert b"} 5551899580\n" in text
    values = {name: value for name, _, value in samples(text)}
    assert values["A"] == 35.686 and values["C"] != values["C"]


def test_the_bridge_reports_its_own_health():
    got = {
        (name, tuple(sorted(labels.items()))): value
        for name, labels, value in samples(render_exposition([], HEALTH))
    }
    assert got[("dcgm_bridge_scrapes_total", (("endpoint", "a:9400"),))] == 10
    assert got[("dcgm_bridge_scrape_errors_total", (("endpoint", "a:9400"), ("kind", "timeout")))] == 2
    assert got[("dcgm_bridge_scrape_duration_seconds", (("endpoint", "a:9400"),))] == 0.004
    assert got[("dcgm_bridge_records_written_total", ())] == 80
    assert got[("dcgm_bridge_otlp_queue_depth_points", ())] == 640
    assert got[("dcgm_bridge_otlp_sent_points_total", ())] == 3200
    assert ("dcgm_bridge_otlp_dropped_points_total", ()) in got


def test_without_otlp_there_are_no_otlp_metrics():
    assert b"dcgm_bridge_otlp" not in render_exposition([], BridgeHealth(records_written=1))


def test_promtool_parses_the_exposition_and_finds_nothing_to_lint_in_our_own_metrics():
    promtool = require_binary("promtool")
    pages = [LatestPage("a:9400", parse_page(p.read_bytes()), "r", "profiling") for p in REAL_PAGES]
    check = [str(promtool), "check", "metrics"]
    full = subprocess.run(check, input=render_exposition(pages, HEALTH), capture_output=True, timeout=30)
    # Exit 3 = lint findings only: dcgm-exporter's own names (counters without _total, camelCase labels),
    # forwarded as written on purpose. Exit 1 would be a parse error.
    assert full.returncode in (0, 3) and b"error while linting" not in full.stderr, full.stderr
    ours = subprocess.run(check, input=render_exposition([], HEALTH), capture_output=True, timeout=30)
    assert ours.returncode == 0, ours.stdout + ours.stderr
