"""The timeline (:mod:`maxinstr.analyze.timeline`: one clock, lanes, each op's stage) as Chrome
trace-event JSON, which ui.perfetto.dev opens; timestamps in us from ``metadata.maxinstr.origin_ns``.

Tracks: ``host pid N`` (stage instances on their threads, nested as they ran; marks as instants;
launch calls and other trace ranges beside each thread), ``stage GPU spans`` (per stage, each
instance's projected GPU span and its GPU events' span), ``GPU d`` (a track per stream with its ops,
category = kernel family, ``args.stage`` = the stage that launched it; the sampler's metrics as
counters). Events are written in chunks straight from the numpy columns (``%`` templates over
``tolist()`` slices): a million-kernel trace is never a list of dicts."""

from __future__ import annotations

import gzip
import io
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from maxinstr._text import clip_text
from maxinstr.analyze.instances import range_names
from maxinstr.analyze.kernels import FAMILY_NAMES
from maxinstr.analyze.timeline import (CALLS_MAX_OPS, MAX_LANES, OP_KIND_NAMES, Timeline, group_codes, hw_throttled,
                                       lanes, launch_calls, nest_lanes, timeline)
from maxinstr.columns import factorize
from maxinstr.errors import MaxinstrError

if TYPE_CHECKING:
    from maxinstr.analyze.report import Analysis, Attribution, Trace
    from maxinstr.analyze.schema import Report

CHUNK = 65_536
"""Rows formatted per write."""

PID_BASE = 1 << 23
"""Synthetic process ids start above Linux's largest pid (2**22), so they never collide with a real host process."""

SPANS_PID = PID_BASE
GPU_PID = PID_BASE + 16
"""``GPU_PID + device`` is the process of one GPU."""

GZIP_LEVEL = 3
"""Fast enough to stay near the plain write; a trace's JSON compresses ~20x anyway."""

# (column, track label, unit key, scale): the sampler metrics shown as counter tracks
COUNTERS: tuple[tuple[str, str, str, float], ...] = (
    ("gpu_util_pct", "util", "%", 1.0), ("sm_active_pct", "SM active", "%", 1.0),
    ("sm_occupancy_pct", "SM occupancy", "%", 1.0), ("tensor_active_pct", "tensor active", "%", 1.0),
    ("dram_bw_util_pct", "DRAM bandwidth", "%", 1.0), ("mem_util_pct", "memory controller", "%", 1.0),
    ("power_w", "power", "W", 1.0), ("mem_used_bytes", "memory used", "GiB", 1.0 / 2**30),
    ("sm_clock_mhz", "SM clock", "MHz", 1.0), ("mem_clock_mhz", "memory clock", "MHz", 1.0),
    ("temp_c", "temperature", "C", 1.0))


def _esc(values: Iterable[str]) -> np.ndarray:
    """JSON string literals (quoted, escaped), ready for a ``%s`` in a template; a text longer
    than a view shows (``_text.DISPLAY_CHARS``) is cut, the cut said: a trace viewer shows names,
    and one 10 MB name repeated on every slice made the trace as many times 10 MB."""
    return np.array([json.dumps(clip_text(str(v))) for v in values], dtype=object)


def _tmpl(text: str) -> str:
    return text.replace("%", "%%")


def _rows(template: str, *columns: np.ndarray) -> Iterator[str]:
    """``template % row`` for every row of the columns, joined a chunk at a time."""
    n = len(columns[0]) if columns else 0
    for lo in range(0, n, CHUNK):
        cols = [c[lo:lo + CHUNK].tolist() for c in columns]
        yield "".join([template % row for row in zip(*cols)])


