"""The simulated dcgm-exporter's pages and physics, read over real HTTP and checked by independent oracles.

Oracles: prometheus_client's parsers (the page parses, with the families and labels each dialect
should have), the real pages and counter CSV in tests/data, and a fine numerical integration of power.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

import bridge.simulator
from bridge.simulator import ManualClock, NodeModel, SimulatedExporter, SimulatorConfig, render_page
from bridge.simulator.config import AMD_DIALECTS, DIALECT_NAMES, NS
from bridge.simulator.model import Curve

DATA = Path(__file__).parent / "data"
T0 = 1_750_000_020 * NS  # a multiple of 30 s, so DCGM refresh windows start on it
Serve = Callable[..., SimulatedExporter]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False) as client:  # one client: building its SSL context costs ~50 ms
        yield client


@pytest.fixture
def serve(clock: ManualClock) -> Iterator[Serve]:
    started: list[SimulatedExporter] = []

    def start(**config: object) -> SimulatedExporter:
        exporter = SimulatedExporter(SimulatorConfig(**config), now_ns=clock)  # type: ignore[arg-type]
        started.append(exporter.start())
        return exporter

    yield start
    for exporter in started:
        exporter.stop()


def get(http: httpx.Client, exporter: SimulatedExporter) -> str:
    response = http.get(exporter.url)
    assert response.status_code == 200
    return response.text


def families(text: str, parse: Callable[[str], Iterable[Metric]] = parse_text) -> dict[str, Metric]:
    """Families by name. Without TYPE lines prometheus_client yields one family per sample: merge them."""
    merged: dict[str, Metric] = {}
    for family in parse(text):
        if family.name in merged:
            merged[family.name].samples.extend(family.samples)
        else:
            merged[family.name] = family
    return merged


def label_keys(line: str) -> list[str]:
    return re.findall(r'[{,] ?(\w+)="', line)


def sample_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def value_of(page: dict[str, Metric], family: str, **labels: str) -> float:
    matches = [s.value for s in page[family].samples if labels.items() <= s.labels.items()]
    assert len(matches) == 1, (family, labels, matches)
    return matches[0]


def test_a_default_page_is_eight_h100s_of_forty_families_like_a_real_node(
    http: httpx.Client, serve: Serve
) -> None:
    exporter = serve()
    response = http.get(exporter.url)
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert 70_000 <= len(response.content) <= 85_000
    page = families(response.text)
    assert len(page) == 40
    assert sum(len(f.samples) for f in page.values()) == 320
    assert "DCGM_FI_DEV_XID_ERRORS" not in page  # blank until an XID happens (#646)
    sample = page["DCGM_FI_DEV_GPU_TEMP"].samples[3].labels
    assert sample["gpu"] == "3" and sample["device"] == "nvidia3"
    assert sample["modelName"] == "NVIDIA H100 80GB HBM3"
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", sample["UUID"])
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", sample["pci_bus_id"])
    assert len({s.labels["UUID"] for s in page["DCGM_FI_DEV_GPU_TEMP"].samples}) == 8


def test_labels_are_written_in_the_exporters_order(http: httpx.Client, serve: Serve) -> None:
    line = sample_lines(get(http, serve(pod_labels="mapped")))[0]
    assert label_keys(line) == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                                "DCGM_FI_DRIVER_VERSION", "container", "namespace", "pod"]
    line = sample_lines(get(http, serve(mig=2, dialect="current")))[0]
    assert label_keys(line) == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE",
                                "GPU_I_ID", "hostname", "DCGM_FI_DRIVER_VERSION"]


# dialect -> (uuid label, host label, driver label, an energy family, families on an 8-GPU page)
ENERGY, DRIVER = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DRIVER_VERSION"
DIALECT_SHAPES = {
    "legacy": ("UUID", "Hostname", DRIVER, ENERGY, 40),
    "current": ("UUID", "hostname", DRIVER, ENERGY, 40),
    "old-namespace": ("uuid", "Hostname", DRIVER, "dcgm_total_energy_consumption", 16),
    "dcgm49": ("UUID", "hostname", "DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 41),
    "dcgm410": ("UUID", "hostname", "DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 41),
    "bare": ("UUID", "Hostname", DRIVER, ENERGY, 40),
    "openmetrics": ("UUID", "Hostname", DRIVER, ENERGY, 40),
    "sorted-labels": ("UUID", "Hostname", DRIVER, ENERGY, 40),
    "spaced": ("UUID", "Hostname", DRIVER, ENERGY, 40),
}


def test_every_dialect_is_described() -> None:
    # amd: AMD's families and labels, none of DCGM's (tests/sources/test_simulator_amd.py)
    assert set(DIALECT_SHAPES) | set(AMD_DIALECTS) == set(DIALECT_NAMES)


@pytest.mark.parametrize("dialect", sorted(DIALECT_SHAPES))
def test_every_dialect_parses_with_its_families_and_labels(
    http: httpx.Client, serve: Serve, dialect: str
) -> None:
    uuid, host, driver, energy, count = DIALECT_SHAPES[dialect]
    text = get(http, serve(dialect=dialect))
    page = families(text, parse_openmetrics if dialect == "openmetrics" else parse_text)
    assert len(page) == count
    for family in page.values():
        assert len(family.samples) == 8
        labels = set(family.samples[0].labels)
        assert labels == {uuid, host, driver, "gpu", "pci_bus_id", "device", "modelName"}
    assert page[energy].type == ("unknown" if dialect == "bare" else "counter")


# (legacy family, DCGM 4.7 family as dcgm-exporter 4.9 writes it, factor): NVIDIA's field table
# (tests/data/go-dcgm_dcgm47-fields.csv), new ids where the unit changed.
DCGM47_PAIRS = [
    ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK_HERTZ", 1e6),
    ("DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 1e6),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1e-3),
    ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS", 1),
    ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", 1e-2),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", 1),
    ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED", 1),
    ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_FREE", 1),
    ("DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_RESERVED", 1),
    ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1),
    ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 1),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 1),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", 1e6),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", 1),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED", 1),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO", 1),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES", 1),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", 1),
]


@pytest.mark.parametrize("dialect", ["dcgm49", "dcgm410"])
def test_dcgm49_and_410_write_nvidias_names_and_units_for_the_same_values(clock: ManualClock, dialect: str) -> None:
    from bridge.simulator.schema import RENAMED_410
    legacy = families(render_page(NodeModel(SimulatorConfig(), clock), T0).decode())
    si_text = render_page(NodeModel(SimulatorConfig(dialect=dialect), clock), T0).decode()
    si = families(si_text)
    for old, new, factor in DCGM47_PAIRS:
        new = RENAMED_410.get(new, new) if dialect == "dcgm410" else new
        assert value_of(si, new, gpu="5") == pytest.approx(value_of(legacy, old, gpu="5") * factor, rel=1e-9)
    capacity = value_of(si, "DCGM_FI_DEV_FB_CAPACITY_BYTES", gpu="5")
    parts = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
    assert capacity == sum(value_of(si, name, gpu="5") for name in parts) * 1_048_576
    assert "# HELP DCGM_FI_DEV_SM_CLOCK_HERTZ SM clock frequency (in Hz).\n" in si_text
    assert "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n" in si_text
    assert ("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND" in si) == (dialect == "dcgm410")


@pytest.mark.parametrize("dialect", ["dcgm49", "dcgm410"])
def test_dcgm49_and_410_names_are_all_nvidias(clock: ManualClock, dialect: str) -> None:
    """Every family the simulator writes is in NVIDIA's table or a release note's (tests/test_fields_dcgm47)."""
    from tests.test_fields_dcgm47 import CURRENT, RELEASE_NOTE_NAMES
    page = families(render_page(NodeModel(SimulatorConfig(dialect=dialect), clock), T0).decode())
    for name in page:
        assert CURRENT.get(name) == name or name in RELEASE_NOTE_NAMES, name


def test_old_namespace_writes_1x_names_and_pod_name_labels(http: httpx.Client, serve: Serve) -> None:
    text = get(http, serve(dialect="old-namespace", pod_labels="mapped", gpus=2))
    page = families(text)
    # TYPE lines, not parsed names: prometheus_client strips `_total` off counter family names.
    assert {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")} == {
        "dcgm_sm_clock", "dcgm_memory_clock", "dcgm_memory_temp", "dcgm_gpu_temp", "dcgm_power_usage",
        "dcgm_total_energy_consumption", "dcgm_pcie_replay_counter", "dcgm_gpu_utilization",
        "dcgm_mem_copy_utilization", "dcgm_enc_utilization", "dcgm_dec_utilization", "dcgm_fb_free",
        "dcgm_fb_used", "dcgm_power_violation", "dcgm_thermal_violation", "dcgm_nvlink_bandwidth_total",
    }
    labels = page["dcgm_gpu_temp"].samples[1].labels
    assert {"uuid", "pod_name", "pod_namespace", "container_name"} <= set(labels)
    assert "UUID" not in labels and "pod" not in labels


def test_bare_dialect_has_no_help_or_type_lines(http: httpx.Client, serve: Serve) -> None:
    text = get(http, serve(dialect="bare"))
    assert not [line for line in text.splitlines() if line.startswith("#")]


def test_openmetrics_ends_with_eof_names_counters_total_and_can_carry_timestamps(
    http: httpx.Client, serve: Serve
) -> None:
    exporter = serve(dialect="openmetrics", timestamps=True)
    response = http.get(exporter.url)
    assert response.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert response.text.endswith("# EOF\n")
    energy = families(response.text, parse_openmetrics)["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    sample = energy.samples[0]
    assert sample.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"
    assert sample.timestamp is not None and float(sample.timestamp) == T0 / NS


def test_text_timestamps_are_milliseconds(http: httpx.Client, serve: Serve) -> None:
    line = sample_lines(get(http, serve(timestamps=True)))[0]
    assert line.endswith(f" {T0 // 1_000_000}")


def test_sorted_labels_sorts_every_label_and_spaced_puts_a_space_after_each_comma(
    http: httpx.Client, serve: Serve
) -> None:
    keys = label_keys(sample_lines(get(http, serve(dialect="sorted-labels", pod_labels="mapped")))[0])
    assert keys == sorted(keys) and len(keys) == 10
    line = sample_lines(get(http, serve(dialect="spaced")))[0]
    assert line.startswith('DCGM_FI_DEV_SM_CLOCK{gpu="0", UUID="GPU-') and ",U" not in line


def test_values_are_formatted_as_the_exporter_does_int_as_d_and_double_as_f(
    http: httpx.Client, serve: Serve
) -> None:
    lines = sample_lines(get(http, serve()))
    value = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in lines}
    for name in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        assert re.fullmatch(r"\d+\.\d{6}", value[name]), name
    for name in (ENERGY, "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_PCIE_TX_BYTES"):
        assert re.fullmatch(r"\d+", value[name]), name


def test_help_and_type_lines_match_a_real_exporter_page(http: httpx.Client, serve: Serve) -> None:
    real = [line for line in (DATA / "k8s-ai-conformance_kops_l4.txt").read_text().splitlines()
            if line.startswith(("# HELP", "# TYPE"))]
    ours = [line for line in get(http, serve()).splitlines() if line.startswith("#")]
    assert real and set(real) <= set(ours)
    assert [line for line in ours if line in real] == real  # same relative order: DCGM field IDs


def test_default_counters_are_the_shipped_csv_rows(http: httpx.Client, serve: Serve) -> None:
    csv = (DATA / "dcgm-exporter_etc_default-counters.csv").read_text()
    rows = [line.split(",")[0].strip() for line in csv.splitlines() if line.startswith("DCGM_")]
    expected = set(rows) - {"DCGM_FI_DRIVER_VERSION", "DCGM_FI_DEV_XID_ERRORS"}  # a label; blank until an XID
    assert set(families(get(http, serve(counters="default")))) == expected


def test_mig_instances_repeat_device_fields_with_the_parents_value_and_have_no_gpu_util(
    http: httpx.Client, serve: Serve, clock: ManualClock
) -> None:
    exporter = serve(gpus=2, mig=3)
    page = families(get(http, exporter))
    assert "DCGM_FI_DEV_GPU_UTIL" not in page and "DCGM_FI_DEV_MEM_COPY_UTIL" not in page  # #216, #430
    energy = page["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples
    assert len(energy) == 6
    for gpu in ("0", "1"):
        mine = [s for s in energy if s.labels["gpu"] == gpu]
        assert {s.labels["GPU_I_PROFILE"] for s in mine} == {"2g.20gb"}
        assert sorted(s.labels["GPU_I_ID"] for s in mine) == ["3", "4", "5"]
        assert {s.value for s in mine} == {exporter.model.counter_mj(int(gpu), clock())}
        for name in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"):
            assert len({s.value for s in page[name].samples if s.labels["gpu"] == gpu}) == 1
        engine = {s.value for s in page["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples if s.labels["gpu"] == gpu}
        assert len(engine) == 3  # each instance has its own load
        fb = sum(value_of(page, f"DCGM_FI_DEV_FB_{k}", gpu=gpu, GPU_I_ID="4") for k in ("USED", "FREE"))
        assert fb == 19_968  # the 2g.20gb instance's memory (nothing reserved per instance)


def test_pod_labels_come_mapped_or_in_the_old_empty_style(http: httpx.Client, serve: Serve) -> None:
    mapped = families(get(http, serve(pod_labels="mapped", gpus_per_pod=4)))["DCGM_FI_DEV_GPU_TEMP"].samples
    assert [s.labels["pod"] for s in mapped] == ["llm-server-0"] * 4 + ["llm-server-1"] * 4
    assert {s.labels["namespace"] for s in mapped} == {"llm-bench"}
    empty = families(get(http, serve(pod_labels="empty")))["DCGM_FI_DEV_GPU_TEMP"].samples
    assert {(s.labels["pod"], s.labels["namespace"], s.labels["container"]) for s in empty} == {("", "", "")}


def test_hostname_can_be_chosen_or_omitted(http: httpx.Client, serve: Serve) -> None:
    named = families(get(http, serve(hostname="node-a")))["DCGM_FI_DEV_GPU_TEMP"].samples[0].labels
    assert named["Hostname"] == "node-a"
    bare = families(get(http, serve(no_hostname=True)))["DCGM_FI_DEV_GPU_TEMP"].samples[0].labels
    assert "Hostname" not in bare and "hostname" not in bare


def test_the_same_seed_gives_byte_identical_pages_for_the_same_simulated_time(
    http: httpx.Client, serve: Serve, clock: ManualClock
) -> None:
    a, b, other = serve(seed=7), serve(seed=7), serve(seed=8)
    assert http.get(a.url).content == http.get(b.url).content
    clock.advance(123 * NS)
    assert http.get(a.url).content == http.get(b.url).content
    assert http.get(a.url).content != http.get(other.url).content
    assert a.model.gpus != other.model.gpus  # different UUIDs


def test_the_energy_counter_is_the_integral_of_power(
    http: httpx.Client, serve: Serve, clock: ManualClock
) -> None:
    exporter = serve(gpus=2)
    first = families(get(http, exporter))
    clock.advance(600 * NS)
    second = families(get(http, exporter))
    t0, t1 = T0, T0 + 600 * NS
    steps = 60_000  # Simpson's rule on a 10 ms grid
    h = (t1 - t0) // steps
    power = [exporter.model.power_watts(1, t0 + i * h) for i in range(steps + 1)]
    numeric = h / NS / 3 * (power[0] + power[-1] + 4 * sum(power[1:-1:2]) + 2 * sum(power[2:-1:2]))
    truth = exporter.model.energy_joules(1, t0, t1)
    assert truth == pytest.approx(numeric, rel=1e-9)
    name = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    delta_mj = value_of(second, name, gpu="1") - value_of(first, name, gpu="1")
    assert abs(delta_mj - 1000 * truth) <= 1  # whole mJ on the page
    assert value_of(second, name, gpu="1") == exporter.model.counter_mj(1, t1)
    origin = exporter.model.counter_origin_ns(1, t1)
    assert value_of(second, name, gpu="1") == math.floor(1000 * exporter.model.energy_joules(1, origin, t1))


def test_power_on_the_page_is_the_model_power_to_the_milliwatt(
    http: httpx.Client, serve: Serve, clock: ManualClock
) -> None:
    exporter = serve()
    for _ in range(5):
        clock.advance(7 * NS)
        page = families(get(http, exporter))
        for gpu in range(8):
            shown = value_of(page, "DCGM_FI_DEV_POWER_USAGE", gpu=str(gpu))
            assert shown == pytest.approx(exporter.model.power_watts(gpu, clock()), abs=0.0005)


def test_values_stay_physical_over_a_simulated_day(clock: ManualClock) -> None:
    model = NodeModel(SimulatorConfig(), clock)
    for minute in range(0, 24 * 60, 7):
        snap = model.snapshot(T0 + minute * 60 * NS)
        for values in snap.values:
            assert 5 <= values["DCGM_FI_DEV_GPU_UTIL"] <= 95
            assert 60 <= values["DCGM_FI_DEV_POWER_USAGE"] <= 700  # H100 SXM: idle to TDP
            assert 25 <= values["DCGM_FI_DEV_GPU_TEMP"] <= 80
            assert 0 <= values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] <= 1
            fb = sum(values[f"DCGM_FI_DEV_FB_{k}"] for k in ("FREE", "USED", "RESERVED"))
            assert fb == values["DCGM_FI_DEV_FB_TOTAL"]


def test_counters_never_decrease_without_a_reset(clock: ManualClock) -> None:
    model = NodeModel(SimulatorConfig(gpus=2), clock)
    counters = ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_POWER_VIOLATION",
                "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
    previous = model.snapshot(T0).values[0]
    for step in range(1, 200):
        current = model.snapshot(T0 + step * 333_000_000).values[0]
        assert all(current[name] >= previous[name] for name in counters)
        previous = current


def test_temperature_is_a_first_order_lag_of_power() -> None:
    power = Curve(400.0, ((150.0, 2 * math.pi / 300, 0.3), (40.0, 2 * math.pi / 20, 1.0)))
    tau = 60.0
    temp = power.lagged(tau)
    for t in range(0, 600 * NS, 37 * NS):
        dt = 1_000_000  # 1 ms central difference
        slope = (temp.at(T0 + t + dt) - temp.at(T0 + t - dt)) / (2 * dt / NS)
        # Float resolution of t (~1e-8 s at 2025 dates) limits the finite difference, not the closed form.
        assert tau * slope == pytest.approx(power.at(T0 + t) - temp.at(T0 + t), abs=2e-3)


def test_refresh_cadence_repeats_values_between_dcgm_refreshes(
    http: httpx.Client, serve: Serve, clock: ManualClock
) -> None:
    exporter = serve(refresh_ms=30_000)
    first = http.get(exporter.url).content
    clock.advance(29 * NS)
    assert http.get(exporter.url).content == first
    clock.advance(1 * NS)
    assert http.get(exporter.url).content != first
    fresh = serve(refresh_ms=0)
    before = http.get(fresh.url).content
    clock.advance(NS // 3)
    assert http.get(fresh.url).content != before


def test_health_index_and_unknown_paths_answer_like_the_exporter(http: httpx.Client, serve: Serve) -> None:
    exporter = serve(gpus=1)
    assert http.get(exporter.base_url + "/health").text == "OK"
    assert "metrics" in http.get(exporter.base_url + "/").text
    assert http.get(exporter.base_url + "/nope").status_code == 404


def test_the_package_surface_is_pinned_and_imports_only_the_standard_library() -> None:
    assert bridge.simulator.__all__ == [
        "DIALECT_NAMES", "FAULT_KINDS", "Fault", "ManualClock", "NodeModel", "PageMods", "SimulatedExporter",
        "SimulatorConfig", "Snapshot", "parse_fault_spec", "render_page", "scaled_clock",
    ]
    import subprocess
    import sys

    code = ("import sys, bridge.simulator; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] not in sys.stdlib_module_names and m.split('.')[0] != 'bridge'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert not [m for m in eval(out) if not m.startswith(("_", "__"))]


def test_dcgm49_writes_an_xid_under_dcgm47s_name_and_the_bridge_reports_it(clock: ManualClock) -> None:
    from bridge.fields import default_table
    from bridge.normalize import Normalizer
    from bridge.parse import parse_page

    model = NodeModel(SimulatorConfig(dialect="dcgm49", gpus=2), clock)
    model.inject_xid(1, 79, T0)
    text = render_page(model, T0 + NS).decode()
    (xid,) = [s for s in families(text)["DCGM_FI_DEV_XID_ERROR"].samples if s.value]
    assert (xid.labels["gpu"], xid.value, xid.labels["err_code"]) == ("1", 79, "79")
    records = Normalizer(default_table()).records(parse_page(text.encode()), source_url="u", timestamp_ns=0)
    assert [r.telemetry_data.get("nvidia_xid_errors") for r in records if r.gpu_index == 1] == [79.0]
