"""Stage semantics on the CPU: records, nesting, threads, async, generators, exceptions,
decorators, disabled mode, out-of-order and cross-thread exits, close_open, capacity, fork."""

from __future__ import annotations

import asyncio
import inspect
import os
import threading

import numpy as np
import pytest

import maxinstr
from maxinstr.rundir import format as fmt

from core_helpers import drain_all, records


def test_record_fields_nesting_and_ids(n):
    t0 = n.clock_ns()
    with n.stage("outer", step=7, dtype="bf16") as outer:
        with n.stage("inner") as inner:
            n.mark("tick", k=1)
        with n.stage("inner2", step=9) as inner2:
            pass
    t1 = n.clock_ns()
    r, names, attrs = drain_all(n)
    by_name = {names[int(x["name_id"])]: x for x in r}
    assert set(by_name) == {"outer", "inner", "tick", "inner2"}
    o, i, m, i2 = by_name["outer"], by_name["inner"], by_name["tick"], by_name["inner2"]
    pid = os.getpid()
    assert int(o["id"]) == outer.id and int(i["id"]) == inner.id and int(i2["id"]) == inner2.id
    assert all(int(x["id"]) >> 32 == pid for x in r)
    seqs = sorted(int(x["id"]) & 0xFFFFFFFF for x in r)
    assert seqs == list(range(seqs[0], seqs[0] + 4))  # one seq per record, in enter order
    assert o["parent_id"] == -1 and o["depth"] == 0
    assert i["parent_id"] == o["id"] and i["depth"] == 1
    assert m["parent_id"] == i["id"] and m["depth"] == 2 and m["flags"] == fmt.MARK
    assert (r["flags"] & (fmt.EXCEPTION | fmt.UNCLOSED | fmt.GPU_DROPPED) == 0).all()
    assert m["host_start_ns"] == m["host_end_ns"]
    assert i2["parent_id"] == o["id"]
    # step inherits from the enclosing stage unless given
    assert (o["step"], i["step"], m["step"], i2["step"]) == (7, 7, 7, 9)
    assert t0 <= o["host_start_ns"] <= i["host_start_ns"] <= i["host_end_ns"] <= o["host_end_ns"] <= t1
    assert (r["tid"] == threading.get_native_id()).all()
    assert attrs == {outer.id: {"dtype": "bf16"}, int(m["id"]): {"k": 1}}
    # completion order: inner, tick, inner2, outer
    assert [names[int(x)] for x in r["name_id"]] == ["tick", "inner", "inner2", "outer"]


def test_names_reported_once_and_drain_in_parts(n):
    for _ in range(5):
        with n.stage("a", i=1):
            pass
    n.resolve(block=True)
    raw, names, attrs = n.drain(2)
    assert len(raw) == 2 * 72
    assert len(attrs) == 2
    raw2, names2, attrs2 = n.drain(max_records=-1)
    a_id = int(records(raw)["name_id"][0])
    assert len(raw2) == 3 * 72 and len(attrs2) == 3
    assert names2 == [(a_id, "a")]  # self-contained: the names of the returned records
    assert n.drain() == (b"", [], [])  # nothing new: no names
    assert dict(n.names())[a_id] == "a"
    ids = set(records(raw)["id"]) | set(records(raw2)["id"])
    assert {a for a, _ in attrs + attrs2} == ids


def test_threads_8x10k_no_lost_or_misnested(n):
    per_thread = 5_000  # x2 stages (outer+inner) = 10k records per thread
    barrier = threading.Barrier(8)

    def work(k):
        barrier.wait()
        for j in range(per_thread):
            with n.stage("outer", step=j, thread=k) if j == 0 else n.stage("outer", step=j):
                with n.stage("inner"):
                    pass

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r, names, _ = drain_all(n)
    assert len(r) == 8 * per_thread * 2
    assert len(np.unique(r["id"])) == len(r)
    assert len(np.unique(r["tid"])) == 8
    by_id = {int(x["id"]): x for x in r}
    inner = r[r["name_id"] == [k for k, v in names.items() if v == "inner"][0]]
    for x in inner:
        p = by_id[int(x["parent_id"])]
        assert p["tid"] == x["tid"] and p["depth"] == 0 and x["depth"] == 1 and p["step"] == x["step"]
        assert p["host_start_ns"] <= x["host_start_ns"] <= x["host_end_ns"] <= p["host_end_ns"]
    assert n.stats()["open_stages"] == 0


def test_exception_sets_flag_pops_and_propagates(n):
    with pytest.raises(KeyError):
        with n.stage("outer"):
            with n.stage("boom"):
                raise KeyError("x")
    with n.stage("after"):
        pass
    r, names, _ = drain_all(n)
    f = {names[int(x["name_id"])]: x for x in r}
    assert f["boom"]["flags"] & fmt.EXCEPTION and f["outer"]["flags"] & fmt.EXCEPTION
    assert f["after"]["flags"] & fmt.EXCEPTION == 0 and f["after"]["depth"] == 0 and f["after"]["parent_id"] == -1


