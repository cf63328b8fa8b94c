"""Find a Python that has a framework, and run an example or a docs command with it.

The examples need frameworks that are not maxinstr dependencies (MAX, torch, CuPy). CI installs
`max` into its own venv (README, "MAX example"); a developer may keep them in a separate venv
instead. Candidates, first that imports the module wins:

1. `MAXINSTR_EXAMPLES_PYTHON` (an interpreter path), if set;
2. the interpreter running the tests;
3. the repo's `.venv-max/bin/python` (the separate venv the MAX example is developed in).

Every child gets the directory holding the `maxinstr` the tests imported first on its
PYTHONPATH, so it runs the same maxinstr (same Python version needed for the native module: a
candidate of another version is skipped).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import maxinstr

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
_MAXINSTR_ROOT = Path(maxinstr.__file__).resolve().parents[1]


def _candidates() -> list[str]:
    out = []
    if os.environ.get("MAXINSTR_EXAMPLES_PYTHON"):
        out.append(os.environ["MAXINSTR_EXAMPLES_PYTHON"])
    out.append(sys.executable)
    out.append(str(REPO / ".venv-max" / "bin" / "python"))
    return out


def child_env(python: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MAXINSTR_SESSION_DIR", None)  # never join a session the test process may have open
    env.pop("MAXINSTR_RUN_DIR", None)
    env["PYTHONUNBUFFERED"] = "1"
    # The maxinstr the tests imported comes first, by absolute path: the child may run in
    # another directory (relative PYTHONPATH entries would break) and another venv.
    inherited = [str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(_MAXINSTR_ROOT), *inherited])
    env.update(extra)
    return env


@functools.cache
def python_with(module: str) -> str | None:
    """The first candidate interpreter that imports `module` and maxinstr (same minor version)."""
    probe = f"import sys, {module}, maxinstr._native; assert sys.version_info[:2] == {tuple(sys.version_info[:2])}"
    for python in _candidates():
        if not Path(python).exists():
            continue
        try:
            done = subprocess.run(
                [python, "-c", probe], env=child_env(python), capture_output=True, timeout=120, cwd=REPO
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return python
    return None


def run_example(
    python: str, script: str, *args: str, cwd: Path, timeout: float = 900, **env: str
) -> subprocess.CompletedProcess:
    """Run examples/<script> with `python` in `cwd` (extra env vars as keywords); output as text."""
    return subprocess.run(
        [python, str(EXAMPLES / script), *args],
        env=child_env(python, COLUMNS="160", **env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
