"""rocprof v1 (results.db and results.json) against the real files, counted from their own tables.

Fixtures (tests/data/PROVENANCE.md): rocprof_v1_kokkos/ is ONE run written both ways (gfx906,
ROCm ~4.0, `rocprof --hip-trace --roctx-trace`); rocprof_v1_mi250x_stats/ is a `rocprof --stats`
run on an MI250X (KERN table only, and the stub results.json rocprof leaves without a trace).
"""

from __future__ import annotations

import collections
import re
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from maxinstr.attribute import Rule, attribute
from maxinstr.attribute.attribute import join_ops_to_calls
from maxinstr.errors import TraceError
from maxinstr.traces import open_trace
from maxinstr.traces.model import NO_ID, OpKind, RangeStyle
from maxinstr.traces.rocprof_v1 import read_rocprof_v1_db, read_rocprof_v1_json

DATA = Path(__file__).resolve().parents[1] / "data" / "rocprof"
KOKKOS = DATA / "rocprof_v1_kokkos"
MI250X = DATA / "rocprof_v1_mi250x_stats"


def sql(db: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def db():
    return read_rocprof_v1_db(KOKKOS / "results.db")


@pytest.fixture(scope="module")
def js():
    return read_rocprof_v1_json(KOKKOS / "results.json")


def names(t, ids) -> list[str]:
    return [t.name(int(i)) for i in ids]


def test_db_counts_are_the_tables_own(db):
    f = KOKKOS / "results.db"
    barriers = sql(f, "SELECT count(*) FROM OPS WHERE Name = 'Unknown command type'")[0][0]
    kernels = sql(f, "SELECT count(*) FROM OPS")[0][0] - barriers
    copies = sql(f, "SELECT count(*) FROM COPY WHERE Name LIKE 'Copy%'")[0][0]
    fills = sql(f, "SELECT count(*) FROM COPY WHERE Name = 'FillBuffer'")[0][0]
    assert (kernels, barriers, copies, fills) == (8, 6, 24, 6)  # the file: 14 OPS rows, 30 COPY rows
    kinds = collections.Counter(db.ops.kind.tolist())
    assert kinds == {OpKind.KERNEL: kernels, OpKind.MEMCPY: copies, OpKind.MEMSET: fills}
    assert any("6 barrier packets" in n for n in db.notes)
    assert len(db.calls) == sql(f, "SELECT count(*) FROM HIP")[0][0] == 104
    assert len(db.ranges) == sql(f, "SELECT count(*) FROM rocTX")[0][0] == 9
    # marks are written as BeginNs..BeginNs+1; the rest are push/pop ranges on the main thread
    marks = sql(f, "SELECT count(*) FROM rocTX WHERE EndNs - BeginNs <= 1")[0][0]
    assert collections.Counter(db.ranges.style.tolist()) == {RangeStyle.MARK: marks, RangeStyle.PUSH_POP: 9 - marks}
    # names lose the quotes the table stores them in
    want = collections.Counter(n.strip('"') for (n,) in sql(f, "SELECT Name FROM rocTX"))
    assert collections.Counter(names(db, db.ranges.name_id)) == want
    assert db.format == "rocprof-v1-db" and db.meta["layout"].startswith("ROCm <= 4.2")
    db.validate()


def test_db_ops_join_their_launch_calls_by_index(db):
    f = KOKKOS / "results.db"
    want = sorted((b, i) for b, i in sql(f, "SELECT BeginNs, \"Index\" FROM OPS WHERE Name != 'Unknown command type' "
                                            "UNION ALL SELECT BeginNs, \"Index\" FROM COPY"))
    assert sorted(zip(db.ops.start_ns.tolist(), db.ops.correlation_id.tolist())) == want
    row = join_ops_to_calls(db)
    assert (row >= 0).all()
    call = names(db, db.calls.name_id[row])
    for kind, name in zip(db.ops.kind.tolist(), call):
        if kind == OpKind.KERNEL:
            assert name == "hipLaunchKernel"
        else:
            assert re.match(r"hipMem(cpy|set)", name), name
    # the old layout's section numbers are replaced by the process the ops name (proc-id)
    (pid,), = sql(f, 'SELECT DISTINCT "proc-id" FROM OPS')
    assert set(db.ops.pid.tolist()) == set(db.calls.pid.tolist()) == set(db.ranges.pid.tolist()) == {pid}


def test_db_copy_bytes_come_from_the_calls_arguments(db):
    f = KOKKOS / "results.db"
    size = {i: int(m.group(1)) for i, a in sql(f, 'SELECT "Index", args FROM HIP')
            if (m := re.search(r"sizeBytes\((\d+)\)", a))}
    ops = db.ops.kind != OpKind.KERNEL
    per_call = collections.defaultdict(int)
    for c, b in zip(db.ops.correlation_id[ops].tolist(), db.ops.bytes[ops].tolist()):
        per_call[c] += b
    assert per_call == {c: size[c] for c in per_call}  # a hipMemset done as two fills: shared, same sum
    assert size[57] == 40_000_000 and per_call[57] == 40_000_000
    assert (db.ops.bytes[~ops] == 0).all()


def test_json_is_the_same_run_as_the_db(db, js):
    """The JSON has no Index: its flow events must tie every op to the very call the db names."""
    assert js.format == "rocprof-v1-json"
    for a, b in ((db.ops, js.ops), (db.ranges, js.ranges)):
        assert np.array_equal(a.start_ns, b.start_ns) and np.array_equal(a.end_ns, b.end_ns)
    assert np.array_equal(db.ops.kind, js.ops.kind) and names(db, db.ops.name_id) == names(js, js.ops.name_id)
    assert names(db, db.ranges.name_id) == names(js, js.ranges.name_id)
    assert np.array_equal(db.ranges.style, js.ranges.style)
    # calls: the same 104, keyed by their exact times
    index_of = {(s, e): c for s, e, c in zip(db.calls.start_ns.tolist(), db.calls.end_ns.tolist(),
                                              db.calls.correlation_id.tolist())}
    times_of = {c: (s, e) for s, e, c in zip(js.calls.start_ns.tolist(), js.calls.end_ns.tolist(),
                                             js.calls.correlation_id.tolist())}
    assert len(index_of) == len(times_of) == 104
    got = [index_of[times_of[c]] if c != NO_ID else NO_ID for c in js.ops.correlation_id.tolist()]
    unlinked = [i for i, c in enumerate(got) if c == NO_ID]
    assert [g for g in got if g != NO_ID] == [c for i, c in enumerate(db.ops.correlation_id.tolist())
                                              if i not in unlinked]
    # tblextr writes one flow per Index: a hipMemset done as two fills has a flow to one of them
    split = [i for i, n in collections.Counter(db.ops.correlation_id.tolist()).items() if n > 1]
    assert sorted(db.ops.correlation_id[unlinked].tolist()) == sorted(split) == [14, 32]
    assert any("2 GPU ops have no flow event" in n for n in js.notes)


def test_json_and_db_give_the_same_stages(db, js):
    a, b = attribute(db), attribute(js)
    assert np.array_equal(a.op_range, b.op_range)  # the two fills without a flow: placed by their GPU time
    assert np.array_equal(a.op_count, b.op_count) and np.array_equal(a.busy_ns, b.busy_ns)
    assert any(n.startswith("2 of 38 GPU ops have no launch call") for n in b.notes)
    assert (a.op_rule == Rule.SAME_THREAD).sum() == (b.op_rule == Rule.SAME_THREAD).sum() > 0
    loop = [i for i, n in enumerate(names(db, db.ranges.name_id)) if n == "Atomic Loop"]
    assert a.kernel_count[loop].tolist() == [1, 1]  # one parallel_for per Atomic Loop


def test_kern_table_mi250x_stats():
    f = MI250X / "results.db"
    t = open_trace(f)
    assert t.format == "rocprof-v1-db"
    n, = sql(f, "SELECT count(*) FROM KERN")[0]
    assert len(t.ops) == n == 1004 and (t.ops.kind == OpKind.KERNEL).all()
    assert len(t.ranges) == 0
    # one stand-in launch call per dispatch, at DispatchNs on the dispatching thread
    want = sorted(sql(f, "SELECT DispatchNs, tid, BeginNs FROM KERN"))
    row = join_ops_to_calls(t)
    assert sorted(zip(t.calls.start_ns[row].tolist(), t.calls.tid[row].tolist(), t.ops.start_ns.tolist())) == want
    # names without the quotes and the kernel descriptor's .kd
    want_names = collections.Counter(re.sub(r"(\s\[clone \.kd\]|\.kd)$", "", k.strip('"'))
                                     for (k,) in sql(f, "SELECT KernelName FROM KERN"))
    assert collections.Counter(names(t, t.ops.name_id)) == want_names
    assert want_names["laplacian_kernel"] == 1001


def test_kern_kernels_go_to_the_range_open_at_dispatch(tmp_path):
    """The thread-and-time rule on the real KERN rows: a rocTX table added to a copy, with one
    range around the dispatch times of kernels 10..19 on their thread, owns exactly those 10."""
    f = shutil.copy(MI250X / "results.db", tmp_path / "results.db")
    con = sqlite3.connect(f)
    rows = con.execute('SELECT DispatchNs, BeginNs, tid, pid FROM KERN ORDER BY "Index"').fetchall()
    con.execute('CREATE TABLE rocTX ("BeginNs" INTEGER, "EndNs" INTEGER, "pid" INTEGER, "tid" INTEGER, '
                '"Name" TEXT, "Index" INTEGER)')
    # from just before kernel 10's dispatch to just after kernel 19's: later kernels are already queued
    # (dispatched early, running late): they must not fall in by their GPU time
    con.execute("INSERT INTO rocTX VALUES (?,?,?,?,?,0)", (rows[10][0] - 1, rows[19][0] + 1, rows[0][2], rows[0][3],
                                                           '"ten dispatches"'))
    con.commit()
    con.close()
    t = read_rocprof_v1_db(f)
    att = attribute(t)
    assert att.op_count.tolist() == [10]
    owned = np.flatnonzero(att.op_range == 0)
    assert sorted(t.ops.start_ns[owned].tolist()) == sorted(r[1] for r in rows[10:20])
    assert any("dispatching thread and DispatchNs" in n for n in t.notes)


def test_stub_results_json_is_one_clear_line():
    with pytest.raises(TraceError) as err:
        open_trace(MI250X / "results.json")
    msg = str(err.value)
    assert "rocprof v1 results.json without trace events" in msg and "results.db beside it" in msg
    assert "\n" not in msg


def test_folder_of_both_files_reads_the_db(tmp_path):
    for name in ("results.db", "results.json"):
        shutil.copy(KOKKOS / name, tmp_path / name)
    assert open_trace(tmp_path).format == "rocprof-v1-db"
    (tmp_path / "results.db").unlink()
    assert open_trace(tmp_path).format == "rocprof-v1-json"


def test_missing_column_is_named(tmp_path):
    f = shutil.copy(KOKKOS / "results.db", tmp_path / "results.db")
    con = sqlite3.connect(f)
    con.execute("ALTER TABLE OPS DROP COLUMN EndNs")
    con.commit()
    con.close()
    with pytest.raises(TraceError, match="table OPS lacks column 'EndNs'"):
        read_rocprof_v1_db(f)


# ---- the ROCm >= 4.3 layouts, from the real rows ------------------------------------------------
# No real rocprof v1 file of ROCm 4.3+ with rocTX and HIP tables was found; these re-encode the
# Kokkos run's real rows in the columns tblextr.py writes from rocprofiler commit 567f457 (ROCm
# 4.3: real pid/tid, stream-id, __section/__lane), 1078a08 (ROCm 5.2: roctx-range) and 28f39ab
# (ROCm 6.2: barrier packets kept as '"<barrier packet>"').


def _new_layout_db(path: Path, rocm: str) -> Path:
    src = sqlite3.connect(f"file:{KOKKOS / 'results.db'}?mode=ro", uri=True)
    (pid,), = src.execute('SELECT DISTINCT "proc-id" FROM OPS').fetchall()
    launcher = dict(src.execute('SELECT "Index", tid FROM HIP').fetchall())
    con = sqlite3.connect(path)
    con.execute('CREATE TABLE rocTX ("BeginNs" INTEGER, "EndNs" INTEGER, "pid" INTEGER, "tid" INTEGER, "Name" TEXT, '
                '"Index" INTEGER, "__section" INTEGER, "__lane" INTEGER)')
    con.executemany("INSERT INTO rocTX VALUES (?,?,?,?,?,?,0,?)",
                    [(b, e, pid, t, n, i, t) for b, e, _, t, n, i in src.execute("SELECT * FROM rocTX")])
    con.execute('CREATE TABLE HIP ("BeginNs" INTEGER, "EndNs" INTEGER, "pid" INTEGER, "tid" INTEGER, "Name" TEXT, '
                '"args" TEXT, "Index" INTEGER, "Data" TEXT, "__section" INTEGER, "__lane" INTEGER, "DurationNs" INTEGER)')
    con.executemany("INSERT INTO HIP VALUES (?,?,?,?,?,?,?,?,2,?,?)",
                    [(b, e, pid, t, n, a, i, d, t, dur) for b, e, _, t, n, a, i, d, dur in src.execute("SELECT * FROM HIP")])
    extra = ', "roctx-range" TEXT' if rocm != "4.3" else ""
    for table in ("OPS", "COPY"):
        con.execute(f'CREATE TABLE {table} ("BeginNs" INTEGER, "EndNs" INTEGER, "dev-id" INTEGER, "queue-id" INTEGER, '
                    f'"Name" TEXT, "pid" INTEGER, "tid" INTEGER{extra}, "stream-id" INTEGER, "Index" INTEGER, '
                    '"Data" TEXT, "__section" INTEGER, "__lane" INTEGER, "DurationNs" INTEGER)')
        for b, e, dev, q, name, _, stream, i, _, d, dur in src.execute(f"SELECT * FROM {table}"):
            if name == "Unknown command type":
                if rocm != "6.2":
                    continue  # ROCm 4.5 to 6.1 skip barrier packets
                name = '"<barrier packet>"'
            # (roctx-range: tblextr writes the op's own name where no range holds its call)
            row = [b, e, dev, q, name, pid, launcher.get(i, 0), *([name] if rocm != "4.3" else []), stream, i, d, 6,
                   stream, dur]
            con.execute(f"INSERT INTO {table} VALUES ({','.join('?' * len(row))})", row)
    con.commit()
    con.close()
    src.close()
    return path


@pytest.mark.parametrize("rocm", ["4.3", "5.2", "6.2"])
def test_newer_db_layouts_read_the_same(tmp_path, db, rocm):
    t = read_rocprof_v1_db(_new_layout_db(tmp_path / "results.db", rocm))
    assert t.meta["layout"].startswith("ROCm >= 5.2" if rocm != "4.3" else "ROCm >= 4.3")
    for a, b in ((t.ops, db.ops), (t.calls, db.calls), (t.ranges, db.ranges)):
        assert np.array_equal(a.start_ns, b.start_ns) and np.array_equal(a.end_ns, b.end_ns)
        assert np.array_equal(a.pid, b.pid) and names(t, a.name_id) == names(db, b.name_id)
    for col in ("kind", "correlation_id", "stream_id", "bytes", "device_id"):
        assert np.array_equal(getattr(t.ops, col), getattr(db.ops, col)), col
    assert any("barrier packets" in n and "<barrier packet>" in n for n in t.notes) == (rocm == "6.2")


def test_newer_json_layout_reads_the_same(tmp_path, js):
    """tblextr's JSON from ROCm 4.3 on: pid/tid as numbers, the process in args.pid, the launching
    thread in args.tid and the stream in args.stream-id of ops (no proc-id)."""
    import json

    doc = json.loads((KOKKOS / "results.json").read_text())
    (pid,), = sql(KOKKOS / "results.db", 'SELECT DISTINCT "proc-id" FROM OPS')
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        e["pid"], e["tid"] = int(e["pid"]), int(e["tid"])
        a = e["args"]
        if "proc-id" in a:
            a["stream-id"], a["tid"], a["pid"] = a["tid"], "216796", str(a.pop("proc-id"))
        else:
            a["pid"] = str(pid)
    p = tmp_path / "results.json"
    p.write_text(json.dumps(doc))
    t = read_rocprof_v1_json(p)
    for col in ("start_ns", "end_ns", "kind", "correlation_id", "stream_id", "pid"):
        assert np.array_equal(getattr(t.ops, col), getattr(js.ops, col)), col
    assert np.array_equal(t.calls.correlation_id, js.calls.correlation_id)
    assert np.array_equal(t.ranges.start_ns, js.ranges.start_ns) and np.array_equal(t.ranges.style, js.ranges.style)
