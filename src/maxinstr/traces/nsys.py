"""Nsight Systems SQLite export -> :class:`~maxinstr.traces.model.Trace` (docs/traces.md).

Works across export schemas (nsys 2022.2 / schema 2.9 through 2026.2 / 3.25): a column a version
lacks is a literal default in the SELECT; event types come from ``ENUM_NSYS_EVENT_TYPE`` when the
file has it. ``CUPTI_ACTIVITY_KIND_RUNTIME`` may hold backtrace rows that repeat a correlation id:
they are dropped, and one call per (process, correlation id) is kept, runtime before driver, and
only the calls that launched an op. tid = globalTid & 0xFFFFFF, pid = (globalTid >> 24) & 0xFFFFFF.
Unclosed NVTX ranges end at the last NVTX timestamp, as ``nsys stats`` does.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np

from maxinstr.columns import correlation_join
from maxinstr.errors import TraceError
from maxinstr.traces import _sqlite_columns as cols
from maxinstr.traces._sqlite_columns import IntCol
from maxinstr.traces._util import TraceBuilder, mark_graph_calls, report
from maxinstr.traces.nsys_export import sqlite_for_report
from maxinstr.traces.model import (INVALID_NS, NO_ID, OP_CALL_KEY, CallKind, Calls, GpuOps, OpKind, Ranges,
                                   RangeStyle, TimeCheck, Trace)

# Fallback numbers for files without ENUM_NSYS_EVENT_TYPE (nsys 2022.2 exports lack it).
_EVENT_TYPES = {"NvtxCategory": 33, "NvtxMark": 34, "NvtxThread": 39, "NvtxPushPopRange": 59, "NvtxStartEndRange": 60,
                "NvtxtMark": 65, "NvtxtPushPopRange": 70, "NvtxtStartEndRange": 71, "NvtxDomainCreate": 75}
_EVENT_CLASS_DRIVER = 1
_EVENT_CLASS_BACKTRACE = 67  # TRACE_PROCESS_EVENT_CUDABACKTRACE

# CUPTI's memcpy kinds, as nsys names copies ("[CUDA memcpy Host-to-Device]")
MEMCPY_KINDS = dict(enumerate((
    "Unknown", "Host-to-Device", "Device-to-Host", "Host-to-Array", "Array-to-Host", "Array-to-Array", "Array-to-Device",
    "Device-to-Array", "Device-to-Device", "Host-to-Host", "Peer-to-Peer", "Unified Host-to-Device",
    "Unified Device-to-Host", "Unified Device-to-Device")))

_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
_MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
_MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
_RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
_NVTX = "NVTX_EVENTS"

TID_MASK = 0xFFFFFF
_ROWS_PER_SLICE = 50_000  # at least this many rows per parallel slice


def _correlation_mask(corr: np.ndarray) -> np.ndarray | None:
    """uint8 mask over correlation ids that some op has; None when ids are too sparse/big."""
    if not len(corr) or corr.max() < 0:
        return np.zeros(1, np.uint8)
    if corr.min() < 0:
        corr = corr[corr >= 0]
    top = int(corr.max()) + 1
    # One byte per id; reading an unwanted API row costs ~48 bytes and a few passes, so the
    # mask pays off unless ids are extremely sparse.
    if top > min(1 << 31, max(1 << 26, 64 * len(corr))):
        return None
    mask = np.zeros(top, np.uint8)
    mask[corr] = 1
    return mask


def _distinct_ids(columns: list[np.ndarray]) -> np.ndarray:
    """Sorted distinct non-negative ids over several columns (bincount when ids are small)."""
    parts = [c for c in columns if len(c)]  # int32 or int64: never widened (10M-row columns)
    if not parts:
        return np.empty(0, np.int64)
    top = max(int(p.max()) for p in parts)
    if top < 0:
        return np.empty(0, np.int64)
    if top < (1 << 24):
        seen = np.zeros(top + 1, bool)
        for p in parts:
            seen[p[p >= 0]] = True
        return np.flatnonzero(seen).astype(np.int64)
    allv = np.unique(np.concatenate(parts))
    return allv[allv >= 0]


def split_global_tid(global_tid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pid, tid) from nsys ``globalTid`` (or ``globalPid``) values."""
    g = np.asarray(global_tid, dtype=np.int64)
    return (g >> 24) & TID_MASK, g & TID_MASK


