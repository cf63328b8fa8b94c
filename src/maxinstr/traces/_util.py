"""What the trace readers share: the Trace's assembly (:class:`TraceBuilder`), columnar helpers
(every one works on whole numpy columns), and reading files safely (bounded gunzip, SQLite)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from maxinstr._files import json_problem
from maxinstr._text import safe_name
from maxinstr.columns import factorize
from maxinstr.errors import TraceError
from maxinstr.traces import _sqlite_columns
from maxinstr.traces.model import INVALID_NS, NO_ID, Calls, CallKind, GpuOps, Ranges, StringTable, Trace

T = TypeVar("T")

Progress = Callable[[str], None]

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"


def report(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def int_column(values, path: object, what: str, *, invalid: int | None = None) -> np.ndarray:
    """``values`` (strings, ints or floats) as int64; a TraceError naming the first bad value, unless
    ``invalid`` is given: then a value that is no int64 (text, a fraction, a bool, None) becomes it
    (time columns: model.INVALID_NS, which model.TimeCheck drops and counts)."""
    if isinstance(values, np.ndarray):
        arr = values
    elif invalid is not None and not all(type(v) is int for v in values):
        arr = np.empty(len(values), dtype=object)  # per value: numpy would read True as 1, 2.5 as 2.5
        arr[:] = list(values)
    else:
        try:
            arr = np.asarray(values)
        except ValueError:  # lists of different lengths among the values
            arr = np.empty(0)
    if arr.ndim != 1 or len(arr) != len(values):  # lists in the values ([1] where 1 belongs): never a 2-D column
        arr = np.empty(len(values), dtype=object)
        arr[:] = list(values)
    with suppress(ValueError, TypeError, OverflowError):
        if arr.dtype.kind in "iu":
            if arr.dtype.kind == "u" and len(arr) and arr.max() > np.iinfo(np.int64).max:
                raise OverflowError
            return arr.astype(np.int64, copy=False)
        if arr.dtype.kind == "b" and invalid is None:
            return arr.astype(np.int64)
        if arr.dtype.kind == "f":
            if len(arr) and not (np.all(np.isfinite(arr)) and np.abs(arr).max() < 9.2e18):
                raise ValueError
            if invalid is not None and len(arr) and bool((arr != np.floor(arr)).any()):
                raise ValueError  # a fraction where the file must hold an integer
            return arr.astype(np.int64)
        if arr.dtype.kind in "USO":
            out = np.array(arr.tolist(), dtype=np.int64)
            if out.shape == arr.shape and (invalid is None or arr.dtype.kind != "O"
                                           or all(type(v) in (int, str) for v in arr.tolist())):
                return out
    if invalid is not None:
        return np.array([_int_or(v, invalid) for v in arr.tolist()], dtype=np.int64)
    for i, value in enumerate(arr.tolist()):
        try:
            _strict_int(value)
        except (ValueError, TypeError, OverflowError):
            raise TraceError(path, f"{what}: row {i + 1}: not an integer: {str(value)[:40]!r}") from None
    raise TraceError(path, f"{what}: values out of the int64 range")


def intern(strings: StringTable, values) -> np.ndarray:
    """int32 ids in ``strings`` for a column of names, through a dict: ``StringTable.ids_for``'s
    fixed-width array of 1M kernel names of thousands of characters ('<U4000') would need 16 GB."""
    seq = values.tolist() if isinstance(values, np.ndarray) else list(values)
    if not seq:
        return np.empty(0, dtype=np.int32)
    local: dict = {}
    codes = np.fromiter((local.setdefault(v, len(local)) for v in seq), dtype=np.int64, count=len(seq))
    mapping = np.fromiter((strings.intern(_as_text(u)) for u in local), dtype=np.int32, count=len(local))
    return mapping[codes]


def _as_text(value) -> str:
    if value is None:
        return ""
    # a JSON "\udcff" escape decodes to a lone surrogate, which no view could print or write
    return safe_name(value if isinstance(value, str) else str(value))


def _int_or(value, invalid: int) -> int:
    """``value`` as an int when it is one in the int64 range (a float only when whole), else ``invalid``."""
    if isinstance(value, float) and not value.is_integer():
        return invalid
    try:
        number = _strict_int(value)
    except (ValueError, TypeError, OverflowError):
        return invalid
    return number if -(2**63) <= number < 2**63 else invalid  # (a whole float may be beyond int64: 1.5e73)


def _strict_int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, float, str, bytes)):
        raise TypeError(value)
    result = int(value)  # (NaN: ValueError, infinity: OverflowError)
    if not isinstance(value, float) and not -(2**63) <= result < 2**63:
        raise OverflowError(value)
    return result


def trailing_int(values: np.ndarray, path: object, what: str) -> np.ndarray:
    """Integers from strings like ``"Agent 1"`` or ``"1"`` (parsed once per distinct value)."""
    uniques, inverse = factorize(values)
    parsed = np.empty(len(uniques), dtype=np.int64)
    for i, u in enumerate(uniques):
        digits = u.rstrip()
        j = len(digits)
        while j > 0 and digits[j - 1].isdigit():
            j -= 1
        if j == len(digits) or len(digits) - j > 18:
            raise TraceError(path, f"{what}: no number (or one out of range) in {u[:40]!r}")
        parsed[i] = int(digits[j:])
    return parsed[inverse]


def pair_push_pop(
    tid: np.ndarray, time_ns: np.ndarray, is_push: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(push_index, pop_index, unmatched_pops, unclosed_pushes)``: push and pop events paired per
    thread, columnarly. The nesting depth is a +1/-1 walk per thread; a push reaching depth d pairs
    with the next pop leaving d (in each (thread, d) group they alternate). A pop with no earlier
    push and a push never popped are dropped and counted."""
    n = len(tid)
    if n == 0:
        empty = np.empty(0, np.int64)
        return empty, empty, 0, 0
    order = np.lexsort((np.arange(n), time_ns, tid))
    t_sorted = tid[order]
    step = np.where(is_push[order], 1, -1).astype(np.int64)
    depth = np.cumsum(step)
    starts = np.flatnonzero(np.r_[True, t_sorted[1:] != t_sorted[:-1]])
    base = np.repeat(depth[starts] - step[starts], np.diff(np.r_[starts, n]))
    depth = depth - base
    level = np.where(step > 0, depth, depth + 1)
    grp_order = np.lexsort((np.arange(n), level, t_sorted))
    g_tid = t_sorted[grp_order]
    g_level = level[grp_order]
    g_push = step[grp_order] > 0
    new_group = np.r_[True, (g_tid[1:] != g_tid[:-1]) | (g_level[1:] != g_level[:-1])]
    # rank within group; groups alternate, so a push pairs with the element right after it
    # when that element is in the same group and is a pop
    same_next = np.r_[~new_group[1:], False]
    next_is_pop = np.r_[~g_push[1:], False]
    pair_start = g_push & same_next & next_is_pop
    push_pos = np.flatnonzero(pair_start)
    pop_pos = push_pos + 1
    push_idx = order[grp_order[push_pos]]
    pop_idx = order[grp_order[pop_pos]]
    n_push = int(g_push.sum())
    unclosed = n_push - len(push_idx)
    unmatched = (n - n_push) - len(pop_idx)
    return push_idx.astype(np.int64), pop_idx.astype(np.int64), unmatched, unclosed