@dataclass
class _Tracks:
    """Process/thread naming metadata, collected while events are planned."""

    meta: list[str] = field(default_factory=list)
    seen_pids: set = field(default_factory=set)
    op_tids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """The track (thread id) of every op, once the ops are written."""

    def process(self, pid: int, name: str, sort: int) -> None:
        if pid in self.seen_pids:
            return
        self.seen_pids.add(pid)
        self.meta += ['{"ph":"M","name":"process_name","pid":%d,"tid":0,"args":{"name":%s}},\n'
                      % (pid, json.dumps(clip_text(name))),
                      '{"ph":"M","name":"process_sort_index","pid":%d,"tid":0,"args":{"sort_index":%d}},\n' % (pid, sort)]

    def thread(self, pid: int, tid: int, name: str, sort: int | None = None) -> None:
        self.meta.append('{"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":%s}},\n'
                         % (pid, tid, json.dumps(clip_text(name))))
        if sort is not None:
            self.meta.append('{"ph":"M","name":"thread_sort_index","pid":%d,"tid":%d,"args":{"sort_index":%d}},\n'
                             % (pid, tid, sort))


def _us(ns: np.ndarray) -> np.ndarray:
    """Nanoseconds (relative) to microseconds, as floats for a ``%.3f``."""
    return np.asarray(ns, np.float64) / 1000.0


def _stage_events(tl: Timeline, tracks: _Tracks, counts: dict[str, int]) -> Iterator[str]:
    inst = tl.inst
    if len(inst) == 0:
        return
    ukeys, kcode = factorize(inst.key)  # no fixed-width copy of the names
    key_json = _esc(ukeys)
    uleaf, lcode = factorize(inst.name)
    leaf_json = _esc(uleaf)[lcode]
    startup = inst.warmup | (inst.inside_startup if len(inst.inside_startup) == len(inst) else False)
    cat = np.where(startup, '"stage,warmup"', np.where(inst.cold, '"stage,cold_start"', '"stage"')).astype(object)
    busy = np.where(inst.proj_start_ns >= 0, inst.busy_ns, -1)
    kernels = np.where(inst.range_index >= 0, inst.kernel_count, -1)
    args = "{\"stage\":%s,\"step\":%d,\"record_id\":%d,\"gpu_event_ns\":%d,\"gpu_busy_ns\":%d,\"kernels\":%d}"
    arg_cols = (key_json[kcode], inst.step, inst.record_id, inst.gpu_event_ns, busy, kernels)

    # host threads: slices nest as the stage stack did; rows that would cross another
    # (start/end ranges in a trace) get their own lane track
    pid = tl.inst_pid
    tid = np.asarray(inst.tid, np.int64)
    group = group_codes(pid, tid)[1]
    lane = nest_lanes(group, inst.host_start_ns, inst.host_end_ns, inst.level, inst.parent)
    # host thread ids are real tids; overflow lanes get synthetic tids above pid_max
    out_tid = np.where(lane > 0, PID_BASE + tid * MAX_LANES + lane, tid)
    for p in np.unique(pid).tolist():
        tracks.process(int(p), tl.pid_names.get(int(p), f"host pid {p}"), 0)
    for p, t, ln in group_codes(pid, tid, lane)[0].tolist():
        tracks.thread(int(p), int(PID_BASE + t * MAX_LANES + ln if ln else t),
                      f"{tl.thread_names.get(int(t)) or 'thread'} {t}" + (f" (overlapping ranges {ln})" if ln else ""))
    mark = inst.is_mark
    # parents before children that start at the same nanosecond (importers nest in file order)
    sl = np.lexsort((inst.host_start_ns - inst.host_end_ns, inst.host_start_ns))
    sl = sl[~mark[sl]]
    ts = _us(inst.host_start_ns - tl.origin_ns)
    dur = _us(inst.host_end_ns - inst.host_start_ns)
    yield from _rows('{"ph":"X","name":%s,"cat":%s,"pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"args":' + args + '},\n',
                     leaf_json[sl], cat[sl], pid[sl], out_tid[sl], ts[sl], dur[sl], *(c[sl] for c in arg_cols))
    counts["stage_ranges"] = len(sl)
    mk = np.flatnonzero(mark)
    yield from _rows('{"ph":"i","s":"t","name":%s,"cat":"mark","pid":%d,"tid":%d,"ts":%.3f,"args":' + args + '},\n',
                     leaf_json[mk], pid[mk], out_tid[mk], ts[mk], *(c[mk] for c in arg_cols))
    counts["marks"] = len(mk)

    tracks.process(SPANS_PID, "stage GPU spans", 1)
    next_tid = 1
    for label, s, e, counter in (("projected GPU span", tl.proj_start_ns, tl.proj_end_ns, "gpu_projected_spans"),
                                 ("GPU events", tl.event_start_ns, tl.event_end_ns, "gpu_event_spans")):
        rows = np.flatnonzero((s >= 0) & (e >= s) & ~mark)
        counts[counter] = len(rows)
        if not len(rows):
            continue
        ln = lanes(kcode[rows], s[rows], e[rows])
        pairs, track = group_codes(kcode[rows], ln)
        for i, (k, lane_k) in enumerate(pairs.tolist()):
            tracks.thread(SPANS_PID, next_tid + i, f"{ukeys[k]} · {label}" + (f" ({lane_k + 1})" if lane_k else ""),
                          sort=next_tid + i)
        tids = next_tid + track
        next_tid += len(pairs)
        cat_json = json.dumps("stage," + label.replace(" ", "_"))
        span = e[rows] - s[rows]
        frac = np.where(busy[rows] >= 0, busy[rows] / np.maximum(span, 1), -1.0)
        yield from _rows('{"ph":"X","name":%s,"cat":' + cat_json + ',"pid":' + str(SPANS_PID) + ',"tid":%d,"ts":%.3f,'
                         '"dur":%.3f,"args":{"stage":%s,"host_start_us":%.3f,"gpu_busy_ns":%d,"busy_frac":%.4f,'
                         '"kernels":%d}},\n',
                         key_json[kcode[rows]], tids, _us(s[rows] - tl.origin_ns), _us(span), key_json[kcode[rows]],
                         ts[rows], busy[rows], frac, kernels[rows])


