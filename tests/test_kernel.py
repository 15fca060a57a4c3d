"""The compiled per-page kernel (bridge/_kernel.c) against its reference, the Python path.

Both get the same real pages, mutated as tests/test_hostile.py mutates them, and every value token a
float() would or would not read; the results must be the same to the bit (NaN's sign included).
"""

from __future__ import annotations

import contextlib
import shutil
import struct
import subprocess
import sys
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge import kernel
from bridge.parse import PageParser
from bridge.parse.template import PageTemplate, TemplatedPage, pack_ints
from tests.test_hostile import CORPUS, mutate, ops_strategy

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent

if not kernel.COMPILED:
    pytest.skip("the kernel is not built here (no C compiler)", allow_module_level=True)


def bits(values: tuple[float, ...] | None) -> list[bytes] | None:
    return None if values is None else [struct.pack("=d", v) for v in values]


def raw_bits(raw: bytes | None) -> list[bytes] | None:
    """The kernel's values (native float64 bytes) as `bits` gives a tuple's."""
    return None if raw is None else [raw[k: k + 8] for k in range(0, len(raw), 8)]


def kernel_values(segments: tuple[bytes, ...], body: bytes) -> list[bytes] | None:
    return raw_bits(kernel.values_of_bytes(b"".join(segments), pack_ints(map(len, segments)), body))


def template_of(body: bytes) -> PageTemplate:
    parser = PageParser()
    parser.parse(body)
    page = parser.parse(body)  # the second read of a structure goes through the template
    assert isinstance(page, TemplatedPage)
    return page.template


TEMPLATES = [template_of(body) for body in CORPUS]


def both(template: PageTemplate, body: bytes) -> tuple[list[bytes] | None, list[bytes] | None]:
    assert template.segments is not None
    return kernel_values(template.segments, body), bits(template.values_of_bytes_python(body))


def test_a_compiler_here_means_the_compiled_path_runs() -> None:
    if shutil.which("gcc") or shutil.which("cc"):
        assert kernel.COMPILED, "a C compiler is on this machine but bridge._kernel was not built: run `make` again"


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
    assert kernel_values(segments, body) == bits(_python(segments, body))


NUMBER_TOKENS = st.one_of(
    st.from_regex(r"[+-]?[0-9]{0,20}(\.[0-9]{0,20})?([eE][+-]?[0-9]{1,5})?", fullmatch=True),
    st.floats().map(repr), st.floats().map(lambda v: f"{v:.17g}"), st.integers(-(2**64), 2**64).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: f"{v:.3f}"))


@pytest.mark.slow  # 3000 examples
@settings(max_examples=3000, deadline=None)
@given(NUMBER_TOKENS)
def test_any_number_token_reads_as_float_reads_it(token: str) -> None:
    """Plain decimals take the kernel's fast path (Clinger's): the same double float() reads, to the bit."""
    template = TEMPLATES[0]
    assert template.segments is not None
    body = template.segments[0] + token.encode() + template.segments[1]
    segments = template.segments[:2]
    assert kernel_values(segments, body) == bits(_python(segments, body))


def test_a_page_holds_its_values_as_the_kernel_gives_them_and_as_a_tuple() -> None:
    """A page read by the kernel holds native float64 bytes; its tuple of values is the same numbers to the bit,
    and a page made from a tuple gives the same bytes."""
    for template, body in zip(TEMPLATES, CORPUS, strict=True):
        page = template.page_of_bytes(body)
        assert page is not None and page.value_count == len(template.names)
        assert bits(page.values) == raw_bits(page.raw) == bits(template.values_of_bytes_python(body))
        assert TemplatedPage(template, page.values).raw == page.raw


def test_segment_lengths_past_their_text_are_refused_not_read() -> None:
    with pytest.raises(ValueError, match="past the text"):
        kernel.values_of_bytes(b"ab", pack_ints([1, 5]), b"a1\nb")
    with pytest.raises(ValueError, match="never negative"):
        kernel.values_of_bytes(b"ab", pack_ints([-1, 1]), b"a1\nb")
    with pytest.raises(TypeError):
        kernel.values_of_bytes(b"ab", b"\x01", b"a1\nb")  # not int32s


