"""Normalisation across dialects: identity by UUID (+ MIG instance), sentinels absent, units converted."""

from __future__ import annotations

import pytest

from bridge.fields import CustomMetricsError, default_table, key_for, parse_custom_metrics
from bridge.normalize import Normalizer
from bridge.parse import parse_page
from tests.conftest import DATA

TABLE = default_table()
UUID0 = "GPU-11111111-0000-0000-0000-000000000000"
UUID1 = "GPU-22222222-0000-0000-0000-000000000000"


def records(text: str, table=TABLE):
    return Normalizer(table).records(parse_page(text.encode()), source_url="http://h:9400/metrics",
                                     timestamp_ns=1000)


EXPECTED_GPUS = {
    "dcgm-exporter_readme_blank_sentinel.txt": 1,
    "k8s-ai-conformance_ericsson_t4.txt": 1,
    "k8s-ai-conformance_kops_l4.txt": 1,
    "k8s-ai-conformance_upcloud_l40s.txt": 1,
    "k8s-ai-conformance_vks_vgpu_grid_a100-40c.txt": 1,
    "nvidia-cloud-native-docs_a100_mig.txt": 2,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_GPUS))
def test_every_real_page_yields_the_right_number_of_gpus(name):
    assert len(records((DATA / name).read_text(encoding="utf-8"))) == EXPECTED_GPUS[name]


def test_the_readme_sentinel_is_absent_never_a_value():
    (gpu,) = records((DATA / "dcgm-exporter_readme_blank_sentinel.txt").read_text(encoding="utf-8"))
    assert "nvidia_memory_temp" not in gpu.telemetry_data
    assert gpu.telemetry_data["nvidia_sm_clock"] == 139.0
    assert gpu.namespace is None and gpu.pod_name is None  # empty pod labels mean absent


def test_a_mig_instance_is_its_own_identity_and_device_fields_stay_on_the_parent():
    parent, instance = records((DATA / "nvidia-cloud-native-docs_a100_mig.txt").read_text(encoding="utf-8"))
    assert parent.gpu_uuid == instance.gpu_uuid and (parent.gpu_instance_id, instance.gpu_instance_id) == (None, "13")
    assert instance.gpu_instance_profile == "1g.5gb"
    assert "nvidia_power_usage" in parent.telemetry_data and "nvidia_power_usage" not in instance.telemetry_data
    assert instance.telemetry_data["nvidia_gr_engine_active"] == pytest.approx(99.5687)


def test_device_fields_repeated_on_every_instance_are_counted_once_for_the_parent():
    lines = []
    for gi in ("1", "2", "3"):
        labels = f'gpu="0",UUID="{UUID0}",modelName="A100",GPU_I_PROFILE="1g.10gb",GPU_I_ID="{gi}",Hostname="n"'
        lines += [f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 300.0", f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} 0.5"]
    got = records("\n".join(lines) + "\n")
    powers = [r.telemetry_data.get("nvidia_power_usage") for r in got]
    assert powers.count(300.0) == 1 and sum(p or 0 for p in powers) == 300.0
    assert len(got) == 4  # the parent (from the repeated device fields) and three instances


def test_aiperf_scale_factors_are_applied():
    labels = f'gpu="0",UUID="{UUID0}",modelName="H100"'
    text = (f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} 1000699000\n"
            f"DCGM_FI_DEV_FB_USED{{{labels}}} 70000\nDCGM_FI_PROF_SM_ACTIVE{{{labels}}} 0.898998\n"
            f"DCGM_FI_DEV_POWER_VIOLATION{{{labels}}} 5003000\nDCGM_FI_DEV_XID_ERRORS{{{labels}}} 43\n")
    data = records(text)[0].telemetry_data
    assert data["nvidia_energy_consumption"] == pytest.approx(1.000699)
    assert data["nvidia_memory_used"] == pytest.approx(73.40032)
    assert data["nvidia_sm_utilization"] == pytest.approx(89.8998)
    assert data["nvidia_power_violation"] == pytest.approx(5003.0)
    assert data["nvidia_xid_errors"] == 43.0


