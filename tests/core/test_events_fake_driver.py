"""The GPU event pool, lazy resolution, boundary sharing, exhaustion and error paths, run against a
test-only stand-in driver (tests/core/native/fake_cuda.c) with a fake GPU timeline."""

from __future__ import annotations

import textwrap

import pytest

PRE = """
fk = ctypes.CDLL(LIB)
fk.fake_count.restype = ctypes.c_longlong
fk.fake_next_ts.restype = ctypes.c_longlong
fk.fake_record_stream.restype = ctypes.c_ulonglong
def count(name):
    return fk.fake_count(name.encode())
def drained():
    raw, names, attrs = n.drain()
    return recs(raw)
"""


@pytest.fixture
def run_fake(run_py, cc_lib):
    lib = str(cc_lib("fake_cuda"))

    def run(code: str, backend: str = "cuda", **env):
        var = "MAXINSTR_CUDA_LIBRARY" if backend == "cuda" else "MAXINSTR_HIP_LIBRARY"
        return run_py(f"LIB = {lib!r}\n" + PRE + textwrap.dedent(code), **{var: lib}, **env)

    return run


def test_lazy_resolution_exact_durations_and_no_hot_path_sync(run_fake):
    out = run_fake(
        """
        n._configure_events(share_ns=0)          # one event per boundary, to check each pair
        fk.fake_set_tick(250_000)                 # each event record is 250 us after the previous
        with n.stage("warm"):
            pass                                  # first GPU stage: context + reference pairing
        syncs_after_init = count("cuEventSynchronize")
        fk.fake_complete_all(); n.resolve(); drained()
        t0 = fk.fake_next_ts()
        for i in range(3):
            with n.stage("s", step=i):
                pass
        not_ready = [n.resolve(), len(drained()), n.stats()["events_in_flight"]]
        fk.fake_set_gpu_now(t0 + 250_000)         # only the first stage's exit event has completed
        first = [n.resolve(), n.stats()["events_in_flight"]]
        r1 = drained()
        fk.fake_complete_all()
        rest = n.resolve()
        r2 = drained()
        r = np.concatenate([r1, r2])
        emit(dict(syncs=[syncs_after_init, count("cuEventSynchronize")], not_ready=not_ready, first=first, rest=rest,
                  dur=(r["gpu_end_ns"] - r["gpu_start_ns"]).tolist(),
                  gaps=(r["gpu_start_ns"][1:] - r["gpu_start_ns"][:-1]).tolist(),
                  flags=r["flags"].tolist(), steps=r["step"].tolist(), stats=n.stats(),
                  created=count("cuEventCreate")))
        """
    )
    assert out["stats"]["gpu_backend"] == "cuda"
    assert out["syncs"] == [3, 3]  # 3 for the reference pairing, none afterwards (resolve() is non-blocking)
    assert out["not_ready"] == [0, 0, 3]  # nothing ready: nothing drained, nothing blocked
    assert out["first"] == [1, 2]
    assert out["rest"] == 2
    assert out["dur"] == [250_000] * 3  # enter->exit = one tick, exactly
    assert out["gaps"] == [500_000, 500_000]  # two events per stage with sharing off
    assert out["flags"] == [2, 2, 2] and out["steps"] == [0, 1, 2]
    assert out["created"] == 64  # the pool grows in chunks, created once and reused


def test_boundary_sharing_one_event_per_sibling(run_fake):
    out = run_fake(
        """
        n._configure_events(share_ns=10**12)     # a window wide enough that every boundary shares
        with n.stage("warm"):
            pass
        fk.fake_complete_all(); n.resolve(); drained()
        before = count("cuEventRecord")
        for i in range(4):
            with n.stage("sib"):
                fk.cuEventRecord.argtypes = None  # stand-in for work: nothing recorded by us
        recorded = count("cuEventRecord") - before
        fk.fake_complete_all(); n.resolve()
        r = drained()
        emit(dict(recorded=recorded, start=r["gpu_start_ns"].tolist(), end=r["gpu_end_ns"].tolist(),
                  shared=n.stats()["events_shared"]))
        """
    )
    assert out["recorded"] == 0  # every boundary shared the previous one: no work was submitted between
    assert out["shared"] >= 8
    assert out["start"][1:] == out["end"][:-1]  # exit of one sibling == enter of the next


def test_sharing_window_respected(run_fake):
    out = run_fake(
        """
        import time
        n._configure_events(share_ns=1_000)
        with n.stage("warm"):
            pass
        before = count("cuEventRecord")
        with n.stage("a"):
            time.sleep(0.002)                     # a gap far longer than the window: a new event
        with n.stage("b"):
            pass
        emit(count("cuEventRecord") - before)
        """
    )
    assert out >= 2


def test_stream_handles_are_used(run_fake):
    out = run_fake(
        """
        n._configure_events(share_ns=0)
        class TorchStream:
            cuda_stream = 0xBEEF
        class CupyStream:
            ptr = 0xCAFE
        with n.stage("warm"):
            pass
        k = fk.fake_nrecords()
        with n.stage("t", stream=TorchStream()):
            pass
        with n.stage("c", stream=CupyStream()):
            pass
        with n.stage("i", stream=1234):
            pass
        emit([fk.fake_record_stream(i) for i in range(k, fk.fake_nrecords())])
        """
    )
    assert out == [0xBEEF, 0xBEEF, 0xCAFE, 0xCAFE, 1234, 1234]


