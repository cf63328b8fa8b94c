"""Exact per-range attribution of GPU ops: ``attribute(trace, run=None) -> Attribution``.

The rules, in order of precedence (docs/attribution.md states them for users):

1. ``SAME_THREAD`` (nsys's rule): the op's launch call (joined by correlation id within its
   process) lies inside a push/pop range -- or a start/end range begun and ended on one
   thread -- on the call's own thread, bounds inclusive. The op belongs to the innermost such
   range (the latest-starting one) and, through ``range_parent``, to every enclosing one.
   Ops whose launch was a CUDA graph launch (or that carry a graph node id) get ``GRAPH``:
   every node kernel of a replay belongs to the range holding the ``cudaGraphLaunch``.
2. ``START_END``: no range of 1 holds the call, but a start/end range that was ended on
   another thread does, and the call was made on its start or its end thread.
3. ``CROSS_THREAD``: the launching thread has no range holding the call (a worker or autograd
   thread): the op goes to the innermost range, over the *other* threads of the same process,
   that holds the call (ties broken by latest start). A range on the launching thread always
   wins over this rule.
4. ``TIME_OVERLAP``: the op has no launch call in the trace (no correlation): it goes to the
   innermost range of its process holding the op's GPU start time. Stated in ``notes``.

Per-range numbers are inclusive of nested ranges, as ``nsys stats`` counts them.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from maxinstr.attribute.intervals import IntervalIndex, dense_index, segmented_union
from maxinstr.attribute.model import Attribution, JoinMethod, Rule
from maxinstr.traces.model import CallKind, OpKind, RangeStyle, Trace

ALL_RULES = frozenset({Rule.SAME_THREAD, Rule.START_END, Rule.CROSS_THREAD, Rule.GRAPH, Rule.TIME_OVERLAP})
NSYS_RULES = frozenset({Rule.SAME_THREAD, Rule.GRAPH})
"""What ``nsys stats -r nvtx_gpu_proj_sum`` attributes: same-thread launches, graph replays
included (through the graph launch's correlation id)."""


def _key(pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    pid = np.asarray(pid, np.int64)
    corr = np.asarray(corr, np.int64)
    ok = (corr >= 0) & (corr < (1 << 32)) & (pid >= 0) & (pid < (1 << 31))
    return np.where(ok, (pid << 32) | (corr & 0xFFFFFFFF), -1)


def join_ops_to_calls(trace: Trace) -> np.ndarray:
    """Per op, the row of its launch call in ``trace.calls`` (same process, same correlation
    id), or -1. Large correlation ids (non-CUDA traces) are ranked densely first."""
    ops, calls = trace.ops, trace.calls
    if not len(ops) or not len(calls):
        return np.full(len(ops), -1, np.int64)
    op_corr, call_corr = ops.correlation_id, calls.correlation_id
    if max(int(op_corr.max(initial=0)), int(call_corr.max(initial=0))) >= (1 << 32):
        uniq = np.unique(call_corr)
        pos = np.clip(np.searchsorted(uniq, op_corr), 0, len(uniq) - 1)
        op_corr = np.where(uniq[pos] == op_corr, pos, -1)
        call_corr = np.searchsorted(uniq, call_corr)
    ck = _key(calls.pid, call_corr)
    ok = _key(ops.pid, op_corr)
    if len(ck) > 1 and np.all(ck[1:] >= ck[:-1]):
        order = np.arange(len(ck))
    else:
        order = np.argsort(ck, kind="stable")
    sk = ck[order]
    pos = np.searchsorted(sk, ok)
    pos_c = np.minimum(pos, len(sk) - 1)
    hit = (ok >= 0) & (sk[pos_c] == ok)
    return np.where(hit, order[pos_c], -1)


def attribute(trace: Trace, run: Any = None, *, rules: Iterable[Rule] | None = None) -> Attribution:
    """Attribute every GPU op of ``trace`` to the ranges that launched it.

    ``rules`` limits the rules used (default: all); ``NSYS_RULES`` reproduces ``nsys stats``.
    With ``run`` (a run directory, see :func:`join_run`), ranges are joined to its stage
    records and ``range_record_id``/``join_method`` are filled.
    """
    use = ALL_RULES if rules is None else frozenset(Rule(r) for r in rules)
    R, C, O = trace.ranges, trace.calls, trace.ops
    n, m = len(R), len(O)
    notes: list[str] = []

    style = R.style
    same_thread = (style == RangeStyle.PUSH_POP) | ((style == RangeStyle.START_END) & (R.end_tid == R.tid))
    split = (style == RangeStyle.START_END) & (R.end_tid != R.tid)
    marks = style == RangeStyle.MARK

    # Threads are (pid, tid) pairs, densely numbered over ranges and calls together.
    all_pid = np.concatenate([R.pid, R.pid, C.pid])
    all_tid = np.concatenate([R.tid, R.end_tid, C.tid])
    thread, _ = dense_index(all_pid, all_tid)
    r_thread, r_end_thread, c_thread = thread[:n], thread[n : 2 * n], thread[2 * n :]

    rows1 = np.flatnonzero(same_thread)
    idx1 = IntervalIndex.build(rows1, r_thread[rows1], R.start_ns[rows1], R.end_ns[rows1])
    parent = np.full(n, -1, np.int64)
    parent[idx1.rows] = idx1.parents()
    if marks.any():  # a mark's parent is the range open around it on its thread
        mrows = np.flatnonzero(marks)
        parent[mrows] = idx1.innermost(r_thread[mrows], R.start_ns[mrows], R.start_ns[mrows])
    depth = _depth(parent)

    # --- calls -> ranges -------------------------------------------------------------------
    op_call = join_ops_to_calls(trace)
    call_used = np.zeros(len(C), bool)
    call_used[op_call[op_call >= 0]] = True
    cu = np.flatnonzero(call_used)
    call_range = np.full(len(C), -1, np.int64)
    call_rule = np.zeros(len(C), np.int8)
    is_graph_call = C.kind == CallKind.GRAPH

    if Rule.SAME_THREAD in use or Rule.GRAPH in use:
        got = idx1.innermost(c_thread[cu], C.start_ns[cu], C.end_ns[cu])
        rule = np.where(is_graph_call[cu], Rule.GRAPH, Rule.SAME_THREAD).astype(np.int8)
        allowed = np.isin(rule, [int(r) for r in use & {Rule.SAME_THREAD, Rule.GRAPH}])
        got = np.where(allowed, got, -1)
        call_range[cu], call_rule[cu] = got, np.where(got >= 0, rule, 0)

    if Rule.START_END in use and split.any():
        left = cu[call_range[cu] < 0]
        rows2 = np.flatnonzero(split)
        best = np.full(len(left), -1, np.int64)
        for grp in (r_thread, r_end_thread):  # the start thread, then the end thread
            idx2 = IntervalIndex.build(rows2, grp[rows2], R.start_ns[rows2], R.end_ns[rows2])
            best = _later(R.start_ns, best, idx2.innermost(c_thread[left], C.start_ns[left], C.end_ns[left]))
        call_range[left] = best
        call_rule[left[best >= 0]] = Rule.START_END

    if Rule.CROSS_THREAD in use and len(rows1):
        left = cu[call_range[cu] < 0]
        best = np.full(len(left), -1, np.int64)
        for t in np.unique(r_thread[rows1]):  # threads holding ranges: few
            pid_t = R.pid[rows1][r_thread[rows1] == t][0]
            sel = np.flatnonzero((C.pid[left] == pid_t) & (c_thread[left] != t))
            if not len(sel):
                continue
            q = left[sel]
            got = idx1.innermost(np.full(len(q), t), C.start_ns[q], C.end_ns[q])
            best[sel] = _later(R.start_ns, best[sel], got)
        call_range[left] = best
        call_rule[left[best >= 0]] = Rule.CROSS_THREAD

    # --- ops ---------------------------------------------------------------------------------
    op_range = np.full(m, -1, np.int64)
    op_rule = np.zeros(m, np.int8)
    has_call = op_call >= 0
    op_range[has_call] = call_range[op_call[has_call]]
    op_rule[has_call] = call_rule[op_call[has_call]]
    graph_op = has_call & (O.graph_node_id >= 0) & (op_rule == Rule.SAME_THREAD)
    op_rule[graph_op] = Rule.GRAPH  # graph node kernels launched through a non-graph call name

    no_call = np.flatnonzero(~has_call)
    if len(no_call):
        if Rule.TIME_OVERLAP in use and len(rows1):
            best = np.full(len(no_call), -1, np.int64)
            for t in np.unique(r_thread[rows1]):
                pid_t = R.pid[rows1][r_thread[rows1] == t][0]
                sel = np.flatnonzero(O.pid[no_call] == pid_t)
                if not len(sel):
                    continue
                q = no_call[sel]
                got = idx1.innermost(np.full(len(q), t), O.start_ns[q], O.start_ns[q])
                best[sel] = _later(R.start_ns, best[sel], got)
            op_range[no_call] = best
            op_rule[no_call[best >= 0]] = Rule.TIME_OVERLAP
            notes.append(
                f"{len(no_call)} of {m} GPU ops have no launch call in the trace (no correlation): "
                f"{int((best >= 0).sum())} attributed by time overlap (GPU start inside a range)"
            )
        else:
            notes.append(f"{len(no_call)} of {m} GPU ops have no launch call in the trace: not attributed")
    if n == 0 and m:
        notes.append("the trace has no ranges: every op has op_range -1 (kernel breakdown only)")
    for r, what in ((Rule.CROSS_THREAD, "launched from another thread than the range's"),
                    (Rule.START_END, "inside start/end ranges ended on another thread")):  # fmt: skip
        k = int((op_rule == r).sum())
        if k:
            notes.append(f"{k} GPU ops attributed by rule {r.name}: {what}")

    att = Attribution(trace=trace, op_range=op_range, op_rule=op_rule, range_parent=parent,
                      range_depth=depth.astype(np.int16))  # fmt: skip
    _range_totals(att, op_call)
    att.notes = notes
    if run is not None:
        join_run(att, run)
    return att


def _later(start: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per element, whichever of ranges a/b started later (-1 = none)."""
    sa = np.where(a >= 0, start[np.maximum(a, 0)], np.iinfo(np.int64).min)
    sb = np.where(b >= 0, start[np.maximum(b, 0)], np.iinfo(np.int64).min)
    return np.where(sb > sa, b, a)


def _depth(parent: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parent), np.int64)
    cur = parent.copy()
    active = np.flatnonzero(cur >= 0)
    while len(active):  # one pass per nesting level
        depth[active] += 1
        cur[active] = parent[cur[active]]
        active = active[cur[active] >= 0]
    return depth


def _range_totals(att: Attribution, op_call: np.ndarray) -> None:
    """Fill the per-range inclusive totals from ``op_range`` and ``range_parent``."""
    trace = att.trace
    O = trace.ops
    n = len(trace.ranges)
    # Each op once per enclosing range: (op, range) pairs, built in op start order so the
    # later sort by range is nearly sorted already.
    by_start = np.argsort(O.start_ns, kind="stable")
    ops_l, rng_l = [], []
    cur_ops = by_start[att.op_range[by_start] >= 0]
    cur = att.op_range[cur_ops]
    while len(cur_ops):
        ops_l.append(cur_ops)
        rng_l.append(cur)
        up = att.range_parent[cur]
        keep = up >= 0
        cur_ops, cur = cur_ops[keep], up[keep]
    pair_op = np.concatenate(ops_l) if ops_l else np.empty(0, np.int64)
    pair_rng = np.concatenate(rng_l) if rng_l else np.empty(0, np.int64)
    order = np.argsort(pair_rng, kind="stable")  # keeps start order inside each range
    pair_op, pair_rng = pair_op[order], pair_rng[order]

    kind = O.kind[pair_op]
    dur = (O.end_ns - O.start_ns)[pair_op]

    def count(mask: np.ndarray | None = None, weights: np.ndarray | None = None) -> np.ndarray:
        r = pair_rng if mask is None else pair_rng[mask]
        w = None if weights is None else (weights if mask is None else weights[mask])
        return np.bincount(r, weights=w, minlength=n)[:n].astype(np.int64)

    att.op_count = count()
    is_k, is_c, is_s = kind == OpKind.KERNEL, kind == OpKind.MEMCPY, kind == OpKind.MEMSET
    att.kernel_count = count(is_k)
    att.kernel_ns = count(is_k, dur)
    nbytes = O.bytes[pair_op]
    att.memcpy_bytes, att.memcpy_ns = count(is_c, nbytes), count(is_c, dur)
    att.memset_bytes, att.memset_ns = count(is_s, nbytes), count(is_s, dur)
    # Launch calls: every op of one call has the same range, so "first op of its call" counts
    # distinct calls; an op with no call counts as its own launch (nsys counts correlation ids).
    first = np.ones(len(O), bool)
    called = np.flatnonzero(op_call >= 0)
    if len(called):
        oc = op_call[called]
        srt = np.argsort(oc, kind="stable")
        dup = np.r_[False, oc[srt][1:] == oc[srt][:-1]]
        first[called[srt[dup]]] = False
    att.launch_count = count(first[pair_op])

    gid, lo, hi, busy = segmented_union(pair_rng, O.start_ns[pair_op], O.end_ns[pair_op])
    att.proj_start_ns = np.full(n, -1, np.int64)
    att.proj_end_ns = np.full(n, -1, np.int64)
    att.busy_ns = np.zeros(n, np.int64)
    att.proj_start_ns[gid], att.proj_end_ns[gid], att.busy_ns[gid] = lo, hi, busy
    att.idle_gap_ns = np.where(att.proj_start_ns >= 0, att.proj_end_ns - att.proj_start_ns - att.busy_ns, 0)
    rules = np.zeros(n, np.uint8)
    pr = att.op_rule[pair_op]
    for r in Rule:
        if r != Rule.NONE:
            rules |= np.where(count(pr == r) > 0, np.uint8(1 << int(r)), np.uint8(0))
    att.range_rules = rules
    att.range_record_id = np.full(n, -1, np.int64)


def join_run(att: Attribution, run: Any) -> None:
    """Join trace ranges to a run directory's stage records (see :mod:`maxinstr.attribute.join`)."""
    from maxinstr.attribute.join import join_records

    join_records(att, run)


__all__ = ["ALL_RULES", "NSYS_RULES", "attribute", "join_ops_to_calls", "join_run", "JoinMethod"]