@pytest.mark.parametrize(("host_label", "uuid_label", "pod_labels"), [
    ("Hostname", "UUID", 'pod="p",namespace="ns"'),
    ("hostname", "UUID", 'pod="p",namespace="ns"'),
    ("hostname", "uuid", 'pod_name="p",pod_namespace="ns",container_name="c"'),
])
def test_identity_and_pod_labels_in_every_dialect(host_label, uuid_label, pod_labels):
    labels = f'gpu="3",{uuid_label}="{UUID0}",modelName="M",{host_label}="node-a",{pod_labels}'
    text = f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 40\n"
    (gpu,) = records(text)
    assert (gpu.gpu_index, gpu.gpu_uuid, gpu.hostname, gpu.pod_name, gpu.namespace) == (3, UUID0, "node-a", "p", "ns")


@pytest.mark.parametrize(("name", "value", "key", "expected"), [
    ("dcgm_gpu_temp", 41, "nvidia_temperature", 41.0),
    ("dcgm_total_energy_consumption", 2e9, "nvidia_energy_consumption", 2.0),
    ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 2e6, "nvidia_energy_consumption", 2.0),
    ("DCGM_FI_DEV_GPU_UTIL_RATIO", 0.42, "nvidia_gpu_utilization", 42.0),
    ("DCGM_FI_DEV_FB_CAPACITY_BYTES", 5e9, "nvidia_fb_capacity", 5.0),
    ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1.98e9, "nvidia_sm_clock", 1980.0),
    ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 1.593e9, "nvidia_mem_clock", 1593.0),
    ("DCGM_FI_DEV_XID_ERROR", 79, "nvidia_xid_errors", 79.0),
    ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 0.25, "nvidia_pipe_tensor_active", 25.0),
    ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 55, "nvidia_temperature", 55.0),
    ("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", 2e6, "nvidia_pcie_tx_bytes", 2.0),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total", 1e9, "nvidia_energy_consumption", 1.0),
    ("DCGM_FI_DEV_POWER_USAGE_INSTANT", 412.5, "nvidia_power_usage_instant", 412.5),  # field 157, up to 4.8
    ("DCGM_FI_DEV_BOARD_POWER_RAW_WATTS", 412.5, "nvidia_power_usage_instant", 412.5),  # its DCGM 4.7 name
])
def test_every_dialects_names_map_to_the_same_report_units(name, value, key, expected):
    (gpu,) = records(f'{name}{{gpu="0",UUID="{UUID0}",modelName="M"}} {value}\n')
    assert gpu.telemetry_data[key] == pytest.approx(expected)


@pytest.mark.parametrize("value", ["2147483632", "2147483635", "9223372036854775792", "9223372036854775795",
                                   "140737488355328.0", "140737488355331.0", "NaN", "+Inf"])
