"""Presets of --stage wrap points (launch/presets.py) and what stands in the way of MAX's own
commands, without MAX: which commands get the max preset by themselves, the @hook specs, the
environment a preset sets, a program that re-executes itself with os.execve (as `max` does for
jemalloc), and a spawn worker started with another PYTHONEXECUTABLE (as Mojo's runtime leaves
for `max serve`'s model worker). The same, with MAX itself: tests/examples/test_max_pipelines.py."""

from __future__ import annotations

import asyncio
import json
import sys
import threading

import numpy as np
import pytest

import maxinstr
from maxinstr.errors import MaxinstrError
from maxinstr.integrations.max_pipeline import WRAP_POINTS, is_max_command
from maxinstr.launch import instrument, presets, runner
from maxinstr.launch.instrument import parse_spec

from _launch_helpers import base_env, run_cli


@pytest.mark.parametrize("cmd, expected", [
    (["max", "generate", "--model-path", "m"], True),
    (["/opt/venv/bin/max", "serve"], True),
    (["python", "-m", "max.entrypoints.pipelines", "generate"], True),
    (["python3", "-u", "-m", "max._entrypoints.pipelines", "serve"], True),
    (["python", "-mmax.entrypoints.pipelines"], True),
    (["python", "examples/max_block.py"], False),  # the user's own MAX script: --preset max by name
    (["python", "-m", "maxinstr.launch.bootstrap", "max"], False),
    (["python", "-m", "maximal"], False),
    (["maxima"], False),
    ([], False),
])
def test_which_commands_are_max_s(cmd, expected):
    assert is_max_command(cmd) is expected
    assert presets.auto_presets(cmd) == (["max"] if expected else [])


def test_every_preset_spec_parses_and_names_a_known_hook():
    for point in WRAP_POINTS:
        spec = parse_spec(point.spec)
        assert spec.text == point.spec
        if spec.name.startswith("@"):
            assert spec.name[1:] in instrument.HOOKS, point.spec
    with pytest.raises(MaxinstrError, match=r"no hook '@nope' \(maxinstr's hooks: @max-arrival, @max-model"):
        parse_spec("mod:f=@nope")
    with pytest.raises(MaxinstrError, match="no such preset"):
        presets.preset("torch")


def test_the_preset_sets_max_telemetry_off_unless_the_user_set_it(tmp_path, monkeypatch):
    spec = runner.RunSpec(command=["max", "serve"], run_dir=tmp_path)
    opts = runner.RunOptions(presets=["max"], stage_specs=["mod:f=g"])
    monkeypatch.delenv("MAX_SERVE_DISABLE_TELEMETRY", raising=False)
    env = runner.child_env(spec, opts, tmp_path, base={})
    assert env["MAX_SERVE_DISABLE_TELEMETRY"] == "1"
    # the preset's specs first, then the user's: every process applies all of them
    assert env["MAXINSTR_STAGES"].split("\n") == [p.spec for p in WRAP_POINTS] + ["mod:f=g"]
    env = runner.child_env(spec, opts, tmp_path, base={"MAX_SERVE_DISABLE_TELEMETRY": "0"})
    assert env["MAX_SERVE_DISABLE_TELEMETRY"] == "0"
    assert "MAX_SERVE_DISABLE_TELEMETRY" not in runner.child_env(spec, runner.RunOptions(), tmp_path, base={})


def test_run_applies_max_by_itself_and_not_with_no_preset(tmp_path, script):
    # a program called `max` (MAX's CLI is named so): a stand-in that prints how many specs it got
    prog = script("max", f"#!{sys.executable}\nimport os\nprint('STAGES', len(os.environ.get('MAXINSTR_STAGES', '').split()))\n")
    prog.chmod(0o755)
    fake_max = [sys.executable, "-m", "max.entrypoints.pipelines"]  # no MAX here: the command fails, the plan stands
    res = run_cli(["run", "--profiler", "none", "--no-report", "-y", "-o", str(tmp_path / "a"), "--", str(prog)], base_env())
    assert f"preset max: {len(WRAP_POINTS)} wrap points in MAX 26.7's pipelines" in res.stderr
    assert f"STAGES {len(WRAP_POINTS)}" in res.stdout
    launch = json.loads((tmp_path / "a" / "launch.json").read_text())
    assert launch["presets"] == ["max"] and launch["env"]["MAX_SERVE_DISABLE_TELEMETRY"] == "1"
    # a MAX program that never imported those modules: each spec is said never applied, once
    assert res.stderr.count("no process of the run imported max.") == len(WRAP_POINTS)
    res = run_cli(["run", "--profiler", "none", "--no-report", "--no-preset", "-y", "-o", str(tmp_path / "b"), "--",
                   str(prog)], base_env())
    assert "preset max" not in res.stderr and "STAGES 0" in res.stdout
    res = run_cli(["run", "--profiler", "none", "--preset", "vllm", "-o", str(tmp_path / "c"), "--", *fake_max], base_env())
    assert res.returncode == 2 and "--preset 'vllm': no such preset (known: max)" in res.stderr
    assert not (tmp_path / "c").exists()