def test_decorator_plain_keeps_metadata(n):
    @maxinstr.stage("add", unit="x")
    def add(a: int, b: int = 2) -> int:
        """Adds."""
        return a + b

    assert add(1) == 3 and add(1, b=5) == 6
    assert add.__name__ == "add" and add.__doc__ == "Adds."
    assert inspect.signature(add) == inspect.signature(add.__wrapped__)
    assert list(inspect.signature(add).parameters) == ["a", "b"]
    r, names, attrs = drain_all(n)
    assert len(r) == 2 and {names[int(x)] for x in r["name_id"]} == {"add"}
    assert len(set(r["id"])) == 2  # a fresh stage per call
    assert all(a == {"unit": "x"} for a in attrs.values())


def test_decorator_recursion_nests(n):
    @maxinstr.stage("fact")
    def fact(k):
        return 1 if k <= 1 else k * fact(k - 1)

    assert fact(4) == 24
    r, _, _ = drain_all(n)
    assert sorted(r["depth"].tolist()) == [0, 1, 2, 3]


def test_async_tasks(n):
    @maxinstr.stage("fetch")
    async def fetch(k):
        await asyncio.sleep(0.01)
        return k

    assert inspect.iscoroutinefunction(fetch) and fetch.__name__ == "fetch"

    async def main():
        return await asyncio.gather(*(fetch(k) for k in range(4)))

    assert asyncio.run(main()) == [0, 1, 2, 3]
    r, _, _ = drain_all(n)
    assert len(r) == 4
    assert ((r["host_end_ns"] - r["host_start_ns"]) >= 9_000_000).all()  # each spans its await
    assert n.stats()["open_stages"] == 0
    with n.stage("after") as a:  # interleaved tasks left the thread's stack clean
        pass
    r, _, _ = drain_all(n)
    assert r["parent_id"][0] == -1 and a.id == r["id"][0]


def test_generator_per_resumption_and_abandoned(n):
    @maxinstr.stage("gen")
    def gen(k):
        """Yields."""
        try:
            for i in range(k):
                with n.stage("body"):
                    pass
                yield i
        finally:
            n.mark("cleanup")

    assert inspect.isgeneratorfunction(gen) and gen.__doc__ == "Yields."
    assert list(gen(3)) == [0, 1, 2]
    r, names, _ = drain_all(n)
    g = r[[names[int(x)] == "gen" for x in r["name_id"]]]
    assert len(g) == 4  # 3 yields + the resumption that ends it
    body = r[[names[int(x)] == "body" for x in r["name_id"]]]
    assert set(body["parent_id"]) <= set(g["id"])

    # abandoned half-way: nothing stays open, and the cleanup runs inside a stage
    it = gen(10)
    next(it)
    with n.stage("consumer") as consumer:
        next(it)
    del it
    assert n.stats()["open_stages"] == 0
    r, names, _ = drain_all(n)
    cleanup = r[[names[int(x)] == "cleanup" for x in r["name_id"]]]
    assert len(cleanup) == 1 and cleanup["parent_id"][0] in set(r["id"])
    gens = r[[names[int(x)] == "gen" for x in r["name_id"]]]
    # the generator's second resumption ran inside the consumer's stage, and nests under it
    assert consumer.id in set(gens["parent_id"])


def test_generator_send_and_throw(n):
    @maxinstr.stage("acc")
    def acc():
        total = 0
        while True:
            try:
                total += yield total
            except ValueError:
                total = -100

    it = acc()
    assert next(it) == 0 and it.send(5) == 5 and it.throw(ValueError) == -100
    it.close()
    r, _, _ = drain_all(n)
    assert len(r) >= 3 and n.stats()["open_stages"] == 0


def test_async_generator(n):
    @maxinstr.stage("agen")
    async def agen(k):
        for i in range(k):
            await asyncio.sleep(0)
            yield i

    async def main():
        return [x async for x in agen(3)]

    assert asyncio.run(main()) == [0, 1, 2]
    r, _, _ = drain_all(n)
    assert len(r) == 4 and n.stats()["open_stages"] == 0  # 3 yields + the end

    async def early():
        async for x in agen(10):
            if x == 1:
                break  # abandoned: the body's cleanup runs in one more stage

    asyncio.run(early())
    r, _, _ = drain_all(n)
    assert n.stats()["open_stages"] == 0 and 2 <= len(r) <= 3


def test_disabled_mode(n):
    n.set_enabled(False)
    assert not maxinstr.is_enabled()
    s = n.stage("x", step=1)
    assert s is n.NOOP
    with s as v:
        assert v is n.NOOP
    n.mark("m")

    def f():
        return 1

    assert n.stage("deco")(f) is f  # decorated while disabled: the function itself
    n.set_enabled(True)
    raw, _, _ = n.drain()
    assert raw == b""


def test_disable_env_var(run_py):
    out = run_py(
        """
        s = n.stage("x")
        emit([n.is_enabled(), s is n.NOOP])
        """,
        MAXINSTR_DISABLE="1",
    )
    assert out == [False, True]


