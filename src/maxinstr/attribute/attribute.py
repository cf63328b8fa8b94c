"""Exact per-range attribution of GPU ops: ``attribute(trace, run=None) -> Attribution``, by the rules of
docs/attribution.md (:class:`Rule`, in order). Per-range numbers include nested ranges, as ``nsys stats``
counts them; where the trace holds other domains' ranges too, maxinstr's stages own the work they submit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from maxinstr.attribute.intervals import IntervalIndex, segmented_union
from maxinstr.attribute.join import in_maxinstr_domain, join_records
from maxinstr.attribute.model import Attribution, JoinMethod, Rule
from maxinstr.columns import correlation_join
from maxinstr.traces.model import OP_CALL_KEY, CallKind, OpKind, RangeStyle, Trace

OP_STAGE_KEY = "op_stage_id"  # trace.meta's per op stage record id that launched it (in-process traces), -1 none
CALIBRATION_KERNEL = "maxinstr_spin"  # the stage core's own GPU-floor kernel (csrc/core/floor.cpp)

_CHUNK = 1 << 20  # ops (or op, range pairs) per block of the per-op passes: bounds the temporaries on 10M-op traces

ALL_RULES = frozenset({Rule.SAME_THREAD, Rule.START_END, Rule.CROSS_THREAD, Rule.GRAPH, Rule.TIME_OVERLAP})
NSYS_RULES = frozenset({Rule.SAME_THREAD, Rule.GRAPH})  # what ``nsys stats -r nvtx_gpu_proj_sum`` attributes


def join_ops_to_calls(trace: Trace) -> np.ndarray:
    """Per op, its launch call's row (same process and correlation id; the first of duplicates), or -1."""
    O, C = trace.ops, trace.calls
    known = trace.meta.get(OP_CALL_KEY) if isinstance(trace.meta, dict) else None
    if (isinstance(known, tuple) and len(known) == 5 and known[0] is O.pid and known[1] is O.correlation_id
            and known[2] is C.pid and known[3] is C.correlation_id and len(known[4]) == len(O)):
        return known[4]  # the reader's own join of these very columns (traces.model.OP_CALL_KEY)
    return correlation_join(O.pid, O.correlation_id, C.pid, C.correlation_id)


