"""Samples -> stages: what the GPU did while each stage was open on the host.

A sample belongs to every stage instance whose host interval ``[start, end)`` contains its
time (nested stages each get it, as inclusive times do). Everything is sort + searchsorted +
cumulative sums over numpy columns; no Python loop over rows or instances (only over the
few devices).

- mean / peak of a metric: over the samples inside the instance (NaN rows skipped).
- GPM metrics (SM activity, occupancy, tensor, DRAM bandwidth) are read >= 100 ms apart, so
  a short stage often contains no GPM row. Such an instance takes the value of the GPM window
  that contains its midpoint (a window's value is in the first GPM row after it); the table
  counts how many instances used that fallback (``gpm_window_instances``).
- energy: the difference of the energy counter, linearly interpolated at the instance's start
  and end (so stages shorter than the sampling interval still get a share); NaN when the
  instance is not inside the sampled time.
- throttling: the OR of the throttle bits of the samples inside; ``hw_throttle_samples``
  counts samples with clocks held down by a limit (not idle, not clock settings), split into
  ``power_cap_samples`` (the driver staying under the power limit: power-bound) and
  ``thermal_hw_samples`` (thermal or hardware slowdown).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from maxinstr.sample.base import GPM_METRICS, HW_THROTTLE_MASK, POWER_CAP_MASK, THERMAL_HW_MASK
from maxinstr.sample.read import Samples

_MEAN_COLUMNS = ("gpu_util_pct", "mem_util_pct", "power_w") + GPM_METRICS
_PEAK_COLUMNS = ("gpu_util_pct", "mem_used_bytes", "power_w", "sm_active_pct", "temp_c")


@dataclass
class InstanceSamples:
    """Per stage instance (aligned with the intervals given), for one device."""

    device: int
    n_samples: np.ndarray
    mean: dict[str, np.ndarray]  # column -> mean over the instance (NaN: no sample)
    count: dict[str, np.ndarray]  # column -> samples with a value (weights for means over instances)
    peak: dict[str, np.ndarray]  # column -> max over the instance
    energy_j: np.ndarray
    throttle: np.ndarray  # OR of throttle bits (uint32)
    hw_throttle_samples: np.ndarray
    gpm_window: np.ndarray  # bool: GPM values came from the enclosing GPM window
    power_cap_samples: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    thermal_hw_samples: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


@dataclass
class StageSamples:
    """Per (stage name, device): the columns a report shows. ``name_id`` indexes the
    caller's names; rows sorted by (name_id, device)."""

    name_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    device: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    instances: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    samples: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    gpu_util_mean_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    gpu_util_peak_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    mem_util_mean_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    sm_active_mean_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    sm_active_peak_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    sm_occupancy_mean_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    tensor_active_mean_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    dram_bw_util_mean_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    mem_used_peak_bytes: np.ndarray = field(default_factory=lambda: np.empty(0))
    power_mean_w: np.ndarray = field(default_factory=lambda: np.empty(0))
    power_peak_w: np.ndarray = field(default_factory=lambda: np.empty(0))
    temp_peak_c: np.ndarray = field(default_factory=lambda: np.empty(0))
    energy_total_j: np.ndarray = field(default_factory=lambda: np.empty(0))
    energy_per_instance_j: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Mean over the instances that have an energy value."""
    energy_instances: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    hw_throttle_samples: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    power_cap_samples: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    thermal_hw_samples: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    throttle_mask: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint32))
    gpm_window_instances: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    def __len__(self) -> int:
        return len(self.name_id)


def _range_sum_count(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    valid = ~np.isnan(x)
    cs = np.concatenate(([0.0], np.cumsum(np.where(valid, x, 0.0), dtype=np.float64)))
    cn = np.concatenate(([0], np.cumsum(valid, dtype=np.int64)))
    return cs[hi] - cs[lo], cn[hi] - cn[lo]


def _range_reduce(ufunc: np.ufunc, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, empty: float | int) -> np.ndarray:
    """``ufunc.reduce(x[lo:hi])`` for every pair; ``empty`` where lo == hi."""
    if len(lo) == 0:
        return np.empty(0, dtype=x.dtype)
    ext = np.concatenate((x, np.array([empty], dtype=x.dtype)))
    idx = np.empty(2 * len(lo), dtype=np.int64)
    idx[0::2], idx[1::2] = lo, hi
    out = ufunc.reduceat(ext, idx)[0::2]
    return np.where(hi > lo, out, np.array(empty, dtype=x.dtype))


def instance_samples(dev: Samples, device: int, start_ns: np.ndarray, end_ns: np.ndarray) -> InstanceSamples:
    """Per-instance sample statistics for one device's rows (``dev``: rows of that device,
    sorted by time) and stage host intervals ``[start_ns, end_ns)``."""
    start = np.asarray(start_ns, dtype=np.int64)
    end = np.maximum(np.asarray(end_ns, dtype=np.int64), start)
    t = dev.t_ns.astype(np.int64, copy=False)
    lo = np.searchsorted(t, start, side="left")
    hi = np.searchsorted(t, end, side="left")
    n = hi - lo
    names = set(dev.rows.dtype.names or ())
    mean: dict[str, np.ndarray] = {}
    count: dict[str, np.ndarray] = {}
    peak: dict[str, np.ndarray] = {}
    gpm_window = np.zeros(len(start), dtype=bool)
    for col in _MEAN_COLUMNS:
        if col not in names:
            continue
        x = dev.rows[col].astype(np.float64)
        s, c = _range_sum_count(x, lo, hi)
        with np.errstate(invalid="ignore", divide="ignore"):
            m = np.where(c > 0, s / np.maximum(c, 1), np.nan)
        c = c.astype(np.float64)
        if col in GPM_METRICS:
            m, used = _gpm_window_fill(t, x, start, end, m)
            gpm_window |= used
            c = np.where(used, 1.0, c)  # a window-filled instance counts as one sample
        mean[col] = m
        count[col] = c
    for col in _PEAK_COLUMNS:
        if col in names:
            peak[col] = _range_reduce(np.fmax, dev.rows[col].astype(np.float64), lo, hi, np.nan)
    energy = np.full(len(start), np.nan)
    if "energy_j" in names:
        e = dev.rows["energy_j"].astype(np.float64)
        ok = ~np.isnan(e)
        te, ev = t[ok], e[ok]
        if len(te) >= 2:
            inside = (start >= te[0]) & (end <= te[-1])
            base = ev[0]  # subtract to keep interpolation exact on large counters
            e_start = np.interp(start, te, ev - base)
            e_end = np.interp(end, te, ev - base)
            energy = np.where(inside, e_end - e_start, np.nan)
    throttle = _range_reduce(np.bitwise_or, dev.throttle.astype(np.uint32), lo, hi, 0).astype(np.uint32)

    def samples_with(mask: int) -> np.ndarray:
        cs = np.concatenate(([0], np.cumsum((dev.throttle & mask) != 0, dtype=np.int64)))
        return cs[hi] - cs[lo]

    return InstanceSamples(
        device=device, n_samples=n.astype(np.int64), mean=mean, count=count, peak=peak, energy_j=energy,
        throttle=throttle, hw_throttle_samples=samples_with(HW_THROTTLE_MASK), gpm_window=gpm_window,
        power_cap_samples=samples_with(POWER_CAP_MASK), thermal_hw_samples=samples_with(THERMAL_HW_MASK),
    )


def _gpm_window_fill(t: np.ndarray, x: np.ndarray, start: np.ndarray, end: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For instances with no GPM row inside: the value of the GPM window holding their midpoint."""
    ok = ~np.isnan(x)
    tg, xg = t[ok], x[ok]
    need = np.isnan(m)
    if len(tg) < 2 or not need.any():
        return m, np.zeros(len(m), dtype=bool)
    mid = start + (end - start) // 2
    k = np.searchsorted(tg, mid, side="left")  # first GPM row at/after mid: its window [tg[k-1], tg[k]]
    # the first GPM value covers the time since the GPM sample before it, which has no row:
    # only windows with a known start (k >= 1) qualify
    usable = need & (k >= 1) & (k < len(tg))
    out = m.copy()
    out[usable] = xg[k[usable]]
    return out, usable


