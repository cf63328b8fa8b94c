"""Stages whose steady instances form two populations, and what tells them apart. A decode loop
replaying a CUDA graph every other step has two kinds of step (162-294 us and 716-1015 us of GPU
span on the H200 capture): their one median (505 us) is a time no step took. Per stage:

1. *Two modes?* The log values of the best time measure split by exact 1-D 2-means, each side
   at least MIN_SHARE, the gap between the lower p90 and the upper p10 at least MIN_SEPARATION
   times their robust spread (a normal sample split at its middle gives ~0.4, h200_decode's
   decode 27), and medians at least MIN_RATIO apart.
2. *What explains it?* The first feature (the user's attrs, the process, CUDA graph replay,
   kernels per instance, the enclosing instance or pipeline iteration, step parity, GPU busy)
   whose levels each fall (>= EXPLAINS) on one side defines the populations: membership from a
   cause, not the value. Else the two sides of the split, said unexplained.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxinstr._units import ns_text
from maxinstr.analyze.instances import StageInstances
from maxinstr.analyze.schema import PopulationGroup, Populations, StepBasis
from maxinstr.analyze.stats import MAD_TO_SIGMA, summarize

MIN_INSTANCES = 12
"""Fewer steady instances than this are not judged (quantiles of tiny groups are noise)."""
MIN_SHARE = 0.1
"""Each population holds at least this share of the stage's steady instances (and 3)."""
MIN_GROUP_UNEXPLAINED = 8
"""A split nothing explains needs this many instances a side: a handful of values does not pin
down a p10/p90 (17 decode steps of one growing KV-cache request split 6/11 into two
"populations" that were one trend). A feature's split has the feature as its evidence."""
MIN_SEPARATION = 2.0
MIN_RATIO = 1.5
"""Below it one median still describes every instance to within a fifth: what a summary is for."""
EXPLAINS = 0.9
"""A feature explains the split when this share of the instances fall on its levels' sides."""
MAX_LEVELS = 8


def two_means_split(logv: np.ndarray) -> int:
    """Index k into the sorted values: [:k] and [k:] minimise the summed squared deviations."""
    v = np.sort(logv)
    n = len(v)
    cs, cs2 = np.cumsum(v), np.cumsum(v * v)
    k = np.arange(1, n)
    left = cs2[k - 1] - cs[k - 1] ** 2 / k
    right = (cs2[-1] - cs2[k - 1]) - (cs[-1] - cs[k - 1]) ** 2 / (n - k)
    return int(k[np.argmin(left + right)])


def modes(values: np.ndarray) -> dict[str, Any] | None:
    """The two-mode split of positive ``values`` (see the module doc), or None."""
    v = np.asarray(values, np.float64)
    v = v[v > 0]
    n = len(v)
    if n < MIN_INSTANCES:
        return None
    lv = np.log(v)
    order = np.sort(lv)
    k = two_means_split(lv)
    lo, hi = order[:k], order[k:]
    if min(len(lo), len(hi)) < max(3, MIN_SHARE * n):
        return None
    spread = np.sqrt((_rsd(lo) ** 2 + _rsd(hi) ** 2) / 2)
    gap = np.percentile(hi, 10) - np.percentile(lo, 90)
    sep = gap / max(spread, 1e-3)
    if sep < MIN_SEPARATION or np.median(hi) - np.median(lo) < np.log(MIN_RATIO):
        return None
    # the threshold half-way (in log) across the gap
    return {"threshold": float(np.exp((lo[-1] + hi[0]) / 2)), "separation": float(sep),
            "low_median": float(np.exp(np.median(lo))), "high_median": float(np.exp(np.median(hi)))}


