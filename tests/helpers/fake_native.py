"""A pure-Python stand-in for ``maxinstr._native`` with the same interface and record
semantics (ids ``(pid << 32) | seq``, per-thread stacks, reset in a fork child). Used only
when the real extension is not built, so session tests run before/without the native core.
The real core is preferred whenever it imports (see ``native()``)."""

from __future__ import annotations

import os
import sys
import threading
import time
import types

import numpy as np

from maxinstr.rundir import format as fmt


def real():
    """The real ``maxinstr._native`` when it is built and importable, else None."""
    try:
        from maxinstr import _native
    except ImportError:
        return None
    return None if getattr(_native, "__fake__", False) else _native


def native():
    """The real core when built, else the fake installed in its place (for child scripts)."""
    return real() or install()


_STATES: list = []


def _reset_all():
    for state in _STATES:
        state.reset()


os.register_at_fork(after_in_child=_reset_all)


def install():
    # the stand-in has no writer thread: the session's real switch for the Python writer
    os.environ.setdefault("MAXINSTR_NATIVE_WRITER", "0")
    mod = make()
    sys.modules["maxinstr._native"] = mod
    import maxinstr

    maxinstr._native = mod
    return mod


def make():
    mod = types.ModuleType("maxinstr._native")
    mod.__fake__ = True
    state = _State()

    mod.clock_ns = time.monotonic_ns
    mod.set_enabled = lambda on: setattr(state, "enabled", bool(on))
    mod.is_enabled = lambda: state.enabled
    mod.stage = state.stage
    mod.mark = state.mark
    mod.drain = state.drain
    mod.resolve = lambda block=False: 0
    mod.resolve_async = lambda: 0
    mod._set_attrs_hook = lambda hook: None  # the stand-in keeps attrs as given
    mod.close_open = state.close_open
    mod.stats = state.stats
    mod.set_capacity = lambda n: setattr(state, "capacity", int(n))
    mod.profiler_start = lambda: state.profiler(True)
    mod.profiler_stop = lambda: state.profiler(False)
    mod.steady_watch = state.steady_watch
    mod.names = lambda: [(i, n) for n, i in state.names.items()]
    mod._state = state
    _STATES.append(state)
    return mod


class _Stage:
    __slots__ = ("state", "name", "step", "attrs", "row")

    def __init__(self, state, name, step, attrs):
        self.state, self.name, self.step, self.attrs = state, name, step, attrs

    def __enter__(self):
        self.row = self.state.push(self.name, self.step, self.attrs)
        return self

    def __exit__(self, exc_type, exc, tb):
        self.state.pop(self.row, exc_type is not None)
        return False


class _State:
    def __init__(self):
        self.enabled = True
        self.capacity = 1 << 22
        self.reset()

    def reset(self):
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.seq = 0
        self.names: dict[str, int] = {}
        self.new_names: list[tuple[int, str]] = []
        self.done: list[tuple] = []
        self.attrs: list[tuple[int, dict]] = []
        self.stacks: dict[int, list] = {}
        self.local = threading.local()
        self.dropped = 0
        self.records = 0
        self.profiling = []
        self.steady = None  # [n, hook, counts] while the steady-state trigger is armed

    def steady_watch(self, n, hook):
        was = self.steady is not None
        self.steady = [int(n), hook, {}] if n >= 0 and hook is not None else None
        return was

    def profiler(self, on):
        self.profiling.append((on, time.monotonic_ns()))
        return False

    def _name_id(self, name):
        nid = self.names.get(name)
        if nid is None:
            nid = self.names[name] = len(self.names)
            self.new_names.append((nid, name))
        return nid

    def _stack(self):
        st = getattr(self.local, "stack", None)
        if st is None or getattr(self.local, "pid", None) != os.getpid():
            st = self.local.stack = []
            self.local.pid = os.getpid()
            with self.lock:
                self.stacks[threading.get_native_id()] = st
        return st

    def stage(self, name, *, stream=None, gpu=None, step=None, **attrs):
        return _Stage(self, name, step, attrs)

    def push(self, name, step, attrs):
        st = self._stack()
        with self.lock:
            self.seq += 1
            rid = (os.getpid() << 32) | self.seq
            nid = self._name_id(name)
        parent = st[-1] if st else None
        if self.steady is not None:  # the core's trigger: before the stage opens
            n, hook, counts = self.steady
            before = counts.get(nid, 0)
            counts[nid] = before + 1
            if parent is None and before >= n:
                self.steady = None
                hook(nid, time.monotonic_ns())
        if step is None:
            step = parent[6] if parent else -1
        row = [rid, parent[0] if parent else -1, threading.get_native_id(), time.monotonic_ns(), -1, nid, step, len(st), attrs]
        st.append(row)
        return row

    def pop(self, row, exc):
        st = self._stack()
        if row in st:
            while st and st[-1] is not row:
                st.pop()
            st.pop()
        self._finish(row, time.monotonic_ns(), fmt.EXCEPTION if exc else 0)

    def _finish(self, row, end, flags):
        rid, parent, tid, start, _, nid, step, depth, attrs = row
        with self.lock:
            if len(self.done) >= self.capacity:
                self.dropped += 1
                return
            self.done.append((rid, parent, tid, start, end, -1, -1, step, nid, depth, flags))
            self.records += 1
            if attrs:
                self.attrs.append((rid, dict(attrs)))

    def mark(self, name, **attrs):
        st = self._stack()
        with self.lock:
            self.seq += 1
            rid = (os.getpid() << 32) | self.seq
            nid = self._name_id(name)
        now = time.monotonic_ns()
        parent = st[-1] if st else None
        row = [rid, parent[0] if parent else -1, threading.get_native_id(), now, now, nid, parent[6] if parent else -1, len(st), attrs]
        self._finish(row, now, fmt.MARK)

    def close_open(self, reason="closed"):
        now = time.monotonic_ns()
        n = 0
        with self.lock:
            stacks = list(self.stacks.values())
        for st in stacks:
            while st:
                self._finish(st.pop(), now, fmt.UNCLOSED)
                n += 1
        return n

    def drain(self, max_records=-1):
        with self.lock:
            done, self.done = self.done, []
            names, self.new_names = self.new_names, []
            attrs, self.attrs = self.attrs, []
        arr = np.array(done, dtype=fmt.STAGE_DTYPE) if done else np.empty(0, fmt.STAGE_DTYPE)
        return arr.tobytes(), names, attrs

    def stats(self):
        return {
            "records": self.records,
            "dropped_records": self.dropped,
            "open_stages": sum(len(s) for s in self.stacks.values()),
            "events_in_flight": 0,
            "events_dropped": 0,
            "gpu_backend": "none",
            "markers": "none",
            "errors": 0,
        }
