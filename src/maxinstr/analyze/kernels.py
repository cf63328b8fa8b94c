"""Per-op analysis: families, kernel tables and each stage's kernel mix (inclusive of nested
stages), all as grouped numpy reductions over the trace's op columns."""

from __future__ import annotations

import numpy as np

from maxinstr.analyze.families import OTHER, classify_id_codes, family_names
from maxinstr.analyze.instances import StageInstances
from maxinstr.analyze.stats import group_medians

_MAX_DEPTH = 64


FAMILY_NAMES = np.array(family_names(), dtype=object)
"""Family name for each int16 family code."""
_OTHER_CODE = family_names().index(OTHER)
_MEMCPY_CODE = family_names().index("memcpy")
_MEMSET_CODE = family_names().index("memset")


def op_families(trace) -> np.ndarray:
    """Family code (int16 into :data:`FAMILY_NAMES`) of every op in ``trace.ops``; copies and
    sets go by their kind, not their name. Codes, not strings: grouping a million ops by an
    integer is a bincount, by a string a sort of Python objects."""
    from maxinstr.traces.model import OpKind

    ops = trace.ops
    fam = classify_id_codes(np.asarray(ops.name_id), np.asarray(trace.strings, dtype=object))
    kind = np.asarray(ops.kind)
    names = list(FAMILY_NAMES)
    fam[kind == OpKind.MEMCPY] = names.index("memcpy")
    fam[kind == OpKind.MEMSET] = names.index("memset")
    return fam


def op_durations(trace) -> np.ndarray:
    ops = trace.ops
    return np.maximum(np.asarray(ops.end_ns, np.int64) - np.asarray(ops.start_ns, np.int64), 0)


def family_table(dur_ns: np.ndarray, families: np.ndarray) -> list[dict]:
    """Rows ``{family, gpu_ns, share, count}`` sorted by time, shares of the total given.
    ``families`` are int codes (:func:`op_families`)."""
    if len(dur_ns) == 0:
        return []
    k = len(FAMILY_NAMES)
    codes = np.asarray(families, dtype=np.int64)
    ns = np.bincount(codes, weights=dur_ns, minlength=k)
    cnt = np.bincount(codes, minlength=k)
    total = float(ns.sum())
    order = [i for i in np.argsort(-ns, kind="stable") if cnt[i] > 0]
    return [
        {"family": str(FAMILY_NAMES[i]), "gpu_ns": float(ns[i]), "share": float(ns[i] / total) if total > 0 else 0.0,
         "count": int(cnt[i])}
        for i in order
    ]


