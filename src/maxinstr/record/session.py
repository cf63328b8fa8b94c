"""Sessions: where stage records go, and the run directory they are written to.

    with maxinstr.session("runs/decode", warmup=2, dtype="bf16"):
        ...

A session owns a run directory (docs/formats.md). While it is open, the native core's writer
thread (no GIL) appends completed stage records to ``parts/<part>/stages.bin`` every 2 ms, or
sooner when many complete (docs/sessions.md "The native writer"); a Python flusher thread runs
every ``flush_interval_s`` (50 ms) for what needs Python: attrs, GPU event resolution, warm-up
detection. With ``MAXINSTR_NATIVE_WRITER=0``, or when the native writer cannot start (said
once), the Python flusher drains and writes the records itself, as before. The sampler (when
``maxinstr.sample`` has one) writes its samples next to them. What is lost if the process dies:

* SIGKILL / OOM kill: the records completed since the writer's last write (about 2 ms of
  records with the native writer; the last ``flush_interval_s`` plus the wait for the GIL with
  the Python one), attrs of the last ``flush_interval_s``, and the stages still open. Written
  rows are in the kernel's page cache as soon as ``write`` returns, so they survive the process.
* machine crash / power loss: additionally up to ``fsync_interval_s`` (1 s) of rows.
* normal exit, an exception escaping the program, SIGTERM, SIGINT: nothing; still-open
  stages are closed and written flagged ``UNCLOSED``.

Rules for unbalanced use (all tested in tests/session/):

* ``close()`` twice: the second call does nothing.
* A session opened while another is open in the same process *joins* it: its stages go to
  the outer run directory; its path, warm-up and user metadata are recorded in the outer
  meta.json under ``nested_sessions`` (and, when the outer session was started from the
  environment by ``maxinstr run``, they become the run's own warm-up and user metadata).
* Stages are not owned by a session object: one that completes while no session is open
  (for example, opened after its session closed) goes to the default in-memory session,
  ``maxinstr.current_session()``.
* Child processes never mix records with their parent: each process writes its own part
  ``p<pid>`` (``r<rank>.p<pid>`` under torchrun). fork children continue the parent's run
  in a part of their own; spawn/forkserver children (and any subprocess that imports
  maxinstr) join through ``MAXINSTR_SESSION_DIR``, which an open session sets.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from maxinstr.rundir import format as fmt
from maxinstr.rundir import owners
from maxinstr.rundir.writer import PartWriter, RunDirWarning, write_json_atomic

__all__ = ["Session", "session", "current_session", "ensure_env_session", "RunDirWarning"]

ENV_RUN_DIR = "MAXINSTR_RUN_DIR"  # set by `maxinstr run`: every session writes here
ENV_SESSION_DIR = "MAXINSTR_SESSION_DIR"  # set by an open session: child processes join it
ENV_SESSION_PID = "MAXINSTR_SESSION_PID"  # the pid of the process that owns that session
ENV_CAPTURE = "MAXINSTR_CAPTURE"  # set by `maxinstr run`: start the profiler at steady state
ENV_MEMORY_RECORDS = "MAXINSTR_MEMORY_RECORDS"  # bound of the default in-memory session
ENV_WARMUP = "MAXINSTR_WARMUP"  # set by `maxinstr run --warmup N`: the run's warm-up count

ENV_NATIVE_WRITER = "MAXINSTR_NATIVE_WRITER"  # "0": the Python flusher writes the records
ENV_WRITER_INTERVAL_MS = "MAXINSTR_WRITER_INTERVAL_MS"  # native writer: write at least this often
ENV_WRITER_THRESHOLD = "MAXINSTR_WRITER_THRESHOLD"  # native writer: wake early at this many records

DEFAULT_FLUSH_INTERVAL_S = 0.05
FLUSH_INTERVAL_RANGE_S = (0.001, 3600.0)  # 0 would make the flusher spin a core; inf, never wake
DEFAULT_WRITER_INTERVAL_MS = 2.0
DEFAULT_WRITER_THRESHOLD = 8192
DEFAULT_SAMPLE_HZ = 100.0
_BUSY_ROWS = 4096  # a drain this big means records arrive fast: drain again without sleeping


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


def _native():
    """The native core, or None when it is not built (sessions still write metadata)."""
    try:
        from maxinstr import _native as native
    except Exception:  # noqa: BLE001 - missing or broken extension: record nothing
        return None
    return native


def _clock_ns() -> int:
    native = _native()
    if native is not None:
        try:
            return int(native.clock_ns())
        except Exception:  # noqa: BLE001
            pass
    return time.monotonic_ns()  # the same CLOCK_MONOTONIC on Linux


class _MemorySink:
    """Keeps drained records in memory, up to ``limit`` rows (the rest are counted)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[np.ndarray] = []
        self.attrs: dict[int, dict[str, Any]] = {}
        self.rows = 0
        self.dropped = 0

    def write(self, rows: np.ndarray, names: dict[int, str], attrs: list[tuple[int, dict[str, Any]]]) -> None:
        room = max(self.limit - self.rows, 0)
        if len(rows) > room:
            self.dropped += len(rows) - room
            rows = rows[:room]
        if len(rows):
            self.chunks.append(rows.copy())
            self.rows += len(rows)
            kept = set(rows["id"].tolist()) if attrs else set()
            if attrs:
                from maxinstr.record.attrs import plain

            for rid, a in attrs:
                if rid in kept:
                    self.attrs[int(rid)] = plain(a)  # data, never the caller's objects