def _python(segments: tuple[bytes, ...], body: bytes) -> tuple[float, ...] | None:
    """The reference for an arbitrary segment tuple (values_of_bytes_python reads a template's own)."""
    template = object.__new__(PageTemplate)
    object.__setattr__(template, "flat", (b"".join(segments), pack_ints(map(len, segments))))  # (segments from it)
    return PageTemplate.values_of_bytes_python(template, body)


def test_without_the_kernel_the_python_path_runs_and_says_so(tmp_path) -> None:
    """A machine without a compiler: `--version` names the pure-Python path, and a sidecar collecting says so in
    one log line and in /status, and records every page all the same."""
    code = ("import sys; sys.modules['bridge._kernel'] = None; "
            "from bridge.kernel import COMPILED; print(COMPILED)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    version = subprocess.run([sys.executable, "-c", "import sys; sys.modules['bridge._kernel'] = None; "
                              "from bridge.cli import main; main(['--version'])"], capture_output=True, text=True)
    assert "pure-Python per-page path" in version.stdout
    run = f"""
import logging, sys, time
sys.modules['bridge._kernel'] = None
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.sidecar.helpers import session_for
with SimulatedExporter(SimulatorConfig(gpus=2)) as exporter:
    session = session_for([exporter.url], __import__("pathlib").Path({str(tmp_path)!r}))
    session.start()
    deadline = time.monotonic() + 30
    while session.records_written < 2 * 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    print(session.status()["per_page_path"])
    session.complete()
    print(session.records_written)
"""
    result = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    path, written = result.stdout.strip().splitlines()[-2:]
    assert path.startswith("pure Python") and int(written) >= 2 * 5, result.stdout
    assert result.stderr.count("the compiled per-page kernel (bridge._kernel) is not built") == 1, result.stderr


# -- the record lines and rows (normalize.py `Normalizer.compiled`) against record_to_line ------------------

SENTINELS = [float("nan"), float("inf"), float("-inf"), 9.223372036854776e18, 2147483632.0, float(2**47)]
ODD_VALUES = [0.0, -0.0, 1e-5, 1e-6, 1.5e-7, 1e15, 1e16, 123456789012345680.0, 5e-324, 1.7976931348623157e308,
              0.1, 2.5, -3.75, 1e300, 4.35e-300]
OPTIONS = {"source_url": "http://gpu-node-7:9400/metrics", "timestamp_ns": 1_733_000_000_123_456_789,
           "run_id": "run-1", "phase": "profiling", "scrape_end_ns": 1_733_000_000_133_456_789}


def _twice(body: bytes) -> TemplatedPage | None:
    parser = PageParser()
    parser.parse(body)
    page = parser.parse(body)
    return page if isinstance(page, TemplatedPage) else None


def _same_records(page: TemplatedPage, **options: object) -> None:
    """The kernel's lines are record_to_line's bytes; its rows the records' values; its records the records."""
    from bridge.fields import default_table
    from bridge.normalize import Normalizer
    from bridge.record_log import record_to_line

    normalizer = Normalizer(default_table())
    compiled = normalizer.compiled(page, **{**OPTIONS, **options})  # type: ignore[arg-type]
    records = Normalizer(default_table()).records(page, **{**OPTIONS, **options})  # type: ignore[arg-type]
    assert compiled is not None
    assert compiled.lines == b"".join(map(record_to_line, records))
    assert compiled.records() == records
    rows = [struct.unpack(f"={len(e.keys)}d", row) for e, row in compiled.row_views()]
    assert [bits(r) for r in rows] == [bits(tuple(r.telemetry_data.values())) for r in records]


