"""One configuration object, resolved once: flag > environment > YAML file (`--config`) > default.

AIPerf's `AIPERF_GPU_*` variables (AIPerf 0.13.0, ai-dynamo/aiperf `src/aiperf/common/environment.py`,
`_GPUSettings`) keep their meaning; our own settings use `DCGM_BRIDGE_*`. The YAML file is shaped like AIPerf's
`gpu_telemetry:` block, and our settings go in the same block under their own names (see `SETTINGS`). Every problem is
reported at once, sorted, naming the flag, variable or file key to fix.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bridge.endpoints import (
    DEFAULT_ENDPOINTS,
    TelemetryItemError,
    TelemetryItems,
    normalize_url,
    parse_default_endpoints,
    parse_items,
)
from bridge.errors import ConfigError as ConfigError
from bridge.samples import COUNTER_MODES, DEFAULT_COUNTER_MODE, CounterMode


@dataclass(frozen=True)
class Setting:
    name: str
    env: tuple[str, ...]
    parse: Callable[[str], Any]
    default: Any
    low: float | None = None
    high: float | None = None
    help: str = ""


_NAME_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def is_path_component(text: str, max_length: int) -> bool:
    """`text` can name a file or folder as it is: 1 to `max_length` letters, digits, '.', '_' and '-', starting
    with a letter or digit, never `..` or a `/` that would reach outside the folder it is put in."""
    return 0 < len(text) <= max_length and _NAME_CHARS.fullmatch(text) is not None and ".." not in text


def _run_id(text: str) -> str:
    """A run id names files and folders (the spool, the subfolder an earlier run's files move to)."""
    if not is_path_component(text, 128):
        raise ValueError(f"{text!r} is not a usable run id: use 1-128 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit (it names files and folders)")
    return text


_PREFIX_BYTES = 200  # + "_gpu_telemetry.jsonl.gz" (23) or mkstemp's ".<name>.XXXXXXXX.tmp" (19) ≤ NAME_MAX (255)


def _export_prefix(text: str) -> str:
    """The prefix names the outputs (`<prefix>.json`, `<prefix>_gpu_telemetry.jsonl`, …): a longer one would
    make every name over the 255 bytes a file system allows, and the run would lose its files at the end."""
    size = len(text.encode())
    if size > _PREFIX_BYTES:
        raise ValueError(f"a prefix of {size} bytes makes file names over the 255 bytes a file system allows; "
                         f"use at most {_PREFIX_BYTES}")
    return text


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def _list(text: str) -> list[str]:
    text = text.strip()
    if text.startswith("["):
        loaded = json.loads(text)
        if not isinstance(loaded, list):
            raise ValueError("expected a JSON list")
        return [str(x) for x in loaded]
    return [x.strip() for x in text.split(",") if x.strip()]


def _counter_mode(text: str) -> CounterMode:
    for mode in COUNTER_MODES:
        if text == mode:
            return mode
    raise ValueError(f"expected {' or '.join(COUNTER_MODES)}, got {text!r}")


SETTINGS: tuple[Setting, ...] = (
    Setting("collection_interval", ("AIPERF_GPU_COLLECTION_INTERVAL",), float, 0.333, 0.01, 300,
            "seconds between scrapes of each endpoint"),
    Setting("default_endpoints", ("AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS",), parse_default_endpoints,
            list(DEFAULT_ENDPOINTS), help="endpoints always probed (comma-separated or a JSON list)"),
    Setting("export_batch_size", ("AIPERF_GPU_EXPORT_BATCH_SIZE",), int, 100, 1, 1_000_000,
            "record-log lines buffered before a flush"),
    Setting("final_scrape_grace_ns", ("AIPERF_GPU_FINAL_SCRAPE_GRACE_NS",), int, 666_000_000, 0, 60e9,
            "trailing grace after the requests end, so the final scrape brackets the window"),
    Setting("final_refresh_wait", ("DCGM_BRIDGE_FINAL_REFRESH_WAIT",), float, 35.0, 0, 300,
            "seconds the end of a run may wait for a slow exporter's next refresh, which brackets the window's "
            "end (0: never)"),
    Setting("reachability_timeout", ("AIPERF_GPU_REACHABILITY_TIMEOUT",), float, 10.0, 0.05, 300,
            "seconds the configure-time probe waits for each endpoint"),
    Setting("shutdown_delay", ("AIPERF_GPU_SHUTDOWN_DELAY",), float, 5.0, 0, 300,
            "seconds allowed for the final scrape and flush at shutdown"),
    Setting("scrape_timeout", ("DCGM_BRIDGE_SCRAPE_TIMEOUT", "AIPERF_HTTP_METRICS_SCRAPE_READ_TIMEOUT"), float,
            5.0, 0.01, 300, "time limit of one scrape, connect included (seconds)"),
    Setting("connect_timeout", ("DCGM_BRIDGE_CONNECT_TIMEOUT",), float, 2.0, 0.01, 60,
            "connect timeout of one scrape (seconds)"),
    Setting("max_body_bytes", ("DCGM_BRIDGE_MAX_BODY_BYTES",), int, 16 * 1024 * 1024, 1024, 2**31,
            "largest /metrics body accepted"),
    Setting("max_series", ("DCGM_BRIDGE_MAX_SERIES",), int, 20_000, 1, 1_000_000,
            "samples read from one page; the rest are dropped and counted"),
    Setting("max_gpus", ("DCGM_BRIDGE_MAX_GPUS",), int, 1024, 1, 1_000_000,
            "GPU identities (UUID x MIG instance) per endpoint and run; records of more are dropped and counted"),
    Setting("ca_file", ("DCGM_BRIDGE_CA_FILE",), str, None, help="CA bundle for https exporters"),
    Setting("insecure_skip_verify", ("DCGM_BRIDGE_INSECURE_SKIP_VERIFY",), _bool, False),
    Setting("bearer_token", ("DCGM_BRIDGE_BEARER_TOKEN",), str, None, help="sent as Authorization: Bearer"),
    Setting("bearer_token_file", ("DCGM_BRIDGE_BEARER_TOKEN_FILE",), str, None),
    Setting("basic_auth_user", ("DCGM_BRIDGE_BASIC_AUTH_USER",), str, None),
    Setting("basic_auth_password_file", ("DCGM_BRIDGE_BASIC_AUTH_PASSWORD_FILE",), str, None),
    Setting("run_id", ("DCGM_BRIDGE_RUN_ID",), lambda text: _run_id(text), None,
            help="run id on every record and OTLP point"),
    Setting("artifact_dir", ("DCGM_BRIDGE_ARTIFACT_DIR",), str, "artifacts"),
    Setting("profile_export_prefix", ("DCGM_BRIDGE_PROFILE_EXPORT_PREFIX",), _export_prefix, None),
    Setting("record_log_gzip", ("DCGM_BRIDGE_RECORD_LOG_GZIP",), _bool, False),
    Setting("flush_interval", ("DCGM_BRIDGE_FLUSH_INTERVAL",), float, 1.0, 0.0, 60,
            "seconds between record-log flushes (what a kill can lose at most)"),
    Setting("counter_mode", ("DCGM_BRIDGE_COUNTER_MODE",), _counter_mode, DEFAULT_COUNTER_MODE),
    # All addresses: the `sidecar` command runs in a pod, where the kubelet's probes and Prometheus reach the
    # pod IP (the NetworkPolicy decides who may). `profile` (a workstation) listens on loopback instead.
    Setting("health_host", ("DCGM_BRIDGE_HEALTH_HOST",), str, "0.0.0.0",
            help="address the `sidecar` command's control API listens on (all: probes reach the pod IP)"),
    Setting("health_port", ("DCGM_BRIDGE_HEALTH_PORT",), int, 8086, 0, 65535),
    Setting("control_allow", ("DCGM_BRIDGE_CONTROL_ALLOW",), _list, ["127.0.0.1/8", "::1/128"],
            help="client networks allowed to POST /phases and /complete"),
    Setting("control_token_file", ("DCGM_BRIDGE_CONTROL_TOKEN_FILE",), str, None,
            help="the control token (POST needs Authorization: Bearer <it>); made and written there when absent"),
    Setting("control_protect_reads", ("DCGM_BRIDGE_CONTROL_PROTECT_READS",), _bool, False,
            help="/status and /metrics also need the control token (/healthz and /readyz never do)"),
    Setting("phase_manifest", ("DCGM_BRIDGE_PHASE_MANIFEST",), str, None,
            help="AIPerf phase_manifest.json (or a folder to search) to take the phases from"),
    Setting("done_file", ("DCGM_BRIDGE_DONE_FILE",), str, None,
            help="complete when this file appears (legacy sidecar)"),
    Setting("exit_on_complete", ("DCGM_BRIDGE_EXIT_ON_COMPLETE",), _bool, True,
            help="exit after POST /complete; false for a native sidecar, which the kubelet would restart"),
)
_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Config:
    enabled: bool = True
    telemetry: TelemetryItems = field(default_factory=TelemetryItems)
    collection_interval: float = 0.333
    default_endpoints: list[str] = field(default_factory=lambda: list(DEFAULT_ENDPOINTS))
    export_batch_size: int = 100
    final_scrape_grace_ns: int = 666_000_000
    final_refresh_wait: float = 35.0
    reachability_timeout: float = 10.0
    shutdown_delay: float = 5.0
    scrape_timeout: float = 5.0
    connect_timeout: float = 2.0
    max_body_bytes: int = 16 * 1024 * 1024
    max_series: int = 20_000
    max_gpus: int = 1024
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    bearer_token: str | None = None
    bearer_token_file: str | None = None
    basic_auth_user: str | None = None
    basic_auth_password_file: str | None = None
    run_id: str | None = None
    artifact_dir: str = "artifacts"
    profile_export_prefix: str | None = None
    record_log_gzip: bool = False
    flush_interval: float = 1.0
    counter_mode: CounterMode = DEFAULT_COUNTER_MODE
    health_host: str = "0.0.0.0"  # the `sidecar` command in a pod: all addresses (see its Setting above)
    health_port: int = 8086
    control_allow: list[str] = field(default_factory=lambda: ["127.0.0.1/8", "::1/128"])
    control_token_file: str | None = None
    control_protect_reads: bool = False
    phase_manifest: str | None = None
    done_file: str | None = None
    exit_on_complete: bool = True
    gpu_pods: tuple[str, ...] = ()  # --gpu-pods NAMESPACE/GLOB: the report counts only these pods' GPUs
    roles: tuple[str, ...] = ()  # --role NAME=NAMESPACE/GLOB: serving roles in the report (bridge/roles.py)
    default_endpoints_named: bool = False  # AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS (or the file's key) was given

    def effective_run_id(self) -> str:
        return self.run_id or _generated_run_id()

    def uncredentialed_urls(self) -> frozenset[str]:
        """The built-in localhost defaults nobody named: the exporter token and basic-auth pair are never sent
        there (any local process, or any container in the pod, may listen on localhost:9400). Credentials go
        to what the user named: --gpu-telemetry, --config, AIPERF_GPU_DEFAULT_DCGM_ENDPOINTS, k8s:// and
        discovered endpoints."""
        named = set(self.telemetry.urls)
        if self.default_endpoints_named:
            named.update(normalize_url(url) for url in self.default_endpoints)
        return frozenset(normalize_url(url) for url in DEFAULT_ENDPOINTS) - named


_RUN_ID: list[str] = []


def _generated_run_id() -> str:
    if not _RUN_ID:
        _RUN_ID.append(uuid.uuid4().hex[:12])
    return _RUN_ID[0]


def load_yaml(path: Path) -> dict[str, Any]:
    """The `gpu_telemetry:` block of a YAML file (or the whole file when it has no such key)."""
    import yaml  # lazy: start-up cost matters under a 25m CPU limit

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--config {path}: cannot read it: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {path}: expected a mapping with a gpu_telemetry: block")
    block = loaded.get("gpu_telemetry", loaded)
    if isinstance(block, str):  # AIPerf: a bare string is one URL
        block = {"urls": [block]}
    if not isinstance(block, dict):
        raise ConfigError(f"--config {path}: gpu_telemetry must be a mapping")
    if "gpu_telemetry" in loaded:
        # Keys beside the block would be ignored: report them with the block's own problems (resolve()).
        outside = sorted(str(k) for k in loaded if k != "gpu_telemetry")
        return {**block, **({_OUTSIDE: outside} if outside else {})}
    return dict(block)


def resolve(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
            config_file: Path | None = None) -> Config:
    """Build the Config. `flags` holds only the options the user gave (None = not given)."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    env = os.environ if env is None else env
    file_values = load_yaml(config_file) if config_file else {}
    errors: list[str] = []
    values: dict[str, Any] = {}
    errors.extend(_file_key_problems(file_values, config_file))
    for setting in SETTINGS:
        value, source = _lookup(setting, flags, env, file_values, config_file)
        if source is None:
            continue
        try:
            parsed = setting.parse(value) if isinstance(value, str) else value
            if setting.parse in (int, float) and not isinstance(parsed, bool):
                parsed = setting.parse(parsed)
            _check_range(setting, parsed)
        except (ValueError, TypeError, TelemetryItemError, json.JSONDecodeError) as exc:
            errors.append(f"{source}: {exc}")
            continue
        values[setting.name] = parsed
    enabled, telemetry = _telemetry(flags, file_values, config_file, errors)
    errors.extend(_unreadable_secret_files(values))
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(sorted(errors)))
    return Config(enabled=enabled, telemetry=telemetry, default_endpoints_named="default_endpoints" in values,
                  **values)


_OUTSIDE = "\0outside"  # load_yaml's note of the top-level keys beside gpu_telemetry:
_FILE_ONLY_KEYS = frozenset({"urls", "url", "metrics_file", "collector", "mode", "enabled"})
_MODES = ("summary", "realtime_dashboard")  # AIPerf's gpu_telemetry.mode


def _file_key_problems(file_values: Mapping[str, Any], config_file: Path | None) -> list[str]:
    """Every unknown key, inside or beside gpu_telemetry:, and an invalid mode, all at once."""
    known = {f.name for f in fields(Config)} - {"default_endpoints_named"} | _FILE_ONLY_KEYS
    problems = [f"--config {config_file}: unknown key {key!r} beside gpu_telemetry: (settings go inside the block)"
                for key in file_values.get(_OUTSIDE, [])]
    problems += [f"--config {config_file}: unknown key gpu_telemetry.{key}"
                 for key in sorted(map(str, file_values)) if key != _OUTSIDE and key not in known]
    mode = file_values.get("mode")
    if mode is not None and mode not in _MODES:
        problems.append(f"--config {config_file}: gpu_telemetry.mode {mode!r} is not one of {', '.join(_MODES)}")
    return problems


def _unreadable_secret_files(values: Mapping[str, Any]) -> list[str]:
    """A token or password file that cannot be read is a configuration error now, not a failed scrape later."""
    problems = []
    for name in ("bearer_token_file", "basic_auth_password_file"):
        path = values.get(name)
        if not path:
            continue
        try:
            Path(path).read_bytes()
        except OSError as exc:
            setting = next(s for s in SETTINGS if s.name == name)
            problems.append(f"{setting.env[0]} / --{name.replace('_', '-')} {path}: cannot read it "
                            f"({exc.strerror or exc}); mount the secret or fix the path")
    return problems


def _lookup(setting: Setting, flags: Mapping[str, Any], env: Mapping[str, str], file_values: Mapping[str, Any],
            config_file: Path | None) -> tuple[Any, str | None]:
    if setting.name in flags:
        return flags[setting.name], f"--{setting.name.replace('_', '-')}"
    for var in setting.env:
        if var in env:
            return env[var], var
    if setting.name in file_values:
        return file_values[setting.name], f"--config {config_file}: gpu_telemetry.{setting.name}"
    return None, None


def _check_range(setting: Setting, value: Any) -> None:
    if setting.low is not None and value < setting.low:
        raise ValueError(f"{value} is below the minimum {setting.low:g}")
    if setting.high is not None and value > setting.high:
        raise ValueError(f"{value} is above the maximum {setting.high:g}")


def _telemetry(flags: Mapping[str, Any], file_values: Mapping[str, Any], config_file: Path | None,
               errors: list[str]) -> tuple[bool, TelemetryItems]:
    items: list[str] = []
    file_urls = file_values.get("urls", file_values.get("url", []))
    if isinstance(file_urls, str):
        file_urls = [file_urls]
    if "gpu_telemetry" in flags:
        items = list(flags["gpu_telemetry"])
    else:
        items = [str(u) for u in file_urls]
        if file_values.get("metrics_file"):
            items.append(str(file_values["metrics_file"]))
        if file_values.get("mode") == "realtime_dashboard":
            items.append("dashboard")
    no_telemetry = bool(flags.get("no_gpu_telemetry"))
    if no_telemetry and flags.get("gpu_telemetry"):
        errors.append("--gpu-telemetry and --no-gpu-telemetry: give one or the other")
    enabled = not no_telemetry and file_values.get("enabled", True) is not False
    try:
        return enabled, parse_items(items)
    except TelemetryItemError as exc:
        errors.append(str(exc))
        return enabled, TelemetryItems()


def describe_settings() -> list[tuple[str, str, str]]:
    """(name, variables, default) rows for `--help` and the README."""
    return [(s.name, ", ".join(s.env), repr(s.default)) for s in SETTINGS]


def env_names() -> Sequence[str]:
    return [var for s in SETTINGS for var in s.env]