class _Process:
    """Per-process recording state. Replaced wholesale in a fork child."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.RLock()  # serialises drains and writes
        self.names: dict[int, str] = {}  # every name id this process has seen
        self.root: Session | None = None  # the session that owns this process's part
        self.stack: list[Session] = []  # open sessions of this process, outermost first
        limit = int(os.environ.get(ENV_MEMORY_RECORDS) or 1 << 20)
        self.memory = _MemorySink(limit)
        self.flusher: threading.Thread | None = None
        self.stop = threading.Event()
        self.exited = False
        self.closing = False  # _exit_process is running
        self.pending_signal: int | None = None
        self.flushing_thread: int | None = None  # thread id inside _flush_locked
        self.deferred_signal: int | None = None


_proc = _Process()


# ------------------------------------------------------------------------------------------
# the session


class Session:
    """A recording session. Use :func:`session` to make one.

    ``path=None`` makes an in-memory session (no directory, no sampler). The attributes
    ``path`` (where it writes), ``part`` (this process's part folder name) and ``closed``
    are public.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        warmup: int = 0,
        sample_hz: float = DEFAULT_SAMPLE_HZ,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        fsync_interval_s: float = 1.0,
        kernels: bool = False,
        _role: str = "owner",
        **user_meta: Any,
    ) -> None:
        if warmup < 0:
            raise ValueError("warmup must be >= 0")
        self.requested_path = None if path is None else str(path)
        env_dir = os.environ.get(ENV_RUN_DIR)
        if path is not None and env_dir and _role == "owner":
            path = env_dir  # `maxinstr run` decides where runs go
        self.path: Path | None = None if path is None else Path(path).absolute()
        self.warmup = int(warmup)
        self.sample_hz = float(sample_hz or 0.0)
        self.flush_interval_s = _bounded_interval("flush_interval_s", flush_interval_s)
        self.fsync_interval_s = float(fsync_interval_s)
        self.user_meta = dict(user_meta)
        self.kernels = bool(kernels)
        self._kernels: Any = None  # the running kernel collector (maxinstr.kernels), when kernels=True
        self.role = _role  # "owner" | "child" (joined from the environment) | "memory"
        self.auto = False  # started by ensure_env_session(), adopts the first nested session's settings
        self.part: str | None = None
        self.meta: dict[str, Any] | None = None
        self.failed: str | None = None
        self.started = False
        self.closed = False
        self._pid = os.getpid()
        self._host: Session | None = None  # the session this one joined, when nested
        self._writer: PartWriter | None = None
        self._sampler: Any = None
        self._signals: dict[int, Any] = {}
        self._env_saved: dict[str, str | None] = {}
        self._top_counts: dict[int, int] = {}
        self._steady_pending = False
        self._capture = False
        self._capture_started = False
        self._writes_meta = False
        self._memory: _MemorySink | None = None
        self._last_dropped = 0
        self._dropped_base = 0  # the native core's drop count when this session began
        self._defer_arming = False  # auto session: warm-up not known until the script says
        # the native writer (docs/sessions.md): None (Python path), "wanted" (start once the
        # part is open: a child's part opens at its first record), "running", "stopped"
        self._nw: str | None = None

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
        proc = _proc
        with proc.lock:
            self.started = True
            self._pid = os.getpid()
            if proc.root is not None and not proc.root.closed:
                self._join(proc.root)
                proc.stack.append(self)
                return self
            # Records completed before this session belong to the in-memory session.
            _flush_locked(proc)
            self._dropped_base = int(_native_stats().get("dropped_records", 0) or 0)
            proc.root = self
            proc.stack.append(self)
            self._open_root()
        if self.path is not None:
            _ensure_flusher(proc)
        return self

    def _join(self, host: Session) -> None:
        self._host = host
        self.part = host.part
        entry = {
            "requested_path": self.requested_path,
            "warmup": self.warmup,
            "user": self.user_meta,
            "start_ns": _clock_ns(),
        }
        if host.auto and not host._adopted_once():
            # The script's own session inside `maxinstr run`: its settings are the run's
            # (except a warm-up given on `maxinstr run`'s command line, which wins).
            host.user_meta.update(self.user_meta)
            if host.meta is not None:
                host.meta["user"] = dict(host.user_meta)
                host.meta["requested_path"] = self.requested_path
                if host._defer_arming:
                    host.warmup = self.warmup
                    host.meta["warmup"] = self.warmup
                    host._defer_arming = False
                    host._arm_steady_state()
        elif self.path is not None and host.path is not None and self.path != host.path:
            warnings.warn(
                f"maxinstr: session {self.requested_path} opened inside the open session {host.path}: "
                "its stages are recorded in the outer run",
                RuntimeWarning,
                stacklevel=3,
            )
        if host.meta is not None:
            host.meta.setdefault("nested_sessions", []).append(entry)
            host._write_meta()
        if self.kernels and not host.kernels and host._writer is not None and host.path is not None and host.part:
            # kernels=True asked by the inner session (e.g. the script's own session under
            # `maxinstr run`): the process's recording is the host's, so the host collects.
            host.kernels = True
            host._start_kernels(host.path / fmt.PARTS_DIR / host.part)

    def _adopted_once(self) -> bool:
        return bool(self.meta and self.meta.get("nested_sessions"))

    def _open_root(self) -> None:
        rank = os.environ.get("RANK")
        self.part = fmt.part_name(self._pid, rank if rank not in (None, "") else None)
        if self.path is None:
            self.role = "memory"
            self._memory = _MemorySink(_proc.memory.limit)
            return
        from maxinstr.rundir import metadata

        part_dir = self.path / fmt.PARTS_DIR / self.part
        self._writer = PartWriter(part_dir, self._part_info(rank), fsync_interval_s=self.fsync_interval_s)
        if self.role == "owner":
            self.meta = metadata.collect(warmup=self.warmup, user=self.user_meta, requested_path=self.requested_path)
            self.meta["session"] = {"pid": self._pid, "part": self.part, "start_ns": _clock_ns(), "end_ns": None}
            self._writes_meta = rank in (None, "", "0")
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                with owners.locked(self.path):  # two sessions opening here decide one after the other
                    if rank in (None, "") and not os.environ.get(ENV_RUN_DIR):
                        live = owners.live_writers(self.path)
                        if live:
                            self._join_live_run(live)
                        else:
                            _clear_previous_run(self.path)
                    if self._writes_meta:
                        write_json_atomic(self.path / fmt.META_FILE, self.meta)
                    else:  # another rank: only when rank 0 has not written it (it overwrites ours)
                        write_json_atomic(self.path / fmt.META_FILE, self.meta, exclusive=True)
                    self._writer.open()
            except OSError as exc:
                self._disk_failed(exc)
                return
            self._nw = "wanted" if _native_writer_wanted() else None
            self._start_native_writer()
            self._set_child_env()
            if self.kernels:
                self._start_kernels(part_dir)
            self._arm_steady_state()
            local_rank = os.environ.get("LOCAL_RANK")
            if self.sample_hz > 0 and local_rank in (None, "", "0"):
                self._start_sampler(part_dir)
        # children create their part lazily, at their first record: a helper process that
        # records nothing leaves no empty part behind
        if self.role == "child":
            self._nw = "wanted" if _native_writer_wanted() else None
        self._install_signal_handlers()
        _register_mp_exit_hook()

    def _join_live_run(self, live: list[str]) -> None:
        """Another process still writes the run here: keep it, add this process's part to it
        (as ranks do) and leave its meta.json to its owner. Said once, naming that process."""
        self._writes_meta = False
        assert self._writer is not None
        self._writer.info["joined_live_run"] = live
        warnings.warn(
            f"maxinstr: {self.path} is the run of a live process ({'; '.join(live[:3])}"
            f"{' ...' if len(live) > 3 else ''}): this session adds its records to that run as part "
            f"{self.part} instead of replacing it",
            RuntimeWarning,
            stacklevel=4,
        )

    def _part_info(self, rank: str | None) -> dict[str, Any]:
        import socket

        def env_int(name: str) -> int | None:
            value = os.environ.get(name)
            try:
                return int(value) if value not in (None, "") else None
            except ValueError:
                return None

        return {
            "part": self.part,
            "pid": self._pid,
            "ppid": os.getppid(),
            "rank": env_int("RANK"),
            "local_rank": env_int("LOCAL_RANK"),
            "world_size": env_int("WORLD_SIZE"),
            "host": socket.gethostname(),
            "role": self.role,
            "started_ns": _clock_ns(),
            "started_unix_ns": time.time_ns(),
            "closed_ns": None,
            "status": "running",
        }

    def _disk_failed(self, exc: OSError) -> None:
        self.failed = exc.strerror or str(exc)
        warnings.warn(
            f"maxinstr: cannot write run directory {exc.filename or self.path}: {self.failed}; "
            "the program continues and stages are kept in memory only",
            RunDirWarning,
            stacklevel=4,
        )
        self._writer = None
        self._memory = _MemorySink(_proc.memory.limit)

    def close(self) -> None:
        """Flush and close the session (a second call does nothing)."""
        if self.closed or not self.started:
            self.closed = True
            return
        proc = _proc
        if os.getpid() != self._pid:
            # A fork child leaving the parent's `with session(...)`: close the child's part,
            # never the parent's run.
            _exit_process(reason="closed")
            self.closed = True
            return
        with proc.lock:
            self.closed = True
            if self in proc.stack:
                proc.stack.remove(self)
            if self._host is not None:
                host = self._host
                if host.meta is not None:
                    for entry in host.meta.get("nested_sessions", []):
                        if entry.get("requested_path") == self.requested_path and entry.get("end_ns") is None:
                            entry["end_ns"] = _clock_ns()
                            break
                    host._write_meta()
                return
            self._close_root(proc, reason="closed")
        _stop_flusher_if_idle(proc)

    def _close_root(self, proc: _Process, *, reason: str) -> None:
        """Final flush and files of the process's root session (caller holds the lock)."""
        native = _native()
        if native is not None and self._capture_started:
            try:
                native.profiler_stop()
            except Exception:  # noqa: BLE001
                pass
            if self.meta is not None:
                self.meta.setdefault("capture", {})["stop_ns"] = _clock_ns()
        if self._sampler is not None:
            try:
                self._sampler.stop()
            except Exception as exc:  # noqa: BLE001 - a broken sampler must not break close
                self._event("error", f"sampler stop failed: {type(exc).__name__}: {exc}")
            self._sampler = None
        if reason.startswith("SIG"):
            # Killed by a signal: never wait on a GPU that may be hung (the process must die);
            # give in-flight GPU records a bounded time to finish instead.
            _resolve_bounded(2.0)
            _flush_locked(proc, block=False)
        else:
            _flush_locked(proc, block=True)
        if self._nw == "running":
            self._stop_native_writer()
            _flush_locked(proc, block=False)  # records completed while it stopped: the Python path
        if self._kernels is not None:  # after the stage events resolved: the stages' GPU work is done
            self._stop_kernels()
        stats = _native_stats()
        if self._writer is not None:
            self._writer.close(
                status=reason,
                closed_ns=_clock_ns(),
                native=stats,
                dropped_records=int(stats.get("dropped_records", 0) or 0) - self._dropped_base,
                writer=self._writer.native_info or {"kind": "python"},
            )
        if self.meta is not None:
            self.meta["status"] = "closed"
            self.meta["session"]["end_ns"] = _clock_ns()
            self.meta["session"]["end_reason"] = reason
            self._write_meta()
        self._restore_signal_handlers()
        self._restore_env()
        if proc.root is self:
            proc.root = None
        if self in proc.stack:
            proc.stack.remove(self)

    # -- the native writer ------------------------------------------------------------------
    def _start_native_writer(self) -> None:
        """Start the core's writer thread on this part's files, or fall back to the Python
        flusher (said once per process) when it cannot start."""
        writer = self._writer
        if self._nw != "wanted" or writer is None or writer.failed or not writer._opened:
            return
        native = _native()
        start = getattr(native, "writer_start", None) if native is not None else None
        if start is None:
            self._nw = None
            if native is not None and not getattr(native, "__fake__", False):
                self._python_writer("this build of maxinstr._native has no native writer")
            return
        try:
            start(
                str(writer.part_dir / fmt.STAGES_FILE),
                str(writer.part_dir / fmt.STRINGS_FILE),
                interval_ms=_env_float(ENV_WRITER_INTERVAL_MS, DEFAULT_WRITER_INTERVAL_MS),
                threshold=int(_env_float(ENV_WRITER_THRESHOLD, DEFAULT_WRITER_THRESHOLD)),
                fsync_interval_s=self.fsync_interval_s,
            )
        except Exception as exc:  # noqa: BLE001 - instrumentation must never stop the program
            self._nw = None
            self._python_writer(f"the native writer did not start ({type(exc).__name__}: {exc})")
            return
        self._nw = "running"
        writer.native_info = {"kind": "native"}
        if self._steady_pending and not self._defer_arming and self.warmup > 0:
            native.writer_watch(self.warmup)

    def _python_writer(self, why: str) -> None:
        self._event("warning", f"{why}: the Python flusher writes the stage records")
        if self._writer is not None:
            self._writer.native_info = {"kind": "python", "why": why}
        global _PYTHON_WRITER_SAID
        if not _PYTHON_WRITER_SAID:
            _PYTHON_WRITER_SAID = True
            warnings.warn(
                f"maxinstr: {why}; the Python flusher writes the stage records (a SIGKILL can lose "
                "the records of the last flush interval)",
                RuntimeWarning,
                stacklevel=4,
            )

    def _poll_native_writer(self, native: Any, status: dict[str, Any] | None = None) -> None:
        """What the writer thread found: a write error (the one warning), the counts for
        part.json, the end of the warm-up."""
        try:
            st = status if status is not None else native.writer_status()
        except Exception as exc:  # noqa: BLE001
            self._event("error", f"native writer status failed: {type(exc).__name__}: {exc}")
            return
        writer = self._writer
        if writer is not None:
            writer.native_rows_written = int(st.get("rows_written", 0))
            writer.native_rows_dropped = int(st.get("rows_dropped", 0))
            info = writer.native_info if writer.native_info is not None else {}
            for key in ("rows_written", "rows_dropped", "batches", "max_batch", "signals", "fsyncs",
                        "dropped_attrs", "interval_ms", "threshold"):
                if key in st:
                    info[key] = st[key]
            writer.native_info = info
            err = st.get("error")
            if err and not writer.failed:
                code, message, filename = err
                writer._fail(OSError(int(code), str(message), str(filename)), "cannot write to")
        if self._steady_pending:
            steady = st.get("steady")
            if self._defer_arming and int(st.get("taken", 0) or 0) > 0:
                # records arrived before the script's own session said its warm-up: warm-up 0
                # (as _observe decides on the Python path)
                self._defer_arming = False
                if self.warmup == 0:
                    start = (self.meta or {}).get("session", {}).get("start_ns") or _clock_ns()
                    self._enter_steady_state(None, int(start))
                else:
                    native.writer_watch(self.warmup)
            elif steady is not None:
                self._enter_steady_state(int(steady[0]), int(steady[1]))

    def _stop_native_writer(self) -> None:
        """Final write and join of the writer thread; the records completed after its last
        take are left to the Python path (the caller drains once more)."""
        native = _native()
        self._nw = "stopped"
        try:
            st = native.writer_stop()
        except Exception as exc:  # noqa: BLE001
            self._event("error", f"native writer stop failed: {type(exc).__name__}: {exc}")
            return
        self._poll_native_writer(native, st)
        if self._writer is not None:
            names = int(st.get("names_written", 0) or 0)
            if names:
                self._writer._mark_written(list(range(names)))  # in strings.jsonl already
        if st.get("dropped_attrs"):
            self._event("warning", "attrs dropped: the Python flusher did not take them in time",
                        dropped_attrs=int(st["dropped_attrs"]))

    def _start_kernels(self, part_dir: Path) -> None:
        """kernels=True: start the in-process kernel collector (docs/kernels.md), or warn once
        why it cannot run and go on with events-only stages."""
        reason = None
        try:
            from maxinstr import kernels as kernels_mod

            collector, _writer = kernels_mod.start(part_dir, {"part": self.part, "pid": self._pid})
            reason = getattr(collector, "reason", None)
            self._kernels = None if reason else collector
        except Exception as exc:  # noqa: BLE001 - instrumentation must never stop the program
            reason = f"kernel collector failed to start: {type(exc).__name__}: {exc}"
        info = {"requested": True, "collector": getattr(self._kernels, "name", "none")}
        if reason:
            info["status"], info["reason"] = "unavailable", reason
            self._event("warning", f"kernels=True: {reason}")
            _warn_kernels_once(reason)
        else:
            info["status"] = "collecting"
        if self.meta is not None:
            self.meta["kernels"] = info
            self._write_meta()

    def _stop_kernels(self) -> None:
        collector, self._kernels = self._kernels, None
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

    def _write_meta(self) -> None:
        if self.meta is None or self.path is None or self.failed or not self._writes_meta or os.getpid() != self._pid:
            return
        try:
            write_json_atomic(self.path / fmt.META_FILE, self.meta)
        except OSError as exc:
            if self._writer is not None:
                self._writer._fail(exc, "cannot write to")

    # -- records ------------------------------------------------------------------------
    def flush(self) -> None:
        """Write every completed record now (blocks until finished GPU events resolve and the
        native writer has written them)."""
        with _proc.lock:
            _flush_locked(_proc, block=True)

    def records(self):
        """The records of this session so far, as a :class:`maxinstr.Run` (flushes first).

        For a directory session this is ``maxinstr.load(path)``; for the in-memory session
        the records held in memory.
        """
        target = self._host or self
        with _proc.lock:
            _flush_locked(_proc, block=False)
        if target.path is not None and not target.failed:
            from maxinstr.rundir import load

            return load(target.path)
        sink = target._memory if target._memory is not None else _proc.memory
        return _memory_run(sink, target)

    # -- internal: writing ----------------------------------------------------------------
    def _sink(self):
        if self._writer is not None and not self.failed:
            return self._writer
        return self._memory if self._memory is not None else _proc.memory

    def _event(self, kind: str, message: str, **fields: Any) -> None:
        if self._writer is not None:
            self._writer.event(kind, message, **fields)

    def _start_sampler(self, part_dir: Path) -> None:
        try:
            from maxinstr import sample

            start = getattr(sample, "start_sampler", None)
            if start is None:
                return
            self._sampler = start(part_dir, 1.0 / self.sample_hz)
        except Exception as exc:  # noqa: BLE001 - sampling is optional; recording goes on
            self._sampler = None
            self._event("warning", f"sampler not started: {type(exc).__name__}: {exc}")

    # -- internal: warm-up and the profiler capture range ---------------------------------
    def _arm_steady_state(self) -> None:
        self._capture = bool(os.environ.get(ENV_CAPTURE)) and self.role == "owner"
        self._steady_pending = True
        self._top_counts.clear()
        if self.warmup == 0 and not self._defer_arming:
            self._enter_steady_state(None, _clock_ns())
        elif self._nw == "running" and not self._defer_arming:
            native = _native()
            if native is not None:
                native.writer_watch(self.warmup)  # the writer thread sees the rows: it counts

    def _observe(self, rows: np.ndarray) -> None:
        """Count completed top-level stages; steady state begins once some top-level name
        has completed ``warmup`` times (its next instance is the first steady one)."""
        if not self._steady_pending or len(rows) == 0:
            return
        if self._defer_arming:
            # `maxinstr run` without a warm-up, and the script opened no session of its own
            # before its first stage completed: warm-up 0, steady state from the start.
            self._defer_arming = False
            if self.warmup == 0:
                start = (self.meta or {}).get("session", {}).get("start_ns") or _clock_ns()
                self._enter_steady_state(None, int(start))
                return
        top = rows[(rows["depth"] == 0) & ((rows["flags"] & fmt.MARK) == 0)]
        if len(top) == 0:
            return
        top = top[np.argsort(top["host_end_ns"], kind="stable")]
        ids, counts = np.unique(top["name_id"], return_counts=True)
        for name_id, count in zip(ids.tolist(), counts.tolist()):
            before = self._top_counts.get(name_id, 0)
            self._top_counts[name_id] = before + count
            if before + count >= self.warmup:
                # the warmup-th instance of this name ends the warm-up
                nth = top["host_end_ns"][top["name_id"] == name_id][self.warmup - before - 1]
                self._enter_steady_state(name_id, int(nth))
                return

    def _enter_steady_state(self, name_id: int | None, at_ns: int) -> None:
        self._steady_pending = False
        if self.meta is None:
            return
        self.meta["steady_state"] = {
            "name": None if name_id is None else _proc.names.get(name_id),
            "start_ns": at_ns,
            "detected_ns": _clock_ns(),
        }
        if self._capture and not self._capture_started:
            native = _native()
            ok = False
            if native is not None:
                try:
                    ok = bool(native.profiler_start())
                except Exception as exc:  # noqa: BLE001
                    self._event("warning", f"profiler_start failed: {type(exc).__name__}: {exc}")
            self._capture_started = ok
            self.meta["capture"] = {"requested": os.environ.get(ENV_CAPTURE), "start_ns": _clock_ns(), "started": ok}
        self._write_meta()

    # -- internal: child processes ---------------------------------------------------------
    def _set_child_env(self) -> None:
        assert self.path is not None
        for key, value in ((ENV_SESSION_DIR, str(self.path)), (ENV_SESSION_PID, str(self._pid))):
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

    # -- internal: signals -------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal only works there; atexit still closes the session
        wanted = [signal.SIGTERM, signal.SIGHUP]
        if signal.getsignal(signal.SIGINT) is signal.SIG_DFL:
            wanted.append(signal.SIGINT)  # Python's KeyboardInterrupt already unwinds cleanly
        for signum in wanted:
            try:
                previous = signal.getsignal(signum)
                if previous is _on_signal:  # left installed by a session closed off the main thread
                    self._signals[signum] = _SAVED_SIGNALS.get(signum, signal.SIG_DFL)
                    continue
                if previous is signal.SIG_IGN or previous is None:
                    continue
                signal.signal(signum, _on_signal)
                _SAVED_SIGNALS[signum] = previous
                self._signals[signum] = previous
            except (ValueError, OSError):
                continue

    def _restore_signal_handlers(self) -> None:
        # From another thread (or a fork child) ours stays installed; it chains to the saved
        # handler when no session is open, so the program's own handling is kept either way.
        if threading.current_thread() is threading.main_thread() and os.getpid() == self._pid:
            for signum in list(self._signals):
                try:
                    if signal.getsignal(signum) is _on_signal:  # leave a handler set after ours alone
                        signal.signal(signum, _SAVED_SIGNALS.pop(signum, signal.SIG_DFL))
                except (ValueError, OSError):
                    pass
        self._signals.clear()