def test_out_of_order_exit_keeps_records_and_nesting(n):
    a = n.stage("a")
    b = n.stage("b")
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)  # outer closes first
    with n.stage("c") as c:  # opened while b is the innermost open stage
        pass
    b.__exit__(None, None, None)
    with n.stage("d") as d:
        pass
    r, _, _ = drain_all(n)
    by = {int(x["id"]): x for x in r}
    assert by[c.id]["parent_id"] == b.id and by[b.id]["parent_id"] == a.id
    assert by[a.id]["host_end_ns"] <= by[b.id]["host_end_ns"]
    assert by[d.id]["parent_id"] == -1 and by[d.id]["depth"] == 0
    assert n.stats()["open_stages"] == 0


def test_exit_on_another_thread(n):
    s = n.stage("handoff")
    s.__enter__()
    done = threading.Event()

    def other():
        s.__exit__(None, None, None)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert done.is_set()
    with n.stage("next") as nxt:
        pass
    r, _, _ = drain_all(n)
    by = {int(x["id"]): x for x in r}
    assert by[s.id]["tid"] == threading.get_native_id()  # tid of the entering thread
    assert by[nxt.id]["parent_id"] == -1
    assert n.stats()["open_stages"] == 0


def test_reenter_open_stage_raises(n):
    s = n.stage("x")
    with s:
        with pytest.raises(RuntimeError):
            s.__enter__()
    with s:  # re-use after exit gives a new record
        pass
    r, _, _ = drain_all(n)
    assert len(r) == 2 and len(set(r["id"])) == 2


def test_close_open_marks_unclosed(n):
    s = n.stage("left", k=1)
    s.__enter__()
    inner = n.stage("inner")
    inner.__enter__()
    got = {}

    def other():
        x = n.stage("other-thread")
        x.__enter__()
        got["id"] = x.id
        got["obj"] = x

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert n.stats()["open_stages"] == 3
    assert n.close_open("session closed") == 3
    assert n.stats()["open_stages"] == 0
    s.__exit__(None, None, None)  # no-op now
    r, names, attrs = drain_all(n)
    assert len(r) == 3 and (r["flags"] & fmt.UNCLOSED).all()
    assert attrs[s.id] == {"k": 1, "unclosed": "session closed"}
    assert attrs[got["id"]] == {"unclosed": "session closed"}
    assert len(set(r["host_end_ns"])) == 1


def test_capacity_drops_and_counts(n):
    before = n.stats()["dropped_records"]
    n.set_capacity(10)
    for _ in range(25):
        with n.stage("x"):
            pass
    r, _, _ = drain_all(n)
    assert len(r) == 10
    assert n.stats()["dropped_records"] - before == 15


def test_bad_arguments(n):
    with pytest.raises(TypeError):
        n.stage(3)
    with pytest.raises(TypeError):
        n.stage("x", stream="s")
    with pytest.raises(ValueError):
        n.stage("x", step=-2)
    with pytest.raises(TypeError):
        n.stage()
    with pytest.raises(TypeError):
        n.drain(maxrecords=3)
    with pytest.raises(TypeError):
        n.close_open(3)
    assert n.resolve(block=False) == 0 and n.close_open(reason="x") == 0

    class Torchish:
        cuda_stream = 1234

    assert n.stage("x", stream=Torchish())._spec()[1]["stream"] == 1234


def test_stats_shape(n):
    st = n.stats()
    for k in ("records", "dropped_records", "open_stages", "events_in_flight", "events_dropped", "event_pool_size"):
        assert isinstance(st[k], int)
    assert st["gpu_backend"] in ("cuda", "hip", "none") and st["markers"] in ("nvtx", "roctx", "none")
    assert isinstance(st["errors"], list)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_resets(n):
    parent_open = n.stage("parent-open")
    parent_open.__enter__()
    with n.stage("parent-done"):
        pass  # pending in the parent, must not show in the child
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(rfd)
            with n.stage("child") as c:
                pass
            raw, names, _ = n.drain()
            rec = records(raw)
            parent_open.__exit__(None, None, None)  # inherited object: inert in the child
            msg = f"{len(rec)} {int(rec['id'][0]) >> 32} {int(rec['id'][0]) & 0xFFFFFFFF} {rec['depth'][0]} {rec['parent_id'][0]} {c.id == int(rec['id'][0])} { {'parent-open', 'parent-done', 'child'} <= {s for _, s in names} } {n.stats()['open_stages']}"
            os.write(wfd, msg.encode())
        finally:
            os._exit(0)
    os.close(wfd)
    out = os.read(rfd, 1000).decode().split()
    os.waitpid(pid, 0)
    assert out == ["1", str(pid), "1", "0", "-1", "True", "True", "0"]
    parent_open.__exit__(None, None, None)
    r, _, _ = drain_all(n)
    assert len(r) == 2 and (r["id"] >> 32 == os.getpid()).all()


def test_exited_threads_are_freed(n):
    def work():
        with n.stage("short-lived"):
            pass

    for _ in range(50):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    drain_all(n)  # the sweep runs at drain
    assert n.stats()["threads"] <= 3  # this thread (+ at most a live helper), not 50
