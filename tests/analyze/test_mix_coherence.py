"""One kernel-mix verdict per stage, and what limits a stage first, on every real fixture.

A stage's mix is one of healthy dense decode / MoE / low-bit / unfused custom architecture /
attention-dominated decode, not several that contradict each other ("healthy" beside "misses
fused kernels"). When launch_bound or host_bound fire on the same stage, they set its pace: they
come before the stage's other findings and the mix finding says it is secondary.
"""

from __future__ import annotations

import json

import pytest

from helpers.fixture_columns import DATA
from maxinstr.analyze.diagnosis import diagnose
from maxinstr.analyze.rules.base import LAUNCH_BOUND_BUSY, MIX_FINDINGS, MIX_HEALTHY, PACE_FINDINGS, WORDS

TRACES = [
    "nsys/h200_decode.sqlite", "nsys/h200_kvcache.sqlite", "nsys/h200_reprefill.sqlite", "nsys/h200_moe.sqlite",
    "nsys/h200_threads.sqlite", "nsys/h200_small.sqlite", "nsys/cs336_2_7B_nvtx_nsys2024.6.sqlite",
    "nsys/cs336_nsys2026.2.sqlite", "nsys/cs336_two_threads_nsys2025.1.sqlite", "nsys/pipit_saxpy_mpi_nsys2022.2.sqlite",
    "nsys/pipit_cloverleaf_no_nvtx_nsys2024.5.sqlite", "kineto/h200_decode.pt.trace.json.gz",
    "kineto/h200_graph_threads.pt.trace.json.gz", "kineto/hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "rocprof/rpd/mytrace.rpd.gz",
]
JOINED = ["h200_kvcache", "h200_reprefill", "h200_moe", "h200_threads"]
SAVED = DATA / "reports" / "h200_kvcache_b16.report.json"


@pytest.fixture(scope="module")
def saved_b16() -> list[dict]:
    """The 07:09 UTC H200 report whose decode drew three mix findings, diagnosed again."""
    return diagnose(json.loads(SAVED.read_text()))


def _stage(findings, stage):
    return [f for f in findings if f.get("stage") == stage]


def _check_coherent(findings: list[dict]) -> None:
    stages = {f["stage"] for f in findings if f.get("stage")}
    for st in stages:
        fs = _stage(findings, st)
        mix = [f["id"] for f in fs if f["id"] in MIX_FINDINGS]
        assert len(mix) <= 1, (st, mix)
        ids = [f["id"] for f in fs]
        if "reprefill_quadratic" in ids:
            assert not set(ids) & set(MIX_HEALTHY), (st, ids)
        pace = [f for f in fs if f["id"] in PACE_FINDINGS]
        if pace:
            # one per population of the stage (two when its instances form two), ahead of the rest
            assert len({f["evidence"].get("population") for f in pace}) == len(pace) <= 2, (st, ids)
            assert fs[:len(pace)] == pace, (st, ids)  # what limits the stage comes first
            lead = max(pace, key=lambda f: f["score"])
            for f in fs:
                if f["id"] in MIX_FINDINGS:
                    assert f["evidence"]["paced_by"] == lead["id"] and "secondary" in f["title"]
                    assert f["next_step"].startswith(f"The {WORDS[lead['id']]} sets this stage's pace")
                    assert f["id"] in lead["evidence"]["secondary"]
                    assert not any(i in f["title"] + f["next_step"] for i in PACE_FINDINGS)  # words, not ids
    for f in findings:
        assert 0.0 <= f["score"] <= 1.0, f  # a rough share of time: never above all of it


@pytest.mark.parametrize("rel", TRACES)
def test_trace_fixtures_are_coherent(report_of, rel):
    _check_coherent(report_of(rel)["diagnosis"])


@pytest.mark.parametrize("name", JOINED)
def test_joined_fixtures_are_coherent(joined, name):
    _check_coherent(joined(name)["diagnosis"])


