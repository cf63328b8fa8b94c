"""Property: any interleaving of enters, exits (in or out of order) and marks on one thread gives
exactly one well-formed record per stage and mark, and leaves the thread's stack clean."""

from __future__ import annotations

from core_helpers import drain_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxinstr.rundir import format as fmt

ops = st.lists(
    st.one_of(
        st.tuples(st.just("enter"), st.integers(0, 3)),
        st.tuples(st.just("exit"), st.integers(0, 50)),
        st.tuples(st.just("mark"), st.integers(0, 3)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops, lifo=st.booleans())
def test_any_interleaving_gives_well_formed_records(n, ops, lifo):
    drain_all(n)  # the fixture runs once for all examples
    open_: list = []
    made = 0
    for op, k in ops:
        if op == "enter":
            s = n.stage(f"s{k}", step=k if k % 2 else None)
            s.__enter__()
            open_.append(s)
            made += 1
        elif op == "exit" and open_:
            s = open_.pop() if lifo else open_.pop(k % len(open_))
            s.__exit__(None, None, None)
        elif op == "mark":
            n.mark(f"m{k}")
            made += 1
    while open_:
        open_.pop().__exit__(None, None, None)
    assert n.stats()["open_stages"] == 0
    with n.stage("probe") as probe:
        pass
    r, _, _ = drain_all(n)
    by = {int(x["id"]): x for x in r}
    assert len(r) == made + 1 and len(by) == len(r)
    assert by[probe.id]["parent_id"] == -1 and by[probe.id]["depth"] == 0
    for x in r:
        assert x["host_start_ns"] <= x["host_end_ns"]
        assert x["flags"] & (fmt.EXCEPTION | fmt.UNCLOSED) == 0
        if x["parent_id"] == -1:
            assert x["depth"] == 0
        else:
            p = by[int(x["parent_id"])]
            assert x["depth"] == p["depth"] + 1
            assert p["host_start_ns"] <= x["host_start_ns"]
            if x["step"] != p["step"]:
                assert x["step"] != -1  # only an explicit step differs from the parent's
            if lifo:
                assert x["host_end_ns"] <= p["host_end_ns"]