# -- assembling a Trace: what every reader does once it has found its columns ----------------------
_DTYPES: dict[type, dict[str, np.dtype]] = {cls: {f.name: getattr(cls(), f.name).dtype for f in fields(cls)}
                                             for cls in (Ranges, Calls, GpuOps)}
_ZERO = ("bytes", "kind", "style")  # columns that default to 0 (a kernel moves no bytes; RUNTIME; PUSH_POP)


def make_table(cls: type[T], parts: list[dict[str, Any]], strings: StringTable, *, sort: bool = True) -> T:
    """One ``cls`` table of ``parts``, dicts of columns by field name: a scalar stands for a whole
    column, ``name`` (strings) is interned, a field left out is NO_ID (0 for ``_ZERO``; ``end_tid``
    is ``tid``). Rows sorted by start unless not ``sort``."""
    columns: dict[str, list[np.ndarray]] = {}
    for part in parts:
        n = len(part["start_ns"])
        for name, dtype in _DTYPES[cls].items():
            value = part.get(name)
            if value is None:
                if name == "name_id" and "name" in part:
                    value = intern(strings, part["name"])
                else:
                    value = part["tid"] if name == "end_tid" else 0 if name in _ZERO else NO_ID
            columns.setdefault(name, []).append(
                np.full(n, value, dtype) if np.ndim(value) == 0 else np.asarray(value).astype(dtype, copy=False))
    if not parts:
        return cls()
    table = cls(**{k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in columns.items()})
    return by_start(table) if sort else table


