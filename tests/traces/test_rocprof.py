"""rocprofv3 readers (CSV set, JSON, rocpd) against the real CSV fixtures, counted independently."""

from __future__ import annotations

import collections
import csv
import shutil
import sqlite3

import numpy as np
import pytest
import rocprof_samples as rs

from maxinstr.errors import TraceError
from maxinstr.traces.model import NO_ID, CallKind, OpKind, RangeStyle
from maxinstr.traces.rocprof import read_rocpd, read_rocprof_csv, read_rocprof_json

LLAMA = rs.LLAMA
DOCS = rs.DOCS


def names(trace, ids):
    return [trace.name(int(i)) for i in ids]


# ---- CSV: ROCm 6.2/6.3 documentation samples (different runs: parse only) -------------------


def test_docs_csv_counts_names_and_styles():
    t = read_rocprof_csv(DOCS)
    markers = rs.rows(DOCS / "marker_api_trace.csv")
    hip = rs.rows(DOCS / "hip_runtime_trace.csv")
    kernels = rs.rows(DOCS / "kernel_trace.csv")
    copies = rs.rows(DOCS / "memory_copy_trace.csv")
    assert t.format == "rocprofv3-csv"
    assert (len(t.ranges), len(t.calls), len(t.ops)) == (len(markers), len(hip), len(kernels) + len(copies))
    assert sorted(names(t, t.ranges.name_id)) == sorted(m["Function"] for m in markers)
    assert names(t, t.calls.name_id) == [h["Function"] for h in sorted(hip, key=lambda r: int(r["Start_Timestamp"]))]
    style = {t.name(int(n)): (int(s), int(tid)) for n, s, tid in zip(t.ranges.name_id, t.ranges.style, t.ranges.tid)}
    assert style["before hipLaunchKernel"] == (RangeStyle.MARK, 717)  # start == end
    assert style["hipLaunchKernel range"] == (RangeStyle.START_END, NO_ID)  # roctxRangeStart: Thread_Id 0
    assert style["hipMemcpy"] == (RangeStyle.PUSH_POP, 717)
    kinds = collections.Counter(t.ops.kind.tolist())
    assert kinds == {OpKind.KERNEL: len(kernels), OpKind.MEMCPY: len(copies)}
    assert sorted(t.ops.start_ns[t.ops.kind == OpKind.KERNEL]) == sorted(int(k["Start_Timestamp"]) for k in kernels)
    # old header: no Stream_Id -> Queue_Id is the stream
    k = t.ops.kind == OpKind.KERNEL
    assert sorted(t.ops.stream_id[k]) == sorted(int(r["Queue_Id"]) for r in kernels)
    assert any("agent numbers" in n for n in t.notes)
    for table in (t.ranges, t.calls, t.ops):
        assert np.all(np.diff(table.start_ns) >= 0)


def test_docs_csv_one_file_reads_its_set():
    whole = read_rocprof_csv(DOCS)
    one = read_rocprof_csv(DOCS / "kernel_trace.csv")
    assert (len(one.ranges), len(one.calls), len(one.ops)) == (len(whole.ranges), len(whole.calls), len(whole.ops))


# ---- CSV: ROCm 7 llama.cpp decode (new header), kernels joined to HIP calls ------------------


def test_llamacpp_csv_counts_and_correlation_links():
    t = read_rocprof_csv(LLAMA)
    kernels = rs.rows(LLAMA / "decode_kernel_trace.csv")
    hip = rs.rows(LLAMA / "decode_hip_api_trace.csv")
    assert (len(t.ops), len(t.calls), len(t.ranges)) == (len(kernels), len(hip), 0) == (144, 920, 0)
    assert t.meta["header"] == ["rocprofv3 >= 7 (Stream_Id)"]
    # the join, counted straight from the raw files
    by_corr = {h["Correlation_Id"]: h["Function"] for h in hip}
    raw = collections.Counter(by_corr[k["Correlation_Id"]] for k in kernels if k["Correlation_Id"] in by_corr)
    assert raw == {"hipGraphLaunch": 24, "hipLaunchKernel": 2, "hipMemcpyAsync": 1}
    call_of = dict(zip(t.calls.correlation_id.tolist(), names(t, t.calls.name_id)))
    joined = collections.Counter(call_of[c] for c in t.ops.correlation_id.tolist() if c in call_of)
    assert joined == raw and sum(joined.values()) == 27
    # graph launch: one call, 24 kernels with stand-in node ids 0..23; the call is CallKind.GRAPH
    graph_calls = t.calls.correlation_id[t.calls.kind == CallKind.GRAPH]
    in_graph = np.isin(t.ops.correlation_id, graph_calls)
    assert sorted(t.ops.graph_node_id[in_graph]) == list(range(24))
    assert np.all(t.ops.graph_node_id[~in_graph] == NO_ID)
    # new header fields: Stream_Id, "Agent 1"; the pid comes from the HIP rows
    assert set(t.ops.stream_id.tolist()) == {int(k["Stream_Id"]) for k in kernels}
    assert set(t.ops.device_id.tolist()) == {1}
    assert set(t.ops.pid.tolist()) == {2684120}
    assert names(t, t.ops.name_id) == [k["Kernel_Name"] for k in sorted(kernels, key=lambda r: int(r["Start_Timestamp"]))]
    assert np.all(np.diff(t.ops.start_ns) >= 0)
    t.validate()