REEXEC = """
import json, os, sys
# as max/_entrypoints/allocator.py: replace this process by one with LD_PRELOAD set, same argv
if "REEXEC_DONE" not in os.environ:
    os.execve(sys.executable, sys.orig_argv, dict(os.environ, REEXEC_DONE="1"))
for i in range(3):
    json.dumps({"i": i})
print("after exec", os.getpid(), flush=True)
"""


def test_the_start_up_hook_survives_a_self_execve(tmp_path, script):
    prog = script("reexec.py", REEXEC)
    out = tmp_path / "run"
    res = run_cli(["run", "--profiler", "none", "-y", "--stage", "json:dumps=dumps", "-o", str(out), "--",
                   sys.executable, str(prog)], base_env())
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout.split("after exec ")[1].split()[0])
    run = maxinstr.load(out)
    assert list(run.stage_names()) == ["dumps"] * 3
    assert [p["pid"] for p in run.parts] == [pid] and run.parts[0]["status"] == "exit"
    assert "never applied" not in res.stderr and "dumps" in res.stdout  # the report printed


SPAWN_ELSEWHERE = """
import json, multiprocessing, os, sys

def child(q):
    json.dumps({"in": "child"})
    q.put((os.getpid(), sys.executable))

if __name__ == "__main__":
    # what Mojo's runtime leaves in MAX's process: a PYTHONEXECUTABLE naming another interpreter,
    # so a spawned child starts with that one's sys.prefix (the venv's site-packages missing)
    os.environ["PYTHONEXECUTABLE"] = sys.argv[1]
    q = multiprocessing.get_context("spawn").Queue()
    p = multiprocessing.get_context("spawn").Process(target=child, args=(q,))
    p.start()
    pid, exe = q.get(timeout=60)
    p.join()
    print("CHILD", pid, exe, flush=True)
"""


def test_a_spawn_worker_with_another_pythonexecutable_is_instrumented(tmp_path, script):
    prog = script("spawner.py", SPAWN_ELSEWHERE)
    out = tmp_path / "run"
    elsewhere = str(tmp_path / "bin" / "python3")  # a path outside any venv
    res = run_cli(["run", "--profiler", "none", "-y", "--no-report", "--stage", "json:dumps=dumps", "-o", str(out), "--",
                   sys.executable, str(prog), elsewhere], base_env(), timeout=120)
    assert res.returncode == 0, res.stderr
    _, pid, exe = next(line for line in res.stdout.splitlines() if line.startswith("CHILD")).split()
    assert exe == elsewhere  # the child did start with the other interpreter's identity
    assert "not importable" not in res.stderr
    run = maxinstr.load(out)
    assert int(pid) in [p["pid"] for p in run.parts] and list(run.stage_names()) == ["dumps"]


# The hooks, on functions shaped as MAX 26.7's (their MAX originals: tests/examples/test_max_pipelines.py).


def test_max_tokenize_stages_each_call_on_the_pool_thread_never_nested(tmp_path):
    from functools import partial

    async def run_with_default_executor(fn, *args, **kwargs):  # max/pipelines/lib/tokenizer.py's, as in 26.7
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, partial(fn, *args, **kwargs))

    wrapped = instrument.max_tokenize(run_with_default_executor)
    barrier = threading.Barrier(4)

    def encode(text):
        barrier.wait(timeout=30)  # all four in the pool at once: concurrent requests
        return [ord(c) for c in text]

    async def requests():
        return await asyncio.gather(*(wrapped(encode, t) for t in ("ab", "cd", "ef", "gh")))

    with maxinstr.session(tmp_path / "run"):
        out = asyncio.run(requests())
    assert out == [[97, 98], [99, 100], [101, 102], [103, 104]]
    run = maxinstr.load(tmp_path / "run")
    assert list(run.stage_names()) == ["tokenize"] * 4
    assert (run.stages["depth"] == 0).all() and len(np.unique(run.stages["tid"])) == 4
    with pytest.raises(MaxinstrError, match="not a coroutine function"):
        instrument.max_tokenize(encode)


def test_a_run_s_recorded_specs_give_back_its_presets_and_its_own_specs():
    max_specs = list(presets.preset("max").specs)
    launch = {"presets": ["max"], "stage_specs": [*max_specs, "mod:f=g"]}
    assert presets.recorded_specs(launch) == (["mod:f=g"], ["max"])
    # a run without the preset (--no-preset): its specs stay as they were, no preset comes back
    assert presets.recorded_specs({"presets": ["max"], "stage_specs": ["mod:f=g"]}) == (["mod:f=g"], [])
    assert presets.recorded_specs({"stage_specs": None, "presets": ["nope", 3]}) == ([], [])
