"""The compiled per-page kernel (bridge/_kernel.c) against its reference, the Python path.

Both get the same real pages, mutated as tests/test_hostile.py mutates them, and every value token a
float() would or would not read; the results must be the same to the bit (NaN's sign included).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.parse import PageParser
from bridge.parse.template import COMPILED, PageTemplate, TemplatedPage
from tests.test_hostile import CORPUS, mutate, ops_strategy

kernel = pytest.importorskip("bridge._kernel", reason="the kernel is not built here (no C compiler)")


def bits(values: tuple[float, ...] | None) -> list[bytes] | None:
    return None if values is None else [struct.pack("<d", v) for v in values]


def template_of(body: bytes) -> PageTemplate:
    parser = PageParser()
    parser.parse(body)
    page = parser.parse(body)  # the second read of a structure goes through the template
    assert isinstance(page, TemplatedPage)
    return page.template


TEMPLATES = [template_of(body) for body in CORPUS]


def both(template: PageTemplate, body: bytes) -> tuple[list[bytes] | None, list[bytes] | None]:
    assert template.segments is not None
    return bits(kernel.values_of_bytes(template.segments, body)), bits(template.values_of_bytes_python(body))


def test_a_compiler_here_means_the_compiled_path_runs() -> None:
    if shutil.which("gcc") or shutil.which("cc"):
        assert COMPILED, "a C compiler is on this machine but bridge._kernel was not built: run `make` again"


def test_every_real_page_reads_the_same_on_both_paths() -> None:
    for template, body in zip(TEMPLATES, CORPUS, strict=True):
        compiled, python = both(template, body)
        assert compiled is not None and compiled == python


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(range(len(CORPUS))), ops_strategy)
def test_a_mutated_real_page_reads_the_same_on_both_paths(index: int, ops: list[tuple[str, int, bytes]]) -> None:
    compiled, python = both(TEMPLATES[index], mutate(CORPUS[index], ops))
    assert compiled == python


TOKENS = [b"1", b"-0", b"+1.5e3", b"1e999", b"-1e999", b"NaN", b"-nan", b"+Inf", b"-inf", b"infinity", b" 2 ",
          b"\t3\x0b", b"1_000", b"", b" ", b"0x10", b"1.5 1700000000000", b"1\x00", b"\xff", b"1e", b".5", b"5.",
          b"1" * 400, b"0." + b"1" * 300, b"--1", b"1e-400", b"\r4"]


@pytest.mark.parametrize("token", TOKENS, ids=repr)
def test_each_value_token_reads_as_float_reads_it(token: bytes) -> None:
    template = TEMPLATES[0]
    assert template.segments is not None and len(template.segments) > 2
    body = bytearray()
    for segment in template.segments[:-1]:
        body += segment + token
    body += template.segments[-1]
    compiled, python = both(template, bytes(body))
    assert compiled == python


@given(st.binary(max_size=40))
def test_any_bytes_as_a_value_read_the_same(token: bytes) -> None:
    template = TEMPLATES[0]
    assert template.segments is not None
    body = template.segments[0] + token + b"".join(template.segments[1:2])
    segments = template.segments[:2]
    assert bits(kernel.values_of_bytes(segments, body)) == bits(_python(segments, body))


def _python(segments: tuple[bytes, ...], body: bytes) -> tuple[float, ...] | None:
    """The reference for an arbitrary segment tuple (values_of_bytes_python reads a template's own)."""
    template = object.__new__(PageTemplate)
    object.__setattr__(template, "segments", segments)
    return PageTemplate.values_of_bytes_python(template, body)


def test_without_the_kernel_the_python_path_runs_and_says_so() -> None:
    code = ("import sys; sys.modules['bridge._kernel'] = None; "
            "from bridge.parse.template import COMPILED; print(COMPILED)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
