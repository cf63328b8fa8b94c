"""rocprofv3 output: the CSV set, the ``--output-format json`` file, and the rocpd SQLite database
ROCm >= 7 writes by default (docs/traces.md). All three carry HIP API calls, kernel dispatches and
copies tied by correlation id, and roctx markers, which rocprofv3 pairs already (raw push/pop rows
are paired here, per thread, columnarly). Times are rocprofiler-sdk ns."""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from maxinstr.columns import isin_strings, per_string
from maxinstr.errors import TraceError
from maxinstr.traces import _util
from maxinstr.traces._util import (HIP_GRAPH_NOTE, Progress, TraceBuilder, by_start, first_rows, graph_stand_ins,
                                   int_column, mark_graph_calls, pair_push_pop, pids_from_calls, report, trailing_int)
from maxinstr.traces.model import INVALID_NS, NO_ID, Calls, GpuOps, OpKind, RangeStyle, Ranges, TimeCheck, Trace

CLOCK = "rocprofiler-sdk-ns"

# -- what the AMD readers share (rocprof v1 too): the last step of their Trace, roctx markers as ranges --
_GRAPH_LAUNCH = re.compile(r"GraphLaunch", re.IGNORECASE)
_RAW_PUSH = {"roctxRangePushA", "roctxRangePush"}
_RAW_POP = {"roctxRangePop", "roctxRangePopA"}
_MARK_OPS = {"roctxMarkA", "roctxMark"}
_START_OPS = {"roctxRangeStartA", "roctxRangeStart"}


def assemble(b: TraceBuilder, meta: dict) -> Trace:
    """The Trace of what an AMD reader added to ``b``: one call per (process, correlation id), the
    first in the file; ops without a process take their call's; stand-in graph node ids."""
    calls = b.table(Calls, sort=False)
    keep = first_rows(calls.pid, calls.correlation_id)
    mark_graph_calls(b.strings, calls, _GRAPH_LAUNCH.search)
    if len(keep) < len(calls):
        b.notes.append(f"{len(calls) - len(keep)} duplicate API rows (same correlation id) dropped")
    calls = by_start(calls.take(keep))
    b.parts[GpuOps].sort(key=lambda part: int(part["kind"]))  # kernels, copies, sets: as names are interned
    ops = b.table(GpuOps)
    pids_from_calls(ops, calls)
    graph_stand_ins(ops, calls, b.notes, HIP_GRAPH_NOTE)
    return b.trace(calls=calls, ops=ops, meta=meta)


def _marker_styles(start: np.ndarray, end: np.ndarray, tid: np.ndarray, op_names: np.ndarray | None) -> np.ndarray:
    """Style of paired marker rows: marks are instants, start/stop ranges have no thread (tid 0)."""
    style = np.full(len(start), int(RangeStyle.PUSH_POP), np.int8)
    if op_names is not None:
        style[isin_strings(op_names, _START_OPS)] = int(RangeStyle.START_END)
        style[isin_strings(op_names, _MARK_OPS)] = int(RangeStyle.MARK)
    else:
        style[tid == 0] = int(RangeStyle.START_END)
        style[start == end] = int(RangeStyle.MARK)
    return style


def markers_from_rows(start: np.ndarray, end: np.ndarray, name: np.ndarray, tid: np.ndarray, pid: np.ndarray,
                      op_names: np.ndarray | None, notes: list[str]) -> dict:
    """Marker rows as the columns of a Ranges part: raw push/pop rows are paired; rows rocprofv3
    paired already are kept."""
    ops = op_names if op_names is not None else name
    is_push = isin_strings(ops, _RAW_PUSH)
    is_pop = isin_strings(ops, _RAW_POP)
    raw = is_pop.any()
    if raw:
        idx = np.flatnonzero(is_push | is_pop)
        push_i, pop_i, unmatched, unclosed = pair_push_pop(tid[idx], start[idx], is_push[idx])
        push_i, pop_i = idx[push_i], idx[pop_i]
        if unmatched or unclosed:
            notes.append(f"roctx push/pop: {unmatched} pops without a push and {unclosed} pushes never popped dropped")
        rest = np.flatnonzero(~(is_push | is_pop))
        r_style = _marker_styles(start[rest], end[rest], tid[rest], op_names[rest] if op_names is not None else None)
        # a raw pop row carries no message; the push's name (message when known) names the range
        return dict(start_ns=np.r_[start[push_i], start[rest]], end_ns=np.r_[end[pop_i], end[rest]],
                    name=np.r_[name[push_i], name[rest]].astype(object), tid=np.r_[tid[push_i], tid[rest]],
                    pid=np.r_[pid[push_i], pid[rest]],
                    style=np.r_[np.full(len(push_i), int(RangeStyle.PUSH_POP), np.int8), r_style])
    style = _marker_styles(start, end, tid, op_names)
    no_thread = (style == int(RangeStyle.START_END)) & (tid == 0)
    if no_thread.any():
        notes.append(f"{int(no_thread.sum())} roctx start/stop ranges carry no thread id (rocprofv3 writes 0)")
    tid = np.where(no_thread, NO_ID, tid)
    return dict(start_ns=start, end_ns=end, name=name.astype(object), tid=tid, pid=pid, style=style)


