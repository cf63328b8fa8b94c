"""Process-level reliability: real child processes killed, signalled, forked, spawned, run
as ranks, and starved of disk. Each asserts on what ``maxinstr.load`` reads back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import maxinstr
from maxinstr.rundir import format as fmt

SRC = str(Path(maxinstr.__file__).parents[1])  # where this maxinstr is imported from


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAXINSTR_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(body))
    return path


def start(path: Path, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(path), *args], env=child_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(proc: subprocess.Popen, word: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(word):
            return line
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"child never said {word!r}: rc={proc.wait()} stderr={proc.stderr.read()[-2000:]}")


LOOP = """
    import os, sys, time, signal
    import maxinstr
    run_dir = sys.argv[1]
    s = maxinstr.session(run_dir, sample_hz=0, flush_interval_s=0.05)
    s.start()
    with maxinstr.stage("outer"):
        for i in range(500):
            with maxinstr.stage("work", step=i):
                pass
        time.sleep(0.3)  # longer than the flush interval: every completed stage is on disk
        print("READY", flush=True)
        time.sleep(60)
"""


def test_sigkill_keeps_every_completed_stage(tmp_path):
    proc = start(script(tmp_path, LOOP), str(tmp_path / "run"))
    wait_for(proc, "READY")
    # The records reach disk while the program runs (no close): wait for them rather than
    # trusting one fixed sleep on a loaded CI machine, then kill.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if len(maxinstr.load(tmp_path / "run")) >= 500:
                break
        except Exception:  # noqa: BLE001 - the part may not be readable yet
            pass
        time.sleep(0.05)
    proc.kill()
    assert proc.wait() == -signal.SIGKILL
    run = maxinstr.load(tmp_path / "run")
    assert run["name"].tolist() == ["work"] * 500  # "outer" was still open: not a completed stage
    assert run["step"].tolist() == list(range(500))
    assert run.meta["status"] == "running"
    assert any("not closed" in n for n in run.notes)


def _native_writer() -> bool:
    """Whether sessions here write through the core's native writer (docs/sessions.md)."""
    try:
        from maxinstr import _native as native
    except ImportError:
        return False
    if getattr(native, "__fake__", False) or not hasattr(native, "writer_start"):
        return False
    return os.environ.get("MAXINSTR_NATIVE_WRITER", "1") != "0"


