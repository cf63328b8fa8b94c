"""`maxinstr run` used wrongly or unluckily (issue 20's CLI sweep): a bad option, a bad -o or a
command that cannot start stops with one line and leaves nothing; a --stage spec no process applies
is said; the run records the `maxinstr run` command that makes it again, and the report's
suggestions quote it. Real child processes; no GPU needed."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from _launch_helpers import base_env, run_cli

ENGINE = "import time\nclass Engine:\n    def step(self):\n        time.sleep(0.0005)\n"
PLAIN = """
    import sys
    sys.path.insert(0, sys.argv[1])
    from engine import Engine
    e = Engine()
    for _ in range(6):
        e.step()
"""


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


# -- nothing starts on a bad option, -o or command ---------------------------------------------
def test_a_bad_number_is_refused_before_anything_starts(tmp_path, script):
    marker = tmp_path / "started"
    prog = script("touch.py", f"open({str(marker)!r}, 'w').write('x')\n")
    for args in (["--warmup", "-1"], ["--repeat", "0"], ["--timeout", "0"], ["--window", "nan"]):
        res = run_cli(["run", *args, "-y", "--", sys.executable, str(prog)], base_env(), cwd=str(tmp_path))
        assert res.returncode == 2, (args, res.stderr)
        assert f"Invalid value for '{args[0]}'" in res.stderr
    assert not marker.exists() and not (tmp_path / "runs").exists()


def test_a_warmup_variable_out_of_range_says_it_is_ignored():
    """MAXINSTR_WARMUP set by hand (maxinstr run never passes a bad one now): the warning says what
    happens, never that a default of -1 is used."""
    from maxinstr import config

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert config.warmup_instances({"MAXINSTR_WARMUP": "-1"}) is None
        assert config.warmup_instances({"MAXINSTR_WARMUP": "3"}) == 3
    (said,) = [str(w.message) for w in seen]
    assert said == "maxinstr: MAXINSTR_WARMUP='-1' is not a whole number >= 0; it is ignored, as if unset"


@pytest.mark.parametrize("layout", ["a file", "inside a file", "inside a file, repeats", "a broken link"])
def test_an_out_that_cannot_be_a_run_directory_is_one_line(tmp_path, script, layout):
    marker = tmp_path / "started"
    prog = script("prog.py", f"open({str(marker)!r}, 'w').write('x')\n")
    before = prog.read_bytes()
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    out, extra, named = {
        "a file": (prog, [], prog),
        "inside a file": (prog / "sub", [], prog),
        "inside a file, repeats": (prog / "sub", ["--repeat", "2"], prog),
        "a broken link": (link, [], link),
    }[layout]
    res = run_cli(["run", "-y", "-o", str(out), *extra, "--", sys.executable, str(prog)], base_env(), cwd=str(tmp_path))
    assert res.returncode == 2
    line = _one_line(res.stderr)
    assert line.startswith(f"maxinstr: -o {out}: {named} ") and line.endswith("nothing was started"), line
    assert prog.read_bytes() == before and not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "prog.py"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_out_in_a_folder_it_cannot_write_is_one_line(tmp_path, script):
    prog = script("prog.py", "print(1)\n")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    res = run_cli(["run", "-y", "-o", str(locked / "r"), "--", sys.executable, str(prog)], base_env())
    assert res.returncode == 2 and "permission denied" in _one_line(res.stderr)


def test_a_command_that_cannot_start_leaves_nothing(tmp_path, script):
    for cmd in (["nosuchcommand-for-maxinstr"], ["./prog.py"]):  # not on PATH; a file that is not executable
        script("prog.py", "print(1)\n")
        res = run_cli(["run", "-y", "--", *cmd], base_env(), cwd=str(tmp_path))
        assert res.returncode == 2
        line = _one_line(res.stderr)
        assert line.startswith(f"maxinstr: {cmd[0]}: ") and "nothing was started" in line
        assert not (tmp_path / "runs").exists()


def test_a_previous_run_is_kept_when_the_new_command_cannot_start(tmp_path, script):
    pytest.importorskip("maxinstr.record")
    prog = script("ok.py", "import maxinstr\nwith maxinstr.stage('s'):\n    pass\n")
    out = tmp_path / "r"
    assert run_cli(["run", "-y", "--no-report", "--profiler", "none", "-o", str(out), "--", sys.executable, str(prog)],
                   base_env()).returncode == 0
    before = sorted(p.name for p in out.iterdir())
    res = run_cli(["run", "-y", "-o", str(out), "--", "nosuchcommand-for-maxinstr"], base_env())
    assert res.returncode == 2 and "nothing was started" in res.stderr
    assert sorted(p.name for p in out.iterdir()) == before and "meta.json" in before


@pytest.mark.parametrize("warm_run", [False, True])
def test_a_command_that_fails_to_exec_takes_back_what_the_run_made(tmp_path, warm_run):
    """A file that is executable but whose interpreter does not exist passes every check and fails
    only in exec: the folders and empty logs the run made are removed, and it says so."""
    prog = tmp_path / "prog"
    prog.write_text("#!/nonexistent/interpreter\n")
    prog.chmod(0o755)
    out = tmp_path / "made" / "r"
    res = run_cli(["run", "-y", "--profiler", "none", "-o", str(out), *(["--warm-run"] if warm_run else []),
                   "--", str(prog)], base_env())
    assert res.returncode == 2
    assert f"maxinstr: {prog}: command not found; nothing was started" in res.stderr
    assert not (tmp_path / "made").exists()


def test_server_and_deep_dive_check_their_out_and_command_the_same_way(tmp_path, script):
    prog = script("prog.py", "print(1)\n")
    res = run_cli(["server", "start", "--profiler", "none", "-o", str(prog), "--", sys.executable, "-c", "pass"], base_env())
    assert res.returncode == 2 and _one_line(res.stderr) == f"maxinstr: -o {prog}: {prog} is a file, not a directory; nothing was started"
    out = tmp_path / "serve"
    res = run_cli(["server", "start", "--profiler", "none", "-o", str(out), "--", "nosuchcommand-for-maxinstr"], base_env())
    assert res.returncode == 2 and "nosuchcommand-for-maxinstr: command not found" in _one_line(res.stderr)
    assert not out.exists()
    run = str(Path(__file__).resolve().parents[1] / "data" / "max" / "block_run")
    res = run_cli(["deep-dive", run, "--stage", "forward", "-o", str(prog), "--dry-run"], base_env())
    assert res.returncode == 2 and f"maxinstr: -o {prog}: {prog} is a file, not a directory" in res.stderr


def test_execute_turns_a_folder_it_cannot_make_into_one_line(tmp_path):
    from maxinstr.errors import MaxinstrError
    from maxinstr.launch import runner

    (tmp_path / "f").write_text("x")
    spec = runner.RunSpec(command=[sys.executable, "-c", "pass"], run_dir=tmp_path / "f" / "r")
    with pytest.raises(MaxinstrError, match=r"/f/r: cannot make the run directory \(Not a directory\)"):
        runner.execute(spec, runner.RunOptions(echo=None))


# -- the command that makes the run again ----------------------------------------------------
def _stage_counts(run_dir: Path) -> dict[str, int]:
    import numpy as np

    import maxinstr

    names, counts = np.unique(maxinstr.load(run_dir)["name"].astype(str), return_counts=True)
    return dict(zip(names.tolist(), counts.tolist()))


def test_the_report_suggests_the_command_that_records_the_run_again(tmp_path, script):
    pytest.importorskip("maxinstr.record")
    (tmp_path / "engine.py").write_text(ENGINE)
    prog = script("plain.py", PLAIN)
    out = tmp_path / "r1"
    program = [sys.executable, str(prog), str(tmp_path)]
    res = run_cli(["run", "-y", "-q", "--no-report", "--profiler", "none", "--warmup", "1",
                   "--stage", "engine:Engine.step=step", "-o", str(out), "--", *program], base_env())
    assert res.returncode == 0, res.stderr
    expected = ["maxinstr", "run", "--profiler", "none", "--warmup", "1", "--stage", "engine:Engine.step=step",
                "--", *program]
    assert json.loads((out / "launch.json").read_text())["maxinstr_command"] == expected
    assert json.loads((out / "meta.json").read_text())["maxinstr_command"] == expected
    rep = run_cli(["report", str(out), "--format", "json", "--quiet"], base_env())
    assert rep.returncode == 0, rep.stderr
    (finding,) = [f for f in json.loads(rep.stdout)["diagnosis"] if f["id"] in ("no_gpu_data", "no_kernels")]
    # it asks for a profiler's kernels: the run's --profiler none is left out, the rest kept
    assert finding["command"] == shlex.join([w for w in expected if w not in ("--profiler", "none")])
    # the Reproduce section quotes the maxinstr run command as it was (not only the program)
    assert {"what": "the run, as maxinstr run made it", "command": shlex.join(expected)} in json.loads(rep.stdout)["reproduce"]
    # and, copied, it records what the run recorded
    again = shlex.split(finding["command"])
    assert again[:2] == ["maxinstr", "run"]
    out2 = tmp_path / "r2"
    res = run_cli(["run", "-y", "-q", "--no-report", "-o", str(out2), *again[2:]], base_env())
    assert res.returncode == 0, res.stderr
    assert _stage_counts(out2) == _stage_counts(out) == {"step": 6}


def test_the_rerun_command_is_one_run_of_a_plan(tmp_path):
    """A run of a --sweep/--repeat plan records the command for itself: its own sweep value, the
    program without the swept flag, no --repeat; no -o (a rerun never replaces it)."""
    from maxinstr.launch import runner

    cmd = ["python", "decode.py"]
    options = runner.RunOptions(rerun_args=["--warmup", "2"])
    specs = runner.plan_runs(cmd, tmp_path, repeat=2, sweep="BATCH=1,8")
    assert [runner.rerun_command(s, options) for s in specs if s.label == "BATCH=8.r2"] == [
        ["maxinstr", "run", "--warmup", "2", "--sweep=BATCH=8", "--", "python", "decode.py"]]
    (flagged,) = [s for s in runner.plan_runs(cmd, tmp_path, sweep="--batch-size=1,8") if s.label == "batch-size=8"]
    assert flagged.command == [*cmd, "--batch-size", "8"]
    assert runner.rerun_command(flagged, options) == ["maxinstr", "run", "--warmup", "2", "--sweep=--batch-size=8",
                                                      "--", *cmd]
    assert runner.rerun_command(flagged, runner.RunOptions()) is None  # not planned from a command line


def test_rerun_args_are_the_options_given_less_where_and_how_it_was_shown():
    from maxinstr.cli.run import command, rerun_args

    ctx = command.make_context("run", ["-o", "x", "-y", "-q", "--no-report", "--repeat", "3", "--sweep", "B=1,2",
                                       "--stage", "m:f", "--stage", "m:g=x", "--window", "4", "--osrt",
                                       "--profiler-arg", "--trace-fork-before-exec=true", "--fatal", "-x-", "--timeout", "60",
                                       "--", "python", "p.py"])
    assert rerun_args(ctx) == ["--window", "4.0", "--osrt", "--stage", "m:f", "--stage", "m:g=x", "--timeout", "60.0",
                               "--fatal=-x-", "--profiler-arg=--trace-fork-before-exec=true"]
    assert rerun_args(command.make_context("run", ["--", "python", "p.py"])) == []  # defaults are not repeated


# -- --stage specs no process applied ---------------------------------------------------------
def test_specs_no_process_applied_are_said_in_launch_json_stderr_and_the_report(tmp_path, script):
    """Applied in the program, in a Python subprocess only, in a fork child only (which ends with
    os._exit): applied. Never imported, or failing to apply: said once on stderr, in launch.json
    and in the report's notes."""
    pytest.importorskip("maxinstr.record")
    (tmp_path / "engine.py").write_text(ENGINE)
    (tmp_path / "helper.py").write_text("def f():\n    return 1\n")
    (tmp_path / "forked.py").write_text("def g():\n    return 2\n")
    prog = script("multi.py", """
        import os, subprocess, sys
        sys.path.insert(0, sys.argv[1])
        from engine import Engine
        Engine().step()
        subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import helper; helper.f()",
                        sys.argv[1]], check=True)
        pid = os.fork()
        if pid == 0:
            import forked
            forked.g()
            os._exit(0)
        os.waitpid(pid, 0)
    """)
    out = tmp_path / "r"
    specs = ["engine:Engine.step=step", "helper:f", "forked:g", "nomod:f", "engine:Engine.nope"]
    res = run_cli(["run", "-y", "-q", "--no-report", "--profiler", "none", "-o", str(out),
                   *[w for s in specs for w in ("--stage", s)], "--", sys.executable, str(prog), str(tmp_path)], base_env())
    assert res.returncode == 0, res.stderr
    unapplied = json.loads((out / "launch.json").read_text())["stage_specs_unapplied"]
    assert unapplied == {"nomod:f": "no process of the run imported nomod", "engine:Engine.nope": "engine has no Engine.nope"}
    said = [ln for ln in res.stderr.splitlines() if "never applied" in ln]
    assert said == ["maxinstr: never applied: --stage nomod:f (no process of the run imported nomod); "
                    "--stage engine:Engine.nope (engine has no Engine.nope)"]
    rep = run_cli(["report", str(out), "--format", "json", "--quiet"], base_env())
    notes = json.loads(rep.stdout)["sources"]["notes"]
    assert "recorded warning: --stage nomod:f was never applied: no process of the run imported nomod" in notes
    assert "recorded warning: --stage engine:Engine.nope was never applied: engine has no Engine.nope" in notes
    assert not any("helper:f" in n or "forked:g" in n for n in notes)


