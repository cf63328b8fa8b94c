"""Sampler rows seen per stage over its steady instances' host intervals: utilisation, clocks,
power, throttle reasons. Per-instance sums are differences of prefix sums over time-sorted rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxinstr.analyze.instances import StageInstances
from maxinstr.sample.attribute import stage_samples
from maxinstr.rundir.samples import HW_THROTTLE_MASK, THROTTLE_NAMES

METRICS = ("gpu_util_pct", "sm_active_pct", "sm_clock_mhz", "power_w", "mem_util_pct", "temp_c",
           "tensor_active_pct", "dram_bw_util_pct")
_NAMES, _HW_MASK = tuple(THROTTLE_NAMES), int(HW_THROTTLE_MASK)


def sample_columns(samples: Any) -> dict[str, np.ndarray] | None:
    """Samples as one dict of columns (``t_ns`` required; None: nothing usable), from a dict of
    columns, a structured array, an object with ``rows``/``columns``, or part -> any of those."""
    if samples is None:
        return None
    cols = _as_columns(samples)
    if cols is not None:
        return cols
    if isinstance(samples, dict):
        merged: dict[str, list[np.ndarray]] = {}
        for value in samples.values():
            c = _as_columns(value)
            if c is None:
                continue
            for k, v in c.items():
                merged.setdefault(k, []).append(v)
        if "t_ns" in merged:
            n = sum(len(x) for x in merged["t_ns"])
            return {k: np.concatenate(v) for k, v in merged.items() if sum(len(x) for x in v) == n}
    return None


def _as_columns(obj: Any) -> dict[str, np.ndarray] | None:
    if isinstance(obj, np.ndarray) and obj.dtype.names and "t_ns" in obj.dtype.names:
        return {k: np.asarray(obj[k]) for k in obj.dtype.names}
    if isinstance(obj, dict) and "t_ns" in obj and not isinstance(obj["t_ns"], dict):
        t = np.asarray(obj["t_ns"])
        return {k: np.asarray(v) for k, v in obj.items()
                if isinstance(v, (np.ndarray, list)) and len(v) == len(t)}
    for attr in ("rows", "columns", "data", "table"):
        inner = getattr(obj, attr, None)
        if inner is not None and not callable(inner):
            c = _as_columns(inner)
            if c is not None:
                return c
    return None


def _is_sampler_samples(obj: Any) -> bool:
    return hasattr(obj, "rows") and hasattr(obj, "for_device") and hasattr(obj, "device")


def stage_sample_stats(inst: StageInstances, samples: Any, part_names: list[str] | None = None) -> dict[str, Any]:
    """Per stage: samples seen, mean metrics, throttled share and reasons; ``_overall`` the run's
    ({} without samples). The sampler's ``Samples`` (part -> Samples, as ``maxinstr.load`` gives)
    go through its own attribution (:func:`maxinstr.sample.attribute.stage_samples`)."""
    if isinstance(samples, dict) and samples and all(_is_sampler_samples(v) for v in samples.values()):
        return _from_sampler(inst, samples, part_names or [])
    if _is_sampler_samples(samples):
        return _from_sampler(inst, {"": samples}, [""])
    cols = sample_columns(samples)
    if not cols or len(cols["t_ns"]) == 0:
        return {}
    t = np.asarray(cols["t_ns"], np.int64)
    order = np.argsort(t, kind="stable")
    t = t[order]
    cols = {k: np.asarray(v)[order] for k, v in cols.items()}
    throttle = np.asarray(cols.get("throttle", np.zeros(len(t), np.int64)), np.int64)
    out: dict[str, Any] = {"_overall": _overall(cols, throttle)}
    if len(inst) == 0:
        return out
    lo = np.searchsorted(t, inst.host_start_ns, "left")
    hi = np.searchsorted(t, inst.host_end_ns, "right")
    count = hi - lo

    def per_instance_sum(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, np.float64)
        ok = np.isfinite(x)
        cs = np.r_[0.0, np.cumsum(np.where(ok, x, 0.0))]
        cn = np.r_[0, np.cumsum(ok)]
        return cs[hi] - cs[lo], cn[hi] - cn[lo]

    thr_hw = np.r_[0, np.cumsum((throttle & _HW_MASK) != 0)]
    bit_counts = {}
    for i, name in enumerate(_NAMES):
        if _HW_MASK >> i & 1:
            c = np.r_[0, np.cumsum((throttle >> i) & 1)]
            bit_counts[name] = c[hi] - c[lo]
    metric_sums = {m: per_instance_sum(cols[m]) for m in METRICS if m in cols}
    keys, steady_rows = inst.steady_by_key()
    for stage, sel in zip(keys.tolist(), steady_rows):
        n_samples = int(count[sel].sum())
        row: dict[str, Any] = {"samples": n_samples, "instances_with_samples": int((count[sel] > 0).sum())}
        for m, (s, c) in metric_sums.items():
            tot_c = c[sel].sum()
            row[f"{m}_mean"] = float(s[sel].sum() / tot_c) if tot_c else None
        throttled = int((thr_hw[hi] - thr_hw[lo])[sel].sum())
        row["throttled_samples"] = throttled
        row["throttled_share"] = float(throttled / n_samples) if n_samples else None
        row["throttle_reason_samples"] = {k: int(v[sel].sum()) for k, v in bit_counts.items() if v[sel].sum() > 0}
        row["throttle_reasons"] = sorted(row["throttle_reason_samples"])
        out[stage] = row
    return out


def _overall(cols: dict[str, np.ndarray], throttle: np.ndarray) -> dict[str, Any]:
    n = len(cols["t_ns"])
    row: dict[str, Any] = {"samples": int(n), "span_ns": int(cols["t_ns"][-1] - cols["t_ns"][0]) if n else 0}
    if "device" in cols:
        row["devices"] = int(len(np.unique(cols["device"])))
    for m in METRICS:
        if m in cols:
            x = np.asarray(cols[m], np.float64)
            x = x[np.isfinite(x)]
            row[f"{m}_mean"] = float(x.mean()) if len(x) else None
            row[f"{m}_max"] = float(x.max()) if len(x) else None
    return row | _throttle_counts(throttle)


def _throttle_counts(throttle: np.ndarray) -> dict[str, Any]:
    """Samples a hardware limit held the clocks down in, and samples per throttle reason."""
    return {"throttled_samples": int(((throttle & _HW_MASK) != 0).sum()),
            "throttle_reasons": {name: int(((throttle >> i) & 1).sum()) for i, name in enumerate(_NAMES)
                                 if ((throttle >> i) & 1).any()}}


_DEVICE_FIELDS = ("gpu_util_mean_pct", "gpu_util_peak_pct", "mem_util_mean_pct", "sm_active_mean_pct", "sm_clock_mean_mhz",
                  "sm_occupancy_mean_pct", "tensor_active_mean_pct", "dram_bw_util_mean_pct",
                  "mem_used_peak_bytes", "power_mean_w", "power_peak_w", "temp_peak_c",
                  "energy_per_instance_j", "energy_total_j", "gpu_util_window_share", "sm_active_window_share",
                  "energy_power_w", "energy_window_share")


def _num(x: Any) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def _from_sampler(inst: StageInstances, samples: dict[str, Any], part_names: list[str]) -> dict[str, Any]:
    """Per stage: one row per device from the sampler's attribution; headline fields from the
    device the stage kept busiest (the one it ran on)."""
    steady = inst.steady
    uniq, code = inst.key_codes()
    per_stage: dict[str, list[dict[str, Any]]] = {}
    all_t, all_thr, n_dev = [], [], 0
    host = inst.host_ns
    for part, smp in samples.items():
        if len(smp) == 0:
            continue
        all_t.append(np.asarray(smp.t_ns, np.int64))
        all_thr.append(np.asarray(smp.throttle, np.int64))
        n_dev += len(np.unique(smp.device))
        own = inst.part == part_names.index(part) if part in part_names else None
        if own is not None and own.any():
            sel = steady & own
        else:  # a part of samples alone (`maxinstr run`'s parts/sampler): every stage of the run
            sel = steady.copy()
        if not sel.any():
            continue
        table, _ = stage_samples(smp, inst.host_start_ns[sel], inst.host_end_ns[sel], code[sel])
        mean_ns = np.bincount(code[sel], weights=host[sel].astype(np.float64), minlength=len(uniq)) / \
            np.maximum(np.bincount(code[sel], minlength=len(uniq)), 1)
        devices = smp.devices
        for i in range(len(table)):
            d = int(table.device[i])
            info = devices[d] if 0 <= d < len(devices) and isinstance(devices[d], dict) else {}
            row = {"part": part, "device": d, "instances": int(table.instances[i]),
                   "samples": int(table.samples[i]), "hw_throttle_samples": int(table.hw_throttle_samples[i]),
                   "power_cap_samples": int(table.power_cap_samples[i]),
                   "throttle_reasons_seen": [n for b, n in enumerate(_NAMES) if int(table.throttle_mask[i]) >> b & 1],
                   "mean_instance_ns": float(mean_ns[int(table.name_id[i])]),
                   "sm_clock_max_mhz": info.get("sm_clock_max_mhz"), "power_limit_w": info.get("power_limit_w")}
            for fld in _DEVICE_FIELDS:
                row[fld] = _num(getattr(table, fld)[i])
            per_stage.setdefault(str(uniq[int(table.name_id[i])]), []).append(row)
    out: dict[str, Any] = {}
    if all_t:
        out["_overall"] = {"samples": int(sum(len(t) for t in all_t)), "devices": n_dev,
                           **_throttle_counts(np.concatenate(all_thr))}
    for stage, rows in per_stage.items():
        main = max(rows, key=lambda r: (r["gpu_util_mean_pct"] or -1, r["samples"]))
        out[stage] = _stage_row(main, rows)
    return out


READING_LAGS = 1.5
"""NVML's power reading is a trailing average (~1 s on Hopper): at this many times the energy
counter's power (and 50 W more), it and its power-cap bits describe the time before the stage."""