def _op_events(tl: Timeline, trace: Trace, op_family: np.ndarray, tracks: _Tracks, counts: dict[str, int]
               ) -> Iterator[str]:
    ops = trace.ops
    n = len(ops)
    counts["ops"] = n
    kind = np.asarray(ops.kind)
    for code, kind_name in enumerate(OP_KIND_NAMES):  # "kernels", "memcpys", "memsets"
        counts[kind_name + "s"] = int((kind == code).sum())
    if n == 0:
        return
    dev = np.asarray(ops.device_id, np.int64)
    pairs, sid = group_codes(dev, np.asarray(ops.stream_id, np.int64))
    tr, track = group_codes(sid, lanes(sid, tl.op_start_ns, tl.op_end_ns))
    pid = GPU_PID + np.maximum(dev, 0)
    for d in np.unique(dev).tolist():
        tracks.process(int(GPU_PID + max(d, 0)), _gpu_label(tl, d), 2 + max(d, 0))
    for i, (s_i, ln) in enumerate(tr.tolist()):
        d, s = pairs[s_i]
        tracks.thread(int(GPU_PID + max(d, 0)), i + 1, f"stream {s}" + (f" (overlap {ln})" if ln else ""), sort=i + 1)
    strings = np.asarray(trace.strings, dtype=object)
    name_json = _esc(strings.tolist()) if len(strings) else np.empty(0, object)
    nid = np.asarray(ops.name_id, np.int64)
    default = _esc(OP_KIND_NAMES)
    names = np.where(nid >= 0, name_json[np.maximum(nid, 0)] if len(name_json) else "",
                     default[np.clip(kind, 0, len(OP_KIND_NAMES) - 1)])
    fam = (_esc(FAMILY_NAMES)[op_family] if len(op_family) == n else np.full(n, '"other"', dtype=object))
    keys = np.empty(0, object)
    if len(tl.inst):
        ukeys, kcode = factorize(tl.inst.key)
        keys = _esc(ukeys)[kcode]
    stage = np.where(tl.op_stage >= 0, keys[np.maximum(tl.op_stage, 0)] if len(keys) else "null", "null")
    tracks.op_tids = track + 1
    yield from _rows('{"ph":"X","name":%s,"cat":%s,"pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,'
                     '"args":{"stage":%s,"correlation_id":%d,"bytes":%d}},\n',
                     names, fam, pid, track + 1, _us(tl.op_start_ns - tl.origin_ns), _us(tl.op_end_ns - tl.op_start_ns),
                     stage, np.asarray(ops.correlation_id, np.int64), np.asarray(ops.bytes, np.int64))