_SAVED_SIGNALS: dict[int, Any] = {}  # signal -> the handler ours replaced (process-wide)
_KERNELS_WARNED: set[str] = set()


def _warn_kernels_once(reason: str) -> None:
    """One plain warning per process and reason: kernels=True could not collect here."""
    if reason in _KERNELS_WARNED:
        return
    _KERNELS_WARNED.add(reason)
    warnings.warn(f"maxinstr: kernels=True: {reason}", RuntimeWarning, stacklevel=6)


def _clear_previous_run(path: Path) -> None:
    """A session opened on an existing run directory replaces that run, once no process of it
    is alive (the caller asked :func:`owners.live_writers`): its meta.json and parts/ go
    (nothing else in the folder is touched), so two runs never merge."""
    import json
    import shutil

    meta = path / fmt.META_FILE
    if not meta.is_file():
        return
    try:
        old = json.loads(meta.read_bytes())
    except (OSError, ValueError):
        return  # not ours to delete
    if not isinstance(old, dict) or old.get("format") != fmt.FORMAT_NAME:
        return
    shutil.rmtree(path / fmt.PARTS_DIR, ignore_errors=True)
    meta.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------
# draining and the flusher thread


def _native_stats() -> dict[str, Any]:
    native = _native()
    if native is None:
        return {}
    try:
        return dict(native.stats())
    except Exception:  # noqa: BLE001
        return {}


