"""A stage's ``share_of_top`` is a share of the steady top-level time: never above 1.

Before, the numerator was every steady instance of the stage while the denominator was the
steady top-level instances only; a child whose parents were mostly warm-up (its own instances
steady) reached 50x on the H200 KV-cache capture (3 requests, warmup=2: the first request, 12 s
with compilation, held 11 s of "steady" decode steps; the one steady request lasts 0.23 s).
Now the numerator counts only the stage's steady instances inside steady top-level instances.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from maxinstr.analyze import instances as inst_mod
from maxinstr.analyze.stage_table import stage_rows


def _share(rows, name):
    return next(r for r in rows if r["name"] == name)["share_of_top"]


def _hand_share(inst, key: str) -> float:
    """The definition, one instance at a time: steady instances of ``key`` whose top-level
    ancestor is steady (and that have no ancestor of the same key), over the steady top-level time."""
    steady, host, parent = inst.steady, inst.host_ns, inst.parent
    top = sum(int(host[i]) for i in range(len(inst)) if parent[i] < 0 and steady[i])
    num = 0
    for i in range(len(inst)):
        if inst.key[i] != key or not steady[i]:
            continue
        a, same = i, False
        while parent[a] >= 0:
            a = int(parent[a])
            same |= inst.key[a] == key
        if steady[a] and not same:
            num += int(host[i])
    return num / top


def test_h200_kvcache_decode_share_is_within_its_steady_request(joined):
    """The real capture that showed the bug: decode's share was 50.8 (and 36.8 on h200_reprefill)."""
    from maxinstr.analyze.report import analyze
    from helpers.fixture_columns import DATA

    for name in ("h200_kvcache", "h200_reprefill"):
        r = joined(name)
        stages = {s["name"]: s for s in r["stages"]}
        assert set(stages) == {"request", "prefill", "sample", "decode"}
        for s in stages.values():
            assert 0.0 <= s["share_of_top"] <= 1.0, (name, s["name"], s["share_of_top"])
        assert stages["request"]["share_of_top"] == 1.0  # the only top-level stage
        # request's children run one after another on one thread: together at most all of it
        assert sum(stages[c]["share_of_top"] for c in ("prefill", "sample", "decode")) <= 1.0
        assert stages["decode"]["share_of_top"] > 0.5  # decode is most of a request
        inst = analyze(run=DATA / "nsys" / f"{name}-run", trace=DATA / "nsys" / f"{name}.sqlite").instances
        for key in stages:
            assert abs(stages[key]["share_of_top"] - _hand_share(inst, key)) < 1e-12, (name, key)


def _instances(names, spans, parent, warmup_n=0):
    """A stage-instance table from a run without a trace: names, host spans, parent rows."""
    n = len(names)
    no_values = {f.name: np.full(n, -1, np.int64) for f in fields(inst_mod.StageInstances)
                 if f.type in ("np.ndarray",) and f.default_factory().dtype == np.int64}
    inst = inst_mod.StageInstances(**no_values)
    inst.name = np.asarray(names, dtype=object)
    inst.host_start_ns = np.array([s for s, _ in spans], np.int64)
    inst.host_end_ns = np.array([e for _, e in spans], np.int64)
    inst.parent = np.asarray(parent, np.int64)
    inst.part = np.zeros(n, np.int64)
    inst.is_mark, inst.step_marked, inst.exception = (np.zeros(n, bool) for _ in range(3))
    return inst_mod._finish(inst, warmup_n, detect_cold=False)


def test_child_of_warmup_parents_by_hand():
    """3 requests, warmup=2: request 0 (100 ns, 9 steps of 10: the first two are warm-up) and
    request 1 (50 ns, 4 steps) are warm-up, request 2 (50 ns, 4 steps of 10) is steady. Before:
    steps 7*10 + 40 + 40 = 150 over 50 = 3.0. Now: 40 / 50."""
    names, spans, parent = [], [], []

    def request(start, end, n_steps):
        names.append("request"), spans.append((start, end)), parent.append(-1)
        p = len(names) - 1
        for k in range(n_steps):
            names.append("step"), spans.append((start + 10 * k, start + 10 * k + 10)), parent.append(p)

    request(0, 100, 9)
    request(100, 150, 4)
    request(150, 200, 4)
    inst = _instances(names, spans, parent, warmup_n=2)
    assert inst.steady.tolist()[:3] == [False, False, False]  # request 0 and its first 2 steps
    rows = stage_rows(inst, None, {}, {})
    assert _share(rows, "request") == 1.0
    assert _share(rows, "step") == 40 / 50


def test_recursion_is_not_counted_twice():
    """f calls f: the inner f is its own stage ('f/f'), its time a share of the top level like any
    other (within the outer f's, which already holds it)."""
    inst = _instances(["main", "f", "f", "g"], [(0, 100), (0, 80), (10, 60), (80, 100)], [-1, 0, 1, 0])
    rows = stage_rows(inst, None, {}, {})
    assert {r["name"]: r["share_of_top"] for r in rows} == {"main": 1.0, "main/f": 0.8, "f/f": 0.5, "g": 0.2}


@st.composite
def _trees(draw):
    """Random nesting trees on one thread: children laid out one after another inside their
    parent with random gaps; names from a small alphabet (so names repeat and recurse)."""
    n = draw(st.integers(1, 40))
    parent = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n)]
    names = [draw(st.sampled_from("abcd")) for _ in range(n)]
    own = [draw(st.integers(0, 50)) for _ in range(n)]
    children = [[c for c in range(n) if parent[c] == i] for i in range(n)]
    dur = [0] * n
    for i in reversed(range(n)):  # children have larger indexes than their parent
        dur[i] = own[i] + sum(dur[c] for c in children[i])
    start = [0] * n
    t = 0
    for i in range(n):
        if parent[i] < 0:
            start[i] = t
            t += dur[i] + draw(st.integers(0, 20))
        cur = start[i] + own[i] // 2
        for c in children[i]:
            start[c] = cur
            cur += dur[c]
    spans = [(start[i], start[i] + dur[i]) for i in range(n)]
    warm = [draw(st.booleans()) for _ in range(n)]
    cold = [draw(st.booleans()) for _ in range(n)]
    return names, spans, parent, warm, cold


@settings(max_examples=150, deadline=None)
@given(_trees())
def test_share_of_top_is_a_share_for_random_trees(tree):
    names, spans, parent, warm, cold = tree
    inst = _instances(names, spans, parent)
    inst.warmup, inst.cold = np.array(warm), np.array(cold)
    rows = stage_rows(inst, None, {}, {})
    top_steady = inst.host_ns[inst.steady & (inst.parent < 0)].sum()
    for r in rows:
        if top_steady <= 0:
            assert r["share_of_top"] is None
            continue
        assert 0.0 <= r["share_of_top"] <= 1.0, r
        assert abs(r["share_of_top"] - _hand_share(inst, r["name"])) < 1e-12
    if top_steady > 0:  # the top-level stages share the top-level time out between them
        assert abs(sum(r["share_of_top"] for r in rows if r["depth"] == 0) - 1.0) < 1e-9


def test_concurrent_children_are_at_most_all_of_the_time():
    """Two instances of one stage under one parent that overlap (parent links across threads):
    160 ns of host time in a 100 ns parent is still a share of 1, not 1.6."""
    inst = _instances(["main", "c", "c", "d"], [(0, 100), (0, 80), (10, 90), (90, 95)], [-1, 0, 0, 0])
    rows = stage_rows(inst, None, {}, {})
    assert {r["name"]: r["share_of_top"] for r in rows} == {"main": 1.0, "c": 1.0, "d": 0.05}
