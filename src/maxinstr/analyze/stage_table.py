"""The report's per-stage sections: ``stages``, ``startup`` and ``coverage``. Columnar over all
stages at once: a per-stage mask over every instance (quadratic) and eight numpy calls per
stage took 179 s for a run of 50,000 distinct names."""

from __future__ import annotations

from typing import Any, Literal, cast

import numpy as np

from maxinstr import warmup as warmup_rule
from maxinstr.analyze import instances as inst_mod
from maxinstr.analyze.populations import MIN_INSTANCES as POPULATION_MIN_INSTANCES
from maxinstr.analyze.populations import stage_populations
from maxinstr.analyze.schema import (Coverage, PerStep, SelfTimes, Stage, StageSamples, StartupRow, Statistic, StepBasis,
                                     StepWork)
from maxinstr.analyze.stats import group_medians, group_summaries, step_trend
from maxinstr.sample.attribute import WINDOW_SHARE_MIN

STARTUP_KEPT = 50
STEP_WORK_MIN_STEPS = 4
PER_STEP_KEPT = 10_000
NVML_UTIL_WINDOW_MIN_NS = 166_666_667
"""NVML averages utilization over a sample period of 1/6 s to 1 s (by GPU; power over ~1 s on
Hopper): a stage shorter than the shortest period cannot be judged by the samples taken in it."""