def stage_samples(
    samples: Samples,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    name_id: np.ndarray,
    devices: list[int] | None = None,
) -> tuple[StageSamples, list[InstanceSamples]]:
    """Per stage name and device, from stage host intervals and their name ids.

    Returns the per-name table and the per-instance statistics (one per device, aligned
    with the given intervals) for renderers that want distributions.
    """
    name_id = np.asarray(name_id, dtype=np.int32)
    devs = sorted(set(int(d) for d in np.unique(samples.device))) if devices is None else devices
    uniq, inverse = np.unique(name_id, return_inverse=True)
    k = len(uniq)
    rows: dict[str, list[np.ndarray]] = {}
    per_instance: list[InstanceSamples] = []

    def put(name: str, value: np.ndarray) -> None:
        rows.setdefault(name, []).append(value)

    for d in devs:
        inst = instance_samples(samples.for_device(d), d, start_ns, end_ns)
        per_instance.append(inst)
        cnt = np.bincount(inverse, minlength=k)
        put("name_id", uniq.astype(np.int32))
        put("device", np.full(k, d, dtype=np.int32))
        put("instances", cnt.astype(np.int64))
        put("samples", np.bincount(inverse, weights=inst.n_samples, minlength=k).astype(np.int64))

        def wmean(col: str) -> np.ndarray:
            # the mean over all samples of the name: instance means weighted by their sample counts
            m = inst.mean.get(col)
            if m is None:
                return np.full(k, np.nan)
            ok = ~np.isnan(m)
            w = np.where(ok, inst.count[col], 0.0)
            num = np.bincount(inverse, weights=np.where(ok, m, 0.0) * w, minlength=k)
            den = np.bincount(inverse, weights=w, minlength=k)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)

        def gmax(col: str) -> np.ndarray:
            out = np.full(k, np.nan)
            p = inst.peak.get(col)
            if p is not None:
                np.fmax.at(out, inverse, p)
            return out

        put("gpu_util_mean_pct", wmean("gpu_util_pct"))
        put("gpu_util_peak_pct", gmax("gpu_util_pct"))
        put("mem_util_mean_pct", wmean("mem_util_pct"))
        put("sm_active_mean_pct", wmean("sm_active_pct"))
        sm_peak = gmax("sm_active_pct")
        if "sm_active_pct" in inst.mean:  # window-filled instances count towards the peak too
            np.fmax.at(sm_peak, inverse, inst.mean["sm_active_pct"])
        put("sm_active_peak_pct", sm_peak)
        put("sm_occupancy_mean_pct", wmean("sm_occupancy_pct"))
        put("tensor_active_mean_pct", wmean("tensor_active_pct"))
        put("dram_bw_util_mean_pct", wmean("dram_bw_util_pct"))
        put("mem_used_peak_bytes", gmax("mem_used_bytes"))
        put("power_mean_w", wmean("power_w"))
        put("power_peak_w", gmax("power_w"))
        put("temp_peak_c", gmax("temp_c"))
        e_ok = ~np.isnan(inst.energy_j)
        e_sum = np.bincount(inverse, weights=np.where(e_ok, inst.energy_j, 0.0), minlength=k)
        e_n = np.bincount(inverse, weights=e_ok.astype(np.float64), minlength=k).astype(np.int64)
        put("energy_total_j", np.where(e_n > 0, e_sum, np.nan))
        with np.errstate(invalid="ignore", divide="ignore"):
            put("energy_per_instance_j", np.where(e_n > 0, e_sum / np.maximum(e_n, 1), np.nan))
        put("energy_instances", e_n)
        put("hw_throttle_samples", np.bincount(inverse, weights=inst.hw_throttle_samples, minlength=k).astype(np.int64))
        put("power_cap_samples", np.bincount(inverse, weights=inst.power_cap_samples, minlength=k).astype(np.int64))
        put("thermal_hw_samples", np.bincount(inverse, weights=inst.thermal_hw_samples, minlength=k).astype(np.int64))
        mask = np.zeros(k, dtype=np.uint32)
        np.bitwise_or.at(mask, inverse, inst.throttle)
        put("throttle_mask", mask)
        put("gpm_window_instances", np.bincount(inverse, weights=inst.gpm_window, minlength=k).astype(np.int64))

    if not rows:
        return StageSamples(), per_instance
    table = StageSamples(**{name: np.concatenate(parts) for name, parts in rows.items()})
    order = np.lexsort((table.device, table.name_id))
    table = StageSamples(**{name: getattr(table, name)[order] for name in rows})
    return table, per_instance