def _flush_locked(proc: _Process, *, block: bool = False, periodic: bool = False) -> int:
    """Drain the native core once into the current sink. Returns the rows drained (by the
    Python path). Unless ``periodic`` (the flusher's own round), also waits until the native
    writer has written every record completed so far."""
    native = _native()
    if native is None:
        return 0
    outer = proc.flushing_thread
    proc.flushing_thread = threading.get_ident()
    try:
        return _drain_into_sink(proc, native, block, periodic)
    finally:
        proc.flushing_thread = outer
        if outer is None and proc.deferred_signal is not None and threading.current_thread() is threading.main_thread():
            signum, proc.deferred_signal = proc.deferred_signal, None
            _on_signal(signum, None)


def _drain_into_sink(proc: _Process, native: Any, block: bool, periodic: bool = False) -> int:
    root = proc.root
    if root is not None and root._nw == "wanted":
        _start_child_writer(root, native)
    try:
        if periodic and not block and hasattr(native, "resolve_async"):
            native.resolve_async()  # elapsed-time calls on the core's placer thread, not under the GIL
        else:
            native.resolve(block)
        data, new_names, attrs = native.drain(-1)
    except Exception as exc:  # noqa: BLE001 - never let recording break the program
        root = proc.root
        if root is not None:
            root._event("error", f"drain failed: {type(exc).__name__}: {exc}")
        return 0
    for name_id, name in new_names:
        proc.names[int(name_id)] = name
    rows = np.frombuffer(data, dtype=fmt.STAGE_DTYPE) if data else np.empty(0, dtype=fmt.STAGE_DTYPE)
    attrs = [(int(rid), a) for rid, a in attrs]
    root = proc.root
    sink = root._sink() if root is not None else proc.memory
    try:
        sink.write(rows, proc.names, attrs)
    except Exception as exc:  # noqa: BLE001 - never raise into the program; the loss is counted
        _count_unwritten(sink, root, len(rows), exc)
    if root is not None:
        if root._nw == "running":
            if not periodic:
                try:
                    native.writer_flush()
                except Exception as exc:  # noqa: BLE001
                    root._event("error", f"native writer flush failed: {type(exc).__name__}: {exc}")
            root._poll_native_writer(native)
        root._observe(rows)
        _note_drops(root)
        if root._kernels is not None:
            try:
                root._kernels.flush()
            except Exception as exc:  # noqa: BLE001
                root._event("error", f"kernel flush failed: {type(exc).__name__}: {exc}")
    return len(rows)


