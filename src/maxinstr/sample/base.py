"""The sampler's small vendor interface, the row layout every vendor fills, and the null backend.

A :class:`Backend` opens a vendor library and hands out one :class:`Device` per visible GPU.
A device fills a preallocated list of metric values (``NaN`` = not read in this row) and
returns the throttle bits it saw; it never raises into the sampler: vendor errors are
translated where they enter (``nvml.py``, ``amdsmi.py``) and reported through
:class:`ErrorLog`, once each. The row layout is vendor-neutral, so a reader never needs to
know which library wrote it.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

NAN = math.nan

# --------------------------------------------------------------------------- row layout
# (name, struct code, unit, what). Header fields first, then metrics. Float metrics are
# NaN when absent (unsupported on this device, or not read in this row: GPM and "slow"
# metrics have their own cadence, see flags).
HEADER: tuple[tuple[str, str, str, str], ...] = (
    ("t_ns", "q", "ns", "host clock (CLOCK_MONOTONIC) when this device's read began"),
    ("device", "H", "", "index into samples.json 'devices'"),
    ("flags", "H", "", "bit 0 GPM: GPM metrics read in this row; bit 1 SLOW: slow metrics read; bit 2 LOST: device lost, last row"),
    ("read_ns", "I", "ns", "time the sampler spent reading this device for this row"),
    ("throttle", "I", "", "vendor-neutral throttle bits, names in samples.json 'throttle_bits'"),
    ("throttle_raw", "Q", "", "the vendor's own reason bitmask (NVML clocks-event reasons; AMD indep_throttle_status), 0 when none"),
)

METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("gpu_util_pct", "f", "%", "time some kernel ran (NVML utilization.gpu / AMD gfx_activity)"),
    ("mem_util_pct", "f", "%", "memory-controller busy time (NVML utilization.memory / AMD umc_activity)"),
    ("mem_used_bytes", "d", "B", "device memory used (all processes)"),
    ("proc_mem_bytes", "d", "B", "device memory used by the watched process(es); slow cadence"),
    ("sm_clock_mhz", "f", "MHz", "SM / graphics clock"),
    ("mem_clock_mhz", "f", "MHz", "memory clock"),
    ("power_w", "f", "W", "board power draw"),
    ("energy_j", "d", "J", "energy counter (monotonic; differences are energy)"),
    ("temp_c", "f", "C", "GPU temperature (NVML GPU sensor / AMD hotspot); slow cadence"),
    ("sm_active_pct", "f", "%", "GPM SM activity: SMs busy x time (Hopper+ only), GPM cadence"),
    ("sm_occupancy_pct", "f", "%", "GPM SM occupancy: resident warps / max, GPM cadence"),
    ("tensor_active_pct", "f", "%", "GPM tensor-pipe activity (any tensor op), GPM cadence"),
    ("dram_bw_util_pct", "f", "%", "GPM DRAM bandwidth utilization, GPM cadence"),
)

METRIC_NAMES: tuple[str, ...] = tuple(m[0] for m in METRICS)
COL: dict[str, int] = {name: i for i, name in enumerate(METRIC_NAMES)}
"""Metric name -> position in the values list a device fills."""

ROW_FORMAT = "<" + "".join(f[1] for f in HEADER + METRICS)

FLAG_GPM = 1
FLAG_SLOW = 2
FLAG_LOST = 4

GPM_METRICS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_util_pct")
SLOW_METRICS = ("proc_mem_bytes", "temp_c")

# ------------------------------------------------------------------------ throttle bits
# Vendor-neutral reasons a GPU's clocks are below maximum. Groups: "idle" is not a problem,
# "setting" is someone's configuration, "throttle" is the hardware/firmware holding the
# GPU back (what a report must flag).
THROTTLE_BITS: tuple[tuple[str, str], ...] = (
    ("idle", "idle"),  # 0: nothing to do, clocks lowered
    ("app_clocks", "setting"),  # 1: applications clocks setting
    ("sw_power_cap", "throttle"),  # 2: power draw at the software power limit
    ("hw_slowdown", "throttle"),  # 3: hardware slowdown (power brake, thermal, ...)
    ("sync_boost", "setting"),  # 4: held to another GPU's clocks (sync boost group)
    ("sw_thermal", "throttle"),  # 5: software thermal slowdown
    ("hw_thermal", "throttle"),  # 6: hardware thermal slowdown
    ("hw_power_brake", "throttle"),  # 7: external power brake assertion
    ("display_clocks", "setting"),  # 8: display clock setting
    ("user_clocks", "setting"),  # 9: user-defined (locked) clocks
    ("current_limit", "throttle"),  # 10: AMD TDC/EDC current limit
    ("throttled_unknown", "throttle"),  # 11: vendor says throttled, cause not given
)
THROTTLE_NAMES: tuple[str, ...] = tuple(t[0] for t in THROTTLE_BITS)
THROTTLE_BIT: dict[str, int] = {name: 1 << i for i, name in enumerate(THROTTLE_NAMES)}
HW_THROTTLE_MASK = sum(1 << i for i, (_, group) in enumerate(THROTTLE_BITS) if group == "throttle")
SETTING_MASK = sum(1 << i for i, (_, group) in enumerate(THROTTLE_BITS) if group == "setting")
IDLE_MASK = THROTTLE_BIT["idle"]


def throttle_names(mask: int) -> list[str]:
    """The names of the vendor-neutral throttle bits set in ``mask``."""
    return [name for i, name in enumerate(THROTTLE_NAMES) if mask >> i & 1]


# ------------------------------------------------------------------------ errors, once
class ErrorLog:
    """Errors and absences met while sampling, recorded once per key (thread-safe).

    ``on_new`` is called (outside the lock) after a new entry is added, so the writer can
    persist it; it must not raise.
    """

    def __init__(self, clock: Callable[[], int], on_new: Callable[[], None] | None = None) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: set[tuple] = set()
        self.entries: list[dict[str, Any]] = []
        self.on_new = on_new

    def once(self, key: tuple, kind: str, message: str, device: int | None = None, metric: str | None = None) -> bool:
        """Record ``message`` unless ``key`` was seen; True when it was new. ``device`` is the
        GPU's visible index (``cuda:N``)."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            self.entries.append(
                {"t_ns": self._clock(), "kind": kind, "device": device, "metric": metric, "message": message}
            )
        if self.on_new is not None:
            try:
                self.on_new()
            except Exception:  # noqa: BLE001 - persisting an error must never raise into sampling
                pass
        return True

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.entries)


