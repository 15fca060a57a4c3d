"""`dcgm-bridge profile --repeat N -- CMD`: the benchmark run N times, each run's telemetry kept apart (issue 45).

Repeat k (1-based) is a run of its own below the artifact folder, `run_NNNN/` (AIPerf's multi-run numbering): its
own session, run id (`<run id>-NNNN`), record log, events file and report, so "one run, one record" holds per
repeat. The artifact folder itself is locked once for the whole (bridge/sidecar/folder_lock.py), each repeat's
session locks its own sub-folder as any run does. AIPerf's `--artifact-dir X` becomes `X/run_NNNN` (added as the
repeat's folder when AIPerf was given none), so its files and the merged telemetry land per repeat; any other
command gets DCGM_BRIDGE_REPEAT (k) and DCGM_BRIDGE_REPEAT_DIR (the repeat's folder). A repeat that fails stops
the series: its exit code is the command's. `dcgm-bridge compare` reads the folder as a configuration's repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bridge.sidecar.aiperf import ARTIFACT_DIR, is_aiperf, option

REPEAT_ENV, REPEAT_DIR_ENV = "DCGM_BRIDGE_REPEAT", "DCGM_BRIDGE_REPEAT_DIR"


def repeat_folder(artifact_dir: Path, k: int) -> Path:
    return artifact_dir / f"run_{k:04d}"


def repeat_command(command: Sequence[str], k: int, folder: Path) -> list[str]:
    """The command of repeat k: AIPerf's artifact folder moved to its `run_NNNN/` (or set to `folder`); any other
    command as given."""
    args = list(command)
    if not is_aiperf(args):
        return args
    end = args.index("--") if "--" in args else len(args)  # AIPerf's own arguments end at a bare --
    out, rest = args[:end], args[end:]
    for position, arg in enumerate(out):
        found = option(arg, ARTIFACT_DIR)
        if found is None:
            continue
        name, inline = found
        if inline is not None:
            out[position] = f"{name}={repeat_folder(Path(inline), k)}"
            return out + rest
        if position + 1 < len(out):
            out[position + 1] = str(repeat_folder(Path(out[position + 1]), k))
            return out + rest
    return [*out, "--artifact-dir", str(folder), *rest]
