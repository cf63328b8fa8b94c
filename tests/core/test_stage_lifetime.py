"""A Stage's embedded __enter__/__exit__ callables keep their Stage alive (the BoundDescr comment
and stage_alloc in csrc/core/stage.cpp; docs/stage-core.md, "How it is proven").

Found on the H200 (Python 3.12): `benchmarks/session_overhead.py --n 50000 --reps 5 --threads 16`
died with SIGSEGV. The embedded bound objects of a freshly allocated Stage had their refcount set
with Py_SET_REFCNT, which on Python >= 3.12 does nothing when the old memory already reads as an
immortal refcount: about half of the fresh Stages then had bound methods that took no reference on
their Stage. `with stage("x"):` drops its own reference to the Stage right after looking up
__enter__/__exit__, so such a Stage went to the free list while still open, was handed out again
to another `stage()` call (another thread's), freed twice, and PyObject_Free'd while still on the
free list (here, with a Python 3.12 build: SIGSEGV in the garbage collector). On Python 3.11
Py_SET_REFCNT has no immortal check, so these tests pass there with or without the fix; on 3.12,
before it, the first two failed every time and the threaded one died with SIGSEGV in 2 runs of 3.
"""

from __future__ import annotations

import pytest

DIRTY = """
import sys
size = n.Stage.__basicsize__
# Blocks of the Stage's allocator size class, filled with 0xff and freed: a Stage allocated next
# lands on that memory, where its embedded objects' refcount fields read as "immortal" on 3.12+.
bufs = [bytearray(b"\\xff" * (size - 1)) for _ in range(6000)]
del bufs
held = [n.stage("lifetime") for _ in range(3000)]  # past the free list of 256: new allocations
"""


def test_bound_methods_hold_a_reference_to_their_stage(run_py):
    out = run_py(
        DIRTY
        + """
missing = 0
for s in held:
    before = sys.getrefcount(s)
    ex = s.__exit__
    if sys.getrefcount(s) != before + 1:
        missing += 1
    en = s.__enter__
    if sys.getrefcount(s) != before + 2:
        missing += 1
    del ex, en
    assert sys.getrefcount(s) == before
emit(missing)
"""
    )
    assert out == 0, f"{out} bound __enter__/__exit__ of 3000 fresh stages took no reference on their stage"


def test_a_stage_held_only_by_its_with_statement_is_not_handed_out_again(run_py):
    # Run in a child: before the fix this corrupted the heap (a Stage freed while open).
    out = run_py(
        DIRTY
        + """
reused = 0
while held:
    with held.pop() as s:  # the with statement holds the only other reference
        t = n.stage("other")  # came from the free list when `s` had wrongly gone there
        if t is s:
            reused += 1
        del t
    del s
raw, _, _ = n.drain()
emit([reused, len(raw) // n.RECORD_SIZE])
"""
    )
    assert out == [0, 3000]


@pytest.mark.parametrize("driver", ["none", "fake_cuda"])
def test_16_threads_of_stages_inside_a_session(run_py, cc_lib, tmp_path, driver):
    """The benchmark that crashed, as a test: 16 threads x 20k stages, the session's flusher
    draining (and, with the stand-in driver, resolving GPU events) meanwhile; every record is on
    disk or counted as dropped, and the process exits cleanly."""
    env = {"MAXINSTR_CUDA_LIBRARY": str(cc_lib("fake_cuda"))} if driver == "fake_cuda" else {}
    env["MAXINSTR_GPU_BUDGET"] = "0"  # every stage GPU-timed: resolution under 16 threads is the point
    out = run_py(
        f"""
        import threading, time
        from pathlib import Path
        import maxinstr
        lib = {env.get("MAXINSTR_CUDA_LIBRARY")!r}
        stop = threading.Event()
        if lib:
            fk = ctypes.CDLL(lib)
            def gpu():  # the fake GPU completes what was recorded, every 0.5 ms
                while not stop.is_set():
                    fk.fake_complete_all()
                    time.sleep(0.0005)
            threading.Thread(target=gpu, daemon=True).start()
        N, T = 20_000, 16
        def work():
            st = maxinstr.stage
            for _ in range(N):
                with st("x"):
                    pass
        def threads():
            pool = [threading.Thread(target=work) for _ in range(T)]
            [t.start() for t in pool]
            [t.join() for t in pool]
        run = Path({str(tmp_path / "run")!r})
        for rep in range(3):  # as benchmarks/session_overhead.py: without, then inside a session
            threads()
            n.resolve(block=True)
            n.drain()
            with maxinstr.session(run / str(rep), sample_hz=0):
                threads()
        stop.set()
        on_disk = 0
        gpu_timed = 0
        for f in run.glob("*/parts/*/stages.bin"):
            r = np.fromfile(f, dtype=STAGE_DTYPE)
            on_disk += len(r)
            gpu_timed += int(((r["flags"] & n.FLAG_GPU_TIMED) != 0).sum())
        s = n.stats()
        emit(dict(on_disk=on_disk, gpu_timed=gpu_timed, dropped=s["dropped_records"], records=s["records"],
                  backend=s["gpu_backend"], events=s["events_recorded"]))
        """,
        **env,
    )
    assert out["records"] == 2 * 3 * 16 * 20_000
    assert out["on_disk"] + out["dropped"] == out["records"] // 2  # the in-session half
    if driver == "fake_cuda":
        assert out["backend"] == "cuda" and out["events"] > 0 and out["gpu_timed"] > 0
