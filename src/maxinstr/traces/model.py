"""The one columnar model every trace reader produces, and attribution and analysis read.

Every table is a struct of equal-length numpy columns; names are interned once into
``Trace.strings`` and referred to by int32 ids (``-1``: none). Times are int64 ns on the trace's
own clock (``Trace.clock``). Integer columns are int64 unless a reader knows the values are small:
the nsys reader gives int32 ``pid``/``tid`` (24 bits in nsys), which halves them on 10M-op traces;
consumers widen (``np.asarray(x, np.int64)``) before shifting or multiplying.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any

import numpy as np

from maxinstr.columns import StringTable as StringTable  # the readers take it with the model (one interner: columns)
from maxinstr.errors import TraceError
from maxinstr.rundir.format import MAX_TIME_NS  # trace times too: a difference of two fits an int64

NO_ID = -1  # a missing id / string / payload in integer columns
# In a time column where the file holds no integer (text, a float, a missing value): TimeCheck drops
# such rows; far below -2**62, it can never pass for a time.
INVALID_NS = int(np.iinfo(np.int64).min)
OP_CALL_KEY = "op_call"
"""``trace.meta[OP_CALL_KEY]``, set by a reader that joined ops to their launch calls anyway (nsys):
``(ops.pid, ops.correlation_id, calls.pid, calls.correlation_id, op_call)``, the key columns (the
very array objects) and per op its call row, as :func:`maxinstr.attribute.attribute.join_ops_to_calls`
computes it; used only while the trace still holds those same arrays."""


class RangeStyle(IntEnum):
    """How a host range was opened and closed."""

    PUSH_POP = 0  # nvtxRangePush/Pop, roctxRangePush/Pop, record_function: same thread
    START_END = 1  # nvtxRangeStart/End, roctxRangeStart/Stop: may end on another thread
    MARK = 2  # instant event (start == end)


class OpKind(IntEnum):
    """What a GPU op is."""

    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2


class CallKind(IntEnum):
    """Which API layer a host call belongs to."""

    RUNTIME = 0  # cudaLaunchKernel, hipLaunchKernel, ...
    DRIVER = 1  # cuLaunchKernel, ...
    GRAPH = 2  # cudaGraphLaunch / hipGraphLaunch: one call, many ops


class _Table:
    """Struct-of-arrays base: every dataclass field is a numpy column of one length."""

    def __len__(self) -> int:
        first = fields(self)[0].name  # type: ignore[arg-type]
        return len(getattr(self, first))

    def validate(self) -> None:
        """Raise ValueError when a column is not 1-D (it would broadcast against the others
        into an n x n array), the columns differ in length, or a time is outside +-2**62 ns
        (then the difference of two could wrap around int64)."""
        for f in fields(self):  # type: ignore[arg-type]
            col = getattr(self, f.name)
            if np.ndim(col) != 1:
                raise ValueError(f"{type(self).__name__}.{f.name}: not a 1-D column")
            if f.name.endswith("_ns") and len(col) and (col.min() <= -MAX_TIME_NS or col.max() >= MAX_TIME_NS):
                raise ValueError(f"{type(self).__name__}.{f.name}: times beyond 2**62 ns")
        lengths = {f.name: len(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{type(self).__name__}: columns differ in length: {lengths}")
        start, end = getattr(self, "start_ns", None), getattr(self, "end_ns", None)
        if start is not None and end is not None and len(start) and bool((end < start).any()):
            # every reader drops such rows through TimeCheck; one left means a reader missed it
            raise ValueError(f"{type(self).__name__}: {int((end < start).sum())} rows end before they start")

    def take(self, index: np.ndarray):
        """A new table holding the rows at ``index`` (an int array or boolean mask)."""
        return type(self)(**{f.name: getattr(self, f.name)[index] for f in fields(self)})  # type: ignore[arg-type]


@dataclass
class Ranges(_Table):
    """Host annotation ranges: NVTX, roctx, record_function, maxinstr stages. ``payload``: the NVTX
    payload (maxinstr's stage record id) or NO_ID; ``end_tid`` differs from ``tid`` only for a
    start/end range closed on another thread."""

    start_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    end_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    name_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    domain_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    tid: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    end_tid: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    pid: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    style: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))
    payload: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


@dataclass
class Calls(_Table):
    """Host API calls that launched GPU work, keyed by ``correlation_id`` (one row per correlation id
    and layer: a reader drops backtrace and duplicate rows)."""

    start_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    end_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    tid: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    pid: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    correlation_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    name_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    kind: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))


@dataclass
class GpuOps(_Table):
    """Kernels, copies and sets that ran on a GPU (``graph_node_id``: NO_ID unless replayed from a
    CUDA/HIP graph; ``bytes``: 0 for kernels)."""

    start_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    end_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    kind: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))
    name_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    device_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    stream_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    pid: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    correlation_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    graph_node_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    bytes: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


@dataclass
class Trace:
    """A vendor trace in columnar form: ``strings[name_id]`` is a name; ``clock`` names the timebase
    of every ``*_ns`` column (``"nsys"``, ``"CLOCK_MONOTONIC"``, ``"kineto-us"``...);
    ``session_start_utc_ns`` is the capture start on the wall clock when known; ``notes``: what
    the reader had to work around (one line each), for the report to say."""

    source: str
    format: str
    strings: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    ranges: Ranges = field(default_factory=Ranges)
    calls: Calls = field(default_factory=Calls)
    ops: GpuOps = field(default_factory=GpuOps)
    thread_names: dict[int, str] = field(default_factory=dict)
    clock: str = "unknown"
    session_start_utc_ns: int | None = None
    notes: list[str] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)

    def name(self, name_id: int) -> str:
        """The string for ``name_id`` ('' for ``NO_ID``)."""
        return "" if name_id < 0 else str(self.strings[name_id])

    def validate(self) -> None:
        """Raise TraceError (one line naming the trace) when a table is malformed (see
        :meth:`_Table.validate`) or a name id points outside ``strings``."""
        n_strings = len(self.strings)
        for table in (self.ranges, self.calls, self.ops):
            try:
                table.validate()
            except ValueError as exc:
                raise TraceError(self.source, str(exc)) from None
            ids = table.name_id
            if len(ids) and (ids.max() >= n_strings or ids.min() < NO_ID):
                raise TraceError(self.source, f"{type(table).__name__}.name_id out of range")


class TimeCheck:
    """Drops the rows whose times cannot be real, table by table of the file, and says so: a reader
    hands each table to :meth:`keep` as soon as it has its start and end columns, before it pairs,
    joins or sorts anything. Invalid: a time that is INVALID_NS (no integer in the file) or beyond
    +-2**62 ns (a difference could wrap around int64), an end before the start, or a start <= 0
    where the clock cannot read 0 (every clock but nsys's: ``start_can_be_zero``). Such rows would
    otherwise be summed (text read as 0 in an nsys export made a 21 ms span 8 s). One note per
    table with invalid rows; a table whose every row is invalid is a TraceError naming the file.
    """

    def __init__(self, source: object, notes: list[str], *, start_can_be_zero: bool = False,
                 expected: str = "an integer") -> None:
        self.source = source
        self.notes = notes
        self.lowest_start = -MAX_TIME_NS if start_can_be_zero else 0  # a valid start is above this
        self.expected = expected  # what a time column holds in this format ("a number" in JSON)

    def keep(self, table: str, start_ns: np.ndarray, end_ns: np.ndarray, *, row: Callable[[int], str] | None = None,
             names: tuple[str, str] = ("start", "end"), unit: str = "rows") -> np.ndarray | None:
        """A boolean mask of the rows of ``table`` to keep, or None when every row is valid (the
        common case: three passes over the columns, nothing copied). ``row(i)`` names the i-th row
        for the note (default ``"row {i + 1}"``); ``names`` are the file's names of the two
        columns (Kineto's end comes from ``dur``), ``unit`` what its rows are called."""
        n = len(start_ns)
        if not n or self.all_valid(start_ns, end_ns):
            return None
        # (start > low and end >= start also keep end above low: no check of its own needed)
        bad = (start_ns <= self.lowest_start) | (end_ns < start_ns) | (end_ns >= MAX_TIME_NS)
        count = int(np.count_nonzero(bad))
        first = int(np.argmax(bad))
        label = row(first) if row is not None else f"row {first + 1}"
        problem = f"{label}: {self._problem(int(start_ns[first]), int(end_ns[first]), names)}"
        if count == n:
            every = f"the one {unit[:-1]} has" if n == 1 else f"all {n} {unit} have"
            raise TraceError(self.source, f"{table}: {every} invalid times ({problem})")
        self.notes.append(f"{table}: {count} of {n} {unit} dropped, their times are not valid (first: {problem})")
        return ~bad

    def drop(self, table: str, columns: list[Any], used: np.ndarray | None = None, **how: Any) -> list[Any]:
        """``columns`` (start and end first; arrays, or lists of the file's records) without the rows
        :meth:`keep` drops; with a mask ``used``, only those rows are judged."""
        rows: Any = slice(None) if used is None else np.flatnonzero(used)
        valid = self.keep(table, columns[0][rows], columns[1][rows], **how)
        if valid is None:
            return columns
        if used is not None:
            ok = np.ones(len(columns[0]), bool)
            ok[rows[~valid]] = False
            valid = ok
        rows = np.flatnonzero(valid).tolist() if any(isinstance(c, list) for c in columns) else None
        return [c[valid] if isinstance(c, np.ndarray) else [c[i] for i in rows] for c in columns]

    def all_valid(self, start_ns: np.ndarray, end_ns: np.ndarray) -> bool:
        """Whether every row is valid (:meth:`keep` would return None)."""
        return not len(start_ns) or (
            int(start_ns.min()) > self.lowest_start and int(end_ns.max()) < MAX_TIME_NS
            and not bool(np.less(end_ns, start_ns).any()))

    def _problem(self, start: int, end: int, names: tuple[str, str]) -> str:
        for value, name in ((start, names[0]), (end, names[1])):
            if value == INVALID_NS:
                return f"{name} missing or not {self.expected}"
            if not -MAX_TIME_NS < value < MAX_TIME_NS:
                return f"{name} beyond 2**62 ns"
        if start <= self.lowest_start:
            return f"{names[0]} {start} ns: this clock never reads 0 or less"
        return f"ends {start - end} ns before it starts"