def read_nsys(path: str | Path, *, backend: str = "auto", progress: Callable[[str], None] | None = None) -> Trace:
    """Read an Nsight Systems SQLite export (or a ``.nsys-rep``, exported first when nsys is on PATH).
    ``backend``: ``"native"`` (the ``maxinstr._columns`` reader), ``"python"`` (sqlite3), or
    ``"auto"``; both give identical traces. ``progress`` gets a one-line message per step."""
    source = Path(path)
    report(progress, f"reading {source.name} (Nsight Systems)")
    db, how = sqlite_for_report(source) if source.suffix in (".nsys-rep", ".qdrep") else (source, None)
    if not db.exists():
        raise TraceError(db, "no such file")
    try:
        schema = cols.table_columns(db)
    except (sqlite3.DatabaseError, ValueError) as exc:
        raise TraceError(db, f"not an SQLite database ({exc})") from None
    if "StringIds" not in schema or not ({_KERNEL, _RUNTIME, _NVTX, _MEMCPY, _MEMSET} & set(schema)):
        raise TraceError(db, "not an Nsight Systems SQLite export (no StringIds, NVTX_EVENTS or CUPTI tables)")
    try:
        be = cols.backend(backend)
        trace = _Reader(str(db), schema, be).read(source)
        trace.notes[:0] = [f"{source.name}: {how}"] if how else []
        cols.release_memory()
        return trace
    except sqlite3.DatabaseError as exc:
        raise TraceError(db, f"SQLite error while reading: {exc}") from None
    except RuntimeError as exc:  # the native reader reports SQLite errors as RuntimeError
        raise TraceError(db, str(exc)) from None
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, MemoryError) as exc:
        # Only a damaged export gets here (values of the wrong type or range): one line, no traceback.
        raise TraceError(db, f"malformed Nsight Systems export ({type(exc).__name__}: {exc})") from None