def by_start(table: T) -> T:
    return table.take(np.argsort(table.start_ns, kind="stable"))  # type: ignore[attr-defined]


class TraceBuilder:
    """How a reader makes its Trace: it adds the parts of each table (:meth:`add`), interns names
    through :attr:`strings`, appends to :attr:`notes`, and calls :meth:`trace`."""

    def __init__(self, source: object, format: str, clock: str) -> None:
        self.source, self.format, self.clock = str(source), format, clock
        self.strings = StringTable()
        self.notes: list[str] = []
        self.thread_names: dict[int, str] = {}
        self.parts: dict[type, list[dict[str, Any]]] = {Ranges: [], Calls: [], GpuOps: []}

    def names(self, values: Any) -> np.ndarray:
        return intern(self.strings, values)

    def add(self, cls: type, **columns: Any) -> None:
        self.parts[cls].append(columns)

    def table(self, cls: type[T], *, sort: bool = True) -> T:
        """The parts added to ``cls`` so far as one table (they are taken)."""
        parts, self.parts[cls] = self.parts[cls], []
        return make_table(cls, parts, self.strings, sort=sort)

    def trace(self, *, calls: Calls | None = None, ops: GpuOps | None = None, ranges: Ranges | None = None,
              **fields: Any) -> Trace:
        """The Trace, validated; a table not given is made of its parts (calls, ops, then ranges: the
        order names are interned in)."""
        calls = self.table(Calls) if calls is None else calls
        ops = self.table(GpuOps) if ops is None else ops
        ranges = self.table(Ranges) if ranges is None else ranges
        trace = Trace(source=self.source, format=self.format, strings=self.strings.to_array(), ranges=ranges,
                      calls=calls, ops=ops, thread_names=self.thread_names, clock=self.clock, notes=self.notes,
                      **fields)
        trace.validate()
        return trace


def first_rows(*keys: np.ndarray) -> np.ndarray:
    """Indices of the first row (in table order) of each distinct tuple of ``keys``, in table order."""
    n = len(keys[0])
    if not n:
        return np.empty(0, np.int64)
    order = np.lexsort((np.arange(n), *keys[::-1]))
    first = np.zeros(n, bool)
    first[0] = True
    for k in keys:
        ks = k[order]
        first[1:] |= ks[1:] != ks[:-1]
    return np.sort(order[first])


def name_flags(strings: StringTable, name_id: np.ndarray, test: Callable[[str], object]) -> np.ndarray:
    """``test`` of each row's name (False for NO_ID), once per string."""
    flags = np.array([bool(test(str(s))) for s in strings.to_array()] + [False], bool)
    return flags[name_id]


def mark_graph_calls(strings: StringTable, calls: Calls, test: Callable[[str], object]) -> None:
    """Calls whose name passes ``test`` (a graph launch, by the format's names) get CallKind.GRAPH."""
    if len(calls):
        calls.kind[name_flags(strings, calls.name_id, test)] = CallKind.GRAPH


