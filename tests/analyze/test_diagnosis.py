"""Diagnosis rules on reports built from the real fixtures."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from helpers.fixture_columns import nvtx_host_durations
from maxinstr.analyze.commands import Commands
from maxinstr.analyze.rules.base import HOST_BOUND_GPU_OVER_HOST, LAUNCH_BOUND_BUSY
from maxinstr.analyze.rules.hot_kernels import DOMINANT_KERNEL_SHARE
from maxinstr.analyze.rules.measurement import rule_throttled
from maxinstr.analyze.rules.mix import HEALTHY_MATMUL_SHARE, QUANT_VS_MATMUL
from maxinstr.analyze.rules.reprefill import (REPREFILL_GROWTH, REPREFILL_KERNEL_OVERLAP, REPREFILL_SPEARMAN,
                                              rule_reprefill)
from maxinstr.analyze.stats import step_trend


def fired(rule, report) -> list:
    """The findings ``rule`` makes of ``report`` on its own (before diagnose relates them)."""
    return [d.finding() for d in rule(report, Commands(report))]


def _ids(report, stage=None):
    return [f["id"] for f in report["diagnosis"] if stage is None or f["stage"] == stage]


def _find(report, fid, stage=None):
    return next(f for f in report["diagnosis"] if f["id"] == fid and (stage is None or f["stage"] == stage))


def test_h200_decode_is_healthy_mix_but_launch_bound(report_of):
    """The decode fixture's verdict, with the reasons: its kernel mix is dense decode (matmul
    first, norm and elementwise below), but the GPU idles between launches most of each step."""
    r = report_of("nsys/h200_decode.sqlite")
    healthy = _find(r, "healthy_dense_decode", "decode")
    assert healthy["verdict"] == "fact"
    ev = healthy["evidence"]
    assert ev["matmul_share"] >= HEALTHY_MATMUL_SHARE
    assert ev["normalization_share"] < ev["matmul_share"] and ev["elementwise_share"] < ev["matmul_share"]
    launch = _find(r, "launch_bound", "decode")
    assert launch["verdict"] == "fact"
    assert launch["evidence"]["gpu_busy_frac_median"] < LAUNCH_BOUND_BUSY
    assert launch["evidence"]["kernels_per_instance_median"] == 19
    assert "graph" in launch["next_step"] and "maxinstr compare" in launch["validation"]
    # the GPU span of a decode step is ~500 us while its kernels sum to well under 100 us
    assert launch["evidence"]["idle_gap_ns_median"] > 0.5 * launch["evidence"]["gpu_proj_ns_median"]
    # nothing claims MoE, low-bit, unfused or re-prefill on this trace
    for absent in ("moe_decode", "moe_routing_overhead", "low_bit_quant_overhead", "reprefill_quadratic",
                   "unfused_custom_architecture", "throttled"):
        assert absent not in _ids(r)


def test_dominant_kernel_names_kernel_and_command(report_of):
    r = report_of("nsys/h200_decode.sqlite")
    f = _find(r, "dominant_kernel", "decode")
    assert f["evidence"]["kernel"] == "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_NNT"
    assert f["evidence"]["share"] >= DOMINANT_KERNEL_SHARE
    assert f["command"].startswith("maxinstr deep-dive ")
    assert "--stage decode" in f["command"] and "--kernel nvjet_sm90_tst_64x8_64x16_4x1_v_bz_NNT" in f["command"]


def test_warmup_contamination_is_one_fact_with_numbers(report_of):
    r = report_of("nsys/h200_decode.sqlite")
    fs = [f for f in r["diagnosis"] if f["id"] == "warmup_contamination"]
    assert len(fs) == 1
    ev = fs[0]["evidence"]
    # the first request (141.8 ms, with the 105.7 ms first sample inside) against ~21.6 ms
    assert ev["worst_stage"] == "request" and ev["worst_ratio"] > 5
    assert ev["excluded_from_headline"] is True
    assert "--warmup" in fs[0]["command"]


def test_profiled_trace_is_flagged(report_of):
    r = report_of("nsys/h200_decode.sqlite")
    assert _find(r, "profiled_timings")["verdict"] == "fact"


def test_unfused_attention_in_cs336(report_of):
    """cs336 assignment models compute softmax by hand (exp + max/sum reductions) and run
    attention as plain sgemm: no fused attention kernel."""
    r = report_of("nsys/cs336_2_7B_nvtx_nsys2024.6.sqlite")
    f = _find(r, "unfused_custom_architecture")
    assert f["verdict"] == "hypothesis"
    assert f["evidence"]["attention_share"] == 0.0 and f["evidence"]["softmax_from_exp_and_max_reduce"] is True
    assert f["evidence"]["matmul_share"] > 0.5


def test_fused_attention_is_not_called_unfused(report_of):
    r = report_of("kineto/h200_decode.pt.trace.json.gz")  # fmha_cutlassF: fused attention
    assert "unfused_custom_architecture" not in _ids(r)


def test_low_bit_on_vllm_fp8_trace(report_of):
    r = report_of("rocprof/rpd/mytrace.rpd.gz")  # vLLM on ROCm: fp8 quant kernels feed Cijk F8 GEMMs
    f = _find(r, "low_bit_weights")
    assert f["verdict"] == "fact" and 0 < f["evidence"]["quant_over_matmul"] < QUANT_VS_MATMUL
    assert "low_bit_quant_overhead" not in _ids(r)


def test_no_stages_rule_on_trace_without_ranges(report_of):
    r = report_of("nsys/pipit_cloverleaf_no_nvtx_nsys2024.5.sqlite")
    assert _find(r, "no_stages")["command"].startswith("maxinstr run")


def test_unattributed_time_rule(report_of):
    r = report_of("nsys/cs336_nsys2026.2.sqlite")  # ranges cover only a few % of the GPU work
    f = _find(r, "unattributed_gpu_time")
    assert f["evidence"]["attributed_share"] < 0.5


def test_findings_are_deepest_stage_only(report_of):
    r = report_of("nsys/h200_decode.sqlite")
    # request (the parent) is launch-bound too, but the finding is reported on decode only
    assert "launch_bound" not in _ids(r, "request")


def test_every_finding_has_the_fields(report_of):
    for rel in ("nsys/h200_decode.sqlite", "nsys/cs336_two_threads_nsys2025.1.sqlite", "rocprof/rpd/mytrace.rpd.gz"):
        for f in report_of(rel)["diagnosis"]:
            assert set(f) >= {"id", "title", "verdict", "stage", "evidence", "next_step", "command", "validation", "score"}
            if f["verdict"] == "hypothesis":
                assert f["validation"]  # a hypothesis says how to confirm the fix


def test_reprefill_rule_fires_on_growing_steps_only(report_of):
    """The rule reads ``steps`` and ``step_work``: flat on the real decode fixture (no finding).
    The same fixture's real per-step durations put in increasing order, as a re-prefilling
    loop's steps would be, do not fire while its kernels show flat per-step work (a longer
    span alone is not re-prefill); with no kernels at all (host times only) the time trend alone
    fires, saying the kernel mix was not seen. Real re-prefill captures: test_reprefill_rule.py."""
    r = report_of("nsys/h200_decode.sqlite")
    assert "reprefill_quadratic" not in _ids(r)
    grown = copy.deepcopy(r)
    dec = next(s for s in grown["stages"] if s["name"] == "decode")
    d = nvtx_host_durations("h200_decode")["maxinstr:decode"]
    dec["steps"] = {**step_trend(np.arange(len(d)), np.sort(d)), "basis": "host_ns"}
    assert fired(rule_reprefill, grown) == []  # the step's GPU work (op time, matmul time) is flat
    dec["step_work"] = None
    f = fired(rule_reprefill, grown)
    assert [x["id"] for x in f] == ["reprefill_quadratic"]
    assert f[0]["evidence"]["spearman"] >= REPREFILL_SPEARMAN
    assert f[0]["evidence"]["last_over_first"] >= REPREFILL_GROWTH and f[0]["evidence"]["prefill_shaped"] is None
    assert "no kernels to confirm" in f[0]["title"]
    # the real decode runs GEMV-shaped nvjet tiles, the prefill 64x64 tiles: little kernel overlap
    assert f[0]["evidence"]["kernel_overlap_with_prefill"] < REPREFILL_KERNEL_OVERLAP
    assert "prefill's kernels" not in f[0]["title"]


def test_throttled_rule_reads_stage_samples(report_of):
    r = copy.deepcopy(report_of("nsys/h200_decode.sqlite"))
    assert fired(rule_throttled, r) == []
    dec = next(s for s in r["stages"] if s["name"] == "decode")
    dec["samples"] = {"samples": 40, "throttled_share": 0.25, "throttle_reasons": ["sw_power_cap"]}
    f = fired(rule_throttled, r)
    assert f and f[0]["evidence"]["reasons"] == ["sw_power_cap"] and f[0]["verdict"] == "fact"
    assert "SW power cap" in f[0]["title"] and "hardware" not in f[0]["title"]


@pytest.mark.parametrize("fid", ["moe_decode", "moe_routing_overhead"])
def test_moe_rules_do_not_fire_without_grouped_matmul(report_of, fid):
    for rel in ("nsys/h200_decode.sqlite", "rocprof/rpd/mytrace.rpd.gz", "kineto/h200_decode.pt.trace.json.gz"):
        assert fid not in _ids(report_of(rel))


def test_attention_dominated_decode_on_kineto_fixture(report_of):
    """The Kineto scenario runs SDPA on one query token with a single 1024-wide head: the
    fmha prefill kernel outweighs the matmuls in every decode step."""
    r = report_of("kineto/h200_decode.pt.trace.json.gz")
    f = _find(r, "attention_dominated_decode", "decode")
    assert f["verdict"] == "hypothesis"
    assert f["evidence"]["attention_share"] > f["evidence"]["matmul_share"]
    assert f["evidence"]["attention_kernel"].startswith("fmha_cutlassF")
    assert f["command"].startswith("maxinstr deep-dive") and "--kernel fmha_cutlassF" in f["command"]
    assert "healthy_dense_decode" not in _ids(r)
    assert "attention_dominated_decode" not in _ids(report_of("nsys/h200_decode.sqlite"))


def test_healthy_mix_says_when_the_host_sets_the_pace(trace_of):
    """h200_threads' decode: matmul-only kernels, 68 % busy within their span (not launch-bound),
    but the kernels are 22 % of the stage's host time (host_bound). The healthy-mix finding must
    say so rather than advise faster matmuls beside host_bound."""
    from helpers.fixture_columns import DATA
    from maxinstr.analyze.report import build_report

    r = build_report(run=DATA / "nsys/h200_threads-run", trace=trace_of("nsys/h200_threads.sqlite"))
    host = _find(r, "host_bound", "decode")
    healthy = _find(r, "healthy_dense_decode", "decode")
    assert host["evidence"]["gpu_over_host"] < HOST_BOUND_GPU_OVER_HOST
    assert healthy["evidence"]["gpu_busy_frac_median"] >= LAUNCH_BOUND_BUSY
    assert healthy["evidence"]["gpu_over_host"] == host["evidence"]["gpu_over_host"]
    assert "which sets the pace" in healthy["title"] and healthy["next_step"].startswith("The host limit sets")
    assert healthy["evidence"]["paced_by"] == "host_bound" and "healthy_dense_decode" in host["evidence"]["secondary"]
    dec = [f["id"] for f in r["diagnosis"] if f["stage"] == "decode"]
    assert dec.index("host_bound") == 0  # what sets the pace comes first; the deep dive is for afterwards
    assert "next at 0%" not in healthy["title"]


def test_a_dominant_copy_gets_no_ncu_deep_dive(report_of):
    """matmul_result.rpd spends 85 % of its GPU time in host-to-device copies: ncu cannot
    profile a copy, so the finding says what to do with it instead of printing deep-dive."""
    r = report_of("rocprof/rpd/matmul_result.rpd")
    f = _find(r, "dominant_kernel")
    assert f["evidence"]["family"] == "memcpy" and f["evidence"]["share"] > 0.5
    assert f["command"] is None and "pinned" in f["next_step"] and "one copy" in f["title"]
    k = _find(report_of("nsys/h200_decode.sqlite"), "dominant_kernel", "decode")
    assert k["command"].startswith("maxinstr deep-dive")  # real kernels keep theirs


def test_dominant_kernel_in_a_stage_the_gpu_does_not_pace(report_of):
    """h200_decode's sample stage: one reduce kernel is 57 % of its GPU time, but the GPU is busy
    6 % of the stage (host_bound). The finding says a faster kernel would not help yet."""
    r = report_of("nsys/h200_decode.sqlite")
    f = _find(r, "dominant_kernel", "sample")
    assert "host_bound" in _ids(r, "sample")
    assert "(but the GPU is busy only 6% of the stage)" in f["title"]
    assert "would not shorten this stage yet" in f["next_step"]
    assert f["command"].startswith("maxinstr deep-dive")  # still there for afterwards
    t = _find(report_of("kineto/h200_graph_threads.pt.trace.json.gz"), "dominant_kernel", "copy_in")
    assert "but" not in t["title"]  # a copy stage the GPU keeps busy: no such clause