def test_sigkill_mid_loop_loses_at_most_one_flush_interval(tmp_path):
    """Kill a tight stage loop at a random moment; count what the child had completed through
    a shared counter page and compare with what load() reads."""
    body = """
    import mmap, os, sys, time
    import numpy as np
    import maxinstr
    fd = os.open(sys.argv[2], os.O_RDWR)
    counter = np.frombuffer(mmap.mmap(fd, 8), dtype=np.int64)
    with maxinstr.session(sys.argv[1], sample_hz=0, flush_interval_s=0.05):
        i = 0
        t_end = time.monotonic() + 60
        print("GO", flush=True)
        while time.monotonic() < t_end:
            with maxinstr.stage("work", step=i):
                pass
            i += 1
            counter[0] = i
            if i % 200 == 0:
                time.sleep(0.001)  # ~100-200k stages/s: a realistic, not a pathological, rate
    """
    counter = tmp_path / "counter"
    counter.write_bytes(b"\0" * 8)
    proc = start(script(tmp_path, body), str(tmp_path / "run"), str(counter))
    wait_for(proc, "GO")
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    completed = int(np.frombuffer(counter.read_bytes(), dtype=np.int64)[0])
    run = maxinstr.load(tmp_path / "run")
    kept = len(run)
    assert kept <= completed and completed > 1000
    assert run["step"].tolist() == list(range(kept))  # a prefix: nothing missing in the middle
    # lost = completed in the last flush interval (+ one drain); at this rate well under 50%
    lost = completed - kept
    print(f"completed {completed}, on disk {kept}, lost {lost} ({'native' if _native_writer() else 'python'} writer)")
    assert lost < completed / 2
    if _native_writer():
        # The native writer writes every 2 ms without the GIL: at ~170k stages/s that is ~350
        # records at most (0-343 measured on the 2-core dev VM, 200 typical). 2% leaves room for
        # a loaded machine descheduling the writer for ~10 ms; the Python flusher (50 ms + the
        # wait for the GIL) lost 5,600-6,000 here (7%) and 2,600-7,200 of ~70k on the H200.
        assert lost <= max(500, completed // 50), f"lost {lost} of {completed}"


def test_sigkill_while_new_names_appear_every_row_has_its_name(tmp_path):
    """Names are written before the rows that use them: a kill while names keep appearing
    leaves no row whose name is missing (no '<name N>' placeholder, no note)."""
    body = """
    import sys, time
    import maxinstr
    with maxinstr.session(sys.argv[1], sample_hz=0):
        print("GO", flush=True)
        i = 0
        while True:
            with maxinstr.stage(f"s{i // 50}", step=i):
                pass
            i += 1
            if i % 200 == 0:
                time.sleep(0.0005)
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    wait_for(proc, "GO")
    # kill once over 1000 records are on disk: a fixed 0.4 s sleep left how many to the load
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if len(maxinstr.load(tmp_path / "run")) > 1000:
                break
        except Exception:  # noqa: BLE001 - the part may not be readable yet
            pass
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    run = maxinstr.load(tmp_path / "run")
    assert len(run) > 1000
    assert not any("not defined" in n for n in run.notes), run.notes
    names = run["name"]
    assert not any(n.startswith("<name") for n in names.tolist())
    assert names.tolist() == [f"s{i // 50}" for i in run["step"].tolist()]


def test_sigterm_finishes_the_run(tmp_path):
    proc = start(script(tmp_path, LOOP), str(tmp_path / "run"))
    wait_for(proc, "READY")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # still dies by the signal it got
    run = maxinstr.load(tmp_path / "run")
    assert run.notes == []
    assert run.meta["status"] == "closed" and run.meta["session"]["end_reason"] == "SIGTERM"
    assert run["name"].tolist() == ["outer"] + ["work"] * 500
    assert run["flags"][0] & fmt.UNCLOSED
    part = run.parts[0]
    assert part["status"] == "SIGTERM"


def test_sigterm_chains_to_the_programs_handler(tmp_path):
    body = LOOP.replace(
        "s.start()",
        "def bye(signum, frame):\n        print('HANDLER', signum, flush=True)\n        sys.exit(7)\n"
        "    signal.signal(signal.SIGTERM, bye)\n    s.start()",
    )
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    wait_for(proc, "READY")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 7 and "HANDLER 15" in out
    run = maxinstr.load(tmp_path / "run")
    assert run.meta["status"] == "closed"
    outer = run.stages[run["name"] == "outer"]
    assert len(outer) == 1 and outer["flags"][0] & fmt.EXCEPTION  # left by SystemExit, not cut


def test_sigint_finishes_the_run(tmp_path):
    proc = start(script(tmp_path, LOOP), str(tmp_path / "run"))
    wait_for(proc, "READY")
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    run = maxinstr.load(tmp_path / "run")
    assert run.meta["status"] == "closed"
    assert len(run) == 501 and run["flags"][run["name"] == "outer"][0] & fmt.EXCEPTION


def test_exception_escaping_and_no_close_finish_the_run(tmp_path):
    body = """
    import sys, maxinstr
    maxinstr.session(sys.argv[1], sample_hz=0).start()   # never closed by the program
    with maxinstr.stage("ok"):
        pass
    with maxinstr.stage("boom"):
        raise ValueError("escapes")
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "ValueError: escapes" in err
    run = maxinstr.load(tmp_path / "run")
    assert run.meta["status"] == "closed" and run.notes == []
    assert run["name"].tolist() == ["ok", "boom"]
    assert run["flags"].tolist() == [0, fmt.EXCEPTION]


def test_daemon_thread_stage_open_at_exit_is_written_unclosed(tmp_path):
    body = """
    import sys, threading, time, maxinstr
    maxinstr.session(sys.argv[1], sample_hz=0).start()
    def worker():
        with maxinstr.stage("forever"):
            time.sleep(60)
    threading.Thread(target=worker, daemon=True).start()
    time.sleep(0.2)
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    run = maxinstr.load(tmp_path / "run")
    assert run["name"].tolist() == ["forever"] and run["flags"][0] == fmt.UNCLOSED


# -- processes: fork, multiprocessing, ranks ---------------------------------------------------


def _by_part(run) -> dict[str, set[str]]:
    names = run["name"]
    out: dict[str, set[str]] = {}
    for index, part in enumerate(run.parts):
        out[part["name"]] = set(names[run["part"] == index].tolist())
    return out


def _ids_match_parts(run) -> None:
    assert np.all(run["id"] >> 32 == run["pid"])


def test_os_fork_child_writes_its_own_part(tmp_path):
    body = """
    import os, sys, maxinstr
    with maxinstr.session(sys.argv[1], sample_hz=0):
        with maxinstr.stage("parent-before"):
            pass
        pid = os.fork()
        if pid == 0:
            with maxinstr.stage("child"):
                pass
            sys.exit(0)          # leaves the child's `with session` and runs its atexit
        with maxinstr.stage("parent-after"):
            pass
        os.waitpid(pid, 0)
        print("CHILD", pid, flush=True)
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    child_pid = int(out.split("CHILD")[1].split()[0])
    run = maxinstr.load(tmp_path / "run")
    parts = _by_part(run)
    assert parts == {f"p{proc.pid}": {"parent-before", "parent-after"}, f"p{child_pid}": {"child"}}
    _ids_match_parts(run)
    assert run.meta["status"] == "closed" and run.meta["pid"] == proc.pid
    if _native_writer():
        # the child did not inherit the parent's writer thread: it started its own on its part
        assert [p["writer"]["kind"] for p in run.parts] == ["native", "native"]
        assert sorted(p["rows_written"] for p in run.parts) == [1, 2]


@pytest.mark.parametrize("how", ["os.fork", "multiprocessing fork"])
def test_fork_child_ended_by_os_exit_keeps_the_stages_its_writer_wrote(tmp_path, how):
    """A fork child's part opens at its first stage, so its native writer writes its records
    within its interval, as any process's; they survive os._exit(). The child waits until it
    sees its rows on disk (no timing assumed); the flusher never runs a round in the child
    (flush_interval_s=3600). Before, the part opened only at the flusher's next round: a child
    that ended within 50 ms of its stages lost them all and left no part."""
    if not _native_writer():
        pytest.skip("the Python writer's bound is the flush interval")
    body = f"""
    import multiprocessing as mp, os, sys, time, maxinstr
    run_dir = sys.argv[1]

    def child():
        for i in range(10):
            with maxinstr.stage("forked", step=i):
                pass
        stages = os.path.join(run_dir, "parts", f"p{{os.getpid()}}", "stages.bin")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if os.path.exists(stages) and os.path.getsize(stages) >= 10 * {fmt.STAGE_DTYPE.itemsize}:
                break
            time.sleep(0.005)
        os._exit(0)  # no exit handler runs: as SIGKILL

    if __name__ == "__main__":
        with maxinstr.session(run_dir, sample_hz=0, flush_interval_s=3600):
            with maxinstr.stage("parent"):
                pass
            if {how!r} == "os.fork":
                pid = os.fork()
                if pid == 0:
                    child()
                os.waitpid(pid, 0)
            else:
                p = mp.get_context("fork").Process(target=child)
                p.start()
                p.join()
                pid = p.pid
        print("CHILD", pid, flush=True)
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    child = int(out.split("CHILD")[1].split()[0])
    run = maxinstr.load(tmp_path / "run")
    parts = _by_part(run)
    assert parts == {f"p{proc.pid}": {"parent"}, f"p{child}": {"forked"}}
    assert run["step"][run["name"] == "forked"].tolist() == list(range(10))
    assert any(f"p{child}" in n and "did not close" in n for n in run.notes), run.notes  # said, as a kill is


def test_python_writer_fallback_env(tmp_path):
    """MAXINSTR_NATIVE_WRITER=0: the Python flusher writes the records, as before."""
    body = """
    import sys, maxinstr
    with maxinstr.session(sys.argv[1], sample_hz=0):
        for i in range(3000):
            with maxinstr.stage("work", step=i, i=i):
                pass
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"), MAXINSTR_NATIVE_WRITER="0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Warning" not in err, err  # chosen, not a failure: nothing said
    run = maxinstr.load(tmp_path / "run")
    assert run.parts[0]["writer"] == {"kind": "python"}
    assert run["step"].tolist() == list(range(3000)) and run.notes == []
    assert run.attrs[int(run["id"][7])] == {"i": 7}


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_children_join_in_parts_of_their_own(tmp_path, method):
    body = f"""
    import multiprocessing as mp, os, sys
    import maxinstr

    def work(n):
        for i in range(n):
            with maxinstr.stage("child-work", step=i):
                pass
        return os.getpid()

    if __name__ == "__main__":
        ctx = mp.get_context({method!r})
        with maxinstr.session(sys.argv[1], sample_hz=0):
            with maxinstr.stage("parent"):
                with ctx.Pool(2) as pool:
                    pids = pool.map(work, [50, 50, 50, 50])
        print("PIDS", *sorted(set(pids)), flush=True)
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    child_pids = {int(p) for p in out.split("PIDS")[1].split()}
    run = maxinstr.load(tmp_path / "run")
    parts = _by_part(run)
    assert parts.pop(f"p{proc.pid}") == {"parent"}
    assert {int(name[1:]) for name in parts} >= child_pids  # forkserver's own server records nothing
    for name, names in parts.items():
        assert names == {"child-work"}, name
    assert (run["name"] == "child-work").sum() == 200  # nothing lost when pool workers exit
    _ids_match_parts(run)


def test_torchrun_style_ranks_write_rank_parts(tmp_path):
    body = """
    import os, sys, maxinstr
    with maxinstr.session(sys.argv[1], sample_hz=0, rank_note=os.environ["RANK"]):
        for i in range(10):
            with maxinstr.stage("step", step=i):
                pass
    """
    path = script(tmp_path, body)
    procs = [
        start(path, str(tmp_path / "run"), RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="3", LOCAL_WORLD_SIZE="3")
        for r in (2, 1, 0)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    run = maxinstr.load(tmp_path / "run")
    names = sorted(p["name"] for p in run.parts)
    assert names == sorted(f"r{r}.p{p.pid}" for r, p in zip((2, 1, 0), procs))
    assert sorted(set(run["rank"].tolist())) == [0, 1, 2]
    assert all(p["world_size"] == 3 for p in run.parts)
    assert run.meta["user"]["rank_note"] == "0"  # rank 0 owns meta.json
    assert np.bincount(run["rank"]).tolist() == [10, 10, 10]


# -- the disk --------------------------------------------------------------------------------


def test_unwritable_run_directory_one_warning_program_runs(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the run directory should go")
    body = """
    import sys, maxinstr
    with maxinstr.session(sys.argv[1], sample_hz=0):
        for i in range(100):
            with maxinstr.stage("work"):
                pass
    print("DONE", flush=True)
    """
    proc = start(script(tmp_path, body), str(blocker / "run"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "DONE" in out
    assert err.count("RunDirWarning") == 1, err
    assert "cannot write run directory" in err


FILL = """
    import signal, sys, resource, maxinstr
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = int(sys.argv[2])
    if limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    with maxinstr.session(sys.argv[1], sample_hz=0, flush_interval_s=0.01) as s:
        for i in range(3000):
            with maxinstr.stage("work", step=i):
                pass
            if i % 100 == 0:
                s.flush()
    print("DONE", flush=True)
"""


def _check_full(run_dir: Path, out: str, err: str, rc: int) -> None:
    assert rc == 0 and "DONE" in out
    assert err.count("RunDirWarning") == 1, err
    run = maxinstr.load(run_dir)  # readable: whole records only
    assert 0 < len(run) < 3000
    assert run["step"].tolist() == list(range(len(run)))
    # the run closed and says how many records the disk took from it (issue 20: it used to
    # read as killed, with no count)
    [part] = run.parts
    assert part["status"] == "closed" and run.meta["status"] == "closed"
    assert part["rows_dropped_disk"] == 3000 - len(run), (part, len(run))
    assert not any("killed" in n or "not closed" in n for n in run.notes), run.notes
    assert any(f"{3000 - len(run)} stage record(s) dropped while recording (the disk write failed)" in n
               for n in run.notes), run.notes


def test_file_size_limit_mid_run_one_warning_and_a_readable_prefix(tmp_path):
    """RLIMIT_FSIZE makes writes past the limit fail with EFBIG, as a full disk would."""
    proc = start(script(tmp_path, FILL), str(tmp_path / "run"), "60000")
    out, err = proc.communicate(timeout=60)
    _check_full(tmp_path / "run", out, err, proc.returncode)


def test_full_tmpfs_mid_run(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root); RLIMIT_FSIZE test covers the path")
    try:
        proc = start(script(tmp_path, FILL), str(mnt / "run"), "0")
        out, err = proc.communicate(timeout=60)
        assert "No space left on device" in err
        _check_full(mnt / "run", out, err, proc.returncode)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_sigterm_during_main_thread_flushes_loses_nothing(tmp_path):
    """SIGTERM landing while the main thread itself writes a batch (s.flush()) is handled after
    that batch: the run is a gap-free prefix of what completed, and closed."""
    body = """
    import sys, maxinstr
    s = maxinstr.session(sys.argv[1], sample_hz=0, flush_interval_s=10)
    s.start()
    i = 0
    while True:
        for _ in range(2000):
            with maxinstr.stage("work", step=i):
                pass
            i += 1
        s.flush()
        if i == 2000:
            print("READY", flush=True)
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    wait_for(proc, "READY")
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    run = maxinstr.load(tmp_path / "run")
    assert run.meta["status"] == "closed" and run.notes == []
    steps = run["step"]
    assert len(steps) >= 2000 and steps.tolist() == list(range(len(steps)))


def test_python_subprocess_joins_with_its_rank(tmp_path):
    """A plain subprocess (here a torchrun-style worker with RANK set) joins the open run."""
    body = """
    import os, subprocess, sys, maxinstr
    code = "import maxinstr\\nwith maxinstr.stage('worker'):\\n    pass\\n"
    with maxinstr.session(sys.argv[1], sample_hz=0):
        with maxinstr.stage("launcher"):
            for rank in (0, 1):
                env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2")
                subprocess.run([sys.executable, "-c", code], env=env, check=True)
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    run = maxinstr.load(tmp_path / "run")
    parts = _by_part(run)
    assert parts.pop(f"p{proc.pid}") == {"launcher"}
    assert sorted(name.split(".")[0] for name in parts) == ["r0", "r1"]
    assert all(names == {"worker"} for names in parts.values())
    assert all(p["role"] == "child" for p in run.parts if p["name"] != f"p{proc.pid}")
    _ids_match_parts(run)


def test_killed_child_part_is_noted(tmp_path):
    body = """
    import os, signal, sys, time, maxinstr
    with maxinstr.session(sys.argv[1], sample_hz=0):
        pid = os.fork()
        if pid == 0:
            with maxinstr.stage("child"):
                pass
            time.sleep(0.3)  # flushed
            os.kill(os.getpid(), signal.SIGKILL)
        os.waitpid(pid, 0)
        print("CHILD", pid, flush=True)
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    child = int(out.split("CHILD")[1].split()[0])
    run = maxinstr.load(tmp_path / "run")
    assert run.meta["status"] == "closed"
    assert "child" in set(run.stage_names().tolist())
    assert any(f"p{child}" in n and "did not close" in n for n in run.notes), run.notes


def test_fork_while_threads_record_and_the_writer_writes(tmp_path):
    """fork() in the middle of heavy recording: the child never inherits the writer's lock held
    or its thread, writes exactly its own records to its own part; the parent loses nothing."""
    body = """
    import os, sys, threading, maxinstr
    stop = threading.Event()
    counts = []
    def work():
        i = 0
        while not stop.is_set():
            with maxinstr.stage("bg", step=i):
                pass
            i += 1
        counts.append(i)
    with maxinstr.session(sys.argv[1], sample_hz=0):
        pool = [threading.Thread(target=work) for _ in range(3)]
        for t in pool:
            t.start()
        children = []
        for k in range(10):
            pid = os.fork()
            if pid == 0:
                stop.set()  # (its copies of the threads do not exist in the child)
                for i in range(100):
                    with maxinstr.stage("child", step=i):
                        pass
                sys.exit(0)
            children.append(pid)
        for pid in children:
            assert os.waitpid(pid, 0)[1] == 0
        stop.set()
        for t in pool:
            t.join()
    print("COUNTS", sum(counts), *children, flush=True)
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    words = out.split("COUNTS")[1].split()
    total, children = int(words[0]), [int(p) for p in words[1:]]
    run = maxinstr.load(tmp_path / "run")
    parts = _by_part(run)
    assert parts.pop(f"p{proc.pid}") == {"bg"}
    assert sorted(parts) == sorted(f"p{c}" for c in children)
    assert all(names == {"child"} for names in parts.values())
    names = run["name"]
    parent = next(p for p in run.parts if p["name"] == f"p{proc.pid}")
    assert (names == "bg").sum() + parent["dropped_records"] == total
    for index, part in enumerate(run.parts):
        if part["name"] != f"p{proc.pid}":
            assert run["step"][run["part"] == index].tolist() == list(range(100))
    _ids_match_parts(run)


def test_a_pool_workers_sigterm_whose_handler_never_runs_still_ends_it(tmp_path):
    """A pool ends idle workers with SIGTERM; one arriving as a worker began to wait on the queue's
    lock left Python's handler unrun and the worker waiting for ever (2-3 pool exits in 40 under
    load). The same state, made deterministic: SIGTERM taken by another thread of the program while
    the main thread waits in C. The flusher finishes the run and ends the child (exit 143); before,
    it waited for ever."""
    body = """
    import multiprocessing as mp, signal, sys, threading, time
    import maxinstr

    def signal_once_main_waits(main_tid):
        # once the main thread sleeps in the kernel, SIGTERM to this thread: its C handler runs here,
        # and Python's waits for the main thread, which no signal wakes
        while open(f"/proc/self/task/{main_tid}/stat").read().rsplit(")", 1)[1].split()[0] != "S":
            time.sleep(0.01)
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        time.sleep(60)

    def child():
        with maxinstr.stage("child-work"):
            pass
        lock = threading.Lock()
        lock.acquire()
        threading.Thread(target=signal_once_main_waits, args=(threading.get_native_id(),), daemon=True).start()
        lock.acquire()  # waits in C for ever

    if __name__ == "__main__":
        with maxinstr.session(sys.argv[1], sample_hz=0):
            p = mp.get_context("fork").Process(target=child)
            p.start()
            p.join(timeout=60)
            print("EXIT", p.exitcode, p.pid, flush=True)
            if p.exitcode is None:
                p.kill()
    """
    proc = start(script(tmp_path, body), str(tmp_path / "run"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    exitcode, pid = out.split("EXIT")[1].split()[:2]
    # 143: the flusher ended it; -15: the main thread ran the handler after all (it had not begun to wait)
    assert exitcode in (str(128 + signal.SIGTERM), str(-signal.SIGTERM)), f"the child still ran: {out}"
    run = maxinstr.load(tmp_path / "run")
    assert _by_part(run)[f"p{pid}"] == {"child-work"}
    assert not any("did not close" in n for n in run.notes), run.notes  # the flusher closed its part
