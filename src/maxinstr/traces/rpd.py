"""RPD (rocmProfileData) SQLite databases, plain or gzip-compressed.

``rocpd_api`` holds host API calls and roctx ranges (``apiName`` ``UserMarker``, message in
``args``), ``rocpd_op`` the GPU work (kernels, copies, fills), and ``rocpd_api_ops`` links each
op to the API call that issued it: the API row id is used as the correlation id. Names are
ids into ``rocpd_string``. rpd_tracer stamps API rows with CLOCK_MONOTONIC nanoseconds.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np

from maxinstr.errors import TraceError
from maxinstr.traces import _util
from maxinstr.traces._util import Progress, int_column, ranges_table, report
from maxinstr.traces.model import INVALID_NS, NO_ID, CallKind, Calls, GpuOps, OpKind, RangeStyle, StringTable, TimeCheck, Trace

_REQUIRED = {
    "rocpd_string": ("id", "string"),
    "rocpd_api": ("id", "pid", "tid", "start", "end", "apiName_id", "args_id"),
    "rocpd_op": ("id", "gpuId", "queueId", "start", "end", "description_id", "opType_id"),
    "rocpd_api_ops": ("api_id", "op_id"),
}
_MARKER_API = "UserMarker"
_GRAPH_LAUNCH = re.compile(r"GraphLaunch", re.IGNORECASE)


def is_rpd(tables: dict[str, str]) -> bool:
    """Whether a SQLite database's tables look like RPD."""
    return "rocpd_api" in tables and "rocpd_op" in tables


def read_rpd(path: str | Path, *, progress: Progress | None = None) -> Trace:
    """Read an RPD database (``.rpd``, or ``.rpd.gz``: inflated into a temp file first)."""
    path = Path(path)
    with _util.sqlite_db(path) as (con, db_path):
        try:
            return _read(path, con, db_path, progress)
        except sqlite3.Error as exc:
            raise TraceError(path, f"RPD: SQLite error: {exc}") from None


def _int_columns(path: Path, db_path: Path, table: str, cols: tuple[str, ...], order: str = "") -> list[np.ndarray]:
    """Integer columns of a big table through the columnar backend (native when built: the
    1.47M-row rocpd_api of a scaled fixture took 0.9 s there, ~8 s through sqlite3 tuples).
    NULL reads as -1; in ``start``/``end`` (kind 't'), NULL or anything but an integer reads as
    INVALID_NS (model.TimeCheck drops the row)."""
    from maxinstr.traces import _sqlite_columns

    times = [c in ("start", "end") for c in cols]
    sql = "SELECT " + ", ".join(f'ifnull("{c}", {INVALID_NS if t else -1})' for c, t in zip(cols, times))
    sql += f' FROM "{table}"' + (f" ORDER BY {order}" if order else "")
    try:
        return list(_sqlite_columns.backend("auto").query(str(db_path), sql, "".join("t" if t else "i" for t in times)))
    except (RuntimeError, ValueError, TypeError, OverflowError, sqlite3.Error) as exc:
        raise TraceError(path, f"RPD table {table}: {str(exc)[:100]}") from None


def _check_schema(path: Path, con: sqlite3.Connection) -> dict[str, str]:
    tables = _util.sqlite_tables(con)
    for table, cols in _REQUIRED.items():
        if table not in tables:
            raise TraceError(path, f"RPD database lacks table {table!r} (truncated, or not RPD)")
        have = _util.sqlite_columns(con, table)
        missing = [c for c in cols if c not in have]
        if missing:
            raise TraceError(path, f"RPD table {table} lacks column {missing[0]!r} (a wrong version?)")
    return tables