def _rsd(x: np.ndarray) -> float:
    return float(MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


def explain(side: np.ndarray, features: list[tuple[str, np.ndarray, list[str]]]
            ) -> tuple[str, np.ndarray, dict[int, str]] | None:
    """The first feature (name, level codes per instance (-1: unknown), level names) whose levels
    each sit on one side of ``side`` (upper mode): (name, its upper-side mask, {side: label})."""
    for name, codes, names in features:
        known = codes >= 0
        if known.mean() < EXPLAINS:
            continue
        levels, inv, counts = np.unique(codes[known], return_inverse=True, return_counts=True)
        if not 2 <= len(levels) <= MAX_LEVELS or (counts < 2).any():
            continue
        up = np.bincount(inv, weights=side[known].astype(float), minlength=len(levels)) / counts
        level_up = up >= 0.5
        if level_up.all() or not level_up.any():
            continue
        agree = np.where(level_up[inv], side[known], ~side[known]).sum()
        if agree < EXPLAINS * len(side):
            continue
        mask = np.zeros(len(side), bool)
        mask[known] = level_up[inv]
        label = {1: ", ".join(names[int(c)] for c in levels[level_up]),
                 0: ", ".join(names[int(c)] for c in levels[~level_up])}
        return name, mask, label
    return None


def _int_levels(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes (-1 where missing: < 0) and level names of non-negative ints."""
    values = np.asarray(values, np.int64)
    ok = values >= 0
    levels, inv = np.unique(values[ok], return_inverse=True)
    codes = np.full(len(values), -1, np.int64)
    codes[ok] = inv.reshape(-1)
    return codes, [str(int(v)) for v in levels]


def _categorical(values: list) -> tuple[np.ndarray, list[str]]:
    """Codes (-1 for None) and level names of a list of hashable values."""
    known = sorted({v for v in values if v is not None}, key=str)
    index = {v: i for i, v in enumerate(known)}
    return np.array([index.get(v, -1) if v is not None else -1 for v in values], np.int64), [str(v) for v in known]


def features(inst, rows: np.ndarray, attrs: dict | None, graph_ops: np.ndarray | None) -> list[tuple[str, np.ndarray, list[str]]]:
    """Candidate explanations for the instances ``rows`` of one stage, in preference order."""
    out: list[tuple[str, np.ndarray, list[str]]] = []
    if attrs:
        recs = inst.record_id[rows]
        per = [attrs.get(int(r)) or {} for r in recs]
        keys = sorted({k for a in per for k in a if k != "step"})
        for k in keys:
            vals = [a.get(k) if isinstance(a.get(k), (str, int, float, bool)) else None for a in per]
            codes, names = _categorical(vals)
            out.append((f"attr {k}", codes, [f"{k}={n}" for n in names]))
    codes, names = _int_levels(inst.part[rows])
    # several processes (ranks, forks): a slow one is its own population
    out.append(("process", codes, [f"process {n}" for n in names]))
    if graph_ops is not None and len(graph_ops) == len(inst):
        g = graph_ops[rows]
        out.append(("CUDA graph replay", np.where(inst.range_index[rows] >= 0, (g > 0).astype(np.int64), -1),
                    ["no CUDA graph", "CUDA graph replay"]))
    codes, names = _int_levels(np.where(inst.range_index[rows] >= 0, inst.kernel_count[rows], -1))
    out.append(("kernels per instance", codes, [f"{n} kernels" for n in names]))
    parent = inst.parent[rows]
    if (parent >= 0).all():
        codes, names = _int_levels(inst.occurrence[parent])
        pname = str(inst.key[parent[0]])
        out.append((f"enclosing {pname}", codes, [f"in {pname} #{n}" for n in names]))
    elif inst.pipeline_head is not None and len(inst.iteration) == len(inst):
        # top-level siblings of a pipeline (prefill, decode steps, readback): which iteration
        codes, names = _int_levels(inst.iteration[rows])
        head = inst.pipeline_head
        out.append(("pipeline iteration", codes, [f"iteration #{n} (from '{head}' #{n})" for n in names]))
    step = inst.step[rows]
    out.append(("step parity", np.where(step >= 0, step % 2, -1), ["even steps", "odd steps"]))
    busy = inst.busy_frac[rows]
    if np.isfinite(busy).mean() >= EXPLAINS:
        ok = np.isfinite(busy)
        cut = np.sort(busy[ok])[two_means_split(busy[ok])] if ok.sum() > 2 else np.inf
        out.append(("GPU busy", np.where(ok, (busy >= cut).astype(np.int64), -1),
                    [f"GPU busy < {cut:.0%}", f"GPU busy >= {cut:.0%}"]))
    return out


def _group_row(inst: StageInstances, rows: np.ndarray, label: str, n_stage: int, graph_ops: np.ndarray | None) -> PopulationGroup:
    row: PopulationGroup = {"label": label, "instances": int(len(rows)), "share": len(rows) / n_stage if n_stage else 0.0}
    for key, values in inst.statistic_values(rows).items():
        row[key] = summarize(values)
    joined = inst.range_index[rows] >= 0
    row["cuda_graph_share"] = (float((graph_ops[rows][joined] > 0).mean())
                               if graph_ops is not None and len(graph_ops) == len(inst) and joined.any() else None)
    return row


def stage_populations(inst, rows: np.ndarray, basis: StepBasis, attrs: dict | None = None,
                      graph_ops: np.ndarray | None = None, values: np.ndarray | None = None) -> Populations | None:
    """``stages[].populations`` for the steady instances ``rows`` of one stage, or None (one
    population). ``basis``: the time measure judged; ``values``: its column, when the caller has
    it (computing it per stage is quadratic in the number of stages)."""
    if values is None:
        values = {"gpu_event_ns": inst.gpu_event_ns, "gpu_proj_ns": inst.proj_ns, "host_ns": inst.host_ns}[basis]
    v = values[rows]
    ok = v > 0
    m = modes(v[ok])
    if m is None:
        return None
    rows = rows[ok]
    side = v[ok] >= m["threshold"]
    found = explain(side, features(inst, rows, attrs, graph_ops))
    if found is not None:
        by, upper, label = found
    elif min(int(side.sum()), int((~side).sum())) < MIN_GROUP_UNEXPLAINED:
        return None
    else:
        by, upper, label = None, side, {1: f"upper mode (>= {ns_text(m['threshold'])})", 0: f"lower mode (< {ns_text(m['threshold'])})"}
    groups = [_group_row(inst, rows[~upper], label[0], len(rows), graph_ops),
              _group_row(inst, rows[upper], label[1], len(rows), graph_ops)]
    med = float(np.median(v[ok]))
    # the symptom: a median between the modes, a time no instance took
    in_gap = bool(v[ok][~side].max() < med < v[ok][side].min())
    return {"basis": basis, "by": by, "explained": by is not None, "separation": round(m["separation"], 2),
            "threshold_ns": m["threshold"], "median_in_gap": in_gap, "groups": groups}
