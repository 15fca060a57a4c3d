"""The `dcgm-bridge` command. Subcommands import their heavy parts lazily: the sidecar starts under a
25m CPU limit, and `--help` should never pay for numpy, rich or the OTLP SDK."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bridge import __version__

if TYPE_CHECKING:
    from bridge.samples import GpuMeta, Sample


def _setup_logging(verbose: int) -> None:
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _version(ctx: click.Context, wanted: bool) -> None:
    if not wanted or ctx.resilient_parsing:
        return
    from bridge.kernel import COMPILED

    path = "compiled per-page kernel" if COMPILED else "pure-Python per-page path (bridge._kernel not built)"
    click.echo(f"dcgm-bridge {__version__} ({path})")
    ctx.exit()


class _LazyGroup(click.Group):
    """Commands from other packages are imported only when they run (or when --help lists them), so
    `dcgm-bridge sidecar` under a 25m CPU limit never pays for the simulator or the kube code."""

    lazy = {"sidecar": "bridge.sidecar.cli:sidecar", "profile": "bridge.sidecar.cli:profile",
            "demo": "bridge.sidecar.cli:demo", "simulate": "bridge.simulator.cli:simulate",
            "report": "bridge.report.cli:report", "kube": "bridge.kube.cli:kube",
            "validate": "bridge.report.validate:validate", "compare": "bridge.report.compare_cli:compare_command"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            from importlib import import_module

            module, _, attr = self.lazy[name].partition(":")
            command: click.Command = getattr(import_module(module), attr)
            return command
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> Any:
        """The one place a `BridgeError` or a usage error becomes a message: one line (or its listed problems), no
        traceback; exit 2 for usage and configuration, the error's own code for Kubernetes, else 1 (README "Exit
        codes")."""
        from bridge.errors import BridgeError, ConfigError, KubeError

        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # click's own would print three lines: usage, a hint, then the error
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            click.echo(f"Error: {exc.format_message()} (see {where} --help)", err=True)
            ctx.exit(2)
        except BridgeError as exc:
            click.echo(f"Error: {exc}", err=True)
            code = 2 if isinstance(exc, ConfigError) else exc.exit_code if isinstance(exc, KubeError) else 1
            ctx.exit(code)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=lambda ctx, _param, value: _version(ctx, value),
              help="Show the version and which per-page path runs (compiled kernel or pure Python), and exit.")
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
def main(verbose: int) -> None:
    """GPU telemetry for LLM benchmark runs: scrape dcgm-exporter, record, report, forward as OTLP."""
    _setup_logging(verbose)


# -- parse -------------------------------------------------------------------------------------------
def _json_value(value: float) -> float | str | None:
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return value


