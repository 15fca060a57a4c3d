"""`dcgm-bridge compare`'s command line: the pairwise comparison (compare.py), the sweep and the repeats needed
(sweep.py), in the console, as JSON or as an HTML page."""

from __future__ import annotations

from pathlib import Path

import click

from bridge.report import sweep
from bridge.report.compare import CompareError, Row, Side, as_json, compare, load_side, render


@click.command("compare")
@click.argument("folders", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json_out", is_flag=True, help="Print the comparison as JSON (README: compare).")
@click.option("--include-invalid", is_flag=True, help="Keep runs whose measurement is NOT valid.")
@click.option("--sweep", "sweep_key", metavar="KEY",
              help="Order the folders by KEY in AIPerf's input_config (concurrency, request_rate, or a dotted path) "
                   "and show each metric against it, with the throughput-vs-energy-per-token Pareto front.")
@click.option("--until-width", type=click.FloatRange(0, 10, min_open=True), default=None, metavar="W",
              help="How many more repeats bring each folder's 95 % interval under W of its mean (its full width, as "
                   "AIPerf's ci_width; 0.10 is AIPerf's default and --json's without this option).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also write the comparison as a self-contained HTML page: a forest plot of the differences, and "
                   "with --sweep each metric's curve with its interval as a band.")
def compare_command(folders: tuple[Path, ...], as_json_out: bool, include_invalid: bool, sweep_key: str | None,
                    until_width: float | None, html_path: Path | None) -> None:
    """Compare configurations with the first: each FOLDER one run or a folder of repeats (run_NNNN/, AIPerf's
    profile_runs/run_NNNN/). Each metric's difference with a 95 % interval of run-to-run variation and measurement
    uncertainty: better, worse or inconclusive."""
    import orjson

    from bridge.errors import ReportInputError

    if len(folders) < 2 and sweep_key is None and until_width is None:
        raise click.UsageError("give at least two folders: the baseline first, then what to compare with it")
    try:
        sides = [load_side(f, include_invalid) for f in folders]
        points = sweep.sweep(sides, sweep_key) if sweep_key is not None else None
    except CompareError as exc:
        raise ReportInputError(f"compare: {exc}") from None
    baseline, *others = sides
    results = [compare(baseline, other) for other in others]
    if html_path is not None:
        _write_page(html_path, sides, results, points, sweep_key)
    width = until_width if until_width is not None else 0.10
    if as_json_out:
        doc = sweep.as_json(points, sweep_key) if points is not None and sweep_key is not None else \
            as_json(baseline, others, results)
        doc["until_width"] = {"width": width, "folders": [
            {"folder": str(s.folder), "metrics": sweep.width_rows(s, width)} for s in sides]}
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return
    lines = sweep.render(points, sweep_key) if points is not None and sweep_key is not None else \
        render(baseline, others, results) if others else []
    for side in sides if until_width is not None else ():
        lines.extend(sweep.width_lines(side, width))
    for line in lines:
        click.echo(line)


def _write_page(path: Path, sides: list[Side], results: list[list[Row]], points: list[sweep.Point] | None,
                key: str | None) -> None:
    """The HTML page, written the way every output is (bridge/files.py: never through a link, never over one of
    the reports compared)."""
    from bridge.errors import ReportInputError
    from bridge.files import same_file, write_atomically, write_problem
    from bridge.report.compare_html import render_compare_html

    problem = write_problem(path)
    if problem is None and (clash := same_file(path, [r.path for s in sides for r in s.runs])) is not None:
        problem = f"{path} is {clash}, one of the reports compared; give another --html path"
    if problem is not None:
        raise ReportInputError(f"compare --html: {problem}")
    baseline, *others = sides
    write_atomically(path, render_compare_html(baseline, others, results, points, key).encode("utf-8"))