def call_rows(op_corr: np.ndarray, call_corr: np.ndarray) -> np.ndarray:
    """Per op, the row of the first call (in table order) with its correlation id, or -1."""
    if not len(call_corr):
        return np.full(len(op_corr), -1, np.int64)
    # (tables read in id order are sorted already: then no sort)
    order = np.arange(len(call_corr)) if (call_corr[1:] >= call_corr[:-1]).all() else np.argsort(call_corr, kind="stable")
    found = call_corr[order]
    pos = np.minimum(np.searchsorted(found, op_corr), len(found) - 1)
    return np.where(found[pos] == op_corr, order[pos], -1)


def pids_from_calls(ops: GpuOps, calls: Calls) -> None:
    """Ops without a process (NO_ID) take the process of the call with their correlation id, or the
    one process of all calls when there is one (a GPU lane names no process)."""
    missing = ops.pid == NO_ID
    if not missing.any() or not len(calls):
        return
    pids = np.unique(calls.pid)
    if len(pids) == 1:
        ops.pid = np.where(missing, pids[0], ops.pid)
    else:
        row = call_rows(ops.correlation_id, calls.correlation_id)
        ops.pid = np.where(missing, np.where(row >= 0, calls.pid[np.maximum(row, 0)], NO_ID), ops.pid)


HIP_GRAPH_NOTE = "graph node ids are stand-ins: the order of each op within its hipGraphLaunch"


def graph_stand_ins(ops: GpuOps, calls: Calls, notes: list[str], note: str) -> None:
    """Stand-in graph node ids where a trace records none: an op of a graph launch call (sharing its
    correlation id) without one gets its order by start within that launch, which names the same node
    across replays of one graph; ``note`` (``{n}``: how many ops) says so."""
    graph_corr = calls.correlation_id[calls.kind == int(CallKind.GRAPH)]
    idx = np.flatnonzero(np.isin(ops.correlation_id, graph_corr) & (ops.correlation_id != NO_ID))
    order = idx[np.lexsort((ops.start_ns[idx], ops.correlation_id[idx]))]
    corr_sorted = ops.correlation_id[order]
    group_start = np.flatnonzero(np.r_[True, corr_sorted[1:] != corr_sorted[:-1]]) if len(order) else order
    ordinal = np.arange(len(order)) - np.repeat(group_start, np.diff(np.r_[group_start, len(order)]))
    fill = ops.graph_node_id[order] == NO_ID
    if fill.any():
        ops.graph_node_id = ops.graph_node_id.copy()
        ops.graph_node_id[order[fill]] = ordinal[fill]
        notes.append(note.format(n=int(fill.sum())))


def read_head(path: Path, n: int = 64) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None


