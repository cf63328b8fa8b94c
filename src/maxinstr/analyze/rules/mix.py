"""Verdicts on a stage's kernel mix: what model it runs (dense decode, MoE, low-bit) and whether
the mix is right (attention-dominated, MoE routing, quantization, unfused kernels)."""

from __future__ import annotations

import re
from typing import Any

from maxinstr.analyze.commands import Commands
from maxinstr.analyze.families import MATMUL_FAMILIES, scanned
from maxinstr.analyze.rules.base import (DECODE_NAME, Draft, deep_dive, fam_share, kernel_id, kernel_names, kernel_regex,
                                         median, significant, stage_weight)
from maxinstr.analyze.schema import MixKernel, Report, Stage

MATMUL = tuple(sorted(MATMUL_FAMILIES))
HEALTHY_MATMUL_SHARE = 0.5
ATTENTION_DOMINATES = 0.4
MOE_GROUPED_SHARE = 0.15
ROUTING_RIVALS = 0.5  # routing >= half the grouped matmul time
QUANT_VS_MATMUL = 0.25
UNFUSED_ELEMENTWISE_SHARE = 0.3
UNFUSED_SOFTMAX_SHARE = 0.02  # below this a softmax is more likely a loss's log-softmax than attention

MOE_PERMUTATION = re.compile(r"sort|histogram|bincount|index_?add|indexFunc.*ReduceAdd|scatter_?add", re.IGNORECASE)
"""Generic kernels (family reduction) that, in a stage running grouped expert matmuls, are the
routing path's token permutation: sorting tokens by expert (and top-k's sort of its k results),
counting tokens per expert, the scatter-add that combines expert outputs."""
ROUTING_FAMILIES = ("routing", "top_k")
"""Families a stage running grouped expert matmuls spends on routing: the router's kernels and
its top-k (the expert choice there)."""
CONCAT_KERNEL = re.compile(r"CatArray|concat|\bcat_", re.IGNORECASE)
"""Concatenation kernels (torch.cat is CatArrayBatchedCopy), family elementwise: in a decode
stage usually a KV cache extended by concatenation each step."""


def _mixed_stages(report: Report) -> list[Stage]:
    return [s for s in report.get("stages", []) if s.get("mix") and significant(report, s)]


def _decode_stages(report: Report) -> list[Stage]:
    return [s for s in _mixed_stages(report) if DECODE_NAME.search(scanned(s.get("leaf", s["name"])))]


def rule_healthy_decode(report: Report, cmd: Commands) -> list[Draft]:
    out = []
    for st in _decode_stages(report):
        mm = fam_share(st, *MATMUL)
        others = {f: fam_share(st, f) for f in ("attention", "normalization", "elementwise", "softmax", "rope",
                                                 "reduction", "quantization", "routing")}
        biggest_other = max(others.items(), key=lambda kv: kv[1])
        if mm < HEALTHY_MATMUL_SHARE or biggest_other[1] >= mm:
            continue
        ev: dict[str, Any] = {"matmul_share": round(mm, 3), **{f"{k}_share": round(v, 3) for k, v in others.items() if v > 0}}
        busy = (st.get("gpu_busy_frac") or {}).get("median")
        if busy is not None:
            ev["gpu_busy_frac_median"] = round(busy, 3)
        busy_ns, host_med = median(st, "gpu_busy_ns"), median(st, "host_ns")
        if busy_ns is not None and host_med:
            ev["gpu_over_host"] = round(busy_ns / host_med, 3)
        title = (f"'{st['name']}' kernel mix is healthy dense decode: matmul {mm:.0%} of its GPU time, "
                 + (f"{biggest_other[0]} next at {biggest_other[1]:.0%}" if biggest_other[1] >= 0.01
                    else "no other compute family above 1%"))
        step = ("With this mix decode is usually weight-bandwidth bound: gains come from fewer bytes "
                "(lower-precision weights), larger batch, or faster matmul kernels; check the dominant "
                "matmul's achieved bandwidth with a deep dive.")
        out.append(Draft("healthy_dense_decode", title, "fact", st["name"], ev, step, deep_dive(cmd, st, family="gemv")))
    return out


