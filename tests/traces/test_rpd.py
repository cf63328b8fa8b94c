"""RPD reader against the real rocmProfileData fixtures, counted with independent SQL."""

from __future__ import annotations

import collections
import gzip
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from maxinstr.errors import TraceError
from maxinstr.traces._util import pair_push_pop
from maxinstr.traces.model import NO_ID, CallKind, OpKind, RangeStyle
from maxinstr.traces import open_trace
from maxinstr.traces.rpd import read_rpd

RPD = Path(__file__).resolve().parents[1] / "data" / "rocprof" / "rpd"


@pytest.fixture(scope="module")
def mytrace_db(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rpd") / "mytrace.rpd"
    with gzip.open(RPD / "mytrace.rpd.gz") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


@pytest.fixture(scope="module")
def mytrace():
    return read_rpd(RPD / "mytrace.rpd.gz")


def sql(db: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def test_mytrace_counts(mytrace, mytrace_db):
    t = mytrace
    assert t.format == "rpd" and t.clock == "CLOCK_MONOTONIC"
    n_marker = sql(mytrace_db, "SELECT count(*) FROM api WHERE apiName = 'UserMarker'")[0][0]
    n_api = sql(mytrace_db, "SELECT count(*) FROM rocpd_api")[0][0]
    op_types = dict(sql(mytrace_db, "SELECT opType, count(*) FROM op GROUP BY opType"))
    assert len(t.ranges) == n_marker == 11884
    assert len(t.calls) == n_api - n_marker
    kinds = collections.Counter(t.ops.kind.tolist())
    assert kinds[OpKind.KERNEL] == op_types["KernelExecution"] + op_types["Task"]
    assert kinds[OpKind.MEMCPY] == sum(v for k, v in op_types.items() if k.startswith("Copy"))
    assert len(t.ops) == sum(op_types.values()) == 10124
    t.validate()


def test_mytrace_marker_names_and_order(mytrace, mytrace_db):
    t = mytrace
    expected = collections.Counter(dict(sql(mytrace_db, "SELECT args, count(*) FROM api WHERE apiName='UserMarker' GROUP BY args")))
    got = collections.Counter(t.name(int(i)) for i in t.ranges.name_id)
    assert got == expected
    assert np.all(np.diff(t.ranges.start_ns) >= 0) and np.all(np.diff(t.ops.start_ns) >= 0)
    assert np.all(t.ranges.style == RangeStyle.PUSH_POP)
    assert set(t.ranges.tid.tolist()) == {tid for (tid,) in sql(mytrace_db, "SELECT DISTINCT tid FROM api WHERE apiName='UserMarker'")}


def test_mytrace_api_op_links(mytrace, mytrace_db):
    t = mytrace
    links = sql(mytrace_db, "SELECT o.start, o.gpuId, ao.api_id, a.apiName FROM rocpd_api_ops ao JOIN rocpd_op o ON o.id = ao.op_id JOIN api a ON a.id = ao.api_id")
    assert len(links) == 10124
    expected = sorted((s, api) for s, _, api, _ in links)
    assert sorted(zip(t.ops.start_ns.tolist(), t.ops.correlation_id.tolist())) == expected
    # every op's correlation id is the id of a kept call, and its pid is that call's pid
    call_ids = dict(zip(t.calls.correlation_id.tolist(), t.calls.pid.tolist()))
    assert all(c in call_ids for c in t.ops.correlation_id.tolist())
    assert np.array_equal(t.ops.pid, [call_ids[c] for c in t.ops.correlation_id.tolist()])
    # graph launches: 20 hipGraphLaunch calls, 418 ops each, stand-in node ids 0..417
    graph_calls = t.calls.correlation_id[t.calls.kind == CallKind.GRAPH]
    assert len(graph_calls) == 20
    in_graph = np.isin(t.ops.correlation_id, graph_calls)
    assert in_graph.sum() == collections.Counter(name for *_, name in links)["hipGraphLaunch"] == 8360
    per_node = collections.Counter(t.ops.graph_node_id[in_graph].tolist())
    assert set(per_node) == set(range(418)) and set(per_node.values()) == {20}
    assert np.all(t.ops.graph_node_id[~in_graph] == NO_ID)
    # the same node id names the same kernel in every replay
    node_names = collections.defaultdict(set)
    for node, name in zip(t.ops.graph_node_id[in_graph].tolist(), t.ops.name_id[in_graph].tolist()):
        node_names[node].add(name)
    assert all(len(v) == 1 for v in node_names.values())


def test_mytrace_copy_bytes(mytrace, mytrace_db):
    total = sql(mytrace_db, "SELECT sum(c.size) FROM rocpd_api_ops ao JOIN rocpd_copyapi c ON c.api_ptr_id = ao.api_id")[0][0]
    assert mytrace.ops.bytes.sum() == total > 0
    assert np.all(mytrace.ops.bytes[mytrace.ops.kind == OpKind.KERNEL] == 0)


def test_matmul_kernels_copies_fill_no_markers():
    t = read_rpd(RPD / "matmul_result.rpd")
    assert (len(t.ranges), len(t.calls), len(t.ops)) == (0, 125, 85)
    assert collections.Counter(t.ops.kind.tolist()) == {OpKind.KERNEL: 29, OpKind.MEMCPY: 55, OpKind.MEMSET: 1}
    assert set(t.ops.device_id.tolist()) == {2}
    linked = sql(RPD / "matmul_result.rpd", "SELECT count(*) FROM rocpd_api_ops")[0][0]
    assert np.count_nonzero(t.ops.correlation_id != NO_ID) == linked == 85


def test_pair_push_pop_rebuilds_real_nested_ranges(mytrace):
    """The columnar push/pop pairing, on the real roctx ranges split into push and pop events."""
    r = mytrace.ranges
    n = len(r)
    tid = np.r_[r.tid, r.tid]
    time = np.r_[r.start_ns, r.end_ns]
    is_push = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    push_i, pop_i, unmatched, unclosed = pair_push_pop(tid, time, is_push)
    got = sorted(zip(time[push_i].tolist(), time[pop_i].tolist()))
    want = sorted(zip(r.start_ns.tolist(), r.end_ns.tolist()))
    assert (unmatched, unclosed) == (0, 0)
    assert got == want


def test_pair_push_pop_drops_unbalanced():
    tid = np.array([7, 7, 7, 7, 9])
    time = np.array([1, 2, 3, 4, 5])
    is_push = np.array([False, True, True, False, True])  # pop first; one push never popped; a lone push
    push_i, pop_i, unmatched, unclosed = pair_push_pop(tid, time, is_push)
    assert list(zip(push_i, pop_i)) == [(2, 3)]
    assert (unmatched, unclosed) == (1, 2)


# ---- bad input ---------------------------------------------------------------------------------


def _copy(tmp_path) -> Path:
    p = tmp_path / "m.rpd"
    shutil.copy(RPD / "matmul_result.rpd", p)
    p.chmod(0o644)
    return p


def test_missing_table(tmp_path):
    p = _copy(tmp_path)
    con = sqlite3.connect(p)
    for v in ("op", "kernel", "copyop", "top", "busy"):
        con.execute(f"DROP VIEW IF EXISTS {v}")
    con.execute("DROP TABLE rocpd_api_ops")
    con.commit()
    con.close()
    with pytest.raises(TraceError, match=r"m\.rpd: RPD database lacks table 'rocpd_api_ops'"):
        read_rpd(p)


def test_missing_column(tmp_path):
    p = _copy(tmp_path)
    con = sqlite3.connect(p)
    for v in ("op", "kernel", "copyop", "top", "busy"):
        con.execute(f"DROP VIEW IF EXISTS {v}")
    con.execute("ALTER TABLE rocpd_op DROP COLUMN gpuId")
    con.commit()
    con.close()
    with pytest.raises(TraceError, match="rocpd_op lacks column 'gpuId'"):
        read_rpd(p)


def test_truncated_gzip_and_truncated_db(tmp_path):
    gz = tmp_path / "t.rpd.gz"
    gz.write_bytes((RPD / "mytrace.rpd.gz").read_bytes()[:50_000])
    with pytest.raises(TraceError, match="corrupt or truncated gzip"):
        read_rpd(gz)
    db = tmp_path / "t.rpd"
    db.write_bytes((RPD / "matmul_result.rpd").read_bytes()[:20_000])
    with pytest.raises(TraceError, match="t.rpd: "):
        read_rpd(db)


def test_python_and_native_column_backends_agree(monkeypatch, mytrace):
    """The big RPD tables go through _sqlite_columns; its sqlite3 fallback gives the same trace."""
    monkeypatch.setenv("MAXINSTR_NO_NATIVE_COLUMNS", "1")
    slow = read_rpd(RPD / "mytrace.rpd.gz")
    for table in ("ranges", "calls", "ops"):
        a, b = getattr(mytrace, table), getattr(slow, table)
        for col in a.__dataclass_fields__:
            assert np.array_equal(getattr(a, col), getattr(b, col)), (table, col)
    assert list(mytrace.strings) == list(slow.strings)


# ---- RPD's Chrome-trace export (rpd2tracing.py) against the .rpd it came from ---------------


def _call_key(t) -> dict[int, tuple[int, int, int]]:
    """correlation id -> (pid, tid, start us) of each call: how both files name one API row."""
    return {int(c): (int(p), int(d), int(s) // 1000)
            for c, p, d, s in zip(t.calls.correlation_id, t.calls.pid, t.calls.tid, t.calls.start_ns)}


def _op_links(t) -> list[tuple]:
    calls = _call_key(t)
    return sorted((int(g), int(q), int(s) // 1000, calls.get(int(c)))
                  for g, q, s, c in zip(t.ops.device_id, t.ops.stream_id, t.ops.start_ns, t.ops.correlation_id))


def test_matmul_json_export_is_the_rpd():
    """rpd2tracing @ c633a7e9 (integer microseconds, a bare list): every op, and the API call each
    op's api_op flow leads to, as the database's rocpd_api_ops says."""
    j = open_trace(RPD / "matmul_result.json")
    d = read_rpd(RPD / "matmul_result.rpd")
    assert j.format == "rpd-json"
    op_types = dict(sql(RPD / "matmul_result.rpd", "SELECT opType, count(*) FROM op GROUP BY opType"))
    kinds = collections.Counter(j.ops.kind.tolist())
    assert kinds == {OpKind.KERNEL: op_types["KernelExecution"], OpKind.MEMCPY: op_types["CopyDeviceToHost"]
                     + op_types["CopyHostToDevice"], OpKind.MEMSET: op_types["FillBuffer"]} == {0: 29, 1: 55, 2: 1}
    assert len(j.calls) == sql(RPD / "matmul_result.rpd", "SELECT count(*) FROM rocpd_api")[0][0] == 125
    assert _op_links(j) == _op_links(d)
    assert (j.ops.correlation_id != NO_ID).all()


def test_mytrace_json_export_is_the_rpd(mytrace):
    """rpd2tracing @ e943e7a5 (ns as decimal microseconds, {"traceEvents": ...}) run on the real
    mytrace.rpd: its 11884 roctx ranges exactly, the 10124 ops and their calls, graph replays."""
    j = open_trace(RPD / "mytrace_rpd2tracing.json.gz")
    d = mytrace
    assert j.format == "rpd-json"
    for a, b in ((j.ranges, d.ranges), (j.ops, d.ops)):
        assert np.array_equal(np.sort(a.start_ns), np.sort(b.start_ns))
        assert np.array_equal(np.sort(a.end_ns), np.sort(b.end_ns))
    assert collections.Counter(j.name(int(i)) for i in j.ranges.name_id) == \
        collections.Counter(d.name(int(i)) for i in d.ranges.name_id)
    assert np.array_equal(np.sort(j.ranges.tid), np.sort(d.ranges.tid))
    assert _op_links(j) == _op_links(d)
    assert (j.calls.kind == CallKind.GRAPH).sum() == 20 and (j.ops.graph_node_id != NO_ID).sum() == 8360
    # rpd2tracing's own summaries on the GPU lanes (UserMarker frames) are not ops
    assert any("summary spans on the GPU lanes" in n for n in j.notes)
