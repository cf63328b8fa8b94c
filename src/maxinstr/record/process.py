"""The process side of recording: :data:`PROCESS` (the name table, the open sessions, the default
in-memory sink), the drain (:func:`flush_locked`: completed records out of the native core into the
root session's sink), the flusher thread, and exit: atexit, multiprocessing's exit hook (its
children end with ``os._exit``), SIGTERM and SIGHUP (and SIGINT where the program left Python's
default) close the run first (:func:`exit_process`), then die by the same signal or chain to the
program's handler. Across ``fork()`` the lock is held; the child records into a part of its own.
Nothing here knows the session class: the session module implements :class:`Root`."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from maxinstr import config
from maxinstr._threads import start_thread
from maxinstr.record.sinks import MemorySink, Sink
from maxinstr.rundir import format as fmt

BUSY_ROWS = 4096  # a drain this big means records arrive fast: drain again without sleeping
SIGNAL_RESOLVE_S = 2.0  # killed by a signal: GPU records in flight get this long, never a blocking wait
# Close (and exit) write pending attrs for at most this long from when close is asked (another thread
# recording with attrs all the while once made close take 20-40 s); the rest is counted and said.
CLOSE_BUDGET_S = 1.0


def native_core() -> Any:
    """The native core, looked up at each call: the session tests may put a stand-in in its place."""
    import maxinstr._native  # noqa: F401 - (imported here, not bound: sys.modules holds the one in use)

    return sys.modules["maxinstr._native"]


def native_stats() -> dict[str, Any]:
    """``_native.stats()``; {} if it raises (a core in a bad state must not stop a close)."""
    try:
        return dict(native_core().stats())
    except Exception:  # noqa: BLE001
        return {}


def clock_ns() -> int:
    """The host clock of every record (CLOCK_MONOTONIC, ns)."""
    return int(native_core().clock_ns())


class Root(Protocol):
    """What the process asks of the session that owns its part (maxinstr.record.session)."""

    closed: bool
    sink: Sink | None  # set once the session is a root

    @property
    def next_flush_s(self) -> float:
        """How long the flusher sleeps after a round (``flush_interval_s``, less while a capture waits)."""

    def before_drain(self, native: Any) -> None:
        """Right before a drain (a child's native writer starts at its first record)."""

    def after_drain(self, rows: np.ndarray, *, periodic: bool) -> None:
        """After the batch reached :attr:`sink`: writer status, warm-up, drops, collectors."""

    def close_root(self, reason: str) -> None:
        """The final flush and files (the caller holds the lock)."""

    def fork_child(self) -> Root | None:
        """In a fork child: the session it records into (a part of its own), or None."""


class Process:
    """Per-process recording state. Reset to new in a fork child (:meth:`reset`)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.RLock()  # serialises drains and writes (new: the parent's may be held by a gone thread)
        self.names: dict[int, str] = {}  # every name id this process has seen
        self.root: Root | None = None  # the session that owns this process's part
        self.stack: list[Any] = []  # open sessions of this process, outermost first
        self.memory = MemorySink(config.memory_records())
        self.flusher: threading.Thread | None = None
        self.stop = threading.Event()
        self.exited = False
        self.closing = False  # exit_process is running
        self.pending_signal: int | None = None
        self.flushing_thread: int | None = None  # thread id inside flush_locked
        self.deferred_signal: int | None = None
        self.signal_seen: tuple[int, float] | None = None  # (signal, monotonic s) read off the wakeup pipe
        self.signal_ran = False  # on_signal ran (the watchdog stands down)


PROCESS = Process()


def flush_locked(proc: Process, *, block: bool = False, periodic: bool = False) -> int:
    """Drain the native core once into the current sink (the caller holds ``proc.lock``).
    Returns the rows drained (by the Python path). Unless ``periodic`` (the flusher's own
    round), also waits until the native writer has written every record completed so far."""
    outer = proc.flushing_thread
    proc.flushing_thread = threading.get_ident()
    try:
        return _drain(proc, native_core(), block, periodic)
    finally:
        proc.flushing_thread = outer
        if outer is None and proc.deferred_signal is not None and threading.current_thread() is threading.main_thread():
            signum, proc.deferred_signal = proc.deferred_signal, None
            on_signal(signum, None)


def _drain(proc: Process, native: Any, block: bool, periodic: bool) -> int:
    root = proc.root
    if root is not None:
        root.before_drain(native)
    sink: Sink = root.sink if root is not None and root.sink is not None else proc.memory
    try:
        if periodic and not block:
            native.resolve_async()  # elapsed-time calls on the core's placer thread, not under the GIL
        else:
            native.resolve(block)
        data, new_names, attrs = native.drain(-1)
    except Exception as exc:  # noqa: BLE001 - never let recording break the program
        sink.event("error", f"drain failed: {type(exc).__name__}: {exc}")
        return 0
    for name_id, name in new_names:
        proc.names[int(name_id)] = name
    rows = np.frombuffer(data, dtype=fmt.STAGE_DTYPE) if data else np.empty(0, dtype=fmt.STAGE_DTYPE)
    try:
        attrs = attrs if type(attrs) is list else list(attrs)  # (record id, attrs) pairs from the core
        sink.write(rows, proc.names, attrs)
    except Exception as exc:  # noqa: BLE001 - never raise into the program; the loss is counted
        # a batch the sink could not take (a bug, or a value nothing could encode): counted
        # where the run says so (part.json rows_dropped_disk, Run.notes)
        sink.count_unwritten(len(rows), len(attrs))
        sink.event("error", f"{len(rows)} record(s) not written: {type(exc).__name__}: {exc}", dropped_records=len(rows))
    except BaseException:
        # Ctrl-C (or SystemExit from a signal handler) between the drain and the write: the
        # batch left the core and would vanish without a word; counted, then the interrupt goes on
        sink.count_unwritten(len(rows), len(attrs))
        raise
    if root is not None:
        root.after_drain(rows, periodic=periodic)
    return len(rows)


def begin_close(proc: Process, *, restart: bool = False) -> None:
    """Start the close's clock (:data:`CLOSE_BUDGET_S`) on the root's sink, before waiting for
    the lock: a flusher writing a large batch then stops at the deadline too. ``restart``: from
    now, after a wait that was not close's own writing (the profiler's stop)."""
    if proc.root is not None and proc.root.sink is not None:
        proc.root.sink.begin_close(time.monotonic() + CLOSE_BUDGET_S, restart=restart)


@contextlib.contextmanager
def hold_interrupt() -> Iterator[list[int]]:
    """Ctrl-C while the run is closed is held until the (bounded) close finishes: the list yielded
    then holds SIGINT and the caller raises KeyboardInterrupt itself, so nothing drained is lost on
    the way (it once left 300,000 rows without their attrs). A second Ctrl-C is obeyed at once.
    Only in the main thread, while SIGINT has Python's default handler (a program's own is its own)."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield held
        return

    def hold(signum: int, frame: Any) -> None:
        if held:
            raise KeyboardInterrupt
        held.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous)