def _count_unwritten(sink: Any, root: Session | None, rows: int, exc: Exception) -> None:
    """A batch the sink could not take (a bug, or a value nothing could encode): its records
    are counted as dropped where the run says so (part.json ``rows_dropped_disk``, Run.notes)."""
    if isinstance(sink, PartWriter):
        sink.rows_dropped += rows
    else:
        sink.dropped += rows
    if root is not None:
        root._event("error", f"{rows} record(s) not written: {type(exc).__name__}: {exc}", dropped_records=rows)


def _start_child_writer(root: Session, native: Any) -> None:
    """A child's part opens at its first record: then its native writer starts."""
    try:
        pending = int(native.stats().get("pending_records", 0) or 0)
    except Exception:  # noqa: BLE001
        return
    if pending and root._writer is not None and root._writer.open_or_warn():
        root._start_native_writer()


def _native_writer_wanted() -> bool:
    return os.environ.get(ENV_NATIVE_WRITER, "1").strip().lower() not in ("0", "false", "no", "off")


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        return default
    return value if value > 0 else default


_PYTHON_WRITER_SAID = False  # the fallback to the Python writer was said (once per process)


def _resolve_bounded(timeout_s: float) -> None:
    """Non-blocking resolves until no GPU event is in flight or ``timeout_s`` passed."""
    native = _native()
    if native is None:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            native.resolve(False)
            if not int(native.stats().get("events_in_flight", 0) or 0):
                return
        except Exception:  # noqa: BLE001
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.005)