def test_saved_h200_kvcache_b16_decode(saved_b16):
    """The report that prompted this (H200, 07:09 UTC): 16 sequences decoded with a cache grown by
    torch.cat. Before, decode carried launch_bound, unfused_custom_architecture AND
    healthy_dense_decode. Defensible verdict: launch-bound first (33 kernels a step, the GPU
    busy 37 % of the step's span: that sets the pace); the mix is *not* healthy: 35 % elementwise
    beside 55 % matmul, and 31 % of the stage is CatArrayBatchedCopy, the cache concatenated every
    step. The per-step work confirms a copy that grows with the cache: op time +42 % from the
    first to the last quarter of the steps while the matmul time stays flat (0.99x), so it is not a
    re-prefill either."""
    dec = _stage(saved_b16, "decode")
    assert [f["id"] for f in dec] == ["launch_bound", "unfused_custom_architecture"]
    launch, mix = dec
    assert launch["evidence"]["gpu_busy_frac_median"] < LAUNCH_BOUND_BUSY
    assert launch["evidence"]["secondary"] == ["unfused_custom_architecture"]
    assert launch["title"].endswith("this sets the stage's pace, its unfused kernels come second")
    assert launch["next_step"].startswith("This limits the stage first: its unfused kernels matter once it is fixed.")
    ev = mix["evidence"]
    assert ev["supersedes"] == ["healthy_dense_decode"] and ev["paced_by"] == "launch_bound"
    assert ev["concat_share"] > 0.25 and ev["top_elementwise_kernels"][0]["kernel"] == "CatArrayBatchedCopy"
    assert ev["op_time_last_over_first"] > 1.3 and abs(ev["matmul_time_last_over_first"] - 1) < 0.05
    assert "torch.cat" in mix["title"] and "Preallocate the KV cache" in mix["next_step"]
    assert launch["score"] > mix["score"]
    _check_coherent(saved_b16)


def test_h200_decode_verdict(report_of):
    """h200_decode (6-layer bf16, one token a step, from Python): the mix is healthy dense decode
    (matmul 70 %, norm 18 %) and nothing else claims the mix; but the GPU is busy 18 % of each
    step's span with 19 kernels: launch_bound sets the pace and comes first."""
    dec = _stage(report_of("nsys/h200_decode.sqlite")["diagnosis"], "decode")
    ids = [f["id"] for f in dec]
    assert ids[0] == "launch_bound" and [i for i in ids if i in MIX_FINDINGS] == ["healthy_dense_decode"]


def test_h200_kvcache_verdict(joined, report_of):
    """h200_kvcache (the earlier capture, one sequence): matmul 94 % of decode, elementwise 3 %;
    the GPU is not idle between launches (no launch_bound/host_bound on decode) and the matmul
    time per step is flat: healthy dense decode, GPU-paced, with its deep-dive command."""
    for findings in (joined("h200_kvcache")["diagnosis"], report_of("nsys/h200_kvcache.sqlite")["diagnosis"]):
        dec = _stage(findings, "decode")
        ids = [f["id"] for f in dec]
        assert "healthy_dense_decode" in ids and not set(ids) & set(PACE_FINDINGS)
        healthy = next(f for f in dec if f["id"] == "healthy_dense_decode")
        assert "secondary" not in healthy["title"] and healthy["command"].startswith("maxinstr deep-dive")


def test_h200_reprefill_verdict(joined):
    """h200_reprefill: every step re-runs the sequence; its matmul-dominated mix (90 %) is the
    prefill's work repeated, so it is not called healthy: reprefill_quadratic stands alone on
    decode's mix, and says which verdict it replaced."""
    dec = _stage(joined("h200_reprefill")["diagnosis"], "decode")
    ids = [f["id"] for f in dec]
    assert "reprefill_quadratic" in ids and "healthy_dense_decode" not in ids
    rq = next(f for f in dec if f["id"] == "reprefill_quadratic")
    assert rq["evidence"]["supersedes"] == ["healthy_dense_decode"]


