"""RPD (rocmProfileData) SQLite databases, plain or gzip, and rpd2tracing's Chrome-trace export.

``rocpd_api`` holds host calls and roctx ranges (``UserMarker``, message in ``args``), ``rocpd_op``
the GPU work, ``rocpd_api_ops`` the link (the API row id is the correlation id); names are ids into
``rocpd_string``. rpd_tracer stamps CLOCK_MONOTONIC ns."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np

from maxinstr.errors import TraceError
from maxinstr.traces import _util
from maxinstr.traces._util import (HIP_GRAPH_NOTE, Progress, TraceBuilder, by_start, call_rows, graph_stand_ins,
                                   int_column, mark_graph_calls, pids_from_calls, report)
from maxinstr.traces.model import INVALID_NS, NO_ID, Calls, GpuOps, OpKind, RangeStyle, Ranges, TimeCheck, Trace

_REQUIRED = {"rocpd_string": ("id", "string"),
             "rocpd_api": ("id", "pid", "tid", "start", "end", "apiName_id", "args_id"),
             "rocpd_op": ("id", "gpuId", "queueId", "start", "end", "description_id", "opType_id"),
             "rocpd_api_ops": ("api_id", "op_id")}
_MARKER_API = "UserMarker"
_GRAPH_LAUNCH = re.compile(r"GraphLaunch", re.IGNORECASE)


def is_rpd(tables: dict[str, str]) -> bool:
    """Whether a SQLite database's tables look like RPD."""
    return "rocpd_api" in tables and "rocpd_op" in tables


def read_rpd(path: str | Path, *, progress: Progress | None = None) -> Trace:
    """Read an RPD database (``.rpd``, or ``.rpd.gz``: inflated into a temp file first)."""
    return _util.read_sqlite(path, "RPD", lambda path, con, db_path: _read(path, con, db_path, progress))