# file-name suffixes of the rocprofv3 CSV set (files may carry a "<pid>_" or other prefix)
_CSV_KINDS = {"kernel_trace.csv": "kernel", "hip_api_trace.csv": "hip", "hip_runtime_trace.csv": "hip",
              "hip_compiler_trace.csv": "hip", "marker_api_trace.csv": "marker", "memory_copy_trace.csv": "memcpy"}
_CSV_REQUIRED = {"kernel": ("Kernel_Name", "Correlation_Id", "Start_Timestamp", "End_Timestamp"),
                 "hip": ("Function", "Process_Id", "Thread_Id", "Correlation_Id", "Start_Timestamp", "End_Timestamp"),
                 "marker": ("Function", "Process_Id", "Thread_Id", "Start_Timestamp", "End_Timestamp"),
                 "memcpy": ("Direction", "Correlation_Id", "Start_Timestamp", "End_Timestamp")}


def csv_kind(name: str) -> str | None:
    """Which table of the rocprofv3 CSV set a file name holds, or None."""
    return next((kind for suffix, kind in _CSV_KINDS.items() if name.endswith(suffix)), None)


# -- CSV set -------------------------------------------------------------------------------------


# the columns any table of the set is read for; names and other text become shared strings
_TEXT_COLS = ("Kernel_Name", "Function", "Direction", "Domain", "Kind", "Agent_Id", "Agent_Type",
              "Source_Agent_Id", "Destination_Agent_Id")
_USED_COLS = frozenset(
    _TEXT_COLS
    + ("Process_Id", "Thread_Id", "Correlation_Id", "Start_Timestamp", "End_Timestamp", "Queue_Id", "Stream_Id",
       "Bytes", "Size", "Copy_Bytes", "Logical_Node_Id")
)


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    """One rocprofv3 CSV file as column name -> numpy column (header row required): through pandas'
    C parser when it is installed (about 20x faster, no Python object per field; text read as
    categories, so each distinct name is one string), else, or at any doubt (a parse error, a
    missing field), through the csv module, which names the bad row."""
    fast = _read_csv_pandas(path)
    return fast if fast is not None else _read_csv_python(path)


def _read_csv_pandas(path: Path) -> dict[str, np.ndarray] | None:
    try:
        import pandas as pd  # optional, and heavy: only for a CSV trace
    except ImportError:
        return None
    # gzip is inflated here, within maxinstr's bound (_util.inflate), never by pandas unbounded
    source: Any = io.BytesIO(_util.read_bytes(path)) if _util.read_head(path, 2) == _util.GZIP_MAGIC else path
    try:
        if isinstance(source, io.BytesIO):
            first = source.readline()
            source.seek(0)
        else:
            with open(path, "rb") as fh:
                first = fh.readline()
        header = next(csv.reader([first.decode("utf-8")]), [])
        if not header or len(set(header)) != len(header) or any("\x00" in h for h in header):
            return None
        use = [c for c in header if c in _USED_COLS]
        if not use:
            return {name: np.empty(0, dtype=object) for name in header}
        frame = pd.read_csv(source, usecols=use, dtype={c: "category" for c in use if c in _TEXT_COLS}, engine="c",
                            keep_default_na=False, na_values=[""], encoding="utf-8")
    except Exception:  # noqa: BLE001 - any parser complaint: the csv-module path gives the precise error
        return None
    if frame.isna().to_numpy().any():
        return None  # a short (truncated) row or an empty field
    out: dict[str, np.ndarray] = {}
    for c in use:
        col = frame[c]
        if isinstance(col.dtype, pd.CategoricalDtype):
            cats = np.asarray(col.cat.categories, dtype=object)
            out[c] = cats[col.cat.codes.to_numpy()] if len(cats) else np.empty(len(col), dtype=object)
        else:
            out[c] = col.to_numpy()
    return out