def resolve_bounded(timeout_s: float) -> None:
    """Non-blocking resolves until no GPU event is in flight or ``timeout_s`` passed."""
    native = native_core()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            native.resolve(False)
            if not int(native.stats().get("events_in_flight", 0) or 0):
                return
        except Exception:  # noqa: BLE001 - at a signal: never stop the process from dying
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.005)


class BufferDrops:
    """Says in the run's events (and once as a warning) when the native buffer dropped
    records since ``base`` (the count when the session began)."""

    LOSSES = ("attrs_unconverted", "depth_refused")
    """The core's other counts of what it did not keep (process-wide, so taken since begin)."""

    def __init__(self) -> None:
        self.base = 0
        self.said = 0
        self.loss_base: dict[str, int] = {}

    def begin(self) -> None:
        stats = native_stats()
        self.base = int(stats.get("dropped_records", 0) or 0)
        self.loss_base = {k: int(stats.get(k, 0) or 0) for k in self.LOSSES}

    def since_begin(self, stats: dict[str, Any] | None = None) -> int:
        stats = native_stats() if stats is None else stats
        return int(stats.get("dropped_records", 0) or 0) - self.base

    def losses(self, stats: dict[str, Any]) -> dict[str, int]:
        """part.json fields: what the core did not keep during this session (the reader says
        each count above zero in the report's notes)."""
        return {k: max(int(stats.get(k, 0) or 0) - self.loss_base.get(k, 0), 0) for k in self.LOSSES}

    def note(self, sink: Sink) -> None:
        dropped = self.since_begin()
        if dropped > self.said:
            if self.said == 0:
                warnings.warn(f"maxinstr: the record buffer was full and dropped {dropped} stage record(s); the count "
                              "is kept in part.json", RuntimeWarning, stacklevel=2)
            sink.event("warning", "record buffer full: records dropped", dropped_records=dropped)
            self.said = dropped


