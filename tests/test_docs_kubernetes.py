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
