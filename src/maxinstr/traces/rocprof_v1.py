"""rocprof v1, the roctracer-based ``rocprof`` of ROCm 3.x to 6.x: the two files its
post-processing script (``tblextr.py``) writes from one set of tables, ``results.db`` (tables
``rocTX``, ``HIP``/``HSA``, ``OPS``, ``COPY``, ``KERN``/``A``, read by column name across tblextr's
layouts) and ``results.json`` (a Chrome trace of the same rows, exact times in
``args.BeginNs``/``EndNs``, no ``Index``: ops are tied to calls through tblextr's flow events).
Times are ns of the HSA system clock. docs/traces.md says what each layout holds."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np

from maxinstr.columns import correlation_join, factorize
from maxinstr.errors import TraceError
from maxinstr.traces import _util
from maxinstr.traces.rocprof import assemble
from maxinstr.traces._util import Progress, TraceBuilder, int_column, report
from maxinstr.traces.model import INVALID_NS, NO_ID, Calls, GpuOps, OpKind, RangeStyle, Ranges, TimeCheck, Trace

CLOCK = "hsa-system-ns"
FORMAT_DB = "rocprof-v1-db"
FORMAT_JSON = "rocprof-v1-json"

_API_TABLES = ("HIP", "HSA")
_OP_TABLES = ("rocTX", "HIP", "HSA", "OPS", "COPY")
_KERN_TABLES = ("KERN", "A")
# GPU-side barrier packets of synchronize calls, not kernels: roctracer named them "Unknown
# command type" (ROCm 4.0 files), tblextr '"<barrier packet>"' (ROCm 6.2 on)
_BARRIERS = frozenset({"Unknown command type", "<barrier packet>"})
_HSA_OFFSET = np.int64(1) << np.int64(40)  # HSA Index counts apart from HIP Index: keep them apart
_KERN_OFFSET = np.int64(1) << np.int64(41)  # synthetic calls of KERN dispatches
_SIZE = re.compile(r"\bsizeBytes\((\d+)\)|\bsize\((\d+)\)")
_DISPATCH = "kernel dispatch"  # the stand-in call of a KERN row
_SECTION_LABELS = ("Markers and Ranges", "CPU HIP API", "CPU HSA API", "COPY")


def is_rocprof_v1(con: sqlite3.Connection, tables: dict[str, str]) -> bool:
    """Whether a SQLite database is a rocprof v1 ``results.db`` (its tables by name and columns)."""
    for t in _OP_TABLES:
        if t in tables and "BeginNs" in _util.sqlite_columns(con, t):
            return True
    return any(t in tables and "KernelName" in _util.sqlite_columns(con, t) for t in _KERN_TABLES)


def is_rocprof_v1_json(events: list) -> bool:
    """Whether a Chrome-trace event list is rocprof v1's: its sections are named by tblextr's
    ``process_name`` labels, or its events carry ``args.BeginNs``."""
    labels = _section_labels(events)
    if any(v in _SECTION_LABELS or re.fullmatch(r"GPU(?: Barriers)?\d+", v) for v in labels.values()):
        return any(isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("args"), dict)
                   and "BeginNs" in e["args"] for e in events[:2000])
    return False


def _strip_quotes(name: str) -> str:
    # tblextr stores rocTX and KERN names in double quotes ('"Atomic Loop"'); the JSON has them bare
    return name[1:-1] if len(name) >= 2 and name[0] == name[-1] == '"' else name


def _kernel_name(name: str) -> str:
    # KERN names are the code object's symbol, the kernel descriptor's: its " [clone .kd]" (".kd"
    # with --basenames) is not part of the kernel's name
    name = _strip_quotes(name)
    for suffix in (" [clone .kd]", ".kd"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _map_names(values: np.ndarray, fn) -> np.ndarray:
    """``fn`` applied once per distinct name (names repeat; rows share the result)."""
    uniques, codes = factorize(values)
    return np.array([fn(u) for u in uniques.tolist()], dtype=object)[codes]


# -- results.db ----------------------------------------------------------------------------------


def read_rocprof_v1_db(path: str | Path, *, progress: Progress | None = None) -> Trace:
    """Read rocprof v1's ``results.db``."""
    return _util.read_sqlite(path, "rocprof v1", lambda path, con, db_path: _read_db(path, con, db_path, progress))


_DEFAULTS = {"t": str(INVALID_NS), "i": "-1", "s": "NULL"}