# ----------------------------------------------------------------------- devices
@dataclass
class DeviceInfo:
    """What a device is, written into samples.json once. Units in names."""

    vendor: str  # "nvidia", "amd", "null"
    visible_index: int  # the index the user's framework calls it (cuda:N / hip:N)
    physical_index: int  # the vendor library's enumeration index (-1 for MIG / unknown)
    name: str = ""
    uuid: str = ""
    pci_bus_id: str = ""
    mig: bool = False
    sm_clock_max_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    mem_total_bytes: float | None = None
    power_limit_w: float | None = None
    gpm: bool = False
    absent: list[str] = field(default_factory=list)
    """Metrics this device does not support (NaN in every row)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class DeviceLost(Exception):
    """Raised by a vendor device's ``read`` when the GPU is gone; the sampler stops that device."""


class Device(ABC):
    """One visible GPU. ``read`` fills ``values`` (pre-filled with NaN) and returns
    ``(flags, throttle_bits, throttle_raw)``. It may raise :class:`DeviceLost`; any other
    vendor error must be handled inside (metric marked absent or error recorded once)."""

    info: DeviceInfo

    @abstractmethod
    def read(self, values: list[float], tick: int, now_ns: int) -> tuple[int, int, int]: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release per-device vendor resources (GPM sample buffers)."""


class Backend(ABC):
    """A vendor library opened for sampling."""

    name: str = "none"

    @abstractmethod
    def devices(self) -> list[Device]: ...

    def versions(self) -> dict[str, str]:
        """Driver / library versions, for samples.json."""
        return {}

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Close the vendor library."""


