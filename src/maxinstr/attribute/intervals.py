"""Columnar interval machinery for attribution: innermost containing range, segmented unions.

All functions work on whole numpy arrays; the only Python loops run over threads or over
nesting depth, never over trace rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from maxinstr import columns

def dense_index(*keys: np.ndarray) -> tuple[np.ndarray, int]:
    """A dense int64 id per distinct tuple of the given equal-length int64 columns."""
    if not keys or len(keys[0]) == 0:
        return np.empty(0, np.int64), 0
    if len(keys) == 1:
        uniq, inv = np.unique(keys[0], return_inverse=True)
        return inv.astype(np.int64), len(uniq)
    stacked = np.stack([np.asarray(k, np.int64) for k in keys], axis=1)
    uniq, inv = np.unique(stacked, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64), len(uniq)


@dataclass
class IntervalIndex:
    """Intervals grouped by an integer group (a thread), sorted by (group, start, -end).

    ``parent[i]`` (sorted positions) is the nearest earlier interval of the same group whose
    end is >= this one's end: the latest-starting interval containing it (for properly nested
    push/pop ranges, the enclosing range). ``rows`` maps sorted positions to caller rows.
    """

    rows: np.ndarray
    group: np.ndarray
    start: np.ndarray
    end: np.ndarray
    parent: np.ndarray
    group_ids: np.ndarray  # distinct groups present, ascending
    group_lo: np.ndarray  # first sorted position of each of group_ids
    group_hi: np.ndarray  # one past the last
    BLOCK = 1 << 21  # queries per step of innermost() (a class constant, not a field)

    @classmethod
    def build(cls, rows: np.ndarray, group: np.ndarray, start: np.ndarray, end: np.ndarray) -> IntervalIndex:
        order = np.lexsort((-end, start, group))
        g, s, e = group[order], start[order], end[order]
        n = len(order)
        # Previous-greater-or-equal element by pointer jumping: candidates only ever move to
        # elements whose end is smaller than the query's, so none is skipped wrongly.
        cand = np.arange(n, dtype=np.int64) - 1
        if n:
            cand[0] = -1
            cand[np.flatnonzero(np.r_[True, g[1:] != g[:-1]])] = -1
        active = np.flatnonzero(cand >= 0)
        while len(active):
            c = cand[active]
            bad = e[c] < e[active]
            active = active[bad]
            if not len(active):
                break
            cand[active] = cand[cand[active]]
            active = active[cand[active] >= 0]
        group_ids, lo = np.unique(g, return_index=True)
        hi = np.r_[lo[1:], n].astype(np.int64) if len(lo) else np.empty(0, np.int64)
        return cls(rows[order], g, s, e, cand, group_ids, lo.astype(np.int64), hi)

    def innermost(self, q_group: np.ndarray, q_start: np.ndarray, q_end: np.ndarray) -> np.ndarray:
        """Per query, the caller row of the latest-starting interval in ``q_group`` with
        start <= q_start and end >= q_end (bounds inclusive, like nsys); -1 when none.
        Queries are taken in blocks so temporaries stay bounded on huge traces."""
        block = self.BLOCK
        if len(q_group) <= block:
            return self._innermost(q_group, q_start, q_end)
        return np.concatenate([
            self._innermost(q_group[i : i + block], q_start[i : i + block], q_end[i : i + block])
            for i in range(0, len(q_group), block)
        ])  # fmt: skip

    def _innermost(self, q_group: np.ndarray, q_start: np.ndarray, q_end: np.ndarray) -> np.ndarray:
        out_pos = np.full(len(q_group), -1, np.int64)
        if not len(self.rows) or not len(q_group):
            return np.full(len(q_group), -1, np.int64)
        gi = np.searchsorted(self.group_ids, q_group)
        gi_c = np.minimum(gi, len(self.group_ids) - 1)
        has = self.group_ids[gi_c] == q_group
        qs = np.flatnonzero(has)
        if not len(qs):
            return np.full(len(q_group), -1, np.int64)
        # Sort queries by group so each group's search runs over one contiguous slice.
        qs = qs[np.argsort(gi_c[qs], kind="stable")]
        qg = gi_c[qs]
        bounds = np.searchsorted(qg, np.arange(len(self.group_ids) + 1))
        for k in np.flatnonzero(bounds[1:] > bounds[:-1]):  # groups (threads), not rows
            sel = qs[bounds[k] : bounds[k + 1]]
            lo, hi = self.group_lo[k], self.group_hi[k]
            out_pos[sel] = lo + searchsorted(self.start[lo:hi], q_start[sel], side="right") - 1
            out_pos[sel[out_pos[sel] < lo]] = -1
        # Walk up while the candidate ends before the query does (depth-bounded loop).
        active = np.flatnonzero(out_pos >= 0)
        while len(active):
            bad = self.end[out_pos[active]] < q_end[active]
            active = active[bad]
            out_pos[active] = self.parent[out_pos[active]]
            active = active[out_pos[active] >= 0]
        result = np.full(len(q_group), -1, np.int64)
        found = out_pos >= 0
        result[found] = self.rows[out_pos[found]]
        return result

    def parents(self) -> np.ndarray:
        """Caller row of each caller row's parent (-1 for none), aligned with ``rows`` order."""
        par = np.full(len(self.rows), -1, np.int64)
        ok = self.parent >= 0
        par[ok] = self.rows[self.parent[ok]]
        return par