# A gzip input inflates to at most RATIO times its own size (real traces: 3x for an RPD database,
# 7-13x for Kineto JSON; a 3 MB decompression bomb inflated to 9.3 GB in memory), or FLOOR, whichever
# is larger (a small file may compress well), and never more than CAP (what a report can hold).
GUNZIP_RATIO, GUNZIP_FLOOR_BYTES, GUNZIP_CAP_BYTES = 100, 64 << 20, 16 << 30
_INFLATE_CHUNK = 1 << 20


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def inflate(path: Path, sink: Callable[[bytes], object]) -> int:
    """Gunzip the file ``path`` into ``sink`` a chunk at a time, every member (as ``gzip`` does);
    returns the inflated size. Inflating past the GUNZIP bound, corrupt or truncated data: TraceError."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        limit = min(max(GUNZIP_RATIO * size, GUNZIP_FLOOR_BYTES), GUNZIP_CAP_BYTES)
        total = 0

        def take(out: bytes) -> None:
            nonlocal total
            total += len(out)
            if total > limit:
                raise TraceError(path, f"gzip data inflates past {_size(limit)} ({GUNZIP_RATIO} times its "
                                       f"{_size(size)}, maxinstr's bound against decompression bombs): not read; "
                                       "if it is a real trace, gunzip it yourself and give the result")
            sink(out)

        d = zlib.decompressobj(wbits=31)
        pending = b""
        try:
            while True:
                if not pending:
                    pending = fh.read(_INFLATE_CHUNK)
                    if not pending:
                        break
                if d.eof:  # between members: zero padding (as gzip(1) allows), or the next member
                    pending = pending.lstrip(b"\0")
                    if not pending:
                        continue
                    d = zlib.decompressobj(wbits=31)
                out = d.decompress(pending, _INFLATE_CHUNK)  # never more than a chunk at a time
                pending = d.unused_data if d.eof else d.unconsumed_tail
                if out:
                    take(out)
            if not d.eof:
                take(d.flush())
        except zlib.error as exc:
            raise TraceError(path, f"corrupt or truncated gzip data ({exc})") from None
        except OSError as exc:
            raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
        if not d.eof:
            raise TraceError(path, "corrupt or truncated gzip data (the file ends inside a gzip member)")
        return total


def read_bytes(path: Path) -> bytes | bytearray:
    """The whole file, gunzipped (:func:`inflate`) when it is gzip."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            if head != GZIP_MAGIC:
                return head + fh.read()
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    out = bytearray()
    inflate(path, out.extend)
    return out


def read_sqlite(path: str | Path, what: str, read: Callable[[Path, sqlite3.Connection, Path], Trace]) -> Trace:
    """``read(path, connection, database file)`` on a SQLite trace (:func:`sqlite_db`); a sqlite3
    error on the way is a TraceError naming ``what``."""
    path = Path(path)
    with sqlite_db(path) as (con, db_path):
        try:
            return read(path, con, db_path)
        except sqlite3.Error as exc:
            raise TraceError(path, f"{what}: SQLite error: {exc}") from None


@contextmanager
def sqlite_db(path: Path) -> Iterator[tuple[sqlite3.Connection, Path]]:
    """A SQLite database opened read-only, and the path of its file, inflated into a temp file when
    gzip-compressed. sqlite3 errors while opening become TraceError."""
    cleanup = None
    try:
        db_path = path
        if read_head(path, 2) == GZIP_MAGIC:
            # the temp copy goes on every way out: an error, a return, Ctrl-C, and SIGTERM/SIGHUP
            # (turned into an exception while it exists); only SIGKILL can leave it behind
            tmpdir = tempfile.mkdtemp(prefix="maxinstr-gunzip-")
            cleanup = TempCleanup(tmpdir)
            db_path = Path(tmpdir) / (path.name[:-3] if path.name.endswith(".gz") else path.name + ".db")
            try:
                with open(db_path, "wb") as dst:
                    inflate(path, dst.write)
            except OSError as exc:  # the temp folder is full
                raise TraceError(path, f"cannot inflate into {tmpdir}: {exc.strerror or exc}") from None
        if read_head(db_path, 16) != SQLITE_MAGIC:
            raise TraceError(path, "not a SQLite database")
        con = None
        try:
            con = sqlite3.connect(f"file:{os.fspath(db_path)}?mode=ro", uri=True)
            # corrupt pages can hold invalid UTF-8: replace it rather than fail in the middle of a fetch
            con.text_factory = lambda b: b.decode("utf-8", "replace")
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            yield con, db_path
        except sqlite3.Error as exc:
            raise TraceError(path, f"SQLite error: {exc}") from None
        except UnicodeDecodeError:  # sqlite3 decodes schema text and column names strictly
            raise TraceError(path, "corrupt database: invalid UTF-8 in its schema") from None
        finally:
            if con is not None:
                con.close()
    finally:
        if cleanup is not None:
            cleanup.close()