def test_pool_exhaustion_keeps_host_times_and_counts(run_fake):
    out = run_fake(
        """
        n._configure_events(pool_size=8, share_ns=0)
        fk.fake_set_gpu_now(0)                    # the GPU never catches up
        with n.stage("warm"):
            pass
        for i in range(20):
            with n.stage("s"):
                pass
        st = n.stats()
        fk.fake_complete_all()
        n.resolve()
        r = drained()
        emit(dict(pool=st["event_pool_size"], dropped=st["events_dropped"], n=len(r),
                  timed=int(((r["flags"] & 2) != 0).sum()), gpu_dropped=int(((r["flags"] & 8) != 0).sum()),
                  host_ok=bool((r["host_end_ns"] >= r["host_start_ns"]).all()),
                  neg=bool((r["gpu_start_ns"][(r["flags"] & 8) != 0] == -1).all()),
                  created=count("cuEventCreate")))
        """
    )
    assert out["pool"] == 8 and out["created"] == 8  # bounded
    assert out["n"] == 21  # every stage still gives a record
    assert out["gpu_dropped"] > 0 and out["dropped"] > 0
    assert out["timed"] + out["gpu_dropped"] == 21
    assert out["host_ok"] and out["neg"]


def test_pool_recovers_when_gpu_catches_up(run_fake):
    out = run_fake(
        """
        n._configure_events(pool_size=8, share_ns=0)
        for i in range(50):
            fk.fake_complete_all()               # the GPU keeps up: opportunistic resolution frees events
            with n.stage("s"):
                pass
        fk.fake_complete_all(); n.resolve()
        r = drained()
        emit([len(r), int(((r["flags"] & 8) != 0).sum()), n.stats()["event_pool_size"]])
        """
    )
    assert out == [50, 0, 8]


def test_block_resolve_waits(run_fake):
    out = run_fake(
        """
        with n.stage("s"):
            pass
        a = n.resolve()
        b = n.resolve(block=True)
        emit([a, b, len(drained()), n.stats()["events_in_flight"]])
        """
    )
    assert out == [0, 1, 1, 0]


def test_no_current_context_means_host_only(run_fake):
    out = run_fake(
        """
        fk.fake_set_context(0)
        with n.stage("s"):
            pass
        with n.stage("forced", gpu=True):
            pass
        r = drained()
        emit(dict(flags=r["flags"].tolist(), created=count("cuEventCreate"), errors=n.stats()["errors"]))
        """
    )
    assert out["flags"] == [0, 0] and out["created"] == 0
    assert any("no GPU context" in e for e in out["errors"])


def test_gpu_false_records_no_events(run_fake):
    out = run_fake(
        """
        with n.stage("s", gpu=False):
            pass
        r = drained()
        emit([r["flags"].tolist(), count("cuEventRecord"), count("cuCtxGetCurrent")])
        """
    )
    assert out == [[0], 0, 0]


@pytest.mark.parametrize(
    ("fail", "expect"),
    [("cuEventRecord", "event record failed"), ("cuEventQuery", "event query failed"),
     ("cuEventElapsedTime", "elapsed-time failed")],
)
def test_driver_errors_flag_gpu_dropped(run_fake, fail, expect):
    out = run_fake(
        f"""
        n._configure_events(share_ns=0)
        with n.stage("warm"):
            pass
        fk.fake_complete_all(); n.resolve(); drained()
        fk.fake_fail({fail!r}.encode(), 999, 1)
        with n.stage("bad"):
            pass
        fk.fake_complete_all(); n.resolve()
        with n.stage("good"):
            pass
        fk.fake_complete_all(); n.resolve()
        r = drained()
        emit(dict(flags=r["flags"].tolist(), errors=n.stats()["errors"], dropped=n.stats()["events_dropped"]))
        """
    )
    assert out["flags"] == [8, 2]  # GPU_DROPPED then a good, GPU_TIMED record
    assert out["dropped"] == 1
    assert any(expect in e and "999" in e for e in out["errors"])


def test_reference_failure_disables_gpu_for_context(run_fake):
    out = run_fake(
        """
        fk.fake_fail(b"cuEventSynchronize", 700, 10)
        with n.stage("s"):
            pass
        r = drained()
        emit([r["flags"].tolist(), n.stats()["errors"]])
        """
    )
    assert out[0] == [0] and any("reference event failed" in e for e in out[1])


def test_missing_library_is_host_only(run_py, tmp_path):
    out = run_py(
        """
        with n.stage("s"):
            pass
        raw, _, _ = n.drain()
        s = n.stats()
        emit([recs(raw)["flags"].tolist(), s["gpu_backend"], s["errors"]])
        """,
        MAXINSTR_CUDA_LIBRARY=str(tmp_path / "libcuda-missing.so"),
    )
    assert out[0] == [0] and out[1] == "none" and any("could not be loaded" in e for e in out[2])


