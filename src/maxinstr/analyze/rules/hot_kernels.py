"""Kernels worth a deep dive: one that dominates a stage (or the trace), and MAX's naive matmul."""

from __future__ import annotations

from maxinstr.analyze.commands import Commands
from maxinstr.analyze.families import NAIVE_MATMUL
from maxinstr.analyze.rules.base import (HOST_BOUND_GPU_OVER_HOST, LAUNCH_BOUND_BUSY, Draft, deep_dive, kernel_regex,
                                         leaf_stages, median, short, significant, stage_weight)
from maxinstr.analyze.schema import Report, Stage

DOMINANT_KERNEL_SHARE = 0.4
NAIVE_MATMUL_SHARE = 0.1  # MAX's fallback matmul: a finding from this share of a stage's GPU time
COPY_FAMILIES = ("memcpy", "memset")
_COPY_STEP = ("A copy, not a kernel: Nsight Compute cannot profile it. Check its direction and size in the trace; "
              "use pinned host memory, overlap it with compute on another stream, or keep the data on the GPU.")


def rule_naive_matmul(report: Report, cmd: Commands) -> list[Draft]:
    out = []
    for st in leaf_stages(report):
        naive = [k for k in (st.get("mix") or {}).get("top_kernels", []) if NAIVE_MATMUL.search(k["name"])]
        share = sum(k["share"] for k in naive)
        if not naive or share < NAIVE_MATMUL_SHARE or not significant(report, st):
            continue
        # the deep dive takes the largest, and prints its own share: the title says both
        largest = max(naive, key=lambda k: k["share"])
        title = (f"'{st['name']}': MAX's naive matmul kernel takes {share:.0%} of the stage's GPU time" if len(naive) == 1
                 else f"'{st['name']}': MAX's naive matmul kernels take {share:.0%} of the stage's GPU time "
                      f"({len(naive)} kernels; the largest, {short(largest['name'])}, {largest['share']:.0%})")
        out.append(Draft(
            "naive_matmul", title, "fact", st["name"],
            {"naive_share": round(share, 3), "kernels": [short(k["name"], 60) for k in naive],
             "largest_kernel": largest["name"], "largest_share": round(largest["share"], 3),
             "per_instance": round(sum(k["per_instance"] for k in naive), 2)},
            "MAX falls back to matmul_kernel_naive where none of its tuned matmuls covers the dtype and shape "
            "(float32, or odd shapes). Run the model in bfloat16 and keep matmul dimensions multiples of 64 so "
            "the tuned kernels (sm90_matmul, gemv_split_k) apply.",
            deep_dive(cmd, st, kernel=largest), cmd.check("the naive kernel must leave the stage's top kernels"),
            score=share * stage_weight(report, st)))
    return out


def _not_gpu_paced(st: Stage) -> str | None:
    """Why the GPU's kernels do not set this stage's pace, as a clause, or None (the pace tests)."""
    busy = median(st, "gpu_busy_frac")
    if busy is not None and busy < LAUNCH_BOUND_BUSY:
        return f"the GPU is busy only {busy:.0%} of the stage"
    busy_ns, host = median(st, "gpu_busy_ns"), median(st, "host_ns")
    if busy_ns is not None and host and busy_ns / host < HOST_BOUND_GPU_OVER_HOST:
        return f"GPU work is only {busy_ns / host:.0%} of the stage's host time"
    return None


def rule_dominant_kernel(report: Report, cmd: Commands) -> list[Draft]:
    out = []
    for st in leaf_stages(report):
        if not st.get("mix") or not significant(report, st):
            continue
        top = (st.get("mix") or {})["top_kernels"][:1]
        if not top or top[0]["share"] < DOMINANT_KERNEL_SHARE:
            continue
        k = top[0]
        copy = k["family"] in COPY_FAMILIES
        pace = None if copy else _not_gpu_paced(st)
        step = _COPY_STEP if copy else "Worth a deep dive: read its achieved bandwidth/throughput against the GPU's peak."
        if pace:
            step = ("A faster kernel would not shorten this stage yet: fix the launch or host limit first "
                    "(the finding above); then a deep dive reads its achieved bandwidth/throughput against the GPU's peak.")
        out.append(Draft(
            "dominant_kernel",
            f"'{st['name']}': one {'copy' if copy else 'kernel'} takes {round(k['share'], 3):.0%} of its GPU time "
            f"({k['family']}: {short(k['name'])})",
            "fact", st["name"],
            {"kernel": k["name"], "family": k["family"], "share": round(k["share"], 3), "count": k["count"],
             "median_ns": k["median_ns"], "per_instance": k.get("per_instance")},
            step, None if copy else deep_dive(cmd, st),
            score=k["share"] * stage_weight(report, st) * (0.25 if pace else 0.5), but=pace))
    gpu = report.get("gpu") or {}
    if not report.get("stages") and gpu.get("kernels"):
        gk = gpu["kernels"][0]
        if gk["share"] >= DOMINANT_KERNEL_SHARE:
            copy = gk["family"] in COPY_FAMILIES
            rivals = [o["name"] for o in gpu["kernels"] if o["share"] >= gk["share"]]
            out.append(Draft(
                "dominant_kernel", f"one {'copy' if copy else 'kernel'} takes {round(gk['share'], 3):.0%} of all GPU time "
                f"({gk['family']}: {short(gk['name'])})",
                "fact", None, {"kernel": gk["name"], "family": gk["family"], "share": round(gk["share"], 3)},
                _COPY_STEP if copy else "Worth a deep dive.",
                None if copy else cmd.deep_dive(kernel_regex(gk["name"], rivals)), score=gk["share"] * 0.5))
    return out