def _stage_row(main: dict, rows: list[dict]) -> dict[str, Any]:
    """A stage's sampler numbers from the device it kept busiest, power by the energy counter;
    where NVML's lagging reading is far above, its power-cap samples are not the stage's either."""
    n = main["samples"]
    reading = main["power_mean_w"]
    # energy over the covered time of its instances, else per instance over the mean instance
    energy_w = main.get("energy_power_w")
    if energy_w is None and main["energy_per_instance_j"] is not None and main["mean_instance_ns"] > 0:
        energy_w = main["energy_per_instance_j"] / (main["mean_instance_ns"] / 1e9)
    lagged = bool(reading is not None and energy_w is not None and reading > READING_LAGS * energy_w
                  and reading - energy_w > 50.0)
    throttled = main["hw_throttle_samples"]
    if lagged:
        throttled -= main["power_cap_samples"]  # the power cap follows the lagging reading
    reasons = [r for r in main["throttle_reasons_seen"] if r in _NAMES and _HW_MASK >> _NAMES.index(r) & 1]
    if lagged and throttled == 0:
        reasons = []
    return {
        "device": main["device"], "samples": n, "instances_with_samples": None,
        "gpu_util_pct_mean": main["gpu_util_mean_pct"], "sm_active_pct_mean": main["sm_active_mean_pct"],
        # share of the time of the NVML utilization windows behind gpu_util_pct_mean that the
        # stage itself filled (None: not windowed, or no window covers the stage)
        "util_window_share": main["gpu_util_window_share"],
        "power_w_mean": energy_w if energy_w is not None else reading,
        "power_source": "energy" if energy_w is not None else ("reading" if reading is not None else None),
        "power_reading_w_mean": reading, "power_reading_lags": lagged,
        "energy_per_instance_j": main["energy_per_instance_j"],
        "energy_window_share": main.get("energy_window_share") if energy_w is not None else None,
        "sm_clock_mhz_mean": main["sm_clock_mean_mhz"], "sm_clock_max_mhz": main["sm_clock_max_mhz"],
        "power_limit_w": main["power_limit_w"],
        "throttled_samples": throttled,
        "throttled_share": (throttled / n) if n else None,
        "throttle_lagged_samples": main["power_cap_samples"] if lagged else 0,
        # the sampler's per-stage table keeps which reasons were seen, not per-reason counts
        "throttle_reasons": reasons,
        "devices": rows,
    }
