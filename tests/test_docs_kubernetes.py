"""docs/kubernetes.md says what `kube profile --dry-run` prints (issue 33 item 7: the grace period)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from bridge.kube.cli import kube

DOC = Path(__file__).parent.parent / "docs" / "kubernetes.md"


def test_the_grace_period_in_the_guide_is_the_one_dry_run_prints() -> None:
    text = " ".join(DOC.read_text().split())
    said = re.search(r"`--duration` \(default 600 s\): (\d+) s for one 8-GPU endpoint at 25m", text)
    assert said, "the guide no longer states the grace period in the form this test reads"
    result = CliRunner().invoke(kube, ["profile", "--model", "m", "--url", "http://frontend:8000", "--job-id",
                                       "bench-1", "--dry-run", "--gpu-telemetry", "node-a:9400"])
    assert result.exit_code == 0, result.output
    jobset = next(yaml.safe_load_all(result.stdout))
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert int(said.group(1)) == pod["terminationGracePeriodSeconds"]


def test_the_guides_table_of_sidecar_resources_is_what_the_model_gives() -> None:
    from bridge.kube.estimate import sidecar_model

    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in DOC.read_text().splitlines() if line.startswith(("| CPU use", "| memory peak"))}
    header = next(line for line in DOC.read_text().splitlines() if line.startswith("| endpoints × 8 GPUs"))
    endpoints = [int(c) for c in header.split("|")[2:-1]]
    assert rows.keys() == {"CPU use → given", "memory peak → given"}, "the guide's table changed its form"
    for column, count in enumerate(endpoints):
        model = sidecar_model(endpoints=count, gpus_per_endpoint=8, collection_interval_s=0.333, otlp=True)
        assert rows["CPU use → given"][column] == f"{model.cpu_m:.0f}m → {model.cpu_quantity}"
        assert rows["memory peak → given"][column] == f"{model.memory_mib:.0f} MiB → {model.memory_quantity}"