class _Reader:
    def __init__(self, db: str, schema: dict[str, set[str]], be: cols.ColumnBackend) -> None:
        self.db = db
        self.schema = schema
        self.be = be
        self.b = TraceBuilder(db, "nsys-sqlite", "nsys")
        self.notes, self.strings = self.b.notes, self.b.strings
        # nsys times count from the session start, so 0 is a time the clock can read
        self.times = TimeCheck(db, self.notes, start_can_be_zero=True)

    def small(self, sql: str) -> list[tuple]:
        with closing(cols.connect(self.db)) as con:
            return con.execute(sql).fetchall()

    def rowid_label(self, table: str, rows: np.ndarray | None = None) -> Callable[[int], str]:
        """Names the i-th row read from ``table`` (``rows[i]``: its position when only some were kept) by its rowid."""

        def label(i: int) -> str:
            pos = int(rows[i]) if rows is not None else i
            found = self.small(f'SELECT rowid FROM "{table}" ORDER BY rowid LIMIT 1 OFFSET {pos}')
            return f"rowid {found[0][0]}" if found else f"row {pos + 1}"

        return label

    def enum(self, table: str, defaults: dict[str, int]) -> dict[str, int]:
        found = dict(defaults)
        if table in self.schema:
            for name, value in self.small(f"SELECT name, id FROM {table}"):
                found[str(name)] = int(value)
        return found

    def read(self, source: Path) -> Trace:
        types = self.enum("ENUM_NSYS_EVENT_TYPE", _EVENT_TYPES)
        queries: list[tuple[str, str]] = []
        slots: dict[str, list[int]] = {}
        workers = cols.worker_count() if self.be.name == "native" else 1

        def add(key: str, sql: str, kinds: str, filter_col: int = -1, mask: np.ndarray | None = None) -> None:
            # Big tables are read in rowid slices on parallel connections (native backend);
            # slices concatenated in rowid order equal one table scan.
            table = sql.split(" FROM ")[1].split()[0]
            top = self.small(f"SELECT ifnull(max(rowid), 0) FROM {table}")[0][0]
            n = min(workers, max(1, top // _ROWS_PER_SLICE))
            bounds = [(top * i // n, top * (i + 1) // n) for i in range(n)] if n > 1 else [None]
            slots[key] = []
            for b in bounds:
                q = sql
                if b is not None:
                    cond = f"rowid > {b[0]} AND rowid <= {b[1]}" if b[1] < top else f"rowid > {b[0]}"
                    q = f"{sql} AND {cond}" if " WHERE " in sql else f"{sql} WHERE {cond}"
                slots[key].append(len(queries))
                # Expected rows (rowids are dense in exports) let the native reader size once;
                # a filtered read keeps about as many rows as there are ops.
                rows = top if b is None else b[1] - b[0]
                if mask is not None:
                    rows = min(rows, wanted + 1024)
                queries.append((q, kinds, filter_col, mask, int(rows)))

        scans: dict[str, tuple] = {}

        def add_table(key: str, table: str, columns: list[IntCol], *, where_not: tuple[int, int] | None = None,
                      filter_col: int = -1, mask: np.ndarray | None = None, pieces: bool = False) -> None:
            # Integer columns of a big table: read straight from the file when the backend can
            # (the native direct scan), else as SQL in parallel rowid slices; the same values.
            present = self.schema[table]
            sql = f"SELECT {', '.join(c.sql(present) for c in columns)} FROM {table}"
            if where_not is not None:
                sql += f" WHERE {columns[where_not[0]].sql(present)} != {where_not[1]}"
            scans[key] = (table, columns, where_not, filter_col, mask, sql, "".join(c.kind for c in columns), pieces)

        # a NULL or non-integer time reads as INVALID_NS: the row is dropped and counted (_ops, _calls)
        times = [IntCol("start", INVALID_NS, "t"), IntCol("end", INVALID_NS, "t")]
        op_columns = times + [IntCol("deviceId", -1, "n"), IntCol("streamId", -1), IntCol("correlationId", -1),
                              IntCol("globalPid", 0, "n", 24, TID_MASK)]

        k = _KERNEL
        if k in self.schema:
            name_col = "demangledName" if "demangledName" in self.schema[k] else "shortName"
            # int32 ('n') device, 24-bit pid and string id: 10M-row columns
            # (pieces: the reader threads' arrays, joined once with the other op tables in _ops)
            add_table("kernel", k, op_columns + [IntCol(name_col, -1, "n"), IntCol("graphNodeId", -1)], pieces=True)
        for key, t in (("memcpy", _MEMCPY), ("memset", _MEMSET)):
            if t in self.schema:
                kind_col = IntCol("copyKind", 0, "n") if key == "memcpy" else IntCol("", 0, "n")  # "": always 0
                add_table(key, t, op_columns + [IntCol("bytes", 0), kind_col, IntCol("graphNodeId", -1)],
                          pieces=True)
        if _NVTX in self.schema:
            present = self.schema[_NVTX]
            payload = ", ".join(f'"{c}"' for c in ("int64Value", "uint64Value", "int32Value", "uint32Value")
                                if c in present)
            # end NULL: a range never ended (or a mark); any other non-integer time is damage
            head = [IntCol("start", INVALID_NS, "t"), IntCol("end", -1, "t")]
            tail = [IntCol("globalTid", 0), IntCol("endGlobalTid"), IntCol("textId"), IntCol("domainId", 0),
                    IntCol("category")]
            payload_sql = f"coalesce({payload}, -1)" if payload else "-1"
            text_sql = '"text"' if "text" in present else "NULL"
            add("nvtx", f"SELECT {', '.join(c.sql(present) for c in head)}, eventType, "
                        f"{', '.join(c.sql(present) for c in tail)}, {payload_sql}, {text_sql} FROM {_NVTX}",
                "ttiiiiiiis")
        if "ThreadNames" in self.schema:
            add("threads", "SELECT globalTid, nameId FROM ThreadNames", "ii")

        def run_queries(queries: list, slots: dict[str, list[int]]) -> dict[str, list[Any]]:
            results = self.be.query_many(self.db, queries) if queries else []
            return {key: cols.concat_results([results[i] for i in idx]) for key, idx in slots.items()}

        def run() -> dict[str, list[Any]]:
            # The SQL queries (NVTX, thread names) run on a thread of their own while the big
            # tables are scanned (both release the GIL); a scan that declines queues its SQL.
            background: dict[str, Any] = {}
            worker = None
            if queries and scans and self.be.name == "native":
                own_queries, own_slots = list(queries), dict(slots)
                queries.clear()
                slots.clear()

                def sql_part() -> None:
                    try:
                        background["out"] = run_queries(own_queries, own_slots)
                    except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
                        background["error"] = exc

                worker = threading.Thread(target=sql_part, name="maxinstr-nsys-sql", daemon=True)
                worker.start()
            scanned: dict[str, list[Any]] = {}
            try:
                for key, (table, columns, where_not, filter_col, mask, sql, kinds, pieces) in scans.items():
                    top = self.small(f"SELECT ifnull(max(rowid), 0) FROM {table}")[0][0]
                    expected = min(top, wanted + 1024) if mask is not None else top
                    got = self.be.scan(self.db, table, columns, filter_col=filter_col, mask=mask, exclude=where_not,
                                       expected_rows=int(expected), pieces=pieces)
                    if got is None:
                        add(key, sql, kinds, filter_col, mask)
                    else:
                        scanned[key] = got
            finally:
                scans.clear()
                if worker is not None:
                    worker.join()
            if "error" in background:
                raise background["error"]
            out = run_queries(queries, slots)
            queries.clear()
            slots.clear()
            out.update(background.get("out", {}))
            out.update(scanned)
            return out

        # Phase 1: GPU ops, NVTX, thread names. Phase 2: the API calls, keeping only rows whose
        # correlation id some op has (a superset across processes; joined exactly below).
        got = run()
        ops, op_name_sid, memcpy_kinds = self._ops(got)
        mask = _correlation_mask(ops.correlation_id)
        wanted = int(np.count_nonzero(mask)) if mask is not None else 0
        if _RUNTIME in self.schema:
            add_table(
                "runtime",
                _RUNTIME,
                # 24-bit pid/tid, string id and event class as int32
                times + [IntCol("globalTid", 0, "n", 24, TID_MASK),
                 IntCol("globalTid", 0, "n", 0, TID_MASK), IntCol("correlationId", -1), IntCol("nameId", -1, "n"),
                 IntCol("eventClass", 0, "n")],
                where_not=(6, _EVENT_CLASS_BACKTRACE),
                filter_col=4,
                mask=mask,
            )
        got.update(run())
        del mask  # (one byte per correlation id: 100+ MB on a 10M-kernel trace)

        calls, call_name_sid = self._calls(got, ops)
        ranges, nvtx_parts = self._nvtx(got.pop("nvtx", None), types)

        # One round trip for every registered string we need, interned in a stable order.
        thread_rows = got.get("threads")
        needed = [op_name_sid, call_name_sid, nvtx_parts["text_sid"]]
        if thread_rows is not None:
            needed.append(thread_rows[1])
        sids = _distinct_ids(needed)
        values = self.be.strings_by_id(self.db, "StringIds", sids)
        sid_to_name = np.array([self.strings.intern(v) for v in values], dtype=np.int32)
        # StringIds ids are small integers: a lookup table maps a whole column at once (a
        # sorted search when ids are huge, e.g. in a corrupt file).
        top = int(sids.max()) + 2 if len(sids) else 1
        if top <= max(1 << 24, 8 * len(sids)):
            lut = np.full(top, NO_ID, np.int32)
            lut[sids] = sid_to_name

            def by_sid(ids: np.ndarray) -> np.ndarray:
                return lut[np.where((ids >= 0) & (ids < len(lut)), ids, len(lut) - 1)]

        else:

            def by_sid(ids: np.ndarray) -> np.ndarray:
                ids = np.asarray(ids, np.int64)
                pos = np.minimum(np.searchsorted(sids, ids), len(sids) - 1)
                return np.where(sids[pos] == ids, sid_to_name[pos], NO_ID).astype(np.int32)

        # Ops: kernels named through StringIds, copies/sets by kind.
        op_name = by_sid(op_name_sid)
        if memcpy_kinds is not None:
            is_copy, kinds = memcpy_kinds  # op rows of the copies, their copy kinds
            labels = self.enum_labels("ENUM_CUDA_MEMCPY_OPER", MEMCPY_KINDS)
            uniq, inv = np.unique(kinds, return_inverse=True)
            ids = np.array([self.strings.intern(f"[CUDA memcpy {labels.get(int(u), 'Unknown')}]") for u in uniq],
                           np.int32)
            op_name[is_copy] = ids[inv.reshape(-1)]
        op_name[ops.kind == OpKind.MEMSET] = self.strings.intern("[CUDA memset]")
        ops.name_id = op_name
        calls.name_id = by_sid(call_name_sid)
        mark_graph_calls(self.strings, calls, lambda name: name.split("_v")[0] in ("cudaGraphLaunch", "cuGraphLaunch"))

        # Range names: registered (textId) first, else inline text -- as nsys coalesces them.
        text_codes, text_values = nvtx_parts["text"]
        local = np.array([self.strings.intern(v) for v in text_values], dtype=np.int32)
        inline = np.where(text_codes >= 0, local[np.maximum(text_codes, 0)] if len(local) else NO_ID, NO_ID)
        registered = by_sid(nvtx_parts["text_sid"])
        ranges.name_id = np.where(registered >= 0, registered, inline).astype(np.int32)
        self._domains_and_categories(ranges, nvtx_parts)

        if thread_rows is not None and len(thread_rows[0]):
            _, tids = split_global_tid(thread_rows[0])
            strings = self.strings.to_array()
            self.b.thread_names = {int(t): str(strings[n]) for t, n in zip(tids, by_sid(thread_rows[1])) if n >= 0}
        self.b.thread_names.update(nvtx_parts["thread_names"])
        self.b.source = str(source)
        if (utc := self._session_value("utcEpochNs")) is None:
            self.notes.append("no session start time: wall-clock times unknown")
        return self.b.trace(calls=calls, ops=ops, ranges=ranges, session_start_utc_ns=utc, meta=self._meta(nvtx_parts))

    def enum_labels(self, table: str, defaults: dict[int, str]) -> dict[int, str]:
        found = dict(defaults)
        if table in self.schema and "label" in self.schema[table]:
            for value, label in self.small(f"SELECT id, label FROM {table}"):
                found[int(value)] = str(label)
        return found

    def _ops(self, got: dict[str, list[Any]]) -> tuple[GpuOps, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        # A column is an array, or a list of arrays (a scan's pieces, one per reader thread):
        # every table's pieces are joined in one concatenation per column below.
        for key in ("kernel", "memcpy", "memset"):
            if key in got:
                got[key] = [c if isinstance(c, list) else [c] for c in got[key]]

        def size(col: list[np.ndarray]) -> int:
            return sum(len(a) for a in col)

        def whole(col: list[np.ndarray]) -> np.ndarray:
            return col[0] if len(col) == 1 else np.concatenate(col)

        def checked(key: str, table: str) -> list[list[np.ndarray]]:
            # Invalid times are rare: only then is a table's columns joined into one piece to drop rows.
            columns = got.pop(key)
            if all(self.times.all_valid(s, e) for s, e in zip(columns[0], columns[1])):
                return columns
            columns = [[whole(c)] for c in columns]
            keep = self.times.keep(table, columns[0][0], columns[1][0], row=self.rowid_label(table))
            return columns if keep is None else [[c[0][keep]] for c in columns]

        parts: list[dict[str, Any]] = []
        name_sid: list[np.ndarray] = []
        copy_rows = copy_kind = None  # rows (in the op table) and copy kinds of the memcpy ops
        for key, kind, table in (("kernel", OpKind.KERNEL, _KERNEL), ("memcpy", OpKind.MEMCPY, _MEMCPY),
                                 ("memset", OpKind.MEMSET, _MEMSET)):
            if key not in got:
                continue
            s, e, dev, stream, corr, gpid, *rest, node = checked(key, table)  # rest: name, or bytes and copy kind
            n = size(s)
            if kind == OpKind.KERNEL:
                name_sid.extend(rest.pop())
                rest = [[np.zeros(n, np.int64)]]
            else:
                name_sid.append(np.full(n, -1, np.int32))
            if kind == OpKind.MEMCPY and n:
                first = sum(p["n"] for p in parts)
                copy_rows, copy_kind = np.arange(first, first + n, dtype=np.int64), whole(rest[1])
            parts.append(dict(start=s, end=e, dev=dev, stream=stream, corr=corr, gpid=gpid, node=node, bytes=rest[0],
                              kind=kind, n=n))
            del s, e, dev, stream, corr, gpid, rest, node
        if not parts:
            self.notes.append("no kernel, memcpy or memset table: the trace has no GPU ops")
            return GpuOps(), np.empty(0, np.int32), None

        def cat(key: str) -> np.ndarray:
            # Drop each slice as soon as it is joined so peak memory stays near one copy.
            return whole([a for p in parts for a in p.pop(key)])

        kinds = np.concatenate([np.full(p["n"], int(p["kind"]), np.int8) for p in parts])
        pid = cat("gpid")  # split from globalPid in SQL, on the reader threads
        ops = GpuOps(start_ns=cat("start"), end_ns=cat("end"), kind=kinds,
                     name_id=np.full(len(kinds), NO_ID, np.int32), device_id=cat("dev").astype(np.int32, copy=False),
                     stream_id=cat("stream"), pid=pid, correlation_id=cat("corr"), graph_node_id=cat("node"),
                     bytes=cat("bytes"))
        sids = name_sid[0] if len(name_sid) == 1 else np.concatenate(name_sid)
        return ops, sids, (copy_rows, copy_kind) if copy_rows is not None else None

    def _calls(self, got: dict[str, list[Any]], ops: GpuOps) -> tuple[Calls, np.ndarray]:
        if "runtime" not in got:
            if len(ops):
                self.notes.append("no CUDA API table: ops cannot be joined to their launch calls")
            return Calls(), np.empty(0, np.int64)
        s, e, pid, tid, corr, name, eclass = got.pop("runtime")
        # (only the rows of launches were read: a row is named by its correlation id)
        s, e, pid, tid, corr, name, eclass = self.times.drop(
            f"{_RUNTIME} (launch calls)", [s, e, pid, tid, corr, name, eclass], row=lambda i: f"correlationId {corr[i]}")
        # One call per (process, correlation id): runtime rows win over driver rows, then the
        # first in table order. Only calls that some op points at (the launches) are kept.
        is_driver = eclass == _EVENT_CLASS_DRIVER
        rank = is_driver.view(np.uint8) if is_driver.any() else None  # driver rows lose to runtime rows
        op_call = correlation_join(ops.pid, ops.correlation_id, pid, corr, right_rank=rank)
        del rank
        used = np.zeros(len(s), bool)
        used[op_call[op_call >= 0]] = True
        # The native read already dropped rows no op points at: usually nothing is left to
        # drop, and then no column is copied.
        if used.all():
            keep = slice(None)
        else:
            keep = np.flatnonzero(used)
            new_row = np.cumsum(used, dtype=np.int64) - 1  # row among the kept calls
            op_call = np.where(op_call >= 0, new_row[np.maximum(op_call, 0)], -1)
            del new_row
        del used
        kind = np.where(is_driver[keep], np.int8(CallKind.DRIVER), np.int8(CallKind.RUNTIME))
        del is_driver
        calls = Calls(start_ns=s[keep], end_ns=e[keep], tid=tid[keep], pid=pid[keep], correlation_id=corr[keep],
                      name_id=np.full(len(kind), NO_ID, np.int32), kind=kind)
        # Kept calls are one per (pid, correlation id), so this is the join attribution makes:
        # handed over with the columns it was computed from (traces.model.OP_CALL_KEY).
        op_call.flags.writeable = False  # shared: nobody may change it under the trace
        self._op_call = (ops.pid, ops.correlation_id, calls.pid, calls.correlation_id, op_call)
        return calls, name[keep]

    def _nvtx(self, rows: list[Any] | None, types: dict[str, int]) -> tuple[Ranges, dict[str, Any]]:
        if rows is None:
            return Ranges(), {"text_sid": np.empty(0, np.int64), "text": (np.empty(0, np.int32), []), "thread_names": {}}
        start, end, etype, gtid, end_gtid, text_sid, domain, category, payload, text = rows
        pushpop = (etype == types["NvtxPushPopRange"]) | (etype == types["NvtxtPushPopRange"])
        startend = (etype == types["NvtxStartEndRange"]) | (etype == types["NvtxtStartEndRange"])
        mark = (etype == types["NvtxMark"]) | (etype == types["NvtxtMark"])
        is_range = pushpop | startend
        keep = is_range | mark
        open_ = is_range & (end == -1)  # end NULL (any other negative end is damage, dropped below)
        # Rows whose times cannot be real go first (an open range is judged by its start), so
        # that they do not move the time open ranges are closed at.
        end = np.where(mark | open_, start, end)
        rows = np.flatnonzero(keep)
        valid = self.times.keep(_NVTX, start[rows], end[rows], row=self.rowid_label(_NVTX, rows))
        if valid is not None:
            keep[rows[~valid]] = False
            open_ &= keep
        if open_.any():
            # nsys stats closes an unclosed range at the last NVTX timestamp; do the same.
            last = int(max(start[keep].max(), end[is_range & keep].max()))
            self.notes.append(f"{int(open_.sum())} NVTX range(s) never ended: closed at the last NVTX timestamp")
            end = np.where(open_, last, end)
        pid, tid = split_global_tid(gtid)
        _, end_tid = split_global_tid(np.where(end_gtid >= 0, end_gtid, gtid))
        style = np.where(pushpop, RangeStyle.PUSH_POP, np.where(startend, RangeStyle.START_END, RangeStyle.MARK))
        ranges = Ranges(start_ns=start[keep], end_ns=end[keep], name_id=np.full(int(keep.sum()), NO_ID, np.int32),
                        domain_id=np.full(int(keep.sum()), NO_ID, np.int32), tid=tid[keep], end_tid=end_tid[keep],
                        pid=pid[keep], style=style[keep].astype(np.int8), payload=payload[keep])
        text_codes, text_values = text

        def rows_of(event: str) -> np.ndarray:
            return np.flatnonzero(etype == types[event])

        thread_names: dict[int, str] = {}
        for i in rows_of("NvtxThread"):  # a handful of naming rows, not trace rows
            name = text_values[text_codes[i]] if text_codes[i] >= 0 else ""
            if not name and text_sid[i] >= 0:
                name = self.be.strings_by_id(self.db, "StringIds", np.array([text_sid[i]]))[0]
            if name:
                thread_names[int(tid[i])] = name
        parts = {"keep": keep, "text_sid": text_sid[keep], "text": (text_codes[keep], text_values),
                 "all_text_sid": text_sid, "all_text": text, "domain": domain, "category": category, "pid": pid,
                 "domain_rows": rows_of("NvtxDomainCreate"), "category_rows": rows_of("NvtxCategory"),
                 "thread_names": thread_names}
        return ranges, parts

    def _domains_and_categories(self, ranges: Ranges, parts: dict[str, Any]) -> None:
        if "keep" not in parts:
            return
        keep = parts["keep"]
        codes, values = parts["all_text"]
        sid = parts["all_text_sid"]
        domain, pid, category = parts["domain"], parts["pid"], parts["category"]

        def label(i: int) -> str:
            if sid[i] >= 0:
                return self.be.strings_by_id(self.db, "StringIds", np.array([sid[i]]))[0]
            return values[codes[i]] if codes[i] >= 0 else ""

        # Domain names are scoped to the process that created them (nsys joins on the pid bits).
        names: dict[tuple[int, int], int] = {}
        for i in parts["domain_rows"]:  # one row per nvtxDomainCreate: a handful
            names.setdefault((int(pid[i]), int(domain[i])), self.strings.intern(label(int(i))))
        kept_domain, kept_pid = domain[keep], pid[keep]
        for (p, d), name_id in names.items():
            ranges.domain_id[(kept_pid == p) & (kept_domain == d)] = name_id
        cats: dict[tuple[int, int, int], str] = {}
        for i in parts["category_rows"]:
            cats[(int(pid[i]), int(domain[i]), int(category[i]))] = label(int(i))
        self._category = category[keep].astype(np.int32)
        self._category_names = {f"{p}:{d}:{c}": v for (p, d, c), v in cats.items()}

    def _session_value(self, column: str) -> int | None:
        t = "TARGET_INFO_SESSION_START_TIME"
        rows = self.small(f"SELECT {column} FROM {t} LIMIT 1") if column in self.schema.get(t, ()) else []
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def _meta(self, parts: dict[str, Any]) -> dict[str, object]:
        meta: dict[str, object] = {"reader_backend": self.be.name}
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if table in self.schema:
                for name, value in self.small(f"SELECT name, value FROM {table}"):
                    if name in ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION"):
                        meta["nsys_version" if "PRODUCT" in name else "schema_version"] = str(value)
        if (clock_ns := self._session_value("systemClockNs")) is not None:
            meta["session_start_system_clock_ns"] = clock_ns
        if hasattr(self, "_op_call"):
            meta[OP_CALL_KEY] = self._op_call
        if hasattr(self, "_category"):
            meta["range_category"] = self._category
            meta["category_names"] = self._category_names
        return meta