def test_h200_moe_verdict(joined, report_of):
    """h200_moe: 108 kernels a step, the GPU busy 18 % of the span: launch_bound first. The mix is
    MoE with routing rivalling the grouped matmuls (sort/histogram/index_add permutation): one mix
    finding, moe_routing_overhead, secondary to the launch gaps; never "healthy dense"."""
    for findings in (joined("h200_moe")["diagnosis"], report_of("nsys/h200_moe.sqlite")["diagnosis"]):
        dec = _stage(findings, "decode")
        assert [f["id"] for f in dec] == ["launch_bound", "moe_routing_overhead"]
        assert dec[1]["evidence"]["paced_by"] == "launch_bound"


def test_h200_threads_verdict(joined):
    """h200_threads (joined to its run): decode's kernels are one matmul (100 %), 68 % busy within
    their span, but only 22 % of the stage's host time: host_bound sets the pace, then the healthy
    mix (secondary) and the dominant kernel."""
    dec = _stage(joined("h200_threads")["diagnosis"], "decode")
    assert [f["id"] for f in dec][0] == "host_bound"
    healthy = next(f for f in dec if f["id"] == "healthy_dense_decode")
    assert healthy["evidence"]["paced_by"] == "host_bound" and "which sets the pace" in healthy["title"]
    assert healthy["next_step"].startswith("The host limit sets this stage's pace")


def test_kineto_decode_and_cs336_verdicts(report_of):
    """Kineto h200_decode: SDPA with one 1024-wide head dispatches the prefill fmha kernel, 69 % of
    decode: attention_dominated_decode, behind launch_bound (busy 15 %). cs336 2.7B: attention as
    sgemm + hand-written softmax: unfused_custom_architecture, not healthy. The vLLM RPD trace:
    the low-bit verdict on execute_model, and its parent 'generate' (whose inclusive mix holds the
    same fp8 quant kernels) is not also called healthy dense."""
    dec = _stage(report_of("kineto/h200_decode.pt.trace.json.gz")["diagnosis"], "decode")
    ids = [f["id"] for f in dec]
    assert ids[0] == "launch_bound" and [i for i in ids if i in MIX_FINDINGS] == ["attention_dominated_decode"]
    cs = report_of("nsys/cs336_2_7B_nvtx_nsys2024.6.sqlite")["diagnosis"]
    assert [f["id"] for f in cs if f["id"] in MIX_FINDINGS] == ["unfused_custom_architecture"]
    rpd = report_of("rocprof/rpd/mytrace.rpd.gz")["diagnosis"]
    assert [(f["id"], f["stage"]) for f in rpd if f["id"] in MIX_FINDINGS] == [("low_bit_weights", "execute_model")]


def test_folding_two_problems_into_one_mix_finding(report_of):
    """Two mix problems on one stage (the MoE stage given cos/sin rotary kernels too) become one
    finding: the larger by score, the other folded into its evidence, title and next step."""
    import copy

    r = copy.deepcopy(report_of("nsys/h200_moe.sqlite"))
    dec = next(s for s in r["stages"] if s["name"] == "decode")
    dec["mix"]["top_kernels"] += [{"name": n, "family": "elementwise", "count": 1, "gpu_ns": 1.0, "median_ns": 1.0,
                                   "share": 0.0} for n in ("cos_kernel_cuda", "sin_kernel_cuda")]
    fs = _stage(diagnose(r), "decode")
    mix = [f for f in fs if f["id"] in MIX_FINDINGS]
    assert len(mix) == 1
    pair = {"moe_routing_overhead", "unfused_custom_architecture"}
    assert mix[0]["id"] in pair
    (other,) = pair - {mix[0]["id"]}
    assert [a["id"] for a in mix[0]["evidence"]["also"]] == [other]
    assert "; also " in mix[0]["title"] and " Also: " in mix[0]["next_step"]
    assert other not in mix[0]["title"] + mix[0]["next_step"]  # in words, not its rule id
