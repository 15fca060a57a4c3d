"""What `profile` knows about AIPerf 0.13 when it wraps it: its command line and the files it writes.

Plain functions over the argument list and the artifact directory (read in the 0.13.0 wheel):

- `--gpu-telemetry ITEM…` (cyclopts `consume_multiple`: values up to the next `-` token) and
  `--no-gpu-telemetry` are taken out of AIPerf's arguments; the items become the bridge's and AIPerf
  gets `--no-gpu-telemetry`, so only one tool scrapes and writes `telemetry_data`.
- `--artifact-dir`/`--output-artifact-dir` is AIPerf's folder as given; without it AIPerf writes to
  `./artifacts/<model>-<service>-<endpoint>-<stimulus>/` (config/resolution/resolvers.py).
  `--profile-export-prefix`/`--profile-export-file` names its files `<base>.json`/`<base>.csv`, the
  directory part of an absolute path dropped and known suffixes stripped (config/artifacts.py).
- `--ui`/`--ui-type`: its default on a terminal is the full-screen dashboard.
- After the run: `phase_manifest.json` only when the run had more than one phase (warmup +
  profiling); otherwise, and when it was cancelled before writing one, the profiling window is the
  JSON's `start_time`/`end_time` (naive local time, µs) and `was_cancelled` says how it ended.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bridge.report.window import MANIFEST_FILE, Phase, WindowError, load_manifest, phase_from_document

logger = logging.getLogger(__name__)

DEFAULT_ROOT = Path("artifacts")  # AIPerf's default artifact root, relative to its working directory
ARTIFACT_DIR = ("--artifact-dir", "--output-artifact-dir")
_PREFIX = ("--profile-export-prefix", "--profile-export-file")
_UI = ("--ui", "--ui-type")
# config/artifacts.py _PREFIX_SUFFIXES_TO_STRIP, longest first
_PREFIX_SUFFIXES = ("_server_metrics.parquet", "_server_metrics.jsonl", "_server_metrics.json",
                    "_server_metrics.csv", "_network_latency.jsonl", "_gpu_telemetry.jsonl", "_timeslices.csv",
                    "_timeslices.json", "_console.txt", "_raw.jsonl", ".parquet", ".csv", ".json", ".jsonl")


def is_aiperf(command: Sequence[str]) -> bool:
    if not command:
        return False
    program = Path(command[0]).name
    return program == "aiperf" or (program.startswith("python") and list(command[1:3]) == ["-m", "aiperf"])


@dataclass(frozen=True)
class AiperfCommand:
    """AIPerf's command line as `profile` runs it, and what was read from it."""

    argv: list[str]  # what runs: telemetry flags removed, --no-gpu-telemetry added (and --ui simple if asked)
    telemetry_items: list[str] = field(default_factory=list)  # from its --gpu-telemetry
    had_no_gpu_telemetry: bool = False
    artifact_dir: Path | None = None  # its --artifact-dir, as given
    prefix: str | None = None  # its --profile-export-prefix, as it resolves it (the base name)
    ui: str | None = None  # its --ui, when given

    @property
    def json_name(self) -> str:
        return f"{self.prefix}.json" if self.prefix else "profile_export_aiperf.json"

    @property
    def csv_name(self) -> str:
        return f"{self.prefix}.csv" if self.prefix else "profile_export_aiperf.csv"

    def with_simple_ui(self) -> AiperfCommand:
        return AiperfCommand([*self.argv, "--ui", "simple"], self.telemetry_items, self.had_no_gpu_telemetry,
                             self.artifact_dir, self.prefix, "simple")


def option(arg: str, names: Sequence[str]) -> tuple[str, str | None] | None:
    """(name, inline value) when `arg` is one of `names`, as `--name` or `--name=value`."""
    for name in names:
        if arg == name:
            return name, None
        if arg.startswith(name + "="):
            return name, arg[len(name) + 1:]
    return None


