"""Record-to-model conversion on raw activity records saved from a real H200 run
(benchmarks/device/15-cupti.sh, step 4: the kernels=True run of benchmarks/cupti_check.py).

The fixture folder tests/data/cupti/h200_small/ holds one part's files as the session wrote
them (activity.bin, activity_names.jsonl, activity.json, stages.bin, strings.jsonl, part.json)
plus the run's meta.json and expected.json (what the conversion gave on the device)."""

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

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "cupti" / "h200_small"
PART_FILES = ("activity.bin", "activity_names.jsonl", "activity.json", "stages.bin", "strings.jsonl", "attrs.jsonl", "part.json")

pytestmark = pytest.mark.skipif(
    not (FIXTURE / "activity.bin").is_file(),
    reason=f"{FIXTURE} not added yet (copy $OUT/cupti/fixture/ from benchmarks/device/15-cupti.sh on the H200)",
)


@pytest.fixture
def run_dir(tmp_path):
    part = json.loads((FIXTURE / "part.json").read_text())
    root = tmp_path / "run"
    pdir = root / "parts" / part["part"]
    pdir.mkdir(parents=True)
    for f in PART_FILES:
        if (FIXTURE / f).is_file():
            shutil.copy(FIXTURE / f, pdir / f)
    shutil.copy(FIXTURE / "meta.json", root / "meta.json")
    return root


def test_fixture_converts_to_the_model_it_gave_on_the_device(run_dir):
    expected = json.loads((FIXTURE / "expected.json").read_text())
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
    from maxinstr.kernels.store import KIND_DRIVER, KIND_EXTERNAL, KIND_MEMSET, KIND_RUNTIME, read_part_activity

    _, rows, names = read_part_activity(FIXTURE)
    api = rows[(rows["kind"] == KIND_RUNTIME) | (rows["kind"] == KIND_DRIVER)]
    kept = np.array([any(w in names[i] for w in _LAUNCH_WORDS) for i in api["name_id"]], bool)
    ops = rows[rows["kind"] <= KIND_MEMSET]
    assert np.isin(ops["correlation_id"], api["correlation_id"][kept]).all()
    ext = rows[rows["kind"] == KIND_EXTERNAL]
    ext_kept = np.isin(ext["correlation_id"], api["correlation_id"][kept])
    before, after = len(rows), len(ops) + int(kept.sum()) + int(ext_kept.sum())
    assert after * 2 < before, (before, after)  # fewer than half the records
