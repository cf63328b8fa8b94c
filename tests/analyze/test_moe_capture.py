"""The MoE rules and kernel families on the real H200 MoE decode capture (benchmarks/scenarios/
moe_decode.py under nsys, benchmarks/device/40-report.sh; tests/data/PROVENANCE-extra.md):
router matmul -> softmax -> top-k -> tokens sorted by expert -> grouped expert matmuls
(torch._grouped_mm, CUTLASS) -> index_add combine."""

from __future__ import annotations

import copy

import pytest

from maxinstr.analyze.commands import Commands
from maxinstr.analyze.rules.base import deep_dive
from maxinstr.analyze.rules.mix import (MOE_GROUPED_SHARE, MOE_PERMUTATION, ROUTING_RIVALS, moe_routing_kernels,
                                        rule_moe_decode)


def fired(rule, report) -> list:
    """The findings ``rule`` makes of ``report`` on its own (before diagnose relates them)."""
    return [d.finding() for d in rule(report, Commands(report))]

REL = "nsys/h200_moe.sqlite"


def _decode(r):
    return next(s for s in r["stages"] if s["name"] == "decode")


def _kernel(stage, needle):
    return next(k for k in stage["mix"]["top_kernels"] if needle in k["name"])


def test_moe_kernel_families(report_of):
    dec = _decode(report_of(REL))
    # the expert matmuls: CUTLASS grouped GEMM (GroupProblemShape) and its argument set-up
    assert _kernel(dec, "GroupProblemShape")["family"] == "grouped_matmul"
    assert _kernel(dec, "prepare_grouped_gemm_data")["family"] == "grouped_matmul"
    # the router: a dense (GEMV-shaped nvjet) matmul, its softmax, then top-k
    assert _kernel(dec, "nvjet_sm90")["family"] == "gemm"
    assert _kernel(dec, "softmax_warp_forward")["family"] == "softmax"
    assert _kernel(dec, "gatherTopK")["family"] == "top_k"  # the router's expert choice here; the rule says so
    # generic sort / histogram / index_add kernels keep their generic family ...
    for needle in ("radixSortKVInPlace", "bitonicSortKVInPlace", "kernelHistogram1D", "indexFuncLargeIndex"):
        assert _kernel(dec, needle)["family"] == "reduction"


def test_routing_with_its_permutation_rivals_the_grouped_matmul(report_of):
    """... but in a stage running grouped expert matmuls they are the routing path's token
    permutation, and the MoE rule counts them: 4% routing family + 30% sort/histogram/scatter-add
    = 34% of decode's GPU time next to 36% grouped matmul."""
    r = report_of(REL)
    f = next(f for f in r["diagnosis"] if f["id"] == "moe_routing_overhead")
    assert f["stage"] == "decode" and f["verdict"] == "hypothesis"
    ev = f["evidence"]
    assert ev["grouped_matmul_share"] >= MOE_GROUPED_SHARE
    assert ev["routing_family_share"] < ROUTING_RIVALS * ev["grouped_matmul_share"]  # family alone: "small"
    assert ev["routing_over_grouped"] >= ROUTING_RIVALS
    assert {"radixSortKVInPlace", "kernelHistogram1D", "indexFuncLargeIndex"} <= set(ev["permutation_kernels"])
    assert "moe_decode" not in [x["id"] for x in r["diagnosis"]]
    assert "permutation" in f["title"] and f["command"].startswith("maxinstr deep-dive ")
    # the deep dive looks at the largest kernel of what the title counts: a permutation sort
    # (the issue: it targeted gatherTopK, 4% of the time, while the permutation was 30%)
    counted = moe_routing_kernels(_decode(r))
    assert counted[0]["share"] > _kernel(_decode(r), "gatherTopK")["share"]
    assert MOE_PERMUTATION.search(counted[0]["name"]) and "gatherTopK" not in f["command"]
    assert f["command"] == deep_dive(Commands(r), _decode(r), kernel=counted[0])


def test_without_the_permutation_kernels_routing_is_small(report_of):
    r = copy.deepcopy(report_of(REL))
    dec = _decode(r)
    dec["mix"]["top_kernels"] = [k for k in dec["mix"]["top_kernels"] if not MOE_PERMUTATION.search(k["name"])]
    (f,) = fired(rule_moe_decode, r)
    assert f["id"] == "moe_decode" and f["verdict"] == "fact" and f["evidence"]["permutation_share"] == 0


@pytest.mark.parametrize("rel", ["nsys/h200_decode.sqlite", "nsys/h200_reprefill.sqlite", "nsys/h200_kvcache.sqlite"])
def test_dense_decodes_have_no_permutation_share(report_of, rel):
    assert not [f for f in report_of(rel)["diagnosis"] if f["id"].startswith("moe_")]