class _Table:
    """Named columns of one table, read by name (a missing optional column gives its default)."""

    def __init__(self, path: Path, db_path: Path, table: str, present: set[str], spec: list[tuple[str, str]]) -> None:
        exprs = [(f'ifnull("{c}", {_DEFAULTS[k]})' if k != "s" else f'"{c}"') if c in present else _DEFAULTS[k]
                 for c, k in spec]
        sql = f'SELECT {", ".join(exprs)} FROM "{table}" ORDER BY rowid'
        kinds = "".join(k for _, k in spec)
        self.cols = dict(zip((c for c, _ in spec), _util.query_columns(path, db_path, sql, kinds,
                                                                       f"rocprof v1 table {table}")))
        self.present = present

    def __getitem__(self, col: str) -> np.ndarray:
        return self.cols[col]

    def __len__(self) -> int:
        return len(next(iter(self.cols.values())))


def _read_db(path: Path, con: sqlite3.Connection, db_path: Path, progress: Progress | None) -> Trace:
    tables = _util.sqlite_tables(con)
    present = {t: _util.sqlite_columns(con, t) for t in (*_OP_TABLES, *_KERN_TABLES) if t in tables}
    if not present:
        raise TraceError(path, "no rocprof v1 table (rocTX, HIP, OPS, COPY, KERN) in this database")
    for t, cols in present.items():
        need = ("KernelName",) if t in _KERN_TABLES else ("BeginNs", "EndNs")
        missing = [c for c in need if c not in cols]
        if missing:
            raise TraceError(path, f"rocprof v1 table {t} lacks column {missing[0]!r} (truncated, or a wrong version)")
    b = TraceBuilder(path, FORMAT_DB, CLOCK)
    times = TimeCheck(path, b.notes)  # the HSA system clock never reads 0
    # ROCm <= 4.2 files keep the process in OPS/COPY "proc-id" and section numbers in rocTX/HIP "pid"
    old = any("proc-id" in present.get(t, ()) for t in ("OPS", "COPY"))
    meta: dict[str, object] = {"tables": {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
                                          for t in present},
                               "layout": _layout(present, old)}

    def table(name: str, spec: list[tuple[str, str]]) -> _Table | None:
        if name not in present:
            return None
        report(progress, f"reading {name}")
        t = _Table(path, db_path, name, present[name], spec)
        t.cols = dict(zip(t.cols, times.drop(name, [t["BeginNs"], t["EndNs"], *t.cols.values()],
                                             names=("BeginNs", "EndNs"))[2:]))
        return t

    # API calls: the correlation id is Index (HSA's counted apart: offset)
    call_args: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for name in _API_TABLES:
        api = table(name, [("BeginNs", "t"), ("EndNs", "t"), ("pid", "i"), ("tid", "i"), ("Name", "s"),
                           ("args", "s"), ("Index", "i")])
        if api is None or not len(api):
            continue
        corr = api["Index"] + (_HSA_OFFSET if name == "HSA" else 0)
        b.add(Calls, start_ns=api["BeginNs"], end_ns=api["EndNs"], tid=api["tid"], pid=api["pid"], correlation_id=corr,
              name=api["Name"])
        call_args[name] = (api["pid"], corr, api["args"])

    # GPU ops
    op_pids: list[np.ndarray] = []
    pid_col = "proc-id" if old else "pid"
    ops = table("OPS", [("BeginNs", "t"), ("EndNs", "t"), ("dev-id", "i"), ("queue-id", "i"), ("stream-id", "i"),
                        ("Name", "s"), (pid_col, "i"), ("tid", "i"), ("Index", "i"), ("roctx-range", "s")])
    if ops is not None and len(ops):
        names = _map_names(ops["Name"], _strip_quotes)
        barrier = np.isin(names, list(_BARRIERS))
        if barrier.any():
            b.notes.append(f"OPS: {int(barrier.sum())} barrier packets (the GPU side of synchronize calls, "
                               f"named {', '.join(sorted(set(names[barrier].tolist())))}) are not kernels: left out")
        k = ~barrier
        b.add(GpuOps, kind=OpKind.KERNEL, start_ns=ops["BeginNs"][k], end_ns=ops["EndNs"][k], name=names[k],
              device_id=ops["dev-id"][k], stream_id=_stream(ops, old)[k], pid=ops[pid_col][k],
              correlation_id=ops["Index"][k])
        op_pids.append(ops[pid_col][k])
        if "roctx-range" in ops.present:
            meta["roctx_range"] = "OPS has roctx-range (tblextr's own range of each op; not used: see docs)"
    copies = None
    if "COPY" in present:
        hip_flavour = "dev-id" in present["COPY"]  # ops_table_descr: from the HIP activity trace
        cpid = pid_col if hip_flavour else "pid"
        copies = table("COPY", [("BeginNs", "t"), ("EndNs", "t"), ("dev-id", "i"), ("queue-id", "i"),
                                ("stream-id", "i"), ("Name", "s"), (cpid, "i"), ("tid", "i"), ("Index", "i")])
        if copies is not None and len(copies):
            corr = copies["Index"] + (0 if hip_flavour else _HSA_OFFSET)
            names = _map_names(copies["Name"], _strip_quotes)
            launch = call_args.get("HIP" if hip_flavour else "HSA")
            if launch is not None and old:  # (pids are section numbers there: join on Index alone)
                launch = (np.zeros(len(launch[0]), np.int64), launch[1], launch[2])
            c_pid = np.zeros(len(corr), np.int64) if old else copies[cpid]
            nbytes = _copy_bytes(c_pid, corr, launch, b.notes)
            _add_copies(b, names, start_ns=copies["BeginNs"], end_ns=copies["EndNs"], device_id=copies["dev-id"],
                        stream_id=_stream(copies, old) if hip_flavour else copies["tid"], pid=copies[cpid],
                        correlation_id=corr, bytes=nbytes)
            op_pids.append(copies[cpid])

    # KERN dispatches: kernels when the HIP activity trace gave none
    kern_name = next((t for t in _KERN_TABLES if t in present and "BeginNs" in present[t]), None)
    if kern_name is not None:
        if any(part["kind"] == OpKind.KERNEL for part in b.parts[GpuOps]):
            n = con.execute(f'SELECT count(*) FROM "{kern_name}"').fetchone()[0]
            if n:
                b.notes.append(f"{kern_name}: {n} kernel dispatches not added (the same kernels as OPS)")
        else:
            kern = table(kern_name, [("BeginNs", "t"), ("EndNs", "t"), ("DispatchNs", "t"), ("KernelName", "s"),
                                     ("gpu-id", "i"), ("queue-id", "i"), ("pid", "i"), ("tid", "i"), ("Index", "i")])
            if kern is not None and len(kern):
                _kern_ops(b, times, kern_name, kern["DispatchNs"] if "DispatchNs" in kern.present else None,
                          kern["tid"], start_ns=kern["BeginNs"], end_ns=kern["EndNs"],
                          name=_map_names(kern["KernelName"], _kernel_name), device_id=kern["gpu-id"],
                          stream_id=kern["queue-id"], pid=kern["pid"], correlation_id=kern["Index"] + _KERN_OFFSET)
                op_pids.append(kern["pid"])

    # rocTX ranges
    tx = table("rocTX", [("BeginNs", "t"), ("EndNs", "t"), ("pid", "i"), ("tid", "i"), ("Name", "s"),
                         ("__lane", "i")])
    if tx is not None and len(tx):
        lane = tx["__lane"] if "__lane" in tx.present else None
        b.add(Ranges, **_ranges(tx["BeginNs"], tx["EndNs"], _map_names(tx["Name"], _strip_quotes), tx["tid"],
                                tx["pid"], lane, b.notes))
        if any(c["name"][0] == _DISPATCH for c in b.parts[Calls] if len(c["name"])):
            b.notes.append("kernels tied to rocTX ranges by their dispatching thread and DispatchNs "
                               "(KERN has no API calls)")

    if old:
        _old_layout_pids(b, op_pids)
    return assemble(b, meta)


