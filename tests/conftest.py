"""Shared test set-up: fixture paths and the `gpu` marker's skip rule."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"

# the native / stage / mark fixtures of tests/session and tests/reliability (tests/helpers)
pytest_plugins = ["helpers.session_fixtures"]


def _has_gpu() -> bool:
    for tool in ("nvidia-smi", "rocm-smi"):
        if shutil.which(tool):
            try:
                return subprocess.run([tool], capture_output=True, timeout=20).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                return False
    return False


HAS_GPU = _has_gpu()

# The signal tests send SIGINT/SIGHUP to the programs they start, which inherit an ignored signal
# from this process: a suite started in the background (a shell ignores SIGINT for `cmd &`) or
# under nohup (SIGHUP) failed them. The defaults back, as an interactive shell gives them.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no GPU on this machine (run on the lent H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The copied real profiler fixtures (see tests/data/PROVENANCE.md)."""
    return DATA
