"""Kineto reader against the real torch.profiler / HTA fixtures, counted from the raw JSON."""

from __future__ import annotations

import collections
import decimal
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from maxinstr.errors import TraceError
from maxinstr.traces.kineto import read_kineto, us_to_ns
from maxinstr.traces.model import NO_ID, CallKind, OpKind, RangeStyle

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"
FIXTURES = sorted(p.name for p in KINETO.glob("*.json.gz"))


def raw(name: str, **kw) -> dict:
    with gzip.open(KINETO / name, "rt") as fh:
        return json.load(fh, **kw)


def xs(doc: dict, *cats: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats]


@pytest.mark.parametrize("name", FIXTURES)
def test_counts_match_raw_events(name):
    doc = raw(name)
    t = read_kineto(KINETO / name)
    assert t.format == "kineto"
    host = xs(doc, "user_annotation", "cpu_op")
    calls = xs(doc, "cuda_runtime", "cuda_driver")
    ops = xs(doc, "kernel", "gpu_memcpy", "gpu_memset")
    assert len(t.ranges) == len(host)
    assert len(t.calls) == len({(e["cat"], e["args"]["correlation"]) for e in calls if "correlation" in e.get("args", {})})
    assert len(t.ops) == len(ops)
    assert collections.Counter(t.name(int(i)) for i in t.ranges.name_id) == collections.Counter(e["name"] for e in host)
    assert collections.Counter(t.name(int(i)) for i in t.ops.name_id) == collections.Counter(e["name"] for e in ops)
    kinds = collections.Counter(t.ops.kind.tolist())
    for cat, kind in (("kernel", OpKind.KERNEL), ("gpu_memcpy", OpKind.MEMCPY), ("gpu_memset", OpKind.MEMSET)):
        assert kinds.get(kind, 0) == len(xs(doc, cat))
    # every op's correlation id joins a call, as args.correlation says
    assert np.all(np.isin(t.ops.correlation_id, t.calls.correlation_id))
    for table in (t.ranges, t.calls, t.ops):
        assert np.all(np.diff(table.start_ns) >= 0)
        assert np.all(table.end_ns >= table.start_ns)
    assert np.all(t.ranges.style == RangeStyle.PUSH_POP)
    t.validate()


def test_h200_decode_stages_and_exact_nanoseconds():
    name = "h200_decode.pt.trace.json.gz"
    t = read_kineto(KINETO / name)
    ann = t.ranges.domain_id == list(t.strings).index("user_annotation")
    stages = collections.Counter(t.name(int(i)) for i in t.ranges.name_id[ann])
    assert stages == {"prefill": 1, "decode": 16, "sample": 16}
    # exact: decimal microseconds from the raw text -> integer ns
    doc = raw(name, parse_float=decimal.Decimal)
    want = sorted(int(decimal.Decimal(e["ts"]) * 1000) for e in xs(doc, "kernel"))
    assert sorted(t.ops.start_ns.tolist()) == want
    want_end = sorted(int(decimal.Decimal(e["ts"]) * 1000) + int(decimal.Decimal(e["dur"]) * 1000) for e in xs(doc, "kernel"))
    assert sorted(t.ops.end_ns.tolist()) == want_end
    assert not any("lose nanoseconds" in n for n in t.notes)
    # wall clock: ts is relative to baseTimeNanoseconds
    first = min(int(decimal.Decimal(e["ts"]) * 1000) for e in xs(doc, "user_annotation", "cpu_op", "cuda_runtime", "cuda_driver", "kernel"))
    assert t.session_start_utc_ns == doc["baseTimeNanoseconds"] + first
    assert t.thread_names == {484: "thread 484 (python3)"}
    assert len(t.meta["gpu_annotations"]) == len(xs(doc, "gpu_user_annotation")) == 33
    assert set(t.ops.pid.tolist()) == {484}
    assert set(t.calls.kind.tolist()) == {CallKind.RUNTIME, CallKind.DRIVER}


def test_rocm_trace_hip_names_and_copy_bytes_from_call():
    t = read_kineto(KINETO / "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert t.meta["runtime"] == "hip"
    assert all(t.name(int(i)).startswith("hip") for i in t.calls.name_id)
    copies = t.ops.kind == OpKind.MEMCPY
    # gpu_memcpy events carry no bytes on ROCm; the hipMemcpyWithStream call's size="2560" does
    assert t.ops.bytes[copies].tolist() == [2560, 2560]
    assert t.thread_names[598009] == "thread 598009 (pt_autograd_0)"


def test_cuda_copies_and_sets_carry_bytes():
    doc = raw("hta_benchmark_result_493459_1694039959_trace.json.gz")
    t = read_kineto(KINETO / "hta_benchmark_result_493459_1694039959_trace.json.gz")
    want = sum(e["args"]["bytes"] for e in xs(doc, "gpu_memcpy", "gpu_memset"))
    assert t.ops.bytes.sum() == want
    assert sorted(set(t.ops.stream_id.tolist())) == sorted({e["args"]["stream"] for e in xs(doc, "kernel", "gpu_memcpy", "gpu_memset")})
    # epoch-microsecond integer timestamps, no baseTimeNanoseconds: the start is already wall clock
    assert t.session_start_utc_ns // 10**9 == 1694039968


def test_triton_kernel_through_cuLaunchKernel():
    t = read_kineto(KINETO / "hta_triton_example.json.gz")
    (corr,) = t.ops.correlation_id
    i = list(t.calls.correlation_id).index(corr)
    assert t.name(int(t.calls.name_id[i])) == "cuLaunchKernel" and t.calls.kind[i] == CallKind.DRIVER


def test_plain_json_and_bare_event_list(tmp_path):
    doc = raw("hta_triton_example.json.gz")
    plain = tmp_path / "t.json"
    plain.write_text(json.dumps(doc))
    a = read_kineto(plain)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc["traceEvents"]))
    b = read_kineto(bare)
    assert (len(a.ops), len(a.calls), len(a.ranges)) == (len(b.ops), len(b.calls), len(b.ranges)) == (1, 2, 4)


