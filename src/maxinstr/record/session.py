"""Sessions: where stage records go, and the run directory they are written to (docs/sessions.md
says what is kept on each way a process can end, and the rules for nested and unbalanced use).

    with maxinstr.session("runs/decode", warmup=2, dtype="bf16"):
        ...

While a session is open, the native core's writer thread (no GIL) appends completed stage records
to ``parts/<part>/stages.bin`` every 2 ms; a Python flusher runs every ``flush_interval_s`` for what
needs Python (attrs, GPU event resolution), and writes the records itself when the native writer is
off or cannot start. Each process writes its own part (``p<pid>``, ``r<rank>.p<pid>``): fork
children in a part of their own, spawn children and subprocesses through ``MAXINSTR_SESSION_DIR``.

This module is the public API and the lifecycle; the rest of the recording side is :mod:`.sinks`
(where drained records go), :mod:`.steady` (steady state, the profiler capture) and
:mod:`.process` (the process's state, the flusher thread, exit, signals, forks).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import warnings
from pathlib import Path
from typing import Any, cast

import numpy as np

from maxinstr import config
from maxinstr.kernels import KernelsUnavailable, SessionKernels
from maxinstr.kernels.base import Collector
from maxinstr.record import process as proc_mod
from maxinstr.record.footprint import PROBE_STAGES, probe_stage_ns
from maxinstr.record.process import PROCESS, BufferDrops, clock_ns, flush_locked, native_core, native_stats
from maxinstr.record.sinks import MemorySink, NativeSink, NativeWriterUnavailable, PythonSink, Sink, attempt
from maxinstr.record.steady import SteadyState
from maxinstr.rundir import format as fmt
from maxinstr.rundir import metadata, owners
from maxinstr.rundir.reader import Run, load
from maxinstr.rundir.writer import PartWriter, RunDirWarning, write_json_atomic
from maxinstr.sample import SessionSampler

__all__ = ["Session", "session", "current_session", "ensure_env_session", "RunDirWarning"]

DEFAULT_FLUSH_INTERVAL_S = 0.05
FLUSH_INTERVAL_RANGE_S = (0.001, 3600.0)  # 0 would make the flusher spin a core; inf, never wake
DEFAULT_SAMPLE_HZ = 100.0


def _bounded_interval(name: str, value: Any) -> float:
    """``value`` within FLUSH_INTERVAL_RANGE_S (NaN or not a number: the default), said once
    in a warning when changed."""
    low, high = FLUSH_INTERVAL_RANGE_S
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    bounded = DEFAULT_FLUSH_INTERVAL_S if seconds != seconds else min(max(seconds, low), high)
    if bounded != seconds:
        warnings.warn(f"maxinstr: {name}={value!r} is not in [{low}, {high}] s; {bounded} s used", RuntimeWarning,
                      stacklevel=4)
    return bounded


_SAID: set[str] = set()  # warnings said once per process: the Python writer fallback, each kernels=True reason


def _warn_once(key: str, message: str, stacklevel: int) -> None:
    if key not in _SAID:
        _SAID.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)


class Session:
    """A recording session (made by :func:`session`; ``path=None``: in memory, no sampler). Public:
    ``path`` (where it writes), ``part`` (this process's part folder name), ``closed``."""

    def __init__(self, path: str | os.PathLike[str] | None, *, warmup: int = 0, sample_hz: float = DEFAULT_SAMPLE_HZ,
                 flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S, fsync_interval_s: float = 1.0,
                 kernels: bool = False, _role: str = "owner", **user_meta: Any) -> None:
        if warmup < 0:
            raise ValueError("warmup must be >= 0")
        self.requested_path = None if path is None else str(path)
        env_dir = config.run_dir()
        if path is not None and env_dir and _role == "owner":
            path = env_dir  # `maxinstr run` decides where runs go
        self.path: Path | None = None if path is None else Path(path).absolute()
        self.sample_hz = float(sample_hz or 0.0)
        self.flush_interval_s = _bounded_interval("flush_interval_s", flush_interval_s)
        self.fsync_interval_s = float(fsync_interval_s)
        self.user_meta = dict(user_meta)
        self.kernels = bool(kernels)
        self.role = _role  # "owner" | "child" (joined from the environment) | "memory"
        self.auto = False  # started by ensure_env_session(), adopts the first nested session's settings
        self.part: str | None = None
        self.meta: dict[str, Any] | None = None
        self.failed: str | None = None
        self.started = False
        self.closed = False
        self.sink: Sink | None = None  # where drained records go, once this session is a root
        self.steady = SteadyState(int(warmup), core=native_core, clock_ns=clock_ns,
                                  names=lambda: PROCESS.names, write_meta=self._write_meta, event=self._event)
        self._pid = os.getpid()
        self._host: Session | None = None  # the session this one joined, when nested
        self._collectors: dict[str, Collector] = {}  # "sampler", "kernel": attached to the part
        self._signals: dict[int, Any] = {}  # the handlers ours replaced, restored at close
        self._env_saved: dict[str, str | None] = {}
        self._writes_meta = False
        self._drops = BufferDrops()

    @property
    def warmup(self) -> int:
        """The first ``warmup`` instances of each stage name are warm-up."""
        return self.steady.warmup

    # -- context manager --------------------------------------------------------------
    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("open" if self.started else "new")
        return f"<maxinstr.Session {self.path or 'in-memory'} part={self.part} {state}>"

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> Session:
        """Open the session (idempotent). Returns ``self``."""
        if self.closed:
            raise RuntimeError("this maxinstr session is closed; open a new one with maxinstr.session(...)")
        if self.started:
            return self
        proc = PROCESS
        with proc.lock:
            self.started = True
            self._pid = os.getpid()
            if proc.root is not None and not proc.root.closed:
                self._join(cast(Session, proc.root))  # the process's root is always a Session
                proc.stack.append(self)
                return self
            # Records completed before this session belong to the in-memory session.
            flush_locked(proc)
            self._drops.begin()
            proc.root = self
            proc.stack.append(self)
            self._open_root()
        if self.path is not None:
            proc_mod.ensure_flusher(proc)
        return self

    def _join(self, host: Session) -> None:
        self._host = host
        self.part = host.part
        entry = {"requested_path": self.requested_path, "warmup": self.warmup, "user": self.user_meta,
                 "start_ns": clock_ns()}
        if host.auto and not (host.meta and host.meta.get("nested_sessions")):
            # The script's own session inside `maxinstr run`: its settings are the run's
            # (except a warm-up given on `maxinstr run`'s command line, which wins).
            host.user_meta.update(self.user_meta)
            if host.meta is not None:
                host.meta["user"] = dict(host.user_meta)
                host.meta["requested_path"] = self.requested_path
                if host.steady.deferred:
                    host.meta["warmup"] = self.warmup
                    host.steady.set_warmup(self.warmup)
        elif self.path is not None and host.path is not None and self.path != host.path:
            warnings.warn(f"maxinstr: session {self.requested_path} opened inside the open session {host.path}: "
                          "its stages are recorded in the outer run", RuntimeWarning, stacklevel=3)
        if host.meta is not None:
            host.meta.setdefault("nested_sessions", []).append(entry)
            host._write_meta()
        if self.kernels and not host.kernels and isinstance(host.sink, PythonSink) and host.path is not None \
                and host.part:
            # kernels=True asked by the inner session (e.g. the script's own session under
            # `maxinstr run`): the process's recording is the host's, so the host collects.
            host.kernels = True
            host._start_kernels(host.path / fmt.PARTS_DIR / host.part)

    def _open_root(self) -> None:
        rank = config.rank()
        self.part = fmt.part_name(self._pid, rank)
        if self.path is None:
            self.role = "memory"
            self.sink = MemorySink(PROCESS.memory.limit)
            return
        part_dir = self.path / fmt.PARTS_DIR / self.part
        part = PartWriter(part_dir, self._part_info(), fsync_interval_s=self.fsync_interval_s)
        self.sink = self._part_sink(part)
        if self.role == "owner":
            self.meta = metadata.collect(warmup=self.warmup, user=self.user_meta, requested_path=self.requested_path)
            self.meta["session"] = {"pid": self._pid, "part": self.part, "start_ns": clock_ns(), "end_ns": None}
            self._writes_meta = rank in (None, 0)
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                with owners.locked(self.path):  # two sessions opening here decide one after the other
                    if rank is None and not config.run_dir():
                        if live := owners.live_writers(self.path):
                            self._join_live_run(part, live)
                        else:
                            _clear_previous_run(self.path)
                    # another rank writes it only when rank 0 has not (which overwrites ours)
                    write_json_atomic(self.path / fmt.META_FILE, self.meta, exclusive=not self._writes_meta)
                    part.open()
            except OSError as exc:
                self._disk_failed(exc)
                return
            self._start_native_writer()
            self._set_child_env()
            if self.kernels:
                self._start_kernels(part_dir)
            self.steady.arm(self.meta, capture=config.capture_request())
            if self.sample_hz > 0 and config.local_rank() in (None, 0):
                self._start_sampler(part_dir)
        else:
            self._open_at_first_stage()
        self._signals = proc_mod.install_signal_handlers()
        proc_mod.register_mp_exit_hook()

    def _part_sink(self, part: PartWriter) -> PythonSink:
        """The native writer unless ``MAXINSTR_NATIVE_WRITER=0`` (started once the part is open)."""
        if config.native_writer_enabled():
            return NativeSink(part, native_core(), fsync_interval_s=self.fsync_interval_s)
        return PythonSink(part)

    def _join_live_run(self, part: PartWriter, live: list[str]) -> None:
        """Another process still writes the run here: keep it, add this process's part to it
        (as ranks do) and leave its meta.json to its owner. Said once, naming that process."""
        self._writes_meta = False
        part.info["joined_live_run"] = live
        warnings.warn(f"maxinstr: {self.path} is the run of a live process ({'; '.join(live[:3])}"
                      f"{' ...' if len(live) > 3 else ''}): this session adds its records to that run as part "
                      f"{self.part} instead of replacing it", RuntimeWarning, stacklevel=4)

    def _part_info(self) -> dict[str, Any]:
        return {
            "part": self.part, "pid": self._pid, "ppid": os.getppid(), "rank": config.rank(),
            "local_rank": config.local_rank(), "world_size": config.world_size(), "host": socket.gethostname(),
            "role": self.role, "started_ns": clock_ns(), "started_unix_ns": time.time_ns(), "closed_ns": None,
            "status": "running",
            # what one stage costs this process, for the report's footprint (record/footprint.py)
            "footprint": {"stage_ns": probe_stage_ns(native_core()), "probe_stages": PROBE_STAGES,
                          # the core's counters are the process's: the report takes this session's share
                          "gpu_cost_ns_at_open": native_stats().get("gpu_cost_ns")},
        }

    def _disk_failed(self, exc: OSError) -> None:
        self.failed = exc.strerror or str(exc)
        warnings.warn(f"maxinstr: cannot write run directory {exc.filename or self.path}: {self.failed}; the "
                      "program continues and stages are kept in memory only", RunDirWarning, stacklevel=4)
        self.sink = MemorySink(PROCESS.memory.limit)

    def close(self) -> None:
        """Flush and close the session (a second call does nothing)."""
        if self.closed or not self.started:
            self.closed = True
            return
        proc = PROCESS
        if os.getpid() != self._pid:
            # A fork child leaving the parent's `with session(...)`: close the child's part,
            # never the parent's run.
            proc_mod.exit_process(reason="closed")
            self.closed = True
            return
        if proc.root is self:
            proc_mod.begin_close(proc)  # bounded whatever other threads record (issue 29)
        with proc_mod.hold_interrupt() as interrupted, proc.lock:
            self.closed = True
            if self in proc.stack:
                proc.stack.remove(self)
            if self._host is not None:
                host = self._host
                if host.meta is not None:
                    for entry in host.meta.get("nested_sessions", []):
                        if entry.get("requested_path") == self.requested_path and entry.get("end_ns") is None:
                            entry["end_ns"] = clock_ns()
                            break
                    host._write_meta()
            else:
                self.close_root("closed")
        proc_mod.stop_flusher_if_idle(proc)
        if interrupted:
            raise KeyboardInterrupt  # the Ctrl-C that came while the run was being closed, now it is

    def close_root(self, reason: str) -> None:
        """Final flush and files of the process's root session (the caller holds the lock)."""
        proc = PROCESS
        self.steady.stop_capture()
        sampler = self._collectors.pop("sampler", None)
        if sampler is not None:
            attempt(self._event, "sampler stop", sampler.stop)
        # nsys writes its trace inside the capture's stop (seconds for a long decode): the budget
        # bounds close's own writing, so it starts again here (the lock keeps other writers out)
        proc_mod.begin_close(proc, restart=True)
        if reason.startswith("SIG"):
            # Killed by a signal: never wait on a GPU that may be hung (the process must die);
            # give in-flight GPU records a bounded time to finish instead.
            proc_mod.resolve_bounded(proc_mod.SIGNAL_RESOLVE_S)
            flush_locked(proc, block=False)
        else:
            flush_locked(proc, block=True)
        if isinstance(self.sink, NativeSink) and self.sink.running:
            self.sink.stop()
            flush_locked(proc, block=False)  # records completed while it stopped: the Python path
        if "kernel" in self._collectors:  # after the stage events resolved: the stages' GPU work is done
            self._stop_kernels()
        stats = native_stats()
        if self.sink is not None:
            self.sink.close(status=reason, closed_ns=clock_ns(), native=stats,
                            dropped_records=self._drops.since_begin(stats), **self._drops.losses(stats))
        if self.meta is not None:
            self.meta["status"] = "closed"
            self.meta["frameworks_loaded"] = metadata.frameworks_loaded()
            self.meta["session"]["end_ns"] = clock_ns()
            self.meta["session"]["end_reason"] = reason
            self._write_meta()
        proc_mod.restore_signal_handlers(self._signals, self._pid)
        self._restore_env()
        if proc.root is self:
            proc.root = None
        if self in proc.stack:
            proc.stack.remove(self)

    # -- what the process asks of its root session (maxinstr.record.process.Root) -----------
    @property
    def next_flush_s(self) -> float:
        return self.flush_interval_s

    def before_drain(self, native: Any) -> None:
        """A child's part opens at its first record (marks alone: here) or stage (the trigger)."""
        if not self._part_pending():
            return
        try:
            pending = int(native.stats().get("pending_records", 0) or 0)
        except Exception:  # noqa: BLE001 - ask again at the next drain
            return
        if pending:
            self._open_part()

    def _part_pending(self) -> bool:
        return isinstance(self.sink, NativeSink) and self.sink.state == "pending"

    def _open_part(self) -> None:
        assert isinstance(self.sink, NativeSink)
        if self.sink.part.open_or_warn():
            self._start_native_writer()

    def _open_at_first_stage(self) -> None:
        """A child (fork, spawn, subprocess) creates its part when it records (a helper process that
        records nothing leaves none): at its first stage's enter, through the core's trigger (before
        the stage's time is taken), so the native writer holds its records from the first, as any
        process's. The flusher's next round found them up to ``flush_interval_s`` later: a fork child
        that ended with os._exit() within 50 ms of its stages lost them all, without a part."""
        if self._part_pending():
            attempt(self._event, "first-stage trigger", lambda: native_core().steady_watch(0, self._first_stage))

    def _first_stage(self, name_id: int, at_ns: int) -> None:
        with PROCESS.lock:
            if PROCESS.root is self and not self.closed and self._part_pending():
                self._open_part()

    def after_drain(self, rows: np.ndarray, *, periodic: bool) -> None:
        assert self.sink is not None
        self.sink.settle(wait=not periodic)
        self._drops.note(self.sink)
        kernels = self._collectors.get("kernel")
        if kernels is not None:
            attempt(self._event, "kernel flush", kernels.flush)

    def fork_child(self) -> Session | None:
        """In a fork child: the session that records the child's own part of this run (its
        records start empty: the core resets itself in the child), or None when this session
        writes no directory."""
        if self.path is None or self.failed:
            return None
        pid = os.getpid()
        joined = Session(self.path, _role="child", sample_hz=0, flush_interval_s=self.flush_interval_s)
        joined.started = True
        joined._pid = pid
        joined.part = fmt.part_name(pid)
        part = PartWriter(self.path / fmt.PARTS_DIR / joined.part, joined._part_info(),
                          fsync_interval_s=self.fsync_interval_s)
        # the core's writer thread did not follow the fork: the child starts its own writer on
        # its own part once it records
        joined.sink = joined._part_sink(part)
        joined._open_at_first_stage()
        if isinstance(self.sink, PythonSink):
            self.sink.part.abandon()  # the parent's descriptors: not ours to write
        return joined

    # -- the native writer ------------------------------------------------------------------
    def _start_native_writer(self) -> None:
        """Start the core's writer thread on this part's files, or fall back to the Python
        writer (said once per process) when it cannot start."""
        sink = self.sink
        if not isinstance(sink, NativeSink) or sink.state != "pending":
            return
        try:
            sink.start()
        except NativeWriterUnavailable as exc:
            self.sink = PythonSink(sink.part, why=str(exc))
            self._python_writer(str(exc))

    def _python_writer(self, why: str) -> None:
        self._event("warning", f"{why}: the Python flusher writes the stage records")
        _warn_once("python writer", f"maxinstr: {why}; the Python flusher writes the stage records (a SIGKILL can "
                   "lose the records of the last flush interval)", stacklevel=4)

    # -- what attaches to the part: the kernel collector, the sampler ---------------------------
    def _start_kernels(self, part_dir: Path) -> None:
        """kernels=True: start the in-process kernel collector (docs/kernels.md), or warn once
        why it cannot run and go on with events-only stages."""
        collector = SessionKernels(part_dir, {"part": self.part, "pid": self._pid})
        reason = None
        try:
            collector.start()
            self._collectors["kernel"] = collector
        except KernelsUnavailable as exc:
            reason = str(exc)
        except Exception as exc:  # noqa: BLE001 - instrumentation must never stop the program
            reason = f"kernel collector failed to start: {type(exc).__name__}: {exc}"
        info: dict[str, Any] = {"requested": True, "collector": collector.name, "status": "collecting"}
        if reason:
            info["status"], info["reason"] = "unavailable", reason
            self._event("warning", f"kernels=True: {reason}")
            _warn_once(reason, f"maxinstr: kernels=True: {reason}", stacklevel=5)
        if self.meta is not None:
            self.meta["kernels"] = info
            self._write_meta()

    def _stop_kernels(self) -> None:
        collector = self._collectors.pop("kernel")
        try:
            stats = collector.stop()
        except Exception as exc:  # noqa: BLE001
            stats = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            self._event("error", f"kernel collector stop failed: {stats['error']}")
        if self.meta is not None and isinstance(self.meta.get("kernels"), dict):
            self.meta["kernels"]["status"] = stats.get("status", "closed")
            for key in ("dropped_cupti", "dropped_queue"):
                if stats.get(key):
                    self.meta["kernels"][key] = stats[key]

    def _start_sampler(self, part_dir: Path) -> None:
        sampler = SessionSampler(part_dir, 1.0 / self.sample_hz)
        try:
            sampler.start()
        except Exception as exc:  # noqa: BLE001 - sampling is optional; recording goes on
            self._event("warning", f"sampler not started: {type(exc).__name__}: {exc}")
            return
        self._collectors["sampler"] = sampler

    def _write_meta(self) -> None:
        if self.meta is None or self.path is None or self.failed or not self._writes_meta or os.getpid() != self._pid:
            return
        try:
            write_json_atomic(self.path / fmt.META_FILE, self.meta)
        except OSError as exc:
            if self.sink is not None:
                self.sink.disk_error(exc)

    # -- records ------------------------------------------------------------------------
    def flush(self) -> None:
        """Write every completed record now (blocks until finished GPU events resolve and the
        native writer has written them)."""
        with PROCESS.lock:
            flush_locked(PROCESS, block=True)

    def records(self) -> Run:
        """The records of this session so far, as a :class:`maxinstr.Run` (flushes first):
        ``maxinstr.load(path)``, or the records an in-memory session holds."""
        target = self._host or self
        with PROCESS.lock:
            flush_locked(PROCESS, block=False)
        if target.path is not None and not target.failed:
            return load(target.path)
        sink = target.sink if isinstance(target.sink, MemorySink) else PROCESS.memory
        return sink.to_run(PROCESS.names, warmup=target.warmup, user=target.user_meta,
                           native_dropped=int(native_stats().get("dropped_records", 0) or 0))

    def _event(self, kind: str, message: str, **fields: Any) -> None:
        if self.sink is not None:
            self.sink.event(kind, message, **fields)

    # -- child processes ----------------------------------------------------------------------
    def _set_child_env(self) -> None:
        assert self.path is not None
        for key, value in ((config.SESSION_DIR, str(self.path)), (config.SESSION_PID, str(self._pid))):
            self._env_saved[key] = os.environ.get(key)
            os.environ[key] = value

    def _restore_env(self) -> None:
        if os.getpid() != self._pid:
            return
        for key, value in self._env_saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._env_saved.clear()


def _clear_previous_run(path: Path) -> None:
    """A session opened on an existing run directory replaces that run, once no process of it
    is alive (the caller asked :func:`owners.live_writers`): its meta.json and parts/ go
    (nothing else in the folder is touched), so two runs never merge."""
    meta = path / fmt.META_FILE
    if not meta.is_file():
        return
    try:
        old = json.loads(meta.read_bytes())
    except (OSError, ValueError):
        return  # not ours to delete
    if not isinstance(old, dict) or old.get("format") != fmt.FORMAT_NAME:
        return
    parts = path / fmt.PARTS_DIR
    if parts.is_symlink():
        parts.unlink()  # a planted link: the link goes, its target is never touched nor written
    shutil.rmtree(parts, ignore_errors=True)
    meta.unlink(missing_ok=True)


def session(path: str | os.PathLike[str] | None, *, warmup: int = 0, sample_hz: float = DEFAULT_SAMPLE_HZ,
            flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S, kernels: bool = False, **user_meta: Any) -> Session:
    """A recording session writing the run directory ``path`` (docs/sessions.md).

    Use it as a context manager, or call ``.start()`` and ``.close()``. ``warmup=N``: the
    first N instances of each stage name are warm-up. ``sample_hz`` sets the GPU sampler's
    rate (0: off). ``kernels=True`` also collects this process's kernels, copies and sets per
    stage in-process (NVIDIA, CUPTI; docs/kernels.md); when another profiler holds CUPTI it
    warns once and stages keep their event times. Other keyword arguments (dtype, checkpoint, flags...) go to meta.json
    under ``"user"``. Under ``maxinstr run`` (``MAXINSTR_RUN_DIR`` set) the run is written
    where ``maxinstr run`` says, and ``path`` is recorded as ``requested_path``.
    """
    return Session(path, warmup=warmup, sample_hz=sample_hz, flush_interval_s=flush_interval_s, kernels=kernels,
                   **user_meta)


_default = Session(None, _role="memory")
_default.started = True


def current_session() -> Session:
    """The innermost open session of this process, or the default in-memory session that
    keeps stages recorded outside any session (bounded by ``MAXINSTR_MEMORY_RECORDS``,
    default 1Mi records; the rest are counted in ``records().notes``)."""
    return PROCESS.stack[-1] if PROCESS.stack else _default


def ensure_env_session() -> Session | None:
    """Open the session the environment asks for, and return the open root session (or None):
    join another process's open session (``MAXINSTR_SESSION_DIR``: a part of our own, the other
    owns meta.json), or open the run of ``maxinstr run`` (``MAXINSTR_RUN_DIR``; the script's own
    session joins it later and gives the run its warm-up and user metadata)."""
    root = PROCESS.root
    if root is not None and not root.closed:
        return root  # type: ignore[return-value]
    joined_dir = config.session_dir()
    owner = config.session_pid()
    try:
        if joined_dir and owner is not None and owner != os.getpid():
            return Session(joined_dir, _role="child", sample_hz=0).start()
        run_dir = config.run_dir()
        if run_dir:
            warmup = config.warmup_instances()
            # `maxinstr run` samples from its own process: none started from the program's
            s = Session(run_dir, warmup=warmup or 0, sample_hz=0 if config.run_sampled() else DEFAULT_SAMPLE_HZ)
            s.auto = True
            # Without `maxinstr run --warmup`, wait for the script's own session to say how
            # many warm-up instances there are before starting a capture.
            s.steady.deferred = warmup is None
            s.requested_path = None
            return s.start()
    except Exception as exc:  # noqa: BLE001 - instrumentation must never stop the program
        warnings.warn(f"maxinstr: could not open the session from the environment: {exc}", RuntimeWarning, stacklevel=2)
    return None
