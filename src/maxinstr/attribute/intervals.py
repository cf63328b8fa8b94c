"""Columnar intervals for attribution (innermost containing range, segmented unions): Python loops run over
threads or nesting depth, never over trace rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from maxinstr import columns
from maxinstr.columns import searchsorted


@dataclass
class IntervalIndex:
    """Intervals grouped by an integer group (a thread), sorted by (group, start, -end). ``parent[i]`` (in
    sorted positions): the latest-starting earlier interval of its group containing it; ``rows``: caller rows."""

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
        # previous-greater-or-equal by pointer jumping: a candidate moves only past ends smaller than its own
        cand = np.arange(n, dtype=np.int64) - 1
        if n:
            cand[0] = -1
            cand[np.flatnonzero(np.r_[True, g[1:] != g[:-1]])] = -1
        active = np.flatnonzero(cand >= 0)
        while len(active):
            c = cand[active]
            active = active[e[c] < e[active]]
            cand[active] = cand[cand[active]]
            active = active[cand[active] >= 0]
        group_ids, lo = np.unique(g, return_index=True)
        hi = np.r_[lo[1:], n].astype(np.int64) if len(lo) else np.empty(0, np.int64)
        return cls(rows[order], g, s, e, cand, group_ids, lo.astype(np.int64), hi)

    def innermost(self, q_group: np.ndarray, q_start: np.ndarray, q_end: np.ndarray) -> np.ndarray:
        """Per query, the caller row of the latest-starting interval in ``q_group`` holding [q_start, q_end]
        (bounds inclusive, like nsys); -1 none. In blocks: bounded temporaries on huge traces."""
        b = self.BLOCK
        if len(q_group) <= b:
            return self._innermost(q_group, q_start, q_end)
        return np.concatenate([self._innermost(q_group[i : i + b], q_start[i : i + b], q_end[i : i + b])
                               for i in range(0, len(q_group), b)])

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
        qs = qs[np.argsort(gi_c[qs], kind="stable")]  # by group: each group's search over one slice
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
        return self._rows_of(out_pos)

    def parents(self) -> np.ndarray:  # caller row of each caller row's parent (-1 none), in ``rows`` order
        return self._rows_of(self.parent)

    def _rows_of(self, pos: np.ndarray) -> np.ndarray:  # caller rows of sorted positions (-1 stays -1)
        out = np.full(len(pos), -1, np.int64)
        out[pos >= 0] = self.rows[pos[pos >= 0]]
        return out


def segmented_union(group: np.ndarray, start: np.ndarray, end: np.ndarray,
                    index: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group of intervals sorted by (group, start): (groups, min start, max end, union length, overlaps
    once); with ``index``, interval i is ``(start[index[i]], end[index[i]])``. Native when built; else one
    ``np.maximum.accumulate`` over groups lifted into bands of the int64 line (the same numbers)."""
    if not (n := len(group)):
        z = np.empty(0, np.int64)
        return z, z, z, z
    if (native := columns.function("segmented_union")) is not None:
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
    gid, first_start, last_end = group[heads], start[heads], np.maximum.reduceat(end, heads)
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
