"""A decode whose every step re-runs the whole sequence (no KV cache): O(n^2) overall. With the
kernels (``stages[].step_work``) both of:

1. *Growth*: the GPU op time a step launches rises with the step index (Spearman >=
   REPREFILL_SPEARMAN, last/first quarter >= REPREFILL_WORK_GROWTH); op time, not the step's
   span, which other tenants, launch gaps and syncs stretch.
2. *Prefill-shaped work*: a KV-cached step multiplies ONE token's activations by the weights,
   so its matmul time and op count do not grow with the step index.

The kernel overlap with a prefill stage is evidence only. Without kernels the time trend alone,
with the stricter REPREFILL_GROWTH (docs/report.md explains the thresholds).
"""

from __future__ import annotations

import re
from typing import Any

from maxinstr.analyze.commands import Commands
from maxinstr.analyze.families import scanned
from maxinstr.analyze.rules.base import Draft, significant, stage_weight
from maxinstr.analyze.schema import Report, Stage, StepTrend

PREFILL_NAME = re.compile(r"prefill|prompt|context|encode", re.IGNORECASE)
REPREFILL_SPEARMAN = 0.8  # monotone trend: under no trend P(rho >= 0.8) = 1.1% at 8 steps, less with more
REPREFILL_WORK_GROWTH = 1.2  # last/first quarter of the steps, on GPU op time and on the matmul time (or op count)
REPREFILL_GROWTH = 1.5  # the same on a time span, when the input has no kernels (a run without a trace)
REPREFILL_MIN_STEPS = 8
REPREFILL_KERNEL_OVERLAP = 0.6


def _kernel_overlap(a: Stage, b: Stage) -> float:
    """Shared GPU time of two stages' kernel mixes: over kernel names, the smaller share. Names
    carry the tile shape, so a decode step that re-runs the prompt shows the prefill's kernels."""
    ka = {k["name"]: k["share"] for k in (a.get("mix") or {}).get("top_kernels", [])}
    kb = {k["name"]: k["share"] for k in (b.get("mix") or {}).get("top_kernels", [])}
    return float(sum(min(ka[n], kb[n]) for n in ka.keys() & kb.keys()))


def _grows(tr: StepTrend | None, ratio: float) -> bool:
    """A trend (stats.step_trend) rising with the step (a null ratio, first quarter 0: no growth)."""
    if not tr:
        return False
    return (tr.get("n_steps") or 0) >= REPREFILL_MIN_STEPS \
        and (tr.get("spearman") or 0) >= REPREFILL_SPEARMAN and (tr.get("last_over_first") or 0) >= ratio


def _round(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


def _trend_ev(prefix: str, tr: StepTrend) -> dict[str, Any]:
    return {f"{prefix}_first_quarter_ns": tr["first_quarter_median_ns"],
            f"{prefix}_last_quarter_ns": tr["last_quarter_median_ns"],
            f"{prefix}_slope_ns_per_step": round(tr["slope_ns_per_step"], 1)}


def rule_reprefill(report: Report, cmd: Commands) -> list[Draft]:
    out = []
    stages = report.get("stages", [])
    prefills = None  # found once a stage needs them: a regex per stage of 50,000 otherwise
    for st in stages:
        tr = st.get("steps")
        if not tr or tr.get("n_steps", 0) < REPREFILL_MIN_STEPS or not significant(report, st):
            continue
        if prefills is None:
            prefills = [s for s in stages if PREFILL_NAME.search(scanned(s.get("leaf", s["name"]))) and s.get("mix")]
        work = st.get("step_work")
        ev: dict[str, Any] = {"steps": tr["n_steps"]}
        if work:
            op_t, mm_t, n_t = work["gpu_op_ns"], work["matmul_ns"], work["ops"]
            if not _grows(op_t, REPREFILL_WORK_GROWTH):
                continue
            mm_grows = (mm_t.get("first_quarter_median_ns") or 0) > 0 and _grows(mm_t, REPREFILL_WORK_GROWTH)
            ops_grow = _grows(n_t, REPREFILL_WORK_GROWTH)
            if not (mm_grows or ops_grow):
                continue
            growth, rho = op_t.get("last_over_first") or 0.0, op_t["spearman"]  # (not null: it grows)
            # the telling numbers first (views show the first few)
            ev.update({"op_time_last_over_first": round(growth, 3), "op_time_spearman": round(rho, 3),
                       "matmul_time_last_over_first": _round(mm_t["last_over_first"], 3),
                       "matmul_time_spearman": round(mm_t["spearman"], 3),
                       "ops_per_step_last_over_first": _round(n_t["last_over_first"], 3),
                       "basis": "gpu_op_ns", **_trend_ev("op_time", op_t), **_trend_ev("matmul_time", mm_t),
                       "ops_per_step_first_quarter": n_t["first_quarter_median_ns"],
                       "ops_per_step_last_quarter": n_t["last_quarter_median_ns"],
                       "ops_spearman": round(n_t["spearman"], 3), "matmul_grows": mm_grows, "op_count_grows": ops_grow,
                       "span_basis": tr.get("basis"), "span_spearman": round(tr["spearman"], 3),
                       "span_last_over_first": _round(tr["last_over_first"], 3)})
            what = "matmul time" if mm_grows else "op count"
            shaped = (f"; its {what} grows with it ({(mm_t if mm_grows else n_t)['last_over_first']:.2f}x), "
                      "which a KV-cached step keeps constant")
        else:
            growth, rho = tr.get("last_over_first", 0) or 0, tr.get("spearman", 0)
            if not (rho >= REPREFILL_SPEARMAN and growth >= REPREFILL_GROWTH):
                continue
            ev.update({"basis": tr.get("basis"), "spearman": round(rho, 3), "last_over_first": round(growth, 2),
                       "slope_ns_per_step": round(tr["slope_ns_per_step"], 1),
                       "first_quarter_median_ns": tr["first_quarter_median_ns"],
                       "last_quarter_median_ns": tr["last_quarter_median_ns"], "prefill_shaped": None})
            shaped = "; no kernels to confirm the steps run prefill-shaped work (add a trace)"
        others = [p for p in prefills if p["name"] != st["name"]]
        if others and st.get("mix"):
            overlap = max(_kernel_overlap(st, p) for p in others)
            ev["kernel_overlap_with_prefill"] = round(overlap, 3)
            if overlap >= REPREFILL_KERNEL_OVERLAP:
                shaped += " and it runs the prefill's kernels"
        out.append(Draft(
            "reprefill_quadratic",
            f"'{st['name']}' GPU work grows with the step index ({growth:.2f}x from first to last quarter, "
            f"Spearman {rho:.2f}){shaped}: the whole sequence may be re-run every step (O(n^2))",
            "hypothesis", st["name"], ev,
            "Check that the KV cache is used: each decode step should process one new token, not the whole prefix "
            "(pass past_key_values / use_cache=True, or the engine's cached decode path). A batch that grows "
            "step by step (continuous batching) also grows the matmuls: rule it out. Then re-run and compare.",
            cmd.compare(),
            cmd.check("the stage median must fall beyond the noise bound and its matmul "
                      "growth (last over first quarter of the steps) fall to about 1.0x"),
            score=stage_weight(report, st) * (1 - 1 / growth)))
    return out