def _layout(present: dict[str, set[str]], old: bool) -> str:
    if old:
        return "ROCm <= 4.2 columns (proc-id)"
    if "roctx-range" in present.get("OPS", ()):
        return "ROCm >= 5.2 columns (roctx-range)"
    if any("__section" in c for c in present.values()):
        return "ROCm >= 4.3 columns (real pid/tid, stream-id)"
    return "kernel dispatches only (KERN)" if set(present) <= set(_KERN_TABLES) else "unknown"


def _stream(t: _Table, old: bool) -> np.ndarray:
    if "stream-id" in t.present:
        return t["stream-id"]
    return t["tid"] if old else t["queue-id"]  # (ROCm <= 4.2: OPS tid is the stream index)


def _copy_bytes(op_pid: np.ndarray, op_corr: np.ndarray, calls: tuple | None, notes: list[str]) -> np.ndarray:
    """Bytes of each copy from its call's arguments (``sizeBytes(N)``, HSA ``size(N)``): the COPY
    table has none. A call whose copy the runtime split into several ops (a hipMemset done as two
    fills) has its bytes shared out among them, so the sum stays the call's."""
    nbytes = np.zeros(len(op_corr), np.int64)
    if calls is None or not len(op_corr):
        if len(op_corr):
            notes.append("COPY: no API table to read byte counts from (bytes = 0)")
        return nbytes
    c_pid, c_corr, c_args = calls
    row = correlation_join(op_pid, op_corr, c_pid, c_corr)
    hit = np.flatnonzero(row >= 0)
    size = _map_names(c_args[row[hit]], _size_of).astype(np.int64)
    # share a call's bytes among its ops (remainder to the first)
    _, first, inv, counts = np.unique(row[hit], return_index=True, return_inverse=True, return_counts=True)
    per = counts[inv]
    share = size // per
    share[first] += size[first] - share[first] * per[first]
    nbytes[hit] = share
    unknown = int(len(op_corr) - (nbytes > 0).sum())
    if unknown:
        notes.append(f"COPY: {unknown} of {len(op_corr)} copies without a byte count in their call's arguments "
                     "(bytes = 0)")
    return nbytes


