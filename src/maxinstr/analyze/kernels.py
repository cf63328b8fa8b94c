"""Per-op analysis: families, kernel tables and each stage's kernel mix (inclusive of nested
stages), as grouped numpy reductions over the trace's op columns."""

from __future__ import annotations

import numpy as np

from maxinstr import columns
from maxinstr.analyze.families import OTHER, classify_id_codes, family_names
from maxinstr.analyze.instances import StageInstances
from maxinstr.analyze.schema import FamilyRow, GpuKernel, Mix, MixRange
from maxinstr.analyze.stats import sort_by_group
from maxinstr.attribute.model import Rule
from maxinstr.traces.model import OpKind

_MAX_DEPTH = 64
FAMILY_NAMES = np.array(family_names(), dtype=object)
"""Family name for each int16 family code."""
_OTHER_CODE = family_names().index(OTHER)
_MEMCPY_CODE = family_names().index("memcpy")
_MEMSET_CODE = family_names().index("memset")


def op_families(trace) -> np.ndarray:
    """Family code (int16 into :data:`FAMILY_NAMES`: grouping a million ops by it is a bincount)
    of every op in ``trace.ops``; copies and sets go by their kind, not their name."""
    fam = classify_id_codes(np.asarray(trace.ops.name_id), np.asarray(trace.strings, dtype=object))
    kind = np.asarray(trace.ops.kind)
    fam[kind == OpKind.MEMCPY] = _MEMCPY_CODE
    fam[kind == OpKind.MEMSET] = _MEMSET_CODE
    return fam


def op_durations(trace) -> np.ndarray:
    return np.maximum(np.asarray(trace.ops.end_ns, np.int64) - np.asarray(trace.ops.start_ns, np.int64), 0)


def family_table(dur_ns: np.ndarray, families: np.ndarray) -> list[FamilyRow]:
    """Rows ``{family, gpu_ns, share, count}`` by time, of the ops given (family codes)."""
    if len(dur_ns) == 0:
        return []
    codes = np.asarray(families, dtype=np.int64)
    ns = np.bincount(codes, weights=dur_ns, minlength=len(FAMILY_NAMES))
    return _family_rows(ns, np.bincount(codes, minlength=len(FAMILY_NAMES)), float(ns.sum()))


def _family_rows(ns: np.ndarray, cnt: np.ndarray, total: float) -> list[FamilyRow]:
    return [{"family": str(FAMILY_NAMES[i]), "gpu_ns": float(ns[i]), "share": float(ns[i] / total) if total > 0 else 0.0,
             "count": int(cnt[i])} for i in np.argsort(-ns, kind="stable") if cnt[i] > 0]


