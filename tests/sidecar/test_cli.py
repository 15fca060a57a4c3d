"""The sidecar command's start-up cost."""

from __future__ import annotations

from click.testing import CliRunner

from bridge.cli import main


def test_the_sidecar_command_does_not_import_the_simulator_or_the_kube_code():
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from bridge.cli import main; "
            "CliRunner().invoke(main, ['sidecar', '--help']); "
            "heavy = ('bridge.kube', 'bridge.simulator', 'bridge.report'); "
            "print(sorted(m for m in sys.modules if m.startswith(heavy)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert CliRunner().invoke(main, ["kube", "--help"]).exit_code == 0