def group_starts(sorted_group: np.ndarray) -> np.ndarray:
    """Positions where a new group begins in a sorted group column."""
    if not len(sorted_group):
        return np.empty(0, np.int64)
    return np.flatnonzero(np.r_[True, sorted_group[1:] != sorted_group[:-1]])


def segmented_union(group: np.ndarray, start: np.ndarray, end: np.ndarray,
                    index: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group of intervals sorted by (group, start): (groups, min start, max end, union length).
    With ``index``, interval i is ``(start[index[i]], end[index[i]])``.

    The native module (``maxinstr._columns.segmented_union``) does it in one pass when built;
    the numpy path below gives the same numbers (tests/attribute/test_intervals.py).

    The union counts overlapping time once (GPU busy time across streams). A segmented running
    maximum is done with one ``np.maximum.accumulate`` by lifting each group into its own band
    of the int64 line; groups are processed in chunks small enough that bands cannot overflow.
    Temporaries are reused in place: this runs over millions of (op, range) pairs.
    """
    n = len(group)
    if not n:
        z = np.empty(0, np.int64)
        return z, z, z, z
    native = columns.function("segmented_union")
    if native is not None:
        return native(group, start, end, None if index is None else np.asarray(index, np.int64))
    if index is not None:
        start, end = start[index], end[index]
    head = np.empty(n, bool)
    head[0] = True
    np.not_equal(group[1:], group[:-1], out=head[1:])
    heads = np.flatnonzero(head)
    seg = np.cumsum(head, dtype=np.int64)
    seg -= 1
    del head
    gid = group[heads]
    first_start = start[heads]
    last_end = np.maximum.reduceat(end, heads)
    span = int((last_end - first_start).max()) + 1
    per_chunk = max(1, (1 << 62) // span)
    fs = first_start[seg]
    run = end - fs  # end relative to the group's first start: >= 0
    for c0 in range(0, len(heads), per_chunk):  # one pass unless spans are huge
        c1 = min(len(heads), c0 + per_chunk)
        lo, hi = heads[c0], (heads[c1] if c1 < len(heads) else n)
        band = seg[lo:hi] - c0
        band *= span
        view = run[lo:hi]
        view += band
        np.maximum.accumulate(view, out=view)
        view -= band
        del band
    run += fs  # running max of end inside the group, absolute
    del fs
    prev = np.empty(n, np.int64)
    prev[1:] = run[:-1]
    del run
    prev[heads] = np.iinfo(np.int64).min // 2
    np.maximum(prev, start, out=prev)
    np.subtract(end, prev, out=prev)
    np.maximum(prev, 0, out=prev)  # time each interval adds beyond those started before it
    union = np.bincount(seg, weights=prev, minlength=len(heads)).astype(np.int64)
    return gid, first_start, last_end, union


def searchsorted(a: np.ndarray, v: np.ndarray, side: Literal["left", "right"] = "left") -> np.ndarray:
    """``np.searchsorted(a, v, side)`` (int64 positions); for int64 columns by the native
    galloping search when built: keys that come nearly sorted (ids, times) cost a few steps."""
    native = columns.function("searchsorted_i64") if len(v) >= 4096 else None
    if native is not None and a.dtype.kind == "i" and v.dtype.kind == "i" and a.itemsize <= 8 and v.itemsize <= 8:
        return native(a, v, side == "right")
    return np.searchsorted(a, v, side=side).astype(np.int64, copy=False)


JOIN_BLOCK = 1 << 21  # left rows per step of correlation_join (bounds its temporaries)


def correlation_join(
    left_pid: np.ndarray, left_corr: np.ndarray, right_pid: np.ndarray, right_corr: np.ndarray,
    right_rank: np.ndarray | None = None,
) -> np.ndarray:
    """Per left row, the right row with the same (pid, correlation id), or -1.

    Where several right rows share a key, the one with the lowest ``right_rank`` (small
    non-negative ints; default all equal) wins, then the first in row order; negative ids
    never match. Correlation ids are small integers in CUDA/HIP traces: when dense enough the
    join is a direct-address table (O(n), no sort); otherwise one stable sort of the right
    keys (skipped when they come sorted, as a trace's calls usually do) and a
    ``searchsorted``. The left side (millions of GPU ops) is taken in blocks and never copied
    or widened as a whole, so beyond the int64 result the temporaries stay small.
    """
    nl = len(left_corr)
    out = np.full(nl, -1, np.int64)
    if not nl or not len(right_corr):
        return out
    right_corr = np.asarray(right_corr)
    right_pid = np.asarray(right_pid)
    rows = None  # right rows that take part (None: all)
    if right_corr.min() < 0:
        rows = np.flatnonzero(right_corr >= 0)
        if not len(rows):
            return out
    rc = np.asarray(right_corr if rows is None else right_corr[rows], np.int64)
    rp = right_pid if rows is None else right_pid[rows]
    lmax = int(np.max(left_corr))
    if lmax < 0:
        return out
    hi = max(lmax, int(rc.max())) + 1
    n_rank = 1
    if right_rank is not None:
        rr = np.asarray(right_rank)
        rr = rr if rows is None else rr[rows]
        n_rank = int(rr.max()) + 1 if len(rr) else 1
    lp_lo, lp_hi = int(np.min(left_pid)), int(np.max(left_pid))
    pids = None  # several processes: keys are (pid rank, id)
    if not (lp_lo == lp_hi == int(rp.min()) == int(rp.max())):
        pids = np.union1d(np.unique(left_pid), np.unique(rp)).astype(np.int64)
    remap = None  # absurd ids (a damaged file): dense ranks of every id first
    if (1 if pids is None else len(pids)) * hi * n_rank >= (1 << 61):
        remap = np.unique(np.concatenate([np.unique(np.asarray(left_corr)[np.asarray(left_corr) >= 0]), rc]))
        rc, hi = np.searchsorted(remap, rc), len(remap)
    if pids is not None:
        rkey = np.searchsorted(pids, np.asarray(rp, np.int64)) * hi + rc
        hi = len(pids) * hi
    else:
        rkey = rc  # one process: the id is the key
    del rc, rp

    def left_key(lo: int, up: int) -> tuple[np.ndarray, np.ndarray]:
        raw = np.asarray(left_corr[lo:up], np.int64)
        bad = raw < 0
        lc = raw if remap is None else np.searchsorted(remap, raw)
        if pids is not None:
            lp = np.asarray(left_pid[lo:up], np.int64)
            at = np.minimum(np.searchsorted(pids, lp), len(pids) - 1)
            lc = at * (hi // len(pids)) + lc
        return np.where(bad, 0, lc), bad

    if hi <= 2 * (nl + len(rkey)) + (1 << 20):  # dense ids: a table (page faults cost more than a search beyond that)
        table = np.full(hi, -1, np.int32 if len(right_corr) < (1 << 31) else np.int64)
        ranks = [None] if n_rank == 1 else list(range(n_rank - 1, -1, -1))  # best rank written last
        for r in ranks:
            sel = np.arange(len(rkey), dtype=np.int64) if r is None else np.flatnonzero(rr == r)
            target = sel if rows is None else rows[sel]
            table[rkey[sel[::-1]]] = target[::-1]  # reversed: with repeated keys the first row wins
            del sel, target
        for lo in range(0, nl, JOIN_BLOCK):
            key, bad = left_key(lo, lo + JOIN_BLOCK)
            found = table[key]
            found[bad] = -1
            out[lo : lo + len(key)] = found
        return out
    # Sort path: keys scaled by the number of ranks so one stable sort orders by (key, rank, row).
    skey = rkey if n_rank == 1 else rkey * n_rank + rr
    del rkey
    if len(skey) < 2 or bool(np.all(skey[1:] >= skey[:-1])):
        row_of = rows  # already sorted: no sort
    else:
        order = np.argsort(skey, kind="stable")
        skey = skey[order]
        row_of = order if rows is None else rows[order]
        del order
    last = len(skey) - 1
    for lo in range(0, nl, JOIN_BLOCK):
        key, bad = left_key(lo, lo + JOIN_BLOCK)
        if n_rank > 1:
            key *= n_rank
        found = searchsorted(skey, key)  # leftmost: the best rank, then first row, of the key
        np.minimum(found, last, out=found)
        if n_rank > 1:
            # key is id * n_rank (rank 0) and skey[found] >= key unless clipped: the same id
            # exactly when the difference is below n_rank (no integer division per op)
            hit = skey[found] - key
            hit = (hit >= 0) & (hit < n_rank)
        else:
            hit = skey[found] == key
        hit &= ~bad
        if row_of is not None:
            found = row_of[found]
        found[~hit] = -1
        out[lo : lo + len(key)] = found
    return out