def kernel_table(trace, families: np.ndarray, dur_ns: np.ndarray, mask: np.ndarray | None = None,
                 limit: int | None = None) -> list[dict]:
    """Per distinct op name: family, count, total/median/max ns and share of the selected ops."""
    name_id = np.asarray(trace.ops.name_id, np.int64)
    if mask is not None:
        name_id, families, dur_ns = name_id[mask], families[mask], dur_ns[mask]
    if len(name_id) == 0:
        return []
    ids, first, inv = np.unique(name_id, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    total = np.bincount(inv, weights=dur_ns, minlength=len(ids))
    count = np.bincount(inv, minlength=len(ids))
    med = group_medians(inv, dur_ns, len(ids))
    mx = np.zeros(len(ids))
    np.maximum.at(mx, inv, dur_ns)
    grand = float(total.sum())
    order = np.argsort(-total, kind="stable")
    if limit is not None:
        order = order[:limit]
    strings = np.asarray(trace.strings, dtype=object)
    return [
        {
            "name": "" if ids[i] < 0 else str(strings[ids[i]]),
            "family": str(FAMILY_NAMES[families[first[i]]]),
            "count": int(count[i]),
            "gpu_ns": float(total[i]),
            "median_ns": float(med[i]),
            "max_ns": float(mx[i]),
            "share": float(total[i] / grand) if grand > 0 else 0.0,
        }
        for i in order
    ]


def range_to_instance(inst: StageInstances, attribution, n_ranges: int) -> np.ndarray:
    """For every trace range, the instance row of itself or its nearest ancestor that is an
    instance (-1 when none): ops inside an unjoined range still reach the enclosing stage."""
    pos = np.full(n_ranges, -1, np.int64)
    ok = inst.range_index >= 0
    pos[inst.range_index[ok]] = np.flatnonzero(ok)
    if attribution is None or len(attribution.range_parent) != n_ranges:
        return pos
    parent = np.asarray(attribution.range_parent, np.int64)
    cur = parent.copy()
    for _ in range(_MAX_DEPTH):
        todo = (pos < 0) & (cur >= 0)
        if not todo.any():
            break
        pos[todo] = pos[cur[todo]]
        cur[todo] = parent[cur[todo]]
    return pos


def range_below_instance(inst: StageInstances, attribution, n_ranges: int) -> np.ndarray:
    """For every trace range that is not a stage instance, its outermost ancestor-or-self below
    the nearest enclosing instance (-1 for instance ranges and for ranges under none): the
    range an op is grouped by in its stage's breakdown (a MAX op range under ``forward``, a
    framework range under a stage). Ranges of one chain between two instances share it."""
    own = np.full(n_ranges, -1, np.int64)
    ok = inst.range_index >= 0
    own[inst.range_index[ok]] = np.flatnonzero(ok)
    below = np.where(own < 0, np.arange(n_ranges), -1)
    if attribution is None or len(attribution.range_parent) != n_ranges:
        return below
    parent = np.asarray(attribution.range_parent, np.int64)
    cur = np.where(below >= 0, parent, -1)
    for _ in range(_MAX_DEPTH):
        up = np.flatnonzero(cur >= 0)
        if not len(up):
            break
        is_inst = own[cur[up]] >= 0
        below[up[~is_inst]] = cur[up[~is_inst]]
        cur[up[is_inst]] = -1
        cur[up[~is_inst]] = parent[cur[up[~is_inst]]]
    reach = range_to_instance(inst, attribution, n_ranges)
    below[reach < 0] = -1  # under no stage: nothing to break down
    return below


def op_instance_pairs(inst: StageInstances, trace, attribution) -> tuple[np.ndarray, np.ndarray]:
    """(op index, instance row) for every op and every instance enclosing it (inclusive).

    An op appears once per enclosing instance level; a name nested in itself is counted
    once per instance, which is what per-instance GPU time means.
    """
    if attribution is None or len(attribution.op_range) != len(trace.ops):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    r2i = range_to_instance(inst, attribution, len(trace.ranges))
    op_range = np.asarray(attribution.op_range, np.int64)
    op_idx = np.flatnonzero(op_range >= 0)
    cur = r2i[op_range[op_idx]]
    ops_out, inst_out = [], []
    for _ in range(_MAX_DEPTH):
        live = cur >= 0
        if not live.any():
            break
        op_idx, cur = op_idx[live], cur[live]
        ops_out.append(op_idx)
        inst_out.append(cur)
        cur = inst.parent[cur]
    if not ops_out:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(ops_out), np.concatenate(inst_out)


def instance_op_work(inst: StageInstances, families: np.ndarray, dur_ns: np.ndarray,
                     pairs: tuple[np.ndarray, np.ndarray], family_codes) -> dict[str, np.ndarray]:
    """Per stage instance (inclusive of nested stages), from the (op, instance) ``pairs`` of
    :func:`op_instance_pairs`: ``op_ns`` the summed duration of its GPU ops, ``ops`` their
    number, and ``family_ns`` the summed duration of the ops whose family code is in
    ``family_codes``. -1 where the instance has no trace range (nothing to say)."""
    n = len(inst)
    op_i, inst_i = pairs
    d = np.asarray(dur_ns, np.float64)[op_i]
    sel = np.isin(np.asarray(families)[op_i], np.asarray(list(family_codes), np.int64))
    has = np.asarray(inst.range_index) >= 0 if len(inst.range_index) == n else np.zeros(n, bool)
    out = {
        "op_ns": np.bincount(inst_i, weights=d, minlength=n),
        "ops": np.bincount(inst_i, minlength=n).astype(np.float64),
        "family_ns": np.bincount(inst_i[sel], weights=d[sel], minlength=n),
    }
    return {k: np.where(has, v, -1.0) for k, v in out.items()}


def stage_mix(inst: StageInstances, trace, attribution, families: np.ndarray, dur_ns: np.ndarray,
              top: int = 8, pairs: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, dict]:
    """Per stage name, over its steady instances: family table, top kernels, and kernels per
    instance. Ops are counted in every enclosing stage (inclusive). A stage with no steady
    instance at all (e.g. a prefill run once per request, all warm-up) uses every instance,
    and says so (``"instances_used": "all"``). ``pairs``: :func:`op_instance_pairs`'s result
    when the caller already has it."""
    op_i, inst_i = pairs if pairs is not None else op_instance_pairs(inst, trace, attribution)
    out: dict[str, dict] = {}
    if len(op_i) == 0:
        return out
    uniq, name_code = inst.key_codes()
    has_steady = np.zeros(len(uniq), bool)
    has_steady[name_code[inst.steady]] = True
    steady_names = set(uniq[has_steady].tolist())
    keep = inst.steady[inst_i] | ~has_steady[name_code[inst_i]]
    op_i, inst_i = op_i[keep], inst_i[keep]
    if len(op_i) == 0:
        return out
    code = name_code[inst_i]
    order = np.argsort(code, kind="stable")
    bounds = np.r_[0, np.flatnonzero(np.diff(code[order])) + 1, len(order)]
    name_ids = np.asarray(trace.ops.name_id, np.int64)
    strings = np.asarray(trace.strings, dtype=object)
    op_rule = np.asarray(attribution.op_rule, np.int64)
    # per op: the range it is grouped by in its stage's breakdown (-1: directly in the stage)
    below = range_below_instance(inst, attribution, len(trace.ranges))
    op_below = below[np.asarray(attribution.op_range, np.int64)]
    op_below[np.asarray(attribution.op_range) < 0] = -1
    range_names = np.asarray(trace.ranges.name_id, np.int64)
    for k in range(len(bounds) - 1):
        sel = order[bounds[k]:bounds[k + 1]]
        ops = op_i[sel]
        stage = str(uniq[code[sel[0]]])
        d, f = dur_ns[ops], families[ops]
        n_inst = len(np.unique(inst_i[sel]))
        ids, first, inv = np.unique(name_ids[ops], return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        tot = np.bincount(inv, weights=d, minlength=len(ids))
        cnt = np.bincount(inv, minlength=len(ids))
        med = group_medians(inv, d, len(ids))
        grand = float(tot.sum())
        best = np.argsort(-tot, kind="stable")[:top]
        out[stage] = {
            "instances": int(n_inst),
            "instances_used": "all" if stage not in steady_names else "steady",
            "gpu_ns": grand,
            "ops": int(len(ops)),
            "ops_per_instance": float(len(ops) / n_inst) if n_inst else 0.0,
            "families": family_table(d, f),
            "top_kernels": [
                {"name": "" if ids[i] < 0 else str(strings[ids[i]]), "family": str(FAMILY_NAMES[f[first[i]]]),
                 "count": int(cnt[i]), "gpu_ns": float(tot[i]), "median_ns": float(med[i]),
                 "share": float(tot[i] / grand) if grand > 0 else 0.0,
                 "per_instance": float(cnt[i] / n_inst) if n_inst else 0.0}
                for i in best
            ],
            "other_share": float(d[f == _OTHER_CODE].sum() / grand) if grand > 0 else 0.0,
            "rules": _rule_counts(op_rule[ops]),
            "ranges": _range_breakdown(op_below[ops], range_names, strings, d, f, n_inst, grand, top),
        }
    return out


def _rule_counts(rules: np.ndarray) -> dict[str, int]:
    """Ops per attribution rule (the rule that tied each op to its stage), by rule name."""
    from maxinstr.attribute.model import Rule

    counts = np.bincount(rules, minlength=len(Rule))
    return {Rule(i).name.lower(): int(c) for i, c in enumerate(counts) if c and i != Rule.NONE}


def _range_breakdown(op_below: np.ndarray, range_names: np.ndarray, strings: np.ndarray, d: np.ndarray,
                     f: np.ndarray, n_inst: int, grand: float, top: int) -> list[dict]:
    """The ranges of other domains inside a stage (MAX's op ranges, a framework's), by name:
    GPU time and kernels of the ops under each, per stage instance. Empty when none."""
    has = op_below >= 0
    if not has.any():
        return []
    names = range_names[op_below[has]]
    ids, first, inv = np.unique(names, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    tot = np.bincount(inv, weights=d[has], minlength=len(ids))
    ops = np.bincount(inv, minlength=len(ids))
    kernels = np.bincount(inv, weights=(f[has] != _MEMCPY_CODE) & (f[has] != _MEMSET_CODE), minlength=len(ids))
    best = np.argsort(-tot, kind="stable")[:top]
    return [{"name": "" if ids[i] < 0 else str(strings[ids[i]]), "ops": int(ops[i]), "kernels": int(kernels[i]),
             "gpu_ns": float(tot[i]), "share": float(tot[i] / grand) if grand > 0 else 0.0,
             "per_instance": float(ops[i] / n_inst) if n_inst else 0.0} for i in best]