def stage_rows(inst: inst_mod.StageInstances, head: inst_mod.StageInstances | None, mix: dict[str, Any],
               sample_stats: dict[str, Any], work: dict[str, np.ndarray] | None = None,
               attrs: dict[int, dict[str, Any]] | None = None, graph_ops: np.ndarray | None = None) -> list[Stage]:
    """``report["stages"]``; ``head``: the unprofiled run's instances (the headline numbers);
    ``attrs`` and ``graph_ops`` (CUDA-graph ops per instance) explain two-population stages."""
    if len(inst) == 0:
        return []
    uniq, code = inst.key_codes()
    n_stages = len(uniq)
    steady, host, proj = inst.steady, inst.host_ns, inst.proj_ns
    values = inst.statistic_values()
    share_of_top = _share_of_top(inst, code, n_stages)
    self_time = _self_times(inst, {k: values[k] for k in ("host_ns", "gpu_event_ns", "gpu_proj_ns", "gpu_busy_ns")})

    def count(mask: np.ndarray) -> np.ndarray:
        return np.bincount(code[mask], minlength=n_stages)

    def least(values: np.ndarray, start: int) -> np.ndarray:  # per stage, the least of values
        out = np.full(n_stages, start)
        np.minimum.at(out, code, values)
        return out

    instances, n_steady = count(np.ones(len(inst), bool)), count(steady)
    n_warmup, n_cold, n_exc = count(inst.warmup), count(inst.cold & ~inst.warmup), count(inst.exception)
    n_inside = count(inst.inside_startup) if len(inst.inside_startup) == len(inst) else np.zeros(n_stages, np.int64)
    only_marks = count(inst.is_mark) == instances
    step_marked = count(inst.step_marked) > 0
    order_u = np.argsort(least(inst.host_start_ns, np.iinfo(np.int64).max), kind="stable")  # pipeline order
    depth, first_of = least(inst.level, np.iinfo(np.int64).max), least(np.arange(len(inst)), len(inst))
    parent_of = _most_common_parent(inst, code, n_stages)
    sc = code[steady]

    def stats(values: np.ndarray) -> list[Statistic]:
        return group_summaries(sc, values[steady], n_stages)

    cols = {k: stats(v) for k, v in values.items()}
    c_host, c_event, c_proj = cols["host_ns"], cols["gpu_event_ns"], cols["gpu_proj_ns"]
    with np.errstate(divide="ignore", invalid="ignore"):
        c_over = stats(np.where((inst.gpu_event_ns >= 0) & (host > 0), inst.gpu_event_ns / np.maximum(host, 1), np.nan))
    self_ns = []
    for k, v in self_time.items():
        present = steady & (v >= 0)
        self_ns.append((k, np.bincount(code[present], weights=v[present], minlength=n_stages).tolist(),
                        (count(present) > 0).tolist()))
    by_stage = np.flatnonzero(steady)[np.argsort(sc, kind="stable")]
    bounds = np.concatenate(([0], np.cumsum(n_steady))).tolist()
    per_steps = _per_steps(inst, by_stage, code[by_stage], n_stages) if step_marked.any() else None
    head_rows = _headline_stats(head, uniq) if head is not None else None
    # per-stage values as Python lists: the loop below runs once per stage (50,000 and more)
    names_l, depth_l, leaf_l = uniq.tolist(), depth.tolist(), inst.name[first_of].tolist()
    counts_l = list(zip(instances.tolist(), n_steady.tolist(), n_warmup.tolist(), n_cold.tolist(), n_inside.tolist(),
                        n_exc.tolist()))
    # share of each stage's steady, joined instances that launch CUDA-graph nodes (None without any)
    graph_share_l: list[float | None] = [None] * n_stages
    if graph_ops is not None:
        joined = steady & (inst.range_index >= 0)
        n_joined, n_graph = count(joined).tolist(), count(joined & (graph_ops > 0)).tolist()
        graph_share_l = [g / j if j else None for g, j in zip(n_graph, n_joined)]
    marks_l, step_marked_l = only_marks.tolist(), step_marked.tolist()
    share_l = None if share_of_top is None else share_of_top.astype(np.float64).tolist()
    series = {"gpu_event_ns": inst.gpu_event_ns, "gpu_proj_ns": proj, "host_ns": host}
    rows: list[Stage] = []
    for u in order_u.tolist():
        if marks_l[u]:
            continue  # instant marks have no duration: counted in report["marks"]
        name = str(names_l[u])
        n_all, n_st, n_wu, n_cs, n_in, n_ex = counts_l[u]
        row: Stage = {"name": name, "parent": parent_of[u], "depth": depth_l[u], "leaf": str(leaf_l[u]),
                      "instances": n_all, "steady": n_st, "warmup": n_wu, "cold_start": n_cs, "inside_startup": n_in,
                      "exceptions": n_ex}
        for key, col in cols.items():
            row[key] = col[u]
        row.update({"share_of_top": None if share_l is None else share_l[u],
                    "self_ns": cast(SelfTimes, {k: total[u] for k, total, present in self_ns if present[u]}),
                    "steps_marked": step_marked_l[u], "steps": None, "mix": mix.get(name),
                    "samples": _window_note(sample_stats.get(name), c_host[u]) if sample_stats else None})
        basis: StepBasis = "gpu_event_ns" if c_event[u]["n"] else ("gpu_proj_ns" if c_proj[u]["n"] else "host_ns")
        if n_st >= STEP_WORK_MIN_STEPS:  # fewer instances cannot span the 4 steps a trend needs
            st = by_stage[bounds[u]:bounds[u + 1]]
            trend = step_trend(inst.step[st], series[basis][st])
            if trend.get("n_steps", 0) >= 4:
                trend["basis"] = basis
                row["steps"] = trend
                if work is not None:
                    row["step_work"] = _step_work(inst.step[st], {k: v[st] for k, v in work.items()})
        row.setdefault("step_work", None)
        row["populations"] = stage_populations(inst, by_stage[bounds[u]:bounds[u + 1]], basis, attrs, graph_ops,
                                               values=series[basis]) if n_st >= POPULATION_MIN_INSTANCES else None
        row["cuda_graph_share"] = graph_share_l[u]
        if c_over[u].get("n"):
            row["gpu_event_over_host"] = c_over[u]
        if row["steps_marked"] and per_steps is not None:
            row["per_step"] = _per_step(per_steps, u, basis)
        if head_rows is not None and head_rows[u] is not None:
            row["headline_from"] = "unprofiled_run"
            row["headline_host_ns"], row["headline_gpu_event_ns"] = head_rows[u]
        else:  # no unprofiled run, or it lacks this stage: the profiled numbers, marked as such
            row["headline_from"] = "run"
            row["headline_host_ns"], row["headline_gpu_event_ns"] = c_host[u], c_event[u]
        rows.append(row)
    return _tree_order(rows)