def _read_csv_python(path: Path) -> dict[str, np.ndarray]:
    data = _util.read_bytes(path)
    if not data.strip():
        raise TraceError(path, "empty file (no CSV header)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(path, f"not UTF-8 text (byte {exc.start})") from None
    if "\x00" in text:
        raise TraceError(path, "binary data in a CSV file")
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise TraceError(path, f"bad CSV: {exc}") from None
    header, body = rows[0], [r for r in rows[1:] if r]
    width = len(header)
    if width == 0 or len(set(header)) != width:
        raise TraceError(path, "bad CSV header")
    bad = next((i for i, r in enumerate(body) if len(r) != width), None)
    if bad is not None:
        raise TraceError(path, f"row {bad + 2} has {len(body[bad])} fields, the header has {width} "
                               "(truncated or corrupt?)")
    if not body:
        return {name: np.empty(0, dtype=object) for name in header}
    return {name: np.array(col, dtype=object) for name, col in zip(header, zip(*body))}


def _csv_groups(path: Path) -> dict[str, dict[str, Path]]:
    """prefix -> {kind: file} for a folder or one file of a rocprofv3 CSV set."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.csv") if p.is_file())
    else:
        if csv_kind(path.name) is None:
            raise TraceError(path, "not a rocprofv3 trace CSV (expected *kernel_trace.csv, *hip_api_trace.csv, ...)")
        prefix = path.name[: -len(next(s for s in _CSV_KINDS if path.name.endswith(s)))]
        files = [p for p in sorted(path.parent.glob(prefix + "*.csv")) if p.name[len(prefix) :] in _CSV_KINDS]
    groups: dict[str, dict[str, Path]] = {}
    for f in files:
        suffix, kind = next(((s, k) for s, k in _CSV_KINDS.items() if f.name.endswith(s)), ("", ""))
        if kind:
            slot = groups.setdefault(str(f.parent / f.name[: -len(suffix)]), {})
            slot.setdefault("hip2" if kind == "hip" and "hip" in slot else kind, f)  # hip_runtime + hip_compiler
    return groups


def read_rocprof_csv(path: str | Path, *, progress: Progress | None = None) -> Trace:
    """Read a rocprofv3 CSV set: a folder, or any one of its ``*_trace.csv`` files.

    A folder holding several sets (one per process, ``<pid>_kernel_trace.csv``) is read whole;
    correlation ids are per process there, so each set's ids are offset by ``set << 40``.
    """
    path = Path(path)
    groups = _csv_groups(path)
    if not groups:
        raise TraceError(path, "no rocprofv3 trace CSV files (*kernel_trace.csv, *hip_api_trace.csv, ...) found")
    b = TraceBuilder(path, "rocprofv3-csv", CLOCK)
    times = TimeCheck(path, b.notes)  # rocprofiler-sdk's clock never reads 0
    files: list[str] = []
    headers: set[str] = set()
    for g, (prefix, kinds) in enumerate(sorted(groups.items())):
        offset = np.int64(g) << np.int64(40) if len(groups) > 1 else np.int64(0)
        pids: list[np.ndarray] = []
        agents = _agent_map(Path(prefix + "agent_info.csv"))
        for kind, f in ((k, kinds[k]) for k in ("hip", "hip2", "marker", "kernel", "memcpy") if k in kinds):
            report(progress, f"reading {f.name}")
            files.append(str(f))
            t = _read_csv(f)
            kind = "hip" if kind == "hip2" else kind
            missing = [c for c in _CSV_REQUIRED[kind] if c not in t]
            if missing:
                raise TraceError(f, f"column {missing[0]!r} missing (not a rocprofv3 {kind} trace, or a wrong version)")
            start = int_column(t["Start_Timestamp"], f, "Start_Timestamp", invalid=INVALID_NS)
            end = int_column(t["End_Timestamp"], f, "End_Timestamp", invalid=INVALID_NS)
            # rows with times that cannot be real: dropped before anything pairs them
            start, end, *columns = times.drop(f.name, [start, end, *t.values()], names=("Start_Timestamp", "End_Timestamp"))
            t = dict(zip(t, columns))
            n = len(start)
            def ints(column: str, t: dict = t, f: Path = f) -> np.ndarray:
                return int_column(t[column], f, column)

            stream_col = next((c for c in ("Stream_Id", "Queue_Id") if c in t), None)
            if kind in ("hip", "marker"):
                pids.append(pid := ints("Process_Id"))
                if kind == "hip":
                    b.add(Calls, start_ns=start, end_ns=end, tid=ints("Thread_Id"), pid=pid,
                          correlation_id=ints("Correlation_Id") + offset, name=t["Function"])
                else:
                    b.add(Ranges, **markers_from_rows(start, end, t["Function"], ints("Thread_Id"), pid, None, b.notes))
            elif kind == "kernel":
                headers.add("rocprofv3 >= 7 (Stream_Id)" if "Stream_Id" in t else "rocprofv3 < 7 (no Stream_Id)")
                agent = trailing_int(t["Agent_Id"], f, "Agent_Id") if "Agent_Id" in t else np.full(n, NO_ID)
                b.add(GpuOps, kind=OpKind.KERNEL, start_ns=start, end_ns=end, name=t["Kernel_Name"],
                      device_id=_gpu_ordinals(agent, agents, b.notes), stream_id=ints(stream_col) if stream_col else NO_ID, pid=_single(pids),
                      correlation_id=ints("Correlation_Id") + offset)
            else:  # memcpy
                src, dst = (trailing_int(t[c], f, c) if c in t else None for c in ("Source_Agent_Id", "Destination_Agent_Id"))
                device: Any = NO_ID
                if src is not None and dst is not None:
                    src, dst = _gpu_ordinals(src, agents, b.notes), _gpu_ordinals(dst, agents, b.notes)
                    device = np.where(per_string(t["Direction"], lambda d: "HOST_TO_DEVICE" in d), dst, src)
                size_col = next((c for c in ("Bytes", "Size", "Copy_Bytes") if c in t), None)
                if size_col is None and n:
                    b.notes.append(f"{f.name}: no byte counts in this rocprofv3 version (bytes = 0)")
                b.add(GpuOps, kind=OpKind.MEMCPY, start_ns=start, end_ns=end, name=t["Direction"], device_id=device,
                      bytes=ints(size_col) if size_col else 0, stream_id=ints(stream_col) if stream_col else NO_ID,
                      pid=_single(pids), correlation_id=ints("Correlation_Id") + offset)
        if "hip" not in kinds and "kernel" in kinds:
            b.notes.append("no HIP API trace next to the kernel trace: kernels cannot be tied to launches")
    if len(groups) > 1:
        b.notes.append(f"{len(groups)} CSV sets read; correlation ids offset by set index << 40")
    return assemble(b, {"files": files, "header": sorted(headers)})


def _agent_map(path: Path) -> dict[int, int] | None:
    """rocprofv3 agent number (``Logical_Node_Id``) -> GPU ordinal, from ``*agent_info.csv``."""
    if not path.is_file():
        return None
    t = _read_csv(path)
    if "Logical_Node_Id" not in t or "Agent_Type" not in t:
        return None
    node = int_column(t["Logical_Node_Id"], path, "Logical_Node_Id")
    gpus = np.sort(node[np.array([str(v) == "GPU" for v in t["Agent_Type"].tolist()], dtype=bool)])
    return {int(n): i for i, n in enumerate(gpus.tolist())}


def _gpu_ordinals(agent: np.ndarray, agents: dict[int, int] | None, notes: list[str]) -> np.ndarray:
    """Agent numbers -> GPU ordinals when the agent table is known; else kept, with a note."""
    if agents is None:
        msg = "device ids are rocprofv3 agent numbers (CPU agents count first; no agent_info.csv)"
        if msg not in notes and len(agent):
            notes.append(msg)
        return agent
    u, inv = np.unique(agent, return_inverse=True)
    return np.array([agents.get(int(a), NO_ID) for a in u.tolist()], dtype=np.int64)[inv]


def _single(pids: list[np.ndarray]) -> int:
    """The one process id seen in this set's host tables, or NO_ID."""
    u = np.unique(np.concatenate(pids)) if pids else np.empty(0)
    return int(u[0]) if len(u) == 1 else NO_ID


# -- JSON (rocprofv3 --output-format json; schema: rocprofiler-sdk source/docs/rocprofv3-schema.json) --


def read_rocprof_json(path: str | Path, *, progress: Progress | None = None, document: object = None) -> Trace:
    """Read rocprofv3's JSON output (``<name>_results.json``; ``document``: the parsed JSON when the
    caller has it)."""
    path = Path(path)
    document = _util.json_document(path, document, progress)
    if not isinstance(document, dict) or "rocprofiler-sdk-tool" not in document:
        raise TraceError(path, "not rocprofv3 JSON (no 'rocprofiler-sdk-tool' key)")
    procs = document["rocprofiler-sdk-tool"]
    procs = [procs] if isinstance(procs, dict) else procs
    if not isinstance(procs, list):
        raise TraceError(path, "'rocprofiler-sdk-tool' is neither a list nor an object")
    b = TraceBuilder(path, "rocprofv3-json", CLOCK)
    times = TimeCheck(path, b.notes)
    with _util.malformed(path, "rocprofv3 JSON"):
        for g, proc in enumerate(procs):
            _json_process(path, proc, np.int64(g) << np.int64(40) if len(procs) > 1 else np.int64(0), b, times,
                          progress)
        if len(procs) > 1:
            b.notes.append(f"{len(procs)} processes; correlation ids offset by process index << 40")
        return assemble(b, {"processes": len(procs)})


def _json_process(path: Path, proc: dict, offset: np.int64, b: TraceBuilder, times: TimeCheck,
                  progress: Progress | None) -> None:
    if not isinstance(proc, dict):
        raise TraceError(path, "a 'rocprofiler-sdk-tool' entry is not an object")
    pid = int(int_column([(proc.get("metadata") or {}).get("pid", NO_ID)], path, "metadata.pid")[0])
    strings = proc.get("strings") or {}
    op_names = [list(k.get("operations") or []) for k in strings.get("buffer_records") or []]
    gpu_ordinal: dict[int, int] = {}  # agent handle -> GPU ordinal (GPU agents in listed order)
    for agent in proc.get("agents") or []:
        if agent.get("type") == 2:
            gpu_ordinal[int(agent["id"]["handle"])] = int(agent.get("gpu_index", len(gpu_ordinal)))
    symbols = {}
    for s in proc.get("kernel_symbols") or []:
        name = s.get("formatted_kernel_name") or s.get("demangled_kernel_name") or s.get("kernel_name") or ""
        symbols[int(s["kernel_id"])] = str(name)
    messages = {int(m["key"]): str(m["value"]) for m in strings.get("marker_api") or []}
    buffers = proc.get("buffer_records") or {}
    if not isinstance(buffers, dict):
        raise TraceError(path, "'buffer_records' is not an object")

    def ints(recs: list, what: str, get: Callable[[dict], Any]) -> np.ndarray:
        return int_column([get(r) for r in recs], path, what)

    def operations(recs: list, key: str) -> np.ndarray:
        """Each record's operation name: its ``kind`` and ``operation`` index the strings table."""
        kind, op = ints(recs, f"{key}.kind", itemgetter("kind")), ints(recs, f"{key}.operation", itemgetter("operation"))
        out = np.empty(len(kind), dtype=object)
        for k, o in set(zip(kind.tolist(), op.tolist())):
            name = op_names[k][o] if 0 <= k < len(op_names) and 0 <= o < len(op_names[k]) else f"op{k}.{o}"
            out[(kind == k) & (op == o)] = str(name)
        return out

    def corr(recs: list, key: str) -> np.ndarray:
        return ints(recs, f"{key}.correlation_id", lambda r: r["correlation_id"]["internal"])

    def device_of(handles: np.ndarray) -> np.ndarray:
        u, inv = np.unique(handles, return_inverse=True)
        return np.array([gpu_ordinal.get(int(h), NO_ID) for h in u], np.int32)[inv]

    def timed(key: str) -> tuple[list, np.ndarray, np.ndarray]:
        """The records of ``buffer_records[key]`` whose times are valid, and their times."""
        recs = buffers.get(key) or []
        if not isinstance(recs, list):
            raise TraceError(path, f"buffer_records.{key} is not a list")
        if any(not isinstance(r, dict) for r in recs):
            raise TraceError(path, f"buffer_records.{key}: a record is not an object")
        start = int_column([r.get("start_timestamp") for r in recs], path, f"{key}.start_timestamp", invalid=INVALID_NS)
        end = int_column([r.get("end_timestamp") for r in recs], path, f"{key}.end_timestamp", invalid=INVALID_NS)
        start, end, recs = times.drop(f"buffer_records.{key} (pid {pid})", [start, end, recs], row=lambda i: f"index {i}",
                                      names=("start_timestamp", "end_timestamp"), unit="records")
        return recs, start, end

    recs, start, end = timed("hip_api")
    if recs:
        report(progress, f"{len(recs)} HIP API records")
        name = operations(recs, "hip_api")
        b.add(Calls, start_ns=start, end_ns=end, tid=ints(recs, "hip_api.thread_id", itemgetter("thread_id")), pid=pid,
              correlation_id=corr(recs, "hip_api") + offset, name=name)
    recs, start, end = timed("kernel_dispatch" if buffers.get("kernel_dispatch") else "kernel_dispatches")
    if recs:
        report(progress, f"{len(recs)} kernel dispatches")
        info = [r["dispatch_info"] for r in recs]
        u, inv = np.unique(int_column([i["kernel_id"] for i in info], path, "dispatch_info.kernel_id"),
                           return_inverse=True)
        names = np.array([symbols.get(int(k), f"kernel_{int(k)}") for k in u], dtype=object)[inv]
        if any(int(k) not in symbols for k in u):
            b.notes.append("some kernel ids have no kernel_symbols entry (named kernel_<id>)")
        streams = [r.get("stream_id") for r in recs]
        if all(isinstance(s, dict) for s in streams):
            stream = int_column([s["handle"] for s in streams], path, "stream_id")
        else:
            stream = int_column([i["queue_id"]["handle"] for i in info], path, "queue_id")
        b.add(GpuOps, kind=OpKind.KERNEL, start_ns=start, end_ns=end, name=names, stream_id=stream, pid=pid,
              device_id=device_of(int_column([i["agent_id"]["handle"] for i in info], path, "agent_id")),
              correlation_id=corr(recs, "kernel_dispatch") + offset)
    recs, start, end = timed("memory_copy")
    if recs:
        direction = operations(recs, "memory_copy")
        src = device_of(ints(recs, "src_agent_id", lambda r: r["src_agent_id"]["handle"]))
        dst = device_of(ints(recs, "dst_agent_id", lambda r: r["dst_agent_id"]["handle"]))
        b.add(GpuOps, kind=OpKind.MEMCPY, start_ns=start, end_ns=end, name=direction,
              device_id=np.where(dst != NO_ID, dst, src), pid=pid,
              stream_id=np.array([(r.get("stream_id") or {}).get("handle", NO_ID) for r in recs], dtype=np.int64),
              correlation_id=corr(recs, "memory_copy") + offset,
              bytes=ints(recs, "memory_copy.bytes", lambda r: r.get("bytes", 0)))
    recs, start, end = timed("marker_api")
    if recs:
        ops = operations(recs, "marker_api")
        names = np.array([messages.get(int(c), o) for c, o in zip(corr(recs, "marker_api").tolist(), ops.tolist())],
                         dtype=object)
        tid = ints(recs, "marker_api.thread_id", itemgetter("thread_id"))
        b.add(Ranges, **markers_from_rows(start, end, names, tid, np.full(len(recs), pid), ops, b.notes))


# -- rocpd SQLite (ROCm >= 7 default output; schema: rocprofiler-sdk-rocpd/rocpd_tables.sql) ---------

_ROCPD_TABLES = ("rocpd_string", "rocpd_info_process", "rocpd_info_thread", "rocpd_info_agent", "rocpd_event",
                 "rocpd_region", "rocpd_kernel_dispatch", "rocpd_info_kernel_symbol", "rocpd_memory_copy",
                 "rocpd_sample", "rocpd_track")
_ROCPD_REQUIRED = ("rocpd_string", "rocpd_event", "rocpd_region", "rocpd_kernel_dispatch", "rocpd_info_kernel_symbol")


_GPU_INDEX = "COALESCE(I.type_index, I.logical_index, I.absolute_index)"


def _lookup(src: dict[str, str], info: str, value: str, key: str) -> str:
    """SQL for ``value`` (alias ``I``) of the row of table ``info`` whose id is ``key`` (``X.pid``:
    in X's guid), or ``key`` itself where the file has no such table."""
    table = src.get(info)
    return f"(SELECT {value} FROM {table} I WHERE I.id = {key} AND I.guid = {key.split('.')[0]}.guid)" if table else key


def is_rocpd(tables: dict[str, str]) -> bool:
    """Whether a SQLite database's tables look like rocpd (ROCm >= 7), not RPD."""
    return any(t.startswith("rocpd_kernel_dispatch") or t.startswith("rocpd_info_process") for t in tables)


def _rocpd_sources(path: Path, tables: dict[str, str]) -> dict[str, str]:
    """Logical table -> SQL source. rocpd stores ``<table><uuid>`` tables and plain-named views;
    when the views are missing, the suffixed tables of every uuid are read with UNION ALL."""
    out = {}
    for logical in _ROCPD_TABLES:
        if logical in tables:
            out[logical] = f'"{logical}"'
            continue
        uuid_tables = sorted(
            t for t in tables if t.startswith(logical) and re.fullmatch(r"[_0-9a-fA-F]+", t[len(logical) :] or "x")
        )
        if uuid_tables:
            out[logical] = "(" + " UNION ALL ".join(f'SELECT * FROM "{t}"' for t in uuid_tables) + ")"
    missing = [t for t in _ROCPD_REQUIRED if t not in out]
    if missing:
        raise TraceError(path, f"rocpd database lacks table {missing[0]!r} (truncated, or a wrong version)")
    return out


def read_rocpd(path: str | Path, *, progress: Progress | None = None) -> Trace:
    """Read a rocpd SQLite database written by rocprofv3 (ROCm >= 7)."""
    return _util.read_sqlite(path, "rocpd", lambda path, con, db_path: _read_rocpd(path, con, db_path, progress))


def _read_rocpd(path: Path, con: sqlite3.Connection, db_path: Path, progress: Progress | None) -> Trace:
    tables = _util.sqlite_tables(con)
    src = _rocpd_sources(path, tables)
    b = TraceBuilder(path, "rocpd", CLOCK)
    times = TimeCheck(path, b.notes)
    meta: dict[str, object] = {}
    if "rocpd_metadata" in tables:
        meta["rocpd_metadata"] = {str(k): str(v) for k, v in con.execute('SELECT tag, value FROM "rocpd_metadata"')}
    thr = src.get("rocpd_info_thread")
    pid_sql = _lookup(src, "rocpd_info_process", "I.pid", "X.pid")
    tid_sql = _lookup(src, "rocpd_info_thread", "I.tid", "X.tid")
    cat_sql = _lookup(src, "rocpd_string", "I.string", "E.category_id")

    def fetch(sql: str, kinds: str) -> list[np.ndarray]:
        return _util.query_columns(path, db_path, sql, kinds, "rocpd")

    # (times are read as kind 't': NULL or anything but an integer is INVALID_NS: TimeCheck drops it)
    start_sql, end_sql = f"ifnull(X.start, {INVALID_NS})", f'ifnull(X."end", {INVALID_NS})'

    # the correlation id that ties a call to its ops: rocprofv3 keeps the internal one in
    # rocpd_event.stack_id (correlation_id holds the external id, mostly 0); writers without it
    # put it in correlation_id
    corr_col = _rocpd_correlation_column(con, src["rocpd_event"])
    meta["correlation_column"] = f"rocpd_event.{corr_col}"
    ext_sql = "E.extdata" if "extdata" in _source_columns(con, src["rocpd_event"]) else "NULL"

    report(progress, "reading rocpd regions")
    start, end, name, pid, tid, corr, cat, ext = fetch(
        f"""SELECT {start_sql}, {end_sql}, S.string, ifnull({pid_sql}, -1), ifnull({tid_sql}, -1),
                   ifnull(E.{corr_col}, -1), {cat_sql}, {ext_sql}
            FROM {src['rocpd_region']} X
            JOIN {src['rocpd_string']} S ON S.id = X.name_id AND S.guid = X.guid
            LEFT JOIN {src['rocpd_event']} E ON E.id = X.event_id AND E.guid = X.guid""",
        "ttsiiiss",
    )
    if len(start):
        cat = np.asarray(cat, dtype=object)  # tested per distinct category (no fixed-width copy)
        # rocprofv3 writes MARKER_CORE_RANGE_API / MARKER_CORE_API, rocprof-sys rocm_marker_api
        is_marker = per_string(cat, lambda c: "marker" in c.lower())
        is_api = ~is_marker & per_string(cat, lambda c: "_api" in c.lower() and "hsa" not in c.lower())
        # (only the rows read as ranges or calls are checked: other categories' times are unused)
        start, end, name, pid, tid, corr, cat, ext, is_marker, is_api = times.drop(
            "rocpd_region", [start, end, name, pid, tid, corr, cat, ext, is_marker, is_api], is_marker | is_api)
        m = np.flatnonzero(is_marker)
        a = np.flatnonzero(is_api)
        if len(m):
            b.add(Ranges, **_rocpd_markers(start[m], end[m], name[m], ext[m], tid[m], pid[m], b.notes))
            _pop_time_ranges(b, start[a], tid[a], pid[a], cat[m])
        b.add(Calls, start_ns=start[a], end_ns=end[a], tid=tid[a], pid=pid[a], correlation_id=corr[a], name=name[a])
        meta["region_categories"] = sorted(set(cat.tolist()))
    marks = _rocpd_marks(src, fetch, times, ext_sql)
    if marks is not None:
        b.add(Ranges, **marks)

    report(progress, "reading rocpd kernel dispatches")
    agent = src.get("rocpd_info_agent")
    dev_sql = _lookup(src, "rocpd_info_agent", _GPU_INDEX, "X.agent_id")
    start, end, name, dev, stream, pid, corr = fetch(
        f"""SELECT {start_sql}, {end_sql}, COALESCE(K.display_name, K.kernel_name, ''),
                   ifnull({dev_sql}, -1), ifnull(X.stream_id, -1), ifnull({pid_sql}, -1), ifnull(E.{corr_col}, -1)
            FROM {src['rocpd_kernel_dispatch']} X
            LEFT JOIN {src['rocpd_info_kernel_symbol']} K ON K.id = X.kernel_id AND K.guid = X.guid
            LEFT JOIN {src['rocpd_event']} E ON E.id = X.event_id AND E.guid = X.guid""",
        "ttsiiii",
    )
    if len(start):
        start, end, name, dev, stream, pid, corr = times.drop("rocpd_kernel_dispatch",
                                                              [start, end, name, dev, stream, pid, corr])
        b.add(GpuOps, kind=OpKind.KERNEL, start_ns=start, end_ns=end, name=name.astype(object),
              device_id=dev, stream_id=stream, pid=pid, correlation_id=corr)
    if "rocpd_memory_copy" in src:
        report(progress, "reading rocpd memory copies")
        dst_sql = _lookup(src, "rocpd_info_agent", _GPU_INDEX, "X.dst_agent_id")
        src_sql = _lookup(src, "rocpd_info_agent", _GPU_INDEX, "X.src_agent_id")
        gpu = _lookup(src, "rocpd_info_agent", "I.type", "X.dst_agent_id") if agent else "'GPU'"
        start, end, name, dst, srcd, dst_type, stream, pid, corr, size = fetch(
            f"""SELECT {start_sql}, {end_sql}, S.string, ifnull({dst_sql}, -1),
                       ifnull({src_sql}, -1), {gpu}, ifnull(X.stream_id, -1), ifnull({pid_sql}, -1),
                       ifnull(E.{corr_col}, -1), ifnull(X.size, 0)
                FROM {src['rocpd_memory_copy']} X
                JOIN {src['rocpd_string']} S ON S.id = X.name_id AND S.guid = X.guid
                LEFT JOIN {src['rocpd_event']} E ON E.id = X.event_id AND E.guid = X.guid""",
            "ttsiisiiii",
        )
        if len(start):
            start, end, name, dst, srcd, dst_type, stream, pid, corr, size = times.drop(
                "rocpd_memory_copy", [start, end, name, dst, srcd, dst_type, stream, pid, corr, size])
            b.add(GpuOps, kind=OpKind.MEMCPY, start_ns=start, end_ns=end, name=name.astype(object),
                  device_id=np.where(dst_type == "GPU", dst, srcd), stream_id=stream, pid=pid, correlation_id=corr,
                  bytes=size)
    if thr:
        for t, n in con.execute(f"SELECT tid, name FROM {thr} WHERE name IS NOT NULL"):
            if isinstance(t, int):
                b.thread_names[t] = str(n)
    return assemble(b, meta)


def _source_columns(con: sqlite3.Connection, source: str) -> set[str]:
    """Column names of a logical rocpd table: its view, or the first of its suffixed tables."""
    m = re.search(r'"([^"]+)"', source)
    return _util.sqlite_columns(con, m.group(1)) if m else set()


def _rocpd_correlation_column(con: sqlite3.Connection, event_source: str) -> str:
    """``stack_id`` where the file fills it (rocprofv3: the internal correlation id, which ties a
    call to its kernels and copies; its ``correlation_id`` is the external id, 0 unless the program
    set one), else ``correlation_id``."""
    if "stack_id" in _source_columns(con, event_source):
        row = con.execute(f"SELECT 1 FROM {event_source} WHERE stack_id IS NOT NULL AND stack_id != 0 LIMIT 1")
        if row.fetchone() is not None:
            return "stack_id"
    return "correlation_id"


def _messages(ext: np.ndarray, default: str = "") -> np.ndarray:
    """``$.message`` of each event's extdata JSON (``default`` when none), parsed once per distinct value."""
    uniq, inv = np.unique(ext.astype(str), return_inverse=True)
    out = []
    for u in uniq.tolist():
        try:
            doc = json.loads(u) if "message" in u else None
        except ValueError:
            doc = None
        msg = doc.get("message") if isinstance(doc, dict) else None
        out.append((str(msg) if msg is not None else "") or default)
    return np.array(out, dtype=object)[inv]


def _rocpd_markers(start: np.ndarray, end: np.ndarray, name: np.ndarray, ext: np.ndarray, tid: np.ndarray,
                   pid: np.ndarray, notes: list[str]) -> dict:
    """Marker regions as the columns of a Ranges part: named after the message in ``extdata`` when
    there is one (rocprofv3 names a region after the operation that paired it: roctxThreadRangeA
    is push/pop, roctxProcessRangeA start/stop on the thread that stopped it); raw push/pop rows
    are paired as in the CSV."""
    ops = name.astype(str)
    message = _messages(ext)
    label = np.where(message != "", message, name).astype(object)
    if np.isin(ops, ["roctxRangePushA", "roctxRangePush", "roctxRangePop", "roctxRangePopA"]).any():
        return markers_from_rows(start, end, label, tid, pid, ops, notes)
    style = np.full(len(start), int(RangeStyle.PUSH_POP), np.int8)
    process = ops == "roctxProcessRangeA"
    style[process] = int(RangeStyle.START_END)
    style[start == end] = int(RangeStyle.MARK)
    if process.any():
        notes.append(f"{int(process.sum())} roctx start/stop ranges: rocpd keeps the thread that stopped each, "
                     "not the one that started it")
    return dict(start_ns=start, end_ns=end, name=label, tid=np.where(process, NO_ID, tid), pid=pid, style=style,
                end_tid=tid)


def _pop_time_ranges(b: TraceBuilder, c_start: np.ndarray, c_tid: np.ndarray, c_pid: np.ndarray,
                     categories: np.ndarray) -> None:
    """roctx ranges stored at their Pop/Stop time (rocprof-sys before ROCm/rocm-systems PR #2793,
    docs/traces.md), seen as all shorter than 50 us and none holding an API call of its thread
    though those threads made calls: kept as marks at the Pop time (no stage of made-up length)."""
    m = b.parts[Ranges][-1]
    spans = np.flatnonzero(m["style"] != int(RangeStyle.MARK))
    if len(spans) < 2 or not len(c_start):
        return
    dur = m["end_ns"][spans] - m["start_ns"][spans]
    if np.median(dur) >= 50_000 or dur.max() >= 1_000_000:
        return
    thread = np.asarray(m["end_tid"] if "end_tid" in m else m["tid"], np.int64)[spans]
    key, c_key = _util.thread_key(np.asarray(m["pid"], np.int64)[spans], thread), _util.thread_key(c_pid, c_tid)
    if not np.isin(key, c_key).all():
        return  # ranges on threads without calls: nothing to judge them by
    # the last call on the range's thread that began at or before the range's end: inside it?
    row = _util.latest_at_or_before(c_key, c_start, key, m["end_ns"][spans])
    holds = (row >= 0) & (c_start[np.maximum(row, 0)] >= m["start_ns"][spans])
    if holds.any():
        return
    m["style"] = np.full(len(m["style"]), int(RangeStyle.MARK), np.int8)
    m["end_ns"] = m["start_ns"].copy()  # (the Pop call's entry: the start the writer stored)
    if "end_tid" in m:  # (a start/stop range's known thread is the one that stopped it: the mark's)
        m["tid"] = np.asarray(m["end_tid"], np.int64).copy()
    producer = "rocprof-sys" if any("rocm_marker_api" in str(c) for c in categories.tolist()) else "its writer"
    b.notes.append(
        f"the {len(spans)} roctx ranges are instants at their Pop/Stop time (median {int(np.median(dur))} ns, none "
        f"holds a call of its thread): rocpd written by {producer} before ROCm/rocm-systems PR #2793 (January 2026) "
        "stored the Pop time as a range's start; kept as marks, so kernels cannot be given to them: capture again "
        "with a newer ROCm")


def _rocpd_marks(src: dict[str, str], fetch: Callable[[str, str], list[np.ndarray]], times: TimeCheck,
                 ext_sql: str) -> dict | None:
    """roctxMark instants: rocprofv3 writes them to rocpd_sample (no name; the message is the
    event's extdata), on a track of the marker category."""
    if "rocpd_sample" not in src or "rocpd_track" not in src:
        return None
    tid_sql = _lookup(src, "rocpd_info_thread", "I.tid", "T.tid")
    pid_sql = _lookup(src, "rocpd_info_process", "I.pid", "T.pid")
    ts, tid, pid, cat, ext = fetch(
        f"""SELECT ifnull(X.timestamp, {INVALID_NS}), ifnull({tid_sql}, -1), ifnull({pid_sql}, -1),
                   {_lookup(src, "rocpd_string", "I.string", "E.category_id")}, {ext_sql}
            FROM {src['rocpd_sample']} X
            JOIN {src['rocpd_track']} T ON T.id = X.track_id AND T.guid = X.guid
            JOIN {src['rocpd_event']} E ON E.id = X.event_id AND E.guid = X.guid""",
        "tiiss",
    )
    sel = np.flatnonzero(per_string(np.asarray(cat, dtype=object), lambda c: "marker" in c.lower())) if len(ts) else ts
    if not len(sel):
        return None
    ts, tid, pid, ext = ts[sel], tid[sel], pid[sel], ext[sel]
    ts, _, tid, pid, ext = times.drop("rocpd_sample (marks)", [ts, ts, tid, pid, ext], names=("timestamp", "timestamp"))
    return dict(start_ns=ts, end_ns=ts, name=_messages(ext, "roctxMarkA"), tid=tid, pid=pid, style=int(RangeStyle.MARK))

