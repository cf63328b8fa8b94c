"""The Nsight Systems reader on every real nsys fixture: counts against the raw tables (SQL),
traps (backtrace rows, driver rows, graph replays, inline/registered names), both backends
agreeing, .nsys-rep handling and one-line errors."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from maxinstr.errors import TraceError
from maxinstr.traces import _sqlite_columns as cols
from maxinstr.traces import nsys as nsys_mod
from maxinstr.traces.model import CallKind, OpKind, RangeStyle
from maxinstr.traces.nsys import read_nsys

DATA = Path(__file__).resolve().parents[1] / "data" / "nsys"
FIXTURES = sorted(DATA.glob("*.sqlite"))
NATIVE = cols.native_module() is not None


def sql(path: Path, query: str):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def has_table(path: Path, table: str) -> bool:
    return bool(sql(path, f"SELECT 1 FROM sqlite_master WHERE type='table' AND name='{table}'"))


def count(path: Path, table: str, where: str = "") -> int:
    if not has_table(path, table):
        return 0
    return sql(path, f"SELECT count(*) FROM {table} {where}")[0][0]


@pytest.fixture(scope="module", params=FIXTURES, ids=lambda p: p.stem)
def loaded(request):
    return request.param, read_nsys(request.param)


def test_fixtures_present():
    assert len(FIXTURES) >= 7


def test_counts_match_raw_tables(loaded):
    path, trace = loaded
    trace.validate()
    ops = trace.ops
    assert (ops.kind == OpKind.KERNEL).sum() == count(path, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert (ops.kind == OpKind.MEMCPY).sum() == count(path, "CUPTI_ACTIVITY_KIND_MEMCPY")
    assert (ops.kind == OpKind.MEMSET).sum() == count(path, "CUPTI_ACTIVITY_KIND_MEMSET")
    n_ranges = count(path, "NVTX_EVENTS", "WHERE eventType IN (59, 60, 70, 71)")
    n_marks = count(path, "NVTX_EVENTS", "WHERE eventType IN (34, 65)")
    assert (trace.ranges.style != RangeStyle.MARK).sum() == n_ranges
    assert (trace.ranges.style == RangeStyle.MARK).sum() == n_marks
    # One call per launch: distinct correlation ids of non-backtrace API rows that some op has.
    ops_union = " UNION ".join(
        f"SELECT correlationId FROM {t}"
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
        if has_table(path, t)
    )
    want = sql(path, f"SELECT count(DISTINCT correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                     f"WHERE eventClass != 67 AND correlationId IN ({ops_union})")[0][0]  # fmt: skip
    assert len(trace.calls) == want
    assert len(np.unique(trace.calls.correlation_id)) == len(trace.calls)
    # Times are the table's own.
    k = trace.ops.kind == OpKind.KERNEL
    lo, hi = sql(path, "SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
    assert trace.ops.start_ns[k].min() == lo and trace.ops.end_ns[k].max() == hi
    assert trace.session_start_utc_ns == sql(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0]
    assert trace.meta["nsys_version"]


def test_kernel_names_are_demangled_and_counted(loaded):
    path, trace = loaded
    (name, n), = sql(path, "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                           "ON s.id = k.demangledName GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 1")  # fmt: skip
    names = trace.strings[trace.ops.name_id]
    assert (names == name).sum() == n


def test_threads_and_processes_from_global_tid(loaded):
    path, trace = loaded
    gtid = sql(path, "SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1")[0][0]
    assert (gtid & 0xFFFFFF) in set(trace.calls.tid.tolist()) or not len(trace.calls)
    assert set(trace.calls.pid.tolist()) <= {(g >> 24) & 0xFFFFFF for (g,) in
                                             sql(path, "SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")}  # fmt: skip


def test_h200_decode_payloads_domains_and_graph():
    trace = read_nsys(DATA / "h200_decode.sqlite")
    R = trace.ranges
    assert {trace.name(int(d)) for d in R.domain_id} == {"maxinstr"}
    assert np.array_equal(np.sort(R.payload), np.sort([v for (v,) in sql(DATA / "h200_decode.sqlite",
                          "SELECT int64Value FROM NVTX_EVENTS WHERE eventType = 59")]))  # fmt: skip
    assert set(trace.strings[R.name_id]) == {"request", "prefill", "decode", "sample"}
    # 684 kernels replayed from a graph, launched by 36 cudaGraphLaunch calls.
    assert (trace.ops.graph_node_id >= 0).sum() == 684
    assert (trace.calls.kind == CallKind.GRAPH).sum() == 36
    assert {trace.name(int(i)) for i in trace.calls.name_id[trace.calls.kind == CallKind.GRAPH]} == {"cudaGraphLaunch_v10000"}


def test_pipit_backtrace_rows_dropped_and_mixed_names():
    path = DATA / "pipit_saxpy_mpi_nsys2022.2.sqlite"
    trace = read_nsys(path)
    # Two runtime rows per correlation id (runtime + backtrace): one call each survives.
    assert count(path, "CUPTI_ACTIVITY_KIND_RUNTIME", "WHERE eventClass = 67") == 38
    k = trace.ops.kind == OpKind.KERNEL
    assert k.sum() == 5
    call_names = {trace.name(int(i)) for i in trace.calls.name_id}
    assert "cudaLaunchKernel_v7000" in call_names and "cudaLaunchKernel" not in call_names
    # Range names come inline (saxpy) and registered (MPI_*), domain MPI for the latter.
    names = {(trace.name(int(d)), trace.name(int(t))) for d, t in zip(trace.ranges.domain_id, trace.ranges.name_id)}
    assert ("", "saxpy") in names and ("MPI", "MPI_Send") in names
    assert trace.thread_names[int(sql(path, "SELECT globalTid FROM NVTX_EVENTS WHERE eventType = 39")[0][0]) & 0xFFFFFF] == "MPI Rank 0"


def test_two_threads_driver_calls_and_thread_names():
    trace = read_nsys(DATA / "cs336_two_threads_nsys2025.1.sqlite")
    drv = trace.calls.kind == CallKind.DRIVER
    assert drv.sum() == 190
    assert {trace.name(int(i)) for i in trace.calls.name_id[drv]} == {"cuLaunchKernel"}
    assert "pt_autograd_0" in trace.thread_names.values()
    assert len(set(trace.calls.tid.tolist())) == 2


def test_no_nvtx_table():
    trace = read_nsys(DATA / "pipit_cloverleaf_no_nvtx_nsys2024.5.sqlite")
    assert len(trace.ranges) == 0 and len(trace.ops) == 1591


def _same(a, b):
    assert list(a.strings) == list(b.strings)
    for table in ("ranges", "calls", "ops"):
        ta, tb = getattr(a, table), getattr(b, table)
        for f in dataclasses.fields(ta):
            x, y = getattr(ta, f.name), getattr(tb, f.name)
            assert x.dtype == y.dtype and np.array_equal(x, y), (table, f.name)
    assert a.thread_names == b.thread_names and a.notes == b.notes
    assert a.session_start_utc_ns == b.session_start_utc_ns


@pytest.mark.skipif(not NATIVE, reason="maxinstr._columns not built")
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_native_and_python_backends_agree(path):
    native = read_nsys(path, backend="native")
    assert native.meta["reader_backend"] == "native"
    _same(native, read_nsys(path, backend="python"))


@pytest.mark.skipif(not NATIVE, reason="maxinstr._columns not built")
def test_sliced_parallel_reads_agree(monkeypatch):
    path = DATA / "cs336_two_threads_nsys2025.1.sqlite"
    whole = read_nsys(path, backend="python")
    monkeypatch.setattr(nsys_mod, "_ROWS_PER_SLICE", 1000)
    monkeypatch.setattr(cols, "worker_count", lambda: 3)
    _same(read_nsys(path, backend="native"), whole)


def test_python_filter_matches_native_semantics():
    cols_in = [np.array([3, 7, -1, 2, 9]), np.array([10, 20, 30, 40, 50])]
    mask = np.array([0, 0, 1, 1, 0, 0, 0, 1], np.uint8)
    v, w = cols.apply_filter(cols_in, 0, mask)
    assert v.tolist() == [3, 7, 2] and w.tolist() == [10, 20, 40]


@pytest.mark.parametrize("backend", ["python", pytest.param("native", marks=pytest.mark.skipif(not NATIVE, reason="maxinstr._columns not built"))])
def test_int32_kind_halves_columns_and_marks_out_of_range_values(tmp_path, backend):
    """Kind 'n' (ids, 24-bit pids, enums): int32; NULL reads as 0 like 'i'; a value outside the
    int32 range (only in a damaged file) reads as -1, on both backends alike."""
    import sqlite3

    db = tmp_path / "n.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (a INTEGER)")
    values = [0, 5, -7, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**40, None, "12"]
    con.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
    con.commit()
    con.close()
    (got,) = cols.backend(backend).query(str(db), "SELECT a FROM t ORDER BY rowid", "n")
    assert got.dtype == np.int32
    assert got.tolist() == [0, 5, -7, 2**31 - 1, -(2**31), -1, -1, -1, 0, 12]
    (wide,) = cols.backend(backend).query(str(db), "SELECT a FROM t ORDER BY rowid", "i")
    assert wide.dtype == np.int64 and wide[7] == 2**40


def test_nsys_reader_narrows_ids_not_times():
    """The 10M-op memory bound rests on int32 pid/tid/device/name columns; times, stream,
    correlation and graph node ids stay int64 (their ranges are not bounded by nsys)."""
    t = read_nsys(DATA / "h200_decode.sqlite")
    assert t.ops.pid.dtype == t.calls.pid.dtype == t.calls.tid.dtype == np.int32
    assert t.ops.device_id.dtype == t.ops.name_id.dtype == t.calls.name_id.dtype == np.int32
    for col in (t.ops.start_ns, t.ops.end_ns, t.ops.stream_id, t.ops.correlation_id, t.ops.graph_node_id,
                t.calls.start_ns, t.calls.end_ns, t.calls.correlation_id):  # fmt: skip
        assert col.dtype == np.int64


def test_nsys_rep_uses_the_export_beside_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys
    rep = tmp_path / "h200_small.nsys-rep"
    shutil.copy(DATA / "h200_small.nsys-rep", rep)
    with pytest.raises(TraceError, match=r"nsys is not on PATH.*nsys export --type sqlite -o h200_small\.sqlite"):
        read_nsys(rep)
    shutil.copy(DATA / "h200_small.sqlite", tmp_path / "h200_small.sqlite")
    trace = read_nsys(rep)
    assert trace.source == str(rep) and len(trace.ops) == 242
    assert any("read from the SQLite export beside it" in n and "h200_small.sqlite" in n for n in trace.notes)


def test_nsys_rep_never_reads_an_older_export_beside_it(tmp_path, monkeypatch):
    """An export older than the .nsys-rep may be of another capture (nsys stats exports again then):
    without nsys a one-line error naming both files, never that export's kernels under the report's name."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys
    rep, beside = tmp_path / "h200_small.nsys-rep", tmp_path / "h200_small.sqlite"
    shutil.copy(DATA / "h200_small.nsys-rep", rep)
    shutil.copy(DATA / "h200_decode.sqlite", beside)  # another capture's export
    os.utime(beside, (1577836800, 1577836800))  # 2020-01-01: older than the report
    with pytest.raises(TraceError) as info:
        read_nsys(rep)
    msg = str(info.value)
    assert "\n" not in msg and str(rep) in msg and str(beside) in msg and "older than the report" in msg
    assert "nsys export --type sqlite --force-overwrite true -o h200_small.sqlite h200_small.nsys-rep" in msg
    os.utime(beside, (rep.stat().st_mtime + 1,) * 2)  # now the newer: read, and said
    trace = read_nsys(rep)
    assert trace.notes[0] == f"h200_small.nsys-rep: read from the SQLite export beside it, {beside} (not older than the .nsys-rep)"