def test_kernel_file_alone_says_it_cannot_join(tmp_path):
    shutil.copy(LLAMA / "decode_kernel_trace.csv", tmp_path)
    t = read_rocprof_csv(tmp_path)
    assert len(t.ops) == 144 and len(t.calls) == 0
    assert any("cannot be tied" in n for n in t.notes)


def test_agent_info_maps_agents_to_gpu_ordinals(tmp_path):
    for f in LLAMA.iterdir():
        shutil.copy(f, tmp_path)
    # rocprofv3 writes <prefix>agent_info.csv; node 0 is the CPU, node 1 the GPU
    (tmp_path / "decode_agent_info.csv").write_text('"Logical_Node_Id","Agent_Type"\n0,"CPU"\n1,"GPU"\n')
    t = read_rocprof_csv(tmp_path)
    assert set(t.ops.device_id.tolist()) == {0}
    assert not any("agent numbers" in n for n in t.notes)


def test_several_sets_in_one_folder_keep_correlation_apart(tmp_path):
    for prefix in ("111_", "222_"):
        for f in LLAMA.iterdir():
            shutil.copy(f, tmp_path / (prefix + f.name.removeprefix("decode_")))
    t = read_rocprof_csv(tmp_path)
    assert (len(t.ops), len(t.calls)) == (288, 1840)
    assert len(np.unique(t.calls.correlation_id)) == 1840
    call_ids = set(t.calls.correlation_id.tolist())
    assert sum(c in call_ids for c in t.ops.correlation_id.tolist()) == 54


# ---- JSON and rocpd: the same real rows, re-encoded (see rocprof_samples.py) -----------------


@pytest.fixture(scope="module")
def csv_trace():
    return read_rocprof_csv(LLAMA)


def _same_as_csv(t, c):
    k = t.ops.kind == OpKind.KERNEL
    assert k.sum() == len(c.ops)
    assert np.array_equal(t.ops.start_ns[k], c.ops.start_ns)
    assert np.array_equal(t.ops.end_ns[k], c.ops.end_ns)
    assert np.array_equal(t.ops.correlation_id[k], c.ops.correlation_id)
    assert np.array_equal(t.ops.stream_id[k], c.ops.stream_id)
    assert np.array_equal(t.ops.graph_node_id[k], c.ops.graph_node_id)
    assert names(t, t.ops.name_id[k]) == names(c, c.ops.name_id)
    assert np.array_equal(t.calls.correlation_id, c.calls.correlation_id)
    assert np.array_equal(t.calls.tid, c.calls.tid)
    assert np.array_equal(t.calls.kind, c.calls.kind)
    assert names(t, t.calls.name_id) == names(c, c.calls.name_id)
    docs = read_rocprof_csv(DOCS)
    assert sorted(zip(names(t, t.ranges.name_id), t.ranges.style.tolist(), t.ranges.start_ns.tolist())) == sorted(
        zip(names(docs, docs.ranges.name_id), docs.ranges.style.tolist(), docs.ranges.start_ns.tolist())
    )
    assert set(t.ops.device_id.tolist()) == {0}  # GPU ordinal from the agent table
    t.validate()


def test_json_reads_the_same_rows_as_csv(tmp_path, csv_trace):
    t = read_rocprof_json(rs.write_json(tmp_path / "run_results.json"))
    assert t.format == "rocprofv3-json"
    _same_as_csv(t, csv_trace)
    copies = t.ops.kind == OpKind.MEMCPY
    assert sorted(names(t, t.ops.name_id[copies])) == sorted(r["Direction"] for r in rs.rows(DOCS / "memory_copy_trace.csv"))