def group_stats(codes: np.ndarray, values: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    """Per integer group code: count, total, median and max of non-negative int ``values``, from
    one sort of a combined (group, value) key."""
    codes = np.asarray(codes, np.int64)
    v = np.asarray(values, np.int64)
    out = {"count": np.bincount(codes, minlength=n_groups),
           "total": np.bincount(codes, weights=v.astype(np.float64), minlength=n_groups),
           "median": np.full(n_groups, np.nan), "max": np.zeros(n_groups)}
    if len(codes) == 0:
        return out
    native = columns.function("group_order_stats")
    if native is not None:  # the same numbers in O(n): a counting sort by group (maxinstr._columns)
        out["median"], out["max"] = native(codes, v, n_groups)
        return out
    c, sv, starts, ends = sort_by_group(codes, v, n_groups)
    g = c[starts]
    out["median"][g] = (sv[(starts + ends - 1) // 2] + sv[(starts + ends) // 2]) / 2.0
    out["max"][g] = sv[ends - 1]
    return out


def kernel_table(trace, families: np.ndarray, dur_ns: np.ndarray, mask: np.ndarray | None = None,
                 limit: int | None = None) -> list[GpuKernel]:
    """Per distinct op name: family, count, total/median/max ns and share of the selected ops."""
    name_id = np.asarray(trace.ops.name_id, np.int64)
    if mask is not None:
        name_id, families, dur_ns = name_id[mask], families[mask], dur_ns[mask]
    if len(name_id) == 0:
        return []
    # name ids index the string table: dense group codes as they are (-1 -> 0)
    code = name_id + 1
    n = int(code.max()) + 1
    st = group_stats(code, dur_ns, n)
    # a name's family is the same for every op of it (by name, or by op kind for copies and sets)
    name_family = np.zeros(n, np.int64)
    name_family[code] = families
    present = np.flatnonzero(st["count"] > 0)
    total = st["total"]
    grand = float(total.sum())
    order = present[np.argsort(-total[present], kind="stable")]
    if limit is not None:
        order = order[:limit]
    strings = np.asarray(trace.strings, dtype=object)
    return [{"name": "" if i == 0 else str(strings[i - 1]), "family": str(FAMILY_NAMES[name_family[i]]),
             "count": int(st["count"][i]), "gpu_ns": float(total[i]), "median_ns": float(st["median"][i]),
             "max_ns": float(st["max"][i]), "share": float(total[i] / grand) if grand > 0 else 0.0} for i in order]


def range_to_instance(inst: StageInstances, attribution, n_ranges: int) -> np.ndarray:
    """For every trace range, the instance row of itself or its nearest ancestor that is an
    instance (-1 when none): ops inside an unjoined range still reach the enclosing stage."""
    pos = _own_instance(inst, n_ranges)
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


def _own_instance(inst: StageInstances, n_ranges: int) -> np.ndarray:
    """Per trace range, the instance row that is that range (-1: none)."""
    own = np.full(n_ranges, -1, np.int64)
    ok = inst.range_index >= 0
    own[inst.range_index[ok]] = np.flatnonzero(ok)
    return own


def range_below_instance(inst: StageInstances, attribution, n_ranges: int) -> np.ndarray:
    """For every trace range that is not a stage instance, its outermost ancestor-or-self below
    the nearest enclosing instance (-1: none): what an op is grouped by in its stage's breakdown
    (a MAX op range under ``forward``, a framework range under a stage)."""
    own = _own_instance(inst, n_ranges)
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
    """(op index, instance row) for every op and every instance enclosing it (inclusive): a name
    nested in itself counts once per instance, which is what per-instance GPU time means."""
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
    """Per stage instance (inclusive of nested stages), from :func:`op_instance_pairs`: ``op_ns``
    its GPU ops' summed duration, ``ops`` their number, ``family_ns`` the duration of those of
    ``family_codes``; -1 where the instance has no trace range."""
    n = len(inst)
    op_i, inst_i = pairs
    d = np.asarray(dur_ns, np.float64)[op_i]
    fam = np.asarray(families, np.int64)
    chosen = np.zeros(max(int(fam.max()) + 1 if len(fam) else 0, *(int(c) + 1 for c in family_codes), 1), bool)
    chosen[[int(c) for c in family_codes if int(c) >= 0]] = True
    sel = chosen[fam][op_i]  # per op once (a table lookup), then per (op, instance) pair
    has = np.asarray(inst.range_index) >= 0 if len(inst.range_index) == n else np.zeros(n, bool)
    out = {"op_ns": np.bincount(inst_i, weights=d, minlength=n), "ops": np.bincount(inst_i, minlength=n).astype(np.float64),
           "family_ns": np.bincount(inst_i[sel], weights=d[sel], minlength=n)}
    return {k: np.where(has, v, -1.0) for k, v in out.items()}


def stage_mix(inst: StageInstances, trace, attribution, families: np.ndarray, dur_ns: np.ndarray,
              top: int = 8, pairs: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Mix]:
    """Per stage key, over its steady instances: family table, top kernels, kernels per instance,
    ops counted in every enclosing stage. A stage with no steady instance (a prefill run once per
    request, all warm-up) uses every instance (``"instances_used": "all"``). ``pairs``:
    :func:`op_instance_pairs`'s result when the caller has it."""
    op_i, inst_i = pairs if pairs is not None else op_instance_pairs(inst, trace, attribution)
    out: dict[str, Mix] = {}
    if len(op_i) == 0:
        return out
    uniq, name_code = inst.key_codes()  # per instance, once
    n_stages = len(uniq)
    has_steady = np.zeros(n_stages, bool)
    has_steady[name_code[inst.steady]] = True
    keep = inst.steady[inst_i] | ~has_steady[name_code[inst_i]]
    op_i, inst_i = op_i[keep], inst_i[keep]
    del keep
    if len(op_i) == 0:
        return out
    # every per-stage number from whole-array bincounts and one sort (no per-stage unique); a 1M-op
    # trace has ~2M (op, enclosing instance) pairs here, so temporaries are int32 and freed early
    code = name_code[inst_i].astype(np.int32)
    with_ops = np.zeros(len(inst), bool)
    with_ops[inst_i] = True
    del inst_i
    n_inst = np.bincount(name_code[with_ops], minlength=n_stages)
    n_fam = len(FAMILY_NAMES)
    d = np.asarray(dur_ns, np.int64)[op_i]
    fk = code * np.int32(n_fam) + np.asarray(families, np.int32)[op_i]
    fam_ns = np.bincount(fk, weights=d, minlength=n_stages * n_fam).reshape(n_stages, n_fam)
    fam_cnt = np.bincount(fk, minlength=n_stages * n_fam).reshape(n_stages, n_fam)
    del fk
    ops = np.bincount(code, minlength=n_stages)
    n_rules = len(Rule)
    rule_cnt = np.bincount(code * np.int32(n_rules) + np.asarray(attribution.op_rule, np.int32)[op_i],
                           minlength=n_stages * n_rules).reshape(n_stages, n_rules)
    ranges = _ranges_by_stage(inst, trace, attribution, op_i, code, d, families, n_stages)
    nid = np.asarray(trace.ops.name_id, np.int64)[op_i] + 1  # string-table index, -1 -> 0
    n_names = int(nid.max()) + 1
    # a name's family is the same for every op of it (by name, or by op kind for copies and sets)
    name_family = np.zeros(n_names, np.int64)
    name_family[nid] = np.asarray(families, np.int64)[op_i]
    del op_i
    pair = code.astype(np.int64) * n_names
    pair += nid
    del code, nid
    occurring: np.ndarray | None  # the (stage, name) pairs that occur, when numbered
    if n_stages * n_names <= 8_000_000:
        occurring, pair_code = None, pair
        n_pairs = n_stages * n_names
    else:  # many stages x many names: number the pairs that occur
        occurring, pair_code = np.unique(pair, return_inverse=True)
        pair_code = pair_code.reshape(-1)
        n_pairs = len(occurring)
    st = group_stats(pair_code, d, n_pairs)
    del pair, pair_code, d
    pair_key = np.arange(n_pairs, dtype=np.int64) if occurring is None else occurring
    present = np.flatnonzero(st["count"] > 0)
    p_stage = pair_key[present] // n_names
    strings = np.asarray(trace.strings, dtype=object)
    for k in np.flatnonzero(ops > 0):
        stage = str(uniq[k])
        mine = present[p_stage == k]
        best = mine[np.argsort(-st["total"][mine], kind="stable")[:top]]
        grand = float(fam_ns[k].sum())
        ni = int(n_inst[k])
        out[stage] = {
            "instances": ni,
            "instances_used": "steady" if has_steady[k] else "all",
            "gpu_ns": grand,
            "ops": int(ops[k]),
            "ops_per_instance": float(ops[k] / ni) if ni else 0.0,
            "families": _family_rows(fam_ns[k], fam_cnt[k], grand),
            "top_kernels": [
                {"name": "" if p_name_i == 0 else str(strings[p_name_i - 1]),
                 "family": str(FAMILY_NAMES[name_family[p_name_i]]),
                 "count": int(st["count"][i]), "gpu_ns": float(st["total"][i]), "median_ns": float(st["median"][i]),
                 "share": float(st["total"][i] / grand) if grand > 0 else 0.0,
                 "per_instance": float(st["count"][i] / ni) if ni else 0.0}
                for i in best for p_name_i in [int(pair_key[i] % n_names)]
            ],
            "other_share": float(fam_ns[k, _OTHER_CODE] / grand) if grand > 0 else 0.0,
            "rules": _rule_counts(rule_cnt[k]),
            "ranges": _range_breakdown(ranges, k, strings, ni, grand, top),
        }
    return out


def _rule_counts(counts: np.ndarray) -> dict[str, int]:
    """Ops per attribution rule (the rule that tied each op to its stage), by rule name."""
    return {Rule(i).name.lower(): int(c) for i, c in enumerate(counts) if c and i != Rule.NONE}


def _ranges_by_stage(inst: StageInstances, trace, attribution, op_i: np.ndarray, code: np.ndarray, d: np.ndarray,
                     families: np.ndarray, n_stages: int) -> dict[str, np.ndarray] | None:
    """Per (stage, range name) over the (op, stage) pairs: GPU time, ops and kernels of the ops
    under ranges of other domains inside the stage (MAX's op ranges); None when no op is."""
    below = range_below_instance(inst, attribution, len(trace.ranges))
    op_range = np.asarray(attribution.op_range, np.int64)
    op_below = np.where(op_range >= 0, below[np.maximum(op_range, 0)], -1)[op_i]
    has = op_below >= 0
    if not has.any():
        return None
    rname = np.asarray(trace.ranges.name_id, np.int64)[op_below[has]] + 1  # -1 -> 0
    n_names = int(rname.max()) + 1
    key = code[has].astype(np.int64) * n_names + rname
    keys, inv = np.unique(key, return_inverse=True)
    inv = inv.reshape(-1)
    fam = np.asarray(families, np.int64)[op_i[has]]
    return {"stage": keys // n_names, "name": keys % n_names,
            "gpu_ns": np.bincount(inv, weights=d[has], minlength=len(keys)),
            "ops": np.bincount(inv, minlength=len(keys)),
            "kernels": np.bincount(inv, weights=(fam != _MEMCPY_CODE) & (fam != _MEMSET_CODE), minlength=len(keys))}


def _range_breakdown(ranges: dict[str, np.ndarray] | None, k: int | np.integer, strings: np.ndarray, n_inst: int, grand: float,
                     top: int) -> list[MixRange]:
    """Stage ``k``'s rows of :func:`_ranges_by_stage`, by GPU time."""
    if ranges is None:
        return []
    mine = np.flatnonzero(ranges["stage"] == k)
    best = mine[np.argsort(-ranges["gpu_ns"][mine], kind="stable")[:top]]
    return [{"name": "" if ranges["name"][i] == 0 else str(strings[ranges["name"][i] - 1]),
             "ops": int(ranges["ops"][i]), "kernels": int(ranges["kernels"][i]), "gpu_ns": float(ranges["gpu_ns"][i]),
             "share": float(ranges["gpu_ns"][i] / grand) if grand > 0 else 0.0,
             "per_instance": float(ranges["ops"][i] / n_inst) if n_inst else 0.0} for i in best]
