"""Statistics over columns, checked against nsys's own numbers for the same fixtures."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.fixture_columns import nvtx_host_durations, nvtx_sum_csv
from maxinstr.analyze.stats import (
    bootstrap_median_diff_bound,
    cold_start_mask,
    group_medians,
    mad_noise_bound,
    occurrence_index,
    spearman,
    step_trend,
    summarize,
)


@pytest.mark.parametrize("stem", ["h200_decode", "h200_small", "cs336_2_7B_nvtx_nsys2024.6", "cs336_two_threads_nsys2025.1"])
def test_summarize_matches_nsys_nvtx_sum(stem):
    ours = nvtx_host_durations(stem)
    ref = nvtx_sum_csv(stem)
    assert ref, stem
    checked = 0
    for name, row in ref.items():
        if name not in ours:
            continue
        s = summarize(ours[name])
        assert s["n"] == row["Instances"]
        assert s["total"] == row["Total Time (ns)"]
        assert s["min"] == row["Min (ns)"] and s["max"] == row["Max (ns)"]
        assert s["median"] == pytest.approx(row["Med (ns)"], abs=0.5)
        checked += 1
    assert checked >= 1


def test_summarize_drops_missing_and_says_n():
    assert summarize(np.array([-1, -1])) == {"n": 0}
    s = summarize(np.array([5, -1, 7, 9]))
    assert s["n"] == 3 and s["median"] == 7 and s["min"] == 5 and s["max"] == 9
    f = summarize(np.array([0.5, np.nan]))
    assert f["n"] == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 50)), min_size=0, max_size=60))
def test_occurrence_index_counts_earlier_rows_of_same_key(rows):
    keys = np.array([r[0] for r in rows], dtype=np.int64)
    order = np.array([r[1] for r in rows], dtype=np.int64)
    got = occurrence_index(keys, order)
    for i in range(len(rows)):
        # earlier: smaller order, or equal order and earlier position (stable)
        expect = sum(1 for j in range(len(rows)) if keys[j] == keys[i] and (order[j] < order[i] or (order[j] == order[i] and j < i)))
        assert got[i] == expect


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 10_000)), min_size=1, max_size=50))
def test_group_medians_equal_numpy(rows):
    codes = np.array([r[0] for r in rows])
    for dtype in (np.float64, np.int64):  # float: lexsort path; int: packed-key sort path
        values = np.array([r[1] for r in rows], dtype=dtype)
        got = group_medians(codes, values, 4)
        for g in range(4):
            sel = values[codes == g]
            if len(sel):
                assert got[g] == pytest.approx(np.median(sel))
            else:
                assert np.isnan(got[g])


def test_cold_start_on_real_sample_stage():
    # h200_decode's 'sample' stage: nsys reports max 105.65 ms against a 0.31 ms median
    d = nvtx_host_durations("h200_decode")["maxinstr:sample"]
    n = len(d)
    codes = np.zeros(n, np.int64)
    occ = np.arange(n)  # NVTX_EVENTS rows are in start order
    mask, z = cold_start_mask(codes, occ, d, np.ones(n, bool))
    assert mask[0] and d[0] == d.max()
    assert mask.sum() <= 3 and not mask[3:].any()
    assert z[0] > 100


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 1000), st.integers(3, 40))
def test_cold_start_never_fires_on_a_constant_series(value, n):
    v = np.full(n, value, dtype=np.int64)
    mask, _ = cold_start_mask(np.zeros(n, np.int64), np.arange(n), v, np.ones(n, bool))
    assert not mask.any()


def test_cold_start_only_leading_run():
    v = np.array([100, 10, 100, 10, 10, 10, 10, 10], dtype=np.int64)
    mask, _ = cold_start_mask(np.zeros(8, np.int64), np.arange(8), v, np.ones(8, bool))
    assert mask.tolist() == [True] + [False] * 7  # the spike at index 2 is not a first call


def test_step_trend_flat_and_growing_on_real_durations():
    d = nvtx_host_durations("h200_decode")["maxinstr:decode"]
    steps = np.tile(np.arange(24), 3)  # 3 requests of 24 decode steps, in start order
    flat = step_trend(steps, d)
    assert flat["n_steps"] == 24 and flat["n_instances"] == 72
    assert abs(flat["spearman"]) < 0.6
    # the same real durations, sorted to grow with the step index, must read as growth
    grown = step_trend(np.arange(len(d)), np.sort(d))
    assert grown["spearman"] > 0.99 and grown["last_over_first"] > 1.5
    assert step_trend(np.arange(3), np.arange(3)) == {"n_steps": 3}


def test_spearman_ties_and_short():
    assert np.isnan(spearman(np.arange(2), np.arange(2)))
    assert spearman(np.arange(5), np.array([1, 1, 1, 1, 1])) == 0.0
    assert spearman(np.arange(5), -np.arange(5)) == pytest.approx(-1.0)


def test_noise_bounds_from_real_spread():
    d = nvtx_host_durations("h200_decode")["maxinstr:sample"][3:]
    a, b = d[: len(d) // 2], d[len(d) // 2:]
    bound = bootstrap_median_diff_bound(a, b)
    assert 0 < bound < np.median(d)  # halves of one steady stage: a small but non-zero bound
    assert abs(np.median(b) - np.median(a)) <= 2 * bound
    assert np.isnan(bootstrap_median_diff_bound(a[:1], b))
    sa, sb = summarize(a), summarize(b)
    mb = mad_noise_bound(sa, sb)
    assert 0 < mb < np.median(d)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.one_of(st.integers(-3, 10**12), st.floats(-1, 1e9))), max_size=200),
       st.booleans())
def test_group_summaries_are_summarize_per_group(pairs, as_float):
    """The report's per-stage statistics for every stage at once (issue 20: 50,000 stage names
    took 179 s as one summarize call per stage and statistic) are summarize's numbers."""
    from maxinstr.analyze.stats import group_summaries

    codes = np.array([c for c, _ in pairs], dtype=np.int64)
    values = np.array([v for _, v in pairs], dtype=np.float64 if as_float else object)
    if not as_float:
        values = np.array([int(v) for v in values], dtype=np.int64)
    got = group_summaries(codes, values, 7)
    for g in range(7):
        want = summarize(values[codes == g])
        assert got[g].keys() == want.keys()
        for k, w in want.items():
            if k in ("mean", "total") and as_float:  # summed in another order: the last bit may differ
                assert got[g][k] == pytest.approx(w, rel=1e-12, abs=1e-9)
            else:
                assert got[g][k] == w, (g, k)