def _int_columns(path: Path, db_path: Path, table: str, cols: tuple[str, ...], order: str = "") -> list[np.ndarray]:
    """Integer columns of a big table through the columnar backend (native when built: the
    1.47M-row rocpd_api of a scaled fixture took 0.9 s there, ~8 s through sqlite3 tuples).
    NULL reads as -1; in ``start``/``end`` (kind 't'), NULL or anything but an integer reads as
    INVALID_NS (model.TimeCheck drops the row)."""
    kinds = "".join("t" if c in ("start", "end") else "i" for c in cols)
    sql = "SELECT " + ", ".join(f'ifnull("{c}", {INVALID_NS if k == "t" else -1})' for c, k in zip(cols, kinds))
    sql += f' FROM "{table}"' + (f" ORDER BY {order}" if order else "")
    return _util.query_columns(path, db_path, sql, kinds, f"RPD table {table}")


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
    b = TraceBuilder(path, "rpd", "CLOCK_MONOTONIC")
    notes = b.notes
    times = TimeCheck(path, notes)  # rpd_tracer's CLOCK_MONOTONIC never reads 0
    fetch = _util.fetch_columns

    # rocpd_string: id -> text. Names stay ids: rows carry positions into this small table
    # (kernel names run to thousands of characters; never widen them into per-row arrays)
    s_id, s_text = fetch(con, 'SELECT id, string FROM "rocpd_string" ORDER BY id', 2)
    s_id = int_column(s_id, path, "rocpd_string.id")
    s_text = np.array([_text(v) for v in s_text.tolist()] + [""], dtype=object)  # last: missing
    s_name = b.names(s_text)
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
    a_start, a_end, a_id, a_pid, a_tid, a_name, a_args = times.drop(
        "rocpd_api", [a_start, a_end, a_id, a_pid, a_tid, a_name, a_args], row=lambda i: f"id {a_id[i]}")
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
        row = call_rows(link_op, o_id)
        hit = row >= 0
        corr[row[hit]] = link_api[hit]
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
    op_pid = np.where(corr != NO_ID, np.r_[a_pid, NO_ID][call_rows(corr, a_id)], NO_ID)
    nbytes = np.zeros(len(o_id), dtype=np.int64)
    if "rocpd_copyapi" in tables and {"api_ptr_id", "size"} <= _util.sqlite_columns(con, "rocpd_copyapi"):
        c_api, c_size = (int_column(c, path, f"rocpd_copyapi.{n}") for c, n in zip(
            fetch(con, 'SELECT api_ptr_id, size FROM "rocpd_copyapi" ORDER BY api_ptr_id', 2), ("api_ptr_id", "size")))
        row = call_rows(corr, c_api)
        has = (row >= 0) & (kind == int(OpKind.MEMCPY))
        nbytes[has] = c_size[row[has]]

    # an op is named by its description (kernel name), else by its type (CopyHostToDevice)
    name_pos = np.where(s_len[desc_pos] > 0, desc_pos, type_pos)
    b.add(GpuOps, start_ns=o_start, end_ns=o_end, kind=kind, name_id=s_name[name_pos], device_id=o_gpu,
          stream_id=o_queue, pid=op_pid, correlation_id=corr, bytes=nbytes)
    ops = by_start(b.table(GpuOps, sort=False).take(keep))
    # host calls: every API row that is not a roctx marker
    c_sel = ~is_marker
    b.add(Calls, start_ns=a_start[c_sel], end_ns=a_end[c_sel], tid=a_tid[c_sel], pid=a_pid[c_sel],
          correlation_id=a_id[c_sel], name_id=s_name[api_pos[c_sel]])
    calls = b.table(Calls)
    mark_graph_calls(b.strings, calls, _GRAPH_LAUNCH.search)
    graph_stand_ins(ops, calls, notes, HIP_GRAPH_NOTE)
    # roctx ranges: UserMarker rows, message in args
    m = np.flatnonzero(is_marker)
    b.add(Ranges, start_ns=a_start[m], end_ns=a_end[m], name_id=s_name[pos_of(a_args[m], "marker args")],
          tid=a_tid[m], pid=a_pid[m], style=np.where(a_start[m] == a_end[m], int(RangeStyle.MARK), 0))
    unlinked = int(((ops.correlation_id == NO_ID)).sum())
    if unlinked:
        notes.append(f"{unlinked} GPU ops have no rocpd_api_ops link to a host call")
    return b.trace(calls=calls, ops=ops, meta=meta)


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# -- RPD's Chrome-trace export (rocmProfileData tools/rpd2tracing.py) ----------------------------

FORMAT_JSON = "rpd-json"
_OP_KINDS = (("KernelExecution", OpKind.KERNEL), ("Task", OpKind.KERNEL), ("Copy", OpKind.MEMCPY),
             ("FillBuffer", OpKind.MEMSET), ("Memset", OpKind.MEMSET))
_FLOW_SLACK_NS = 2000  # rpd2tracing starts an api->op flow 2 us before the call's end


def is_rpd_json(events: list) -> bool:
    """Whether a Chrome-trace event list is rpd2tracing's: GPU sections named ``GPU<n>`` with a
    ``process_sort_index`` of 1000000 + n, host threads named ``Hip <tid>``, flows of category
    ``api_op``."""
    head = events[:5000]
    for e in head:
        if not isinstance(e, dict):
            continue
        if e.get("cat") == "api_op" and e.get("ph") in ("s", "f"):
            return True
        args = e.get("args")
        if e.get("ph") == "M" and isinstance(args, dict):
            if e.get("name") == "thread_name" and str(args.get("name", "")).startswith("Hip "):
                return True
            if e.get("name") == "process_sort_index" and str(args.get("sort_index", "")).startswith("100000"):
                return True
    return False


