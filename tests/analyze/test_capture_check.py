"""A steady-state capture that missed the program's GPU work is said at the top of the report,
with the fix (issue 27 point 5), on the real H200 steady-state captures in tests/data."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

import maxinstr
from maxinstr.analyze.report import analyze
from maxinstr.analyze.sources import capture_check
from maxinstr.render import text as text_view

DATA = Path(__file__).parents[1] / "data"


def test_a_capture_with_no_gpu_op_is_said_with_the_work_it_missed():
    """h200_window-run: a `maxinstr run --window 1` capture whose 401 stage records all carry GPU
    event times (423 ms). Were its trace to hold no GPU op (issue 27: 12 decode steps over before
    the capture started), the report says so at the top, with that evidence and the fix."""
    run = maxinstr.load(DATA / "nsys/h200_window-run")
    inst = analyze(run).instances
    problem, note = capture_check(run.meta, 0, inst)
    assert note is None
    assert problem.startswith(f"the capture holds no GPU op, though the program ran {int(inst.steady.sum())} steady")
    assert "423.39 ms of GPU work on their streams (401 instances)" in problem
    assert "at the start of a 'decode'" in problem and "--capture all" in problem
    # with the ops it held: no problem; the steady instances its window left out are a note
    problem, note = capture_check(run.meta, 1, inst)
    assert problem is None
    stop = run.meta["capture"]["stop_ns"]
    start = run.meta["capture"]["start_ns"]
    outside = inst.steady & ((inst.host_start_ns < start) | (inst.host_end_ns > stop))
    assert outside.sum() > 0 and note.startswith(f"{int(outside.sum())} of {int(inst.steady.sum())} steady")


def test_a_capture_the_session_could_not_start_is_said():
    run = maxinstr.load(DATA / "nsys/h200_window-run")
    meta = copy.deepcopy(run.meta)
    meta["capture"]["started"] = False
    problem, _ = capture_check(meta, 0, analyze(run).instances)
    assert problem.startswith("the session could not start the profiler's capture range")


def test_the_real_steady_captures_hold_their_steady_instances():
    """max/block_run and max/decoder_run: steady-state captures whose every steady instance
    began inside the capture: nothing at the top, no note."""
    for name in ("max/block_run", "max/decoder_run"):
        a = analyze(DATA / name, DATA / name / "profile.sqlite")
        assert a.report["sources"].get("capture_problem") is None
        assert not any("outside the capture range" in n for n in a.report["sources"]["notes"])
        problem, note = capture_check(a.run.meta, len(a.trace.ops), a.instances)
        # the records of the warm-up, before the capture, are why the join note counts records
        # without a range: said, with their number
        unjoined = int((a.instances.range_index < 0).sum())
        assert problem is None and note.startswith(f"the {unjoined} stage records with no range in the trace all began before")


def test_the_problem_is_the_first_thing_the_text_view_says_after_the_sources():
    run = maxinstr.load(DATA / "nsys/h200_window-run")
    a = analyze(run)
    report = a.report
    report["sources"]["capture_problem"], _ = capture_check(run.meta, 0, a.instances)
    lines = text_view.render(report, width=80).splitlines()
    at = next(i for i, line in enumerate(lines) if "│ capture empty " in line)
    assert at < next(i for i, line in enumerate(lines) if "Stages" in line)
    assert np.all([len(line) <= 80 for line in lines])