def test_json_raw_push_pop_rows_are_paired(tmp_path):
    # the docs marker rows as raw roctxRangePushA / roctxRangePop records: 2 push/pop ranges
    doc = rs.rocprof_json()
    proc = doc["rocprofiler-sdk-tool"][0]
    raw = []
    for m in proc["buffer_records"]["marker_api"]:
        if m["operation"] == rs.MARKER_OPS.index("roctxRangePushA"):
            pop = dict(m, operation=rs.MARKER_OPS.index("roctxRangePop"), start_timestamp=m["end_timestamp"])
            raw += [dict(m, end_timestamp=m["start_timestamp"]), pop]
        else:
            raw.append(m)
    proc["buffer_records"]["marker_api"] = raw
    import json

    p = tmp_path / "raw_results.json"
    p.write_text(json.dumps(doc))
    t = read_rocprof_json(p)
    paired = read_rocprof_json(rs.write_json(tmp_path / "paired_results.json"))
    assert sorted(zip(t.ranges.start_ns.tolist(), t.ranges.end_ns.tolist(), t.ranges.style.tolist())) == sorted(
        zip(paired.ranges.start_ns.tolist(), paired.ranges.end_ns.tolist(), paired.ranges.style.tolist())
    )


@pytest.mark.parametrize("backend", ["auto", "python"])
@pytest.mark.parametrize("views", [True, False], ids=["views", "uuid-tables-only"])
def test_rocpd_reads_the_same_rows_as_csv(tmp_path, csv_trace, views, backend, monkeypatch):
    if backend == "python":  # the columnar backend's sqlite3 path (native is used when built)
        monkeypatch.setenv("MAXINSTR_NO_NATIVE_COLUMNS", "1")
    t = read_rocpd(rs.write_rocpd(tmp_path / "run_results.db", views=views))
    assert t.format == "rocpd"
    _same_as_csv(t, csv_trace)
    assert t.thread_names[2684120] == "thread 2684120"


# ---- bad input ---------------------------------------------------------------------------------


def _copy_set(tmp_path):
    for f in LLAMA.iterdir():
        shutil.copy(f, tmp_path)
    return tmp_path / "decode_kernel_trace.csv"


def test_missing_column_names_file_and_column(tmp_path):
    f = _copy_set(tmp_path)
    with open(f, newline="") as fh:
        table = list(csv.reader(fh))
    drop = table[0].index("Correlation_Id")
    with open(f, "w", newline="") as fh:
        csv.writer(fh, quoting=csv.QUOTE_ALL).writerows([c for i, c in enumerate(r) if i != drop] for r in table)
    with pytest.raises(TraceError, match=r"decode_kernel_trace\.csv: column 'Correlation_Id' missing"):
        read_rocprof_csv(tmp_path)


def test_truncated_row_names_the_row(tmp_path):
    f = _copy_set(tmp_path)
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=r"decode_kernel_trace\.csv: row \d+ has \d+ fields"):
        read_rocprof_csv(f)


def test_empty_and_non_numeric(tmp_path):
    f = _copy_set(tmp_path)
    f.write_bytes(b"")
    with pytest.raises(TraceError, match="empty file"):
        read_rocprof_csv(tmp_path)
    f = tmp_path / "decode_hip_api_trace.csv"
    text = f.read_text().replace('"342331487543011"', '"12x"', 1)
    f.write_text(text)
    (tmp_path / "decode_kernel_trace.csv").unlink()
    # a time that is no integer: that row is dropped and said, the rest read
    t = read_rocprof_csv(tmp_path)
    n_rows = len(text.strip().splitlines()) - 1
    assert len(t.calls) == n_rows - 1
    assert ("decode_hip_api_trace.csv: 1 of %d rows dropped, their times are not valid "
            "(first: row 1: Start_Timestamp missing or not an integer)" % n_rows) in t.notes


def test_rocpd_missing_table(tmp_path):
    import sqlite3

    p = rs.write_rocpd(tmp_path / "x_results.db", views=False)
    con = sqlite3.connect(p)
    con.execute("DROP TABLE rocpd_kernel_dispatch_0000a1b2")
    con.commit()
    con.close()
    with pytest.raises(TraceError, match="lacks table 'rocpd_kernel_dispatch'"):
        read_rocpd(p)


def test_json_wrong_types(tmp_path):
    import json

    doc = rs.rocprof_json()
    doc["rocprofiler-sdk-tool"][0]["buffer_records"]["hip_api"][3]["start_timestamp"] = "soon"
    p = tmp_path / "bad_results.json"
    p.write_text(json.dumps(doc))
    t = read_rocprof_json(p)
    n_hip = len(doc["rocprofiler-sdk-tool"][0]["buffer_records"]["hip_api"])
    assert len(t.calls) == len(read_rocprof_json(rs.write_json(tmp_path / "good_results.json")).calls) - 1
    assert any(n.startswith("buffer_records.hip_api (pid ") and f": 1 of {n_hip} records dropped" in n
               and "(first: index 3: start_timestamp missing or not an integer)" in n for n in t.notes), t.notes
    doc["rocprofiler-sdk-tool"][0]["buffer_records"] = [1, 2]
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="buffer_records"):
        read_rocprof_json(p)


