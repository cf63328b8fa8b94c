"""`maxinstr run`'s start-up hook leaves the program as it would be without maxinstr until the
program asks for maxinstr (imports it, or imports a --stage target): no module beyond bare
Python's (numpy above all: a script that pins BLAS threads before `import numpy` must keep
that), no thread, no signal handler, no environment change, no native core (so no GPU call).
Each check runs the same probe bare and under `maxinstr run` and compares."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _launch_helpers import base_env, run_cli

# What the program can see of its own process, printed as JSON as its first act. It imports
# nothing itself before reading sys.modules (json and signal are imported after that read).
PROBE = """\
import os, sys
mods = sorted(sys.modules)
threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
import json, signal
handlers = {n: str(signal.getsignal(getattr(signal, n))) for n in ("SIGINT", "SIGTERM", "SIGCHLD", "SIGUSR1", "SIGUSR2")}
print(json.dumps({"modules": mods, "threads": threads, "handlers": handlers, "env": sorted(os.environ),
                  "meta_path": [type(f).__name__ for f in sys.meta_path]}))
"""


def _bare(script, env) -> dict:
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _under_run(script, env, out_dir, *extra: str) -> dict:
    res = run_cli(["run", "-y", "-q", "--no-report", "--profiler", "none", "-o", str(out_dir), *extra, "--",
                   sys.executable, str(script)], env)
    assert res.returncode == 0, res.stderr
    return json.loads((out_dir / "child.log").read_text().splitlines()[0])


@pytest.mark.parametrize("stage", [[], ["--stage", "some_module_never_imported:f"]])
def test_the_hook_is_unseen_until_asked(tmp_path, script, stage):
    probe = script("probe.py", PROBE)
    env = base_env()
    bare = _bare(probe, env)
    seen = _under_run(probe, env, tmp_path / "run", *stage)
    extra = sorted(set(seen["modules"]) - set(bare["modules"]))
    # the one module that differs is the hook itself, bare Python has no sitecustomize
    assert extra == ["sitecustomize"], extra
    assert "numpy" not in seen["modules"] and not any(m.startswith("maxinstr") for m in seen["modules"])
    assert seen["threads"] == bare["threads"]
    assert seen["handlers"] == bare["handlers"]
    # the environment differs by what `maxinstr run` hands the child, nothing the hook adds
    added = set(seen["env"]) - set(bare["env"])
    assert added <= {"MAXINSTR_RUN_DIR", "MAXINSTR_RUN_SAMPLED", "MAXINSTR_STAGES", "MAXINSTR_CAPTURE",
                     "MAXINSTR_CAPTURE_WINDOW_S"}, added
    assert seen["meta_path"] == ["_MaxinstrTrigger", *bare["meta_path"]]


def test_a_script_that_pins_blas_threads_before_numpy_keeps_it(tmp_path, script):
    """The case a user met: OPENBLAS_NUM_THREADS set before `import numpy` was lost under
    `maxinstr run` because the hook had imported numpy already."""
    pytest.importorskip("numpy")
    prog = script("pin.py", """\
        import os, sys
        before = "numpy" in sys.modules
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        import numpy
        print(before)
        """)
    res = run_cli(["run", "-y", "-q", "--no-report", "--profiler", "none", "-o", str(tmp_path / "r"), "--",
                   sys.executable, str(prog)], base_env())
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "r" / "child.log").read_text().splitlines()[0] == "False"


def test_importing_maxinstr_opens_the_run(tmp_path, script):
    prog = script("marked.py", """\
        import maxinstr
        with maxinstr.stage("work"):
            pass
        """)
    out = tmp_path / "r"
    res = run_cli(["run", "-y", "-q", "--no-report", "--profiler", "none", "-o", str(out), "--",
                   sys.executable, str(prog)], base_env())
    assert res.returncode == 0, res.stderr
    run = __import__("maxinstr").load(out)
    assert [str(n) for n in run.stage_names()] == ["work"]
    assert json.loads((out / "meta.json").read_text())["pid"] is not None  # the program's session wrote it


def test_a_stage_target_starts_maxinstr_at_its_import(tmp_path, script):
    (tmp_path / "work_mod.py").write_text("import sys\nLOADS = getattr(sys, '_work_mod_loads', 0) + 1\n"
                                          "sys._work_mod_loads = LOADS\n\ndef step():\n    return 1\n")
    prog = script("main.py", """\
        import sys
        print("maxinstr" in sys.modules)
        import work_mod
        for _ in range(3):
            work_mod.step()
        print(work_mod.LOADS, work_mod.__spec__.name, type(work_mod.__loader__).__name__)
        """)
    out = tmp_path / "r"
    res = run_cli(["run", "-y", "-q", "--no-report", "--profiler", "none", "-o", str(out), "--stage",
                   "work_mod:step=step", "--", sys.executable, str(prog)], base_env(), cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    lines = (out / "child.log").read_text().splitlines()
    assert lines[:2] == ["False", "1 work_mod SourceFileLoader"], lines  # run once, its own loader
    run = __import__("maxinstr").load(out)
    assert [str(n) for n in run.stage_names()].count("step") == 3


def test_a_target_that_starting_maxinstr_imports_runs_once(tmp_path, script):
    """A target in a module that maxinstr imports itself while starting (numpy): the program's
    import that fired the hook gets that one module, executed once, with its own spec."""
    np = pytest.importorskip("numpy")
    prog = script("main.py", """\
        import numpy, sys
        print(numpy.__spec__.name, numpy.__spec__.origin, type(numpy.__loader__).__name__, numpy is sys.modules["numpy"])
        numpy.array_equal([1], [1])
        numpy.array_equal([1], [2])
        """)
    out = tmp_path / "r"
    res = run_cli(["run", "-y", "-q", "--no-report", "--profiler", "none", "-o", str(out), "--stage",
                   "numpy:array_equal=eq", "--", sys.executable, str(prog)], base_env())
    assert res.returncode == 0, res.stderr
    line = (out / "child.log").read_text().splitlines()[0]
    assert line == f"numpy {np.__spec__.origin} SourceFileLoader True", line
    run = __import__("maxinstr").load(out)
    assert [str(n) for n in run.stage_names()].count("eq") == 2


def test_a_program_that_never_asks_still_gets_a_run(tmp_path, script):
    """No maxinstr import, no target: `maxinstr run` writes the run's meta.json and samples from
    its own process, so the report still answers "is my GPU used"."""
    prog = script("plain.py", "print('ran')\n")
    out = tmp_path / "r"
    res = run_cli(["run", "-y", "-q", "--no-report", "--profiler", "none", "-o", str(out), "--",
                   sys.executable, str(prog)], base_env())
    assert res.returncode == 0, res.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["command"] == [sys.executable, str(prog)] and meta["status"] == "closed"
    assert (out / "parts" / "sampler" / "samples.json").exists()
    run = __import__("maxinstr").load(out)
    assert run.parts == [] and "sampler" in run.samples  # samples of the run, no process part
    res = run_cli(["report", str(out)], base_env())
    assert res.returncode == 0, res.stderr