def read_rpd_json(path: str | Path, *, progress: Progress | None = None, document: object = None) -> Trace:
    """Read RPD's Chrome-trace export (``rpd2tracing.py``: a bare event list, or an object with
    ``traceEvents``). GPU ops are the ``X`` events on the ``GPU<n>`` sections (pid = gpuId, tid =
    queueId), their type in ``args.desc``; the tool's own summaries there ("UserMarker frame" and
    "Graph <n>" spans) are skipped. Each op is tied to its API call through the ``api_op`` flow: it
    starts on the call's thread at the call's end less 2 us (or at the op's start when earlier)."""
    path = Path(path)
    events = _util.chrome_events(path, document, "RPD JSON", progress)
    with _util.malformed(path, "RPD JSON"):
        return _read_json(path, events, progress)


def _read_json(path: Path, events: list, progress: Progress | None) -> Trace:
    b = TraceBuilder(path, FORMAT_JSON, "CLOCK_MONOTONIC")
    notes = b.notes
    times = TimeCheck(path, notes)
    gpu_pids: set[str] = set()
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name":
            args = e.get("args")
            if isinstance(args, dict) and str(args.get("name", "")).startswith("GPU"):
                gpu_pids.add(str(e.get("pid")))
    report(progress, f"{len(events)} events")
    ops_ev: list[dict] = []
    host_ev: list[dict] = []
    marks: list[dict] = []
    flow_s: dict[str, dict] = {}
    flow_f: list[dict] = []
    skipped = 0
    for e in events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "X":
            args = e.get("args")
            if not isinstance(args, dict):
                args = {}
            if str(e.get("pid")) in gpu_pids:
                if "kernels" in args or str(args.get("desc", "")).startswith("UserMarker frame"):
                    skipped += 1  # rpd2tracing's summaries of ops already listed
                else:
                    ops_ev.append(e)
            else:
                host_ev.append(e)
        elif ph == "i":
            marks.append(e)
        elif ph == "s" and e.get("cat") == "api_op":
            flow_s[str(e.get("id"))] = e
        elif ph == "f" and e.get("cat") == "api_op":
            flow_f.append(e)

    def col(evs: list[dict], key: str) -> list:
        return [ev.get(key) for ev in evs]

    def timed(evs: list[dict], what: str) -> tuple[list[dict], np.ndarray, np.ndarray]:
        start = _util.decimal_us_to_ns(col(evs, "ts"), path, f"{what}.ts")
        dur = _util.decimal_us_to_ns([ev.get("dur", 0) for ev in evs], path, f"{what}.dur")
        end = np.where((start == INVALID_NS) | (dur == INVALID_NS), INVALID_NS, start + np.where(dur == INVALID_NS, 0, dur))
        start, end, evs = times.drop(what, [start, end, evs], row=lambda i: f"event {i}", names=("ts", "dur"),
                                     unit="events")
        return evs, start, end

    def ints(evs: list[dict], key: str) -> np.ndarray:  # (never raises: what is no integer is NO_ID)
        return int_column(col(evs, key), path, key, invalid=NO_ID)

    # host: API calls and roctx ranges (UserMarker: the message is both the name and args.desc)
    host_ev, h_start, h_end = timed(host_ev, "host events")
    h_name = np.array([str(ev.get("name", "")) for ev in host_ev], dtype=object)
    h_desc = np.array([str((ev.get("args") or {}).get("desc", "")) for ev in host_ev], dtype=object)
    is_marker = h_name == h_desc
    h_pid, h_tid = ints(host_ev, "pid"), ints(host_ev, "tid")
    c = np.flatnonzero(~is_marker)
    corr = np.arange(len(c), dtype=np.int64)  # the call's row: RPD's own api id is not in the export
    b.add(Calls, start_ns=h_start[c], end_ns=h_end[c], tid=h_tid[c], pid=h_pid[c], correlation_id=corr,
          name_id=b.names(h_name[c]))
    calls = b.table(Calls, sort=False)
    mark_graph_calls(b.strings, calls, _GRAPH_LAUNCH.search)

    # GPU ops
    ops_ev, o_start, o_end = timed(ops_ev, "GPU op events")
    desc = [str((ev.get("args") or {}).get("desc", "")) for ev in ops_ev]
    kind = np.array([next((int(k) for prefix, k in _OP_KINDS if d.startswith(prefix)), -1) for d in desc], np.int8)
    if (kind < 0).any():
        other = sorted({d for d, k in zip(desc, kind.tolist()) if k < 0})[:5]
        notes.append(f"{int((kind < 0).sum())} GPU events of other types left out ({', '.join(other)})")
    o_pid, o_tid = ints(ops_ev, "pid"), ints(ops_ev, "tid")

    # api_op flows: f at (gpu, queue, op start) -> s at (pid, tid, call end - 2 us or op start)
    pairs = [(flow_s[str(f.get("id"))], f) for f in flow_f if str(f.get("id")) in flow_s]
    s_t = _util.decimal_us_to_ns([s.get("ts") for s, _ in pairs], path, "flow ts")
    f_t = _util.decimal_us_to_ns([f.get("ts") for _, f in pairs], path, "flow ts")
    starts, ends = [s for s, _ in pairs], [f for _, f in pairs]
    s_key = _util.thread_key(ints(starts, "pid"), ints(starts, "tid"))
    # the call began at or before the flow's start + 2 us (its end), and began last on that thread
    # (of calls beginning in one microsecond, the later-listed: rpd2tracing writes them in id order)
    flow_call = _util.latest_at_or_before(_util.thread_key(calls.pid, calls.tid), calls.start_ns, s_key,
                                          np.where(s_t < f_t, s_t + _FLOW_SLACK_NS, s_t))
    f_key = np.stack([ints(ends, "pid"), ints(ends, "tid"), f_t])
    op_corr = _util.match_rows(np.stack([o_pid, o_tid, o_start]), f_key, np.where(flow_call >= 0, corr[np.maximum(flow_call, 0)], NO_ID), NO_ID)
    names = np.array([str(ev.get("name", "")) for ev in ops_ev], dtype=object)
    b.add(GpuOps, start_ns=o_start, end_ns=o_end, kind=kind, name_id=b.names(names), device_id=o_pid, stream_id=o_tid,
          correlation_id=op_corr)
    ops = by_start(b.table(GpuOps, sort=False).take(kind >= 0))
    pids_from_calls(ops, calls)  # an op's process is its call's (a GPU section is no process)
    if unlinked := int((ops.correlation_id == NO_ID).sum()):
        notes.append(f"{unlinked} GPU ops have no api_op flow to a host call")
    graph_stand_ins(ops, calls, notes, HIP_GRAPH_NOTE)
    calls = by_start(calls)

    # roctx ranges and marks
    m = np.flatnonzero(is_marker)
    marks, k_start, _ = timed(marks, "mark events") if marks else ([], np.empty(0, np.int64), None)
    r_start = np.r_[h_start[m], k_start]
    r_end = np.r_[h_end[m], k_start]
    r_name = np.r_[h_name[m], np.array([str(ev.get("name", "")) for ev in marks], dtype=object)].astype(object)
    style = np.r_[np.full(len(m), int(RangeStyle.PUSH_POP), np.int8), np.full(len(marks), int(RangeStyle.MARK), np.int8)]
    b.add(Ranges, start_ns=r_start, end_ns=r_end, name=r_name, tid=np.r_[h_tid[m], ints(marks, "tid")],
          pid=np.r_[h_pid[m], ints(marks, "pid")], style=style)
    if skipped:
        notes.append(f"{skipped} rpd2tracing summary spans on the GPU lanes (UserMarker frames, graph spans) skipped")
    if len(o_start) and not (np.r_[o_start, h_start] % 1000).any():
        notes.append("RPD JSON export: times are whole microseconds (this rpd2tracing version drops the ns)")
    if (ops.kind != int(OpKind.KERNEL)).any():
        notes.append("RPD JSON export: copies carry no byte count (the .rpd's rocpd_copyapi does)")
    return b.trace(calls=calls, ops=ops, meta={"flows": len(pairs)})