def test_us_to_ns_precision_note():
    ns, err = us_to_ns(np.array([5373996908959.009, 1.5]))
    assert ns.tolist() == [5373996908959009, 1500] and err < 0.5
    _, err = us_to_ns(np.array([1694039968955744.5]))  # epoch us with a fraction: float64 cannot hold ns
    assert err > 0.5


def test_missing_correlation_taken_from_flow(tmp_path):
    doc = raw("hta_triton_example.json.gz")
    for e in xs(doc, "kernel"):
        del e["args"]["correlation"]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    t = read_kineto(p)
    assert t.ops.correlation_id.tolist() == [35]
    assert any("ac2g" in n for n in t.notes)


def test_bad_inputs(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"traceEvents": 5}')
    with pytest.raises(TraceError, match="bad.json: no 'traceEvents' list"):
        read_kineto(p)
    doc = raw("hta_triton_example.json.gz")
    xs(doc, "kernel")[0]["ts"] = "yesterday"
    p.write_text(json.dumps(doc))
    # the trace's one kernel has no valid time: nothing of the table is left, an error
    with pytest.raises(TraceError, match=r"bad.json: 'kernel' events: the one event has invalid times "
                                         r"\(traceEvents\[\d+\]: ts missing or not a number\)"):
        read_kineto(p)
    doc = raw("hta_triton_example.json.gz")
    xs(doc, "kernel")[0]["tid"] = [1]
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="bad.json: kernel: tid: event 1 holds a JSON array where a number belongs"):
        read_kineto(p)
    doc = raw("hta_triton_example.json.gz")
    xs(doc, "kernel")[0]["ts"] = 1e300
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"ts beyond 2\*\*62 ns"):
        read_kineto(p)
    doc["traceEvents"][3] = "not an event"
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"bad.json: not a Kineto / Chrome trace: traceEvents\[3\] is a string, not an event object"):
        read_kineto(p)
    p.write_bytes(gzip.compress(b'{"traceEvents": [')[:-3])
    with pytest.raises(TraceError, match="gzip"):
        read_kineto(p)
    assert NO_ID == -1


def test_h200_graph_replays_and_worker_thread_attribution():
    """The H200 capture of benchmarks/device/25-kineto.sh: kernels replayed by cudaGraphLaunch
    belong to the `graph_replay` range that launched them; kernels launched by a worker thread
    with no range of its own go to the main thread's open range, marked CROSS_THREAD. The
    expectations are counted from the raw JSON here, not stored."""
    from maxinstr.attribute.attribute import attribute
    from maxinstr.attribute.model import Rule

    name = "h200_graph_threads.pt.trace.json.gz"
    doc = raw(name)
    calls = xs(doc, "cuda_runtime", "cuda_driver")
    main_tid = next(e["tid"] for e in xs(doc, "user_annotation") if e["name"] == "main_with_worker")
    graph_corr = {e["args"]["correlation"] for e in calls if e["name"] == "cudaGraphLaunch"}
    worker_corr = {e["args"]["correlation"] for e in calls if e["tid"] != main_tid}
    kernels = xs(doc, "kernel")
    n_graph = sum(k["args"]["correlation"] in graph_corr for k in kernels)
    n_worker = sum(k["args"]["correlation"] in worker_corr for k in kernels)
    assert n_graph and n_worker  # the capture has both patterns

    t = read_kineto(KINETO / name)
    att = attribute(t)
    owner = np.array([t.name(int(t.ranges.name_id[r])) if r >= 0 else "" for r in att.op_range])
    is_kernel = t.ops.kind == OpKind.KERNEL
    graph = is_kernel & (att.op_rule == Rule.GRAPH)
    cross = is_kernel & (att.op_rule == Rule.CROSS_THREAD)
    assert int(graph.sum()) == n_graph == int((t.ops.graph_node_id >= 0).sum())
    assert set(owner[graph]) == {"graph_replay"}
    assert int(cross.sum()) == n_worker
    assert set(owner[cross]) == {"main_with_worker"}
    replays = [i for i in range(len(t.ranges)) if t.name(int(t.ranges.name_id[i])) == "graph_replay"]
    assert len(replays) == len(graph_corr) and len({int(att.op_count[i]) for i in replays}) == 1