def test_every_real_page_gives_the_record_lines_record_to_line_gives() -> None:
    for body in CORPUS:
        page = _twice(body)
        assert page is not None
        _same_records(page)
        _same_records(page, run_id=None, phase=None, scrape_end_ns=None)  # the optional keys left out


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(range(len(CORPUS))), ops_strategy)
def test_a_mutated_real_page_gives_the_same_record_lines(index: int, ops: list[tuple[str, int, bytes]]) -> None:
    page = _twice(mutate(CORPUS[index], ops))
    if page is not None and page.values:
        _same_records(page)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(CORPUS))),
       st.lists(st.tuples(st.integers(0, 10**6), st.one_of(st.sampled_from(SENTINELS + ODD_VALUES), st.floats())),
                max_size=12))
@pytest.mark.slow
def test_any_values_on_a_real_template_give_the_same_record_lines(index: int,
                                                                  changes: list[tuple[int, float]]) -> None:
    """Sentinels, NaN/inf (absent: another plan), subnormals, huge and tiny values in any place."""
    page = TEMPLATE_PAGES[index]
    values = list(page.values)
    for at, value in changes:
        values[at % len(values)] = value
    _same_records(TemplatedPage(page.template, tuple(values)))


TEMPLATE_PAGES = [page for page in map(_twice, CORPUS) if page is not None]


@settings(max_examples=2000, deadline=None)
@given(st.floats())
def test_a_float_is_written_as_orjson_writes_it(value: float) -> None:
    import orjson

    from bridge.record_log import line_program

    program = line_program([((b"{", b"", (b'"v":',), b"", b""), (0,), (1.0,))])
    lines, rows = kernel.records_of(*program, doubles([value]), 0, None)
    assert lines == b"{0" + b'"v":' + orjson.dumps(value) + b"0}\n"
    assert rows == struct.pack("=d", value)


@pytest.mark.parametrize("value", SENTINELS + ODD_VALUES + [float(2**53), float(2**63), 1e22, 123.0, 1e-300])
def test_edge_floats_are_written_as_orjson_writes_them(value: float) -> None:
    test_a_float_is_written_as_orjson_writes_it.hypothesis.inner_test(value)  # type: ignore[attr-defined]


# -- the OTLP points (otlp/plan.py `PagePlan.fill`) against the struct.pack fill ------------------------------


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(range(len(CORPUS))),
       st.lists(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(SENTINELS[3:] + ODD_VALUES + [0.0, 1.0])),
                         max_size=6), min_size=1, max_size=6))
def test_a_page_sequence_gives_the_same_otlp_bytes_on_both_fills(index: int,
                                                                 steps: list[list[tuple[int, float]]]) -> None:
    """Pages of one template one after another (values changed, sentinels coming and going, counters going
    down: a reset); every chunk is the same bytes whether the plan is filled by the kernel or by struct.pack.
    Each page is released before the next, so the kernel's plan writes every page into the same buffer."""
    from bridge.otlp.encode import ContextCache, EndpointEncoder

    page = TEMPLATE_PAGES[index]
    compiled, python = (EndpointEncoder({"service.name": "dcgm-exporter"}) for _ in range(2))
    ctx = ContextCache().get("run-1", "profiling")
    values = list(page.values)
    for step, changes in enumerate([[], []] + steps):
        for at, value in changes:
            values[at % len(values)] = value
        templated = TemplatedPage(page.template, tuple(values))
        encoded = compiled.encode(templated, ctx, 1_000_000_000 * (step + 1))
        chunk = bytes(encoded.chunk)
        encoded.release()
        with kernel.python_path():
            expected = python.encode(templated, ctx, 1_000_000_000 * (step + 1)).chunk
        assert chunk == expected
        assert compiled.buffers.free <= 1 and compiled.buffers.lent == 0  # one buffer, taken again and again


