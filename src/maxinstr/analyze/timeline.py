"""The timeline the Perfetto and HTML views draw: a run's records, a trace's ops and calls, and
the sampler's rows on one axis, as columns. The axis is the run's host clock (CLOCK_MONOTONIC)
when a run is given, else the trace's: trace times move by the median of ``trace range start -
record host start`` over the joined records (:class:`Clock`). Overlapping rows of one track are
spread over lanes, so that slices of one lane nest as a viewer needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from maxinstr.analyze.kernels import range_to_instance
from maxinstr.columns import correlation_join
from maxinstr.rundir import format as fmt
from maxinstr.rundir.samples import HW_THROTTLE_MASK
from maxinstr.traces.model import CallKind, OpKind, Trace

if TYPE_CHECKING:
    from maxinstr.analyze.report import Analysis

CALLS_MAX_OPS = 250_000
"""Launch calls (and their flow arrows) are on the timeline up to this many ops: beyond, they
would double a view for little."""
MAX_LANES = 16
"""Lanes an overlapping track is spread over (Chrome JSON slices of one thread must nest)."""
OP_KIND_NAMES: tuple[str, ...] = tuple(kind.name.lower() for kind in sorted(OpKind))
"""An op's kind by its ``kind`` code (``traces.model.OpKind``)."""


@dataclass
class Clock:
    """How trace times map onto the view's axis: ``axis_ns = trace_ns - offset_ns``."""

    axis: str
    """``"host"`` (the run's CLOCK_MONOTONIC) or the trace's clock name."""
    offset_ns: int = 0
    method: str = "none"
    """``matched_pairs`` | ``same_clock`` | ``start_aligned`` | ``trace_only`` | ``run_only``."""
    pairs: int = 0
    spread_ns: float | None = None
    """Median absolute deviation of the pairs' differences from the offset."""
    join: str | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "offset_ns": int(self.offset_ns), "method": self.method, "pairs": int(self.pairs),
                "spread_ns": self.spread_ns, "join": self.join, "note": self.note}


def align(analysis: Analysis) -> Clock:
    """The offset that puts the trace on the run's host clock (see the module docstring)."""
    run, trace, inst = analysis.run, analysis.trace, analysis.instances
    if trace is None:
        return Clock(axis="host" if run is not None else "none", method="run_only")
    if run is None:
        return Clock(axis=str(trace.clock), method="trace_only", note=f"Times on the trace's clock ({trace.clock})")
    join = getattr(getattr(analysis.attribution, "join_method", None), "name", None)
    join = join.lower() if join else None
    joined = np.flatnonzero(inst.range_index >= 0) if len(inst) else np.empty(0, np.int64)
    if len(joined):
        starts = np.asarray(trace.ranges.start_ns, np.int64)[inst.range_index[joined]]
        diff = starts - inst.host_start_ns[joined]
        offset = int(np.median(diff))
        spread = float(np.median(np.abs(diff - offset)))
        return Clock(axis="host", offset_ns=offset, method="matched_pairs", pairs=len(joined), spread_ns=spread,
                     join=join, note=f"Trace times moved by the median of (trace range start - record host start) over {len(joined)} "
                                     f"records joined by {join or 'id'}")
    if "MONOTONIC" in str(trace.clock).upper() and "RAW" not in str(trace.clock).upper():
        return Clock(axis="host", method="same_clock", note=f"The trace clock {trace.clock} is the host clock: no offset")
    # nothing ties the clocks together: line the first trace range (or op) up with the first record
    t_first = _first(np.asarray(trace.ranges.start_ns, np.int64), np.asarray(trace.ops.start_ns, np.int64))
    h_first = _first(inst.host_start_ns)
    offset = int(t_first - h_first) if t_first is not None and h_first is not None else 0
    return Clock(axis="host", offset_ns=offset, method="start_aligned",
                 note="No record joined a trace range: the trace is shifted so that it starts with the run "
                      "(approximate; GPU work is not exactly under its stages)")


def _first(*arrays: np.ndarray) -> int | None:
    lows = [int(a.min()) for a in arrays if len(a)]
    return min(lows) if lows else None