def _read(path: Path, con: sqlite3.Connection, db_path: Path, progress: Progress | None) -> Trace:
    tables = _check_schema(path, con)
    meta: dict[str, object] = {}
    if "rocpd_metadata" in tables:
        meta["rpd_metadata"] = {str(k): str(v) for k, v in con.execute('SELECT tag, value FROM "rocpd_metadata"')}
    notes: list[str] = []
    times = TimeCheck(path, notes)  # rpd_tracer's CLOCK_MONOTONIC never reads 0
    fetch = _util.fetch_columns

    # rocpd_string: id -> text. Names stay ids: rows carry positions into this small table
    # (kernel names run to thousands of characters; never widen them into per-row arrays)
    s_id, s_text = fetch(con, 'SELECT id, string FROM "rocpd_string" ORDER BY id', 2)
    s_id = int_column(s_id, path, "rocpd_string.id")
    s_text = np.array([_text(v) for v in s_text.tolist()] + [""], dtype=object)  # last: missing
    strings = StringTable()
    s_name = _util.intern(strings, s_text)
    s_len = np.array([len(v) for v in s_text], dtype=np.int64)
    missing_pos = len(s_text) - 1

    def pos_of(ids: np.ndarray, what: str) -> np.ndarray:
        if not len(ids):
            return np.empty(0, dtype=np.int64)
        if not len(s_id):
            return np.full(len(ids), missing_pos, dtype=np.int64)
        pos = np.minimum(np.searchsorted(s_id, ids), len(s_id) - 1)
        bad = s_id[pos] != ids
        if bad.any():
            notes.append(f"{int(bad.sum())} {what} ids not in rocpd_string (named '')")
        return np.where(bad, missing_pos, pos)

    def flag(pred) -> np.ndarray:
        return np.array([bool(pred(v)) for v in s_text], dtype=bool)

    report(progress, "reading rocpd_api")
    a_id, a_pid, a_tid, a_start, a_end, a_name, a_args = _int_columns(
        path, db_path, "rocpd_api", ("id", "pid", "tid", "start", "end", "apiName_id", "args_id"), order="id"
    )
    # every API row becomes a call or a range: rows whose times cannot be real are dropped first
    keep = times.keep("rocpd_api", a_start, a_end, row=lambda i: f"id {a_id[i]}")
    if keep is not None:
        a_id, a_pid, a_tid, a_start, a_end, a_name, a_args = (
            c[keep] for c in (a_id, a_pid, a_tid, a_start, a_end, a_name, a_args))
    api_pos = pos_of(a_name, "apiName")
    is_marker = flag(lambda v: v == _MARKER_API)[api_pos]

    report(progress, "reading rocpd_op")
    o_id, o_gpu, o_queue, o_start, o_end, o_desc, o_type = _int_columns(
        path, db_path, "rocpd_op", ("id", "gpuId", "queueId", "start", "end", "description_id", "opType_id")
    )
    type_pos = pos_of(o_type, "opType")
    desc_pos = pos_of(o_desc, "description")

    link_api, link_op = _int_columns(path, db_path, "rocpd_api_ops", ("api_id", "op_id"))
    # correlation id of each op = the id of the API row linked to it
    corr = np.full(len(o_id), NO_ID, dtype=np.int64)
    if len(link_op) and len(o_id):
        o_order = np.argsort(o_id, kind="stable")
        pos = np.minimum(np.searchsorted(o_id[o_order], link_op), len(o_id) - 1)
        hit = o_id[o_order][pos] == link_op
        corr[o_order[pos[hit]]] = link_api[hit]
        if (~hit).any():
            notes.append(f"{int((~hit).sum())} rocpd_api_ops rows point at missing ops")

    # op kinds; barriers and markers are not GPU work we report
    kind = np.full(len(o_id), -1, dtype=np.int8)
    kind[flag(lambda v: v in ("KernelExecution", "Task"))[type_pos]] = int(OpKind.KERNEL)
    kind[flag(lambda v: v.startswith("Copy"))[type_pos]] = int(OpKind.MEMCPY)
    kind[flag(lambda v: v == "FillBuffer" or v.startswith("Memset"))[type_pos]] = int(OpKind.MEMSET)
    dropped = kind < 0
    if dropped.any():
        kinds = sorted({str(s_text[i]) for i in np.unique(type_pos[dropped])})[:5]
        notes.append(f"{int(dropped.sum())} rocpd_op rows of other types dropped ({', '.join(kinds)})")
    keep = ~dropped
    # (only the ops read are checked: a barrier's times are unused)
    used = np.flatnonzero(keep)
    valid = times.keep("rocpd_op", o_start[used], o_end[used], row=lambda i: f"id {o_id[used[i]]}")
    if valid is not None:
        keep[used[~valid]] = False

    # pid of each op from its API row; bytes of copies from rocpd_copyapi
    link_pos = np.searchsorted(a_id, corr)
    api_pos_c = np.minimum(link_pos, max(len(a_id) - 1, 0))
    linked = (corr != NO_ID) & (len(a_id) > 0)
    if len(a_id):
        linked &= a_id[api_pos_c] == corr
    op_pid = np.where(linked, a_pid[api_pos_c] if len(a_id) else NO_ID, NO_ID)
    nbytes = np.zeros(len(o_id), dtype=np.int64)
    if "rocpd_copyapi" in tables and {"api_ptr_id", "size"} <= _util.sqlite_columns(con, "rocpd_copyapi"):
        c_api, c_size = (
            int_column(c, path, f"rocpd_copyapi.{n}")
            for c, n in zip(
                fetch(con, 'SELECT api_ptr_id, size FROM "rocpd_copyapi" ORDER BY api_ptr_id', 2),
                ("api_ptr_id", "size"),
            )
        )
        if len(c_api):
            p = np.minimum(np.searchsorted(c_api, corr), len(c_api) - 1)
            has = (c_api[p] == corr) & (kind == int(OpKind.MEMCPY))
            nbytes[has] = c_size[p[has]]

    # an op is named by its description (kernel name), else by its type (CopyHostToDevice)
    name_pos = np.where(s_len[desc_pos] > 0, desc_pos, type_pos)
    ops = GpuOps(
        start_ns=o_start,
        end_ns=o_end,
        kind=kind,
        name_id=s_name[name_pos],
        device_id=o_gpu.astype(np.int32),
        stream_id=o_queue,
        pid=op_pid.astype(np.int64),
        correlation_id=corr,
        graph_node_id=np.full(len(o_id), NO_ID, np.int64),
        bytes=nbytes,
    ).take(keep)
    ops = ops.take(np.argsort(ops.start_ns, kind="stable"))

    # host calls: every API row that is not a roctx marker
    c_sel = ~is_marker
    is_graph = flag(lambda v: _GRAPH_LAUNCH.search(v))[api_pos[c_sel]]
    calls = Calls(
        start_ns=a_start[c_sel],
        end_ns=a_end[c_sel],
        tid=a_tid[c_sel],
        pid=a_pid[c_sel],
        correlation_id=a_id[c_sel],
        name_id=s_name[api_pos[c_sel]],
        kind=np.where(is_graph, int(CallKind.GRAPH), int(CallKind.RUNTIME)).astype(np.int8),
    )
    calls = calls.take(np.argsort(calls.start_ns, kind="stable"))
    graph_corr = calls.correlation_id[calls.kind == int(CallKind.GRAPH)]
    ops.graph_node_id = _util.graph_node_ordinals(ops.correlation_id, ops.start_ns, graph_corr)
    if (ops.graph_node_id != NO_ID).any():
        notes.append("graph node ids are stand-ins: the order of each op within its hipGraphLaunch")

    # roctx ranges: UserMarker rows, message in args
    m = np.flatnonzero(is_marker)
    m_start, m_end = a_start[m], a_end[m]
    style = np.where(m_start == m_end, int(RangeStyle.MARK), int(RangeStyle.PUSH_POP)).astype(np.int8)
    ranges = ranges_table(
        m_start,
        m_end,
        s_name[pos_of(a_args[m], "marker args")],
        a_tid[m],
        a_pid[m],
        style,
    )
    unlinked = int(((ops.correlation_id == NO_ID)).sum())
    if unlinked:
        notes.append(f"{unlinked} GPU ops have no rocpd_api_ops link to a host call")
    trace = Trace(
        source=str(path),
        format="rpd",
        strings=strings.to_array(),
        ranges=ranges,
        calls=calls,
        ops=ops,
        clock="CLOCK_MONOTONIC",
        notes=notes,
        meta=meta,
    )
    trace.validate()
    return trace


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
