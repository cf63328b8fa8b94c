"""Property: whatever tree of stages a program runs inside a session (any nesting, steps,
attrs, marks, exceptions), the run directory read back holds exactly that tree."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maxinstr
from maxinstr.rundir import format as fmt

names = st.sampled_from(["decode", "prefill", "attn", "mlp", "sample", "ünïcode name", "a b"])
node = st.deferred(
    lambda: st.one_of(
        st.tuples(st.just("mark"), names, st.integers(0, 3)),
        st.tuples(
            st.just("stage"),
            names,
            st.one_of(st.none(), st.integers(0, 1000)),
            st.booleans(),  # raise inside
            st.dictionaries(st.sampled_from(["layer", "batch", "tag"]), st.one_of(st.integers(-5, 5), st.text(max_size=4)), max_size=2),
            st.lists(node, max_size=3),
        ),
    )
)


class Boom(Exception):
    pass


def run_tree(stage, mark, nodes, depth, parent, expected):
    for n in nodes:
        if n[0] == "mark":
            mark(n[1], k=n[2])
            expected.append((n[1], depth, parent, fmt.MARK, {"k": n[2]}))
            continue
        _, name, step, boom, attrs, children = n
        index = len(expected)
        expected.append(None)
        flags = 0
        try:
            kwargs = dict(attrs)
            if step is not None:
                kwargs["step"] = step
            with stage(name, **kwargs):
                run_tree(stage, mark, children, depth + 1, index, expected)
                if boom:
                    raise Boom()
        except Boom:
            flags = fmt.EXCEPTION
        expected[index] = (name, depth, parent, flags, attrs)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.lists(node, min_size=1, max_size=4))
def test_run_directory_holds_exactly_the_stage_tree(native, stage, mark, tree):
    with tempfile.TemporaryDirectory() as tmp:
        expected: list = []
        with maxinstr.session(Path(tmp) / "run", sample_hz=0, flush_interval_s=0.01):
            run_tree(stage, mark, tree, 0, -1, expected)
        run = maxinstr.load(Path(tmp) / "run")
        assert run.notes == []
        assert np.all(np.diff(run["host_start_ns"]) >= 0)
        # ids count up in the order the program entered the stages (one thread)
        order = np.argsort(run["id"], kind="stable")
        run.stages = run.stages[order]
        got_names = run.stage_names().tolist()
        assert got_names == [e[0] for e in expected]
        assert run["depth"].tolist() == [e[1] for e in expected]
        assert (run["flags"] & (fmt.EXCEPTION | fmt.MARK)).tolist() == [e[3] for e in expected]
        ids = run["id"]
        parents = [-1 if e[2] < 0 else int(ids[e[2]]) for e in expected]
        assert run["parent_id"].tolist() == parents
        for i, e in enumerate(expected):
            assert run.attrs.get(int(ids[i]), {}) == {k: v for k, v in e[4].items()}
        assert len(np.unique(ids)) == len(ids)