def _most_common_parent(inst: inst_mod.StageInstances, code: np.ndarray, n_stages: int) -> list[str | None]:
    """Per stage: the stage key its instances' parents most often have (ties: the first key), or None."""
    out: list[str | None] = [None] * n_stages
    child = np.flatnonzero(inst.parent >= 0)
    if len(child) == 0:
        return out
    keys = inst.key_codes()[0]
    pcode = code[inst.parent[child]]  # parents are stages too: their key codes index the same keys
    pair, counts = np.unique(code[child] * n_stages + pcode, return_counts=True)
    stage_of, parent_of = pair // n_stages, pair % n_stages
    best = np.lexsort((parent_of, -counts, stage_of))
    first = best[np.r_[True, stage_of[best][1:] != stage_of[best][:-1]]]
    for s, p in zip(stage_of[first].tolist(), parent_of[first].tolist()):
        out[s] = str(keys[p])
    return out


def _headline_stats(head: inst_mod.StageInstances, uniq: np.ndarray) -> list[tuple[Statistic, Statistic] | None]:
    """Per stage of ``uniq``: (host, GPU-event) statistics over the unprofiled run's steady
    instances of that key, None where it has none."""
    keys = head.key
    pos = np.minimum(np.searchsorted(uniq, keys), len(uniq) - 1)
    hit = (uniq[pos] == keys) & head.steady
    host = group_summaries(pos[hit], head.host_ns[hit], len(uniq))
    gpu = group_summaries(pos[hit], head.gpu_event_ns[hit], len(uniq))
    present = np.bincount(pos[hit], minlength=len(uniq)) > 0
    return [(host[i], gpu[i]) if present[i] else None for i in range(len(uniq))]


def _share_of_top(inst: inst_mod.StageInstances, code: np.ndarray, n_stages: int) -> np.ndarray | None:
    """Per stage: the share of the steady top-level host time its steady instances account for
    (None without any). A steady instance counts only inside a steady top-level ancestor: dividing
    every steady instance by the steady top-level time gave 50x on a capture whose warm-up request
    held most of the "steady" decode steps. One with an ancestor of its own stage is left out (its
    time is in that ancestor's), as is one whose parent chain does not end."""
    parent, steady, host = inst.parent, inst.steady, inst.host_ns
    top = steady & (inst.level == 0)
    top_total = float(host[top].sum())
    if top_total <= 0:
        return None
    root = np.arange(len(inst))
    cur = parent.copy()
    nested_in_same = np.zeros(len(inst), dtype=bool)
    live = np.flatnonzero(cur >= 0)
    for _ in range(inst_mod.MAX_LEVELS):
        if len(live) == 0:
            break
        up = cur[live]
        root[live] = up
        nested_in_same[live] |= code[up] == code[live]
        cur[live] = parent[up]
        live = live[cur[live] >= 0]
    counted = steady & (cur < 0) & ~nested_in_same & top[root]
    inside = np.bincount(code[counted], weights=host[counted].astype(np.float64), minlength=n_stages)
    # parent links that cross threads can put concurrent instances under one parent, whose host
    # times then add up to more than its wall time: a share is still at most all
    return np.minimum(inside / top_total, 1.0)


def _tree_order(rows: list[Stage]) -> list[Stage]:
    """Rows (in pipeline order) reordered depth first, so that indentation by depth reads as the tree."""
    present = {r["name"] for r in rows}
    children: dict[str | None, list[Stage]] = {}
    for r in rows:
        parent = r.get("parent") if r.get("parent") in present and r.get("parent") != r["name"] else None
        children.setdefault(parent, []).append(r)
    out: list[Stage] = []
    seen: set[str] = set()
    stack = list(reversed(children.get(None, [])))
    while stack:
        r = stack.pop()
        if r["name"] in seen:
            continue
        seen.add(r["name"])
        out.append(r)
        stack.extend(reversed(children.get(r["name"], [])))
    return out + [r for r in rows if r["name"] not in seen]  # parent cycles: kept, in pipeline order