def attribute(trace: Trace, run: Any = None, *, rules: Iterable[Rule] | None = None) -> Attribution:
    """Attribute every GPU op of ``trace`` to the ranges that launched it, by ``rules`` (default: all;
    ``NSYS_RULES`` as ``nsys stats``); with ``run`` ranges are joined to its stage records (:mod:`.join`)."""
    use = ALL_RULES if rules is None else frozenset(Rule(r) for r in rules)
    owner = trace.meta.get(OP_STAGE_KEY) if isinstance(trace.meta, dict) else None
    if isinstance(owner, np.ndarray) and len(owner) == len(trace.ops):
        return _attribute_by_stage_id(trace, owner, run)
    R, C, O = trace.ranges, trace.calls, trace.ops
    n, m = len(R), len(O)
    notes: list[str] = []

    split = (R.style == RangeStyle.START_END) & (R.end_tid != R.tid)
    # threads ((pid, tid)) holding ranges get dense ids; a call on another thread gets -1 (only CROSS_THREAD)
    r_key, r_end_key = _thread_key(R.pid, R.tid), _thread_key(R.pid, R.end_tid)
    threads = np.unique(np.concatenate([r_key, r_end_key]))
    r_thread, r_end_thread = np.searchsorted(threads, r_key), np.searchsorted(threads, r_end_key)
    c_thread = _thread_ids(threads, C.pid, C.tid)
    same_thread, rows1, idx1, parent = _range_tree(trace, r_thread)
    depth = _depth(parent)

    op_call = join_ops_to_calls(trace)
    call_used = np.zeros(len(C), bool)
    for lo in range(0, m, _CHUNK):
        oc = op_call[lo : lo + _CHUNK]
        call_used[oc[oc >= 0]] = True
    # readers keep launch calls only: usually all used, then whole columns pass as they are (no index copies)
    all_used = bool(call_used.all())
    cu = slice(None) if all_used else np.flatnonzero(call_used)
    call_range, call_rule = np.full(len(C), -1, np.int64), np.zeros(len(C), np.int8)
    is_graph_call = C.kind == CallKind.GRAPH

    if Rule.SAME_THREAD in use or Rule.GRAPH in use:
        got = idx1.innermost(c_thread[cu], C.start_ns[cu], C.end_ns[cu])
        rule = np.where(is_graph_call[cu], Rule.GRAPH, Rule.SAME_THREAD).astype(np.int8)
        allowed = np.isin(rule, [int(r) for r in use & {Rule.SAME_THREAD, Rule.GRAPH}])
        got = np.where(allowed, got, -1)
        call_range[cu], call_rule[cu] = got, np.where(got >= 0, rule, 0)
        del got, rule, allowed  # (each one value per call: free them before the big passes)

    def pending() -> np.ndarray:  # used calls no range holds yet
        return np.flatnonzero(call_range < 0) if all_used else cu[call_range[cu] < 0]  # noqa: F821 - called before the del below

    if Rule.START_END in use and split.any():
        left = pending()
        rows2 = np.flatnonzero(split)
        best = np.full(len(left), -1, np.int64)
        for grp in (r_thread, r_end_thread):  # the start thread, then the end thread
            idx2 = IntervalIndex.build(rows2, grp[rows2], R.start_ns[rows2], R.end_ns[rows2])
            best = _later(R.start_ns, best, idx2.innermost(c_thread[left], C.start_ns[left], C.end_ns[left]))
        call_range[left] = best
        call_rule[left[best >= 0]] = Rule.START_END
        del left, best

    if Rule.CROSS_THREAD in use and len(rows1):
        left = pending()
        best = _innermost_elsewhere(trace, idx1, rows1, r_thread, left, C.pid, C.start_ns, C.end_ns, c_thread)
        call_range[left] = best
        call_rule[left[best >= 0]] = Rule.CROSS_THREAD
        del left, best

    stage, linked = stage_domain_mask(trace), 0
    if stage is not None and Rule.CROSS_THREAD in use:
        cidx = np.arange(len(C)) if all_used else cu
        linked = _own_by_stages(trace, stage, same_thread, r_thread, c_thread, cidx, parent, call_range, call_rule)
        if linked:
            depth = _depth(parent)
        del cidx

    op_range, op_rule = np.full(m, -1, np.int64), np.zeros(m, np.int8)
    for lo in range(0, m, _CHUNK):  # in blocks: bounded temporaries on 10M-op traces
        h = np.flatnonzero(op_call[lo : lo + _CHUNK] >= 0)
        c = op_call[lo + h]
        op_range[lo + h] = call_range[c]
        rule = call_rule[c]
        # graph node kernels launched through a non-graph call name
        rule[(rule == Rule.SAME_THREAD) & (O.graph_node_id[lo + h] >= 0)] = Rule.GRAPH
        op_rule[lo + h] = rule
        del h, c, rule

    no_call = np.flatnonzero(op_call < 0)
    if len(no_call):
        if Rule.TIME_OVERLAP in use and len(rows1):
            best = _innermost_elsewhere(trace, idx1, rows1, r_thread, no_call, O.pid, O.start_ns, O.start_ns)
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
        if k := int((op_rule == r).sum()):
            notes.append(f"{k} GPU ops attributed by rule {r.name}: {what}")
    if linked:
        notes.append(f"{linked} ranges of other domains on threads that hold no stage (a runtime's worker: MAX "
                     "launches every kernel from one) nest under the maxinstr stage that owns their ops")

    # Launches per range: one per used call, at its range (every op of a call has that range).
    call_launch = call_range[call_range >= 0]
    del call_range, call_rule, call_used, cu, c_thread, no_call, is_graph_call, idx1  # before the big pass
    del r_key, r_end_key, r_thread, r_end_thread, rows1, threads
    att = Attribution(trace=trace, op_range=op_range, op_rule=op_rule, range_parent=parent,
                      range_depth=depth.astype(np.int16))  # fmt: skip
    box = [op_call]  # handed over: _range_sums frees it (8 bytes per op) once the sums are taken
    del op_call
    _range_sums(att, box, call_launch)
    del call_launch
    _range_spans(att)
    att.notes = notes
    if run is not None:
        join_records(att, run)
    return att