def test_hip_backend(run_fake):
    out = run_fake(
        """
        n._configure_events(share_ns=0)
        fk.fake_set_tick(5_000)
        with n.stage("s"):
            pass
        fk.fake_complete_all(); n.resolve()
        r = drained()
        emit([n.stats()["gpu_backend"], r["flags"].tolist(), (r["gpu_end_ns"] - r["gpu_start_ns"]).tolist()])
        """,
        backend="hip",
    )
    assert out == ["hip", [2], [5_000]]


def test_profiler_start_stop(run_fake):
    out = run_fake(
        """
        emit([n.profiler_start(), n.profiler_stop(), count("cuProfilerStart"), count("cuProfilerStop")])
        """
    )
    assert out == [True, True, 1, 1]


def test_close_open_releases_events(run_fake):
    out = run_fake(
        """
        s = n.stage("left"); s.__enter__()
        n.close_open("atexit")
        fk.fake_complete_all(); n.resolve()
        r = drained()
        emit([r["flags"].tolist(), n.stats()["events_in_flight"]])
        """
    )
    assert out == [[16], 0]  # UNCLOSED, host times only


def test_fork_child_has_no_gpu_timing(run_fake):
    out = run_fake(
        """
        import os
        with n.stage("parent"):
            pass
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            with n.stage("child"):
                pass
            raw, _, _ = n.drain()
            rr = recs(raw)
            os.write(w, f"{len(rr)} {int(rr['flags'][0])} {int(n.stats()['gpu_off_after_fork'])}".encode())
            os._exit(0)
        os.close(w)
        msg = os.read(r, 100).decode()
        os.waitpid(pid, 0)
        emit(msg)
        """
    )
    assert out == "1 0 1"


def test_graph_capture_is_never_disturbed(run_fake):
    out = run_fake(
        """
        n._configure_events(share_ns=0)
        with n.stage("before"):                   # reference pairing happens outside the capture
            pass
        fk.fake_begin_capture(ctypes.c_ulonglong(0xCA97), 0)   # a non-blocking stream captures
        with n.stage("other-stream", stream=0x1234) as o:      # work elsewhere keeps GPU time
            pass
        with n.stage("captured", stream=0xCA97) as c:          # no event goes into the graph
            pass
        for i in range(200):                                   # opportunistic resolution too
            with n.stage("more", stream=0x1234):
                pass
        resolved = n.resolve()                                 # the session's flusher thread
        invalid = fk.fake_capture_invalidated()
        into = fk.fake_recorded_into_capture()
        mode = fk.fake_thread_mode()
        fk.fake_end_capture()
        fk.fake_complete_all(); n.resolve()
        r = drained()
        by = {int(x["id"]): int(x["flags"]) for x in r}
        st = n.stats()
        emit(dict(invalid=invalid, into=into, mode=mode, skipped=st["events_skipped_capture"],
                  flags=[by[o.id], by[c.id]], errors=st["errors"]))
        """
    )
    assert out["invalid"] == 0  # our queries ran in relaxed capture mode
    assert out["into"] == 0  # nothing recorded into the capturing stream
    assert out["mode"] == 0  # the thread's capture mode was restored
    assert out["skipped"] >= 1
    assert out["flags"] == [2, 8]  # other stream: timed; captured stream: GPU_DROPPED
    assert out["errors"] == []


def test_reference_pairing_retried_after_capture(run_fake):
    out = run_fake(
        """
        import time
        fk.fake_begin_capture(ctypes.c_ulonglong(0xCA97), 1)   # a *blocking* stream captures
        with n.stage("during"):
            pass
        rec_during = count("cuEventRecord")                     # the legacy stream was not touched
        fk.fake_end_capture()
        first = drained()["flags"].tolist()
        time.sleep(1.1)                                         # retried at most once a second
        with n.stage("after"):
            pass
        fk.fake_complete_all(); n.resolve()
        emit([first, drained()["flags"].tolist(), rec_during])
        """
    )
    assert out == [[0], [2], 0]


def test_two_contexts_keep_separate_pools_and_anchors(run_fake):
    out = run_fake(
        """
        n._configure_events(share_ns=0)
        fk.fake_set_tick(10_000)
        ids = {}
        for ctx in (0x1000, 0x2000, 0x1000, 0x2000):
            fk.fake_set_context(ctypes.c_longlong(ctx))
            with n.stage(f"c{ctx:x}") as s:
                pass
            ids[s.id] = ctx
        fk.fake_complete_all(); n.resolve()
        r = drained()
        st = n.stats()
        emit(dict(contexts=st["gpu_contexts"], pool=st["event_pool_size"],
                  flags=r["flags"].tolist(), dur=(r["gpu_end_ns"] - r["gpu_start_ns"]).tolist()))
        """
    )
    assert out["contexts"] == 2 and out["pool"] == 128  # one chunk of 64 per context
    assert out["flags"] == [2, 2, 2, 2] and out["dur"] == [10_000] * 4
