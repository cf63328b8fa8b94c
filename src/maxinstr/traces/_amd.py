"""What the AMD readers share: the raw columns a reader gathers (:class:`Parts`) and the one
assembler that turns them into a :class:`~maxinstr.traces.model.Trace` (calls deduplicated per
correlation id, ops sorted, stand-in graph node ids, roctx ranges paired or styled).

Used by the rocprofv3 readers (CSV, JSON, rocpd: ``rocprof.py``) and rocprof v1 (``rocprof_v1.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from maxinstr.columns import isin_strings

from maxinstr.traces import _util
from maxinstr.traces._util import pair_push_pop, ranges_table
from maxinstr.traces.model import NO_ID, CallKind, Calls, GpuOps, OpKind, RangeStyle, StringTable, Trace

_GRAPH_LAUNCH = re.compile(r"GraphLaunch", re.IGNORECASE)
_RAW_PUSH = {"roctxRangePushA", "roctxRangePush"}
_RAW_POP = {"roctxRangePop", "roctxRangePopA"}
_MARK_OPS = {"roctxMarkA", "roctxMark"}
_START_OPS = {"roctxRangeStartA", "roctxRangeStart"}

# --------------------------------------------------------------------------------------
# Columns shared by the three rocprofv3 flavours, then one assembler


@dataclass
class Parts:
    """Raw columns gathered by one flavour before they become a Trace."""

    calls: list[dict] = field(default_factory=list)  # start,end,tid,pid,corr,name(str array)
    kernels: list[dict] = field(default_factory=list)  # start,end,name,device,stream,pid,corr
    copies: list[dict] = field(default_factory=list)  # start,end,name,device,stream,pid,corr,bytes
    sets: list[dict] = field(default_factory=list)  # memsets (rocprof v1 FillBuffer): as copies
    markers: list[dict] = field(default_factory=list)  # start,end,name,tid,pid,style(op names opt.)
    notes: list[str] = field(default_factory=list)
    thread_names: dict[int, str] = field(default_factory=dict)


def _cat(parts: list[dict], key: str, dtype) -> np.ndarray:
    if not parts:
        return np.empty(0, dtype=dtype)
    return np.concatenate([np.asarray(p[key]).astype(dtype, copy=False) for p in parts])


def assemble(path: Path, fmt: str, parts: Parts, meta: dict, *, clock: str = "rocprofiler-sdk-ns") -> Trace:
    """The Trace of ``parts`` (``fmt`` names the format, ``clock`` the timebase of every time)."""
    strings = StringTable()

    # host calls: one row per correlation id (rocprofv3 ids are unique per process)
    c_corr = _cat(parts.calls, "corr", np.int64)
    c_names = _cat(parts.calls, "name", object)
    c_pid = _cat(parts.calls, "pid", np.int64)
    keep = _first_per_key(c_pid, c_corr)
    c_name_id = _util.intern(strings, c_names)
    calls_kind = _graph_kind(strings, c_name_id)
    calls = Calls(
        start_ns=_cat(parts.calls, "start", np.int64),
        end_ns=_cat(parts.calls, "end", np.int64),
        tid=_cat(parts.calls, "tid", np.int64),
        pid=c_pid,
        correlation_id=c_corr,
        name_id=c_name_id,
        kind=calls_kind,
    ).take(keep)
    if len(keep) < len(c_corr):
        parts.notes.append(f"{len(c_corr) - len(keep)} duplicate API rows (same correlation id) dropped")
    calls = calls.take(np.argsort(calls.start_ns, kind="stable"))

    # GPU ops
    op_parts = []
    for kind, group in ((OpKind.KERNEL, parts.kernels), (OpKind.MEMCPY, parts.copies), (OpKind.MEMSET, parts.sets)):
        if not group:
            continue
        names = _cat(group, "name", object)
        n = len(names)
        op_parts.append(
            dict(
                start=_cat(group, "start", np.int64),
                end=_cat(group, "end", np.int64),
                kind=np.full(n, int(kind), np.int8),
                name_id=_util.intern(strings, names),
                device=_cat(group, "device", np.int32),
                stream=_cat(group, "stream", np.int64),
                pid=_cat(group, "pid", np.int64),
                corr=_cat(group, "corr", np.int64),
                bytes=_cat(group, "bytes", np.int64) if kind != OpKind.KERNEL else np.zeros(n, np.int64),
            )
        )
    if op_parts:
        cols = {k: np.concatenate([p[k] for p in op_parts]) for k in op_parts[0]}
        ops = GpuOps(
            start_ns=cols["start"],
            end_ns=cols["end"],
            kind=cols["kind"],
            name_id=cols["name_id"],
            device_id=cols["device"],
            stream_id=cols["stream"],
            pid=cols["pid"],
            correlation_id=cols["corr"],
            graph_node_id=np.full(len(cols["start"]), NO_ID, np.int64),
            bytes=cols["bytes"],
        )
        ops = ops.take(np.argsort(ops.start_ns, kind="stable"))
        ops.pid = _fill_pid_from_calls(ops.pid, ops.correlation_id, calls)
        graph_corr = calls.correlation_id[calls.kind == int(CallKind.GRAPH)]
        ops.graph_node_id = _util.graph_node_ordinals(ops.correlation_id, ops.start_ns, graph_corr)
        if (ops.graph_node_id != NO_ID).any():
            parts.notes.append(
                "graph node ids are stand-ins: the order of each op within its hipGraphLaunch"
            )
    else:
        ops = GpuOps()

    # ranges
    range_tables = []
    for m in parts.markers:
        names = np.asarray(m["name"], dtype=object)
        if not len(names):
            continue
        range_tables.append(
            ranges_table(
                np.asarray(m["start"], np.int64),
                np.asarray(m["end"], np.int64),
                _util.intern(strings, names),
                np.asarray(m["tid"], np.int64),
                np.asarray(m["pid"], np.int64),
                np.asarray(m["style"], np.int8),
                end_tid=np.asarray(m.get("end_tid", m["tid"]), np.int64),
            )
        )
    ranges = _util.concat_ranges(range_tables)

    trace = Trace(
        source=str(path),
        format=fmt,
        strings=strings.to_array(),
        ranges=ranges,
        calls=calls,
        ops=ops,
        thread_names=parts.thread_names,
        clock=clock,
        notes=parts.notes,
        meta=meta,
    )
    trace.validate()
    return trace


def _graph_kind(strings: StringTable, name_id: np.ndarray) -> np.ndarray:
    """CallKind per call: GRAPH for hipGraphLaunch-like names, RUNTIME otherwise."""
    if not len(name_id):
        return np.empty(0, dtype=np.int8)
    table = strings.to_array()
    flag = np.array([bool(_GRAPH_LAUNCH.search(str(n))) for n in table], dtype=bool)
    return np.where(flag[name_id], int(CallKind.GRAPH), int(CallKind.RUNTIME)).astype(np.int8)


def _first_per_key(pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """Indices of the first row of each (pid, correlation id), in original order."""
    if not len(corr):
        return np.empty(0, np.int64)
    order = np.lexsort((np.arange(len(corr)), corr, pid))
    first = np.r_[True, (pid[order][1:] != pid[order][:-1]) | (corr[order][1:] != corr[order][:-1])]
    return np.sort(order[first])


def _fill_pid_from_calls(op_pid: np.ndarray, op_corr: np.ndarray, calls: Calls) -> np.ndarray:
    """Give ops without a pid the pid of the call with their correlation id (or the only pid)."""
    missing = op_pid == NO_ID
    if not missing.any() or not len(calls):
        return op_pid
    out = op_pid.copy()
    pids = np.unique(calls.pid)
    if len(pids) == 1:
        out[missing] = pids[0]
        return out
    order = np.argsort(calls.correlation_id, kind="stable")
    sorted_corr = calls.correlation_id[order]
    pos = np.searchsorted(sorted_corr, op_corr[missing])
    pos_c = np.minimum(pos, len(sorted_corr) - 1)
    hit = sorted_corr[pos_c] == op_corr[missing]
    filled = np.where(hit, calls.pid[order][pos_c], NO_ID)
    out[missing] = filled
    return out


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


def markers_from_rows(
    start: np.ndarray,
    end: np.ndarray,
    name: np.ndarray,
    tid: np.ndarray,
    pid: np.ndarray,
    op_names: np.ndarray | None,
    notes: list[str],
) -> dict:
    """Marker rows -> range columns. Raw push/pop rows are paired; paired rows are kept."""
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
        return dict(
            start=np.r_[start[push_i], start[rest]],
            end=np.r_[end[pop_i], end[rest]],
            name=np.r_[name[push_i], name[rest]].astype(object),
            tid=np.r_[tid[push_i], tid[rest]],
            pid=np.r_[pid[push_i], pid[rest]],
            style=np.r_[np.full(len(push_i), int(RangeStyle.PUSH_POP), np.int8), r_style],
        )
    style = _marker_styles(start, end, tid, op_names)
    no_thread = (style == int(RangeStyle.START_END)) & (tid == 0)
    if no_thread.any():
        notes.append(f"{int(no_thread.sum())} roctx start/stop ranges carry no thread id (rocprofv3 writes 0)")
    tid = np.where(no_thread, NO_ID, tid)
    return dict(start=start, end=end, name=name.astype(object), tid=tid, pid=pid, style=style)

