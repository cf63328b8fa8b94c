"""Statistics over whole numpy columns: summaries, group medians, cold-start outliers, step
trends, noise bounds. A missing duration (``-1``, a float NaN) is dropped before summarising:
every summary says how many values it rests on (``n``)."""

from __future__ import annotations

import numpy as np

from maxinstr import columns
from maxinstr.analyze.schema import Statistic, StepTrend
from maxinstr.columns import occurrence_index

MAD_TO_SIGMA = 1.4826
"""Scale that turns a median absolute deviation into a normal standard deviation."""
COLD_START_Z = 5.0
"""Robust z-score above which a leading instance counts as a cold-start outlier, ..."""
COLD_START_RATIO = 1.5
"""... when also this many times the steady median (a tight distribution's 3% wobble is no spike)."""
COLD_START_MAX_PREFIX = 3
"""Leading instances per name that can be cold-start outliers (compile and cache-fill spikes)."""


def summarize(values: np.ndarray) -> Statistic:
    """:class:`Statistic` of ``values`` (missing dropped; ``{"n": 0}`` when none is left).
    Percentiles interpolate linearly (numpy's default, as ``nsys stats`` medians)."""
    v = np.asarray(values)
    if v.dtype.kind in "iu":
        v = v[v >= 0]
    else:
        v = v[np.isfinite(v)]
    if v.size == 0:
        return {"n": 0}
    v = v.astype(np.float64)
    med, p90, p99, q1, q3 = np.percentile(v, [50, 90, 99, 25, 75])
    return {"n": int(v.size), "median": float(med), "p90": float(p90), "p99": float(p99), "min": float(v.min()),
            "max": float(v.max()), "mean": float(v.mean()), "mad": float(np.median(np.abs(v - med))), "q1": float(q1),
            "q3": float(q3), "total": float(v.sum())}


_QUANTILES = (("median", 0.5), ("p90", 0.9), ("p99", 0.99), ("q1", 0.25), ("q3", 0.75))


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    # numpy's own linear interpolation (numpy.lib._function_base_impl._lerp): np.percentile's
    # numbers to the last bit
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


def group_summaries(codes: np.ndarray, values: np.ndarray, n_groups: int) -> list[Statistic]:
    """:func:`summarize` per group code (``0..n_groups-1``), the same numbers, by two sorts, not a
    numpy call per group per statistic (400,000 for 50,000 stages)."""
    c = np.asarray(codes, dtype=np.int64)
    v = np.asarray(values)
    keep = v >= 0 if v.dtype.kind in "iu" else np.isfinite(v)
    c, v = c[keep], v[keep].astype(np.float64)
    counts = np.bincount(c, minlength=n_groups)[:n_groups]
    none: Statistic = {"n": 0}  # one object for every empty group (read-only, as all of them)
    out: list[Statistic] = [none] * n_groups
    filled = np.flatnonzero(counts)
    if len(filled) == 0:
        return out
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    n = counts[filled]
    first = starts[filled]
    # sums in each group's own order, as summarize's v.sum() (add.reduceat sums each segment
    # with the same pairwise loop)
    native = columns.function("group_sort_f64")
    both = native(c, v, n_groups) if native is not None else None  # None: it declined
    if both is None:
        both = v[np.argsort(c, kind="stable")], v[np.lexsort((v, c))]
    totals = np.add.reduceat(both[0], first)
    x = both[1]
    del both
    stats: dict[str, np.ndarray] = {"min": x[first], "max": x[first + n - 1], "total": totals, "mean": totals / n}
    for key, q in _QUANTILES:
        vi = (n - 1) * q
        prev = np.floor(vi)
        gamma = vi - prev
        lo = first + np.minimum(prev.astype(np.int64), n - 1)
        hi = first + np.minimum(prev.astype(np.int64) + 1, n - 1)
        stats[key] = _lerp(x[lo], x[hi], gamma)
    dev = np.abs(x - np.repeat(stats["median"], n))
    stats["mad"] = group_medians(np.repeat(np.arange(len(filled)), n), dev, len(filled))
    cols = (stats[k].tolist() for k in ("median", "p90", "p99", "min", "max", "mean", "mad", "q1", "q3", "total"))
    # a dict display per group (twice as fast as dict(zip(...)): 50,000 groups per column)
    for g, c, md, p90, p99, lo, hi, mean, mad, q1, q3, total in zip(filled.tolist(), n.tolist(), *cols):
        out[g] = {"n": c, "median": md, "p90": p90, "p99": p99, "min": lo, "max": hi, "mean": mean, "mad": mad,
                  "q1": q1, "q3": q3, "total": total}
    return out