def _window_note(samples: StageSamples | None, host: Statistic) -> StageSamples | None:
    """The stage's sampler numbers, with ``window_limited`` set when utilization cannot be told for
    the stage itself: its NVML windows' time mostly not its own (``util_window_share`` below
    WINDOW_SHARE_MIN), no window over it, or (samples not from NVML) a median instance shorter
    than NVML's shortest window. ``power_limited``: the same verdict for power."""
    if not samples:
        return samples
    out = StageSamples(**samples)
    median = host.get("median") if host.get("n") else None
    share = out.get("util_window_share")
    if "util_window_share" in out and out.get("gpu_util_pct_mean") is None:
        out["window_limited"] = True  # no window covers the stage
    elif share is not None:
        out["window_limited"] = bool(share < WINDOW_SHARE_MIN)
    else:
        out["window_limited"] = bool(median is not None and median < NVML_UTIL_WINDOW_MIN_NS)
    # power from the energy counter is judged on the readings around the stage; NVML's reading on
    # the same windows as utilization
    e_share = out.get("energy_window_share")
    if out.get("power_source") == "energy" and e_share is not None:
        out["power_limited"] = bool(e_share < WINDOW_SHARE_MIN)
    else:
        out["power_limited"] = bool(out["window_limited"])
    out["sampler_window_min_ns"] = NVML_UTIL_WINDOW_MIN_NS
    return out


def _self_times(inst: inst_mod.StageInstances, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per instance: its value minus its direct child instances' values, clipped at 0 (-1 where
    missing). Exact per instance, so children that are warm-up still come off."""
    out = {}
    has_parent = inst.parent >= 0
    for key, v in columns.items():
        v = np.asarray(v, np.float64)
        child = has_parent & (v >= 0)
        sums = np.bincount(inst.parent[child], weights=v[child], minlength=len(inst)) if len(inst) else np.zeros(0)
        out[key] = np.where(v >= 0, np.maximum(v - sums, 0.0), -1.0)
    return out


def _step_work(step: np.ndarray, work: dict[str, np.ndarray]) -> StepWork | None:
    """Step trends of the GPU work a stage launches (op time, matmul time, op count), from the ops:
    other tenants, launch gaps and syncs stretch time spans. The re-prefill rule reads them."""
    out: StepWork = {}
    keys: tuple[tuple[Literal["gpu_op_ns", "matmul_ns", "ops"], str], ...] = (
        ("gpu_op_ns", "op_ns"), ("matmul_ns", "family_ns"), ("ops", "ops"))
    for key, col in keys:
        tr = step_trend(step, work[col])
        if tr.get("n_steps", 0) < STEP_WORK_MIN_STEPS:
            return None
        out[key] = tr
    return out


PerSteps = tuple[list[tuple[int, int]], tuple[Any, ...]]


def _per_steps(inst: inst_mod.StageInstances, idx: np.ndarray, stage: np.ndarray, n_stages: int) -> PerSteps:
    """Over the instances ``idx`` (``stage``: their stage codes), per (stage, marked step) of the
    first PER_STEP_KEPT of each stage, by one sort: (per stage its (lo, hi) slice, (steps,
    instances, host medians, {GPU measure: medians}))."""
    step = inst.step[idx]
    ok = step >= 0
    s, st, i = stage[ok], step[ok], idx[ok]
    if len(s) == 0:
        return [(0, 0)] * n_stages, ([], [], [], {"gpu_event_ns": [], "gpu_proj_ns": []})
    order = np.lexsort((st, s))
    s, st, i = s[order], st[order], i[order]
    new_pair = np.r_[True, (s[1:] != s[:-1]) | (st[1:] != st[:-1])]
    pcode = np.cumsum(new_pair) - 1
    n_pairs = int(pcode[-1]) + 1
    pair_stage, pair_step = s[new_pair], st[new_pair]
    first_pair = np.searchsorted(pair_stage, np.arange(n_stages))
    keep = (np.arange(n_pairs) - first_pair[pair_stage] < PER_STEP_KEPT)[pcode]
    counts = np.bincount(pcode[keep], minlength=n_pairs).tolist()
    host = group_medians(pcode[keep], inst.host_ns[i][keep], n_pairs).tolist()
    gpu = {}
    for key, col in (("gpu_event_ns", inst.gpu_event_ns), ("gpu_proj_ns", inst.proj_ns)):
        g = col[i]
        good = keep & (g >= 0)
        gpu[key] = group_medians(pcode[good], g[good], n_pairs).tolist()
    ends = np.minimum(np.r_[first_pair[1:], n_pairs], first_pair + PER_STEP_KEPT).tolist()
    return list(zip(first_pair.tolist(), ends)), (pair_step.astype(int).tolist(), counts, host, gpu)


def _per_step(per_steps: PerSteps, stage: int, basis: StepBasis) -> PerStep:
    """One stage's part of :func:`_per_steps`, as parallel lists (GPU medians on ``basis``)."""
    lo, hi = per_steps[0][stage]
    marked, n, host, gpu = per_steps[1]
    out: PerStep = {"step": marked[lo:hi], "n": n[lo:hi], "host_median_ns": host[lo:hi]}
    if basis != "host_ns":
        out["gpu_basis"] = basis
        out["gpu_median_ns"] = gpu[basis][lo:hi]
    return out


