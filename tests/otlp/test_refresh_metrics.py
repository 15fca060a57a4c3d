"""The exporters' refresh reaches a real OTLP store (VictoriaMetrics) as `dcgm_bridge_exporter_*` gauges, from
the resource `dcgm-bridge`, beside the exporter's own series (issue 15: the stale-exporter alert reads them)."""

from __future__ import annotations

import time

import pytest

from bridge.endpoints import display_key
from bridge.simulator import SimulatedExporter, SimulatorConfig
from tests.otlp.conftest import forwarding_session, prom_query

pytestmark = pytest.mark.realstack  # VictoriaMetrics

RUN = "refresh-otlp-1"


def test_the_refresh_gauges_reach_the_store(victoria_metrics, tmp_path):
    with SimulatedExporter(SimulatorConfig(gpus=1, seed=2, refresh_ms=400)) as exporter:
        session = forwarding_session(victoria_metrics, exporter.url, tmp_path, RUN, 0.05)
        time.sleep(2.0)
        session.complete()
    victoria_metrics.flush()
    endpoint = display_key(exporter.url)
    period = prom_query(victoria_metrics.base,
                        f'last_over_time(dcgm_bridge_exporter_refresh_period_seconds{{run_id="{RUN}"}}[10m])',
                        time.time())
    assert len(period) == 1 and period[0]["metric"]["endpoint"] == endpoint
    assert float(period[0]["value"][1]) == pytest.approx(0.4, rel=0.2)
    last = prom_query(victoria_metrics.base,
                      f'last_over_time(dcgm_bridge_exporter_last_refresh_timestamp_seconds{{run_id="{RUN}"}}[10m])',
                      time.time())
    assert len(last) == 1 and time.time() - 60 < float(last[0]["value"][1]) <= time.time()
    # The exporter's own series are still there, undisturbed by the bridge's page.
    power = prom_query(victoria_metrics.base,
                       f'count(last_over_time(DCGM_FI_DEV_POWER_USAGE{{run_id="{RUN}"}}[10m]))', time.time())
    assert power and float(power[0]["value"][1]) == 1