def _note_drops(root: Session) -> None:
    """Say in events.jsonl (and once as a warning) when the native buffer dropped records."""
    stats = _native_stats()
    dropped = int(stats.get("dropped_records", 0) or 0) - root._dropped_base
    if dropped > root._last_dropped:
        if root._last_dropped == 0:
            warnings.warn(
                f"maxinstr: the record buffer was full and dropped {dropped} stage record(s); "
                "the count is kept in part.json",
                RuntimeWarning,
                stacklevel=2,
            )
        root._event("warning", "record buffer full: records dropped", dropped_records=dropped)
        root._last_dropped = dropped


def _flusher_main(proc_ref: weakref.ref[_Process]) -> None:
    while True:
        proc = proc_ref()
        if proc is None or proc is not _proc or proc.pid != os.getpid():
            return
        root = proc.root
        if root is None or proc.stop.is_set():
            return
        interval = root.flush_interval_s
        if root._steady_pending and root._capture:
            interval = min(interval, 0.01)  # start the capture close to the warm-up's end
        try:
            with proc.lock:
                drained = _flush_locked(proc, periodic=True)
        except Exception:  # noqa: BLE001 - a flusher that dies loses the run; keep going
            drained = 0
        if drained < _BUSY_ROWS:
            proc.stop.wait(interval)
        del proc, root


