"""kernels=True without CUPTI (the CPU/CI path), and the record-to-model conversion of
in-process activity (maxinstr.traces.inprocess) on activity rows written for a real run's
stage records."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import maxinstr
from maxinstr.analyze.report import build_report
from maxinstr.attribute.attribute import attribute
from maxinstr.attribute.model import JoinMethod, Rule
from maxinstr.rundir.activity import (
    ACTIVITY_DTYPE,
    KIND_DRIVER,
    KIND_EXTERNAL,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_RUNTIME,
    ActivityWriter,
    read_part_activity,
)
from maxinstr.rundir import load
from maxinstr.rundir.activity import to_collector_clock
from maxinstr.traces.inprocess import read_run, to_host_clock
from maxinstr.traces.model import OpKind

pytest.importorskip("maxinstr._native", reason="maxinstr._native is not built")


def _cupti_usable() -> bool:
    try:
        from cupti import cupti  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return Path("/dev/nvidia0").exists()


def test_kernels_true_without_cupti_warns_once_and_records_stages(tmp_path):
    if _cupti_usable():
        pytest.skip("CUPTI is usable here: the fallback path is tested on machines without it")
    run_dir = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # two sessions: one warning per process and reason
            with maxinstr.session(run_dir, kernels=True, sample_hz=0):
                for i in range(3):
                    with maxinstr.stage("work", step=i):
                        pass
    ours = [w for w in caught if "kernels=True" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["kernels"]["requested"] is True and meta["kernels"]["status"] == "unavailable"
    assert meta["kernels"]["reason"] in str(ours[0].message)
    run = load(run_dir)
    assert len(run.stages) == 3
    (act,) = list(run_dir.glob("parts/*/activity.json"))
    assert json.loads(act.read_text())["status"] == "unavailable"
    report = build_report(run_dir)
    assert report["sources"]["trace"] is None
    assert any("kernels=True collected nothing" in n for n in report["sources"]["notes"])
    assert [s["name"] for s in report["stages"]] == ["work"]


def test_host_clock_mapping_keeps_ns_with_large_epochs_and_drift():
    host = np.array([1_000_000_000, 2_000_000_000], np.int64)
    coll = np.array([1_700_000_000_000_000_000, 1_700_000_001_000_000_500], np.int64)  # 500 ns drift per s
    pairs = np.column_stack([host, coll]).tolist()
    ts = np.array([coll[0], coll[0] + 500_000_250, coll[1], coll[1] + 10], np.int64)
    got, mapped = to_host_clock(ts, pairs)
    assert mapped
    assert got.tolist() == [host[0], host[0] + 500_000_000, host[1], host[1] + 10]
    same, mapped1 = to_host_clock(ts[:1], pairs[:1])
    assert mapped1 and same.tolist() == [host[0]]
    raw, mapped0 = to_host_clock(ts, [])
    assert not mapped0 and raw.tolist() == ts.tolist()
    # the launch tags' direction (host -> collector) is its inverse, to the ns
    back = to_collector_clock(got, pairs)
    assert back.tolist() == ts.tolist()
    assert to_collector_clock(ts, []).tolist() == ts.tolist()


def _synthetic_activity(run_dir: Path, offset_ns: int) -> dict:
    """Activity rows for the run's real stage records: per innermost stage k kernels, one
    memcpy in 'load', one memset, ops launched outside any stage, and a graph replay; API rows
    with correlation ids; external-correlation rows naming the stage ids. Returns the truth."""
    run = load(run_dir)
    st = run.stages
    names = run.stage_names()
    rows: list[tuple] = []
    corr = 100
    truth: dict[int, dict[str, int]] = {}
    kname = ["gemm_kernel", "add_kernel", "softmax_kernel"]
    api_names = ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync", "cuGraphLaunch", "cuLaunchKernel"]
    all_names = kname + api_names
    nid = {n: i for i, n in enumerate(all_names)}
    cbid = {"cudaLaunchKernel": 211, "cudaMemcpyAsync": 41, "cudaMemsetAsync": 51, "cuGraphLaunch": 514, "cuLaunchKernel": 307}

    def launch(kind: int, stage_id: int, t_host: int, dur: int, api: str, name: str | None = None, nbytes: int = 0,
               graph_nodes: int = 0) -> None:
        nonlocal corr
        corr += 1
        c = corr
        t = t_host + offset_ns
        api_kind = KIND_DRIVER if api.startswith("cu") and not api.startswith("cuda") else KIND_RUNTIME
        rows.append((api_kind, 0, 0, nid[api], t, t + 500, c, -1, -1, 4242, -1, 0, -1, cbid[api]))
        if stage_id >= 0:
            rows.append((KIND_EXTERNAL, 0, 0, -1, 0, 0, c, stage_id, -1, -1, -1, 0, -1, 5))
        for g in range(max(1, graph_nodes)):
            start = t + 2_000 + g * (dur + 100)
            rows.append((kind, 8 if kind == KIND_MEMCPY else 0, 0, nid[name] if name else -1, start, start + dur, c, -1, 7,
                         -1, (1000 + g) if graph_nodes else 0, nbytes, 0, -1))  # fmt: skip
        if stage_id >= 0:
            tr = truth.setdefault(stage_id, {"kernels": 0, "kernel_ns": 0, "memcpy": 0, "memset": 0, "launches": 0, "graph": 0})
            tr["launches"] += 1
            n = max(1, graph_nodes)
            if kind == KIND_KERNEL:
                tr["kernels"] += n
                tr["kernel_ns"] += n * dur
                tr["graph"] += graph_nodes
            elif kind == KIND_MEMCPY:
                tr["memcpy"] += 1
            else:
                tr["memset"] += 1

    for k in range(len(st)):
        rid, name = int(st["id"][k]), str(names[k])
        t0 = int(st["host_start_ns"][k])
        if name == "load":
            launch(KIND_MEMCPY, rid, t0, 3_000, "cudaMemcpyAsync", nbytes=1 << 20)
            launch(KIND_MEMSET, rid, t0 + 10, 1_000, "cudaMemsetAsync", nbytes=4096)
        elif name == "compute":
            for j in range(3):
                launch(KIND_KERNEL, rid, t0 + j, 10_000 + 1000 * j, "cudaLaunchKernel", kname[j])
        elif name == "graph":
            launch(KIND_KERNEL, rid, t0, 4_000, "cuGraphLaunch", "add_kernel", graph_nodes=3)
        elif name == "step":  # launched in the parent, between children
            launch(KIND_KERNEL, rid, t0, 2_000, "cuLaunchKernel", "add_kernel")
    launch(KIND_KERNEL, -1, int(st["host_start_ns"].min()) - 50_000, 5_000, "cudaLaunchKernel", "gemm_kernel")  # outside

    part_dir = run_dir / "parts" / run.parts[0]["name"]
    w = ActivityWriter(part_dir, {"part": run.parts[0]["name"], "pid": int(run.parts[0]["pid"])})
    arr = np.array(rows, dtype=ACTIVITY_DTYPE)
    w.write(arr[: len(arr) // 2], all_names[:4])  # two flushes, names arriving in two batches
    w.write(arr[len(arr) // 2 :], all_names)
    lo = int(st["host_start_ns"].min())
    w.write_meta(status="closed", collector="cupti", external_kind=5,
                 clock_pairs=[[lo, lo + offset_ns], [lo + 10**9, lo + 10**9 + offset_ns]])  # fmt: skip
    return {"truth": truth, "rows": len(arr)}


@pytest.fixture
def synthetic_run(tmp_path):
    run_dir = tmp_path / "run"
    with maxinstr.session(run_dir, sample_hz=0, warmup=1):
        for i in range(3):
            with maxinstr.stage("step", step=i):
                with maxinstr.stage("load"):
                    pass
                with maxinstr.stage("compute"):
                    pass
                with maxinstr.stage("graph"):
                    pass
    return run_dir, _synthetic_activity(run_dir, offset_ns=1_700_000_000_000_000_000)


def test_conversion_attributes_each_op_to_the_stage_that_launched_it(synthetic_run):
    run_dir, made = synthetic_run
    meta, rows, names = read_part_activity(next((run_dir / "parts").iterdir()))
    assert len(rows) == made["rows"] and "gemm_kernel" in names
    run = load(run_dir)
    trace, notes = read_run(run)
    assert trace is not None and trace.format == "maxinstr-inprocess" and trace.clock == "CLOCK_MONOTONIC"
    trace.validate()
    O = trace.ops
    assert (O.start_ns >= run.stages["host_start_ns"].min() - 100_000).all()  # mapped onto the host clock
    assert int((O.kind == OpKind.MEMCPY).sum()) == 3 and int((O.kind == OpKind.MEMSET).sum()) == 3
    assert {trace.name(int(i)) for i in O.name_id[O.kind == OpKind.MEMCPY]} == {"[CUDA memcpy Device-to-Device]"}
    att = attribute(trace, run)
    assert att.join_method == JoinMethod.PAYLOAD
    assert int((att.op_range < 0).sum()) == 1  # the launch outside every stage
    rid = att.range_record_id
    truth = made["truth"]
    for r in range(len(trace.ranges)):
        own = {k: 0 for k in ("kernels", "kernel_ns", "memcpy", "memset", "launches")}
        # inclusive totals: the stage's own launches plus its children's
        for sid, t in truth.items():
            k = np.flatnonzero(run.stages["id"] == sid)[0]
            if sid == rid[r] or run.stages["parent_id"][k] == rid[r]:
                for key in own:
                    own[key] += t[key]
        assert att.kernel_count[r] == own["kernels"]
        assert att.kernel_ns[r] == own["kernel_ns"]
        assert att.launch_count[r] == own["launches"]
        assert int(att.op_count[r]) == own["kernels"] + own["memcpy"] + own["memset"]
    graph_ops = O.graph_node_id >= 0
    assert graph_ops.sum() == 9 and (att.op_rule[graph_ops] == Rule.GRAPH).all()
    assert (att.op_rule[(att.op_range >= 0) & ~graph_ops] == Rule.SAME_THREAD).all()
    calls = trace.calls
    assert len(calls) == len(np.unique(O.correlation_id))
    staged = np.isin(calls.tid, run.stages["tid"])
    assert staged.sum() == len(calls) - 1 and (calls.tid[~staged] == 4242).all()  # the outside call keeps CUPTI's tid


def test_report_without_trace_picks_up_in_process_kernels(synthetic_run):
    run_dir, made = synthetic_run
    report = build_report(run_dir)
    src = report["sources"]
    assert src["trace_format"] == "maxinstr-inprocess" and src["join"] == "payload"
    assert report["perturbed"] and "in-process" in report["perturbed_reason"]
    assert not any("--trace" in r["command"] for r in report["reproduce"])
    assert report["gpu"] is not None
    kernels = {k["name"] for k in report["gpu"]["kernels"]}
    assert {"gemm_kernel", "add_kernel", "softmax_kernel"} <= kernels


def test_dropped_and_unclosed_are_said(synthetic_run):
    run_dir, _ = synthetic_run
    part_dir = next((run_dir / "parts").iterdir())
    meta = json.loads((part_dir / "activity.json").read_text())
    meta.update(status="collecting", dropped_cupti=17, dropped_queue=3)
    (part_dir / "activity.json").write_text(json.dumps(meta))
    with open(part_dir / "activity.bin", "ab") as f:
        f.write(b"\0" * 11)  # a torn row
    trace, notes = read_run(load(run_dir))
    text = "\n".join(trace.notes)
    assert "17 activity records dropped by CUPTI" in text and "3 activity records dropped by maxinstr" in text
    assert "did not close" in text and "torn row" in text
    report = build_report(run_dir)
    assert any("dropped by CUPTI" in n for n in report["sources"]["notes"])


def test_an_op_whose_launch_call_has_no_record_is_said(synthetic_run):
    """kernels=True keeps API records only for launch/copy/set functions: an op launched by a
    function left out would have no launch call; the report says how many, not silently."""
    run_dir, _ = synthetic_run
    assert not any("launch-call record" in n for n in read_run(load(run_dir))[1])
    part_dir = next((run_dir / "parts").iterdir())
    rows = np.fromfile(part_dir / "activity.bin", dtype=ACTIVITY_DTYPE)
    kernels = np.flatnonzero(rows["kind"] == KIND_KERNEL)
    cut = rows["correlation_id"][kernels[:2]]
    keep = ~(np.isin(rows["correlation_id"], cut) & ((rows["kind"] == KIND_RUNTIME) | (rows["kind"] == KIND_DRIVER)))
    rows[keep].tofile(part_dir / "activity.bin")
    trace, notes = read_run(load(run_dir))
    assert any("2 GPU ops have no launch-call record" in n for n in notes), notes
    assert len(trace.ops) == int((rows["kind"] <= KIND_MEMSET).sum())  # the ops are still there


def test_malformed_activity_file_is_one_line_naming_it(tmp_path):
    from maxinstr.errors import RunDirError

    (tmp_path / "activity.json").write_text("{not json")
    with pytest.raises(RunDirError, match=r"activity\.json: not valid JSON"):
        read_part_activity(tmp_path)
    (tmp_path / "activity.json").write_text(json.dumps({"format": "maxinstr-activity", "version": 1}))
    (tmp_path / "activity.bin").write_bytes(np.array([(9,) + (0,) * 13], ACTIVITY_DTYPE).tobytes())
    with pytest.raises(RunDirError, match=r"activity\.bin: none of its 1 row\(s\) is an activity record \(row 0: kind 9 "):
        read_part_activity(tmp_path)
    # one bad row among good ones is that row only: skipped, counted and said
    (tmp_path / "activity.bin").write_bytes(np.array([(0, 0, 0, -1) + (0,) * 10, (9,) + (0,) * 13], ACTIVITY_DTYPE).tobytes())
    meta, rows, _ = read_part_activity(tmp_path)
    assert len(rows) == 1 and rows["kind"][0] == 0
    assert meta["notes"] == [f"{tmp_path / 'activity.bin'}: skipped 1 of 2 row(s) that are not activity records "
                             "(first: row 1, kind 9 is not 0 to 5)"]


def test_kernel_names_are_demangled_like_nsys_when_cxxfilt_is_there():
    import shutil

    from maxinstr.traces.inprocess import demangle

    names = ["_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_", "ampere_bf16_s1688gemm_bf16_128x128", "cudaLaunchKernel"]
    out = demangle(names)
    assert out[1:] == names[1:]  # plain names untouched
    if shutil.which("c++filt"):
        assert out[0].startswith("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>")
    else:
        assert out[0] == names[0]


def test_kernels_true_on_a_joined_session_is_taken_up_by_the_host(tmp_path):
    if _cupti_usable():
        pytest.skip("CUPTI is usable here: the fallback path is tested on machines without it")
    outer = tmp_path / "outer"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one warning per process may have been given already
        with maxinstr.session(outer, sample_hz=0):
            with maxinstr.session(None, kernels=True):  # joins the outer session
                with maxinstr.stage("x"):
                    pass
    meta = json.loads((outer / "meta.json").read_text())
    assert meta["kernels"]["requested"] is True and meta["kernels"]["status"] == "unavailable"
    assert list(outer.glob("parts/*/activity.json"))


def test_open_trace_reads_a_run_directory_with_in_process_kernels(synthetic_run, tmp_path):
    from maxinstr.errors import TraceError
    from maxinstr.traces import open_trace

    run_dir, _ = synthetic_run
    trace = open_trace(run_dir)
    assert trace.format == "maxinstr-inprocess" and len(trace.ops) == len(read_run(load(run_dir))[0].ops)
    empty = tmp_path / "empty_run"
    with maxinstr.session(empty, kernels=True, sample_hz=0):
        pass
    if not _cupti_usable():
        with pytest.raises(TraceError, match="without in-process kernels"):
            open_trace(empty)
