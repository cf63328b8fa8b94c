"""NVTX and roctx emission, observed through test-only libraries (not assumed)."""

from __future__ import annotations

from pathlib import Path


def _lines(path: Path) -> list[list[str]]:
    return [ln.split(" ") for ln in path.read_text().splitlines()]


SCRIPT = """
import threading
with n.stage("outer", step=1) as a:
    with n.stage("inner") as b:
        pass
    n.mark("tick")
with n.stage("outer") as c:   # the registered string is reused, not registered again
    pass
tids = []
def other():
    with n.stage("worker") as w:
        tids.append((threading.get_native_id(), w.id))
t = threading.Thread(target=other); t.start(); t.join()
raw, names, _ = n.drain()
r = recs(raw)
emit({"ids": {"a": a.id, "b": b.id, "c": c.id, "w": tids[0][1]}, "tid": threading.get_native_id(),
      "wtid": tids[0][0], "mark": int(r[(r["flags"] & 4) != 0]["id"][0]), "stats": n.stats()})
"""


def test_nvtx_exact_sequence_with_payload_ids(run_py, cc_lib, tmp_path):
    log = tmp_path / "nvtx.log"
    out = run_py(SCRIPT, NVTX_INJECTION64_PATH=str(cc_lib("nvtx_inject")), MAXINSTR_TEST_NVTX_LOG=str(log))
    ids, tid, wtid = out["ids"], str(out["tid"]), str(out["wtid"])
    assert out["stats"]["markers"] == "nvtx"
    INT64 = "2"  # NVTX_PAYLOAD_TYPE_INT64
    assert _lines(log) == [
        ["init"],
        ["domain", "maxinstr"],
        ["register", "maxinstr", "outer"],
        ["push", tid, "maxinstr", "outer", INT64, str(ids["a"])],
        ["register", "maxinstr", "inner"],
        ["push", tid, "maxinstr", "inner", INT64, str(ids["b"])],
        ["pop", tid, "maxinstr"],
        ["register", "maxinstr", "tick"],
        ["mark", tid, "maxinstr", "tick", INT64, str(out["mark"])],
        ["pop", tid, "maxinstr"],
        ["push", tid, "maxinstr", "outer", INT64, str(ids["c"])],
        ["pop", tid, "maxinstr"],
        ["register", "maxinstr", "worker"],
        ["push", wtid, "maxinstr", "worker", INT64, str(ids["w"])],
        ["pop", wtid, "maxinstr"],
    ]


def test_nvtx_out_of_order_exit_keeps_ranges_nested(run_py, cc_lib, tmp_path):
    log = tmp_path / "nvtx.log"
    out = run_py(
        """
        a = n.stage("a"); b = n.stage("b")
        a.__enter__(); b.__enter__()
        a.__exit__(None, None, None)   # record of a ends now; its range waits for b's
        b.__exit__(None, None, None)
        emit([a.id, b.id])
        """,
        NVTX_INJECTION64_PATH=str(cc_lib("nvtx_inject")),
        MAXINSTR_TEST_NVTX_LOG=str(log),
    )
    ev = [(x[0], x[-1]) for x in _lines(log) if x[0] in ("push", "pop")]
    assert [e[0] for e in ev] == ["push", "push", "pop", "pop"]
    assert [int(ev[0][1]), int(ev[1][1])] == out


def test_nvtx_exception_pops(run_py, cc_lib, tmp_path):
    log = tmp_path / "nvtx.log"
    run_py(
        """
        try:
            with n.stage("x"):
                with n.stage("y"):
                    raise ValueError
        except ValueError:
            pass
        emit(1)
        """,
        NVTX_INJECTION64_PATH=str(cc_lib("nvtx_inject")),
        MAXINSTR_TEST_NVTX_LOG=str(log),
    )
    assert [x[0] for x in _lines(log) if x[0] in ("push", "pop")] == ["push", "push", "pop", "pop"]


def test_markers_none(run_py, cc_lib, tmp_path):
    log = tmp_path / "nvtx.log"
    out = run_py(
        """
        with n.stage("x"):
            pass
        emit(n.stats()["markers"])
        """,
        NVTX_INJECTION64_PATH=str(cc_lib("nvtx_inject")),
        MAXINSTR_TEST_NVTX_LOG=str(log),
        MAXINSTR_MARKERS="none",
    )
    assert out == "none" and not log.exists()


def test_roctx_exact_sequence(run_py, cc_lib, tmp_path):
    log = tmp_path / "roctx.log"
    out = run_py(
        SCRIPT + "\nemit(dict(out_prev=None, prof=[n.profiler_start(), n.profiler_stop()], markers=n.stats()['markers']))\n",
        MAXINSTR_ROCTX_LIBRARY=str(cc_lib("fake_roctx")),
        MAXINSTR_TEST_ROCTX_LOG=str(log),
    )
    assert out["markers"] == "roctx" and out["prof"] == [True, True]
    lines = _lines(log)
    tid_lines = [x for x in lines if x[0] in ("push", "pop", "mark")]
    # roctx has no payload: a range joins its record by (tid, name, order), see docs/formats.md
    assert [(x[0], x[2] if len(x) > 2 else None) for x in tid_lines] == [
        ("push", "outer"), ("push", "inner"), ("pop", None), ("mark", "tick"), ("pop", None),
        ("push", "outer"), ("pop", None), ("push", "worker"), ("pop", None),
    ]
    assert len({x[1] for x in tid_lines}) == 2  # main thread + worker thread
    assert ["resume", "0"] in lines and ["pause", "0"] in lines


def test_roctx_missing_library_falls_back_to_nvtx(run_py, tmp_path):
    out = run_py(
        """
        with n.stage("x"):
            pass
        s = n.stats()
        emit([s["markers"], s["errors"]])
        """,
        MAXINSTR_ROCTX_LIBRARY=str(tmp_path / "nope.so"),
    )
    assert out[0] == "nvtx" and any("roctx" in e for e in out[1])


def test_nvtx_balanced_under_random_out_of_order_exits(run_py, cc_lib, tmp_path):
    log = tmp_path / "nvtx.log"
    out = run_py(
        """
        import random
        rng = random.Random(7)
        open_, ids = [], []
        for i in range(400):
            if open_ and rng.random() < 0.5:
                open_.pop(rng.randrange(len(open_))).__exit__(None, None, None)
            else:
                s = n.stage(f"s{i % 5}"); s.__enter__(); open_.append(s); ids.append(s.id)
        while open_:
            open_.pop(rng.randrange(len(open_))).__exit__(None, None, None)
        with n.stage("last") as last:
            pass
        emit([ids + [last.id], n.stats()["open_stages"]])
        """,
        NVTX_INJECTION64_PATH=str(cc_lib("nvtx_inject")),
        MAXINSTR_TEST_NVTX_LOG=str(log),
    )
    ids, open_stages = out
    lines = [x for x in _lines(log) if x[0] in ("push", "pop")]
    depth, min_depth = 0, 0
    for x in lines:
        depth += 1 if x[0] == "push" else -1
        min_depth = min(min_depth, depth)
    assert depth == 0 and min_depth == 0  # never popped more than pushed, balanced at the end
    assert [int(x[-1]) for x in lines if x[0] == "push"] == ids  # one push per stage, in enter order
    assert lines[-2:] == [["push", lines[-1][1], "maxinstr", "last", "2", str(ids[-1])], ["pop", lines[-1][1], "maxinstr"]]
    assert open_stages == 0
