"""The simulated GPUs: smooth seeded load, the physics derived from it, and ground truth for tests.

Every quantity is an affine function of a load curve, `0.5 + Σ a·sin(ωt + φ)` kept inside [0.05, 0.95]
by construction (never clipped), so integrals and the first-order thermal lag have closed forms:

    power(t)   = idle + span · load(t)                        W
    energy     = ∫ power dt since the counter's origin        mJ, INT (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
    gpu temp   = ambient + k · lag_τ(power)(t)                the bounded solution of τ·T' = target - T

The counter's origin is boot (a seeded uptime before construction, or `boot_ns`) or the latest counter
reset; ground truth (`energy_joules`) ignores resets. Values are evaluated at the DCGM refresh instant
floor(t / refresh) · refresh, so they repeat between refreshes as the real exporter's do.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bridge.simulator.config import AMD_DIALECTS, NS, SimulatorConfig
from bridge.simulator.schema import FIELDS, MIG_PROFILES, mig_profile_for
from bridge.simulator.sensors import Sensors

Value = int | float
_EPOCH_NS = 1_700_000_000 * NS  # phases are measured from here so sin() arguments stay small
_HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")  # an HGX H100 8-GPU baseboard
_FB_TOTAL_MIB, _FB_RESERVED_MIB = 81_559, 579  # H100 80GB HBM3 as nvidia-smi reports it
_XID = "DCGM_FI_DEV_XID_ERRORS"
_INSTANCE_KEYS = frozenset(f.key for f in FIELDS if f.mig == "instance")
_WHOLE_GPU_KEYS = frozenset(f.key for f in FIELDS if f.mig == "whole-gpu")


def _seconds(t_ns: int) -> float:
    return (t_ns - _EPOCH_NS) / NS


@dataclass(frozen=True, slots=True)
class Curve:
    """offset + Σ amplitude·sin(omega·t + phase), t in seconds since _EPOCH_NS."""

    offset: float
    terms: tuple[tuple[float, float, float], ...] = ()

    def at(self, t_ns: int) -> float:
        s = _seconds(t_ns)
        return self.offset + sum(a * math.sin(w * s + p) for a, w, p in self.terms)

    def integral(self, t0_ns: int, t1_ns: int) -> float:
        """∫ curve dt over [t0, t1], in value × seconds."""
        s0, s1 = _seconds(t0_ns), _seconds(t1_ns)
        waves = sum(a / w * (math.cos(w * s0 + p) - math.cos(w * s1 + p)) for a, w, p in self.terms)
        return self.offset * ((t1_ns - t0_ns) / NS) + waves

    def affine(self, scale: float, offset: float) -> Curve:
        """offset + scale · curve."""
        return Curve(offset + scale * self.offset, tuple((scale * a, w, p) for a, w, p in self.terms))

    def lagged(self, tau_s: float) -> Curve:
        """The bounded solution y of τ·y' = curve - y: each sinusoid is damped and delayed."""
        return Curve(
            self.offset,
            tuple((a / math.hypot(1.0, w * tau_s), w, p - math.atan(w * tau_s)) for a, w, p in self.terms),
        )


def mix(parts: Iterable[tuple[float, Curve]], offset: float = 0.0) -> Curve:
    """offset + Σ weight · curve."""
    terms: list[tuple[float, float, float]] = []
    for weight, curve in parts:
        offset += weight * curve.offset
        terms.extend((weight * a, w, p) for a, w, p in curve.terms)
    return Curve(offset, tuple(terms))


def seeded_load(rng: random.Random) -> Curve:
    """A smooth utilisation curve: minutes-long phases, a benchmark-like swell, second-scale jitter."""
    centre = rng.uniform(0.4, 0.6)
    room = min(centre - 0.05, 0.95 - centre)  # amplitudes sum to at most this: no clipping needed
    shares = (rng.uniform(0.45, 0.55), rng.uniform(0.25, 0.35), rng.uniform(0.1, 0.15))
    periods = (rng.uniform(600, 1800), rng.uniform(60, 300), rng.uniform(5, 20))
    return Curve(centre, tuple(
        (room * share, 2 * math.pi / period, rng.uniform(0, 2 * math.pi))
        for share, period in zip(shares, periods, strict=True)
    ))


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    pci_bus_id: str
    device: str


@dataclass(frozen=True, slots=True)
class Entity:
    """One series group: a whole GPU, or one MIG GPU instance of it (the parent's gpu/UUID)."""

    gpu: int
    instance_id: int | None = None  # NVML GPU-instance ID (label GPU_I_ID)
    profile: str | None = None  # GPU_I_PROFILE
    fb_total_mib: int = _FB_TOTAL_MIB


