"""Shared helpers for the `maxinstr run` / deep-dive / server tests: real child processes, and
the fake profilers of tests/launch/fakes first on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


import maxinstr

FAKES = Path(__file__).parent / "fakes"
PKG_ROOT = str(Path(maxinstr.__file__).resolve().parent.parent)  # src/ or site-packages


def base_env(fakes: bool = True, **extra: str) -> dict[str, str]:
    """The environment for a `python -m maxinstr` subprocess: maxinstr importable, fakes
    first on PATH (when asked), no inherited maxinstr/session variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAXINSTR_", "FAKE_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_ROOT, env.get("PYTHONPATH", "")) if p)
    path = env.get("PATH", "")
    if fakes:
        path = f"{FAKES}{os.pathsep}{path}"
    else:
        path = os.pathsep.join(p for p in path.split(os.pathsep) if Path(p).resolve() != FAKES.resolve())
    env["PATH"] = path
    env.update(extra)
    return env


def run_cli(args: list[str], env: dict[str, str], timeout: float = 60, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "maxinstr", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL)