def _add_copies(b: TraceBuilder, names: np.ndarray, **columns: np.ndarray) -> None:
    """Copies as MEMCPY ops, fills and memsets as MEMSET ops."""
    is_set = np.array([bool(re.search(r"Fill|Memset", n)) for n in names.tolist()], bool)
    for sel, kind in ((~is_set, OpKind.MEMCPY), (is_set, OpKind.MEMSET)):
        if sel.any():
            b.add(GpuOps, kind=kind, name=names[sel], **{k: v[sel] for k, v in columns.items()})


def _size_of(args: str) -> int:
    m = _SIZE.search(args)
    return int(m.group(1) or m.group(2)) if m else 0


def _kern_ops(b: TraceBuilder, times: TimeCheck, table: str, dispatch: np.ndarray | None, tid: np.ndarray,
              **op: np.ndarray) -> None:
    """KERN rows as kernels, each with a stand-in launch call at its dispatch time on its dispatching
    thread: there are no API calls, so a kernel belongs to the range open on that thread when it
    was dispatched (the thread-and-time rule)."""
    b.add(GpuOps, kind=OpKind.KERNEL, **op)
    if dispatch is None:
        b.notes.append(f"{table}: no DispatchNs column: kernels are placed in ranges by GPU start time")
        return
    ok = times.keep(f"{table}.DispatchNs" if table else "DispatchNs", dispatch, dispatch,
                    names=("DispatchNs", "DispatchNs"))
    sel = slice(None) if ok is None else ok
    b.add(Calls, start_ns=dispatch[sel], end_ns=dispatch[sel], tid=tid[sel], pid=op["pid"][sel],
          correlation_id=op["correlation_id"][sel], name=np.full(len(dispatch[sel]), _DISPATCH, dtype=object))


def _ranges(start: np.ndarray, end: np.ndarray, name: np.ndarray, tid: np.ndarray, pid: np.ndarray,
            lane: np.ndarray | None, notes: list[str]) -> dict:
    """rocTX rows as range columns: a mark spans one ns (tblextr writes tms..tms+1); a start/stop
    range has lane 0 (ROCm >= 4.3: its tid is the stopping thread) or tid 0 (before): the thread
    that started it is not in the file."""
    style = np.full(len(start), int(RangeStyle.PUSH_POP), np.int8)
    split = (lane == 0) & (tid != 0) if lane is not None else np.zeros(len(start), bool)
    no_thread = tid == 0
    style[split | no_thread] = int(RangeStyle.START_END)
    style[(end - start) <= 1] = int(RangeStyle.MARK)
    starts = style == int(RangeStyle.START_END)
    if starts.any():
        notes.append(f"rocTX: {int(starts.sum())} roctxRangeStart/Stop ranges: the file does not say which thread "
                     "started them")
    end_tid = np.where(starts & (tid != 0), tid, np.where(starts, NO_ID, tid))
    end = np.where(style == int(RangeStyle.MARK), start, end)  # a mark is an instant: tblextr's + 1 is not its length
    return dict(start_ns=start, end_ns=end, name=name, tid=np.where(starts, NO_ID, tid), pid=pid, style=style,
                end_tid=end_tid)