@dataclass(frozen=True, slots=True)
class _Physics:
    load: Curve  # whole-GPU utilisation, 0.05-0.95
    power: Curve  # W
    gpu_temp: Curve  # °C
    mem_temp: Curve  # °C
    idle_w: float
    span_w: float
    fb_used_mib: int
    replay_every_s: float  # 0: a healthy link that never replays


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every entity's values (legacy units: MHz, C, W, mJ, %, MiB, ns) at one DCGM refresh instant."""

    t_ns: int
    values: tuple[dict[str, Value], ...]  # per entity, keyed by legacy field name; absent = blank


class NodeModel:
    """The node's GPUs. Stateful only in its scripted events (counter resets, XIDs)."""

    def __init__(self, config: SimulatorConfig, now_ns: Callable[[], int] = time.time_ns) -> None:
        self.config = config
        rng = random.Random(f"dcgm-sim:{config.seed}")
        uptime_ns = round(rng.uniform(1, 30) * 86_400 * NS)
        amd = config.dialect in AMD_DIALECTS
        if amd:  # counters near the ~1.9-2.1e7 J amd-smi shows on real MI210/MI300 parts (ROCm/amdsmi#38): ~0.5 days
            uptime_ns = round((0.45 + (uptime_ns / (86_400 * NS) - 1) / 29 * 0.1) * 86_400 * NS)
        self.boot_ns = config.boot_ns if config.boot_ns is not None else now_ns() - uptime_ns
        # Without NODE_NAME the exporter's Hostname is its pod's name: DaemonSet name + 5 characters.
        # (AMD's GPU operator names its exporter DaemonSet default-metrics-exporter: silogen/kaiwo's MI300X lines.)
        daemonset = "default-metrics-exporter-" if amd else "dcgm-exporter-"
        self.hostname = config.hostname or daemonset + "".join(
            rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5)
        )
        self.gpus = tuple(_gpu(i, rng) for i in range(config.gpus))
        self._refresh_ns = config.refresh_ms * 1_000_000
        self._sensors = Sensors() if config.sensors == "h200" else None
        entities: list[Entity] = []
        instance_loads: list[Curve] = []
        physics = []
        self.run_factor = config.power_scale  # the node's power against the seed's own (ground truth for tests)
        if config.repeat is not None:
            self.run_factor *= max(1 + config.run_to_run_cv * random.Random(
                f"dcgm-sim:{config.seed}:repeat:{config.repeat}").gauss(0.0, 1.0), 0.5)
        for gpu in self.gpus:
            grng = random.Random(f"dcgm-sim:{config.seed}:{gpu.index}")
            load = seeded_load(grng)
            if config.repeat is not None:  # the load's randomness: the second-scale jitter's phase drawn anew
                rrng = random.Random(f"dcgm-sim:{config.seed}:{gpu.index}:repeat:{config.repeat}")
                *slow, (a, w, _) = load.terms
                load = Curve(load.offset, (*slow, (a, w, rrng.uniform(0, 2 * math.pi))))
            if config.mig:
                profile = mig_profile_for(config.mig)
                slices, mem_mib, ids = MIG_PROFILES[profile]
                loads = [seeded_load(random.Random(f"dcgm-sim:{config.seed}:{gpu.index}:{i}"))
                         for i in range(config.mig)]
                # Unused slices idle at 0.05; the device load is the slice-weighted mean.
                load = mix(((slices / 7, curve) for curve in loads), 0.05 * (1 - slices * config.mig / 7))
                entities.extend(Entity(gpu.index, ids[i], profile, mem_mib) for i in range(config.mig))
                instance_loads.extend(loads)
            else:
                entities.append(Entity(gpu.index))
                instance_loads.append(load)
            physics.append(_physics(load, grng, amd, self.run_factor))
        self.entities = tuple(entities)
        self._instance_loads = tuple(instance_loads)
        self._physics = tuple(physics)
        self._lock = threading.Lock()
        self._resets: tuple[tuple[int, int | None], ...] = ()  # (at_ns, gpu or None for all)
        self._xids: tuple[tuple[int, int, int], ...] = ()  # (at_ns, gpu, code)
        self.version = 0  # bumped by every scripted event: caches key on it

    # --- scripted events -------------------------------------------------------------------------

    def reset_counters(self, at_ns: int, gpu: int | None = None) -> None:
        """From `at_ns` on, counters count from 0 again (driver reload: every GPU; GPU reset: one)."""
        with self._lock:
            self._resets = (*self._resets, (at_ns, gpu))
            self.version += 1

    def inject_xid(self, gpu: int, code: int, at_ns: int) -> None:
        """From `at_ns` on, XID_ERRORS shows `code` on every series of `gpu` (it never clears, #500)."""
        with self._lock:
            self._xids = tuple(sorted((*self._xids, (at_ns, gpu, code))))
            self.version += 1

    # --- ground truth ----------------------------------------------------------------------------

    def sample_time_ns(self, t_ns: int) -> int:
        """The DCGM refresh instant whose values a request at `t_ns` sees."""
        return t_ns - t_ns % self._refresh_ns if self._refresh_ns else t_ns

    def power_watts(self, gpu: int, t_ns: int) -> float:
        """The true instantaneous power at `t_ns` (no refresh quantisation, no mW rounding)."""
        return self._physics[gpu].power.at(t_ns)

    def energy_joules(self, gpu: int, t0_ns: int, t1_ns: int) -> float:
        """The energy the GPU really consumed over [t0, t1], whatever the counters did."""
        ph = self._physics[gpu]
        return ph.idle_w * ((t1_ns - t0_ns) / NS) + ph.span_w * ph.load.integral(t0_ns, t1_ns)

    def counter_origin_ns(self, gpu: int, t_ns: int) -> int:
        """When the counters shown at `t_ns` started from 0: boot or the latest reset before."""
        t = self.sample_time_ns(t_ns)
        resets = [at for at, g in self._resets if at <= t and (g is None or g == gpu)]
        return max([self.boot_ns, *resets])

    def counter_mj(self, gpu: int, t_ns: int) -> int:
        """What the exporter shows for TOTAL_ENERGY_CONSUMPTION at `t_ns`: whole mJ since the origin (at the
        counter's last update, with sensors that hold it)."""
        t = self.sample_time_ns(t_ns)
        return self._counter_mj(gpu, self.counter_origin_ns(gpu, t), t)

    def served_power_watts(self, gpu: int, t_ns: int) -> float:
        """What the exporter shows for POWER_USAGE at `t_ns`: the true power at DCGM's sample, or what the sensors
        made of it (a one-second average, `sensors`)."""
        t = self.sample_time_ns(t_ns)
        ph = self._physics[gpu]
        if self._sensors is None:
            return round(ph.idle_w + ph.span_w * ph.load.at(t), 3)
        return self._sensors.gauge_w(lambda at: self.energy_joules(gpu, t - 2 * NS, at), ph.power.at, t)  # (any origin)

    def _counter_mj(self, gpu: int, origin: int, t: int) -> int:
        if self._sensors is not None:
            t = max(self._sensors.counter_instant(t), origin)
        return math.floor(1000 * self.energy_joules(gpu, origin, t))

    def xid_at(self, gpu: int, t_ns: int) -> int | None:
        t = self.sample_time_ns(t_ns)
        codes = [code for at, g, code in self._xids if g == gpu and at <= t]
        return codes[-1] if codes else None

    # --- what the exporter reads -------------------------------------------------------------------

    def snapshot(self, t_ns: int) -> Snapshot:
        t = self.sample_time_ns(t_ns)
        devices = [self._device_values(g, t) for g in range(len(self.gpus))]
        values = []
        for entity, load in zip(self.entities, self._instance_loads, strict=True):
            device = devices[entity.gpu]
            if entity.instance_id is None:
                values.append(device)
                continue
            own = {k: v for k, v in device.items() if k not in _WHOLE_GPU_KEYS and k not in _INSTANCE_KEYS}
            own.update(_engine_values(load.at(t)))
            used = int(entity.fb_total_mib * (0.55 + 0.3 * load.at(t)))
            own.update(_fb_values(entity.fb_total_mib, 0, used))
            if _XID in device:
                own[_XID] = device[_XID]
            values.append(own)
        return Snapshot(t, tuple(values))

    def _device_values(self, gpu: int, t: int) -> dict[str, Value]:
        ph = self._physics[gpu]
        load = ph.load.at(t)
        origin = self.counter_origin_ns(gpu, t)
        up_s = (t - origin) / NS
        load_s = ph.load.integral(origin, t)  # ∫ load dt since the origin, shared by every counter
        energy_mj = self._counter_mj(gpu, origin, t)
        replays = math.floor(up_s / ph.replay_every_s) if ph.replay_every_s else 0
        values: dict[str, Value] = {
            "DCGM_FI_DEV_SM_CLOCK": _round(1410 + 570 * load),
            "DCGM_FI_DEV_MEM_CLOCK": 2619,
            "DCGM_FI_DEV_MEMORY_TEMP": _round(ph.mem_temp.at(t)),
            "DCGM_FI_DEV_GPU_TEMP": _round(ph.gpu_temp.at(t)),
            "DCGM_FI_DEV_POWER_USAGE": self.served_power_watts(gpu, t),  # NVML reports mW
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": energy_mj,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": replays,
            "DCGM_FI_DEV_GPU_UTIL": _round(100 * load),
            "DCGM_FI_DEV_MEM_COPY_UTIL": _round(60 * load),
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0,
            # Throttled for a load-proportional share of the time: 2 % (power cap), 0.2 % (thermal).
            "DCGM_FI_DEV_POWER_VIOLATION": math.floor(0.02 * NS * load_s),
            "DCGM_FI_DEV_THERMAL_VIOLATION": math.floor(0.002 * NS * load_s),
            "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": 0,
            "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": 0,
            "DCGM_FI_DEV_LOW_UTIL_VIOLATION": 0,
            "DCGM_FI_DEV_RELIABILITY_VIOLATION": 0,
            **_fb_values(_FB_TOTAL_MIB, _FB_RESERVED_MIB, ph.fb_used_mib + _round(1024 * load)),
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 0,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 0,
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 0,
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 0,
            # Tensor-parallel all-reduce traffic grows with load (units disputed: DCGM#221).
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": math.floor(40_000 * up_s + 24_000_000 * load_s),
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
            **_engine_values(load),
            "DCGM_FI_PROF_PCIE_TX_BYTES": _round(4.0e7 + 3.5e8 * load),
            "DCGM_FI_PROF_PCIE_RX_BYTES": _round(9.0e7 + 8.5e8 * load),
        }
        xid = self.xid_at(gpu, t)
        if xid is not None:
            values[_XID] = xid
        return values


