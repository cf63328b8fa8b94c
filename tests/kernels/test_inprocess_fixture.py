"""Record-to-model conversion on raw activity records saved from real H200 runs
(benchmarks/device/15-cupti.sh, step 4: the kernels=True run of benchmarks/cupti_check.py).

Each fixture folder holds one part's files as the session wrote them (activity.bin,
activity_names.jsonl, activity.json, stages.bin, strings.jsonl, part.json) plus the run's
meta.json and expected.json (what the conversion gave on the device): tests/data/cupti/h200_small/
from the API + external-correlation records (06:38 UTC), h200_small_tags/ from the launch tags
(kernels=True's default since; 14:20 UTC)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from maxinstr.analyze.report import build_report
from maxinstr.attribute.attribute import attribute
from maxinstr.attribute.model import JoinMethod
from maxinstr.rundir import load
from maxinstr.traces.inprocess import read_run
from maxinstr.traces.model import OpKind

DATA = Path(__file__).resolve().parents[1] / "data" / "cupti"
FIXTURE = DATA / "h200_small"  # the API + external-correlation records
FIXTURE_TAGS = DATA / "h200_small_tags"  # the launch tags
PART_FILES = ("activity.bin", "activity_names.jsonl", "activity.json", "stages.bin", "strings.jsonl", "attrs.jsonl", "part.json")


@pytest.fixture(params=[FIXTURE, FIXTURE_TAGS], ids=["records", "tags"])
def fixture_dir(request) -> Path:
    return request.param


@pytest.fixture
def run_dir(tmp_path, fixture_dir):
    return _copy_run(fixture_dir, tmp_path)


def _copy_run(fixture: Path, tmp_path: Path) -> Path:
    part = json.loads((fixture / "part.json").read_text())
    root = tmp_path / "run"
    pdir = root / "parts" / part["part"]
    pdir.mkdir(parents=True)
    for f in PART_FILES:
        if (fixture / f).is_file():
            shutil.copy(fixture / f, pdir / f)
    shutil.copy(fixture / "meta.json", root / "meta.json")
    return root


def test_fixture_converts_to_the_model_it_gave_on_the_device(run_dir, fixture_dir):
    expected = json.loads((fixture_dir / "expected.json").read_text())
    run = load(run_dir)
    trace, notes = read_run(run)
    assert trace is not None, notes
    trace.validate()
    O = trace.ops
    assert len(O) == expected["ops"] and len(trace.calls) == expected["calls"] and len(trace.ranges) == expected["ranges"]
    assert int((O.kind == OpKind.KERNEL).sum()) == expected["kernels"]
    assert int((O.kind == OpKind.MEMCPY).sum()) == expected["memcpy"] > 0
    assert int((O.kind == OpKind.MEMSET).sum()) == expected["memset"]
    assert int((O.end_ns - O.start_ns)[O.kind == OpKind.KERNEL].sum()) == expected["kernel_ns_total"]
    assert (O.end_ns >= O.start_ns).all()
    assert all(trace.name(int(i)) for i in O.name_id)  # every op named
    att = attribute(trace, run)
    assert att.join_method == JoinMethod[expected["join"]] == JoinMethod.PAYLOAD
    assert int((att.op_range >= 0).sum()) == expected["attributed"]


def test_fixture_ops_fall_inside_their_stage_on_the_host_clock(run_dir):
    """The GPU runs behind the host, so an op starts after its stage's launch began; and the
    clock pairs put ops on the stage records' clock."""
    run = load(run_dir)
    trace, _ = read_run(run)
    att = attribute(trace, run)
    own = att.op_range >= 0
    starts = trace.ranges.start_ns[att.op_range[own]]
    # CUPTI's GPU times are normalised to its CPU clock, then mapped onto CLOCK_MONOTONIC: allow
    # 20 us of skew (a launch's GPU start trails its stage's start by more than that on its own)
    assert (trace.ops.start_ns[own] >= starts - 20_000).all()
    assert np.median(trace.ops.start_ns[own] - starts) > 0