class NullDevice(Device):
    """A device that reads nothing: every metric absent. Used where no GPU library exists and
    to measure the sampler's own Python cost (thread wake-up, row packing, write)."""

    def __init__(self, visible_index: int = 0) -> None:
        self.info = DeviceInfo(vendor="null", visible_index=visible_index, physical_index=-1, name="null")

    def read(self, values: list[float], tick: int, now_ns: int) -> tuple[int, int, int]:
        return 0, 0, 0


class NullBackend(Backend):
    """No vendor library: no devices (or ``n`` null devices, for cost measurements).

    ``reason`` says why there is no real backend, e.g. "NVML: libnvidia-ml.so.1 not found;
    amdsmi: not installed"; it is written into samples.json and printed by ``snapshot``.
    """

    name = "none"

    def __init__(self, reason: str = "", n_devices: int = 0) -> None:
        self.reason = reason
        self._n = n_devices

    def devices(self) -> list[Device]:
        return [NullDevice(i) for i in range(self._n)]


def nan_values() -> list[float]:
    """A fresh values list, all metrics absent."""
    return [NAN] * len(METRICS)


# ------------------------------------------------------------- probe-based vendor devices
ABSENT, LOST, RETRY = "absent", "lost", "retry"
MAX_FAILS_IN_A_ROW = 100


class Probe:
    """One metric read: ``fn(values)`` fills its columns. ``columns`` are marked absent
    when the probe is dropped."""

    __slots__ = ("name", "fn", "columns", "fails")

    def __init__(self, name: str, fn: Callable[[list], None], columns: tuple[str, ...] | None = None) -> None:
        self.name = name
        self.fn = fn
        self.columns = (name,) if columns is None else columns
        self.fails = 0


class ProbeDevice(Device):
    """A device read by a fixed tuple of probes (fast: every row; slow: every
    ``slow_every``-th row). Subclasses translate their vendor's errors in ``classify``:
    ABSENT drops the probe (recorded once), LOST raises :class:`DeviceLost`, RETRY records
    once per error and drops the probe after ``MAX_FAILS_IN_A_ROW`` failures in a row."""

    _fast: tuple[Probe, ...] = ()
    _slow: tuple[Probe, ...] = ()
    _slow_every: int = 1
    errors: ErrorLog

    def classify(self, exc: Exception) -> tuple[str, str, object]:
        """(ABSENT|LOST|RETRY, one-line description, error key) for a failed vendor call."""
        return RETRY, f"{type(exc).__name__}: {exc}", type(exc).__name__

    def fail(self, probe: Probe, exc: Exception) -> None:
        idx = self.info.visible_index
        kind, what, key = self.classify(exc)
        if kind == LOST:
            self.errors.once((idx, "lost"), "lost", f"gpu{idx}: device lost ({what}); sampling of it stopped", idx, probe.name)
            raise DeviceLost(what)
        probe.fails += 1
        if kind == ABSENT or probe.fails >= MAX_FAILS_IN_A_ROW:
            self._fast = tuple(p for p in self._fast if p is not probe)
            self._slow = tuple(p for p in self._slow if p is not probe)
            for col in probe.columns:
                if col not in self.info.absent:
                    self.info.absent.append(col)
            self.errors.once((idx, probe.name, "absent"), "absent" if kind == ABSENT else "metric",
                             f"gpu{idx}: {probe.name} absent ({what})", idx, probe.name)
        else:
            self.errors.once((idx, probe.name, key), "metric", f"gpu{idx}: {probe.name}: {what} (retrying)", idx, probe.name)

    def read_probes(self, values: list[float], tick: int) -> int:
        """Run the fast probes, and the slow ones on their ticks; returns FLAG_SLOW or 0."""
        for probe in self._fast:
            try:
                probe.fn(values)
                probe.fails = 0
            except Exception as exc:  # noqa: BLE001 - translated in fail()
                self.fail(probe, exc)
        if tick % self._slow_every:
            return 0
        for probe in self._slow:
            try:
                probe.fn(values)
                probe.fails = 0
            except Exception as exc:  # noqa: BLE001
                self.fail(probe, exc)
        return FLAG_SLOW
