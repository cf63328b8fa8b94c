"""Fixtures of the stage-core tests: the native module, test-only C libraries compiled with the
system C compiler, and a helper that runs a snippet in a fresh interpreter (env vars such as
NVTX_INJECTION64_PATH / MAXINSTR_CUDA_LIBRARY are read once per process)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from core_helpers import drain_all

NATIVE_SRC = Path(__file__).parent / "native"

native = pytest.importorskip("maxinstr._native", reason="maxinstr._native is not built")
if getattr(native, "__fake__", False):  # another suite's pure-Python stand-in
    pytest.skip("maxinstr._native is a stand-in here, not the built extension", allow_module_level=True)


@pytest.fixture
def n():
    """The native module, drained and enabled before and after each test."""
    native.set_enabled(True)
    native.close_open("test setup")
    drain_all(native)
    native.set_capacity(1_000_000)
    yield native
    native.set_enabled(True)
    native.close_open("test teardown")
    drain_all(native)
    native.set_capacity(1_000_000)


@pytest.fixture(scope="session")
def cc_lib(tmp_path_factory):
    """Compile tests/core/native/<name>.c into a shared library; returns its path."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    out_dir = tmp_path_factory.mktemp("native")
    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in built:
            out = out_dir / f"{name}.so"
            subprocess.run(
                [cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(NATIVE_SRC / f"{name}.c"), "-lpthread"],
                check=True,
                capture_output=True,
            )
            built[name] = out
        return built[name]

    return build


def _pythonpath() -> str:
    import maxinstr

    pkg_root = str(Path(maxinstr.__file__).resolve().parent.parent)
    rest = os.environ.get("PYTHONPATH", "")
    return pkg_root + (os.pathsep + rest if rest else "")


@pytest.fixture
def run_py():
    """run_py(code, **env) -> the JSON the snippet printed last (snippet: `emit(obj)`)."""

    prelude = textwrap.dedent(
        """\
        import json, sys, ctypes
        import numpy as np
        from maxinstr import _native as n
        from maxinstr.rundir.format import STAGE_DTYPE
        def emit(obj):
            print("@@" + json.dumps(obj))
        def recs(raw):
            return np.frombuffer(raw, dtype=STAGE_DTYPE)
        """
    )

    def run(code: str, **env: str):
        e = dict(os.environ)
        for k in ("NVTX_INJECTION64_PATH", "MAXINSTR_CUDA_LIBRARY", "MAXINSTR_HIP_LIBRARY", "MAXINSTR_ROCTX_LIBRARY",
                  "MAXINSTR_DISABLE", "MAXINSTR_MARKERS"):
            e.pop(k, None)
        e.update(env)
        e["PYTHONPATH"] = _pythonpath()
        p = subprocess.run(
            [sys.executable, "-c", prelude + textwrap.dedent(code)], env=e, capture_output=True, text=True, timeout=60
        )
        if p.returncode != 0:
            raise AssertionError(f"snippet failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("@@")]
        return json.loads(lines[-1][2:]) if lines else None

    return run