@pytest.mark.parametrize("folder", [DOCS, LLAMA], ids=["docs", "llamacpp"])
def test_csv_module_fallback_reads_the_same(monkeypatch, folder):
    """Without pandas (or when pandas balks) the csv-module path gives the identical trace."""
    import maxinstr.traces.rocprof as rocprof

    fast = read_rocprof_csv(folder)
    monkeypatch.setattr(rocprof, "_read_csv_pandas", lambda path: None)
    slow = read_rocprof_csv(folder)
    for table in ("ranges", "calls", "ops"):
        a, b = getattr(fast, table), getattr(slow, table)
        for col in a.__dataclass_fields__:
            if col == "name_id":
                assert names(fast, getattr(a, col)) == names(slow, getattr(b, col))
            else:
                assert np.array_equal(getattr(a, col), getattr(b, col)), (table, col)
    assert fast.notes == slow.notes


# ---- rocpd from the real Kokkos run (rocprof v1's rows re-encoded, rocprof_samples.py) ----------


@pytest.fixture(scope="module")
def kokkos_db():
    from maxinstr.traces.rocprof_v1 import read_rocprof_v1_db

    return read_rocprof_v1_db(rs.KOKKOS_DB)


@pytest.mark.parametrize("writer", ["rocprofv3", "rocprof-sys"])
def test_rocpd_writers_read_like_the_same_run(tmp_path, kokkos_db, writer):
    """rocprofv3's layout (correlation in stack_id, marker names in extdata, marks as samples) and
    rocprof-sys's (rocm_*_api categories, correlation_id, regions named by the message) give the
    ops, calls, ranges and stages the run's own results.db gives."""
    from maxinstr.attribute import attribute

    p = rs.write_rocpd_from_v1(tmp_path / f"{writer}.db", writer)
    t = read_rocpd(p)
    d = kokkos_db
    con = sqlite3.connect(p)
    assert len(t.ops) == sum(con.execute(f"SELECT count(*) FROM {x}").fetchone()[0]
                             for x in ("rocpd_kernel_dispatch", "rocpd_memory_copy")) == len(d.ops) == 38
    con.close()
    assert t.meta["correlation_column"] == ("rocpd_event.stack_id" if writer == "rocprofv3" else
                                            "rocpd_event.correlation_id")
    for a, b in ((t.ops, d.ops), (t.calls, d.calls), (t.ranges, d.ranges)):
        assert np.array_equal(a.start_ns, b.start_ns) and np.array_equal(a.end_ns, b.end_ns)
    assert np.array_equal(t.ops.correlation_id, d.ops.correlation_id)
    assert np.array_equal(t.calls.correlation_id, d.calls.correlation_id)
    assert names(t, t.ranges.name_id) == names(d, d.ranges.name_id)
    assert np.array_equal(t.ranges.style, d.ranges.style)  # 7 ranges, 2 marks
    a, b = attribute(t), attribute(d)
    assert np.array_equal(a.op_range, b.op_range) and np.array_equal(a.busy_ns, b.busy_ns)
    assert (a.op_range >= 0).sum() > 0


def test_rocpd_ranges_stored_at_pop_time_are_said(tmp_path, kokkos_db):
    """rocpd written by rocprof-sys before ROCm/rocm-systems PR #2793 holds each roctx range from
    its Pop call's entry to its exit: detected, kept as marks at the Pop time, and said."""
    from maxinstr.attribute import attribute

    t = read_rocpd(rs.write_rocpd_from_v1(tmp_path / "pre.db", "rocprof-sys-pre-2793"))
    d = kokkos_db
    assert np.all(t.ranges.style == RangeStyle.MARK)
    spans = d.ranges.style != RangeStyle.MARK
    assert sorted(t.ranges.start_ns.tolist()) == sorted(np.r_[d.ranges.end_ns[spans], d.ranges.start_ns[~spans]].tolist())
    note = next(n for n in t.notes if "PR #2793" in n)
    assert note.startswith("the 7 roctx ranges are instants at their Pop/Stop time") and "rocprof-sys" in note
    assert (attribute(t).op_range == -1).all()
    # the same file with real ranges says nothing of the kind
    ok = read_rocpd(rs.write_rocpd_from_v1(tmp_path / "post.db", "rocprof-sys"))
    assert not any("PR #2793" in n for n in ok.notes)
