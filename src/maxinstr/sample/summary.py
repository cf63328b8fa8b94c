"""Per-GPU summary of a sampling window and the "is my GPU used?" verdict (``snapshot``), over
the active window (first to last sample with any utilization). The rules are :data:`THRESHOLDS`;
a busy GPU whose kernels fill few SMs is launch/sync-bound: NVML "utilization" is the share of
time *some* kernel ran, not how much of the GPU it used, which SM activity (Hopper+ GPM) says.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from maxinstr.rundir.reader import Samples
from maxinstr.rundir.samples import HW_THROTTLE_MASK, POWER_CAP_MASK, THERMAL_HW_MASK, THROTTLE_BITS

IDLE_PEAK_UTIL_PCT = 5.0
BUSY_UTIL_PCT = 70.0
SM_ACTIVE_LOW_PCT = 25.0

THRESHOLDS = {
    "idle": f"peak util < {IDLE_PEAK_UTIL_PCT:g}%",
    "busy": f"mean util >= {BUSY_UTIL_PCT:g}% and SM activity >= {SM_ACTIVE_LOW_PCT:g}% (when measured)",
    "launch/sync-bound": f"mean util >= {BUSY_UTIL_PCT:g}% but SM activity < {SM_ACTIVE_LOW_PCT:g}%",
    "host-bound": f"otherwise (mean util < {BUSY_UTIL_PCT:g}%)",
}


@dataclass
class GpuSummary:
    """One GPU over the sampled window. Percentages in 0..100; NaN when not measured."""

    device: int
    visible_index: int
    name: str
    samples: int
    window_s: float
    active_s: float
    util_mean_pct: float
    util_peak_pct: float
    sm_active_mean_pct: float
    sm_active_peak_pct: float
    tensor_active_mean_pct: float
    mem_used_peak_bytes: float
    mem_total_bytes: float
    power_mean_w: float
    power_peak_w: float
    energy_j: float
    sm_clock_mean_mhz: float
    sm_clock_max_mhz: float
    throttle_pct: dict[str, float] = field(default_factory=dict)  # reason -> % of the window's samples
    hw_throttle_pct: float = 0.0  # clocks held below maximum by any limit (power cap or thermal/HW)
    power_cap_pct: float = 0.0  # the driver under the power limit: normal for a loaded GPU (power-bound)
    thermal_hw_pct: float = 0.0  # thermal or hardware slowdown (heat, power brake, current limit)
    verdict: str = "idle"
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in asdict(self).items()}


def _stat(fn, x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(fn(x)) if len(x) else float("nan")


def verdict(util_mean: float, util_peak: float, sm_active_mean: float) -> tuple[str, str]:
    """The verdict and the rule that fired."""
    if not np.isfinite(util_peak):
        return "unknown", "this device does not report utilization (e.g. a MIG instance)"
    if util_peak < IDLE_PEAK_UTIL_PCT:
        return "idle", f"peak util {util_peak:.0f}% < {IDLE_PEAK_UTIL_PCT:g}%"
    if util_mean >= BUSY_UTIL_PCT:
        if np.isfinite(sm_active_mean) and sm_active_mean < SM_ACTIVE_LOW_PCT:
            return "launch/sync-bound", (
                f"util {util_mean:.0f}% >= {BUSY_UTIL_PCT:g}% but SM activity {sm_active_mean:.0f}% < {SM_ACTIVE_LOW_PCT:g}%")
        sm = f", SM activity {sm_active_mean:.0f}% >= {SM_ACTIVE_LOW_PCT:g}%" if np.isfinite(sm_active_mean) else ", SM activity not measured"
        return "busy", f"util {util_mean:.0f}% >= {BUSY_UTIL_PCT:g}%{sm}"
    sm = f", SM activity {sm_active_mean:.0f}%" if np.isfinite(sm_active_mean) else ""
    return "host-bound", f"util {util_mean:.0f}% < {BUSY_UTIL_PCT:g}%{sm}"


def summarize(samples: Samples) -> list[GpuSummary]:
    out: list[GpuSummary] = []
    devices = samples.devices
    for d in sorted(set(int(x) for x in np.unique(samples.device))):
        rows = samples.for_device(d)
        info = devices[d] if d < len(devices) else {}
        t = rows.t_ns
        util = rows.column("gpu_util_pct").astype(np.float64)
        busy = np.flatnonzero(np.nan_to_num(util) > 0)
        win = slice(busy[0], busy[-1] + 1) if len(busy) else slice(0, len(rows))
        w = rows.rows[win]
        wu = w["gpu_util_pct"].astype(np.float64)
        sm = w["sm_active_pct"].astype(np.float64)
        energy = rows.column("energy_j").astype(np.float64)
        e_ok = energy[~np.isnan(energy)]
        thr = w["throttle"]
        n = max(1, len(w))
        throttle_pct = {name: 100.0 * float(np.count_nonzero(thr & (1 << i))) / n
                        for i, (name, _) in enumerate(THROTTLE_BITS) if np.any(thr & (1 << i))}
        u_mean, u_peak, sm_mean = _stat(np.mean, wu), _stat(np.max, wu), _stat(np.mean, sm)
        v, why = verdict(u_mean, u_peak, sm_mean)
        out.append(GpuSummary(
            device=d, visible_index=int(info.get("visible_index", d)), name=str(info.get("name", "")),
            samples=len(rows), window_s=float(t[-1] - t[0]) * 1e-9 if len(t) > 1 else 0.0,
            active_s=float(w["t_ns"][-1] - w["t_ns"][0]) * 1e-9 if len(w) > 1 else 0.0,
            util_mean_pct=u_mean, util_peak_pct=u_peak, sm_active_mean_pct=sm_mean,
            sm_active_peak_pct=_stat(np.max, sm),
            tensor_active_mean_pct=_stat(np.mean, w["tensor_active_pct"].astype(np.float64)),
            mem_used_peak_bytes=_stat(np.max, rows.column("mem_used_bytes").astype(np.float64)),
            mem_total_bytes=float(info.get("mem_total_bytes") or np.nan),
            power_mean_w=_stat(np.mean, w["power_w"].astype(np.float64)),
            power_peak_w=_stat(np.max, rows.column("power_w").astype(np.float64)),
            energy_j=float(e_ok[-1] - e_ok[0]) if len(e_ok) > 1 else float("nan"),
            sm_clock_mean_mhz=_stat(np.mean, w["sm_clock_mhz"].astype(np.float64)),
            sm_clock_max_mhz=float(info.get("sm_clock_max_mhz") or np.nan), throttle_pct=throttle_pct,
            hw_throttle_pct=100.0 * float(np.count_nonzero(thr & HW_THROTTLE_MASK)) / n,
            power_cap_pct=100.0 * float(np.count_nonzero(thr & POWER_CAP_MASK)) / n,
            thermal_hw_pct=100.0 * float(np.count_nonzero(thr & THERMAL_HW_MASK)) / n, verdict=v, why=why))
    return out