def _round(x: float) -> int:
    return math.floor(x + 0.5)


def _engine_values(load: float) -> dict[str, Value]:
    """DCP ratios (0-1, six decimals on the page) of an LLM serving workload at this load."""
    return {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": load,
        "DCGM_FI_PROF_SM_ACTIVE": 0.93 * load,
        "DCGM_FI_PROF_SM_OCCUPANCY": 0.41 * load,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.52 * load,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.66 * load,
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.0,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.08 * load,
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.03 * load,
    }


def _fb_values(total: int, reserved: int, used: int) -> dict[str, Value]:
    """DCGM's FB fields add up: total = free + used + reserved (MiB)."""
    return {
        "DCGM_FI_DEV_FB_TOTAL": total,
        "DCGM_FI_DEV_FB_FREE": total - reserved - used,
        "DCGM_FI_DEV_FB_USED": used,
        "DCGM_FI_DEV_FB_RESERVED": reserved,
    }


def _physics(load: Curve, rng: random.Random, amd: bool = False, factor: float = 1.0) -> _Physics:
    """An H100 SXM: ~70 W idle, ~680 W at full load; GPU and HBM temperatures lag power by minutes. `amd`: an
    MI300X, 136-139 W idle as its exporter reports it (amd_gpu_package_power, ROCm/device-metrics-exporter PR #558),
    up to its 750 W socket power (the same draws, rescaled, so the seeds' other values stay as they were). `factor`
    scales the power (a repeat's run-to-run variation, a configuration's power_scale)."""
    idle_w, span_w, ambient = rng.uniform(62, 78), rng.uniform(590, 630), rng.uniform(26, 32)
    if amd:
        idle_w, span_w = 136 + (idle_w - 62) / 16 * 3, span_w - 20
    idle_w, span_w = idle_w * factor, span_w * factor  # (factor 1 leaves the seed's values as they were)
    power = load.affine(span_w, idle_w)
    return _Physics(
        load=load,
        power=power,
        gpu_temp=power.lagged(rng.uniform(40, 80)).affine(0.062, ambient),
        mem_temp=power.lagged(rng.uniform(90, 150)).affine(0.055, ambient + 4),
        idle_w=idle_w,
        span_w=span_w,
        fb_used_mib=rng.randrange(62_000, 74_000),  # weights + a pre-allocated KV cache
        replay_every_s=rng.choice((0.0, 0.0, 0.0, rng.uniform(600, 3600))),
    )


def _gpu(index: int, rng: random.Random) -> Gpu:
    h = f"{rng.getrandbits(128):032x}"
    uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    domain, bus = divmod(index, len(_HGX_BUSES))
    return Gpu(index, uuid, f"{domain:08X}:{_HGX_BUSES[bus]}:00.0", f"nvidia{index}")


class ManualClock:
    """A clock tests and benches move by hand: `clock()` reads it, `advance(ns)` moves it."""

    def __init__(self, start_ns: int = 1_750_000_000 * NS) -> None:
        self._t = start_ns
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return self._t

    def advance(self, ns: int) -> int:
        with self._lock:
            self._t += ns
            return self._t

    def set(self, t_ns: int) -> None:
        with self._lock:
            self._t = t_ns


def scaled_clock(scale: float, base: Callable[[], int] = time.time_ns) -> Callable[[], int]:
    """A clock that runs `scale` times faster than `base` from now on (hours of load in minutes)."""
    start = base()
    return lambda: start + int((base() - start) * scale)