def test_a_spec_applied_by_a_process_later_killed_counts_as_applied(tmp_path, script):
    """Each process says what it applied as it applies it: a SIGKILL later takes none of it back."""
    pytest.importorskip("maxinstr.record")
    (tmp_path / "engine.py").write_text(ENGINE)
    prog = script("killed.py", """
        import os, signal, sys
        sys.path.insert(0, sys.argv[1])
        from engine import Engine
        Engine().step()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = tmp_path / "r"
    res = run_cli(["run", "-y", "-q", "--no-report", "--profiler", "none", "-o", str(out), "--stage",
                   "engine:Engine.step", "--", sys.executable, str(prog), str(tmp_path)], base_env())
    assert res.returncode == 1  # the program died
    assert json.loads((out / "launch.json").read_text())["stage_specs_unapplied"] == {}
    assert "never applied" not in res.stderr


def test_a_program_that_is_not_python_applies_no_spec(tmp_path):
    out = tmp_path / "r"
    res = run_cli(["run", "-y", "-q", "--no-report", "--profiler", "none", "-o", str(out), "--stage", "m:f",
                   "--", "true"], base_env())
    assert res.returncode == 0, res.stderr
    (why,) = json.loads((out / "launch.json").read_text())["stage_specs_unapplied"].values()
    assert why.startswith("no process of the run imported m or recorded anything")


def test_the_module_form_says_a_spec_the_program_never_imported(tmp_path, script):
    pytest.importorskip("maxinstr.record")
    prog = script("main.py", "print('ran')\n")
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "maxinstr.launch.bootstrap", "--stage", "nomod:f", "-o", str(out), str(prog)],
                         env=base_env(), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and res.stdout == "ran\n", res.stderr
    assert "maxinstr: never applied: --stage nomod:f (no process of the run imported nomod)" in res.stderr
    events = [json.loads(ln) for p in (out / "parts").iterdir() for ln in (p / "events.jsonl").read_text().splitlines()]
    assert any(e["message"] == "--stage nomod:f was never applied: no process of the run imported nomod" for e in events)