def group_medians(codes: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of ``values`` per integer group code (NaN for empty groups), vectorised by a sort."""
    out = np.full(n_groups, np.nan)
    if len(codes) == 0:
        return out
    codes = np.asarray(codes, dtype=np.int64)
    values = np.asarray(values)
    native = columns.function("group_medians_f64")
    if native is not None:  # the same numbers in O(n) (maxinstr._columns); None: it declined
        got = native(codes, values.astype(np.float64, copy=False), n_groups)
        if got is not None:
            return got
    c, v, starts, ends = sort_by_group(codes, values, n_groups)
    v = v.astype(np.float64)
    out[c[starts]] = (v[(starts + ends - 1) // 2] + v[(starts + ends) // 2]) / 2
    return out


def sort_by_group(codes: np.ndarray, values: np.ndarray, n_groups: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(codes, values) sorted by (group, value), and each present group's [start, end) in them.
    Small non-negative int values sort as one int64 key (group, value), in place: several times
    faster than lexsort, and a 1M-op trace holds 2M (op, stage) pairs (kernels.group_stats)."""
    span = int(values.max()) + 1 if values.dtype.kind == "i" and len(values) and values.min() >= 0 else 0
    if 0 < span and span * max(n_groups, 1) < (1 << 62):
        key = codes * span
        key += values
        key.sort()
        c = key // span
        key -= c * span
        v = key
    else:
        perm = np.lexsort((values, codes))
        c, v = codes[perm], values[perm]
    starts = np.r_[0, np.flatnonzero(np.diff(c)) + 1]
    return c, v, starts, np.r_[starts[1:], len(c)]


def cold_start_mask(codes: np.ndarray, occurrence: np.ndarray, values: np.ndarray, eligible: np.ndarray,
                    z_threshold: float = COLD_START_Z, ratio: float = COLD_START_RATIO,
                    max_prefix: int = COLD_START_MAX_PREFIX, first_calls: np.ndarray | None = None,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Cold-start outliers, ``(mask, z)``: the leading instances of each group (``codes``: one per
    process, with its own first instances and pace) that stand far above the rest. ``eligible``:
    the candidates and steady reference (warm-up removed, values present). An outlier is among the
    first ``max_prefix`` eligible rows by ``occurrence``, its robust z-score ``(x - median) /
    (1.4826 * MAD)`` (MAD floored at 1% of the median) above ``z_threshold``, ``x >= ratio *
    median``, in an unbroken leading run. ``first_calls``: the rows that can be a first call at
    all (a stage that ran many times in warm-up is slow for another reason)."""
    n = len(codes)
    mask = np.zeros(n, dtype=bool)
    z = np.zeros(n, dtype=np.float64)
    if n == 0 or not eligible.any():
        return mask, z
    n_groups = int(codes.max()) + 1
    idx = np.flatnonzero(eligible)
    c, v = codes[idx], values[idx].astype(np.float64)
    med = group_medians(c, v, n_groups)
    mad = group_medians(c, np.abs(v - med[c]), n_groups)
    scale = np.maximum(MAD_TO_SIGMA * mad, 0.01 * np.abs(med))
    scale = np.where(scale > 0, scale, 1.0)
    zi = (v - med[c]) / scale[c]
    z[idx] = zi
    elig_rank = occurrence_index(c, occurrence[idx])
    candidate = (elig_rank < max_prefix) & (zi > z_threshold) & (v >= ratio * med[c])
    if first_calls is not None:
        candidate &= np.asarray(first_calls, bool)[idx]
    # a cold start stands above every later instance: where the steady ones reach as high (a
    # host time's noise on a busy CPU), a high first one is that noise, not a first call
    rest_max = np.full(n_groups, -np.inf)
    np.maximum.at(rest_max, c[~candidate], v[~candidate])
    candidate &= v > rest_max[c]
    # keep only an unbroken leading run: ranks before the group's first non-candidate
    first_non = np.full(n_groups, np.iinfo(np.int64).max)
    np.minimum.at(first_non, c[~candidate], elig_rank[~candidate])
    keep = candidate & (elig_rank < first_non[c])
    mask[idx] = keep
    return mask, z


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); NaN with fewer than 3 points."""
    if len(x) < 3:
        return float("nan")
    rx, ry = _rank(np.asarray(x, float)), _rank(np.asarray(y, float))
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return 0.0
    return float(((rx - rx.mean()) * (ry - ry.mean())).mean() / (sx * sy))


def _rank(a: np.ndarray) -> np.ndarray:
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a), dtype=np.float64)
    ranks[order] = np.arange(len(a), dtype=np.float64)
    # ties: their average rank
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    sums = np.bincount(inv.reshape(-1), weights=ranks)
    return (sums / counts)[inv.reshape(-1)]