def _call_events(tl: Timeline, trace: Trace, op_tids: np.ndarray, tracks: _Tracks, counts: dict[str, int]
                 ) -> Iterator[str]:
    """Host API calls that launched GPU work, on a track beside their thread, and a flow arrow
    from each launch to the op it launched (:func:`~maxinstr.analyze.timeline.launch_calls`)."""
    calls, ops = trace.calls, trace.ops
    counts["api_calls"] = counts["launch_flows"] = 0
    if len(calls) == 0:
        return
    if len(ops) > CALLS_MAX_OPS:
        counts["api_calls_left_out"] = len(calls)
        return
    cs = np.asarray(calls.start_ns, np.int64) - tl.shift_ns
    ce = np.maximum(np.asarray(calls.end_ns, np.int64) - tl.shift_ns, cs)
    pid = np.asarray(calls.pid, np.int64)
    call_tid = _beside(tl, tracks, pid, np.asarray(calls.tid, np.int64), PID_BASE * 2, "launch calls",
                       lambda group: lanes(group, cs, ce))
    strings = np.asarray(trace.strings, dtype=object)
    nid = np.asarray(calls.name_id, np.int64)
    uid, inv = np.unique(nid, return_inverse=True)
    names = _esc([str(strings[i]) if 0 <= i < len(strings) else "launch" for i in uid.tolist()])[inv.reshape(-1)]
    corr = np.asarray(calls.correlation_id, np.int64)
    yield from _rows('{"ph":"X","name":%s,"cat":"api","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,'
                     '"args":{"correlation_id":%d}},\n',
                     names, pid, call_tid, _us(cs - tl.origin_ns), _us(ce - cs), corr)
    counts["api_calls"] = len(calls)
    # flows: each op from the call that launched it
    hit, c = launch_calls(trace)
    ids = hit + 1
    yield from _rows('{"ph":"s","id":%d,"cat":"launch","name":"launch","pid":%d,"tid":%d,"ts":%.3f},\n',
                     ids, pid[c], call_tid[c], _us(cs[c] - tl.origin_ns))
    yield from _rows('{"ph":"f","bp":"e","id":%d,"cat":"launch","name":"launch","pid":%d,"tid":%d,"ts":%.3f},\n',
                     ids, GPU_PID + np.maximum(np.asarray(ops.device_id, np.int64)[hit], 0), op_tids[hit],
                     _us(tl.op_start_ns[hit] - tl.origin_ns))
    counts["launch_flows"] = len(hit)