def test_fixture_steady_steps_have_equal_kernel_counts_per_stage(run_dir):
    run = load(run_dir)
    trace, _ = read_run(run)
    att = attribute(trace, run)
    st, names = run.stages, run.stage_names()
    by_id = {int(i): k for k, i in enumerate(st["id"])}
    counts: dict[str, set[int]] = {}
    for r in np.flatnonzero(att.range_record_id >= 0):
        k = by_id[int(att.range_record_id[r])]
        if st["step"][k] >= run.warmup:
            counts.setdefault(str(names[k]), set()).add(int(att.kernel_count[r]))
    assert {"copy_in", "matmul", "pointwise", "copy_out", "step"} <= set(counts)
    assert all(len(v) == 1 for v in counts.values()), counts
    assert counts["matmul"].pop() >= 4


def test_fixture_report_without_trace(run_dir):
    report = build_report(run_dir)
    assert report["sources"]["trace_format"] == "maxinstr-inprocess"
    names = {s["name"] for s in report["stages"]}
    assert {"matmul", "pointwise"} <= names
    assert report["gpu"]["kernels"]


def test_fixture_every_op_was_launched_by_a_function_kernels_true_keeps():
    """kernels=True keeps API records only for functions named with Launch/Memcpy/Memset
    (maxinstr.kernels.cupti._LAUNCH_WORDS): on the H200's records (collected with nearly every
    function on), each kernel, copy and set was launched by such a function, and the others
    were most of the API records."""
    from maxinstr.kernels.cupti import _LAUNCH_WORDS
    from maxinstr.rundir.activity import KIND_DRIVER, KIND_EXTERNAL, KIND_MEMSET, KIND_RUNTIME, read_part_activity

    _, rows, names = read_part_activity(FIXTURE)
    api = rows[(rows["kind"] == KIND_RUNTIME) | (rows["kind"] == KIND_DRIVER)]
    kept = np.array([any(w in names[i] for w in _LAUNCH_WORDS) for i in api["name_id"]], bool)
    ops = rows[rows["kind"] <= KIND_MEMSET]
    assert np.isin(ops["correlation_id"], api["correlation_id"][kept]).all()
    ext = rows[rows["kind"] == KIND_EXTERNAL]
    ext_kept = np.isin(ext["correlation_id"], api["correlation_id"][kept])
    before, after = len(rows), len(ops) + int(kept.sum()) + int(ext_kept.sum())
    assert after * 2 < before, (before, after)  # fewer than half the records


def test_tags_fixture_launch_calls_lie_inside_their_stages(tmp_path):
    """The launch tags carry the core's host clock, mapped onto CUPTI's at take and back onto the
    host clock by the reader: on the H200's tags every op's launch call lies inside the stage it
    was tagged with, on that stage's thread, and each call was tagged once; the core's own
    calibration kernels (launched while the first stage is entered) name no stage."""
    act = json.loads((FIXTURE_TAGS / "activity.json").read_text())
    assert act["stage_correlation"].startswith("launch tags") and act["launch_tags"]["dropped"] == 0
    run_dir = _copy_run(FIXTURE_TAGS, tmp_path)
    run = load(run_dir)
    trace, _ = read_run(run)
    att = attribute(trace, run)
    own = np.flatnonzero(att.op_range >= 0)
    spin = np.array([trace.name(int(i)) == "maxinstr_spin" for i in trace.ops.name_id])
    # maxinstr's own floor-calibration kernels name no stage (and the notes say whose they are);
    # every other op has its stage
    assert spin.sum() > 0 and (att.op_range[spin] < 0).all() and (att.op_range[~spin] >= 0).all()
    assert any(f"({int(spin.sum())} of them maxinstr's own GPU-floor calibration kernels)" in x for x in att.notes), att.notes
    C = trace.calls
    assert len(np.unique(C.correlation_id)) == len(C) == act["launch_tags"]["calls"]
    row = {int(c): i for i, c in enumerate(C.correlation_id)}
    ci = np.array([row[int(c)] for c in trace.ops.correlation_id[own]])
    r = att.op_range[own]
    assert (C.start_ns[ci] >= trace.ranges.start_ns[r]).all() and (C.end_ns[ci] <= trace.ranges.end_ns[r]).all()  # (>= 2 us inside here)
    assert (C.start_ns[ci] <= C.end_ns[ci]).all() and (C.tid[ci] == trace.ranges.tid[r]).all()
