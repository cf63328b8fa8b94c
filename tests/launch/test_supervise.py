"""The supervisor against real child processes: success, early crash, fatal log line in a
process that keeps running, hang (timeout), silence, and cleanup of the whole group."""
from __future__ import annotations

import os
import sys
import time

import pytest

from maxinstr.launch import supervise as sv


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_success_is_logged_and_echoed(tmp_path, script):
    prog = script("ok.py", "print('step 1'); print('done')\n")
    lines: list[str] = []
    res = sv.supervise([sys.executable, str(prog)], log_path=tmp_path / "log", echo=lines.append)
    assert res.ok and res.returncode == 0 and res.status == "ok"
    assert lines == ["step 1", "done"]
    assert (tmp_path / "log").read_text() == "step 1\ndone\n"


def test_early_crash_is_reported_with_its_error(tmp_path, script):
    prog = script("crash.py", """
        import sys
        def load(path):
            raise FileNotFoundError(f"model not found: {path}")
        load("/models/llama-404")
    """)
    t0 = time.monotonic()
    res = sv.supervise([sys.executable, str(prog)], log_path=tmp_path / "log")
    assert time.monotonic() - t0 < 10
    assert res.status == "failed" and res.returncode == 1
    assert res.fatal_label == "python traceback"
    assert res.tail[-1] == "FileNotFoundError: model not found: /models/llama-404"


def test_fatal_line_in_a_process_that_hangs_stops_it_within_seconds(tmp_path, script):
    # A server that logs an OOM and then keeps running: do not wait for a timeout.
    prog = script("oom_then_hang.py", """
        import time
        print("loading weights", flush=True)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        time.sleep(120)
    """)
    t0 = time.monotonic()
    res = sv.supervise([sys.executable, str(prog)], log_path=tmp_path / "log", fatal_grace_s=1.0, timeout_s=100)
    elapsed = time.monotonic() - t0
    assert res.status == "fatal-log" and res.stopped_by_maxinstr
    assert res.fatal_label == "out of GPU memory"
    assert "CUDA out of memory" in res.fatal_line
    assert elapsed < 15, elapsed


def test_bad_flag_is_fatal(tmp_path, script):
    prog = script("cli.py", """
        import argparse
        p = argparse.ArgumentParser(); p.add_argument("--steps", type=int); p.parse_args()
    """)
    res = sv.supervise([sys.executable, str(prog), "--stepz", "3"], log_path=tmp_path / "log")
    assert res.status == "failed" and res.returncode == 2
    assert res.fatal_label == "bad command-line flag"


def test_hang_hits_the_time_limit_and_the_whole_group_is_stopped(tmp_path, script):
    pidfile = tmp_path / "grandchild.pid"
    prog = script("hang.py", f"""
        import subprocess, sys, time
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pidfile)!r}, "w").write(str(g.pid))
        print("working", flush=True)
        time.sleep(120)
    """)
    t0 = time.monotonic()
    res = sv.supervise([sys.executable, str(prog)], log_path=tmp_path / "log", timeout_s=1.5, stop_grace_s=2)
    assert res.status == "timeout" and time.monotonic() - t0 < 12
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_silent_program(tmp_path, script):
    prog = script("silent.py", "pass\n")
    res = sv.supervise([sys.executable, str(prog)], log_path=tmp_path / "log")
    assert res.ok and res.tail == [] and (tmp_path / "log").read_bytes() == b""


def test_no_fail_fast_lets_a_noisy_program_finish(tmp_path, script):
    prog = script("noisy.py", "print('Traceback (most recent call last):', flush=True)\nimport time; time.sleep(0.5)\n")
    res = sv.supervise([sys.executable, str(prog)], log_path=tmp_path / "log", fatal_patterns=None, fatal_grace_s=0.1)
    assert res.ok


def test_missing_executable_raises():
    with pytest.raises(FileNotFoundError):
        sv.supervise(["/nonexistent/definitely-not-here"])
