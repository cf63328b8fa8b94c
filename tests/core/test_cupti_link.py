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


def test_launch_tags_carry_the_innermost_stage_of_the_calling_thread(run_fake):
    """cupti_tags (kernels=True's stage of each launch): only the functions enabled call back;
    one tag per outermost call, with CUPTI's correlation id, the innermost open stage of the
    thread making the call and the id of the driver call a runtime launch makes inside itself;
    another thread's calls carry its own stage; None unsubscribes."""
    out = run_fake(
        """
import threading
import maxinstr
t0 = n.clock_ns()
assert n.cupti_tags(LIB, [211], [307])            # runtime cudaLaunchKernel-like, driver cuLaunchKernel-like
assert n.cupti_tags(LIB, [211], [307])            # a second call keeps the one subscription
fk.fake_cupti_call(2, 211, 1)                      # outside any stage
with maxinstr.stage("outer"):
    assert fk.fake_cupti_call2(2, 211, 2, 1, 307, 7) == 2   # a runtime launch and its own driver launch
    with maxinstr.stage("inner"):
        fk.fake_cupti_call(1, 307, 3)              # a driver launch made directly
        fk.fake_cupti_call(2, 5, 4)                # a function not enabled: no callback
    def worker():
        with maxinstr.stage("w"):
            fk.fake_cupti_call(2, 211, 5)
    t = threading.Thread(target=worker); t.start(); t.join()
n.cupti_tags(None)
fk.fake_cupti_call(2, 211, 6)                      # unsubscribed
raw = n.cupti_tags_take()
from maxinstr.kernels.cupti import TAG_DTYPE
tags = np.frombuffer(raw, dtype=TAG_DTYPE)
r = drained()
names = dict(n.names())
by_name = {names[int(k)]: int(i) for k, i in zip(r["name_id"], r["id"])}
emit(dict(corr=tags["correlation_id"].tolist(), domain=tags["domain"].tolist(), stage=tags["stage_id"].tolist(),
          inner=tags["inner_correlation_id"].tolist(),
          expect=[-1, by_name["outer"], by_name["inner"], by_name["w"]], stats=n.cupti_tags_stats(),
          tids=tags["tid"].tolist(), cbid=tags["cbid"].tolist(),
          ordered=bool(((tags["start_ns"] >= t0) & (tags["end_ns"] >= tags["start_ns"]) & (tags["end_ns"] <= n.clock_ns())).all())))
"""
    )
    assert out["corr"] == [1, 2, 3, 5]
    assert out["inner"] == [0, 7, 0, 0]
    assert out["domain"] == [2, 2, 1, 2]
    assert out["stage"] == out["expect"]
    assert out["tids"][1] == out["tids"][2] != out["tids"][3]
    assert out["stats"]["calls"] == 4 and out["stats"]["on"] is False and out["stats"]["dropped"] == 0
    assert out["cbid"] == [211, 211, 307, 211] and out["ordered"]  # entry and exit times, the core's clock


def test_launch_tag_flags_times_off_and_no_work(run_fake):
    """flags=0 keeps the tags without CUPTI timestamps (-1); flags=2 (the benchmark's dispatch
    floor) keeps nothing; a re-subscription starts from a clean thread state."""
    out = run_fake(
        """
import maxinstr
from maxinstr.kernels.cupti import TAG_DTYPE
assert n.cupti_tags(LIB, [211], [307], 0)
with maxinstr.stage("s"):
    fk.fake_cupti_call2(2, 211, 1, 1, 307, 2)
n.cupti_tags(None)
no_times = np.frombuffer(n.cupti_tags_take(), dtype=TAG_DTYPE)
assert n.cupti_tags(LIB, [211], [307], 2)
fk.fake_cupti_call2(2, 211, 3, 1, 307, 4)
n.cupti_tags(None)
noop = len(n.cupti_tags_take())
t0 = n.clock_ns()
assert n.cupti_tags(LIB, [211], [307])
fk.fake_cupti_call(2, 211, 5)
n.cupti_tags(None)
after = np.frombuffer(n.cupti_tags_take(), dtype=TAG_DTYPE)
emit(dict(n=len(no_times), start=no_times["start_ns"].tolist(), end=no_times["end_ns"].tolist(),
          stage=no_times["stage_id"].tolist(), noop=noop, after=after["correlation_id"].tolist(),
          after_start=int(after["start_ns"][0]) - t0))
"""
    )
    assert out["n"] == 1 and out["start"] == [-1] and out["end"] == [-1] and out["stage"][0] >= 0
    assert out["noop"] == 0
    assert out["after"] == [5] and out["after_start"] >= 0


def test_the_cores_own_calibration_launches_name_no_stage(run_py, cc_lib):
    """The floor calibration launches its kernels while the first GPU-timed stage is being
    entered (before its NVTX range is pushed): their tags name no stage, the user's launches in
    that stage do (stand-in driver whose cuLaunchKernel calls the stand-in libcupti's callback)."""
    cupti, cuda = str(cc_lib("fake_cupti")), str(cc_lib("fake_cuda"))
    out = run_py(
        f"""
fk = ctypes.CDLL({cupti!r}, mode=ctypes.RTLD_GLOBAL)
import maxinstr
from maxinstr.kernels.cupti import TAG_DTYPE
assert n.cupti_tags({cupti!r}, [211], [307])
with maxinstr.stage("first", gpu=True) as s:   # reference pairing + floor calibration happen here
    fk.fake_cupti_call(2, 211, 1)              # the user's launch
n.cupti_tags(None)
tags = np.frombuffer(n.cupti_tags_take(), dtype=TAG_DTYPE)
emit(dict(corr=tags["correlation_id"].tolist(), stage=tags["stage_id"].tolist(), sid=s.id,
          floor=n.stats()["gpu_floor"], errors=n.stats()["errors"]))
""",
        MAXINSTR_CUDA_LIBRARY=cuda,
        MAXINSTR_GPU_FLOOR_NS="auto",
    )
    assert out["floor"] == ["calibrated"], out
    calib = [s for c, s in zip(out["corr"], out["stage"]) if c != 1]
    assert len(calib) >= 10 and set(calib) == {-1}  # the calibration's kernels: no stage
    assert out["stage"][out["corr"].index(1)] == out["sid"]
