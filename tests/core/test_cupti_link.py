"""The stage core's CUPTI external-correlation hooks (session kernels=True), against a test-only
stand-in libcupti (tests/core/native/fake_cupti.c) that logs every push and pop."""

from __future__ import annotations

import pytest

PRE = """
fk = ctypes.CDLL(LIB, mode=ctypes.RTLD_GLOBAL)   # loaded first: cupti_link only takes a loaded library
def log():
    out = []
    for i in range(fk.fake_cupti_count()):
        v = ctypes.c_int64(0)
        op = fk.fake_cupti_log(i, ctypes.byref(v))
        out.append([op, v.value])
    return out
def drained():
    raw, names, attrs = n.drain()
    return recs(raw)
"""


@pytest.fixture
def run_fake(run_py, cc_lib):
    lib = str(cc_lib("fake_cupti"))
    return lambda code: run_py(f"LIB = {lib!r}\n" + PRE + code)


def test_each_stage_pushes_its_record_id_and_pops_it(run_fake):
    out = run_fake(
        """
import maxinstr
n.drain()
assert n.cupti_link(LIB, 5)
with maxinstr.stage("outer"):
    with maxinstr.stage("inner"):
        pass
    maxinstr.mark("m")                         # marks push nothing
    with maxinstr.stage("inner"):
        pass
n.cupti_link(None)
with maxinstr.stage("after"):                  # off: nothing pushed
    pass
r = drained()
emit(dict(log=log(), ids=r["id"].tolist(), names=[int(x) for x in r["name_id"]], depth=fk.fake_cupti_depth(),
          stats=n.cupti_stats()))
"""
    )
    ids = out["ids"]  # completion order: inner, mark, inner, outer, after
    inner1, _mark, inner2, outer, _after = ids
    assert out["log"] == [[5, outer], [5, inner1], [-5, inner1], [5, inner2], [-5, inner2], [-5, outer]]
    assert out["depth"] == 0
    assert out["stats"]["pushes"] == 3 and out["stats"]["errors"] == 0 and out["stats"]["on"] is False


def test_pop_stays_balanced_when_tagging_stops_inside_a_stage(run_fake):
    out = run_fake(
        """
import maxinstr
assert n.cupti_link(LIB, 3)
s = maxinstr.stage("open_when_stopped")
s.__enter__()
n.cupti_link(None)                     # the session closes while the stage is open
with maxinstr.stage("untagged"):
    pass
s.__exit__(None, None, None)           # still pops the id it pushed
assert n.cupti_link(LIB, 3)
t = maxinstr.stage("opened_before_start")
n.cupti_link(None)
t2 = maxinstr.stage("x")
n.cupti_link(LIB, 3)
t.__enter__(); t.__exit__(None, None, None)
emit(dict(log=log(), depth=fk.fake_cupti_depth(), stats=n.cupti_stats()))
"""
    )
    ops = [op for op, _ in out["log"]]
    assert ops == [3, -3, 3, -3]
    assert out["log"][0][1] == out["log"][1][1]
    assert out["depth"] == 0 and out["stats"]["errors"] == 0


def test_unloaded_library_is_refused(run_py, tmp_path):
    out = run_py(
        f"""
ok = n.cupti_link({str(tmp_path / 'libcupti_missing.so')!r}, 5)
emit(dict(ok=ok, errors=n.stats()["errors"], stats=n.cupti_stats()))
"""
    )
    assert out["ok"] is False and out["stats"]["on"] is False
    assert any("cupti" in e and "not loaded" in e for e in out["errors"])
