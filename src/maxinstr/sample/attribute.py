"""Samples -> stages: what the GPU did while each stage was open on the host, by sort,
searchsorted and cumulative sums over numpy columns (no Python loop over rows or instances).

- mean / peak: over the samples inside the instance's ``[start, end)`` (NaN rows skipped).
- Windowed metrics go by the time their value describes, not the time it was read: a GPM value
  covers the time since the previous GPM row; NVIDIA's ``gpu_util_pct``/``mem_util_pct`` is the
  share of the driver's last sample period (200 ms on the H200) in which a kernel ran, read after
  it ended (the rows inside a 0.25 s matmul stage gave it the idle period before: 15 % for a
  stage run back to back). The value is the windows' mean weighted by their overlap, ``count``
  the covered ns, and per name ``window_share`` how much of the windows' time the stage filled.
- energy: the counter's difference, interpolated at the instance's start and end; NaN outside
  the sampled time.
- throttling: the OR of the bits inside; ``hw_throttle_samples`` counts samples with clocks held
  down by a limit, split into ``power_cap_samples`` and ``thermal_hw_samples``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from maxinstr.rundir.reader import Samples
from maxinstr.rundir.samples import FLAG_GPM, GPM_METRICS, HW_THROTTLE_MASK, POWER_CAP_MASK, THERMAL_HW_MASK

NVML_UTIL_COLUMNS = ("gpu_util_pct", "mem_util_pct")  # windowed on NVIDIA (:func:`util_windows`)
NVML_UTIL_PERIODS_NS = (166_666_667, 200_000_000, 250_000_000, 333_333_333, 500_000_000, 1_000_000_000)
"""Sample periods NVML documents (by GPU); the H200 changes the value every 200.0 ms (docs/sampler.md)."""
NVML_UTIL_PERIOD_MAX_NS = 1_000_000_000
NVML_UTIL_LAG_NS = 25_000_000
"""How long before it is first read an NVML utilization window ends: 23-26 ms on the H200 (driver
580.159.04, .coord/device5 report/kvcache-plain-run: busy from 7544.5 ms, the value read at 7570.1
ms still said idle, the next one 200 ms later 100 %)."""
NVML_GPM_LAG_NS = 87_000_000
"""How long before their row a GPM value's counters were taken: on the H200 (same runs) SM activity
rose ~87 ms after the GPU became busy, and run/window's utilization and GPM edges agree on 86-93
ms with both lags applied. Re-measured by benchmarks/device/35-util-windows.sh."""
WINDOW_SHARE_MIN = 0.5
"""Below this share of its windows' time in the stage, a windowed value describes mostly other
stages or idle time: the report says so instead of printing it."""

_MEAN_COLUMNS = ("gpu_util_pct", "mem_util_pct", "power_w", "sm_clock_mhz") + GPM_METRICS
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
    windows: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # column -> windows' (start, end)
    energy_covered_j: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Energy over the part of the instance inside the counter's readings, and that part's ns
    (an instance the sampler stopped reading in the middle of still gets its power)."""
    energy_covered_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


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
    sm_clock_mean_mhz: np.ndarray = field(default_factory=lambda: np.empty(0))
    tensor_active_mean_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    dram_bw_util_mean_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    mem_used_peak_bytes: np.ndarray = field(default_factory=lambda: np.empty(0))
    power_mean_w: np.ndarray = field(default_factory=lambda: np.empty(0))
    power_peak_w: np.ndarray = field(default_factory=lambda: np.empty(0))
    temp_peak_c: np.ndarray = field(default_factory=lambda: np.empty(0))
    energy_total_j: np.ndarray = field(default_factory=lambda: np.empty(0))
    energy_per_instance_j: np.ndarray = field(default_factory=lambda: np.empty(0))  # over those with a value
    energy_instances: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    energy_power_w: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Energy over the covered time of the name's instances, per second (NaN: none covered)."""
    energy_window_share: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Share of the time between the energy readings around the name's instances spent in them
    (interpolated linearly, a stage filling little of it gets the power of what ran around it)."""
    hw_throttle_samples: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    power_cap_samples: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    thermal_hw_samples: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    throttle_mask: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint32))
    gpm_window_instances: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    gpu_util_window_share: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Share of the utilization windows' time spent in the name's instances (NaN: none covers them)."""
    sm_active_window_share: np.ndarray = field(default_factory=lambda: np.empty(0))

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


