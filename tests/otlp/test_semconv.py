"""`--otlp-names semconv`: the GPU metrics as OpenTelemetry's hardware conventions (bridge/otlp/semconv.py).

The same simulated GPUs in the legacy and the DCGM 4.7 dialect give the very same hw.* points; end to end,
a sidecar forwarding with semconv names puts `hw.power`, `hw.energy`, … with `hw.id`/`hw.type` into
VictoriaMetrics, and the default still forwards the exporter's names.
"""

from __future__ import annotations

import time

import pytest

from bridge.otlp import resolve_config
from bridge.otlp.config import OtlpConfigError
from bridge.otlp.semconv import SEMCONV, page_to_semconv
from bridge.parse import parse_page
from bridge.samples import ParsedPage, Sample
from bridge.simulator import ManualClock, SimulatedExporter, SimulatorConfig
from tests.otlp.conftest import prom_query, wait_until

T_NS = 1_760_000_000_000_000_000


def _hw_points(dialect: str) -> dict[tuple[str, str, str], float]:
    exporter = SimulatedExporter(SimulatorConfig(gpus=2, dialect=dialect, seed=5), now_ns=ManualClock(T_NS))
    page = page_to_semconv(parse_page(exporter.renderer.page(T_NS, _no_mods())))
    return {(s.name, s.labels["hw.id"], s.labels.get("hw.gpu.task", "")): s.value
            for s in page.samples if s.name.startswith("hw.")}


def _no_mods():  # noqa: ANN202 - the simulator's own constant
    from bridge.simulator.render import NO_MODS

    return NO_MODS


def test_the_legacy_and_the_dcgm47_names_give_the_same_semconv_points():
    legacy, dcgm47 = _hw_points("legacy"), _hw_points("dcgm49")
    names = {name for name, _, _ in legacy}
    assert {"hw.power", "hw.energy", "hw.gpu.utilization", "hw.gpu.memory.usage"} <= names
    assert legacy.keys() == dcgm47.keys() - {k for k in dcgm47 if k[0] == "hw.gpu.memory.limit"}
    for key, value in legacy.items():
        assert dcgm47[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


def test_a_gpu_metric_is_renamed_scaled_and_attributed_and_the_rest_is_kept():
    labels = {"gpu": "0", "UUID": "GPU-1", "modelName": "H100", "Hostname": "n1"}
    page = ParsedPage(
        [Sample("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", labels, 5_000.0),
         Sample("DCGM_FI_DEV_GPU_UTIL", labels, 40.0), Sample("DCGM_FI_DEV_FB_USED", labels, 2.0),
         Sample("DCGM_FI_DEV_GPU_TEMP", labels, 61.0)],
        {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter", "DCGM_FI_DEV_GPU_UTIL": "gauge",
         "DCGM_FI_DEV_FB_USED": "gauge", "DCGM_FI_DEV_GPU_TEMP": "gauge"}, {}, [])
    energy, util, used, temp = page_to_semconv(page).samples
    assert (energy.name, energy.value) == ("hw.energy", 5.0)  # mJ -> J
    assert (util.name, util.value, util.labels["hw.gpu.task"]) == ("hw.gpu.utilization", 0.4, "general")
    assert (used.name, used.value) == ("hw.gpu.memory.usage", 2 * 1048576)
    assert temp == page.samples[3]
    assert {"hw.id": "GPU-1", "hw.type": "gpu", "hw.vendor": "NVIDIA"}.items() <= energy.labels.items()
    assert energy.labels["Hostname"] == "n1"
    assert page_to_semconv(page).types["hw.energy"] == "counter"


def test_every_mapped_family_has_a_unit_and_a_help_text():
    for family, metric in SEMCONV.items():
        assert metric.unit in ("1", "By", "W", "J"), family
        assert metric.kind in ("gauge", "counter"), family


def test_names_other_than_exporter_and_semconv_are_refused():
    assert resolve_config({}, endpoint="http://127.0.0.1:1").names == "exporter"  # type: ignore[union-attr]
    assert resolve_config({}, endpoint="http://127.0.0.1:1", names="semconv").names == "semconv"  # type: ignore[union-attr]
    with pytest.raises(OtlpConfigError, match="use exporter or semconv"):
        resolve_config({}, endpoint="http://127.0.0.1:1", names="otel")


# Metric names as the store makes them: as sent, or Prometheus' translation with the conventions' units.
NAMING = {"victoria_metrics": ("hw.power", "hw.energy", "hw.gpu.utilization", "hw.id", "hw.type"),
          "victoria_metrics_prom_naming": ("hw_power_watts", "hw_energy_joules_total", "hw_gpu_utilization_ratio",
                                           "hw_id", "hw_type")}


@pytest.mark.realstack
@pytest.mark.parametrize("store", list(NAMING))
def test_a_sidecar_with_semconv_names_forwards_hw_metrics_with_their_units(store, request, tmp_path):
    from bridge.config import Config
    from bridge.endpoints import TelemetryItems
    from bridge.fields import default_table
    from bridge.otlp import OtlpForwarder
    from bridge.sidecar.session import Session

    victoria_metrics = request.getfixturevalue(store)
    power_name, energy_name, util_name, hw_id, hw_type = NAMING[store]
    run = f"semconv-run-{store}"
    otlp = resolve_config({}, endpoint=victoria_metrics.otlp_url, export_interval_s=0.2, names="semconv")
    assert otlp is not None
    with SimulatedExporter(SimulatorConfig(gpus=2, seed=6, dialect="dcgm49")) as exporter:
        config = Config(telemetry=TelemetryItems(urls=[exporter.url]), default_endpoints=[],
                        artifact_dir=str(tmp_path), collection_interval=0.1, run_id=run, shutdown_delay=10.0)
        session = Session(config, default_table(), forwarder=OtlpForwarder(otlp, base_resource={}))
        session.configure()
        session.start()
        wait_until(lambda: session.records_written >= 2 * 5, 30.0, "five scrapes")
        session.complete(requests_end_ns=time.time_ns())
    victoria_metrics.flush()
    at = time.time()
    # Range selectors: the run's end wrote staleness markers.
    power = prom_query(victoria_metrics.base, f'last_over_time({{__name__="{power_name}", run_id="{run}"}}[1m])', at)
    assert len(power) == 2 and all(r["metric"][hw_type] == "gpu" for r in power)
    uuids = {gpu.uuid for gpu in exporter.model.gpus}
    assert {r["metric"][hw_id] for r in power} == uuids
    energy = prom_query(victoria_metrics.base, f'{{__name__="{energy_name}", run_id="{run}"}}[1m]', at)
    assert len(energy) == 2
    for series in energy:  # joules, moving
        values = [float(v) for _, v in series["values"] if v != "NaN"]  # the staleness marker at the end
        assert values[-1] > values[0] > 0
    util = prom_query(victoria_metrics.base,
                      f'last_over_time({{__name__="{util_name}", run_id="{run}"}}[1m])', at)
    assert util and all(0 <= float(r["value"][1]) <= 1 for r in util)
    assert not prom_query(victoria_metrics.base, f'DCGM_FI_DEV_BOARD_POWER_WATTS{{run_id="{run}"}}[1m]', at)


def test_the_otlp_names_flag_reaches_the_forwarder():
    from bridge.sidecar.cli import build_forwarder

    forwarder, _ = build_forwarder({"otlp_endpoint": "http://127.0.0.1:1", "otlp_names": "semconv"})
    assert forwarder is not None
    try:
        assert forwarder.config.names == "semconv"
    finally:
        forwarder.close(0.1)