class TempCleanup:
    """Removes a temporary folder or file on :meth:`close`. Until then SIGTERM and SIGHUP, whose default
    action once left a 653 MB ``/tmp/maxinstr-*`` behind, raise SystemExit in the main thread so every
    ``finally`` runs (a handler the program set itself is left alone)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.saved: dict[int, object] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with suppress(OSError, ValueError):
                if signal.getsignal(sig) is signal.SIG_DFL:
                    self.saved[sig] = signal.signal(sig, _exit_on_signal)

    def close(self) -> None:
        for sig, handler in self.saved.items():
            with suppress(OSError, ValueError):
                signal.signal(sig, handler)  # type: ignore[arg-type]
        self.saved.clear()
        if os.path.isdir(self.folder) and not os.path.islink(self.folder):
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            with suppress(OSError):
                os.unlink(self.folder)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def sqlite_tables(con: sqlite3.Connection) -> dict[str, str]:
    return {name: kind for name, kind in con.execute("SELECT name, type FROM sqlite_master WHERE type IN ('table','view')")}


def sqlite_columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f'PRAGMA table_info("{table}")')}


def fetch_columns(con: sqlite3.Connection, sql: str, n_cols: int) -> list[np.ndarray]:
    """Run ``sql`` and return its result as ``n_cols`` numpy object/int columns."""
    rows = con.execute(sql).fetchall()
    if not rows:
        return [np.empty(0, dtype=object) for _ in range(n_cols)]
    return [np.array(col) for col in zip(*rows)]


def load_json(data: bytes | bytearray, path: object) -> object:
    """Parse JSON bytes with the standard library (orjson parsed a 1.36M-event Kineto trace in 15.4 s
    instead of 18.3 s, but peaked at 2.28 GB instead of 1.65 GB: not worth a dependency)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise TraceError(path, "not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a number too long
        raise TraceError(path, f"not valid JSON ({json_problem(exc, data)})") from None


def json_document(path: Path, document: object, progress: Progress | None) -> object:
    """``document`` when the caller has parsed it already (open_trace sniffs it), else ``path``'s."""
    if document is None:
        report(progress, f"parsing {path.name}")
        document = load_json(read_bytes(path), path)
    return document


def chrome_events(path: Path, document: object, what: str, progress: Progress | None = None) -> list:
    """The event list of a Chrome trace (``{"traceEvents": [...]}`` or a bare list)."""
    document = json_document(path, document, progress)
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise TraceError(path, f"{what} without a traceEvents list")
    return events


@contextmanager
def malformed(path: object, what: str) -> Iterator[None]:
    """The errors content of the wrong shape raises while a reader picks it apart, as TraceError."""
    try:
        yield
    except TraceError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as exc:
        raise TraceError(path, f"malformed {what}: {type(exc).__name__}: {str(exc)[:80]}") from None
    except RecursionError:
        raise TraceError(path, f"malformed {what}: nested too deeply") from None


def query_columns(path: Path, db_path: Path, sql: str, kinds: str, what: str) -> list[np.ndarray]:
    """One SELECT through the columnar SQLite backend: ``i`` and ``t`` columns int64 (``ifnull`` NULLs
    in SQL), ``s`` columns object arrays sharing one string per distinct value (NULL -> '')."""
    try:
        raw = _sqlite_columns.backend("auto").query(str(db_path), sql, kinds)
    except (RuntimeError, ValueError, TypeError, OverflowError, sqlite3.Error) as exc:
        raise TraceError(path, f"{what}: {str(exc)[:100]}") from None
    out = []
    for kind, col in zip(kinds, raw):
        if kind == "s":
            codes, values = col
            table = np.array([*values, ""], dtype=object)
            out.append(table[np.where(codes < 0, len(values), codes)])
        else:
            out.append(col)
    return out


def thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return (np.asarray(pid, np.int64) << np.int64(32)) ^ (np.asarray(tid, np.int64) & np.int64(0xFFFFFFFF))


def latest_at_or_before(row_key: np.ndarray, row_t: np.ndarray, q_key: np.ndarray, q_t: np.ndarray) -> np.ndarray:
    """Per query, the row with the same key and the greatest ``row_t <= q_t`` (of equal times, the
    later row), or -1: rows and queries sorted together by (key, time), rows first at equal times."""
    n, m = len(row_key), len(q_key)
    if not n or not m:
        return np.full(m, -1, np.int64)
    key = np.concatenate([np.asarray(row_key, np.int64), np.asarray(q_key, np.int64)])
    t = np.concatenate([np.asarray(row_t, np.int64), np.asarray(q_t, np.int64)])
    is_q = np.r_[np.zeros(n, bool), np.ones(m, bool)]
    order = np.lexsort((np.arange(n + m), is_q, t, key))
    pos = np.where(is_q[order], -1, np.arange(n + m))
    last = np.maximum.accumulate(pos)  # sorted position of the last row at or before each entry
    q_at = np.flatnonzero(is_q[order])
    hit = last[q_at]
    row = np.where(hit >= 0, order[np.maximum(hit, 0)], -1)
    ok = (row >= 0) & (key[np.maximum(row, 0)] == key[order[q_at]])
    out = np.full(m, -1, np.int64)
    out[order[q_at] - n] = np.where(ok, row, -1)
    return out


def decimal_us_to_ns(values: list, path: object, what: str) -> np.ndarray:
    """Microsecond times as JSON strings or numbers (``"8306017670485"``, ``"12.345"``, ``12``) as
    int64 ns, exactly for strings (decimals rounded to the ns); no number: INVALID_NS."""
    local: dict = {}
    codes = np.fromiter((local.setdefault(v, len(local)) if isinstance(v, (str, int, float)) and not isinstance(v, bool)
                         else -1 for v in values), dtype=np.int64, count=len(values))
    parsed = np.array([_us_ns(u) for u in local] + [INVALID_NS], dtype=np.int64)
    return parsed[codes]


def _us_ns(value: str | int | float) -> int:
    try:
        if isinstance(value, int):
            ns = value * 1000
        elif isinstance(value, float):
            if value != value or abs(value) > 9.2e15:
                return INVALID_NS
            ns = round(value * 1000)
        else:
            text = value.strip()
            neg = text.startswith("-")
            whole, _, frac = text.lstrip("+-").partition(".")
            if not (whole.isdigit() or (not whole and frac)) or (frac and not frac.isdigit()):
                return INVALID_NS
            digits = (frac + "0000")[:4]
            ns = int(whole or "0") * 1000 + (int(digits) + 5) // 10
            ns = -ns if neg else ns
    except (ValueError, OverflowError):
        return INVALID_NS
    return ns if -(2**62) < ns < 2**62 else INVALID_NS


def match_rows(keys: np.ndarray, ref_keys: np.ndarray, ref_value: np.ndarray, missing: int = -1) -> np.ndarray:
    """Per column of ``keys`` (k rows of int64 keys), the ``ref_value`` of the first column of
    ``ref_keys`` with the same keys, or ``missing``: one sort and one search of a structured view."""
    keys, ref_keys = np.asarray(keys, np.int64), np.asarray(ref_keys, np.int64)
    out = np.full(keys.shape[1], missing, np.int64)
    if not keys.shape[1] or not ref_keys.shape[1]:
        return out
    dt = np.dtype([(f"k{i}", np.int64) for i in range(keys.shape[0])])

    def rec(k: np.ndarray) -> np.ndarray:  # each column's keys as one record
        return np.ascontiguousarray(k.T).view(dt).ravel()

    ref = rec(ref_keys)
    order = np.argsort(ref, kind="stable")
    ref = ref[order]
    q = rec(keys)
    pos = np.minimum(np.searchsorted(ref, q), len(ref) - 1)
    hit = ref[pos] == q
    out[hit] = np.asarray(ref_value)[order][pos[hit]]
    return out