@main.command()
@click.argument("source")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: samples, dropped lines, normalised GPUs.")
@click.option("--metrics-csv", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="Custom-metrics CSV (dcgm-exporter format) to map extra fields.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The sidecar's YAML settings (TLS, auth, timeouts), as with `sidecar --config`.")
def parse(source: str, as_json: bool, metrics_csv: tuple[str, ...], config_file: Path | None) -> None:
    """Show what the bridge sees in one page: SOURCE is a file, - for stdin, or a URL.

    A URL is fetched exactly as the sidecar fetches it: the same TLS, auth and timeout settings, from
    the same environment variables (DCGM_BRIDGE_CA_FILE, DCGM_BRIDGE_BEARER_TOKEN_FILE, …) or --config."""
    from bridge.fields import default_table, dialect_summary, spec_for_family, table_with_custom
    from bridge.normalize import Normalizer, meta_of
    from bridge.parse import parse_page
    from bridge.recognize import no_gpu_reason, unsupported_energy
    from bridge.record_log import record_to_dict

    body, origin = read_parse_source(source, config_file)
    table = table_with_custom(default_table(), list(metrics_csv))
    page = parse_page(body)
    reason = no_gpu_reason(page, body, table) if body.strip() else None
    if reason is not None:
        from bridge.errors import ConfigError

        raise ConfigError(f"parse {origin}: {reason}")
    normalizer = Normalizer(table)
    records = normalizer.records(page, source_url=origin, timestamp_ns=0)
    # A GPU's series whose family the report does not map (AMD's pcie_tx, gpu_clock, …) is forwarded, not reported.
    unmapped = [s for s in page.samples if spec_for_family(table, s.name) is None and meta_of(s.labels) is not None]
    summary = dialect_summary((s.name for s in page.samples), table, also_unmapped=(s.name for s in unmapped))
    if as_json:
        out = {
            "samples": [{"name": s.name, "labels": dict(s.labels), "value": _json_value(s.value),
                         "timestamp_ms": s.timestamp_ms} for s in page.samples],
            "dropped": [{"line": d.line, "text": d.text, "reason": d.reason} for d in page.dropped],
            "gpus": [{k: v for k, v in record_to_dict(r).items() if k != "timestamp_ns"} for r in records],
            "families": {name: {"dialect": d, "key": k} for name, (d, k) in summary.mapped.items()},
            "unmapped": list(summary.unmapped),
            "warnings": [*(a.message() for a in normalizer.take_anomalies()), *unsupported_energy(records)],
        }
        click.echo(json.dumps(out, indent=2, ensure_ascii=False))
        return
    families = list(dict.fromkeys(s.name for s in page.samples))
    from bridge.report.telemetry_data import gpus_text

    gpus = gpus_text((origin, r) for r in records)
    click.echo(f"{origin}: {len(page.samples)} samples in {len(families)} families, "
               f"{len(page.dropped)} lines dropped, {gpus}")
    for d in page.dropped:
        click.echo(f"  dropped line {d.line}: {d.reason}: {d.text[:100]}")
    click.echo("families, by the exporter that writes the name:")
    for line in summary.lines():
        click.echo(line)
    for anomaly in normalizer.take_anomalies():
        click.echo(f"  warning: {anomaly.message()}")
    for warning in unsupported_energy(records):
        click.echo(f"  warning: {warning}")
    for r in records:
        click.echo(_gpu_line(r))
        for key, value in r.telemetry_data.items():
            spec = table.by_key.get(key)
            click.echo(f"      {spec.label if spec else key:<45} {value:,.6g}")
    by_gpu: dict[tuple[str, str | None], list[Sample]] = {}
    metas: dict[tuple[str, str | None], GpuMeta] = {}
    for s in unmapped:
        meta = meta_of(s.labels)
        assert meta is not None
        metas.setdefault(meta.identity, meta)
        by_gpu.setdefault(meta.identity, []).append(s)
    if by_gpu:
        click.echo("series of GPUs in families not mapped (forwarded, not in the report):")
    for identity, samples in by_gpu.items():
        click.echo(_gpu_line(metas[identity]))
        for s in samples:
            extra = ",".join(f"{k}={v}" for k, v in s.labels.items() if k.endswith(("_index", "_type")) and
                             k not in ("gpu_compute_partition_type", "gpu_memory_partition_type"))
            click.echo(f"      {s.name + (f'{{{extra}}}' if extra else ''):<45} {s.value:,.6g}")


def _gpu_line(meta: GpuMeta) -> str:
    """A GPU's line in `parse`: index, identity, its MIG instance or AMD partition, model, host."""
    part = ""
    if meta.gpu_instance_id is not None:
        noun = "partition" if meta.platform == "amd" else "MIG"
        part = f" {noun} {meta.gpu_instance_id} ({meta.gpu_instance_profile})"
    return f"  GPU {meta.gpu_index} {meta.gpu_uuid}{part} {meta.gpu_model_name or '(no model name)'} " \
           f"host={meta.hostname or '-'}"


def read_parse_source(source: str, config_file: Path | None) -> tuple[bytes, str]:
    """`parse`'s page and where it came from: stdin (-), a file, or a URL fetched with the sidecar's settings."""
    import sys

    if source == "-":
        return sys.stdin.buffer.read(), "<stdin>"
    if Path(source).exists():
        from bridge.errors import ConfigError

        if Path(source).is_dir():
            raise ConfigError(f"parse {source!r} is a folder; give one page: a file, - for stdin, or a URL")
        try:
            return Path(source).read_bytes(), source
        except OSError as exc:
            raise ConfigError(f"parse {source!r}: cannot read it ({exc.strerror or exc})") from None
    if not (source.lower().startswith("http") or ":" in source):
        from bridge.errors import ConfigError

        raise ConfigError(f"parse {source!r}: no such file, and not a URL (expected a file, -, host:port or "
                          "http://host:9400/metrics)")
    return fetch_like_the_sidecar(source, config_file)


def fetch_like_the_sidecar(source: str, config_file: Path | None) -> tuple[bytes, str]:
    from bridge.config import resolve
    from bridge.endpoints import normalize_url
    from bridge.fetch import FetchError, make_fetcher
    from bridge.redact import redact_url
    from bridge.sidecar.session import fetch_settings

    url = normalize_url(source, flag="parse")
    fetcher = make_fetcher(fetch_settings(resolve({}, config_file=config_file)))
    try:
        return fetcher.fetch(url).body, redact_url(url)
    except FetchError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        fetcher.close()


if __name__ == "__main__":
    main()
