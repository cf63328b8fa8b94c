"""A torch.profiler trace of a maxinstr program joins the program's stages (the H200 capture
in tests/data/kineto/h200_torch_decode*, PROVENANCE-extra.md).

maxinstr's stages are NVTX ranges, which Kineto does not record: before, "0 of 138075 candidate
ranges joined ... by (thread, name, order)" and no stage had kernels. The run's stage records
are now placed on the trace's wall clock and launches tied to them by thread and time; the
result must equal what an nsys capture of the same program gives (its per-instance numbers are
kept in h200_torch_decode.nsys-reference.json, made by benchmarks/nsys_reference.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from maxinstr.analyze.report import analyze
from maxinstr.attribute import JoinMethod, attribute
from maxinstr.attribute.join import place_run_stages
from maxinstr.traces.kineto import read_kineto

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"
TRACE, RUN = KINETO / "h200_torch_decode.pt.trace.json.gz", KINETO / "h200_torch_decode-run"


@pytest.fixture(scope="module")
def result():
    return analyze(RUN, trace=TRACE)


def test_every_stage_instance_holds_what_nsys_gives_it(result):
    run, att = result.run, result.attribution
    assert att.join_method == JoinMethod.CLOCK
    assert "placed on the trace's wall clock" in att.notes[0]
    by_record = {int(r): i for i, r in enumerate(att.range_record_id) if r >= 0}
    names = np.asarray(run.stage_names(), dtype=object)
    got: dict[str, list[tuple[int, int]]] = {}
    for k in np.argsort(run.stages["host_start_ns"], kind="stable"):
        r = by_record[int(run.stages["id"][k])]
        got.setdefault(str(names[k]), []).append((int(att.kernel_count[r]), int(att.kernel_ns[r])))
    ref = json.loads((KINETO / "h200_torch_decode.nsys-reference.json").read_text())["stages"]
    assert got.keys() == ref.keys()
    for stage, rows in ref.items():
        assert [c for c, _ in got[stage]] == [c for c, _ in rows], stage  # every instance, every kernel
        ns_ref = sum(t for _, t in rows)
        if sum(c for c, _ in rows) >= 100:  # a stage with real GPU work: its kernel time within 1 %
            assert abs(sum(t for _, t in got[stage]) / ns_ref - 1) < 0.01, stage
    assert sum(c for c, _ in got["decode"]) == 23808


def test_the_report_shows_per_stage_kernels_and_says_how(result):
    report = result.report
    forward = next(s for s in report["stages"] if s["name"] == "forward")
    assert forward["kernels_per_instance"]["median"] == 87
    assert report["sources"]["join"] == "clock" and report["sources"]["join_problem"] is None


def test_a_trace_that_cannot_be_placed_says_so_at_the_top(tmp_path):
    """Without the run's clock pair the stages cannot be placed: the report's header says why
    and what to do, instead of a note at the end."""
    import shutil

    from maxinstr.render.text import render

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    meta = json.loads((run / "meta.json").read_text())
    del meta["clock"]
    (run / "meta.json").write_text(json.dumps(meta))
    report = analyze(run, trace=TRACE).report
    assert "torch.profiler" in report["sources"]["join_problem"]
    head = render(report, width=120).split("Stages")[0]
    assert "join failed" in head and "maxinstr run" in head


def test_placing_is_needed_only_where_the_trace_has_no_stages():
    trace = read_kineto(TRACE)
    placed, note = place_run_stages(trace, RUN)
    assert len(placed.ranges) == len(trace.ranges) + 1753 and "1753 stage records" in note
    assert place_run_stages(placed, RUN) is None  # already holds maxinstr ranges
    assert place_run_stages(trace, None) is None
    # the placed ranges are on the trace's clock: the first stage starts among the trace's events
    att = attribute(placed, run=RUN)
    assert att.kernel_count[len(trace.ranges):].sum() > 0