def _range_events(tl: Timeline, trace: Trace, attribution: Attribution | None, tracks: _Tracks, counts: dict[str, int]
                  ) -> Iterator[str]:
    """The trace's other host ranges (framework ops, other NVTX domains), beside their thread, nested as they ran."""
    r = trace.ranges
    used = np.zeros(len(r), bool)
    ri = np.asarray(tl.inst.range_index, np.int64)
    used[ri[ri >= 0]] = True
    rows = np.flatnonzero(~used)
    counts["trace_ranges"] = 0
    if len(rows) == 0:
        return
    if len(rows) > CALLS_MAX_OPS:
        counts["trace_ranges_left_out"] = len(rows)
        return
    s = np.asarray(r.start_ns, np.int64)[rows] - tl.shift_ns
    e = np.maximum(np.asarray(r.end_ns, np.int64)[rows] - tl.shift_ns, s)
    pid, tid = np.asarray(r.pid, np.int64)[rows], np.asarray(r.tid, np.int64)[rows]
    if attribution is not None and len(attribution.range_parent) == len(r):
        pos = np.full(len(r), -1, np.int64)
        pos[rows] = np.arange(len(rows))
        par = np.asarray(attribution.range_parent, np.int64)[rows]
        parent = np.where(par >= 0, pos[np.maximum(par, 0)], -1)
        depth = np.asarray(attribution.range_depth, np.int64)[rows]
    else:
        parent, depth = np.full(len(rows), -1, np.int64), np.zeros(len(rows), np.int64)
    out_tid = _beside(tl, tracks, pid, tid, PID_BASE * 3, "trace ranges",
                      lambda group: nest_lanes(group, s, e, depth, parent))
    strings = np.asarray(trace.strings, dtype=object)
    dom = np.asarray(r.domain_id, np.int64)[rows]
    udom, dinv = np.unique(dom, return_inverse=True)
    cats = _esc(["range," + (str(strings[d]) if 0 <= d < len(strings) else "") for d in udom.tolist()])[dinv.reshape(-1)]
    names = range_names(trace)[rows]
    un, ninv = factorize(names)
    order = np.lexsort((s - e, s))
    yield from _rows('{"ph":"X","name":%s,"cat":%s,"pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f},\n',
                     _esc(un)[ninv.reshape(-1)][order], cats[order], pid[order], out_tid[order],
                     _us(s - tl.origin_ns)[order], _us(e - s)[order])
    counts["trace_ranges"] = len(rows)