def lanes(group: np.ndarray, start: np.ndarray, end: np.ndarray, max_lanes: int = MAX_LANES) -> np.ndarray:
    """A lane per row such that no two rows of one group and lane overlap: greedy in passes, a
    row that starts before the end of an earlier one of its group moves to the next lane."""
    n = len(start)
    lane = np.zeros(n, np.int64)
    todo = np.arange(n)
    for k in range(max_lanes):
        if len(todo) == 0:
            break
        lane[todo] = k
        if k == max_lanes - 1:
            break
        g, s, e = group[todo], start[todo], end[todo]
        order = np.lexsort((s, g))
        gs, ss, es = g[order], s[order], e[order]
        bounds = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1], True])
        bumped = np.zeros(len(order), bool)
        for lo, hi in zip(bounds[:-1], bounds[1:]):  # per group (streams, stage keys: few)
            prev_end = np.maximum.accumulate(es[lo:hi])
            bumped[lo + 1:hi] = ss[lo + 1:hi] < prev_end[:-1]
        todo = todo[order[bumped]]
    return lane


def nest_lanes(group: np.ndarray, start: np.ndarray, end: np.ndarray, depth: np.ndarray,
               parent: np.ndarray) -> np.ndarray:
    """Lane 0 for rows that nest properly on their group's track (rows of one depth do not
    overlap; children lie inside their ``parent``), 1+ for a row that crosses another of its
    depth (start/end ranges, skewed clocks), and its descendants with it."""
    n = len(start)
    if n == 0:
        return np.zeros(0, np.int64)
    first = lanes(group_codes(group, depth)[1], start, end, max_lanes=2)
    bad = first > 0
    parent = np.asarray(parent, np.int64)
    has_parent = parent >= 0
    for _ in range(64):  # descendants of a displaced row follow it
        newly = has_parent & ~bad & bad[np.maximum(parent, 0)]
        if not newly.any():
            break
        bad |= newly
    lane = np.zeros(n, np.int64)
    if bad.any():
        lane[bad] = 1 + lanes(np.asarray(group)[bad], start[bad], end[bad], max_lanes=MAX_LANES - 1)
    return lane


def group_codes(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows as a 2-D array, code per row) for integer columns, in sorted order;
    1-D uniques combined arithmetically (``np.unique(axis=0)`` sorts slow void rows)."""
    n = len(columns[0])
    code = np.zeros(n, np.int64)
    uniques = []
    for col in columns:
        u, c = np.unique(np.asarray(col, np.int64), return_inverse=True)
        uniques.append(u)
        code = code * len(u) + c.reshape(-1)
    ucode, inv = np.unique(code, return_inverse=True)
    rows = np.empty((len(ucode), len(columns)), np.int64)
    rest = ucode.copy()
    for j in range(len(columns) - 1, -1, -1):
        rows[:, j] = uniques[j][rest % len(uniques[j])]
        rest //= len(uniques[j])
    return rows, inv.reshape(-1)


@dataclass
class Timeline:
    """Everything on the :class:`Clock`'s axis (ns), as columns (-1: none). ``inst``: the
    analysis's StageInstances; ``event_*``: per instance, the GPU event span the run recorded;
    ``op_stage``: per op, the instance row of the stage that launched it; ``samples``: ``(part
    name, Samples)`` with a row; ``shift_ns``: what was subtracted from the trace's times."""

    clock: Clock
    origin_ns: int
    inst: Any
    inst_pid: np.ndarray
    proj_start_ns: np.ndarray
    proj_end_ns: np.ndarray
    event_start_ns: np.ndarray
    event_end_ns: np.ndarray
    op_start_ns: np.ndarray
    op_end_ns: np.ndarray
    op_stage: np.ndarray
    samples: list[tuple[str, Any]]
    thread_names: dict[int, str]
    pid_names: dict[int, str]
    gpu_names: dict[int, str] = field(default_factory=dict)
    """Visible GPU index -> name (run meta.json, else the sampler's device list)."""
    shift_ns: int = 0

    @property
    def end_ns(self) -> int:
        highs = [int(a.max()) for a in (self.inst.host_end_ns, self.op_end_ns) if len(a)]
        highs += [int(s.t_ns.max()) for _, s in self.samples]
        return max(highs) if highs else self.origin_ns