def test_a_chunk_buffer_is_written_again_only_once_its_page_is_released() -> None:
    """The kernel's plan writes a page's points into the buffer of an earlier page only once that page is
    released (its batch sent): a page still held (a batch being retried, a carried page) keeps its bytes, and
    a counter reset in between still reaches a returned buffer (its start time is in the frame, not in the
    points). The pool keeps no more idle buffers than its bound, however many pages were held at once."""
    from bridge.otlp.encode import ContextCache, EncodedPage, EndpointEncoder
    from bridge.otlp.plan import POOL_SIZE

    page = max(TEMPLATE_PAGES, key=lambda p: len(p.values))  # a whole node's page, counters among its values
    compiled, python = EndpointEncoder({"service.name": "x"}), EndpointEncoder({"service.name": "x"})
    ctx = ContextCache().get("run-1", "profiling")
    values = list(page.values)

    def both(step: int) -> tuple[EncodedPage, bytes]:
        templated = TemplatedPage(page.template, tuple(values))
        encoded = compiled.encode(templated, ctx, 1_000_000_000 * step)
        with kernel.python_path():
            return encoded, bytes(python.encode(templated, ctx, 1_000_000_000 * step).chunk)

    both(1)
    both(2)[0].release()  # (the second page is the plan's first)
    plan = compiled._plan
    assert plan is not None and plan.sum_at, "a page with counters"
    held, expected = both(3)
    kept = bytes(held.chunk)
    assert compiled.buffers.lent == 1
    values[plan.sum_at[0]] += 1.0
    for step in range(4, 8):  # later pages while the third is held, each its own chunk
        later, later_expected = both(step)
        assert later.chunk == later_expected and held.chunk == kept == expected
        later.release()
    held.release()
    held.release()  # a second release gives nothing back twice
    assert (compiled.buffers.lent, compiled.buffers.free) == (0, 2)
    values[plan.sum_at[0]] = -1.0  # a reset: a new start time goes into the frame
    for step in range(8, 11):
        chunk, expected = both(step)
        assert chunk.chunk == expected
        chunk.release()
        values[plan.sum_at[0]] = 5.0 + step
    many = [both(step)[0] for step in range(11, 11 + 3 * POOL_SIZE)]  # a receiver outage: pages held
    assert compiled.buffers.lent == 3 * POOL_SIZE
    for encoded in many:
        encoded.release()
    assert (compiled.buffers.lent, compiled.buffers.free) == (0, POOL_SIZE)  # the idle ones bounded


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(SENTINELS + ODD_VALUES), max_size=40), st.booleans())
def test_blank_at_finds_what_the_python_finds(values: list[float], not_finite: bool) -> None:
    import math

    from bridge.fields import BLANK_VALUES

    found = kernel.blank_at(doubles(values), None, tuple(BLANK_VALUES), not_finite)
    assert found == tuple(i for i, v in enumerate(values)
                          if v in BLANK_VALUES or (not_finite and not math.isfinite(v)))
    positions = pack_ints(range(0, len(values), 2))
    assert kernel.blank_at(doubles(values), positions, tuple(BLANK_VALUES), not_finite) == tuple(
        i for i in found if i % 2 == 0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(SENTINELS + ODD_VALUES + [-1.0, -0.0]), min_size=1, max_size=30),
       st.data())
def test_sums_of_gathers_the_counters_and_finds_those_that_fell_as_python_compares(values: list[float], data) -> None:
    positions = data.draw(st.lists(st.integers(0, len(values) - 1), max_size=20))
    last = data.draw(st.lists(st.sampled_from(SENTINELS + ODD_VALUES + [-1.0, -0.0]), min_size=len(positions),
                              max_size=len(positions)))
    gathered, fell = kernel.sums_of(doubles(values), pack_ints(positions), doubles(last))
    assert raw_bits(gathered) == bits(tuple(values[p] for p in positions))
    assert fell == tuple(k for k, p in enumerate(positions) if values[p] < last[k])  # NaN never fell
    with pytest.raises(ValueError, match="one last value"):
        kernel.sums_of(doubles(values), pack_ints(positions), doubles([*last, 1.0]))
    with pytest.raises(IndexError):
        kernel.sums_of(doubles(values), pack_ints([len(values)]), doubles([1.0]))


# -- the sidecar's pipeline on both paths -------------------------------------------------------------------


def _run_pipeline(tmp_path, bodies: list[bytes], *, kernel_on: bool) -> tuple[bytes, list, dict]:
    with contextlib.nullcontext() if kernel_on else kernel.python_path():
        return _pipeline_output(tmp_path, bodies, kernel_on=kernel_on)