def step_trend(step: np.ndarray, values: np.ndarray) -> StepTrend:
    """How a per-instance duration changes with the step index, over the per-step medians: slope,
    Spearman correlation, last quarter's median over the first's (``{"n_steps": k}`` under 4)."""
    ok = (np.asarray(step) >= 0) & (np.asarray(values) >= 0)
    s, v = np.asarray(step)[ok], np.asarray(values)[ok]
    steps = np.unique(s)
    if len(steps) < 4:
        return {"n_steps": int(len(steps))}
    codes = np.searchsorted(steps, s)
    med = group_medians(codes, v, len(steps))
    slope, intercept = np.polyfit(steps.astype(float), med, 1)
    q = max(1, len(steps) // 4)
    first, last = float(np.median(med[:q])), float(np.median(med[-q:]))
    return {"n_steps": int(len(steps)), "n_instances": int(len(s)), "first_step": int(steps[0]),
            "last_step": int(steps[-1]), "slope_ns_per_step": float(slope), "spearman": spearman(steps, med),
            "first_quarter_median_ns": first, "last_quarter_median_ns": last,
            "last_over_first": float(last / first) if first > 0 else float("nan")}


def bootstrap_median_diff_bound(a: np.ndarray, b: np.ndarray, q: float = 50.0, n_boot: int = 400,
                                 seed: int = 0) -> float:
    """Half-width of the 95% bootstrap interval of ``percentile(b, q) - percentile(a, q)``:
    compare's noise bound (all resamples drawn as one index matrix)."""
    a = np.asarray(a, float)
    b = np.asarray(b, float)
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    rng = np.random.default_rng(seed)
    ra = np.percentile(a[rng.integers(0, len(a), (n_boot, len(a)))], q, axis=1)
    rb = np.percentile(b[rng.integers(0, len(b), (n_boot, len(b)))], q, axis=1)
    d = rb - ra
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float((hi - lo) / 2)


def mad_noise_bound(stat_a: Statistic, stat_b: Statistic) -> float:
    """Noise bound on a median difference from two summaries alone (saved JSON reports): two
    standard errors of the difference, a median's taken as ``1.2533 * 1.4826 * MAD / sqrt(n)``."""
    def se(s: Statistic) -> float:
        n = s.get("n", 0)
        if n < 2:
            return float("nan")
        return 1.2533 * MAD_TO_SIGMA * s.get("mad", 0.0) / np.sqrt(n)

    return float(2.0 * np.hypot(se(stat_a), se(stat_b)))