def stage_domain_mask(trace: Trace) -> np.ndarray | None:
    """Per range, whether it is a maxinstr stage, when the trace also holds other domains' ranges; else None."""
    stage = in_maxinstr_domain(trace) & (trace.ranges.style != RangeStyle.MARK)
    return None if not stage.any() or stage.all() else stage


def _own_by_stages(trace: Trace, stage: np.ndarray, same_thread: np.ndarray, r_thread: np.ndarray,
                   c_thread: np.ndarray, cidx: np.ndarray, parent: np.ndarray, call_range: np.ndarray,
                   call_rule: np.ndarray) -> int:
    """Stages own the work they submit, whoever launches it (docs/attribution.md): each launch call (rows
    ``cidx``) gets its stage from the stage ranges alone; ``call_range`` keeps the innermost range of any
    domain under that stage; another domain's range on a thread without stages nests under the stage of
    its first launch. Returns the ranges so linked."""
    R, C = trace.ranges, trace.calls
    srows = np.flatnonzero(same_thread & stage)
    if not len(srows) or not len(cidx):
        return 0
    idx = IntervalIndex.build(srows, r_thread[srows], R.start_ns[srows], R.end_ns[srows])
    cs, ce, ct = C.start_ns[cidx], C.end_ns[cidx], c_thread[cidx]
    own = idx.innermost(ct, cs, ce)
    rule = np.where(own >= 0, np.where(C.kind[cidx] == CallKind.GRAPH, Rule.GRAPH, Rule.SAME_THREAD), Rule.NONE)
    left = np.flatnonzero(own < 0)
    if len(left):
        best = _innermost_elsewhere(trace, idx, srows, r_thread, cidx[left], C.pid, C.start_ns, C.end_ns, c_thread)
        own[left] = best
        rule[left[best >= 0]] = Rule.CROSS_THREAD
    rule = rule.astype(np.int8)

    nearest, top = _stage_ancestry(stage, parent)
    holds_stage = np.zeros(int(r_thread.max()) + 1 if len(r_thread) else 0, bool)
    holds_stage[r_thread[srows]] = True
    inner = call_range[cidx]
    has = inner >= 0
    inner_stage = np.where(has, nearest[np.maximum(inner, 0)], -1)
    keep = has & (inner_stage == own)
    # ranges of a thread that holds no stage, under no stage: each nests under the stage of its
    # first launch call (by time); its calls that belong to another stage go to that stage directly
    free = has & ~keep & (own >= 0) & (inner_stage < 0) & ~holds_stage[r_thread[np.maximum(inner, 0)]]
    linked = 0
    if free.any():
        f = np.flatnonzero(free)
        tops = top[inner[f]]
        order = np.lexsort((cs[f], tops))
        first = np.r_[True, tops[order][1:] != tops[order][:-1]]
        link_top, link_to = tops[order][first], own[f][order][first]
        parent[link_top] = link_to
        linked, target = len(link_top), np.full(len(R), -1, np.int64)
        target[link_top] = link_to
        keep[f] = target[tops] == own[f]
    call_range[cidx] = np.where(keep, inner, np.where(own >= 0, own, inner))
    call_rule[cidx] = np.where(own >= 0, rule, call_rule[cidx])
    return linked


