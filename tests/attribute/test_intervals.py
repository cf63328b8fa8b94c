"""Property tests of the interval helpers against brute force (small random inputs)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")  # in the test extra; the GPU machine may lack it
from hypothesis import given, settings
from hypothesis import strategies as st

from maxinstr import columns
from maxinstr.attribute.intervals import IntervalIndex, segmented_union
from maxinstr.columns import correlation_join

interval = st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(0, 30))


@settings(max_examples=200, deadline=None)
@given(st.lists(interval, max_size=25), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 90), st.integers(0, 5)), max_size=20))
def test_innermost_is_latest_starting_container(ivs, queries):
    g = np.array([i[0] for i in ivs], np.int64)
    s = np.array([i[1] for i in ivs], np.int64)
    e = s + np.array([i[2] for i in ivs], np.int64)
    idx = IntervalIndex.build(np.arange(len(ivs)), g, s, e)
    qg = np.array([q[0] for q in queries], np.int64)
    qs = np.array([q[1] for q in queries], np.int64)
    qe = qs + np.array([q[2] for q in queries], np.int64)
    got = idx.innermost(qg, qs, qe)
    for k in range(len(queries)):
        holders = [i for i in range(len(ivs)) if g[i] == qg[k] and s[i] <= qs[k] and e[i] >= qe[k]]
        if not holders:
            assert got[k] == -1
        else:
            # the latest start; among equal starts, the shortest (tightest)
            best = max(holders, key=lambda i: (s[i], -e[i]))
            assert (s[got[k]], e[got[k]]) == (s[best], e[best])


@settings(max_examples=200, deadline=None)
@given(st.lists(interval, min_size=1, max_size=40))
def test_segmented_union_matches_brute_force(ivs):
    ivs = sorted(ivs, key=lambda t: (t[0], t[1]))
    g = np.array([i[0] for i in ivs], np.int64)
    s = np.array([i[1] for i in ivs], np.int64)
    e = s + np.array([i[2] for i in ivs], np.int64)
    gid, lo, hi, union = segmented_union(g, s, e)
    for k, grp in enumerate(gid):
        cover = set()
        for a, b in zip(s[g == grp], e[g == grp]):
            cover.update(range(int(a), int(b)))
        assert union[k] == len(cover)
        assert lo[k] == s[g == grp].min() and hi[k] == e[g == grp].max()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 12)), max_size=30),
       st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 12)), max_size=30))  # fmt: skip
def test_correlation_join_first_match(left, right):
    lp = np.array([x[0] for x in left], np.int64)
    lc = np.array([x[1] for x in left], np.int64)
    rp = np.array([x[0] for x in right], np.int64)
    rc = np.array([x[1] for x in right], np.int64)
    got = correlation_join(lp, lc, rp, rc)
    for k in range(len(left)):
        want = next((j for j in range(len(right)) if rp[j] == lp[k] and rc[j] == lc[k] and lc[k] >= 0), -1)
        assert got[k] == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 12)), max_size=30),
       st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 12)), max_size=30))  # fmt: skip
def test_correlation_join_sparse_ids_take_the_sort_path(left, right):
    big = 10**12  # too sparse for a direct-address table
    lp = np.array([x[0] for x in left], np.int64)
    lc = np.array([x[1] * big if x[1] >= 0 else -1 for x in left], np.int64)
    rp = np.array([x[0] for x in right], np.int64)
    rc = np.array([x[1] * big if x[1] >= 0 else -1 for x in right], np.int64)
    got = correlation_join(lp, lc, rp, rc)
    for k in range(len(left)):
        want = next((j for j in range(len(right)) if rp[j] == lp[k] and rc[j] == lc[k] and lc[k] >= 0), -1)
        assert got[k] == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 12)), max_size=30),
       st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 12), st.integers(0, 2)), max_size=30),
       st.sampled_from([1, 10**12]), st.sampled_from([3, 1 << 21]))  # fmt: skip
def test_correlation_join_rank_then_row_wins(left, right, scale, block):
    """With ranks (driver rows rank 1 lose to runtime rows rank 0), the lowest rank wins, then
    the first row; on both the table and the sort path, in small and whole blocks, with
    int32 pid columns as the nsys reader gives them."""
    import maxinstr.columns as iv

    lp = np.array([x[0] for x in left], np.int32)
    lc = np.array([x[1] * scale if x[1] >= 0 else -1 for x in left], np.int64)
    rp = np.array([x[0] for x in right], np.int32)
    rc = np.array([x[1] * scale if x[1] >= 0 else -1 for x in right], np.int64)
    rank = np.array([x[2] for x in right], np.uint8)
    old = iv.JOIN_BLOCK
    iv.JOIN_BLOCK = block
    try:
        got = correlation_join(lp, lc, rp, rc, right_rank=rank)
    finally:
        iv.JOIN_BLOCK = old
    for k in range(len(left)):
        cand = [j for j in range(len(right)) if rp[j] == lp[k] and rc[j] == lc[k] and lc[k] >= 0]
        want = min(cand, key=lambda j: (rank[j], j)) if cand else -1
        assert got[k] == want


@pytest.mark.parametrize("seed", range(8))
def test_native_segmented_union_equals_numpy(seed, monkeypatch):
    """The native one-pass union (maxinstr._columns) and the numpy path give the same arrays,
    with and without an index into the columns."""

    if columns.function("segmented_union") is None:
        pytest.skip("maxinstr._columns not built")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 50_000))
    g = np.sort(rng.integers(0, int(rng.integers(1, 3000)), n))
    s = np.sort(rng.integers(-(10**12), 10**12, n))
    s = s[np.lexsort((s, g))] if seed % 2 else np.sort(s)
    e = s + rng.integers(0, 10**9 if seed % 3 else 10**13, n)
    order = np.lexsort((s, g))
    g, s, e = g[order], s[order], e[order]
    perm = rng.permutation(n)
    inv = np.empty(n, np.int64)
    inv[perm] = np.arange(n)
    s_p, e_p = s[perm], e[perm]  # columns in another order; index inv picks row i back
    got = segmented_union(g, s, e)
    got_ix = segmented_union(g, s_p, e_p, index=inv)
    monkeypatch.setitem(columns.FUNCTIONS, "segmented_union", None)
    want = segmented_union(g, s, e)
    want_ix = segmented_union(g, s_p, e_p, index=inv)
    for a, b, c, d in zip(got, want, got_ix, want_ix):
        assert a.dtype == b.dtype == np.int64 and np.array_equal(a, b) and np.array_equal(c, b) and np.array_equal(d, b)


@pytest.mark.parametrize("seed", range(10))
def test_native_searchsorted_equals_numpy(seed):

    native = columns.function("searchsorted_i64")
    if native is None:
        pytest.skip("maxinstr._columns not built")
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(0, 5000)), int(rng.integers(0, 20000))
    a = np.sort(rng.integers(-50, int(rng.choice([60, 10**12])), n))
    v = rng.integers(-80, int(rng.choice([90, 10**12])), m)
    if seed % 3 == 0:
        v = np.sort(v)  # nearly sorted keys: the galloping case
    elif seed % 3 == 1:
        v = np.sort(v)[::-1].copy()
    for side in ("left", "right"):
        assert np.array_equal(native(a, v, side == "right"), np.searchsorted(a, v, side=side))