def rule_attention_dominated_decode(report: Report, cmd: Commands) -> list[Draft]:
    out = []
    for st in _decode_stages(report):
        att, mm = fam_share(st, "attention"), fam_share(st, *MATMUL)
        if att < ATTENTION_DOMINATES or att <= mm:
            continue
        kernels = [k for k in (st.get("mix") or {})["top_kernels"] if k["family"] == "attention"]
        ev: dict[str, Any] = {"attention_share": round(att, 3), "matmul_share": round(mm, 3)}
        if kernels:
            ev.update({"attention_kernel": kernels[0]["name"], "attention_kernel_median_ns": kernels[0]["median_ns"],
                       "attention_per_instance": kernels[0].get("per_instance")})
        out.append(Draft(
            "attention_dominated_decode",
            f"'{st['name']}': attention takes {att:.0%} of decode GPU time, more than the matmuls ({mm:.0%})",
            "hypothesis", st["name"], ev,
            "At short context a decode step should be dominated by weight matmuls. Attention this large means a very "
            "long context, or an attention kernel not made for one query token (a prefill kernel, an unusual head "
            "dimension, no flash-decoding / paged-attention path). Check the head dimension and the attention backend.",
            deep_dive(cmd, st, family="attention"),
            cmd.check("attention share and decode median must fall beyond the noise bound"),
            score=(att - mm) * stage_weight(report, st)))
    return out


def moe_permutation(stage: Stage) -> tuple[float, list[str]]:
    """Share of a stage's GPU time in MOE_PERMUTATION kernels of its top kernels (not routing or
    grouped_matmul already), and their names."""
    ks = [k for k in (stage.get("mix") or {}).get("top_kernels", [])
          if k["family"] not in ROUTING_FAMILIES + ("grouped_matmul",) and MOE_PERMUTATION.search(scanned(k["name"]))]
    return float(sum(k["share"] for k in ks)), [k["name"] for k in ks]


def moe_routing_kernels(stage: Stage) -> list[MixKernel]:
    """The stage's top kernels the MoE rule counts as routing (routing and top-k families, the
    token permutation), largest first: what its deep dive should look at."""
    ks = [k for k in (stage.get("mix") or {}).get("top_kernels", [])
          if k["family"] in ROUTING_FAMILIES
          or (k["family"] != "grouped_matmul" and MOE_PERMUTATION.search(scanned(k["name"])))]
    return sorted(ks, key=lambda k: -k["share"])


def rule_moe_decode(report: Report, cmd: Commands) -> list[Draft]:
    out = []
    for st in _mixed_stages(report):
        grouped = fam_share(st, "grouped_matmul")
        if grouped < MOE_GROUPED_SHARE:
            continue
        routing_family = fam_share(st, *ROUTING_FAMILIES)
        perm, perm_names = moe_permutation(st)
        routing = routing_family + perm
        ev: dict[str, Any] = {"grouped_matmul_share": round(grouped, 3), "routing_share": round(routing, 3),
                              "routing_family_share": round(routing_family, 3), "permutation_share": round(perm, 3),
                              "permutation_kernels": [kernel_regex(n) for n in perm_names],
                              "routing_over_grouped": round(routing / grouped, 3) if grouped else None}
        if routing < ROUTING_RIVALS * grouped:
            out.append(Draft(
                "moe_decode", f"'{st['name']}' is MoE: grouped matmul {grouped:.0%}, routing {routing:.0%} (small)",
                "fact", st["name"], ev, "Routing is not the problem; the grouped expert matmuls are the work."))
            continue
        counted = moe_routing_kernels(st)
        out.append(Draft(
            "moe_routing_overhead",
            f"'{st['name']}': MoE routing takes {routing:.0%} of GPU time, rivalling the expert matmuls ({grouped:.0%})"
            + (f"; {perm:.0%} of it in generic sort/histogram/scatter-add kernels (token permutation)" if perm else ""),
            "hypothesis", st["name"], ev,
            "Routing (top-k, index creation, permutation) should be a small fraction of the expert matmuls. "
            "Look for a fused top-k/routing kernel, or unfused sort/scan steps in the routing path.",
            # the largest kernel of what the title counts (a permutation sort can outweigh top-k)
            deep_dive(cmd, st, kernel=counted[0] if counted else None),
            cmd.check("routing share and stage median must drop beyond the noise bound"),
            score=routing * stage_weight(report, st)))
    return out


