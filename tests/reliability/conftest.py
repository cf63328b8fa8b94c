"""Fixtures of the reliability tests. The session fixtures (``native``, ``stage``, ``mark``) are
shared with tests/session: tests/helpers/session_fixtures.py."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(params=["idle", "loaded"])
def machine_load(request):
    """Runs the test as it is ("idle") and again with every core kept busy by other processes
    ("loaded": one spinning process per core, as a shared CI machine can be)."""
    import os
    import subprocess

    procs = []
    if request.param == "loaded":
        spin = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end:\n    pass\n"
        procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 2)]
    yield request.param
    for p in procs:
        p.kill()
        p.wait()