def test_nsys_rep_exported_with_nsys(tmp_path):
    """A stand-in `nsys` on PATH is invoked with `export --type sqlite` and its output used."""
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n# args: export --type sqlite --force-overwrite true --output OUT REP\n"
                    f'[ "$1" = export ] && [ "$3" = sqlite ] && cp {DATA / "h200_small.sqlite"} "$7"\n')  # fmt: skip
    fake.chmod(0o755)
    rep = tmp_path / "r.nsys-rep"
    shutil.copy(DATA / "h200_small.nsys-rep", rep)
    shutil.copy(DATA / "h200_decode.sqlite", tmp_path / "r.sqlite")
    os.utime(tmp_path / "r.sqlite", (1577836800, 1577836800))  # older than the report: exported again
    from maxinstr.traces.nsys_export import sqlite_for_report

    out, how = sqlite_for_report(rep, nsys=str(fake))
    assert out == tmp_path / "r.sqlite" and out.is_file() and how == f"exported to SQLite by nsys export: {out}"
    assert len(read_nsys(out).ops) == 242


def test_errors_are_one_line(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_nsys(tmp_path / "missing.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(TraceError, match="not an SQLite database"):
        read_nsys(junk)
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.close()
    with pytest.raises(TraceError, match="not an Nsight Systems SQLite export") as info:
        read_nsys(other)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("backend", ["python"] + (["native"] if NATIVE else []))
def test_damaged_files_give_trace_errors(tmp_path, backend):
    """Random byte damage to a real export: a Trace or a one-line TraceError, nothing else."""
    import random

    seed = (DATA / "h200_small.sqlite").read_bytes()
    rng = random.Random(1234)
    path = tmp_path / "damaged.sqlite"
    outcomes = {"trace": 0, "error": 0}
    for _ in range(40):
        data = bytearray(seed)
        for _ in range(rng.choice([1, 4, 16, 64])):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            from maxinstr.attribute import attribute

            attribute(read_nsys(path, backend=backend))
            outcomes["trace"] += 1
        except TraceError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc)
            outcomes["error"] += 1
    assert outcomes["trace"] and outcomes["error"]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_reader_join_is_the_join_attribution_makes(path):
    """The reader hands over its op -> call join (traces.model.OP_CALL_KEY); it must equal the
    join of the trace's own columns, and be ignored once a column is replaced."""
    import dataclasses as dc

    from maxinstr.attribute.attribute import join_ops_to_calls
    from maxinstr.columns import correlation_join
    from maxinstr.traces.model import OP_CALL_KEY

    for backend in ["python"] + (["native"] if NATIVE else []):
        t = read_nsys(path, backend=backend)
        fresh = correlation_join(t.ops.pid, t.ops.correlation_id, t.calls.pid, t.calls.correlation_id)
        if len(t.calls):
            assert t.meta[OP_CALL_KEY][4] is join_ops_to_calls(t)
        assert np.array_equal(join_ops_to_calls(t), fresh)
        if len(t.ops):
            t.ops = dc.replace(t.ops, correlation_id=t.ops.correlation_id.copy())
            assert join_ops_to_calls(t) is not t.meta.get(OP_CALL_KEY, (None,) * 5)[4]


@pytest.mark.skipif(not NATIVE, reason="maxinstr._columns not built")
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_scans_on_several_threads_agree(path, monkeypatch):
    """The direct scans split a table's leaves over the reader threads and hand back one piece
    per thread, joined once with the other op tables: the same trace as one SQL read."""
    whole = read_nsys(path, backend="python")
    monkeypatch.setattr(cols, "worker_count", lambda: 4)
    _same(read_nsys(path, backend="native"), whole)