def _ensure_flusher(proc: _Process) -> None:
    if proc.flusher is not None and proc.flusher.is_alive():
        return
    proc.stop.clear()
    proc.flusher = threading.Thread(
        target=_flusher_main, args=(weakref.ref(proc),), name="maxinstr-flusher", daemon=True
    )
    proc.flusher.start()


def _stop_flusher_if_idle(proc: _Process) -> None:
    if proc.root is not None:
        return
    proc.stop.set()
    t = proc.flusher
    if t is not None and t is not threading.current_thread():
        t.join(timeout=2.0)
    proc.flusher = None


# ------------------------------------------------------------------------------------------
# process exit: atexit, signals, multiprocessing children, fork


def _exit_process(reason: str = "exit") -> None:
    """Close this process's recording: close still-open stages (flag UNCLOSED), write the
    last records, close the part and (owner) meta.json. Idempotent per process."""
    proc = _proc
    if proc.pid != os.getpid() or proc.exited or proc.closing:
        return
    proc.closing = True
    acquired = proc.lock.acquire(timeout=5.0)  # never hang an exiting program
    try:
        if proc.exited:
            return
        proc.exited = True
        root = proc.root
        if root is None:
            return
        native = _native()
        if native is not None:
            try:
                native.close_open(reason)
            except Exception:  # noqa: BLE001
                pass
        for s in list(proc.stack):
            s.closed = True
        root.closed = True
        root._close_root(proc, reason=reason)
        proc.stack.clear()
    finally:
        if acquired:
            proc.lock.release()
        proc.closing = False
    proc.stop.set()
    if proc.pending_signal is not None and reason not in ("SIGTERM", "SIGHUP", "SIGINT"):
        _die_by(proc.pending_signal)  # a terminating signal arrived while we finished


def _on_signal(signum: int, frame: Any) -> None:
    proc = _proc
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
                _flush_locked(proc)
            finally:
                proc.lock.release()
        previous(signum, frame)
        return
    # Default action (terminate): finish the run, then die by the same signal.
    _exit_process(reason=signal.Signals(signum).name)
    _die_by(signum)


def _die_by(signum: int) -> None:
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_exit_process)

_MP_TOKEN = type("_MPToken", (), {})()  # kept alive: multiprocessing's after-fork registry is weak