def test_blank_sentinels_and_non_finite_values_are_absent(value):
    text = (f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{UUID0}",modelName="M"}} {value}\n'
            f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{UUID0}",modelName="M"}} 100\n')
    (gpu,) = records(text)
    assert "nvidia_temperature" not in gpu.telemetry_data and gpu.telemetry_data["nvidia_power_usage"] == 100.0


def test_a_null_label_value_means_absent():
    text = f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{UUID0}",modelName="<<<NULL>>>",GPU_I_PROFILE="<<<NULL>>>"}} 40\n'
    (gpu,) = records(text)
    assert gpu.gpu_model_name is None and gpu.gpu_instance_profile is None and gpu.gpu_instance_id is None


def test_a_gpu_without_uuid_or_model_is_kept_and_costs_the_others_nothing():
    text = ('DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n"} 40\n'
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",UUID="{UUID1}",modelName="M",Hostname="n"}} 50\n')
    first, second = records(text)
    assert first.gpu_uuid == "unknown:n:0" and first.telemetry_data["nvidia_temperature"] == 40.0
    assert second.gpu_uuid == UUID1


def test_two_hosts_behind_one_url_with_the_same_index_stay_apart():
    text = (f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{UUID0}",modelName="M",Hostname="a"}} 40\n'
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{UUID1}",modelName="M",Hostname="b"}} 50\n')
    a, b = records(text)
    assert (a.hostname, a.telemetry_data["nvidia_temperature"]) == ("a", 40.0)
    assert (b.hostname, b.telemetry_data["nvidia_temperature"]) == ("b", 50.0)


def test_nvlink_nvswitch_and_cpu_entities_are_not_gpus():
    text = (f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{UUID0}",modelName="M"}} 40\n'
            'DCGM_FI_DEV_GPU_TEMP{nvswitch="nvswitch0",hostname="n"} 45\n'
            f'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{nvlink="1",gpu="0",gpu_uuid="{UUID0}"}} 7\n'
            'DCGM_FI_DEV_GPU_TEMP{cpu="0"} 60\n')
    (gpu,) = records(text)
    assert gpu.telemetry_data == {"nvidia_temperature": 40.0}


def test_xid_is_a_code_and_unmapped_families_are_left_to_otlp():
    text = (f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="{UUID0}",modelName="M",err_code="79"}} 79\n'
            f'DCGM_EXP_XID_ERRORS_COUNT{{gpu="0",UUID="{UUID0}",modelName="M",xid="79"}} 2\n')
    (gpu,) = records(text)
    assert gpu.telemetry_data == {"nvidia_xid_errors": 79.0}
    assert TABLE.kind_of("nvidia_xid_errors").value == "code"


def test_the_custom_metrics_csv_honours_type_unit_and_scale():
    csv = ("# custom\nDCGM_FI_DEV_RETIRED_DBE, counter, Retired pages from double-bit errors.\n"
           "DCGM_FI_PROF_NVLINK_TX_BYTES_X, gauge, NVLink TX (in MiB).\n"
           "DCGM_FI_DEV_THERMAL_X, counter, Thermal throttling (in ns).\n"
           "DCGM_FI_DEV_POWER_USAGE, gauge, already mapped (in W).\n"
           "DCGM_FI_DRIVER_VERSION, label, Driver Version\n")
    specs = {s.key: s for s in parse_custom_metrics(csv, "m.csv", TABLE)}
    assert set(specs) == {"nvidia_retired_dbe", "nvidia_nvlink_tx_bytes_x", "nvidia_thermal_x"}
    assert specs["nvidia_retired_dbe"].kind.value == "counter"
    assert (specs["nvidia_nvlink_tx_bytes_x"].unit, specs["nvidia_nvlink_tx_bytes_x"].scale) == ("GB", 1.048576e-3)
    assert (specs["nvidia_thermal_x"].unit, specs["nvidia_thermal_x"].scale) == ("us", 1e-3)
    table = TABLE.with_custom(specs.values())
    (gpu,) = records(f'DCGM_FI_DEV_THERMAL_X{{gpu="0",UUID="{UUID0}"}} 5000\n', table)
    assert gpu.telemetry_data == {"nvidia_thermal_x": 5.0}


def test_an_invalid_custom_metrics_line_is_an_error_naming_its_line():
    with pytest.raises(CustomMetricsError, match=r"m\.csv:2: type 'gaug' is not gauge or counter"):
        parse_custom_metrics("DCGM_FI_DEV_A, gauge, ok\nDCGM_FI_DEV_B, gaug, typo\n", "m.csv", TABLE)
    with pytest.raises(CustomMetricsError, match=r"m\.csv:1: expected 'DCGM_FIELD, type, help'"):
        parse_custom_metrics("DCGM_FI_DEV_A gauge\n", "m.csv", TABLE)


def test_the_shipped_counter_csvs_load_as_custom_metrics():
    for name in ("dcgm-exporter_etc_default-counters.csv", "dcgm-exporter_etc_dcp-metrics-included.csv"):
        parse_custom_metrics((DATA / name).read_text(encoding="utf-8"), name, TABLE)
    assert key_for("DCGM_FI_DEV_SM_CLOCK") == "nvidia_sm_clock"
