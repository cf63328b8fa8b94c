"""Where a session's drained records go (:class:`Sink`): :class:`MemorySink` (in memory, bounded:
the default session, and a session whose directory could not be written), :class:`PythonSink`
(:class:`~maxinstr.rundir.writer.PartWriter` appends rows, names and attrs to the part's files) and
:class:`NativeSink` (the core's writer thread appends rows and names without the GIL, docs/sessions.md
"The native writer"; drains then hand Python only attrs, and the last rows once it has stopped).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import numpy as np

from maxinstr import config
from maxinstr._attrs import plain
from maxinstr.rundir import format as fmt
from maxinstr.rundir.reader import RUN_STAGE_DTYPE, Run
from maxinstr.rundir.writer import PartWriter

Attrs = list[tuple[int, dict[str, Any]]]
T = TypeVar("T")


def attempt(event: Callable[..., None], what: str, call: Callable[[], T], kind: str = "error") -> T | None:
    """``call()``, or None when it raises: then one line in the run's events (``what`` failed, why).
    Instrumentation never stops the program, nor a close."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001
        event(kind, f"{what} failed: {type(exc).__name__}: {exc}")
        return None


class Sink(Protocol):
    """What a drained batch of records is handed to. No method raises for a disk problem: what
    could not be written is counted where the run says so (part.json, Run.notes)."""

    kind: str  # part.json ``writer.kind``: ``memory``, ``python`` or ``native``

    def write(self, rows: np.ndarray, names: dict[int, str], attrs: Attrs) -> None:
        """One drained batch: ``rows`` (STAGE_DTYPE), every name the process knows, the attrs."""

    def count_unwritten(self, rows: int, attrs: int = 0) -> None:
        """A batch :meth:`write` raised on or never reached (a bug, Ctrl-C after the drain)."""

    def begin_close(self, deadline: float, *, restart: bool = False) -> None:
        """Attrs not written by ``deadline`` (``time.monotonic()``) are counted, not written: close
        is bounded whatever other threads record. The earliest deadline holds, unless ``restart``."""

    def event(self, kind: str, message: str, **fields: Any) -> None:
        """One warning/error line for the run (events.jsonl where there is one)."""

    def disk_error(self, exc: OSError) -> None:
        """Another file of the run (meta.json) could not be written: said once, nothing more written."""

    def settle(self, *, wait: bool) -> dict[str, Any] | None:
        """After a drain; with ``wait``, return once every record completed so far is written."""

    def close(self, **part_fields: Any) -> None:
        """The last write: part.json with ``part_fields`` (status, counts), files closed."""


class MemorySink:
    """Keeps drained records in memory, up to ``limit`` rows (the rest are counted)."""

    kind = "memory"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[np.ndarray] = []
        self.attrs: dict[int, dict[str, Any]] = {}
        self.rows = 0
        self.dropped = 0

    def write(self, rows: np.ndarray, names: dict[int, str], attrs: Attrs) -> None:
        room = max(self.limit - self.rows, 0)
        if len(rows) > room:
            self.dropped += len(rows) - room
            rows = rows[:room]
        if len(rows):
            self.chunks.append(rows.copy())
            self.rows += len(rows)
            kept = set(rows["id"].tolist()) if attrs else set()
            for rid, a in attrs:
                if rid in kept:
                    self.attrs[int(rid)] = plain(a)  # data, never the caller's objects

    def count_unwritten(self, rows: int, attrs: int = 0) -> None:
        self.dropped += rows

    # no disk, nothing slow to bound; no events.jsonl (records() notes say what was dropped)
    def begin_close(self, deadline: float, *, restart: bool = False) -> None: ...

    def event(self, kind: str, message: str, **fields: Any) -> None: ...

    def disk_error(self, exc: OSError) -> None: ...

    def settle(self, *, wait: bool) -> None: ...

    def close(self, **part_fields: Any) -> None: ...

    def to_run(self, names_map: dict[int, str], *, warmup: int, user: dict[str, Any], native_dropped: int) -> Run:
        """The records kept, as a :class:`maxinstr.Run` (``names_map``: the process's name table;
        ``native_dropped``: records the core's buffer dropped before they were drained)."""
        rows = np.concatenate(self.chunks) if self.chunks else np.empty(0, dtype=fmt.STAGE_DTYPE)
        out = np.zeros(len(rows), dtype=RUN_STAGE_DTYPE)
        for col in fmt.STAGE_DTYPE.names or ():
            out[col] = rows[col]
        used = np.unique(rows["name_id"]) if len(rows) else np.empty(0, np.int32)
        names = np.empty(len(used), dtype=object)
        names[:] = [names_map.get(int(i), f"<name {int(i)}>") for i in used]
        if len(rows):
            out["name_id"] = np.searchsorted(used, rows["name_id"]).astype(np.int32)
        out["pid"] = os.getpid()
        rank = config.rank()
        out["rank"] = -1 if rank is None else rank
        out = out[np.argsort(out["host_start_ns"], kind="stable")]
        notes = []
        if self.dropped:
            notes.append(f"in-memory session full: {self.dropped} record(s) dropped (limit {self.limit})")
        if native_dropped:
            notes.append(f"record buffer full: {native_dropped} record(s) dropped before they were drained")
        meta = {"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION, "status": "memory", "warmup": warmup,
                "user": dict(user)}
        return Run(path=None, meta=meta, stages=out, names=names, attrs=dict(self.attrs),
                   parts=[{"name": fmt.part_name(), "pid": os.getpid(), "rows": len(out)}], notes=notes)