def timeline(analysis: Analysis) -> Timeline:
    """Put the analysis's records, trace ops and samples on one axis."""
    clock = align(analysis)
    inst, trace, run = analysis.instances, analysis.trace, analysis.run
    n = len(inst)
    shift = clock.offset_ns if (run is not None and trace is not None) else 0

    def moved(col: np.ndarray) -> np.ndarray:
        col = np.asarray(col, np.int64)
        return np.where(col >= 0, col - shift, -1)

    ev_s = ev_e = np.full(n, -1, np.int64)
    pid_names: dict[int, str] = {}
    if run is not None:
        st = run.stages
        parts = getattr(run, "parts", []) or []
        part_pid = np.array([int(p.get("pid") or 0) for p in parts] or [0], np.int64)
        inst_pid = part_pid[np.clip(inst.part, 0, len(part_pid) - 1)] if n else np.zeros(0, np.int64)
        for p in parts:
            rank = p.get("rank")
            pid_names[int(p.get("pid") or 0)] = f"host pid {p.get('pid')}" + (f" (rank {rank})" if rank not in (None, -1) else "")
        if len(st) == n and n and np.array_equal(np.asarray(st["id"], np.int64), inst.record_id):
            timed = (np.asarray(st["flags"]) & fmt.GPU_TIMED) != 0
            ev_s = np.where(timed, np.asarray(st["gpu_start_ns"], np.int64), -1)
            ev_e = np.where(timed, np.asarray(st["gpu_end_ns"], np.int64), -1)
    else:
        inst_pid = np.asarray(inst.part, np.int64)
    for pid in np.unique(inst_pid).tolist():
        pid_names.setdefault(int(pid), f"host pid {pid}")

    if trace is not None and len(trace.ops):
        ops = trace.ops
        op_s = np.asarray(ops.start_ns, np.int64) - shift
        op_e = np.maximum(np.asarray(ops.end_ns, np.int64) - shift, op_s)
        att = analysis.attribution
        if att is not None and len(att.op_range) == len(ops) and n:
            r2i = range_to_instance(inst, att, len(trace.ranges))
            op_range = np.asarray(att.op_range, np.int64)
            op_stage = np.where(op_range >= 0, r2i[np.maximum(op_range, 0)] if len(r2i) else -1, -1)
        else:
            op_stage = np.full(len(ops), -1, np.int64)
    else:
        op_s = op_e = op_stage = np.empty(0, np.int64)

    run_samples = (getattr(run, "samples", None) or {}) if run is not None else {}
    samples = [(name, smp) for name, smp in sorted(run_samples.items()) if hasattr(smp, "t_ns") and len(smp)]

    gpu_names: dict[int, str] = {}
    for d in (d for _, smp in samples for d in smp.devices if d.get("name")):
        gpu_names.setdefault(int(d.get("visible_index", 0)), str(d["name"]))
    for g in ((run.meta or {}).get("gpus") or []) if run is not None else []:
        if isinstance(g, dict) and g.get("name") is not None:
            gpu_names[int(g.get("index", 0))] = str(g["name"])
    proj_s = moved(inst.proj_start_ns)
    lows = [int(a[a >= 0].min()) for a in (inst.host_start_ns, proj_s, ev_s, op_s) if len(a) and (a >= 0).any()]
    lows += [int(s.t_ns.min()) for _, s in samples]
    if trace is not None and len(trace.calls) and len(trace.ops) <= CALLS_MAX_OPS:
        lows.append(int(np.asarray(trace.calls.start_ns, np.int64).min()) - shift)
    origin = min(lows) if lows else 0
    tnames = {int(k): str(v) for k, v in (getattr(trace, "thread_names", None) or {}).items()} if trace is not None else {}
    return Timeline(clock=clock, origin_ns=origin, inst=inst, inst_pid=inst_pid, proj_start_ns=proj_s,
                    proj_end_ns=moved(inst.proj_end_ns), event_start_ns=ev_s, event_end_ns=ev_e, op_start_ns=op_s, op_end_ns=op_e,
                    op_stage=op_stage, samples=samples, thread_names=tnames, pid_names=pid_names, gpu_names=gpu_names,
                    shift_ns=shift)


def launch_calls(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(op rows, call rows): each op a host call of the trace launched, and that call (the one
    with the op's process and correlation id, the runtime layer's first), as Kineto draws its
    flow arrows."""
    calls, ops = trace.calls, trace.ops
    call = correlation_join(ops.pid, ops.correlation_id, calls.pid, calls.correlation_id,
                            right_rank=(np.asarray(calls.kind) != CallKind.RUNTIME).astype(np.int64))
    hit = np.flatnonzero(call >= 0)
    return hit, call[hit]


def hw_throttled(throttle: np.ndarray) -> np.ndarray:
    """Per sampler row, 1 where a hardware limit (power cap, thermal) held the clocks down, else 0."""
    return ((throttle & HW_THROTTLE_MASK) != 0).astype(np.int64)