def _old_layout_pids(b: TraceBuilder, op_pids: list[np.ndarray]) -> None:
    """ROCm <= 4.2: rocTX and HIP rows carry a section number where the process belongs; the ops
    name it (``proc-id``). One process: every row gets it. Several: the calls cannot say whose they
    are, so ops join calls by Index alone (pids cleared), and a note says so."""
    pids = np.unique(np.concatenate(op_pids)) if op_pids else np.empty(0, np.int64)
    if len(pids) == 1:
        for part in (*b.parts[Calls], *b.parts[Ranges]):
            part["pid"] = pids[0]
        return
    if len(pids) > 1:
        for part in (*b.parts[Calls], *b.parts[Ranges], *b.parts[GpuOps]):
            part["pid"] = NO_ID
        b.notes.append(f"{len(pids)} processes in a rocprof file from before ROCm 4.3: its API and rocTX rows "
                           "carry no process id, so ops are joined to calls by Index alone")


# -- results.json --------------------------------------------------------------------------------


def _section_labels(events: list) -> dict[int, str]:
    """pid -> the ``process_name`` label of each section (tblextr's, rpd2tracing's)."""
    out: dict[int, str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name":
            args = e.get("args")
            try:
                pid = int(e.get("pid"))  # type: ignore[arg-type]
            except (TypeError, ValueError):
                continue
            if isinstance(args, dict) and isinstance(args.get("name"), str):
                out[pid] = args["name"]
    return out


def _ints(values: list) -> np.ndarray:
    return int_column(values, None, "", invalid=NO_ID)  # (never raises: what is no integer is NO_ID)


def read_rocprof_v1_json(path: str | Path, *, progress: Progress | None = None, document: object = None) -> Trace:
    """Read rocprof v1's ``results.json`` (``document``: the parsed JSON when the caller has it)."""
    path = Path(path)
    events = _util.chrome_events(path, document, "rocprof v1 JSON", progress)
    with _util.malformed(path, "rocprof v1 JSON"):
        return _read_json(path, events, progress)


def _read_json(path: Path, events: list, progress: Progress | None) -> Trace:
    labels = _section_labels(events)
    b = TraceBuilder(path, FORMAT_JSON, CLOCK)
    times = TimeCheck(path, b.notes)
    report(progress, f"{len(events)} events")
    by_section: dict[str, list[dict]] = {}
    flows_s: list[dict] = []
    flows_t: list[dict] = []
    for e in events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "X" and isinstance(e.get("args"), dict):
            try:
                label = labels.get(int(e.get("pid")), "")  # type: ignore[arg-type]
            except (TypeError, ValueError):
                label = ""
            label = "GPU Barriers" if label.startswith("GPU Barriers") else "GPU" if label.startswith("GPU") else label
            by_section.setdefault(label, []).append(e)
        elif ph == "s":
            flows_s.append(e)
        elif ph in ("t", "f"):
            flows_t.append(e)

    def raw(evs: list[dict], key: str, default=None) -> list:
        return [ev["args"].get(key, default) for ev in evs]

    def arg(evs: list[dict], key: str, default=None) -> np.ndarray:
        return _ints(raw(evs, key, default))

    def timed(label: str) -> tuple[list[dict], np.ndarray, np.ndarray]:
        evs = by_section.get(label, [])
        start = int_column(raw(evs, "BeginNs"), path, f"{label}.BeginNs", invalid=INVALID_NS)
        end = int_column(raw(evs, "EndNs"), path, f"{label}.EndNs", invalid=INVALID_NS)
        start, end, evs = times.drop(f"'{label}' events", [start, end, evs], row=lambda i: f"event {i}",
                                     names=("BeginNs", "EndNs"), unit="events")
        return evs, start, end

    def lane_keys(evs: list[dict]) -> tuple[np.ndarray, ...]:
        # the event's own section (pid), lane (tid) and ts (us), as the flow events name them
        return tuple(_ints([ev.get(key) for ev in evs]) for key in ("pid", "tid", "ts"))

    # calls: one row per event, in file order; the correlation id is the row number
    call_key: list[np.ndarray] = []
    n_calls = 0
    for label in ("CPU HIP API", "CPU HSA API"):
        evs, start, end = timed(label)
        if not evs:
            continue
        sec, lane, ts = lane_keys(evs)
        corr = np.arange(n_calls, n_calls + len(evs), dtype=np.int64)
        n_calls += len(evs)
        b.add(Calls, start_ns=start, end_ns=end, tid=arg(evs, "tid"), pid=arg(evs, "pid"), correlation_id=corr,
              name=np.array([ev.get("name", "") for ev in evs], dtype=object))
        # of calls that began in the same microsecond, the later-beginning, then the shorter one is
        # taken for a flow there (hipMemcpyToSymbol holds the hipMemcpy that launched the copy)
        call_key.append(np.stack([sec, lane, ts, corr, start, -end]))
    calls_k = np.concatenate(call_key, axis=1) if call_key else np.empty((6, 0), np.int64)
    calls_k = calls_k[:, np.lexsort((calls_k[5], calls_k[4]))]

    # flows: t (the op's section, lane, ts) -> s (the call's section, thread, a time inside the call)
    s_id = {str(f.get("id")): f for f in flows_s}
    pairs = [(s_id[str(t.get("id"))], t) for t in flows_t if str(t.get("id")) in s_id]
    (f_sec, f_thr, f_ts), t_key = (np.stack([_ints([p[j].get(k) for p in pairs]) for k in ("pid", "tid", "ts")])
                                   for j in (0, 1))
    # the call of each flow: on its thread, the one that began last at or before the flow's start
    flow_call = _util.latest_at_or_before(_util.thread_key(calls_k[0], calls_k[1]), calls_k[2],
                                          _util.thread_key(f_sec, f_thr), f_ts)
    flow_corr = np.where(flow_call >= 0, calls_k[3][np.maximum(flow_call, 0)], NO_ID)

    op_pids: list[np.ndarray] = []
    old = False
    for label in ("GPU", "COPY"):
        evs, start, end = timed(label)
        if not evs:
            continue
        names = np.array([_strip_quotes(str(ev.get("name", ""))) for ev in evs], dtype=object)
        old = old or any("proc-id" in ev["args"] for ev in evs[:1])
        pid = arg(evs, "proc-id" if old else "pid")
        sec, lane, ts = lane_keys(evs)
        corr = _util.match_rows(np.stack([sec, lane, ts]), t_key, flow_corr, NO_ID)
        device, stream = arg(evs, "dev-id", NO_ID), arg(evs, "stream-id")
        if not any(ev["args"].get("stream-id") is not None for ev in evs[:1]):
            stream = lane if label == "GPU" or old else arg(evs, "queue-id", NO_ID)
        if label == "GPU":
            barrier = np.isin(names, list(_BARRIERS))
            if barrier.any():
                b.notes.append(f"{int(barrier.sum())} barrier packets (the GPU side of synchronize calls) are not "
                                   "kernels: left out")
            dispatch = [ev["args"].get("DispatchNs") for ev in evs]
            if any(d is not None for d in dispatch):  # KERN rows (--stats): the dispatching thread and time
                k_pid = arg(evs, "pid")
                _kern_ops(b, times, "", int_column(dispatch, path, "DispatchNs", invalid=INVALID_NS), arg(evs, "tid"),
                          start_ns=start, end_ns=end, name=_map_names(names, _kernel_name),
                          device_id=arg(evs, "gpu-id"), stream_id=arg(evs, "queue-id"), pid=k_pid,
                          correlation_id=np.arange(len(evs), dtype=np.int64) + _KERN_OFFSET)
                b.notes.append("kernels tied to ranges by their dispatching thread and DispatchNs (no API calls)")
                op_pids.append(k_pid)
                continue
            k = ~barrier
            b.add(GpuOps, kind=OpKind.KERNEL, start_ns=start[k], end_ns=end[k], name=names[k], device_id=device[k],
                  stream_id=stream[k], pid=pid[k], correlation_id=corr[k])
            op_pids.append(pid[k])
        else:
            _add_copies(b, names, start_ns=start, end_ns=end, device_id=device, stream_id=stream, pid=pid,
                        correlation_id=corr)
            op_pids.append(pid)
            b.notes.append("rocprof v1 JSON: copies carry no byte count (results.db's HIP arguments do)")
    unlinked = sum(int((part["correlation_id"] == NO_ID).sum()) for part in b.parts[GpuOps])
    if unlinked:
        b.notes.append(f"{unlinked} GPU ops have no flow event to their call (tblextr writes one per call)")

    evs, start, end = timed("Markers and Ranges")
    if evs:
        b.add(Ranges, **_ranges(start, end, np.array([str(ev.get("name", "")) for ev in evs], dtype=object),
                                arg(evs, "tid"), arg(evs, "pid"), _ints([ev.get("tid") for ev in evs]), b.notes))
    if old:
        _old_layout_pids(b, op_pids)
    return assemble(b, {"sections": sorted(set(labels.values())), "flows": len(pairs)})