def prefix_base(value: str) -> str:
    """AIPerf's base file name for a --profile-export-prefix value."""
    path = Path(value)
    base = path.name if path.is_absolute() else value
    for suffix in _PREFIX_SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def parse_command(command: Sequence[str]) -> AiperfCommand:
    """Read AIPerf's arguments and take its GPU telemetry flags over."""
    argv: list[str] = []
    items: list[str] = []
    no_telemetry = False
    artifact_dir: Path | None = None
    prefix: str | None = None
    ui: str | None = None
    args = list(command)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            argv.extend(args[i - 1:])
            break
        telemetry = option(arg, ("--gpu-telemetry",))
        if telemetry is not None:
            if telemetry[1] is not None:
                items.append(telemetry[1])
            while i < len(args) and not args[i].startswith("-"):
                items.append(args[i])
                i += 1
            continue
        if arg == "--no-gpu-telemetry":
            no_telemetry = True
            continue
        argv.append(arg)
        for names in (ARTIFACT_DIR, _PREFIX, _UI):
            found = option(arg, names)
            if found is None:
                continue
            value = found[1]
            if value is None and i < len(args):
                value = args[i]
                argv.append(value)
                i += 1
            if value is None:
                break
            if names is ARTIFACT_DIR:
                artifact_dir = Path(value)
            elif names is _PREFIX:
                prefix = prefix_base(value)
            else:
                ui = value
            break
    split = [part.strip() for item in items for part in item.split(",") if part.strip()]
    argv.append("--no-gpu-telemetry")
    return AiperfCommand(argv, split, no_telemetry, artifact_dir, prefix, ui)


@dataclass(frozen=True)
class AiperfOutputs:
    """The files one AIPerf run wrote."""

    directory: Path
    json_path: Path
    csv_path: Path
    manifest: Path | None


def find_outputs(command: AiperfCommand, roots: Sequence[Path], since_ns: int, cwd: Path | None = None,
                 ) -> AiperfOutputs | None:
    """AIPerf's folder for this run: its --artifact-dir, else the newest folder below `roots` (and AIPerf's
    default ./artifacts) holding its JSON written since `since_ns`. None when it wrote none."""
    base = cwd or Path.cwd()
    if command.artifact_dir is not None:
        directory = command.artifact_dir if command.artifact_dir.is_absolute() else base / command.artifact_dir
        candidates = [directory / command.json_name]
    else:
        candidates = []
        for root in [*roots, base / DEFAULT_ROOT]:
            if root.is_dir():
                candidates.extend(root.rglob(command.json_name))
    fresh = [p for p in candidates if _written_since(p, since_ns)]
    if not fresh:
        return None
    return _outputs_of(command, max(fresh, key=lambda p: p.stat().st_mtime_ns), since_ns)


def find_profile_runs(command: AiperfCommand, root: Path, since_ns: int, cwd: Path | None = None,
                      ) -> list[AiperfOutputs]:
    """AIPerf's multi-run layout (`--num-profile-runs N`: `<base>/profile_runs/run_NNNN/`, no JSON at `<base>`,
    aiperf/orchestrator/orchestrator.py): each run's files written since `since_ns`, in run order. `<base>` is its
    --artifact-dir, else `root` (the bridge's)."""
    base = cwd or Path.cwd()
    directory = command.artifact_dir or root
    directory = directory if directory.is_absolute() else base / directory
    return [_outputs_of(command, json_path, since_ns)
            for json_path in sorted((directory / "profile_runs").glob(f"run_[0-9]*/{command.json_name}"))
            if not json_path.is_symlink() and _written_since(json_path, since_ns)]


def _outputs_of(command: AiperfCommand, json_path: Path, since_ns: int) -> AiperfOutputs:
    """The files of the run whose JSON is `json_path`: its CSV beside it, its phase manifest if written since."""
    directory = json_path.parent
    manifest = directory / MANIFEST_FILE
    return AiperfOutputs(directory, json_path, directory / command.csv_name,
                         manifest if _written_since(manifest, since_ns) else None)


def _written_since(path: Path, since_ns: int) -> bool:
    try:
        # Filesystem times are coarser than the clock (and may lag it by a tick): a second of slack.
        return path.is_file() and path.stat().st_mtime_ns >= since_ns - 1_000_000_000
    except OSError:
        return False


@dataclass(frozen=True)
class AiperfResult:
    """How the run ended and which window it measured, from its files."""

    phases: list[Phase]
    was_cancelled: bool
    document: dict[str, Any] | None  # its profile_export JSON


def read_result(outputs: AiperfOutputs) -> AiperfResult:
    document = _read_json(outputs.json_path)
    cancelled = bool(document.get("was_cancelled")) if document else False
    phases: list[Phase] = []
    if outputs.manifest is not None:
        try:
            phases = load_manifest(outputs.manifest)
        except WindowError as exc:
            logger.warning("%s", exc)
    if not phases and document:
        phase = phase_from_document(document)
        if phase is not None:
            phases = [phase]
    cancelled = cancelled or any(p.was_cancelled for p in phases if p.kind == "profiling")
    return AiperfResult(phases, cancelled, document)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        logger.warning("cannot read %s: %s", path, exc)
        return None
    return doc if isinstance(doc, dict) else None