def _period(gaps: np.ndarray, periods: tuple[int, ...], tol_ns: np.ndarray) -> int | None:
    """The largest candidate period of which >= 80 % of ``gaps`` (between detected updates) are
    a whole multiple, within ``tol_ns`` (each gap's bracket uncertainty) or 10 % of the period.
    Larger is the cautious choice: gaps of a 1 s driver are multiples of 0.5 s too."""
    for p in sorted(periods, reverse=True):
        k = np.round(gaps / p)
        fits = (k >= 1) & (np.abs(gaps - k * p) <= np.maximum(tol_ns, 0.1 * p))
        if fits.sum() >= 0.8 * len(gaps):
            return p
    return None


def util_windows(t: np.ndarray, x: np.ndarray, *, lag_ns: int = NVML_UTIL_LAG_NS,
                 periods: tuple[int, ...] = NVML_UTIL_PERIODS_NS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(start_ns, end_ns, value)`` of the windows NVML utilization values describe.

    NVML updates the value once per period P; a value first read at t was published at an update
    u <= t and describes ``[u - lag - P, u - lag]``. Updates are found where the value changes
    (the midpoint of the rows around it); between two lie round(gap / P) evenly spaced (the
    H200's phase can jump by ~20 ms: no global grid), and every P before the first and after the
    last. With too few changes to find P (idle all along), P is NVML's longest (1 s) and only
    ``[t_first - lag, t_last - P - lag]`` is kept: a later stage gets no utilization rather than
    the idle value read before its work was counted."""
    ok = ~np.isnan(x)
    tu, vu = t[ok].astype(np.int64), x[ok].astype(np.float64)
    if len(tu) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
    ch = np.nonzero(np.diff(vu) != 0)[0] + 1
    p = None
    if len(ch) >= 3:
        lo, hi = tu[ch - 1], tu[ch]
        u = (lo + hi) // 2
        p = _period(np.diff(u).astype(np.float64), periods, ((hi - lo)[1:] + (hi - lo)[:-1]).astype(np.float64))
    if p is None:
        first = np.concatenate(([0], ch))
        last = np.concatenate((ch - 1, [len(tu) - 1]))
        ws = tu[first] - lag_ns
        we = tu[last] - NVML_UTIL_PERIOD_MAX_NS - lag_ns
        keep = we > ws
        return ws[keep], we[keep], vu[first][keep]
    lo, hi = tu[ch - 1], tu[ch]
    u = (lo + hi) // 2
    val = vu[ch]
    gaps = np.diff(u)
    n = np.maximum(1, np.round(gaps / p)).astype(np.int64)
    step = gaps // n
    # updates between detected ones: u_a + j * step_a, j < n_a (values unchanged until the next)
    rep = np.repeat(np.arange(len(n)), n)
    j = np.arange(len(rep)) - np.repeat(np.cumsum(n) - n, n)
    mid_u = u[:-1][rep] + j * step[rep]
    mid_v = val[:-1][rep]
    # before the first change: back to the update the first row read (at most P before it)
    nb = max(0, int((u[0] - (tu[0] - p)) // p))
    pre_u = u[0] - p * np.arange(nb, 0, -1, dtype=np.int64)
    # after the last change: every P up to the last row
    na = int((tu[-1] - u[-1]) // p) + 1
    post_u = u[-1] + p * np.arange(na, dtype=np.int64)
    ups = np.concatenate((pre_u, mid_u, post_u))
    lens = np.diff(ups, prepend=ups[0] - p)  # a window runs from the update before
    vals = np.concatenate((np.full(nb, vu[0]), mid_v, np.full(na, val[-1])))
    return ups - lag_ns - lens, ups - lag_ns, vals


def gpm_windows(t: np.ndarray, x: np.ndarray, flags: np.ndarray | None = None, *, lag_ns: int = 0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(start_ns, end_ns, value)`` of GPM windows: each GPM value covers the time since the
    previous GPM row (flag GPM; the first one, whose start has no row, is left out), shifted
    back by ``lag_ns``."""
    g = (np.asarray(flags) & FLAG_GPM) != 0 if flags is not None else ~np.isnan(x)
    tg = t[g].astype(np.int64)
    xg = x[g].astype(np.float64)
    if len(tg) < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
    ws, we, v = tg[:-1] - lag_ns, tg[1:] - lag_ns, xg[1:]
    keep = ~np.isnan(v)
    return ws[keep], we[keep], v[keep]


def window_means(ws: np.ndarray, we: np.ndarray, v: np.ndarray, start: np.ndarray, end: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per interval ``[start, end)``: the mean of the window values weighted by their overlap
    with it, and the covered time (ns). Windows sorted and not overlapping. Cumulative
    integrals at the window edges, interpolated: no loop over windows or intervals."""
    n = len(start)
    if len(ws) == 0 or n == 0:
        return np.full(n, np.nan), np.zeros(n)
    length = (we - ws).astype(np.float64)
    edges = np.column_stack((ws, we)).ravel().astype(np.float64)  # each window's start and end, in order
    cum_f = np.concatenate(([0.0], np.cumsum(v * length)))
    cum_c = np.concatenate(([0.0], np.cumsum(length)))
    f = np.column_stack((cum_f[:-1], cum_f[1:])).ravel()
    c = np.column_stack((cum_c[:-1], cum_c[1:])).ravel()
    base = float(edges[0])  # keep interpolation exact on large clocks
    e = edges - base
    a = np.asarray(start, np.float64) - base
    b = np.asarray(end, np.float64) - base
    cov = np.interp(b, e, c) - np.interp(a, e, c)
    val = np.interp(b, e, f) - np.interp(a, e, f)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(cov > 0, val / np.where(cov > 0, cov, 1.0), np.nan)
    return mean, np.maximum(cov, 0.0)


def window_share(ws: np.ndarray, we: np.ndarray, start: np.ndarray, end: np.ndarray, covered: np.ndarray) -> float:
    """Of the windows that touch any of the intervals, the share of their time spent inside the
    intervals (``covered``: each interval's covered ns, from :func:`window_means`). NaN when no
    window touches them. Windows touched by several intervals count once."""
    if len(ws) == 0 or len(start) == 0:
        return float("nan")
    first = np.searchsorted(we, np.asarray(start), side="right")  # first window ending after start
    last = np.searchsorted(ws, np.asarray(end), side="left")  # windows starting before end
    ok = last > first
    if not ok.any():
        return float("nan")
    mark = np.zeros(len(ws) + 1, np.int64)
    np.add.at(mark, first[ok], 1)
    np.add.at(mark, last[ok], -1)
    touched = np.cumsum(mark[:-1]) > 0
    total = float((we - ws)[touched].sum())
    return float(covered.sum() / total) if total > 0 else float("nan")


def instance_samples(dev: Samples, device: int, start_ns: np.ndarray, end_ns: np.ndarray,
                     vendor: str | None = None) -> InstanceSamples:
    """Per-instance statistics of one device's rows (``dev``, time-sorted) over stage intervals
    ``[start_ns, end_ns)``. ``vendor`` (default: samples.json's) windows utilization on NVIDIA."""
    start = np.asarray(start_ns, dtype=np.int64)
    end = np.maximum(np.asarray(end_ns, dtype=np.int64), start)
    t = dev.t_ns.astype(np.int64, copy=False)
    lo = np.searchsorted(t, start, side="left")
    hi = np.searchsorted(t, end, side="left")
    n = hi - lo
    names = set(dev.rows.dtype.names or ())
    if vendor is None:
        devs = dev.devices
        vendor = devs[device].get("vendor") if 0 <= device < len(devs) and isinstance(devs[device], dict) else None
    nvidia = vendor == "nvidia"
    mean: dict[str, np.ndarray] = {}
    count: dict[str, np.ndarray] = {}
    windows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    gpm_window = np.zeros(len(start), dtype=bool)
    flags = dev.rows["flags"] if "flags" in names else None
    for col in [c for c in _MEAN_COLUMNS if c in names]:
        x = dev.rows[col].astype(np.float64)
        gpm = col in GPM_METRICS
        if gpm or (nvidia and col in NVML_UTIL_COLUMNS):
            ws, we, v = gpm_windows(t, x, flags, lag_ns=NVML_GPM_LAG_NS if nvidia else 0) if gpm else util_windows(t, x)
            m, c = window_means(ws, we, v, start, end)
            if gpm:  # no GPM row inside, but a window covering it
                gpm_window |= (_range_sum_count(x, lo, hi)[1] == 0) & (c > 0)
            windows[col] = (ws, we)
        else:
            s, c = _range_sum_count(x, lo, hi)
            with np.errstate(invalid="ignore", divide="ignore"):
                m = np.where(c > 0, s / np.maximum(c, 1), np.nan)
            c = c.astype(np.float64)
        mean[col] = m
        count[col] = c
    peak = {col: _range_reduce(np.fmax, dev.rows[col].astype(np.float64), lo, hi, np.nan)
            for col in _PEAK_COLUMNS if col in names}
    energy = np.full(len(start), np.nan)
    cov_j = np.zeros(len(start))
    cov_ns = np.zeros(len(start), np.int64)
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
            cs, ce = np.maximum(start, te[0]), np.minimum(end, te[-1])
            cov_ns = np.maximum(ce - cs, 0)
            cov_j = np.where(cov_ns > 0, np.interp(ce, te, ev - base) - np.interp(cs, te, ev - base), 0.0)
            windows["energy_j"] = (te[:-1], te[1:])
    throttle = _range_reduce(np.bitwise_or, dev.throttle.astype(np.uint32), lo, hi, 0).astype(np.uint32)

    def samples_with(mask: int) -> np.ndarray:
        cs = np.concatenate(([0], np.cumsum((dev.throttle & mask) != 0, dtype=np.int64)))
        return cs[hi] - cs[lo]

    return InstanceSamples(
        device=device, n_samples=n.astype(np.int64), mean=mean, count=count, peak=peak, energy_j=energy,
        throttle=throttle, hw_throttle_samples=samples_with(HW_THROTTLE_MASK), gpm_window=gpm_window,
        power_cap_samples=samples_with(POWER_CAP_MASK), thermal_hw_samples=samples_with(THERMAL_HW_MASK),
        windows=windows, energy_covered_j=cov_j, energy_covered_ns=cov_ns,
    )


def stage_samples(samples: Samples, start_ns: np.ndarray, end_ns: np.ndarray, name_id: np.ndarray,
                  devices: list[int] | None = None) -> tuple[StageSamples, list[InstanceSamples]]:
    """Per stage name and device: the table, and the per-instance statistics (one per device,
    aligned with the intervals) for renderers that want distributions."""
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
        put("name_id", uniq.astype(np.int32))
        put("device", np.full(k, d, dtype=np.int32))
        put("instances", np.bincount(inverse, minlength=k).astype(np.int64))
        put("samples", np.bincount(inverse, weights=inst.n_samples, minlength=k).astype(np.int64))

        def wmean(col: str, inst: InstanceSamples = inst) -> np.ndarray:  # this device's
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

        def gmax(col: str, inst: InstanceSamples = inst) -> np.ndarray:
            out = np.full(k, np.nan)
            p = inst.peak.get(col)
            if p is not None:
                np.fmax.at(out, inverse, p)
            return out

        for col in _MEAN_COLUMNS:  # gpu_util_pct -> gpu_util_mean_pct
            base, unit = col.rsplit("_", 1)
            put(f"{base}_mean_{unit}", wmean(col))
        for col in _PEAK_COLUMNS:
            base, unit = col.rsplit("_", 1)
            peak = gmax(col)
            if col == "sm_active_pct" and col in inst.mean:  # window-filled instances count towards the peak too
                np.fmax.at(peak, inverse, inst.mean[col])
            put(f"{base}_peak_{unit}", peak)
        e_ok = ~np.isnan(inst.energy_j)
        e_sum = np.bincount(inverse, weights=np.where(e_ok, inst.energy_j, 0.0), minlength=k)
        e_n = np.bincount(inverse, weights=e_ok.astype(np.float64), minlength=k).astype(np.int64)
        put("energy_total_j", np.where(e_n > 0, e_sum, np.nan))
        with np.errstate(invalid="ignore", divide="ignore"):
            put("energy_per_instance_j", np.where(e_n > 0, e_sum / np.maximum(e_n, 1), np.nan))
        put("energy_instances", e_n)
        c_j = np.bincount(inverse, weights=inst.energy_covered_j, minlength=k)
        c_ns = np.bincount(inverse, weights=inst.energy_covered_ns.astype(np.float64), minlength=k)
        with np.errstate(invalid="ignore", divide="ignore"):
            put("energy_power_w", np.where(c_ns > 0, c_j / np.maximum(c_ns, 1) * 1e9, np.nan))
        for name in ("hw_throttle_samples", "power_cap_samples", "thermal_hw_samples"):
            put(name, np.bincount(inverse, weights=getattr(inst, name), minlength=k).astype(np.int64))
        mask = np.zeros(k, dtype=np.uint32)
        np.bitwise_or.at(mask, inverse, inst.throttle)
        put("throttle_mask", mask)
        put("gpm_window_instances", np.bincount(inverse, weights=inst.gpm_window, minlength=k).astype(np.int64))
        for col, field_name in (("gpu_util_pct", "gpu_util_window_share"), ("sm_active_pct", "sm_active_window_share"),
                                ("energy_j", "energy_window_share")):
            share = np.full(k, np.nan)
            if col in inst.windows:
                ws, we = inst.windows[col]
                covered = inst.energy_covered_ns if col == "energy_j" else inst.count[col]
                for j in range(k):  # per stage name (few): windows shared by its instances count once
                    sel = inverse == j
                    share[j] = window_share(ws, we, np.asarray(start_ns)[sel], np.asarray(end_ns)[sel], covered[sel])
            put(field_name, share)

    if not rows:
        return StageSamples(), per_instance
    table = StageSamples(**{name: np.concatenate(parts) for name, parts in rows.items()})
    order = np.lexsort((table.device, table.name_id))
    table = StageSamples(**{name: getattr(table, name)[order] for name in rows})
    return table, per_instance