def rule_low_bit(report: Report, cmd: Commands) -> list[Draft]:
    out = []
    for st in _mixed_stages(report):
        q, mm = fam_share(st, "quantization"), fam_share(st, *MATMUL)
        if q <= 0 or mm <= 0:
            continue
        ratio = q / mm
        ev: dict[str, Any] = {"quantization_share": round(q, 3), "matmul_share": round(mm, 3), "quant_over_matmul": round(ratio, 3)}
        if ratio < QUANT_VS_MATMUL:
            out.append(Draft(
                "low_bit_weights", f"'{st['name']}': low-bit path, quantization {ratio:.0%} of matmul time (small)",
                "fact", st["name"], ev, "Quantization overhead is small relative to the matmuls."))
            continue
        out.append(Draft(
            "low_bit_quant_overhead",
            f"'{st['name']}': quantize/dequantize/scale kernels cost {ratio:.0%} of the matmul time they feed",
            "hypothesis", st["name"], ev,
            "Activation quantization or weight dequantization runs as separate kernels. Fuse it into the matmul "
            "(prologue/epilogue), pre-quantize weights offline, or use a kernel that takes the low-bit format directly.",
            deep_dive(cmd, st, family="quantization"),
            cmd.check("quantization share must fall and the stage median drop beyond noise; check accuracy too"),
            score=q * stage_weight(report, st)))
    return out


def rule_unfused(report: Report, cmd: Commands) -> list[Draft]:
    out = []
    for st in _mixed_stages(report):
        names = " ".join(kernel_names(st)).lower()
        mm, att, ew = fam_share(st, *MATMUL), fam_share(st, "attention"), fam_share(st, "elementwise")
        reasons = []
        ev: dict[str, Any] = {"matmul_share": round(mm, 3), "attention_share": round(att, 3),
                              "elementwise_share": round(ew, 3)}
        if mm > 0 and att == 0:
            soft = fam_share(st, "softmax")
            manual_softmax = "exp_kernel" in names and "maxops" in names
            if soft >= UNFUSED_SOFTMAX_SHARE or manual_softmax:
                reasons.append("attention runs as matmul + softmax kernels (no fused attention kernel)")
                ev["softmax_share"] = round(soft, 3)
                ev["softmax_from_exp_and_max_reduce"] = manual_softmax
        if fam_share(st, "normalization") == 0 and "rsqrt" in names and ("pow_tensor" in names or "meanops" in names):
            reasons.append("normalization is built from pow/mean/rsqrt kernels (no fused rms_norm/layer_norm)")
            ev["unfused_norm_markers"] = [m for m in ("pow_tensor", "meanops", "rsqrt") if m in names]
        if ("cos" in names and "sin" in names) and fam_share(st, "rope") == 0 and "triton" not in names:
            reasons.append("rotary embedding computed with separate cos/sin elementwise kernels")
        concat = 0.0
        if mm > 0 and ew >= UNFUSED_ELEMENTWISE_SHARE:
            ew_kernels = [k for k in (st.get("mix") or {}).get("top_kernels", []) if k["family"] == "elementwise"]
            ev["top_elementwise_kernels"] = [{"kernel": kernel_regex(k["name"]), "share": round(k["share"], 3)}
                                             for k in ew_kernels[:3]]
            cat = [k for k in ew_kernels if CONCAT_KERNEL.search(scanned(k["name"]))]
            concat = float(sum(k["share"] for k in cat))
            reason = f"elementwise kernels take {ew:.0%} of GPU time next to {mm:.0%} matmul"
            if concat >= 0.5 * ew:
                ev["concat_share"] = round(concat, 3)
                reason += (f", {concat:.0%} of the stage in concatenation ({kernel_id(cat[0]['name'])[:60]}): "
                           "in a decode step that is usually a KV cache grown by torch.cat, which copies the "
                           "whole cache every step")
                work = st.get("step_work") or {}
                if work.get("gpu_op_ns") and work.get("matmul_ns"):
                    # the copy grows with the cache while the matmuls stay flat (not a re-prefill)
                    ev["op_time_last_over_first"] = work["gpu_op_ns"].get("last_over_first")
                    ev["matmul_time_last_over_first"] = work["matmul_ns"].get("last_over_first")
            reasons.append(reason)
        if not reasons:
            continue
        step = ("Use the framework's fused ops (scaled_dot_product_attention / flash attention, fused rms_norm, fused "
                "RoPE) or compile the block (torch.compile, a MAX graph) so these become single kernels.")
        if concat:
            cache = ("Preallocate the KV cache for the longest sequence and write each step's keys/values in place "
                     "(a static cache: slice assignment or index_copy_) instead of concatenating.")
            step = cache if len(reasons) == 1 else cache + " " + step
        out.append(Draft(
            "unfused_custom_architecture", f"'{st['name']}' misses fused kernels: " + "; ".join(reasons),
            "hypothesis", st["name"], ev, step,
            deep_dive(cmd, st, family="elementwise" if ew >= UNFUSED_ELEMENTWISE_SHARE else None),
            cmd.check("the stage's kernels per instance must fall and its median beyond the noise bound"),
            score=max(ew, fam_share(st, "softmax", "reduction")) * stage_weight(report, st)))
    return out
