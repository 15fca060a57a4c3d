"""bench/run.py rewrites RESULTS.md on every `make bench`, but keeps what no run here can remeasure: the real-GPU
section (from its heading on), which a device session wrote."""

from __future__ import annotations

import runpy
from pathlib import Path

RUN = runpy.run_path(str(Path(__file__).parents[1] / "bench" / "run.py"), run_name="bench_run")


def test_the_real_gpu_section_is_kept_and_nothing_before_it(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\nold figures\n\n## A real GPU\n\nH200 figures\n")
    assert RUN["kept_sections"](results) == "\n## A real GPU\n\nH200 figures\n"


def test_without_the_section_or_the_file_nothing_is_kept(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    assert RUN["kept_sections"](results) == ""
    results.write_text("# Benchmark results\n\nold figures\n")
    assert RUN["kept_sections"](results) == ""


def test_the_committed_results_hold_the_real_gpu_section() -> None:
    results = Path(__file__).parents[1] / "bench" / "RESULTS.md"
    assert RUN["kept_sections"](results).startswith("\n## A real GPU\n")