def _flusher_main(proc_ref: weakref.ref[Process]) -> None:
    while True:
        proc = proc_ref()
        if proc is None or proc.pid != os.getpid():
            return
        root = proc.root
        if root is None or proc.stop.is_set():
            return
        interval = root.next_flush_s
        try:
            with proc.lock:
                drained = flush_locked(proc, periodic=True)
        except Exception:  # noqa: BLE001 - a flusher that dies loses the run; keep going
            drained = 0
        _watch_signals(proc)
        if drained < BUSY_ROWS:
            proc.stop.wait(interval)
        del proc, root


_WAKE_FD: int | None = None  # read end of the signal wakeup pipe a multiprocessing child set (_as_mp_child)
UNRUN_HANDLER_S = 0.25  # a signal whose Python handler has not run for this long is finished by the flusher


def _watch_signals(proc: Process) -> None:
    """The flusher's watch, in a multiprocessing child, on a SIGTERM/SIGHUP whose Python handler never
    ran: a pool ends idle workers with SIGTERM, and one arriving as the worker began waiting on the
    queue's lock (between the wait's signal check and its sem_wait) left the handler unrun and the
    worker waiting for ever (faulthandler: main thread in SemLock.__enter__; 2-3 pool exits in 40
    under load). CPython writes each signal's number to the wakeup fd as it arrives; after
    UNRUN_HANDLER_S the flusher finishes the run and ends the process as the signal would."""
    if _WAKE_FD is None or proc.signal_ran:
        return
    with contextlib.suppress(BlockingIOError, OSError):
        for signum in os.read(_WAKE_FD, 64):
            if signum in (signal.SIGTERM, signal.SIGHUP) and proc.signal_seen is None:
                proc.signal_seen = (signum, time.monotonic())
    if proc.signal_seen is not None and time.monotonic() - proc.signal_seen[1] > UNRUN_HANDLER_S:
        exit_process(reason=signal.Signals(proc.signal_seen[0]).name)
        os._exit(128 + proc.signal_seen[0])  # (SIG_DFL cannot be set off the main thread: the shell's status)


def ensure_flusher(proc: Process) -> None:
    if proc.flusher is not None and proc.flusher.is_alive():
        return
    proc.stop.clear()
    proc.flusher = start_thread(_flusher_main, "maxinstr-flusher", weakref.ref(proc))


def stop_flusher_if_idle(proc: Process) -> None:
    if proc.root is not None:
        return
    proc.stop.set()
    t = proc.flusher
    if t is not None and t is not threading.current_thread():
        t.join(timeout=2.0)
    proc.flusher = None


def exit_process(reason: str = "exit") -> None:
    """Close this process's recording: close still-open stages (flag UNCLOSED), write the
    last records, close the part and (owner) meta.json. Idempotent per process."""
    proc = PROCESS
    if proc.pid != os.getpid() or proc.exited or proc.closing:
        return
    proc.closing = True
    begin_close(proc)
    with hold_interrupt():  # the process is ending: a Ctrl-C now only waits for the (bounded) close
        _exit_locked(proc, reason)
    proc.stop.set()
    if proc.pending_signal is not None and reason not in ("SIGTERM", "SIGHUP", "SIGINT"):
        _die_by(proc.pending_signal)  # a terminating signal arrived while we finished


def _exit_locked(proc: Process, reason: str) -> None:
    acquired = proc.lock.acquire(timeout=5.0)  # never hang an exiting program
    try:
        if proc.exited:
            return
        proc.exited = True
        root = proc.root
        if root is None:
            return
        with contextlib.suppress(Exception):  # the stages still open are lost; the rest is written
            native_core().close_open(reason)
        for s in list(proc.stack):
            s.closed = True
        root.closed = True
        root.close_root(reason)
        proc.stack.clear()
    finally:
        if acquired:
            proc.lock.release()
        proc.closing = False


_SAVED_SIGNALS: dict[int, Any] = {}  # signal -> the handler ours replaced (process-wide)