def startup_rows(inst: inst_mod.StageInstances) -> list[StartupRow]:
    """``report["startup"]``: the instances kept out as warm-up or cold start (not those nested in
    one), with the pipeline iteration each ran in (``top_stage``, ``top_occurrence``): declaring
    warm-up up to that one covers it."""
    idx = np.flatnonzero(inst.warmup | inst.cold)
    if len(idx) == 0:
        return []
    idx = idx[np.argsort(inst.host_start_ns[idx], kind="stable")][:STARTUP_KEPT]
    host, proj = inst.host_ns, inst.proj_ns
    top = warmup_rule.top_ancestor(inst.parent)
    nested = inst_mod.descendant_counts(inst.parent)
    # a cold pipeline iteration's head instance keeps its whole iteration out, siblings included
    head = inst.iteration_head if len(inst.iteration_head) == len(inst) else np.zeros(len(inst), bool)
    nested = np.where(inst.cold & head, np.maximum(nested, inst_mod.iteration_sizes(inst)), nested)
    return [
        {"stage": str(inst.key[i]), "occurrence": int(inst.occurrence[i]),
         "reason": "warmup" if inst.warmup[i] else "cold_start", "host_ns": int(host[i]),
         "gpu_event_ns": int(inst.gpu_event_ns[i]) if inst.gpu_event_ns[i] >= 0 else None,
         "gpu_proj_ns": int(proj[i]) if proj[i] >= 0 else None,
         "robust_z": round(float(inst.cold_z[i]), 2) if inst.cold[i] else None,
         "top_stage": inst.pipeline_head if inst.pipeline_head is not None else str(inst.key[top[i]]),
         "top_occurrence": int(inst.iteration[i]), "nested": int(nested[i])}
        for i in idx
    ]


def coverage(inst: inst_mod.StageInstances) -> Coverage | None:
    """How much of the run's wall time (first top-level start to last end) top-level stages cover,
    and their GPU event time; None without stages."""
    top = (inst.level == 0) & ~inst.is_mark if len(inst) else np.zeros(0, bool)
    if not top.any():
        return None
    start, end = inst.host_start_ns[top], inst.host_end_ns[top]
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    new = np.r_[True, s[1:] > e[:-1]]
    run_end = np.maximum.reduceat(e, np.flatnonzero(new))
    gpu = inst.gpu_event_ns[top]
    return {"wall_ns": int(e[-1] - s[0]), "in_stages_ns": int((run_end - s[new]).sum()),
            "gpu_event_ns": int(gpu[gpu >= 0].sum()) if (gpu >= 0).any() else None,
            "gpu_event_instances": int((gpu >= 0).sum())}
