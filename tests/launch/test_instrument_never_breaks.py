"""Instrumenting code you cannot edit never breaks it (issue 20, class 7).

- A spec that cannot be applied (a method of a C type such as ``decimal.Decimal.sqrt``, a
  property, a read-only attribute, a class whose metaclass refuses assignment) says one line and
  leaves the program and every other spec working, whether the module is imported later (the
  import hook) or already (applied at once). Property test over sets of such specs.
- ``--stage json:dumps`` records the program's calls only, not maxinstr's own (its run
  directory writers call json.dumps, on its threads too).
- ``python -m maxinstr.launch.bootstrap --stage ...`` without a run directory writes one
  (runs/<script>-<time>, said in one line) rather than keeping the records in memory to lose.
- ``maxinstr snapshot -- CMD`` with no GPU never starts CMD (it used to start it and stop it).
"""

from __future__ import annotations

import importlib
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _launch_helpers import base_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxinstr.launch import instrument as inst

MODULE = """
    import decimal

    Decimal = decimal.Decimal          # a C type: its methods cannot be replaced
    SEQ = (1, 2)                       # not callable

    class Frozen(type):
        def __setattr__(cls, name, value):
            raise AttributeError(f"{cls.__name__} is frozen")

    class Locked(metaclass=Frozen):
        def step(self):
            return "locked"

    class Model:
        @property
        def size(self):
            return 3

        def forward(self, x):
            return x + 1

    def good(x):
        return 2 * x
"""

BAD = ["Decimal.sqrt", "Decimal.quantize", "SEQ", "Locked.step", "Model.size", "Model.nothing", "missing",
       "Decimal.__init__"]
_counter = itertools.count()


def _module(tmp_path: Path) -> str:
    name = f"target_{os.getpid()}_{next(_counter)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    return name


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(bad=st.lists(st.sampled_from(BAD), min_size=1, max_size=4), imported_first=st.booleans(),
       good_first=st.booleans())
def test_a_spec_that_cannot_apply_never_breaks_the_import_or_other_specs(tmp_path_factory, bad, imported_first,
                                                                        good_first):
    tmp = tmp_path_factory.mktemp("mods")
    path = pytest.MonkeyPatch()  # a fixture's monkeypatch would outlive hypothesis' examples
    path.syspath_prepend(str(tmp))
    name = _module(tmp)
    calls: list[str] = []

    def factory(stage_name):
        def deco(func):
            def wrapper(*args, **kwargs):
                calls.append(stage_name)
                return func(*args, **kwargs)
            return wrapper
        return deco

    before = len(inst.instrument_errors())
    try:
        if imported_first:
            importlib.import_module(name)
        specs = [f"{name}:{q}" for q in bad]
        good = [f"{name}:good", f"{name}:Model.forward"]
        for target in (good + specs if good_first else specs + good):
            inst.instrument(target, lazy=True, stage_factory=factory)
        mod = importlib.import_module(name)  # the import hook applies what waited for it
        assert mod.good(2) == 4 and mod.Model().forward(1) == 2 and mod.Model().size == 3
        assert mod.Locked().step() == "locked" and mod.Decimal(4).sqrt() == 2
        assert calls == ["good", "Model.forward"]
        errors = inst.instrument_errors()[before:]
        assert len(errors) == len(bad) and all(e.startswith(f"--stage {name}:") for e in errors), errors
    finally:
        path.undo()
        sys.modules.pop(name, None)


def _py(args, env, cwd):
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL)


PROGRAM = """
    import decimal, json
    import helper
    print(decimal.Decimal(16).sqrt(), json.dumps([1]), json.dumps({"a": 2}), json.dumps(3),
          sum(helper.work(i) for i in range(5)))
"""


@pytest.mark.parametrize("bad", ["decimal:Decimal.sqrt", "builtins:str.upper"])  # imported later / already
def test_bootstrap_with_an_unwrappable_spec_runs_the_program_and_the_others(tmp_path, bad):
    (tmp_path / "helper.py").write_text("def work(i):\n    return i\n")
    (tmp_path / "main.py").write_text(textwrap.dedent(PROGRAM))
    out = tmp_path / "run"
    res = _py(["-m", "maxinstr.launch.bootstrap", "--stage", bad, "--stage", "helper:work=w", "--stage",
               "json:dumps=dumps", "-o", str(out), "main.py"], base_env(), str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout == '4 [1] {"a": 2} 3 10\n'
    assert res.stderr.count("maxinstr:") == 1 and f"--stage {bad}: cannot replace" in res.stderr, res.stderr
    import maxinstr

    run = maxinstr.load(out)
    names = run["name"].tolist()
    assert names.count("w") == 5
    # the program's three json.dumps calls, on its own thread; none of maxinstr's (its writers
    # and flusher write JSON lines with json.dumps all the time)
    assert names.count("dumps") == 3
    assert set(run["tid"][run["name"] == "dumps"].tolist()) == set(run["tid"][run["name"] == "w"].tolist())


def test_bootstrap_without_a_run_directory_writes_one(tmp_path):
    (tmp_path / "helper.py").write_text("def work(i):\n    return i\n")
    (tmp_path / "main.py").write_text("import helper\nprint(sum(helper.work(i) for i in range(5)))\n")
    res = _py(["-m", "maxinstr.launch.bootstrap", "--stage", "helper:work=w", "main.py"], base_env(), str(tmp_path))
    assert res.returncode == 0 and res.stdout == "10\n", res.stderr
    [line] = res.stderr.splitlines()
    assert line.startswith("maxinstr: writing the run to runs/main-"), line
    import maxinstr

    [run_dir] = (tmp_path / "runs").iterdir()
    assert maxinstr.load(run_dir)["name"].tolist() == ["w"] * 5


def test_snapshot_without_a_gpu_runs_the_command_unwatched(tmp_path, monkeypatch, capsys):
    """Its help says it exits with the command's status: without a GPU the command still runs,
    unwatched, said in one line (issue 28.8: it was never started)."""
    from maxinstr.cli import main
    from maxinstr.sample import amdsmi as amd

    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML, no amdsmi: no GPU, whatever the machine
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setattr(amd, "_import_failure", None)
    marker = tmp_path / "started"
    code = main(["snapshot", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w').close(); raise SystemExit(5)"])
    err = capsys.readouterr().err
    assert code == 5 and marker.exists()
    assert err.startswith("maxinstr: no GPU to watch (") and err.count("\n") == 1 and "unwatched" in err
