"""The `dcgm-bridge` command. Subcommands import their heavy parts lazily: the sidecar starts under a
25m CPU limit, and `--help` should never pay for numpy, rich or the OTLP SDK."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import click

from bridge import __version__


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
            "validate": "bridge.report.validate:validate"}

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
    from bridge.fields import default_table, dialect_summary, table_with_custom
    from bridge.normalize import Normalizer
    from bridge.parse import parse_page
    from bridge.record_log import record_to_dict
    from bridge.report.console import plural

    body, origin = read_parse_source(source, config_file)
    table = table_with_custom(default_table(), list(metrics_csv))
    page = parse_page(body)
    if not page.samples and body.strip():
        from bridge.errors import ConfigError

        raise ConfigError(f"parse {origin}: not a metrics page: no sample in its {plural(len(page.dropped), 'line')} "
                          f"({page_kind(body)}); give a dcgm-exporter /metrics URL or a page it served")
    normalizer = Normalizer(table)
    records = normalizer.records(page, source_url=origin, timestamp_ns=0)
    summary = dialect_summary((s.name for s in page.samples), table)
    if as_json:
        out = {
            "samples": [{"name": s.name, "labels": dict(s.labels), "value": _json_value(s.value),
                         "timestamp_ms": s.timestamp_ms} for s in page.samples],
            "dropped": [{"line": d.line, "text": d.text, "reason": d.reason} for d in page.dropped],
            "gpus": [{k: v for k, v in record_to_dict(r).items() if k != "timestamp_ns"} for r in records],
            "families": {name: {"dialect": d, "key": k} for name, (d, k) in summary.mapped.items()},
            "unmapped": list(summary.unmapped),
            "warnings": [a.message() for a in normalizer.take_anomalies()],
        }
        click.echo(json.dumps(out, indent=2, ensure_ascii=False))
        return
    families = list(dict.fromkeys(s.name for s in page.samples))
    from bridge.report.telemetry_data import gpus_text

    gpus = gpus_text((origin, (r.gpu_uuid, r.gpu_instance_id)) for r in records)
    click.echo(f"{origin}: {len(page.samples)} samples in {len(families)} families, "
               f"{len(page.dropped)} lines dropped, {gpus}")
    for d in page.dropped:
        click.echo(f"  dropped line {d.line}: {d.reason}: {d.text[:100]}")
    click.echo("families, by the exporter that writes the name:")
    for line in summary.lines():
        click.echo(line)
    for anomaly in normalizer.take_anomalies():
        click.echo(f"  warning: {anomaly.message()}")
    for r in records:
        mig = f" MIG {r.gpu_instance_id} ({r.gpu_instance_profile})" if r.gpu_instance_id else ""
        click.echo(f"  GPU {r.gpu_index} {r.gpu_uuid}{mig} {r.gpu_model_name or '(no model name)'} "
                   f"host={r.hostname or '-'}")
        for key, value in r.telemetry_data.items():
            spec = table.by_key.get(key)
            click.echo(f"      {spec.label if spec else key:<45} {value:,.6g}")


def page_kind(body: bytes) -> str:
    """What a page that holds no sample looks like, for the one-line error."""
    head = body.lstrip()[:512].lower()
    if head.startswith((b"<!doctype html", b"<html")) or b"<html" in head:
        return "it looks like HTML"
    if head.startswith((b"{", b"[")):
        return "it looks like JSON: a report? `dcgm-bridge report` reads the record log"
    return "no line has the form name{labels} value"


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
