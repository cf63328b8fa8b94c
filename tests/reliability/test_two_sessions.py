"""Two sessions on one directory (issue 20, class 1): a live run is never deleted.

Two processes open a session on the same path, 0.5 s apart or at the same moment: both keep
every record (one run, two parts); the second says once which live process it joined. A run
whose processes are gone is a previous run and is replaced. The rule that decides, over the
states a run directory can be in, is a property test of ``owners.live_writers``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_processes import script, start, wait_for

import maxinstr
from maxinstr.rundir import format as fmt
from maxinstr.rundir import owners

WRITER = """
    import os, sys, time
    import maxinstr
    go = sys.argv[2]
    while not os.path.exists(go):  # both processes start recording together
        time.sleep(0.005)
    time.sleep(float(sys.argv[3]))
    me, other = sys.argv[4], {"first": "second", "second": "first"}[sys.argv[4]]
    with maxinstr.session(sys.argv[1], sample_hz=0, who=me):
        open(go + "." + me, "w").close()
        for i in range(1000):
            with maxinstr.stage(me, step=i):
                pass
            if i % 100 == 0:
                time.sleep(0.01)
        end = time.monotonic() + 60
        while not os.path.exists(go + "." + other) and time.monotonic() < end:
            time.sleep(0.005)  # the two sessions are open at the same time
    print("DONE", flush=True)
"""


def _two(tmp_path: Path, delay_s: float):
    body = script(tmp_path, WRITER)
    go = tmp_path / "go"
    run_dir = tmp_path / "run"
    first = start(body, str(run_dir), str(go), "0", "first")
    second = start(body, str(run_dir), str(go), str(delay_s), "second")
    go.write_text("")
    outs = [p.communicate(timeout=120) for p in (first, second)]
    for p, (_, err) in zip((first, second), outs):
        assert p.returncode == 0, err
    return run_dir, first, second, outs


def _check_both_kept(run_dir: Path, first, second, outs) -> None:
    run = maxinstr.load(run_dir)
    by_part = {p["name"]: p for p in run.parts}
    assert set(by_part) == {f"p{first.pid}", f"p{second.pid}"}
    names = run["name"]
    assert (names == "first").sum() == 1000 and (names == "second").sum() == 1000
    for index, _part in enumerate(run.parts):
        assert run["step"][run["part"] == index].tolist() == list(range(1000))
    # exactly one of them joined the other's live run, and said so once, naming it
    joined = [p for p in run.parts if p.get("joined_live_run")]
    assert len(joined) == 1
    owner = first if joined[0]["pid"] == second.pid else second
    err = outs[0][1] if joined[0]["pid"] == first.pid else outs[1][1]
    assert err.count("RuntimeWarning") == 1 and f"pid {owner.pid}" in err, err
    assert run.meta["pid"] == owner.pid and run.meta["status"] == "closed"


def test_second_session_half_a_second_later_keeps_both(tmp_path, machine_load):
    _check_both_kept(*_two(tmp_path, 0.5))


def test_two_sessions_at_the_same_moment_keep_both(tmp_path, machine_load):
    _check_both_kept(*_two(tmp_path, 0.0))


def test_a_run_whose_processes_are_gone_is_replaced(tmp_path):
    body = script(tmp_path, """
    import sys, time, maxinstr
    maxinstr.session(sys.argv[1], sample_hz=0).start()
    with maxinstr.stage("old"):
        pass
    print("READY", flush=True)
    time.sleep(60)
    """)
    run_dir = tmp_path / "run"
    proc = start(body, str(run_dir))
    wait_for(proc, "READY")
    proc.kill()
    proc.wait()
    assert owners.live_writers(run_dir) == []  # killed: status "running", but nobody left
    with maxinstr.session(run_dir, sample_hz=0):
        with maxinstr.stage("new"):
            pass
    run = maxinstr.load(run_dir)
    assert run["name"].tolist() == ["new"] and [p["pid"] for p in run.parts] == [os.getpid()]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


DEAD = _dead_pid()
HERE = socket.gethostname()
NOW_NS = time.time_ns()

# (pid, started_unix_ns, host) -> alive?
WRITERS = st.sampled_from([
    ((os.getppid(), NOW_NS - 10**9, HERE), True),   # a live process (the test runner's parent)
    ((1, NOW_NS, HERE), True),                     # alive, started long before its part: fine
    ((1, 10**9, HERE), False),                     # pid 1 started after 1970-01-01 00:00:01: a reused pid
    ((DEAD, NOW_NS, HERE), False),                 # gone
    ((DEAD, NOW_NS, "other-host"), True),          # another host: cannot tell, kept
    ((os.getpid(), NOW_NS, HERE), False),          # this very process reopening its run
    (("x", NOW_NS, HERE), False),                  # damaged part.json
    ((-5, None, HERE), False),
])
STATUS = st.sampled_from(["running", "closed", "SIGTERM", None, 3])


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(meta=st.one_of(st.none(), st.tuples(WRITERS, STATUS)), parts=st.lists(st.tuples(WRITERS, STATUS), max_size=4),
       garbage=st.booleans())
def test_live_writers_is_every_running_part_of_a_live_process(tmp_path_factory, meta, parts, garbage):
    root = tmp_path_factory.mktemp("states")
    expected = set()
    if meta is not None:
        ((pid, started, host), alive), status = meta
        doc = {"format": fmt.FORMAT_NAME, "version": 1, "status": status, "pid": pid, "host": host,
               "clock": {"realtime_ns": started}}
        (root / fmt.META_FILE).write_text(json.dumps(doc))
        if status == "running" and alive:
            expected.add(repr(pid))
    for k, (((pid, started, host), alive), status) in enumerate(parts):
        part = root / fmt.PARTS_DIR / f"p{k}"
        part.mkdir(parents=True)
        doc = {"pid": pid, "host": host, "status": status, "started_unix_ns": started}
        (part / fmt.PART_FILE).write_text(json.dumps(doc))
        if status == "running" and alive:
            expected.add(repr(pid))
    if garbage:
        bad = root / fmt.PARTS_DIR / "zz"
        bad.mkdir(parents=True, exist_ok=True)
        (bad / fmt.PART_FILE).write_text("{not json")
    lines = owners.live_writers(root)
    assert len(lines) == len(expected), (lines, expected)
    for pid in expected:
        assert any(line.startswith(f"pid {pid.strip(chr(39))} ") for line in lines), (pid, lines)