class PythonSink:
    """The Python writer: the session's flusher appends rows, names and attrs to the part."""

    kind = "python"

    def __init__(self, part: PartWriter, why: str | None = None) -> None:
        self.part = part
        self.info: dict[str, Any] = {"kind": "python"} if why is None else {"kind": "python", "why": why}

    def write(self, rows: np.ndarray, names: dict[int, str], attrs: Attrs) -> None:
        self.part.write(rows, names, attrs)

    def count_unwritten(self, rows: int, attrs: int = 0) -> None:
        self.part.rows_dropped += rows
        self.part.attrs_dropped_disk += attrs

    def begin_close(self, deadline: float, *, restart: bool = False) -> None:
        if restart or self.part.deadline is None or deadline < self.part.deadline:
            self.part.deadline = deadline

    def event(self, kind: str, message: str, **fields: Any) -> None:
        self.part.event(kind, message, **fields)

    def disk_error(self, exc: OSError) -> None:
        self.part.fail(exc, "cannot write to")

    def settle(self, *, wait: bool) -> dict[str, Any] | None:
        return None

    def close(self, **part_fields: Any) -> None:
        self.part.close(writer=self.info, **part_fields)


class NativeWriterUnavailable(Exception):
    """The core's writer thread could not start; ``str(exc)`` says why in one line."""


class NativeSink(PythonSink):
    """The core's writer thread writes the rows and names of this part (no GIL); the session's
    drains hand :meth:`write` the attrs, and after :meth:`stop` the rows completed since the
    thread's last take. ``pending`` until :meth:`start` (a fork or spawn child starts it at its
    first stage's enter, so a helper process that records nothing leaves no part)."""

    kind = "native"

    def __init__(self, part: PartWriter, native: Any, *, fsync_interval_s: float) -> None:
        super().__init__(part)
        self.native = native
        self.fsync_interval_s = fsync_interval_s
        self.state = "pending"  # -> "running" -> "stopped"

    @property
    def running(self) -> bool:
        return self.state == "running"

    def start(self) -> None:
        """Start the writer thread on the part's files (raises NativeWriterUnavailable)."""
        part = self.part
        if part.failed or not part.is_open:
            raise NativeWriterUnavailable(f"the part's files are not open ({part.failed or 'not created'})")
        try:
            self.native.writer_start(str(part.part_dir / fmt.STAGES_FILE), str(part.part_dir / fmt.STRINGS_FILE),
                                     interval_ms=config.writer_interval_ms(),
                                     threshold=config.writer_threshold_records(),
                                     fsync_interval_s=self.fsync_interval_s)
        except Exception as exc:  # noqa: BLE001 - a thread or file that cannot be created: the Python writer
            raise NativeWriterUnavailable(f"the native writer did not start ({type(exc).__name__}: {exc})") from None
        self.state = "running"
        self.info = {"kind": self.kind}  # part.json says "python" until the thread runs

    def settle(self, *, wait: bool) -> dict[str, Any] | None:
        if not self.running:
            return None
        if wait:
            attempt(self.event, "native writer flush", self.native.writer_flush)
        return self.poll()

    def poll(self, status: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """What the writer thread found (``status``, else asked now): its counts go to
        part.json; a write error is the PartWriter's one warning. Returns the status."""
        st = status if status is not None else attempt(self.event, "native writer status", self.native.writer_status)
        if st is None:
            return None
        part = self.part
        part.native_rows_written = int(st.get("rows_written", 0))
        part.native_rows_dropped = int(st.get("rows_dropped", 0))
        self.info.update({key: st[key] for key in ("rows_written", "rows_dropped", "batches", "max_batch", "signals",
                                                   "fsyncs", "dropped_attrs", "interval_ms", "threshold") if key in st})
        err = st.get("error")
        if err and not part.failed:
            code, message, filename = err
            part.fail(OSError(int(code), str(message), str(filename)), "cannot write to")
        return st

    def stop(self) -> dict[str, Any] | None:
        """The thread's last write and join. The records completed after its last take are
        left in the core's buffer: the caller drains once more (they reach :meth:`write`).
        Returns the thread's final status."""
        self.state = "stopped"
        st = attempt(self.event, "native writer stop", self.native.writer_stop)
        if st is None:
            return None
        self.poll(st)
        if names := int(st.get("names_written", 0) or 0):
            self.part.mark_names_written(list(range(names)))  # in strings.jsonl already
        if st.get("dropped_attrs"):
            self.event("warning", "attrs dropped: the Python flusher did not take them in time",
                       dropped_attrs=int(st["dropped_attrs"]))
        return st
