"""Columnar interval machinery for attribution: innermost containing range, segmented unions.

All functions work on whole numpy arrays; the only Python loops run over threads or over
nesting depth, never over trace rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    def build(cls, rows: np.ndarray, group: np.ndarray, start: np.ndarray, end: np.ndarray) -> "IntervalIndex":
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
            out_pos[sel] = lo + np.searchsorted(self.start[lo:hi], q_start[sel], side="right") - 1
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


def segmented_union(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group of intervals sorted by (group, start): (groups, min start, max end, union length).

    The union counts overlapping time once (GPU busy time across streams). A segmented running
    maximum is done with one ``np.maximum.accumulate`` by lifting each group into its own band
    of the int64 line; groups are processed in chunks small enough that bands cannot overflow.
    Temporaries are reused in place: this runs over millions of (op, range) pairs.
    """
    n = len(group)
    if not n:
        z = np.empty(0, np.int64)
        return z, z, z, z
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


def correlation_join(
    left_pid: np.ndarray, left_corr: np.ndarray, right_pid: np.ndarray, right_corr: np.ndarray,
    right_order: np.ndarray | None = None,
) -> np.ndarray:
    """Per left row, the right row with the same (pid, correlation id), or -1.

    Where several right rows share a key, the first in ``right_order`` (default: row order)
    wins; negative ids never match. Correlation ids are small integers in CUDA/HIP traces: when
    dense enough the join is a direct-address table (O(n), no sort); otherwise one stable sort
    of the right keys and a ``searchsorted`` (both sides come nearly sorted from a trace, which
    keeps that cheap too).
    """
    left_pid = np.asarray(left_pid, np.int64)
    left_corr = np.asarray(left_corr, np.int64)
    right_pid = np.asarray(right_pid, np.int64)
    right_corr = np.asarray(right_corr, np.int64)
    if not len(left_corr) or not len(right_corr):
        return np.full(len(left_corr), -1, np.int64)
    identity = right_order is None  # right rows in their own order: row == position
    rows = None if identity else np.asarray(right_order, np.int64)
    rc = right_corr if identity else right_corr[rows]
    rp = right_pid if identity else right_pid[rows]
    if rc.min() < 0:
        keep = np.flatnonzero(rc >= 0)
        rows = keep if rows is None else rows[keep]
        rc, rp = rc[keep], rp[keep]
        identity = False
    if not len(rc):
        return np.full(len(left_corr), -1, np.int64)
    lok = left_corr >= 0
    all_ok = bool(lok.all())
    lc = left_corr if all_ok else left_corr[lok]
    lp = left_pid if all_ok else left_pid[lok]
    if not len(lc):
        return np.full(len(left_corr), -1, np.int64)
    hi = int(max(lc.max(), rc.max())) + 1
    if lp.min() == lp.max() == rp.min() == rp.max():
        lkey, rkey = lc, rc  # one process: the id is the key
    else:
        pids = np.unique(np.concatenate([np.unique(lp), np.unique(rp)]))
        if len(pids) * hi >= (1 << 62):  # absurd ids: rank them densely first
            uniq = np.unique(np.concatenate([lc, rc]))
            lc, rc, hi = np.searchsorted(uniq, lc), np.searchsorted(uniq, rc), len(uniq)
        lkey = np.searchsorted(pids, lp) * hi + lc
        rkey = np.searchsorted(pids, rp) * hi + rc
        hi = len(pids) * hi
    if hi <= 2 * (len(lkey) + len(rkey)) + (1 << 20):  # dense ids: a table (page faults cost more than a search beyond that)
        if rows is None:
            rows = np.arange(len(rkey), dtype=np.int64)
        table = np.full(hi, -1, np.int32 if len(right_corr) < (1 << 31) else np.int64)
        table[rkey[::-1]] = rows[::-1]  # reversed: with repeated keys the first row wins
        found = table[lkey].astype(np.int64)
        del table
    else:
        if len(rkey) < 2 or bool(np.all(rkey[1:] >= rkey[:-1])):
            sk, row_of = rkey, (None if identity else rows)  # already sorted: no sort
        else:
            order = np.argsort(rkey, kind="stable")  # stable: the first row of a key stays first
            sk, row_of = rkey[order], (order if rows is None else rows[order])
            del order
        found = np.searchsorted(sk, lkey)  # leftmost: the first row of the key
        np.minimum(found, len(sk) - 1, out=found)
        miss = sk[found] != lkey
        if row_of is not None:
            found = row_of[found]
        found[miss] = -1
    if all_ok:
        return found
    out = np.full(len(left_corr), -1, np.int64)
    out[lok] = found
    return out
