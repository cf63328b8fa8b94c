"""A run directory is data, never an order (issue 29, point 1): `maxinstr server window|stop`
and `maxinstr deep-dive` read a command or a process from a file that anyone may have written.
Nothing named there runs or is signalled unless the user typed it, confirmed it, or maxinstr
proved the process is the one it started."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from maxinstr.errors import MaxinstrError
from maxinstr.launch import server as srv

from _launch_helpers import base_env, run_cli

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def bystander():
    """An unrelated process in a process group of its own (what a planted pgid would name)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited: a server.json naming it names no one (never a
    made-up number, which could be someone's process group on a shared machine)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _payload(tmp_path: Path) -> tuple[Path, Path]:
    """A program that leaves a file behind when it runs, and that file."""
    marker = tmp_path / "payload-ran"
    prog = tmp_path / "payload.sh"
    prog.write_text(f"#!/bin/sh\necho \"$@\" > {marker}\n")
    prog.chmod(0o755)
    return prog, marker


def _server_json(run: Path, pid: int, **extra) -> None:
    run.mkdir(parents=True, exist_ok=True)
    state = {"run_dir": str(run), "pid": pid, "pgid": pid, "command": ["serve"], "launch_command": ["serve"],
             "profiler": "nsys", "session": "maxinstr-serve-1-2", "nsys": None, "windows": [], "log": str(run / "server.log")}
    state.update(extra)
    (run / "server.json").write_text(json.dumps(state))


def _alive(proc: subprocess.Popen) -> bool:
    time.sleep(0.3)  # a signal sent is delivered by now
    return proc.poll() is None


def test_server_stop_neither_runs_the_nsys_nor_signals_the_group_server_json_names(tmp_path, bystander):
    """The attack of the issue: server.json's "nsys" a script, its pid/pgid someone else's."""
    prog, marker = _payload(tmp_path)
    run = tmp_path / "run"
    _server_json(run, bystander.pid, nsys=str(prog))
    res = run_cli(["server", "stop", str(run)], base_env())
    assert res.returncode == 2
    assert not marker.exists()  # the planted "nsys" never ran
    assert _alive(bystander)  # and the named group got no signal
    assert len(res.stderr.strip().splitlines()) == 1 and "server.json" in res.stderr and "nothing was signalled" in res.stderr


def test_a_copied_start_time_does_not_make_a_process_the_server(tmp_path, bystander):
    """Everything /proc tells anyone (pid, group, start time, boot) copied into server.json: the
    process still lacks the token and run directory maxinstr gave its server, so it is not one."""
    run = tmp_path / "run"
    _server_json(run, bystander.pid, profiler="none", session=None, start_ticks=srv.process_start_ticks(bystander.pid),
                 boot_id=srv.boot_id(), token="0" * 32)
    res = run_cli(["server", "stop", str(run)], base_env())
    assert res.returncode == 2 and "does not hold this server's token" in res.stderr
    assert _alive(bystander)
    res = run_cli(["server", "window", str(run), "--duration", "0.1"], base_env())
    assert res.returncode == 2 and "no window was captured" in res.stderr


def test_a_reused_pid_is_not_signalled(tmp_path, script):
    """A server maxinstr really started, whose pid now names a process started at another time
    (what a reused pid looks like): refused; with the true start time, stopped."""
    server = script("server.py", "import time\nprint('ready', flush=True)\ntime.sleep(120)\n")
    run = tmp_path / "s"
    res = run_cli(["server", "start", "-o", str(run), "--profiler", "none", "--ready", "ready", "--",
                   sys.executable, str(server)], base_env())
    assert res.returncode == 0, res.stderr
    state = json.loads((run / "server.json").read_text())
    assert state["start_ticks"] == srv.process_start_ticks(state["pid"]) and len(state["token"]) == 32
    try:
        (run / "server.json").write_text(json.dumps({**state, "start_ticks": state["start_ticks"] + 1}))
        res = run_cli(["server", "stop", str(run)], base_env())
        assert res.returncode == 2 and "the pid was reused by another process" in res.stderr
        assert srv.process_start_ticks(state["pid"]) == state["start_ticks"]  # still running
        (run / "server.json").write_text(json.dumps(state))
        res = run_cli(["server", "stop", str(run)], base_env())
        assert res.returncode == 0, res.stderr
    finally:
        try:
            os.killpg(state["pgid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_server_json_names_another_run_directory_it_is_never_written(tmp_path, bystander):
    """The file's "run_dir" is not where maxinstr writes: the folder on the command line is."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    _server_json(run, bystander.pid, run_dir=str(elsewhere), profiler="none", session=None)
    state = srv.ServerState.load(run)
    assert state.run_dir == run.resolve()
    with pytest.raises(MaxinstrError):
        srv.profile_window(run, duration_s=0.1, echo=None)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("doc,problem", [
    ({"pid": "123"}, '"pid" is not a process id'),
    ({"pid": 0}, '"pid" is not a process id'),  # kill(0, ...) would signal our own group
    ({"pgid": -1}, '"pgid" is not a process group id'),
    ({"command": "rm -rf /"}, '"command" is not a list of strings'),
    ({"session": "x; rm -rf /"}, '"session" is not an nsys session name'),
    ({"profiler": "rocprofv3"}, '"profiler" is not "nsys" or "none"'),
    ({"windows": {"a": 1}}, '"windows" is not a list of objects'),
    ({"start_ticks": 1.5}, '"start_ticks" is not a count'),
    ({"log": None}, '"log" is not a path'),
    ({"run_dir": None}, '"run_dir" is not a path'),
])
def test_a_malformed_server_json_is_one_line(tmp_path, doc, problem, dead_pid):
    """Point 9: not KeyError / TypeError from inside maxinstr."""
    run = tmp_path / "run"
    _server_json(run, **{"pid": dead_pid, **doc})
    for verb in (["stop"], ["window", "--duration", "0.1"]):
        res = run_cli(["server", *verb, str(run)], base_env())
        assert res.returncode == 2, res.stderr
        line = res.stderr.strip()
        assert "\n" not in line and "server.json: unreadable server state" in line and problem in line, line


@pytest.mark.parametrize("text,problem", [
    ("[1]", "not a JSON object"), ("{", "not valid JSON"), ('{"pid": 1}', 'no "run_dir"'), ("[" * 100 + "]" * 100, "nested"),
])
def test_server_json_that_is_no_state_is_one_line(tmp_path, text, problem):
    run = tmp_path / "run"
    run.mkdir()
    (run / "server.json").write_text(text)
    res = run_cli(["server", "stop", str(run)], base_env())
    assert res.returncode == 2 and problem in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_server_json_that_is_a_fifo_does_not_hang(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "server.json")
    res = run_cli(["server", "stop", str(run)], base_env(), timeout=30)
    assert res.returncode == 2 and "FIFO" in res.stderr


# -- deep-dive: a command from a file is shown, then confirmed ---------------------------------

def _recorded_run(tmp_path: Path, command: list[str], specs: list[str] | None = None) -> Path:
    """A run directory whose launch.json names ``command`` and whose trace is a real nsys one."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "profile.sqlite").write_bytes((DATA / "nsys" / "h200_decode.sqlite").read_bytes())
    (run / "meta.json").write_text(json.dumps({"format": "maxinstr-run", "version": 1, "status": "closed"}))
    (run / "launch.json").write_text(json.dumps({
        "command": command, "stage_specs": specs or [],
        "profiler": {"name": "nsys", "capture": "all"},
        "artifact": {"files": {"trace": str(run / "profile.sqlite")}},
    }))
    return run


def test_a_trace_a_run_names_outside_itself_is_not_read(tmp_path):
    """meta.json's profiler.trace naming a file elsewhere: `report` neither reads it nor runs
    `nsys export` beside it (a copied run would write next to a file the user never named)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim.nsys-rep").write_bytes(b"not yours")
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"format": "maxinstr-run", "version": 1, "status": "closed",
                                               "profiler": {"name": "nsys", "trace": str(elsewhere / "victim.nsys-rep")}}))
    res = run_cli(["report", str(run)], base_env(FAKE_NSYS_LOG=str(tmp_path / "nsys.jsonl")))
    assert res.returncode == 0, res.stderr
    assert "outside the run directory: not read (give --trace to use it)" in res.stdout
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim.nsys-rep"]  # nothing exported beside it
    assert not (tmp_path / "nsys.jsonl").exists()


def test_deep_dive_does_not_run_a_recorded_command_unconfirmed(tmp_path):
    prog, marker = _payload(tmp_path)
    run = _recorded_run(tmp_path, [str(prog), "--pwn\x1b[2J"], specs=["evil:payload"])
    env = base_env(FAKE_NCU_LOG=str(tmp_path / "ncu.jsonl"))
    res = run_cli(["deep-dive", str(run), "--kernel", "nvjet"], env)
    assert res.returncode == 2, res.stderr
    assert not marker.exists() and not (tmp_path / "ncu.jsonl").exists()  # neither ncu nor the program ran
    assert not (run / "deep-dive").exists()
    assert f"comes from {run / 'launch.json'}" in res.stderr
    assert "--pwn\\x1b[2J" in res.stderr and "\x1b" not in res.stderr  # shown, escapes and all, never sent raw
    assert "--stage evil:payload" in res.stderr
    assert "give --yes to run it, or the command to run after --" in res.stderr.strip().splitlines()[-1]


def test_deep_dive_runs_a_recorded_command_with_yes_or_a_typed_one(tmp_path):
    prog, marker = _payload(tmp_path)
    run = _recorded_run(tmp_path, [str(prog), "recorded"])
    env = base_env(FAKE_NCU_LOG=str(tmp_path / "ncu.jsonl"), FAKE_NCU_PROFILE="memory")
    res = run_cli(["deep-dive", str(run), "--kernel", "nvjet", "--yes"], env)
    assert res.returncode == 0, res.stderr
    argv = [json.loads(x)["argv"] for x in (tmp_path / "ncu.jsonl").read_text().splitlines()]
    assert [str(prog), "recorded"] == next(a for a in argv if a[0] not in ("--import", "--version"))[-2:]
    # a command typed after -- is the user's own: no question
    res = run_cli(["deep-dive", str(run), "--kernel", "nvjet", "--", str(prog), "typed"], env)
    assert res.returncode == 0, res.stderr
    assert "comes from" not in res.stderr


def test_deep_dive_from_a_report_json_confirms_its_runs_command_too(tmp_path):
    """A report JSON's sources.run points at a run directory whose launch.json names a program."""
    prog, marker = _payload(tmp_path)
    run = _recorded_run(tmp_path, [str(prog)])
    report = tmp_path / "report.json"
    res = run_cli(["report", str(DATA / "nsys" / "h200_decode.sqlite"), "--format", "json", "-o", str(report)], base_env())
    assert res.returncode == 0, res.stderr
    doc = json.loads(report.read_text())
    doc["sources"]["run"] = str(run)
    report.write_text(json.dumps(doc))
    res = run_cli(["deep-dive", str(report), "--kernel", "nvjet"], base_env(FAKE_NCU_LOG=str(tmp_path / "ncu.jsonl")))
    assert res.returncode == 2 and "comes from" in res.stderr and not marker.exists()


@pytest.mark.parametrize("launch,problem", [
    ([1], "not a JSON object"),
    ({"command": "sh -c x"}, '"command" is not a list of strings'),
    ({"command": ["a"], "stage_specs": "m:f"}, '"stage_specs" is not a list of strings'),
    ({"command": ["a"], "profiler": "nsys"}, '"profiler" is not an object'),
    ({"command": ["a"], "env": {"MAXINSTR_WARMUP": 3}}, '"env" is not an object of strings'),
])
def test_a_malformed_launch_json_is_one_line(tmp_path, launch, problem):
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"format": "maxinstr-run", "version": 1, "status": "closed"}))
    (run / "launch.json").write_text(json.dumps(launch))
    res = run_cli(["deep-dive", str(run), "--kernel", "x"], base_env())
    assert res.returncode == 2 and problem in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
