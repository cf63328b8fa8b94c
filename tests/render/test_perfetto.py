"""Perfetto / Chrome trace JSON: valid, complete (event counts equal the model's), units right,
slices of one track properly nested, sampler metrics as counter tracks, one clock."""

from __future__ import annotations

import gzip
import io
import json
import os
import threading
from collections import Counter, defaultdict

import numpy as np
import pytest

from maxinstr.analyze.report import analyze
from maxinstr.analyze.timeline import align, lanes, timeline
from maxinstr.errors import MaxinstrError
from maxinstr.render import perfetto
from views_data import DATA, recorded_run


def _nested(events: list[dict]) -> list[str]:
    """Problems with X slices of one (pid, tid) that cross instead of nesting."""
    tracks: dict[tuple, list] = defaultdict(list)
    for ev in events:
        if ev["ph"] == "X":
            s = round(ev["ts"] * 1000)
            tracks[(ev["pid"], ev["tid"])].append((s, -round(ev["dur"] * 1000), s + round(ev["dur"] * 1000), ev["name"]))
    bad = []
    for key, rows in tracks.items():
        stack: list[int] = []
        for s, _, e, name in sorted(rows):
            while stack and stack[-1] <= s:
                stack.pop()
            if stack and e > stack[-1]:
                bad.append(f"{key}: {name} [{s}, {e}] crosses a slice ending at {stack[-1]}")
            stack.append(e)
    return bad


@pytest.fixture(scope="module")
def decode():
    a = analyze(trace=str(DATA / "nsys" / "h200_decode.sqlite"))
    doc = json.loads(perfetto.render(a.report, analysis=a))
    return a, doc


def test_trace_only_counts_equal_the_model(decode):
    a, doc = decode
    ev = doc["traceEvents"]
    meta = doc["metadata"]["maxinstr"]
    inst, trace = a.instances, a.trace
    stage_x = [e for e in ev if e["ph"] == "X" and e["cat"].split(",")[0] == "stage" and e["pid"] < perfetto.PID_BASE]
    assert len(stage_x) == len(inst) == 150 == meta["counts"]["stage_ranges"]
    assert Counter(e["name"] for e in stage_x) == Counter(inst.name.astype(str).tolist())
    spans = [e for e in ev if e["ph"] == "X" and e["pid"] == perfetto.SPANS_PID]
    assert len(spans) == int((inst.proj_start_ns >= 0).sum()) == meta["counts"]["gpu_projected_spans"]
    ops = [e for e in ev if e["ph"] == "X" and e["pid"] >= perfetto.GPU_PID]
    assert len(ops) == len(trace.ops) == 1730
    assert Counter(e["cat"] for e in ops)["memcpy"] == int((trace.ops.kind == 1).sum()) == 111
    # every kernel slice names its family and, when attributed, its stage
    assert {e["cat"] for e in ops} >= {"gemm", "normalization", "elementwise"}
    staged = sum(1 for e in ops if e["args"]["stage"] is not None)
    assert staged == int((a.attribution.op_range >= 0).sum())
    assert meta["clock"]["method"] == "trace_only"