def _pipeline_output(tmp_path, bodies: list[bytes], *, kernel_on: bool) -> tuple[bytes, list, dict]:
    from bridge.fetch import FetchedPage
    from bridge.fields import default_table
    from bridge.normalize import Normalizer
    from bridge.record_log import LineWriter
    from bridge.sidecar.pipeline import LatestRecords, LiveSeriesSink, Pipeline, RecordLogSink
    from bridge.sidecar.spool import LiveSeries

    folder = tmp_path / ("compiled" if kernel_on else "python")
    folder.mkdir()
    writer = LineWriter(folder / "records.jsonl", flush_interval_s=0)
    live = LiveSeries(folder / "spool")
    latest = LatestRecords()
    events = LineWriter(folder / "events.jsonl", flush_interval_s=0)
    pipeline = Pipeline(Normalizer(default_table()), [RecordLogSink(writer), LiveSeriesSink(live), latest],
                        events, run_id="run-1",
                        phase=lambda: "profiling", max_gpus=8)
    compiled = 0
    for n, body in enumerate(bodies):
        page = pipeline.on_page("http://gpu-node-7:9400/metrics",
                                FetchedPage(body, 1_000_000_000 * (n + 1), 1_000_000_000 * (n + 1) + 5, "text/plain"))
        compiled += page.compiled is not None
    assert compiled >= (5 if kernel_on else 0) and (kernel_on or compiled == 0)
    writer.close()
    events.close()
    series = sorted(((s.endpoint, s.meta, s.timestamps.tolist(), {k: bits(tuple(v)) for k, v in s.values.items()})
                     for s in live.finish()), key=repr)
    return (folder / "records.jsonl").read_bytes(), series, latest.latest


def _sample_lines(body: bytes) -> list[bytes]:
    return [line for line in body.split(b"\n") if line and not line.startswith(b"#")]


def _with_values(body: bytes, tokens: dict[int, bytes]) -> bytes:
    """The page with the value of its n-th sample line replaced."""
    lines = body.split(b"\n")
    at = [i for i, line in enumerate(lines) if line and not line.startswith(b"#")]
    for n, token in tokens.items():
        line = lines[at[n]]
        lines[at[n]] = line[: line.rindex(b" ") + 1] + token
    return b"\n".join(lines)


def test_the_pipeline_writes_the_same_log_series_and_live_view_with_and_without_the_kernel(tmp_path):
    """A 2-MIG page, a page with blanks and a counter reset, a page of new GPUs past max_gpus (8): the record
    log, the live report's series and the live view are the same whichever path read them."""
    from tests.test_hostile import _simulated

    first = _simulated("current", mig=2)
    blanks = _with_values(first, {3: b"9223372036854775807", 10: b"NaN", 11: b"+Inf"})
    energy = next(n for n, line in enumerate(_sample_lines(first)) if line.startswith(b"DCGM_FI_DEV_TOTAL_ENERGY"))
    reset = _with_values(first, {energy: b"12"})
    bodies = [first, first, blanks, first, reset, first, first.replace(b"GPU-", b"GPU-X"), first]
    compiled = _run_pipeline(tmp_path, bodies, kernel_on=True)
    python = _run_pipeline(tmp_path, bodies, kernel_on=False)
    assert compiled[0] == python[0] and compiled[0].count(b"\n") > 6 * 2
    assert compiled[1] == python[1]
    assert compiled[2] == python[2]



