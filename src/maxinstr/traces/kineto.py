"""PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzip (docs/traces.md).

Host ranges are ``user_annotation``/``cpu_op`` events, calls ``cuda_runtime``/``cuda_driver`` (HIP
names on ROCm), GPU ops ``kernel``/``gpu_memcpy``/``gpu_memset``, tied by ``args.correlation`` (else
the ``ac2g`` flow). Microsecond float timestamps become int64 ns by splitting whole and fractional
microseconds: exact below 2**43 us (~100 days); above that a note says how many ns may be off.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from maxinstr.errors import TraceError
from maxinstr.rundir.format import MAX_TIME_NS
from maxinstr.traces import _util
from maxinstr.traces._util import (Progress, TraceBuilder, by_start, call_rows, first_rows, graph_stand_ins,
                                   make_table, mark_graph_calls, name_flags, pids_from_calls, report)
from maxinstr.traces.model import INVALID_NS, NO_ID, CallKind, Calls, GpuOps, OpKind, Ranges, TimeCheck, Trace

HOST_RANGE_CATS = ("user_annotation", "cpu_op")
CALL_CATS = {"cuda_runtime": CallKind.RUNTIME, "cuda_driver": CallKind.DRIVER}
OP_CATS = {"kernel": OpKind.KERNEL, "gpu_memcpy": OpKind.MEMCPY, "gpu_memset": OpKind.MEMSET}
_MAX_US = 4.6e15  # 2**62 ns: beyond it a start plus a duration, or a difference, can overflow int64


def read_kineto(path: str | Path, *, progress: Progress | None = None, document: object = None) -> Trace:
    """Read a Kineto trace (``*.pt.trace.json`` or ``.json.gz``; ``document``: the parsed JSON
    when the caller has it)."""
    path = Path(path)
    document = _util.json_document(path, document, progress)
    if isinstance(document, dict):
        events = document.get("traceEvents")
        where = "traceEvents"  # how a note names an event: traceEvents[12], or [12] in a bare list
        if not isinstance(events, list):
            raise TraceError(path, "no 'traceEvents' list (not a Kineto / Chrome trace)")
    elif isinstance(document, list):
        events, document, where = document, {}, ""
    else:
        raise TraceError(path, "not a Kineto / Chrome trace (top level is neither an object nor a list)")
    # every event is an object: a list of anything else ([1, 2, 3]) is no trace, said in one line
    odd = None
    if not set(map(type, events)) <= {dict}:  # (a set of the types: one C-level pass)
        odd = next((i for i, e in enumerate(events) if not isinstance(e, dict)), None)
    if odd is not None:
        raise TraceError(path, f"not a Kineto / Chrome trace: {where}[{odd}] is {_json_kind(events[odd])}, "
                               "not an event object")
    with _util.malformed(path, "Kineto JSON"):
        return _read(path, document, events, where, progress)


_JSON_KINDS = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
               list: "an array"}


def _json_kind(value: object) -> str:
    return _JSON_KINDS.get(type(value), f"a {type(value).__name__}")


def us_to_ns(us: np.ndarray) -> tuple[np.ndarray, float]:
    """Microsecond floats -> int64 ns, and the worst rounding error in ns the float64 input allows."""
    us = np.asarray(us, dtype=np.float64)
    whole = np.floor(us)
    ns = whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)
    if not len(us):
        return ns, 0.0
    has_fraction = bool(np.any(us != whole))
    worst = float(np.spacing(np.abs(us).max())) * 1000 / 2 if has_fraction else 0.0
    return ns, worst


def _col(evs: list, key: str, default=None) -> list:
    return [e.get(key, default) for e in evs]


def _args_col(evs: list, key: str, default=None) -> list:
    return [a.get(key, default) if isinstance(a := e.get("args"), dict) else default for e in evs]


def _flat(values: list, dtype) -> np.ndarray | None:
    """``values`` as a 1-D array of ``dtype``, or None when they are not one number each: a
    list in a field (``"tid": [1]``) would make numpy build a 2-D column, which later
    broadcasts against the others into an n x n array."""
    try:
        arr = np.array(values, dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        return None
    return arr if arr.shape == (len(values),) else None


def _loose_ints(values: list, path: Path, what: str) -> np.ndarray:
    """Ints where the value is one (or a numeric string like '7' / 'stream 7'), else NO_ID; a
    list or object where a number belongs is an error."""
    arr = _flat(values, np.int64)
    if arr is not None:
        return arr
    for i, v in enumerate(values):
        if isinstance(v, (list, dict)):
            raise TraceError(path, f"{what}: event {i + 1} holds a JSON {'array' if isinstance(v, list) else 'object'} "
                                   "where a number belongs")
    out = np.full(len(values), NO_ID, dtype=np.int64)
    for i, v in enumerate(values):
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, (int, float)) and v == v and abs(v) < 9.2e18:
            out[i] = int(v)
        elif isinstance(v, str):
            digits = v.strip().split(" ")[-1]
            if digits.lstrip("-").isdigit() and len(digits) < 19:
                out[i] = int(digits)
    return out


_NUMBER = {int, float}  # exactly: a JSON true is no timestamp, nor is "12.5"


def _microseconds(values: list) -> np.ndarray:
    """JSON numbers as float64; NaN for anything else (missing, null, a string, a list...)."""
    if set(map(type, values)) <= _NUMBER:
        arr = _flat(values, np.float64)  # None only for an int beyond float64
        if arr is not None:
            return arr
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        if type(v) in _NUMBER:
            try:
                out[i] = float(v)
            except OverflowError:  # an int beyond float64: beyond any time too
                out[i] = np.inf if v > 0 else -np.inf
    return out


def _times(evs: list) -> tuple[np.ndarray, np.ndarray, float]:
    """(start_ns, end_ns, worst rounding error in ns) of ``X`` events. A ``ts`` or ``dur`` that
    is no number gives INVALID_NS, one beyond 2**62 ns gives +-2**62: model.TimeCheck drops and
    counts such an event. A missing ``dur`` is 0."""
    start, err1 = _ns(_microseconds(_col(evs, "ts")))
    length, err2 = _ns(_microseconds(_col(evs, "dur", 0)))
    start_ok = (start > -MAX_TIME_NS) & (start < MAX_TIME_NS)
    length_ok = (length > -MAX_TIME_NS) & (length < MAX_TIME_NS)
    both = start_ok & length_ok
    if both.all():
        return start, start + length, max(err1, err2)
    # a bad ts makes the end the same mark (the note names ts); a bad dur makes the end its mark
    end = np.where(both, start + np.where(both, length, 0), np.where(start_ok, length, start))
    return start, end, max(err1, err2)


def _ns(us: np.ndarray) -> tuple[np.ndarray, float]:
    """:func:`us_to_ns`, with INVALID_NS where ``us`` is NaN (no number) and +-2**62 where it is
    beyond that many ns."""
    nan = np.isnan(us)
    big = ~nan & ~(np.abs(us) <= _MAX_US)
    if not (nan.any() or big.any()):
        return us_to_ns(us)
    ns, err = us_to_ns(np.where(nan | big, 0.0, us))
    ns[big] = np.where(us[big] > 0, MAX_TIME_NS, -MAX_TIME_NS)
    ns[nan] = INVALID_NS
    return ns, err


def _read(path: Path, doc: dict, events: list, where: str, progress: Progress | None) -> Trace:
    report(progress, f"{len(events)} trace events")
    b = TraceBuilder(path, "kineto", "kineto-us")
    notes = b.notes
    ph = _col(events, "ph")
    cat = _col(events, "cat")
    by_cat: dict[str, list[int]] = {}  # category -> positions of its X events in traceEvents
    for i, (p, c) in enumerate(zip(ph, cat)):
        if p == "X" and c is not None:
            by_cat.setdefault(c, []).append(i)
    rounding_ns: dict[str, float] = {}  # per category: the worst a float64 timestamp can be off
    check = TimeCheck(path, notes, expected="a number")  # Kineto's clock (wall or monotonic) never reads 0

    def category(c: str) -> tuple[list, np.ndarray, np.ndarray]:
        """The ``X`` events of category ``c`` whose times are valid, and those times."""
        idx = by_cat.get(c, [])
        evs = list(map(events.__getitem__, idx))
        start, end, rounding_ns[c] = _times(evs)
        start, end, evs = check.drop(f"'{c}' events", [start, end, evs], row=lambda i: f"{where}[{idx[i]}]",
                                     names=("ts", "dur"), unit="events")
        return evs, start, end

    def ints(evs: list, c: str, key: str) -> np.ndarray:  # (key "args.x": the event's args field x)
        arg = key.removeprefix("args.")
        return _loose_ints(_args_col(evs, arg) if arg != key else _col(evs, key), path, f"{c}: {key}")

    for c in (c for c in HOST_RANGE_CATS if c in by_cat):
        evs, start, end = category(c)
        b.add(Ranges, start_ns=start, end_ns=end, name_id=b.names(_col(evs, "name", "")), tid=ints(evs, c, "tid"),
              pid=ints(evs, c, "pid"), domain_id=b.strings.intern(c))
    ranges = b.table(Ranges)

    # runtime / driver calls: those that can launch work, one per (correlation id, layer)
    sizes = []
    for c, kind in ((c, k) for c, k in CALL_CATS.items() if c in by_cat):
        evs, start, end = category(c)
        b.add(Calls, start_ns=start, end_ns=end, name_id=b.names(_col(evs, "name", "")), tid=ints(evs, c, "tid"),
              pid=ints(evs, c, "pid"), correlation_id=ints(evs, c, "args.correlation"), kind=int(kind))
        sizes.append(ints(evs, c, "args.size"))
    calls = b.table(Calls, sort=False)
    call_size = np.concatenate(sizes) if sizes else np.empty(0, np.int64)
    mark_graph_calls(b.strings, calls, lambda name: "GraphLaunch" in name)
    has_corr = calls.correlation_id != NO_ID
    keep = np.zeros(len(calls), bool)
    keep[first_rows(calls.correlation_id, calls.kind)] = True
    keep &= has_corr
    if (~has_corr).any():
        notes.append(f"{int((~has_corr).sum())} runtime calls without a correlation id dropped")
    if dup := int((has_corr & ~keep).sum()):
        notes.append(f"{dup} duplicate runtime calls (same correlation id and layer) dropped")
    order = np.flatnonzero(keep)[np.argsort(calls.start_ns[keep], kind="stable")]
    calls, call_size = calls.take(order), call_size[order]

    op_events = []
    for c, op_kind in ((c, k) for c, k in OP_CATS.items() if c in by_cat):
        evs, start, end = category(c)
        device = ints(evs, c, "args.device")
        device = np.where(device == NO_ID, ints(evs, c, "pid"), device)
        stream = ints(evs, c, "args.stream")
        stream = np.where(stream == NO_ID, ints(evs, c, "tid"), stream)
        b.add(GpuOps, start_ns=start, end_ns=end, kind=int(op_kind), name_id=b.names(_col(evs, "name", "")),
              device_id=device, stream_id=stream, correlation_id=ints(evs, c, "args.correlation"),
              bytes=0 if op_kind == OpKind.KERNEL else np.maximum(ints(evs, c, "args.bytes"), 0),
              graph_node_id=ints(evs, c, "args.graph node id"))
        op_events += evs
    ops = b.table(GpuOps, sort=False)
    if (ops.correlation_id == NO_ID).any():  # only then: where each op sits, to find its ac2g flow end
        keys = [(e.get("pid"), e.get("tid"), e.get("ts")) for e in op_events]
        ops.correlation_id = _corr_from_flows(events, ph, cat, keys, ops.correlation_id, notes)
    ops = by_start(ops)
    pids_from_calls(ops, calls)
    ops.bytes = _bytes_from_calls(ops, calls, call_size, notes)
    # graph replays: Kineto names no graph node; as for rocprofv3/RPD, the order of an op within its
    # cudaGraphLaunch stands in (kept where the trace does carry a node id)
    graph_stand_ins(ops, calls, notes, "graph node ids of {n} ops are stand-ins: their order within their graph launch")

    host_pids = set(np.unique(np.r_[ranges.pid, calls.pid]).tolist())
    for i, p in enumerate(ph):
        if p == "M" and (e := events[i]).get("name") == "thread_name" and isinstance(e.get("args"), dict):
            tid, pid = e.get("tid"), e.get("pid")
            if isinstance(tid, int) and pid in host_pids and not isinstance(tid, bool):
                b.thread_names[tid] = str(e["args"].get("name", "")).strip()
    meta: dict[str, object] = {}
    if "gpu_user_annotation" in by_cat:  # the GPU-side copy of each record_function range
        evs, start, end = category("gpu_user_annotation")
        meta["gpu_annotations"] = make_table(Ranges, [dict(
            start_ns=start, end_ns=end, name_id=b.names(_col(evs, "name", "")),
            tid=ints(evs, "gpu_user_annotation", "args.stream"), pid=ints(evs, "gpu_user_annotation", "args.device"),
            domain_id=b.strings.intern("gpu_user_annotation"))], b.strings)
    meta.update({k: doc[k] for k in ("schemaVersion", "cuda_runtime_version", "cuda_driver_version", "trace_id",
                                     "distributedInfo") if k in doc})
    if isinstance(doc.get("deviceProperties"), list):
        meta["devices"] = [d.get("name") for d in doc["deviceProperties"] if isinstance(d, dict)]
    if name_flags(b.strings, np.unique(calls.name_id), lambda name: name.startswith("hip")).any():
        meta["runtime"] = "hip"
    worst_ns = max((rounding_ns.get(c, 0.0) for c in (*HOST_RANGE_CATS, *CALL_CATS, *OP_CATS)), default=0.0)
    if worst_ns > 0.5:
        notes.append(f"timestamps beyond 2**43 us lose nanoseconds in float64: up to {worst_ns:.0f} ns off")

    base = doc.get("baseTimeNanoseconds")
    session_start = None
    if t0_candidates := [a.min() for a in (ranges.start_ns, calls.start_ns, ops.start_ns) if len(a)]:
        t0 = int(min(t0_candidates))
        if isinstance(base, int) and not isinstance(base, bool):
            session_start = base + t0
            meta["base_time_ns"] = base
        elif t0 > 946_684_800 * 10**9:  # after 2000-01-01: absolute Unix-epoch microseconds
            session_start = t0
    return b.trace(calls=calls, ops=ops, ranges=ranges, session_start_utc_ns=session_start, meta=meta)


def _corr_from_flows(events: list, ph: list, cat: list, op_keys: list, corr: np.ndarray, notes: list) -> np.ndarray:
    """Fill missing op correlation ids from ``ac2g`` flow-end events at the op's (pid, tid, ts)."""
    ends = {}
    for i, (p, c) in enumerate(zip(ph, cat)):
        if c == "ac2g" and p == "f":
            e = events[i]
            ends[(e.get("pid"), e.get("tid"), e.get("ts"))] = e.get("id")
    out = corr.copy()
    filled = 0
    for i in np.flatnonzero(corr == NO_ID).tolist():
        fid = ends.get(op_keys[i])
        if isinstance(fid, int) and not isinstance(fid, bool):
            out[i] = fid
            filled += 1
    missing = int((out == NO_ID).sum())
    if filled:
        notes.append(f"{filled} GPU ops took their correlation id from ac2g flow events")
    if missing:
        notes.append(f"{missing} GPU ops have no correlation id")
    return out


def _bytes_from_calls(ops: GpuOps, calls: Calls, call_size: np.ndarray, notes: list) -> np.ndarray:
    """Copy bytes from the launching call's ``size`` argument where the op has none (ROCm Kineto
    copies carry no ``bytes``)."""
    nbytes = ops.bytes
    if len(calls):
        row = call_rows(ops.correlation_id, calls.correlation_id)
        hit = (row >= 0) & (ops.correlation_id != NO_ID)
        size = call_size[np.maximum(row, 0)]
        fill = hit & (ops.kind != int(OpKind.KERNEL)) & (nbytes == 0) & (size > 0)
        nbytes = np.where(fill, size, nbytes)
        if fill.any():
            notes.append(f"{int(fill.sum())} copies took their byte count from the runtime call's size argument")
        unknown = (ops.correlation_id != NO_ID) & ~hit
        if unknown.any():
            notes.append(f"{int(unknown.sum())} GPU ops have a correlation id with no runtime call in the trace")
    return nbytes