def _beside(tl: Timeline, tracks: _Tracks, pid: np.ndarray, tid: np.ndarray, base: int, label: str,
            lanes_of: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Tracks beside each host thread (synthetic tids from ``base``: never a real tid, never a
    stage lane), one per lane of ``lanes_of(thread group)``; each row's tid."""
    pairs, group = group_codes(pid, tid)
    tr, track = group_codes(group, lanes_of(group))
    for i, (g, ln) in enumerate(tr.tolist()):
        p, t = pairs[g]
        tracks.process(int(p), tl.pid_names.get(int(p), f"host pid {p}"), 0)
        tracks.thread(int(p), int(base + i), f"{tl.thread_names.get(int(t)) or 'thread'} {t} · {label}"
                      + (f" ({ln + 1})" if ln else ""))
    return base + track


def _gpu_label(tl: Timeline, index: int) -> str:
    name = tl.gpu_names.get(int(index))
    return f"GPU {index}" + (f" ({name})" if name else "")


def _counter_events(tl: Timeline, tracks: _Tracks, counts: dict[str, int]) -> Iterator[str]:
    total = 0
    for part, smp in tl.samples:
        devs, have = smp.devices, set(smp.rows.dtype.names or ())
        for d in np.unique(np.asarray(smp.device)).tolist():
            vis = int((devs[d] if d < len(devs) else {}).get("visible_index", d))
            pid = GPU_PID + vis
            tracks.process(pid, _gpu_label(tl, vis), 2 + vis)
            rows = smp.for_device(d).rows
            ts = _us(rows["t_ns"].astype(np.int64) - tl.origin_ns)
            label = f"GPU {vis}" + (f" {part}" if len(tl.samples) > 1 else "")
            for col, what, unit, scale in (c for c in COUNTERS if c[0] in have):
                v = rows[col].astype(np.float64) * scale
                ok = np.isfinite(v)
                if not ok.any():
                    continue
                total += int(ok.sum())
                tmpl = ('{"ph":"C","name":' + _tmpl(json.dumps(f"{label} {what}")) + ',"pid":%d,"ts":%.3f,"args":{'
                        + _tmpl(json.dumps(unit)) + ':%.6g}},\n')
                yield from _rows(tmpl, np.full(int(ok.sum()), pid), ts[ok], v[ok])
            # hardware throttling (power cap, thermal, ...) as a 0/1 track, written where it changes
            thr = hw_throttled(rows["throttle"]) if "throttle" in have else None
            if thr is not None and len(thr):
                at = np.flatnonzero(np.r_[True, thr[1:] != thr[:-1]])
                total += len(at)
                tmpl = '{"ph":"C","name":' + _tmpl(json.dumps(f"{label} hw throttled")) + ',"pid":%d,"ts":%.3f,"args":{"on":%d}},\n'
                yield from _rows(tmpl, np.full(len(at), pid), ts[at], thr[at])
    counts["counter_samples"] = total


def events(report: Report, analysis: Analysis) -> Iterator[str]:
    """The trace-event JSON document, a chunk of text at a time."""
    tl = timeline(analysis)
    tracks = _Tracks()
    counts: dict[str, int] = {}
    yield '{"displayTimeUnit":"ns","traceEvents":[\n'
    yield from _stage_events(tl, tracks, counts)
    if (trace := analysis.trace) is not None:
        yield from _op_events(tl, trace, analysis.op_family, tracks, counts)
        yield from _call_events(tl, trace, tracks.op_tids, tracks, counts)
        yield from _range_events(tl, trace, analysis.attribution, tracks, counts)
    yield from _counter_events(tl, tracks, counts)
    counts["metadata"] = len(tracks.meta)
    # metadata last (tracks are named as events are planned); the array's last element
    # loses its trailing comma
    yield ("".join(tracks.meta)[:-2] if tracks.meta else "") + "\n],\n"
    src = report.get("sources") or {}
    meta = {"schema": "maxinstr-perfetto", "version": 1, "origin_ns": int(tl.origin_ns),
            "ts_unit": "us from origin_ns on the axis clock", "clock": tl.clock.as_dict(), "counts": counts,
            "run": src.get("run"), "trace": src.get("trace"), "trace_format": src.get("trace_format"),
            "generated": report.get("generated")}
    yield '"metadata":' + json.dumps({"maxinstr": meta}, default=_jsonable, allow_nan=False) + "}\n"


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        f = float(obj)
        return f if math.isfinite(f) else None
    return str(obj)


def _need_analysis(analysis: Analysis | None) -> Analysis:
    if analysis is None:
        raise MaxinstrError("--format perfetto needs the run directory or trace itself, not a saved JSON report "
                            "(the report keeps statistics, not the timeline)")
    return analysis


def write(out: str | Path | IO[str], report: Report, analysis: Analysis | None = None) -> dict[str, Any]:
    """Stream the trace JSON to a path (gzip when it ends in ``.gz``; Perfetto opens both) or a
    text file object. Returns the metadata's ``maxinstr`` block (counts, clock)."""
    chunks = events(report, _need_analysis(analysis))
    if isinstance(out, (str, Path)):
        path = Path(out)
        with gzip.open(path, "wt", compresslevel=GZIP_LEVEL) if path.suffix == ".gz" else open(path, "w") as fh:
            last = _drain(chunks, fh)
    else:
        last = _drain(chunks, out)
    return json.loads(last[len('"metadata":'):-2])["maxinstr"]


def _drain(chunks: Iterator[str], fh: IO[str]) -> str:
    last = ""
    for chunk in chunks:
        fh.write(chunk)
        last = chunk
    return last


def render(report: Report, analysis: Analysis | None = None, *, width: int = 120, color: bool = False) -> str:
    """The trace JSON as one string (``maxinstr report --format perfetto``). For big traces
    prefer :func:`write`, which never holds the whole document."""
    buf = io.StringIO()
    _drain(events(report, _need_analysis(analysis)), buf)
    return buf.getvalue()