def _stage_ancestry(stage: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per range: the nearest stage among itself and its ancestors (-1 none), and its top-level ancestor."""
    n = len(parent)
    nearest, top = np.where(stage, np.arange(n), -1), np.arange(n)
    up = parent.copy()
    active = np.flatnonzero(up >= 0)
    while len(active):  # one pass per nesting level
        p = up[active]
        nearest[active] = np.where(nearest[active] >= 0, nearest[active], np.where(stage[p], p, -1))
        top[active] = p
        up[active] = parent[p]
        active = active[up[active] >= 0]
    return nearest, top


def _attribute_by_stage_id(trace: Trace, owner: np.ndarray, run: Any) -> Attribution:
    """Attribution where the trace names, per op, the stage record that launched it: that record's range."""
    R, O = trace.ranges, trace.ops
    m = len(O)
    notes: list[str] = []
    r_key = _thread_key(R.pid, R.tid)
    threads = np.unique(r_key)
    r_thread = np.searchsorted(threads, r_key)
    _, rows1, idx1, parent = _range_tree(trace, r_thread)
    depth = _depth(parent)
    # (pid, record id) -> range row; marks never own ops.
    cand = np.flatnonzero((R.style != RangeStyle.MARK) & (R.payload >= 0))
    key = _thread_key(R.pid[cand], R.payload[cand])  # record ids are unique per process
    srt = np.argsort(key, kind="stable")
    key, cand = key[srt], cand[srt]
    op_key, op_range = _thread_key(O.pid, owner), np.full(m, -1, np.int64)
    if len(key) and m:
        pos = np.minimum(np.searchsorted(key, op_key), len(key) - 1)
        hit = (owner >= 0) & (key[pos] == op_key) & (R.payload[cand[pos]] == owner)
        op_range[hit] = cand[pos[hit]]
    op_call = join_ops_to_calls(trace)
    cross = _cross_thread_untagged(trace, owner, op_call, op_range, r_thread, threads, rows1, idx1)
    graph, has_call = O.graph_node_id >= 0, op_call >= 0
    if has_call.any():
        graph[has_call] |= trace.calls.kind[op_call[has_call]] == CallKind.GRAPH
    op_rule = np.where(op_range >= 0, np.where(graph, Rule.GRAPH, Rule.SAME_THREAD), Rule.NONE).astype(np.int8)
    op_rule[cross] = Rule.CROSS_THREAD
    tagged = int((owner >= 0).sum())
    lost = tagged - int(((op_range >= 0) & (owner >= 0)).sum())
    own_ids = np.flatnonzero(np.asarray(trace.strings, dtype=object) == CALIBRATION_KERNEL)
    ours = int(((owner < 0) & np.isin(O.name_id, own_ids)).sum()) if len(own_ids) else 0
    exact = int(((op_range >= 0) & (owner >= 0)).sum())
    outside = m - exact - len(cross) - lost
    how = trace.meta.get("stage_correlation", "CUPTI external correlation")
    notes.append(f"{m} GPU ops collected in-process: {exact} tied to their stage by the stage id of their launch call "
                 f"({how}, on the launching thread)"
                 + (f", {len(cross)} by rule CROSS_THREAD (launched by a thread that holds no stage, a runtime's worker, "
                    "while a stage of another thread was open)" if len(cross) else "")
                 + f"; {outside} ran outside every stage"
                 + (f" ({ours} of them maxinstr's own GPU-floor calibration kernels)" if ours else ""))  # fmt: skip
    if lost:
        notes.append(f"{lost} GPU ops name a stage record that is not in the trace's ranges (record lost?): not attributed")
    att = Attribution(trace=trace, op_range=op_range, op_rule=op_rule, range_parent=parent,
                      range_depth=depth.astype(np.int16))  # fmt: skip
    _range_sums(att, op_call)
    _range_spans(att)
    att.notes = notes
    if run is not None:
        join_records(att, run)
    return att


def _cross_thread_untagged(trace: Trace, owner: np.ndarray, op_call: np.ndarray, op_range: np.ndarray,
                           r_thread: np.ndarray, threads: np.ndarray, rows1: np.ndarray, idx1: IntervalIndex) -> np.ndarray:
    """In-process ops launched by a thread holding no stage (MAX's worker): CROSS_THREAD; their rows."""
    C = trace.calls
    left = np.flatnonzero((owner < 0) & (op_range < 0) & (op_call >= 0))
    if not len(left) or not len(rows1):
        return np.empty(0, np.int64)
    ci = op_call[left]
    worker = ~np.isin(_thread_key(C.pid[ci], C.tid[ci]), threads) & (C.start_ns[ci] >= 0)
    left, ci = left[worker], ci[worker]
    best = _innermost_elsewhere(trace, idx1, rows1, r_thread, ci, C.pid, C.start_ns, C.end_ns)
    op_range[left] = best
    return left[best >= 0]


def _range_tree(trace: Trace, r_thread: np.ndarray) -> tuple[np.ndarray, np.ndarray, IntervalIndex, np.ndarray]:
    """(same-thread ranges mask, their rows, their index, per range its parent: the innermost same-thread
    range holding it, a mark's the one open around it)."""
    R = trace.ranges
    same_thread = (R.style == RangeStyle.PUSH_POP) | ((R.style == RangeStyle.START_END) & (R.end_tid == R.tid))
    rows1 = np.flatnonzero(same_thread)
    idx1 = IntervalIndex.build(rows1, r_thread[rows1], R.start_ns[rows1], R.end_ns[rows1])
    parent = np.full(len(R), -1, np.int64)
    parent[idx1.rows] = idx1.parents()
    mrows = np.flatnonzero(R.style == RangeStyle.MARK)
    if len(mrows):
        parent[mrows] = idx1.innermost(r_thread[mrows], R.start_ns[mrows], R.start_ns[mrows])
    return same_thread, rows1, idx1, parent


def _innermost_elsewhere(trace: Trace, idx: IntervalIndex, rows: np.ndarray, r_thread: np.ndarray, q: np.ndarray,
                         pid: np.ndarray, start: np.ndarray, end: np.ndarray,
                         thread: np.ndarray | None = None) -> np.ndarray:
    """Per query row ``q``, the latest-starting range of ``idx`` holding it on another thread of its process
    than ``thread`` (when given); -1 none. One pass per thread holding ranges."""
    R, best = trace.ranges, np.full(len(q), -1, np.int64)
    for t in np.unique(r_thread[rows]):
        pid_t = R.pid[rows][r_thread[rows] == t][0]
        sel = np.flatnonzero((pid[q] == pid_t) & (thread[q] != t) if thread is not None else pid[q] == pid_t)
        if len(sel):
            got = idx.innermost(np.full(len(sel), t), start[q[sel]], end[q[sel]])
            best[sel] = _later(R.start_ns, best[sel], got)
    return best


def _thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return (np.asarray(pid, np.int64) << 32) | (np.asarray(tid, np.int64) & 0xFFFFFFFF)


def _thread_ids(threads: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """int32 position of each (pid, tid) in the sorted ``threads`` keys, -1 when absent, block by block."""
    out = np.full(len(pid), -1, np.int32 if len(threads) < (1 << 31) else np.int64)
    for lo in range(0, len(pid) if len(threads) else 0, _CHUNK):
        keys = _thread_key(pid[lo : lo + _CHUNK], tid[lo : lo + _CHUNK])
        pos = np.minimum(np.searchsorted(threads, keys), len(threads) - 1)
        out[lo : lo + _CHUNK] = np.where(threads[pos] == keys, pos, -1)
    return out


def _later(start: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:  # whichever of ranges a, b started later
    sa = np.where(a >= 0, start[np.maximum(a, 0)], np.iinfo(np.int64).min)
    sb = np.where(b >= 0, start[np.maximum(b, 0)], np.iinfo(np.int64).min)
    return np.where(sb > sa, b, a)


def _depth(parent: np.ndarray) -> np.ndarray:
    depth, cur = np.zeros(len(parent), np.int64), parent.copy()
    active = np.flatnonzero(cur >= 0)
    while len(active):  # one pass per nesting level
        depth[active] += 1
        cur[active] = parent[cur[active]]
        active = active[cur[active] >= 0]
    return depth


def _range_sums(att: Attribution, op_call: np.ndarray | list[np.ndarray],
                call_launch: np.ndarray | None = None) -> None:
    """Counts, times, bytes, launches and rules per innermost range, pushed up the tree a level at a time.
    ``op_call`` handed over in a one-element list is freed after the per-op pass; ``call_launch``: the
    range of each launch call that has one (launches counted per call)."""
    if isinstance(op_call, list):
        op_call = op_call.pop()
    trace = att.trace
    O, R = trace.ops, trace.ranges
    n, m = len(R), len(O)
    parent, depth = att.range_parent, att.range_depth.astype(np.int64)
    n_rules = max(int(r) for r in Rule) + 1
    K, C, S = int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET)

    # Launches: each call's first op (found by scattering blocks of ops last to first) counts its call
    # (nsys counts correlation ids); an op with no call is a launch of its own.
    first_op = np.full(len(trace.calls) if call_launch is None else 0, m, np.int64)
    for lo in range(((m - 1) // _CHUNK) * _CHUNK if m and call_launch is None else -1, -1, -_CHUNK):
        oc = op_call[lo : lo + _CHUNK]
        idx = np.arange(lo, lo + len(oc), dtype=np.int64)
        has = oc >= 0
        first_op[oc[has][::-1]] = idx[has][::-1]
    by_kind, ns_kind, bytes_kind = (np.zeros(3 * n, np.float64) for _ in range(3))
    launches, by_rule = np.zeros(n, np.float64), np.zeros(n_rules * n, np.float64)
    owned_count = 0
    for lo in range(0, m, _CHUNK):
        sl = slice(lo, lo + _CHUNK)
        rng = att.op_range[sl]
        ok = np.flatnonzero(rng >= 0)
        if not len(ok):
            continue
        owned_count += len(ok)
        r = rng[ok]
        k3 = r * 3 + O.kind[sl][ok]
        by_kind += np.bincount(k3, minlength=3 * n)
        ns_kind += np.bincount(k3, weights=(O.end_ns[sl][ok] - O.start_ns[sl][ok]).astype(np.float64), minlength=3 * n)
        bytes_kind += np.bincount(k3, weights=O.bytes[sl][ok].astype(np.float64), minlength=3 * n)
        del k3
        oc = op_call[sl][ok]
        has = oc >= 0
        if call_launch is None:
            first = np.ones(len(ok), np.float64)
            first[has] = first_op[oc[has]] == (ok[has] + lo)
            launches += np.bincount(r, weights=first, minlength=n)
            del first
        else:  # an op with no call is a launch of its own (nsys counts correlation ids)
            launches += np.bincount(r[~has], minlength=n)
        by_rule += np.bincount(r * n_rules + att.op_rule[sl][ok], minlength=n_rules * n)
        del r, ok, oc, has
    if call_launch is not None and len(call_launch):
        launches += np.bincount(call_launch, minlength=n)
    del first_op, op_call
    by_kind, ns_kind, bytes_kind = by_kind.reshape(n, 3), ns_kind.reshape(n, 3), bytes_kind.reshape(n, 3)
    by_rule = by_rule.reshape(n, n_rules)
    # One column per total (not an n x 13 matrix: three copies of that cost 300 MB at 1M ranges).
    cols = [by_kind.sum(axis=1), by_kind[:, K], ns_kind[:, K], bytes_kind[:, C], ns_kind[:, C],
            bytes_kind[:, S], ns_kind[:, S], launches, *[by_rule[:, int(r)] for r in Rule if r != Rule.NONE]]  # fmt: skip
    del by_kind, ns_kind, bytes_kind, launches, by_rule
    levels = []
    if n and owned_count:
        levels = [np.flatnonzero((depth == d) & (parent >= 0)) for d in range(int(depth.max()), 0, -1)]
    for i, col in enumerate(cols):
        col = np.ascontiguousarray(col)
        for rows in levels:  # push sums up, deepest level first
            # (no row of a level is another's parent: one bincount adds it; integer sums, exact in float64)
            col += np.bincount(parent[rows], weights=col[rows], minlength=n)
        cols[i] = np.rint(col).astype(np.int64)
        del col
    (att.op_count, att.kernel_count, att.kernel_ns, att.memcpy_bytes, att.memcpy_ns,
     att.memset_bytes, att.memset_ns, att.launch_count) = cols[:8]  # fmt: skip
    bits = np.zeros(n, np.uint8)
    for i, r in enumerate(r for r in Rule if r != Rule.NONE):
        bits |= np.where(cols[8 + i] > 0, np.uint8(1 << int(r)), np.uint8(0))
    att.range_rules = bits


def _where32(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(mask)`` as int32 when it fits, block by block."""
    if len(mask) >= (1 << 31):
        return np.flatnonzero(mask)
    parts = [np.flatnonzero(mask[lo : lo + _CHUNK]).astype(np.int32) + np.int32(lo) for lo in range(0, len(mask), _CHUNK)]
    return np.concatenate(parts) if parts else np.empty(0, np.int32)


def _range_spans(att: Attribution) -> None:
    """Projected GPU span, busy time (a union: it does not add up, so each range sees its whole subtree)
    and idle gaps per range, over (op, ancestor at that level) pairs one level at a time. The largest
    pass on a 10M-op trace: int32 positions, temporaries in blocks, one int64 key array sorted in place."""
    trace = att.trace
    O, R = trace.ops, trace.ranges
    n, m = len(R), len(O)
    att.proj_start_ns = np.full(n, -1, np.int64)
    att.proj_end_ns = np.full(n, -1, np.int64)
    att.busy_ns = np.zeros(n, np.int64)
    owned_any = bool(n) and any(bool((att.op_range[lo : lo + _CHUNK] >= 0).any()) for lo in range(0, m, _CHUNK))
    if owned_any:
        pos_t = np.int32 if m < (1 << 31) else np.int64
        # Owned ops in GPU start order (stable: ties keep op order).
        by_op_start = np.argsort(O.start_ns, kind="stable").astype(pos_t)
        keep = np.empty(m, bool)
        for lo in range(0, m, _CHUNK):
            keep[lo : lo + _CHUNK] = att.op_range[by_op_start[lo : lo + _CHUNK]] >= 0
        op_order = by_op_start[keep] if not keep.all() else by_op_start
        del by_op_start, keep
        # Ranges relabelled by host start (rank) so that, level by level, the ancestor keys
        # come out nearly sorted; row n is a sentinel "no range" (depth -1, its own parent).
        by_start = np.argsort(R.start_ns, kind="stable")
        rng_t = np.int32 if n < (1 << 31) - 1 else np.int64
        rank = np.empty(n + 1, np.int64)
        rank[by_start] = np.arange(n)
        rank[n] = -1
        up_of = np.append(np.where(att.range_parent >= 0, att.range_parent, n), n).astype(rng_t)
        depth_of = np.append(att.range_depth.astype(np.int16), np.int16(-1))
        cur = np.empty(len(op_order), rng_t)
        for lo in range(0, len(op_order), _CHUNK):
            cur[lo : lo + _CHUNK] = att.op_range[op_order[lo : lo + _CHUNK]]
        for level in range(int(depth_of[:n].max()), -1, -1):
            at = _where32(depth_of[cur] == level)
            if not len(at):
                continue
            if len(at) == len(cur):  # every op (level 0, at least): no index needed
                at = None
            # (rank << 32 | position in `at`): sorting these unique values orders by range,
            # then by GPU start (positions follow op_order) -- a stable sort by range, in place.
            packed = rank[cur if at is None else cur[at]]
            packed <<= 32
            for lo in range(0, len(packed), _CHUNK):
                packed[lo : lo + _CHUNK] |= np.arange(lo, min(len(packed), lo + _CHUNK), dtype=np.int64)
            # Unique keys, nearly (nsys exports: exactly) sorted: timsort ("stable") sees that in one pass,
            # where quicksort takes ~70 ms per million.
            packed.sort(kind="stable")
            if level == 0:  # the last level: positions no longer needed
                del cur
            # Bounded temporaries on huge traces: cut the level into chunks of whole ranges.
            a = 0
            while a < len(packed):
                b = min(len(packed), a + _CHUNK)
                if b < len(packed):
                    b = int(np.searchsorted(packed, (packed[b] >> 32) << 32, side="left"))
                    if b <= a:
                        b = int(np.searchsorted(packed, ((packed[a] >> 32) + 1) << 32, side="left"))
                blk = packed[a:b]
                pos = blk & 0xFFFFFFFF
                ops_l = op_order[pos if at is None else at[pos]]
                del pos
                gid, lo, hi, busy = segmented_union(blk >> 32, O.start_ns, O.end_ns, index=ops_l)
                del ops_l, blk
                rows = by_start[gid]
                att.proj_start_ns[rows], att.proj_end_ns[rows], att.busy_ns[rows] = lo, hi, busy
                a = b
            del packed
            if level == 0:
                break
            if at is None:
                np.take(up_of, cur, out=cur)
            else:
                cur[at] = up_of[cur[at]]
            del at
    att.idle_gap_ns = np.where(att.proj_start_ns >= 0, att.proj_end_ns - att.proj_start_ns - att.busy_ns, 0)
    att.range_record_id = np.full(n, -1, np.int64)


__all__ = ["ALL_RULES", "NSYS_RULES", "attribute", "join_ops_to_calls", "JoinMethod"]
