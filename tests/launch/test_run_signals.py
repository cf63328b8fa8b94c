"""SIGTERM or SIGHUP to `maxinstr run` while its program runs (issue 29, signals at every
phase): the default action killed maxinstr alone; the program, in a process group of its own,
went on running unwatched, and no launch.json said what happened. Now they are handled as Ctrl-C
is: the program's group is stopped, the run is recorded as interrupted by that signal, and
maxinstr exits with the status the shell gives a death by it."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _launch_helpers import base_env

PROGRAM = "import os, sys, time\nprint('started', os.getpid(), flush=True)\ntime.sleep(120)\n"


def _pid_gone(pid: int, within_s: float = 15) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminating_signal_stops_the_program_and_records_the_run(tmp_path, sig):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "maxinstr", "run", "--profiler", "none", "--no-report", "-y",
                             "-o", str(run), "--", sys.executable, str(prog)], env=base_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    child = None
    deadline = time.monotonic() + 60
    while child is None and time.monotonic() < deadline:
        log = run / "child.log"
        text = log.read_text() if log.exists() else ""
        if text.startswith("started"):
            child = int(text.split()[1])
        time.sleep(0.05)
    assert child is not None, "the program never started"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert _pid_gone(child)  # the program did not outlive maxinstr
    record = json.loads((run / "launch.json").read_text())["run"]
    assert record["status"] == "interrupted" and record["signal"] == signal.Signals(sig).name
    assert f"interrupted by {signal.Signals(sig).name}" in err
