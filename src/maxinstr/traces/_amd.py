"""What the AMD readers (rocprofv3's CSV, JSON and rocpd in ``rocprof.py``, rocprof v1) share: the
last step of their Trace (:func:`assemble`) and roctx marker rows as ranges."""

from __future__ import annotations

import re

import numpy as np

from maxinstr.columns import isin_strings
from maxinstr.traces._util import (HIP_GRAPH_NOTE, TraceBuilder, by_start, first_rows, graph_stand_ins, mark_graph_calls,
                                   pair_push_pop, pids_from_calls)
from maxinstr.traces.model import NO_ID, Calls, GpuOps, RangeStyle, Trace

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

