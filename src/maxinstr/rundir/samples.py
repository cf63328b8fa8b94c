"""The GPU sampler's files in a part folder (docs/formats.md): ``samples.bin``, fixed-size rows
of the layout below, and ``samples.json``, which describes them (a reader needs no vendor
knowledge). No numpy here: the sampler's child process imports this and nothing heavier.
"""

from __future__ import annotations

import struct
from typing import Any

SAMPLES_FILE = "samples.bin"
SAMPLES_LAYOUT_FILE = "samples.json"
SAMPLES_FORMAT = "maxinstr-samples"
SAMPLES_VERSION = 1

# (name, struct code, unit, what). Float metrics are NaN when absent or not read in this row.
HEADER: tuple[tuple[str, str, str, str], ...] = (
    ("t_ns", "q", "ns", "host clock (CLOCK_MONOTONIC) when this device's read began"),
    ("device", "H", "", "index into samples.json 'devices'"),
    ("flags", "H", "", "bit 0 GPM: GPM metrics read in this row; bit 1 SLOW: slow metrics read; bit 2 LOST: device lost, last row"),
    ("read_ns", "I", "ns", "time the sampler spent reading this device for this row"),
    ("throttle", "I", "", "vendor-neutral throttle bits, names in samples.json 'throttle_bits'"),
    ("throttle_raw", "Q", "", "the vendor's own reason bitmask (NVML clocks-event reasons; AMD indep_throttle_status), 0 when none"),
)
HEADER_FIELDS = tuple(f[0] for f in HEADER)

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
GPM_METRICS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_util_pct")

ROW_FORMAT = "<" + "".join(f[1] for f in HEADER + METRICS)
ROW_SIZE = struct.calcsize(ROW_FORMAT)
_NUMPY_TYPE = {"q": "<i8", "H": "<u2", "I": "<u4", "Q": "<u8", "f": "<f4", "d": "<f8"}

FLAG_GPM = 1
FLAG_SLOW = 2
FLAG_LOST = 4

# Vendor-neutral reasons a GPU's clocks are below maximum, by group: "power_cap" is "power-bound",
# normal for a loaded GPU; "thermal_hw" (heat, power brake, current limit) is what a report flags.
THROTTLE_BITS: tuple[tuple[str, str], ...] = (
    ("idle", "idle"),  # 0: nothing to do, clocks lowered
    ("app_clocks", "setting"),  # 1: applications clocks setting
    ("sw_power_cap", "power_cap"),  # 2: driver holds clocks down to stay under the power limit
    ("hw_slowdown", "thermal_hw"),  # 3: hardware slowdown (power brake, thermal, ...)
    ("sync_boost", "setting"),  # 4: held to another GPU's clocks (sync boost group)
    ("sw_thermal", "thermal_hw"),  # 5: software thermal slowdown
    ("hw_thermal", "thermal_hw"),  # 6: hardware thermal slowdown
    ("hw_power_brake", "thermal_hw"),  # 7: external power brake assertion (hardware)
    ("display_clocks", "setting"),  # 8: display clock setting
    ("user_clocks", "setting"),  # 9: user-defined (locked) clocks
    ("current_limit", "thermal_hw"),  # 10: AMD TDC/EDC current limit
    ("throttled_unknown", "thermal_hw"),  # 11: vendor says throttled, cause not given
)
THROTTLE_NAMES: tuple[str, ...] = tuple(t[0] for t in THROTTLE_BITS)
THROTTLE_BIT: dict[str, int] = {name: 1 << i for i, name in enumerate(THROTTLE_NAMES)}
POWER_CAP_MASK = sum(1 << i for i, (_, group) in enumerate(THROTTLE_BITS) if group == "power_cap")
THERMAL_HW_MASK = sum(1 << i for i, (_, group) in enumerate(THROTTLE_BITS) if group == "thermal_hw")
HW_THROTTLE_MASK = POWER_CAP_MASK | THERMAL_HW_MASK


def row_layout() -> dict[str, Any]:  # as written into samples.json
    return {
        "size": ROW_SIZE,
        "byteorder": "little",
        "fields": [{"name": n, "type": _NUMPY_TYPE[c], "unit": u, "desc": d} for n, c, u, d in HEADER + METRICS],
    }