def _register_mp_exit_hook() -> None:
    """multiprocessing children end with os._exit (no atexit); their finalizers do run."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    try:
        if mp.parent_process() is None:
            return
        from multiprocessing import util

        util.Finalize(None, _exit_process, exitpriority=-100)
        # a child's bootstrap clears finalizers registered before it; this re-registers after
        util.register_after_fork(_MP_TOKEN, lambda _: util.Finalize(None, _exit_process, exitpriority=-100))
    except Exception:  # noqa: BLE001
        pass


def _before_fork() -> None:
    # Hold the lock across fork so the child never inherits a half-written batch.
    _proc.lock.acquire(timeout=1.0)


def _after_fork_parent() -> None:
    try:
        _proc.lock.release()
    except RuntimeError:
        pass


def _after_fork_child() -> None:
    """A fork child records into a part of its own; nothing of the parent's is kept."""
    global _proc
    parent = _proc
    child = _Process()  # fresh locks (the parent's may be held by a thread that is gone)
    child.names = dict(parent.names)
    root = parent.root
    if root is not None and root.path is not None and not root.failed:
        joined = Session(root.path, _role="child", sample_hz=0, flush_interval_s=root.flush_interval_s)
        joined.started = True
        joined._pid = child.pid
        _proc = child
        child.root = joined
        child.stack.append(joined)
        joined.part = fmt.part_name(child.pid)
        joined._writer = PartWriter(
            root.path / fmt.PARTS_DIR / joined.part, joined._part_info(os.environ.get("RANK")),
            fsync_interval_s=root.fsync_interval_s,
        )
        # the core's writer thread did not follow the fork: the child starts its own writer on
        # its own part once it has records (_start_child_writer)
        joined._nw = "wanted" if _native_writer_wanted() else None
        if root._writer is not None:
            for f in root._writer._files.values():  # the parent's descriptors: not ours to write
                f.close()
        _ensure_flusher(child)
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            try:
                mp_util.register_after_fork(
                    _MP_TOKEN, lambda _: mp_util.Finalize(None, _exit_process, exitpriority=-100)
                )
            except Exception:  # noqa: BLE001
                pass
    else:
        _proc = child


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)


# ------------------------------------------------------------------------------------------
# public functions


def session(
    path: str | os.PathLike[str] | None,
    *,
    warmup: int = 0,
    sample_hz: float = DEFAULT_SAMPLE_HZ,
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
    kernels: bool = False,
    **user_meta: Any,
) -> Session:
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
    proc = _proc
    if proc.stack:
        return proc.stack[-1]
    return _default


def ensure_env_session() -> Session | None:
    """Open the session the environment asks for, if any, and return the open root session.

    * ``MAXINSTR_SESSION_DIR`` set by another process's open session: join it (this
      process writes its own part; the other owns meta.json).
    * ``MAXINSTR_RUN_DIR`` set (``maxinstr run``): open the run's session here; a session
      the script opens later joins it and gives the run its warm-up and user metadata.

    Called by ``maxinstr run``'s start-up hook and when ``maxinstr.record`` is imported.
    """
    proc = _proc
    if proc.root is not None and not proc.root.closed:
        return proc.root
    joined_dir = os.environ.get(ENV_SESSION_DIR)
    owner = os.environ.get(ENV_SESSION_PID)
    try:
        if joined_dir and owner and owner != str(os.getpid()):
            s = Session(joined_dir, _role="child", sample_hz=0)
            return s.start()
        run_dir = os.environ.get(ENV_RUN_DIR)
        if run_dir:
            warmup_env = os.environ.get(ENV_WARMUP, "").strip()
            s = Session(run_dir, warmup=int(warmup_env) if warmup_env.isdigit() else 0)
            s.auto = True
            # Without `maxinstr run --warmup`, wait for the script's own session to say how
            # many warm-up instances there are before starting a capture.
            s._defer_arming = not warmup_env.isdigit()
            s.requested_path = None
            return s.start()
    except Exception as exc:  # noqa: BLE001 - instrumentation must never stop the program
        warnings.warn(f"maxinstr: could not open the session from the environment: {exc}", RuntimeWarning, stacklevel=2)
    return None


def _memory_run(sink: _MemorySink, owner: Session):
    from maxinstr.rundir.reader import RUN_STAGE_DTYPE, Run

    rows = np.concatenate(sink.chunks) if sink.chunks else np.empty(0, dtype=fmt.STAGE_DTYPE)
    out = np.zeros(len(rows), dtype=RUN_STAGE_DTYPE)
    for col in fmt.STAGE_DTYPE.names or ():
        out[col] = rows[col]
    names_map = _proc.names
    used = np.unique(rows["name_id"]) if len(rows) else np.empty(0, np.int32)
    names = np.empty(len(used), dtype=object)
    names[:] = [names_map.get(int(i), f"<name {int(i)}>") for i in used]
    if len(rows):
        out["name_id"] = np.searchsorted(used, rows["name_id"]).astype(np.int32)
    out["pid"] = os.getpid()
    rank = os.environ.get("RANK")
    out["rank"] = int(rank) if rank not in (None, "") and rank.isdigit() else -1
    out = out[np.argsort(out["host_start_ns"], kind="stable")]
    notes = []
    if sink.dropped:
        notes.append(f"in-memory session full: {sink.dropped} record(s) dropped (limit {sink.limit})")
    dropped_native = int(_native_stats().get("dropped_records", 0) or 0)
    if dropped_native:
        notes.append(f"record buffer full: {dropped_native} record(s) dropped before they were drained")
    meta = {
        "format": fmt.FORMAT_NAME,
        "version": fmt.FORMAT_VERSION,
        "status": "memory",
        "warmup": owner.warmup,
        "user": dict(owner.user_meta),
    }
    return Run(
        path=None,
        meta=meta,
        stages=out,
        names=names,
        attrs=dict(sink.attrs),
        parts=[{"name": fmt.part_name(), "pid": os.getpid(), "rows": len(out)}],
        notes=notes,
    )