def on_signal(signum: int, frame: Any) -> None:
    proc = PROCESS
    proc.signal_ran = True
    if proc.closing:
        # A second signal while the run is being finished (multiprocessing's terminate()
        # can send two): let the first finish; it dies by this signal afterwards.
        proc.pending_signal = signum
        return
    if proc.flushing_thread == threading.get_ident():
        # The signal interrupted a batch being written by this very thread: finish that
        # batch first (it holds drained records), then handle the signal.
        proc.deferred_signal = signum
        return
    previous = _SAVED_SIGNALS.get(signum, signal.SIG_DFL)
    if callable(previous):
        # The program has its own handler: make everything so far durable, then let it decide.
        if proc.lock.acquire(timeout=2.0):
            try:
                flush_locked(proc)
            finally:
                proc.lock.release()
        previous(signum, frame)
        return
    # Default action (terminate): finish the run, then die by the same signal.
    exit_process(reason=signal.Signals(signum).name)
    _die_by(signum)


def _die_by(signum: int) -> None:
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_signal_handlers() -> dict[int, Any]:
    """Ours on SIGTERM, SIGHUP (and SIGINT where Python's default is not in place: its
    KeyboardInterrupt already unwinds cleanly). Returns what a session restores at close."""
    saved: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return saved  # signal.signal only works there; atexit still closes the session
    wanted = [signal.SIGTERM, signal.SIGHUP]
    if signal.getsignal(signal.SIGINT) is signal.SIG_DFL:
        wanted.append(signal.SIGINT)
    for signum in wanted:
        try:
            previous = signal.getsignal(signum)
            if previous is on_signal:  # left installed by a session closed off the main thread
                saved[signum] = _SAVED_SIGNALS.get(signum, signal.SIG_DFL)
                continue
            if previous is signal.SIG_IGN or previous is None:
                continue
            signal.signal(signum, on_signal)
            _SAVED_SIGNALS[signum] = previous
            saved[signum] = previous
        except (ValueError, OSError):
            continue
    return saved


def restore_signal_handlers(saved: dict[int, Any], owner_pid: int) -> None:
    # From another thread (or a fork child) ours stays installed; it chains to the saved
    # handler when no session is open, so the program's own handling is kept either way.
    if threading.current_thread() is threading.main_thread() and os.getpid() == owner_pid:
        for signum in list(saved):
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(signum) is on_signal:  # leave a handler set after ours alone
                    signal.signal(signum, _SAVED_SIGNALS.pop(signum, signal.SIG_DFL))
    saved.clear()


atexit.register(exit_process)

_MP_TOKEN = type("_MPToken", (), {})()  # kept alive: multiprocessing's after-fork registry is weak


def register_mp_exit_hook() -> None:
    """multiprocessing children end with os._exit (no atexit); their finalizers do run."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    try:
        if mp.parent_process() is None:
            return
        from multiprocessing import util  # (a child of multiprocessing: it is imported already)

        _as_mp_child()
        # a child's bootstrap clears finalizers registered before it; this re-registers after
        util.register_after_fork(_MP_TOKEN, lambda _: _as_mp_child())
    except Exception:  # noqa: BLE001 - an odd multiprocessing: the child's records end at its last flush
        pass


def _as_mp_child() -> None:
    """A multiprocessing child closes its part at its normal exit (a finalizer: it ends with
    os._exit), and its flusher watches for a terminating signal whose handler never ran
    (:func:`_watch_signals`) through a signal wakeup pipe, unless the program set a wakeup fd."""
    global _WAKE_FD
    from multiprocessing import util

    util.Finalize(None, exit_process, exitpriority=-100)
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(OSError, ValueError):
        if _WAKE_FD is not None:  # a fork child of a child: the parent's pipe, inherited
            os.close(_WAKE_FD)
            _WAKE_FD = None
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if previous != -1:  # the program's own: put it back, no watch
            signal.set_wakeup_fd(previous)
            os.close(r)
            os.close(w)
        else:
            _WAKE_FD = r


def _before_fork() -> None:
    # Hold the lock across fork so the child never inherits a half-written batch.
    PROCESS.lock.acquire(timeout=1.0)


def _after_fork_parent() -> None:
    with contextlib.suppress(RuntimeError):
        PROCESS.lock.release()


def _after_fork_child() -> None:
    """A fork child records into a part of its own; nothing of the parent's is kept."""
    proc = PROCESS
    parent_root, names = proc.root, proc.names
    child_root = parent_root.fork_child() if parent_root is not None else None
    proc.reset()  # fresh locks (the parent's may be held by a thread that is gone)
    proc.names = dict(names)
    if child_root is None:
        return
    proc.root = child_root
    proc.stack.append(child_root)
    ensure_flusher(proc)
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        with contextlib.suppress(Exception):  # as register_mp_exit_hook
            mp_util.register_after_fork(_MP_TOKEN, lambda _: _as_mp_child())


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)
