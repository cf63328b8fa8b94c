"""`maxinstr run`'s start-up hook starts maxinstr at the first import that asks for it (a
--stage target's package, maxinstr itself). The ways a real program reaches that import, each
run as a real `maxinstr run` of a real program: `python -m pkg`, a find_spec probe before the
import, a target imported in the middle of numpy's own import, a module that fails its first
import, a function its package re-exports, a module Python imported before the program started.
Each asserts the stages the program's calls made (counted in the run directory)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

import maxinstr
from _launch_helpers import base_env, run_cli


def _run(tmp_path, specs: list[str], *command: str, cwd=None):
    out = tmp_path / "r"
    args = ["run", "-y", "-q", "--no-report", "--profiler", "none", "-o", str(out)]
    for spec in specs:
        args += ["--stage", spec]
    res = run_cli([*args, "--", *command], base_env(), cwd=str(cwd or tmp_path))
    assert res.returncode == 0, res.stderr
    return out, res


def _stage_counts(out) -> dict[str, int]:
    names = [str(n) for n in maxinstr.load(out).stage_names()]
    return {n: names.count(n) for n in set(names)}


def _package(tmp_path):
    """pkg/sub.py defines f; pkg/__init__.py re-exports it and imports pkg/user.py, which binds
    it by name too (the usual shape of a library's package)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .sub import f\nfrom . import user\n")
    (pkg / "sub.py").write_text("def f():\n    return 1\n")
    (pkg / "user.py").write_text("from .sub import f\n\ndef g():\n    return f()\n")
    (pkg / "__main__.py").write_text(textwrap.dedent("""\
        import sys
        from pkg.sub import f
        for _ in range(3):
            f()
        print("maxinstr" in sys.modules)
        """))


def test_python_dash_m_package_starts_maxinstr(tmp_path):
    """runpy looks the package up (importlib.util.find_spec) before it imports it: that look-up
    must not use up the hook's one trigger."""
    _package(tmp_path)
    out, res = _run(tmp_path, ["pkg.sub:f"], sys.executable, "-m", "pkg")
    assert (out / "child.log").read_text().splitlines()[0] == "True"
    assert _stage_counts(out) == {"f": 3}
    assert "never applied" not in res.stderr


def test_a_find_spec_probe_before_the_import_leaves_the_trigger_armed(tmp_path, script):
    """The usual "is it installed?" check (transformers asks importlib.util.find_spec("torch")
    before importing torch) ahead of the import that should start maxinstr."""
    (tmp_path / "work_mod.py").write_text("def step():\n    return 1\n")
    prog = script("main.py", """\
        import importlib.util
        assert importlib.util.find_spec("work_mod") is not None
        import work_mod
        for _ in range(3):
            work_mod.step()
        """)
    out, res = _run(tmp_path, ["work_mod:step"], sys.executable, str(prog))
    assert _stage_counts(out) == {"step": 3}, res.stderr


def test_a_target_imported_inside_numpys_import_starts_maxinstr_after_numpy(tmp_path, script):
    """numpy imports math half-way through its own import; maxinstr imports numpy. Started at
    that point, maxinstr met a half-initialized numpy and the run had no session."""
    pytest.importorskip("numpy")
    prog = script("main.py", """\
        import numpy
        import math
        for _ in range(3):
            math.sqrt(2.0)
        print(numpy.ones(2).sum())
        """)
    out, res = _run(tmp_path, ["math:sqrt"], sys.executable, str(prog))
    assert "start-up hook failed" not in res.stderr and "could not open the session" not in res.stderr, res.stderr
    assert (out / "child.log").read_text().splitlines()[0] == "2.0"
    assert _stage_counts(out) == {"sqrt": 3}


def test_a_module_that_fails_its_first_import_is_staged_when_it_imports(tmp_path, script):
    """The first import raises (caught by the program), the second succeeds: the spec applies to
    the module that ran, not to the half-run one the failure left behind."""
    (tmp_path / "flaky.py").write_text(textwrap.dedent("""\
        import os
        if not os.environ.get("FLAKY_OK"):
            raise RuntimeError("not yet")

        def f():
            return 1
        """))
    prog = script("main.py", """\
        import os
        try:
            import flaky
        except RuntimeError:
            pass
        os.environ["FLAKY_OK"] = "1"
        import flaky
        for _ in range(3):
            flaky.f()
        """)
    out, res = _run(tmp_path, ["flaky:f"], sys.executable, str(prog))
    assert "flaky has no f" not in res.stderr, res.stderr
    assert _stage_counts(out) == {"f": 3}
    lines = [json.loads(x) for x in (out / "stage-specs.jsonl").read_text().splitlines()]
    assert [x["applied"] for x in lines] == [True]


def test_a_function_its_package_reexports_is_staged_under_every_name(tmp_path, script):
    """`from .sub import f` in the package's __init__ ran before maxinstr started (it starts
    once the package has run): pkg.f and pkg.user's f are the staged function too, as they were
    when the hook wrapped pkg.sub as soon as it ran."""
    _package(tmp_path)
    prog = script("main.py", """\
        import pkg
        import pkg.sub
        for _ in range(3):
            pkg.f()
            pkg.user.g()
            pkg.sub.f()
        """)
    out, res = _run(tmp_path, ["pkg.sub:f"], sys.executable, str(prog))
    assert _stage_counts(out) == {"f": 9}, res.stderr


def test_a_target_python_imported_before_the_program_is_staged(tmp_path, script):
    """time (like os, sys, io) is imported by Python's own start-up, before the hook: there is
    no import of it to wait for, so maxinstr starts with the program."""
    prog = script("main.py", """\
        import time
        for _ in range(3):
            time.sleep(0)
        """)
    out, res = _run(tmp_path, ["time:sleep"], sys.executable, str(prog))
    assert "never applied" not in res.stderr, res.stderr
    assert _stage_counts(out) == {"sleep": 3}


def test_the_hook_knows_every_package_starting_maxinstr_imports(tmp_path, script):
    """The hook never starts maxinstr inside the import of a package that starting it imports
    (the standard library's, or those it names): each such package must be named, else a target
    imported inside that package's import would start maxinstr on the half-initialized package."""
    import ast

    from maxinstr.launch.layout import site_dir

    tree = ast.parse((__import__("pathlib").Path(site_dir()) / "sitecustomize.py").read_text())
    named = next(ast.literal_eval(node.value.args[0]) for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", "") == "_MAXINSTR_NEEDS")
    bare = script("bare.py", "import sys, json\nprint(json.dumps(sorted(sys.modules)))\n")
    import subprocess

    before = set(json.loads(subprocess.run([sys.executable, str(bare)], capture_output=True, text=True, env=base_env(),
                                           check=True).stdout))
    prog = script("main.py", """\
        import sys, json
        import maxinstr
        with maxinstr.stage("s"):
            pass
        print(json.dumps(sorted(sys.modules)))
        """)
    out, _ = _run(tmp_path, [], sys.executable, str(prog))
    loaded = set(json.loads((out / "child.log").read_text().splitlines()[-1]))
    tops = {m.partition(".")[0] for m in loaded - before} - set(sys.stdlib_module_names) - {"sitecustomize"}
    assert "numpy" in tops and tops <= set(named), sorted(tops - set(named))


@pytest.mark.parametrize("flag", ["-I", "-E", "-S", "-sE", "-Xdev -I"])
def test_a_python_started_so_that_it_skips_the_hook_is_said_in_the_plan(tmp_path, flag):
    """-I and -E ignore PYTHONPATH, -S skips site: the hook never runs, so --stage and the run's
    session cannot reach the program. The plan says so before anything runs, with the way that works."""
    flags = flag.split()
    out, res = _run(tmp_path, ["json:dumps"], sys.executable, *flags, "-c", "import json; json.dumps(1)")
    said = [line.strip() for line in res.stderr.splitlines() if "skips maxinstr's start-up hook" in line]
    assert said and f"python {flags[-1]} -m maxinstr.launch.bootstrap" in said[0], res.stderr


def test_the_plan_says_nothing_of_flags_that_keep_the_hook(tmp_path):
    out, res = _run(tmp_path, ["json:dumps"], sys.executable, "-u", "-X", "dev", "-c", "import json; json.dumps(1)")
    assert "start-up hook" not in res.stderr and _stage_counts(out) == {"dumps": 1}
