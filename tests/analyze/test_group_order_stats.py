"""``maxinstr._columns.group_order_stats`` (per-group median and max in O(n)) gives the numbers of
the sort-based numpy path of ``kernels.group_stats``, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from maxinstr import columns
from maxinstr.analyze import kernels

NATIVE = columns.function("group_order_stats")


@pytest.mark.skipif(NATIVE is None, reason="maxinstr._columns not built")
@pytest.mark.parametrize("seed", range(12))
def test_native_group_stats_equal_numpy(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n, g = int(rng.integers(0, 20_000)), int(rng.integers(1, 2_000))
    codes = rng.integers(0, g, n) if seed % 3 else np.sort(rng.integers(0, g, n))
    values = rng.integers(0, int(rng.choice([2, 1000, 1 << 33, 1 << 61])), n)
    got = kernels.group_stats(codes, values, g)
    monkeypatch.setitem(columns.FUNCTIONS, "group_order_stats", None)  # the numpy path
    want = kernels.group_stats(codes, values, g)
    for key in want:
        assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key], equal_nan=True), key


@pytest.mark.skipif(NATIVE is None, reason="maxinstr._columns not built")
def test_codes_outside_the_groups_are_refused():
    with pytest.raises(RuntimeError, match="outside"):
        NATIVE(np.array([0, 3]), np.array([1, 2]), 3)
    med, mx = NATIVE(np.array([1, 1, 1, 1]), np.array([4, 1, 3, 2]), 3)
    assert np.isnan(med[0]) and med[1] == 2.5 and mx.tolist() == [0.0, 4.0, 0.0]


@pytest.mark.skipif(NATIVE is None, reason="maxinstr._columns not built")
@pytest.mark.parametrize("seed", range(12))
def test_native_group_medians_equal_the_sort(seed, monkeypatch):
    from maxinstr.analyze import stats

    rng = np.random.default_rng(100 + seed)
    n, g = int(rng.integers(0, 20_000)), int(rng.integers(1, 2_000))
    codes = rng.integers(0, g, n)
    kind = seed % 4
    values = (rng.integers(0, 1 << 40, n) if kind == 0 else rng.integers(0, 5, n) if kind == 1
              else rng.random(n) * 1e9 if kind == 2 else np.round(rng.normal(0, 3, n), 1))
    got = stats.group_medians(codes, values, g)
    monkeypatch.setitem(columns.FUNCTIONS, "group_medians_f64", None)  # the sort
    want = stats.group_medians(codes, values, g)
    assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


@pytest.mark.skipif(NATIVE is None, reason="maxinstr._columns not built")
def test_native_medians_decline_nan_and_negative_zero():
    f = columns.function("group_medians_f64")
    assert f(np.array([0, 0]), np.array([1.0, np.nan]), 1) is None
    assert f(np.array([0, 0]), np.array([-0.0, 0.0]), 1) is None
    assert f(np.array([0, 0, 1]), np.array([1.0, 2.0, 3.0]), 3).tolist()[:2] == [1.5, 3.0]


@pytest.mark.skipif(NATIVE is None, reason="maxinstr._columns not built")
@pytest.mark.parametrize("seed", range(8))
def test_native_group_summaries_equal_the_sorts(seed, monkeypatch):
    from maxinstr.analyze import stats

    rng = np.random.default_rng(200 + seed)
    n, g = int(rng.integers(0, 30_000)), int(rng.integers(1, 500))
    codes = rng.integers(0, g, n)
    values = rng.integers(-5, 1 << 35, n) if seed % 2 else np.where(rng.random(n) < 0.1, np.nan, rng.random(n) * 1e6)
    got = stats.group_summaries(codes, values, g)
    monkeypatch.setitem(columns.FUNCTIONS, "group_sort_f64", None)
    monkeypatch.setitem(columns.FUNCTIONS, "group_medians_f64", None)
    assert stats.group_summaries(codes, values, g) == got


@pytest.mark.skipif(NATIVE is None, reason="maxinstr._columns not built")
@pytest.mark.parametrize("seed", range(8))
def test_native_occurrence_index_equals_the_sort(seed, monkeypatch):
    from maxinstr.analyze import stats

    rng = np.random.default_rng(300 + seed)
    n = int(rng.integers(0, 20_000))
    keys = rng.integers(0, int(rng.choice([3, 500, 1 << 40])), n) - (1 << 20) * (seed % 2)
    order = rng.integers(0, int(rng.choice([5, 1 << 50])), n)  # many ties when small
    got = stats.occurrence_index(keys, order)
    monkeypatch.setitem(columns.FUNCTIONS, "running_counts", None)
    want = stats.occurrence_index(keys, order)
    assert got.dtype == want.dtype and np.array_equal(got, want)