def test_units_pid_tid_and_times(decode):
    a, doc = decode
    ev = doc["traceEvents"]
    origin = doc["metadata"]["maxinstr"]["origin_ns"]
    ops = a.trace.ops
    # kernels: ts is microseconds from origin_ns, dur microseconds; exact to the nanosecond
    by_corr = {e["args"]["correlation_id"]: e for e in ev if e["ph"] == "X" and e["pid"] >= perfetto.GPU_PID}
    for i in (0, 100, len(ops) - 1):
        e = by_corr[int(ops.correlation_id[i])]
        assert isinstance(e["ts"], float) or isinstance(e["ts"], int)
        assert round(e["ts"] * 1000) + origin == int(ops.start_ns[i])
        assert round(e["dur"] * 1000) == int(ops.end_ns[i] - ops.start_ns[i])
        assert e["pid"] == perfetto.GPU_PID + int(ops.device_id[i])
    # stage slices sit on the real host pid/tid of their range
    stage_x = [e for e in ev if e["ph"] == "X" and e["cat"].startswith("stage") and e["pid"] < perfetto.PID_BASE]
    assert {(e["pid"], e["tid"]) for e in stage_x} == {(465, 465)}
    decode_us = np.median([e["dur"] for e in stage_x if e["name"] == "decode" and e["cat"] == "stage"])
    assert decode_us == pytest.approx(a.report["stages"][2]["host_ns"]["median"] / 1e3)  # 813.7 us, in microseconds
    # tracks are named: streams, the host thread, the GPU
    names = {(e["pid"], e["tid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert (465, 465, "python3 465") in names
    assert {n for p, _, n in names if p == perfetto.GPU_PID} == {"stream 7", "stream 13", "stream 17", "stream 21"}


def test_slices_nest_on_every_track(decode):
    _, doc = decode
    assert _nested(doc["traceEvents"]) == []


def test_lanes_split_crossing_slices():
    # the real decode trace: stage spans of 'request' contain 'decode' spans; put them in one
    # group and the lanes must separate every crossing pair
    a = analyze(trace=str(DATA / "nsys" / "h200_decode.sqlite"))
    inst = a.instances
    ok = inst.proj_start_ns >= 0
    s, e = inst.proj_start_ns[ok], inst.proj_end_ns[ok]
    lane = lanes(np.zeros(len(s), np.int64), s, e)
    assert lane.max() >= 1  # request spans overlap their decode spans
    for k in np.unique(lane):
        o = np.argsort(s[lane == k])
        ss, ee = s[lane == k][o], e[lane == k][o]
        assert (ss[1:] >= ee[:-1]).all()


def test_every_fixture_gives_valid_json():
    for path in ("kineto/h200_decode.pt.trace.json.gz", "nsys/cs336_two_threads_nsys2025.1.sqlite",
                 "rocprof/rpd", "nsys/pipit_cloverleaf_no_nvtx_nsys2024.5.sqlite"):
        p = DATA / path
        if p.is_dir():
            p = next(p.glob("*.rpd"), None) or p
        a = analyze(trace=str(p))
        doc = json.loads(perfetto.render(a.report, analysis=a))
        ops = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] >= perfetto.GPU_PID]
        assert len(ops) == len(a.trace.ops), path
        assert _nested(doc["traceEvents"]) == [], path


def test_run_directory_with_samples(tmp_path, monkeypatch):
    run = recorded_run(tmp_path / "run", monkeypatch)
    a = analyze(run=str(run))
    buf = io.StringIO()
    meta = perfetto.write(buf, a.report, analysis=a)
    doc = json.loads(buf.getvalue())
    ev = doc["traceEvents"]
    stages = a.run.stages
    x = [e for e in ev if e["ph"] == "X" and e["pid"] < perfetto.PID_BASE]
    marks = [e for e in ev if e["ph"] == "i"]
    assert len(x) + len(marks) == len(stages) == 17
    assert [e["name"] for e in marks] == ["done"]
    # the session's own process and thread
    assert {(e["pid"], e["tid"]) for e in x} == {(os.getpid(), threading.get_native_id())}
    origin = meta["origin_ns"]
    first = min(x, key=lambda e: e["ts"])
    assert round(first["ts"] * 1000) + origin == int(stages["host_start_ns"].min())
    assert meta["clock"]["method"] == "run_only" and meta["clock"]["axis"] == "host"
    # counter tracks: one event per finite sample of each metric
    smp = a.run.samples[next(iter(a.run.samples))]
    counters = [e for e in ev if e["ph"] == "C"]
    by_name = Counter(e["name"] for e in counters)
    assert by_name["GPU 0 util"] == int(np.isfinite(smp.column("gpu_util_pct")).sum()) > 100
    assert by_name["GPU 0 power"] == int(np.isfinite(smp.column("power_w")).sum())
    assert by_name["GPU 0 SM active"] == int(np.isfinite(smp.column("sm_active_pct")).sum()) > 5
    assert meta["counts"]["counter_samples"] == len(counters)
    power = [e["args"]["W"] for e in counters if e["name"] == "GPU 0 power"]
    assert 100 < max(power) <= 800  # real H200 watts, not milliwatts
    assert all(e["pid"] == perfetto.GPU_PID for e in counters)
    assert _nested(ev) == []


def test_run_with_a_foreign_trace_is_start_aligned(tmp_path, monkeypatch):
    # a real run and a real trace that is not its own: no record joins a range, so the trace is
    # lined up by its start and the metadata says so
    run = recorded_run(tmp_path / "run", monkeypatch)
    a = analyze(run=str(run), trace=str(DATA / "nsys" / "h200_decode.sqlite"))
    clock = align(a)
    assert clock.method == "start_aligned" and clock.pairs == 0
    first_trace = min(int(a.trace.ranges.start_ns.min()), int(a.trace.ops.start_ns.min()))
    assert clock.offset_ns == first_trace - int(a.instances.host_start_ns.min())
    doc = json.loads(perfetto.render(a.report, analysis=a))
    assert doc["metadata"]["maxinstr"]["clock"]["method"] == "start_aligned"
    assert "approximate" in doc["metadata"]["maxinstr"]["clock"]["note"]


def test_write_gzip_and_saved_report_error(tmp_path, decode):
    a, doc = decode
    out = tmp_path / "t.json.gz"
    meta = perfetto.write(out, a.report, analysis=a)
    with gzip.open(out, "rt") as fh:
        back = json.load(fh)
    assert len(back["traceEvents"]) == len(doc["traceEvents"])
    assert meta["counts"] == doc["metadata"]["maxinstr"]["counts"]
    with pytest.raises(MaxinstrError, match="saved JSON report"):
        perfetto.render(a.report, analysis=None)


def test_cli_writes_perfetto(tmp_path):
    from click.testing import CliRunner

    from maxinstr.cli.report import command

    out = tmp_path / "t.json"
    res = CliRunner().invoke(command, ["--trace", str(DATA / "nsys" / "h200_decode.sqlite"), "--format", "perfetto",
                                       "-o", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["metadata"]["maxinstr"]["counts"]["ops"] == 1730


def test_run_with_a_monotonic_clock_trace_needs_no_offset(tmp_path, monkeypatch):
    # rocprof/RPD traces are on CLOCK_MONOTONIC, the run's own clock: with nothing joined the
    # offset is 0 and the metadata says why
    run = recorded_run(tmp_path / "run", monkeypatch)
    a = analyze(run=str(run), trace=str(DATA / "rocprof" / "rpd" / "matmul_result.rpd"))
    assert "MONOTONIC" in a.trace.clock
    clock = align(a)
    assert clock.method == "same_clock" and clock.offset_ns == 0


def test_launch_calls_and_flows(decode):
    a, doc = decode
    ev = doc["traceEvents"]
    calls, ops = a.trace.calls, a.trace.ops
    api = [e for e in ev if e["ph"] == "X" and e["cat"] == "api"]
    assert len(api) == len(calls) == 1082
    assert all(e["ts"] >= 0 for e in ev if "ts" in e)  # the origin is the earliest event of any kind
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == doc["metadata"]["maxinstr"]["counts"]["launch_flows"]
    # every op of this trace has its launch call (graph replays share one): 1730 arrows
    assert len(starts) == len(ops)
    for fid in (1, 500, len(ops)):  # flow k starts at the launch call of op k-1 and ends at that op
        s, f = starts[fid], ends[fid]
        assert f["ts"] >= s["ts"]  # the GPU runs what was launched, later
        corr = int(ops.correlation_id[fid - 1])
        assert any(c["args"]["correlation_id"] == corr for c in api
                   if (c["pid"], c["tid"], c["ts"]) == (s["pid"], s["tid"], s["ts"]))
        op = next(e for e in ev if e["ph"] == "X" and e["pid"] == f["pid"] and e["tid"] == f["tid"] and e["ts"] == f["ts"])
        assert op["args"]["correlation_id"] == corr


def _shifted_fixture_run(tmp_path, shift_ns: int):
    """The run directory behind the real h200_decode capture (its records rebuilt from the NVTX
    ranges: payload = record id; tests/helpers/fixture_columns.py), loaded with its host clock
    moved by ``shift_ns``: host clock and trace clock differ, as CLOCK_MONOTONIC and nsys's do."""
    import maxinstr
    from helpers.fixture_columns import run_from_nsys_fixture

    run = maxinstr.load(run_from_nsys_fixture(tmp_path / "run", "h200_decode", warmup=1))
    run.stages["host_start_ns"] += shift_ns
    run.stages["host_end_ns"] += shift_ns
    return analyze(run=run, trace=str(DATA / "nsys" / "h200_decode.sqlite"))


def test_offset_from_payload_matched_pairs(tmp_path):
    shift = 123_456_789_012
    a = _shifted_fixture_run(tmp_path, shift)
    clock = align(a)
    assert (clock.method, clock.join, clock.pairs) == ("matched_pairs", "payload", 150)
    assert clock.offset_ns == -shift and clock.spread_ns == 0.0
    doc = json.loads(perfetto.render(a.report, analysis=a))
    meta = doc["metadata"]["maxinstr"]
    assert meta["clock"]["offset_ns"] == -shift and meta["clock"]["axis"] == "host"
    origin = meta["origin_ns"]
    ops = a.trace.ops
    first = min((e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] >= perfetto.GPU_PID),
                key=lambda e: e["ts"])
    assert round(first["ts"] * 1000) + origin == int(ops.start_ns.min()) + shift  # kernels on the host clock
    # on one axis, no joined stage's GPU work starts before the host range that launched it
    tl = timeline(a)
    j = (a.instances.range_index >= 0) & (tl.proj_start_ns >= 0)
    assert j.sum() == 150 and (tl.proj_start_ns[j] >= a.instances.host_start_ns[j]).all()
    assert _nested(doc["traceEvents"]) == []


def test_framework_ranges_beside_the_stages():
    # the real Kineto decode trace: record_function stages plus 2,901 aten/cpu_op ranges
    a = analyze(trace=str(DATA / "kineto" / "h200_decode.pt.trace.json.gz"))
    doc = json.loads(perfetto.render(a.report, analysis=a))
    ev = doc["traceEvents"]
    ranges = [e for e in ev if e["ph"] == "X" and e["cat"].startswith("range,")]
    assert len(ranges) == len(a.trace.ranges) - len(a.instances) == doc["metadata"]["maxinstr"]["counts"]["trace_ranges"]
    assert any(e["name"].startswith("cpu_op:aten::") for e in ranges)
    assert {e["tid"] for e in ranges}.isdisjoint({e["tid"] for e in ev if e["ph"] == "X" and e["cat"] == "stage"})
    assert _nested(ev) == []


def test_throttle_track_from_real_samples(tmp_path, monkeypatch):
    # the replayed H200 rows carry sw_power_cap throttling: a 0/1 track written where it changes
    run = recorded_run(tmp_path / "run", monkeypatch)
    a = analyze(run=str(run))
    doc = json.loads(perfetto.render(a.report, analysis=a))
    thr = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "GPU 0 hw throttled"]
    smp = a.run.samples[next(iter(a.run.samples))]
    on = smp.hw_throttled()
    assert len(thr) == 1 + int((on[1:] != on[:-1]).sum()) >= 2
    assert [e["args"]["on"] for e in thr][:2] in ([0, 1], [1, 0])
