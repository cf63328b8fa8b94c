"""Session tests (tests/session, tests/reliability) run against the real native core when it is
built, else against the pure-Python stand-in in fake_native.py (installed only for the test, then
removed). A pytest plugin: tests/conftest.py loads it."""

from __future__ import annotations

import sys

import pytest

from helpers import fake_native


@pytest.fixture
def native(monkeypatch):
    """The native core (real or stand-in), drained, with no session open."""
    import maxinstr
    from maxinstr.record import process

    core = fake_native.real()
    if core is None:
        core = fake_native.make()
        monkeypatch.setenv("MAXINSTR_NATIVE_WRITER", "0")  # the stand-in has no writer thread
        monkeypatch.setitem(sys.modules, "maxinstr._native", core)
        monkeypatch.setattr(maxinstr, "_native", core, raising=False)
    _reset(process, core)
    yield core
    for s in list(process.PROCESS.stack):
        s.close()
    _reset(process, core)


def _reset(process, core):
    from maxinstr.record.sinks import MemorySink

    core.set_enabled(True)
    core.close_open("test")
    core.resolve(True)
    core.drain(-1)
    process.PROCESS.memory = MemorySink(process.PROCESS.memory.limit)


@pytest.fixture
def stage(native):
    """``stage(name, **kw)`` context manager: maxinstr.stage when the real core is built."""
    if getattr(native, "__fake__", False):
        return native.stage
    import maxinstr

    return maxinstr.stage


@pytest.fixture
def mark(native):
    if getattr(native, "__fake__", False):
        return native.mark
    import maxinstr

    return maxinstr.mark
