"""The re-prefill rule on real H200 captures (benchmarks/device/40-report.sh, tests/data/PROVENANCE-extra.md):
a decode loop that re-runs the whole sequence every step, its KV-cache contrast, and the other
decode fixtures. The rule needs both signals: the step's GPU op time grows with the step index,
and so does the work a KV-cached step keeps constant (its matmul time or its op count)."""

from __future__ import annotations

import copy

import pytest

from maxinstr.analyze.commands import Commands
from maxinstr.analyze.rules.reprefill import REPREFILL_SPEARMAN, REPREFILL_WORK_GROWTH, rule_reprefill


def fired(rule, report) -> list:
    """The findings ``rule`` makes of ``report`` on its own (before diagnose relates them)."""
    return [d.finding() for d in rule(report, Commands(report))]


def _decode(r):
    return next(s for s in r["stages"] if s["name"] == "decode")


def _reprefill(r):
    return [f for f in r["diagnosis"] if f["id"] == "reprefill_quadratic"]


def test_fires_on_the_reprefill_capture_with_its_numbers(joined):
    r = joined("h200_reprefill")
    assert r["sources"]["join"] == "payload"
    (f,) = _reprefill(r)
    assert f["stage"] == "decode" and f["verdict"] == "hypothesis"
    ev = f["evidence"]
    assert ev["steps"] == 160 and ev["basis"] == "gpu_op_ns"
    # the GPU work of a step in the one steady request (warmup=2 of 3 requests): 1.39 ms (first
    # quarter) -> 2.01 ms (last), rank correlation 0.93
    assert ev["op_time_spearman"] > 0.9 and 1.4 < ev["op_time_last_over_first"] < 1.6
    # ... carried by the matmuls (sequence-sized, as in the prefill): 1.26 ms -> 1.80 ms
    assert ev["matmul_grows"] and ev["matmul_time_spearman"] > 0.9 and ev["matmul_time_last_over_first"] > 1.4
    assert 1.1e6 < ev["matmul_time_first_quarter_ns"] < 1.35e6 < 1.7e6 < ev["matmul_time_last_quarter_ns"]
    # the same 29 ops every step: the prefill's op sequence, not more of them
    assert not ev["op_count_grows"] and ev["ops_per_step_first_quarter"] == ev["ops_per_step_last_quarter"] == 29
    # why the time-span rule missed it: other GPU tenants stretched the event spans
    assert ev["span_basis"] == "gpu_event_ns" and ev["span_spearman"] < REPREFILL_SPEARMAN
    assert "matmul time grows" in f["title"] and "KV-cached" in f["title"]
    # the validation names what compare prints: the median's verdict and the matmul growth
    assert f["command"].startswith("maxinstr compare ") and "matmul growth" in f["validation"]


def test_fires_on_the_reprefill_trace_alone(report_of):
    (f,) = _reprefill(report_of("nsys/h200_reprefill.sqlite"))
    assert f["stage"] == "decode" and f["evidence"]["matmul_grows"]


def test_kvcache_contrast_does_not_fire(joined):
    r = joined("h200_kvcache")
    assert not _reprefill(r)
    w = _decode(r)["step_work"]
    # the cached step's matmuls read the same weights for one token every step: flat
    assert w["matmul_ns"]["spearman"] < REPREFILL_SPEARMAN and abs(w["matmul_ns"]["last_over_first"] - 1) < 0.02
    assert w["gpu_op_ns"]["last_over_first"] < REPREFILL_WORK_GROWTH  # attention over a longer cache: +1%
    assert w["ops"]["first_quarter_median_ns"] == w["ops"]["last_quarter_median_ns"] == 31


@pytest.mark.parametrize("rel", ["nsys/h200_decode.sqlite", "nsys/h200_threads.sqlite", "nsys/h200_moe.sqlite",
                                 "nsys/h200_kvcache.sqlite"])
def test_other_decode_captures_do_not_fire(report_of, rel):
    r = report_of(rel)
    assert not _reprefill(r)
    for st in r["stages"]:
        if st.get("step_work"):  # flat or falling: no step's work grows
            assert st["step_work"]["matmul_ns"]["last_over_first"] < 1.05 or st["step_work"]["matmul_ns"]["first_quarter_median_ns"] == 0


def test_growth_without_prefill_shaped_work_does_not_fire(joined):
    """Both signals are needed: the re-prefill capture's growing op time on a step whose
    matmuls and op count stay flat (the KV-cache capture's) is what a cached decode with a
    growing attention cost looks like: not re-prefill."""
    grown = copy.deepcopy(joined("h200_kvcache"))
    dec = _decode(grown)
    dec["step_work"]["gpu_op_ns"] = _decode(joined("h200_reprefill"))["step_work"]["gpu_op_ns"]
    assert fired(rule_reprefill, grown) == []
    # ... and prefill-shaped work (matmuls growing) with it: fires
    dec["step_work"]["matmul_ns"] = _decode(joined("h200_reprefill"))["step_work"]["matmul_ns"]
    assert [f["id"] for f in fired(rule_reprefill, grown)] == ["reprefill_quadratic"]


def test_growing_op_count_is_prefill_shaped_too(joined):
    """A step that launches more ops as the sequence grows (a per-token loop) is the other
    work a cached step keeps constant."""
    r = copy.deepcopy(joined("h200_reprefill"))
    dec = _decode(r)
    flat_mm = _decode(joined("h200_kvcache"))["step_work"]["matmul_ns"]
    dec["step_work"]["matmul_ns"] = flat_mm
    assert fired(rule_reprefill, r) == []
    dec["step_work"]["ops"] = dict(dec["step_work"]["gpu_op_ns"])  # a count with the op time's trend
    (f,) = fired(rule_reprefill, r)
    assert f["evidence"]["op_count_grows"] and not f["evidence"]["matmul_grows"] and "op count" in f["title"]


def test_rule_reads_a_saved_report(joined, tmp_path):
    """Through the JSON view and back (NaN ratios of a stage without matmuls become null):
    the same finding, and no error on the null ratios."""
    import json

    from maxinstr.render.json import render

    back = json.loads(render(joined("h200_reprefill")))
    sample = next(s for s in back["stages"] if s["name"] == "sample")
    assert sample["step_work"]["matmul_ns"]["last_over_first"] is None  # no matmul in the argmax step
    assert [(f["id"], f["stage"]) for f in fired(rule_reprefill, back)] == [("reprefill_quadratic", "decode")]
    dec = next(s for s in back["stages"] if s["name"] == "decode")
    dec["step_work"]["gpu_op_ns"]["last_over_first"] = None  # as a stage with no op time in its first steps
    assert fired(rule_reprefill, back) == []