@pytest.mark.parametrize("block_bytes", [1, 6000, 1 << 20], ids=["every page", "a few pages", "until the end"])
def test_the_live_series_hands_out_held_pages_in_time_order_whatever_comes_between(tmp_path, monkeypatch,
                                                                                  block_bytes):
    """An endpoint's pages of one plan wait as one block before they go to their series: a plan change, a page
    that comes as records, the block filling up and the end each hand them out first. The series come out as
    those of every page added record by record, with spooling on the way (small flush thresholds)."""
    from bridge.fields import default_table
    from bridge.normalize import Normalizer
    from bridge.sidecar import spool
    from tests.test_hostile import _simulated

    monkeypatch.setattr(spool, "_BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(spool, "_FLUSH_BYTES", 2048)
    monkeypatch.setattr(spool, "_SPOOL_MEMORY", 0)
    first = _simulated("current", mig=2)
    bodies = [first] * 7 + [first.replace(b"GPU-", b"GPU-X")] * 3 + [first] * 6
    normalizer, parser = Normalizer(default_table()), PageParser()
    held, reference = spool.LiveSeries(tmp_path / "held"), spool.LiveSeries(tmp_path / "reference")
    for n, body in enumerate(bodies):
        t_ns = 1_000_000_000 * (n + 1)
        compiled = normalizer.compiled(parser.parse(body), source_url="http://gpu-node-7:9400/metrics",
                                       timestamp_ns=t_ns, run_id="r", phase="profiling",
                                       scrape_end_ns=t_ns + 5_000_000 * n)
        assert compiled is not None
        if n in (4, 12):
            held.add(compiled.records(), "gpu-node-7:9400")
        else:
            held.add_compiled(compiled, "gpu-node-7:9400")
        reference.add(compiled.records(), "gpu-node-7:9400")

    def summary(live: spool.LiveSeries) -> list:
        return sorted(((s.endpoint, s.meta, s.timestamps.tolist(), {k: bits(tuple(v)) for k, v in s.values.items()},
                        None if s.ends is None else s.ends.tolist()) for s in live.finish()), key=repr)

    assert held.records == reference.records
    result = summary(held)
    assert result == summary(reference) and len(result) >= 4
    # each page's end reaches its series beside its time, as a column of no telemetry key
    assert all(ends == [t + 5 * (t // 1_000_000_000 - 1) * 1_000_000 for t in times]
               for _, _, times, _, ends in result)
    assert not any(key.endswith("scrape_end_ns") for *_, values, _ in result for key in values)
    assert any((tmp_path / "held").glob("*.rows"))  # (the flushes ran)


def test_a_spool_that_cannot_be_written_gives_up_cleanly_while_pages_are_held(tmp_path, monkeypatch, caplog):
    """Past its in-memory bound an unwritable spool gives up (the report then re-reads the record log), also in
    the middle of handing two endpoints' held pages out: no exception reaches the scrape thread."""
    from bridge.fields import default_table
    from bridge.normalize import Normalizer
    from bridge.sidecar import spool
    from tests.test_hostile import _simulated

    monkeypatch.setattr(spool, "_FLUSH_BYTES", 1024)
    monkeypatch.setattr(spool, "_SPOOL_MEMORY", 0)
    monkeypatch.setattr(spool, "_MAX_UNSPOOLED_BYTES", 20_000)
    (tmp_path / "a-file").write_text("not a folder")
    live = spool.LiveSeries(tmp_path / "a-file" / "spool")
    normalizer, parsers = Normalizer(default_table()), {"a": PageParser(), "b": PageParser()}
    body = _simulated("current", mig=2)
    for n in range(30):
        for endpoint, parser in parsers.items():
            compiled = normalizer.compiled(parser.parse(body), source_url=f"http://{endpoint}:9400/metrics",
                                           timestamp_ns=10**9 * (n + 1), run_id="r", phase=None)
            assert compiled is not None
            live.add_compiled(compiled, f"{endpoint}:9400")
    assert live.complete  # held in blocks, nothing spooled yet
    live.add(compiled.records(), "b:9400")  # hands both endpoints' blocks out: the spool fails and gives up
    assert not live.complete and live.error is not None and "cannot write" in live.error
    live.add_compiled(compiled, "b:9400")  # and later pages are simply not kept
    assert any("gave up" in message for message in caplog.messages)


def test_the_live_view_keeps_each_gpus_latest_page_when_a_gpu_comes_and_goes(tmp_path):
    """LatestRecords only swaps the page while pages keep the same plan (the same GPUs in the same places): a GPU
    missing from some pages keeps its last record, and one that comes back has the newest, as with no shortcut."""
    from tests.test_hostile import _simulated

    both = _simulated("current")
    one = b"\n".join(line for line in both.split(b"\n") if b'gpu="1"' not in line)  # GPU 1 gone
    bodies = [both, both, one, one, one, both, both]
    compiled = _run_pipeline(tmp_path, bodies, kernel_on=True)
    python = _run_pipeline(tmp_path, bodies, kernel_on=False)
    assert compiled[2] == python[2]
    times = {key[1][0]: (first.timestamp_ns, latest.timestamp_ns) for key, (first, latest) in compiled[2].items()}
    assert sorted(times.values()) == [(1_000_000_000, 7_000_000_000)] * 2  # both GPUs: the first page, the last

    (tmp_path / "partial").mkdir()
    partial = _run_pipeline(tmp_path / "partial", bodies[:5], kernel_on=True)
    assert partial[2] == _run_pipeline(tmp_path / "partial", bodies[:5], kernel_on=False)[2]
    # GPU 1's last record is the second page's (a page that only replaced the first), GPU 0's the fifth
    assert sorted(latest.timestamp_ns for _first, latest in partial[2].values()) == [2_000_000_000, 5_000_000_000]


class _Sneaky(float):
    """A float whose conversion runs Python code: the kernel must refuse it rather than call it while it holds
    borrowed references."""

    def __float__(self) -> float:
        raise AssertionError("the kernel called Python code")


def test_the_kernel_refuses_arguments_that_do_not_fit_rather_than_read_past_them() -> None:
    """Flat arguments that disagree with each other (a position past the values, a layout past its text or its
    frame, a buffer that is not whole numbers) are an exception, never a read outside a buffer."""
    from bridge.record_log import line_program

    program = line_program([((b"{", b"", (b'"v":',), b"", b""), (1,), (1.0,))])
    with pytest.raises(IndexError):
        kernel.records_of(*program, doubles([2.0]), 0, None)  # position 1 of one value
    text, layout, scales = program
    with pytest.raises(ValueError, match="past the text"):
        kernel.records_of(text[:-2], layout, scales, doubles([2.0, 3.0]), 0, None)
    with pytest.raises(ValueError, match="whole text"):
        kernel.records_of(text + b"x", layout, scales, doubles([2.0, 3.0]), 0, None)
    with pytest.raises(ValueError, match="runs past the end"):
        kernel.records_of(text, layout[:-4], scales, doubles([2.0, 3.0]), 0, None)
    with pytest.raises(ValueError, match="one scale per key"):
        kernel.records_of(text, layout, b"", doubles([2.0, 3.0]), 0, None)
    with pytest.raises(TypeError, match="float64"):
        kernel.records_of(text, layout, scales, b"\x00" * 7, 0, None)
    assert kernel.records_of(*program, doubles([2.0, 3.0]), 0, None)[0] == b'{0"v":3.00}\n'
    with pytest.raises(ValueError, match="outside the frame"):
        kernel.points_of(b"\x00" * 20, pack_ints([3, 0]), doubles([1.0]), 1)  # 3 + 18 > 20
    with pytest.raises(ValueError, match="outside the frame"):
        kernel.points_of(b"\x00" * 20, pack_ints([0, 1]), doubles([1.0]), 1)
    with pytest.raises(ValueError, match="pairs"):
        kernel.points_of(b"\x00" * 20, pack_ints([0]), doubles([1.0]), 1)
    assert kernel.points_of(bytearray(20), pack_ints([1, 0]), doubles([1.0]), 2) == \
        b"\x00" + struct.pack("<BQBd", 0x19, 2, 0x21, 1.0) + b"\x00"
    with pytest.raises(IndexError):
        kernel.blank_at(doubles([1.0]), pack_ints([1]), (1.0,), True)
    with pytest.raises(TypeError, match="floats and ints"):
        kernel.blank_at(doubles([1.0]), None, (_Sneaky(1.5),), True)


def doubles(values: list[float]) -> bytes:
    """Values as the kernel holds a page's: native float64."""
    return array("d", values).tobytes()
