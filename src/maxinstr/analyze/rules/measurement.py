"""Rules on how far the numbers hold: a profiler's overhead, maxinstr's own, undeclared cold
starts, clocks held down."""

from __future__ import annotations

from typing import Any

from maxinstr.analyze.commands import NVIDIA_SMI_CLOCKS, Commands
from maxinstr.analyze.footprint import THRESHOLD_SHARE
from maxinstr.analyze.rules.base import Draft, stage_weight
from maxinstr.analyze.schema import Report, StartupRow

THROTTLED_SHARE = 0.05
NVML_REASONS = {"sw_power_cap": "SW power cap", "hw_slowdown": "HW slowdown", "sw_thermal": "SW thermal slowdown",
                "hw_thermal": "HW thermal slowdown", "hw_power_brake": "HW power brake slowdown",
                "current_limit": "current limit", "throttled_unknown": "throttled, reason not given"}
"""Throttle reasons as NVML (nvmlClocksEventReasons) and AMD SMI name them."""


def rule_perturbed(report: Report, cmd: Commands) -> list[Draft]:
    if not report.get("perturbed") or report.get("headline_source") == "unprofiled_run":
        return []
    return [Draft(
        "profiled_timings", "Timings were taken under a profiler: absolute numbers include its overhead",
        "fact", None, {"reason": report.get("perturbed_reason")},
        "Use this capture for attribution (which kernels, which stage); take headline timings from the same "
        "program run without the profiler, and pass it with --unprofiled.",
        cmd.report("--unprofiled RUN_WITHOUT_PROFILER"))]


def rule_observer_cost(report: Report, cmd: Commands) -> list[Draft]:
    """maxinstr's own estimated share of the staged time (analyze/footprint.py) past its threshold."""
    fp = report.get("footprint") or {}
    share = fp.get("overall_share")
    by: dict[str, float] = {k: float(v) for k, v in (fp.get("overall_ns_by_source") or {}).items()
                            if isinstance(v, (int, float))}
    if share is None or share < THRESHOLD_SHARE or not by:
        return []
    total = sum(by.values()) or 1.0
    source = max(by, key=lambda k: by[k])
    cheaper = {
        "kernels": "kernels=True ties each kernel to its stage inside the process, and CUPTI costs every launch: "
                   "take the kernels from a profiler's trace instead (maxinstr run -- python SCRIPT), or keep "
                   "kernels=True for a short window",
        # the stages' own enter/exit (timed host-only): gpu=False saves none of it, only the GPU events'
        "stages": "mark fewer, coarser stages in the hot loop (a stage around a few microseconds of work costs "
                  "about as much as the work)",
        "gpu_events": "GPU-time fewer steps: maxinstr.set_gpu_budget(0.001) (or MAXINSTR_GPU_BUDGET), or gpu=False "
                      "on the nested stages",
    }[source]
    parts = ", ".join(f"{k.replace('_', ' ')} {v / total:.0%}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v > 0)
    return [Draft(
        "observer_cost", f"maxinstr's own work is an estimated {share:.0%} of the staged time", "hypothesis", None,
        {"estimated_share": round(float(share), 4), "by_source": parts, "stage_ns": fp.get("stage_ns"),
         "event_ns": fp.get("event_ns"), "op_ns": fp.get("op_ns")},
        f"Watching this program slows it: {cheaper}. The times above include it.",
        validation="run the program once without maxinstr (MAXINSTR_DISABLE=1) and compare its own throughput",
        score=float(share))]


def rule_warmup_contamination(report: Report, cmd: Commands) -> list[Draft]:
    warm_n = report.get("warmup", {}).get("n", 0)
    by_stage: dict[str, list[StartupRow]] = {}
    for row in report.get("startup", []):
        if row["reason"] == "cold_start":
            by_stage.setdefault(row["stage"], []).append(row)
    stages = {s["name"]: s for s in report.get("stages", [])}
    ratios: dict[str, float] = {}
    worst_stage, worst_ratio, n_cold = None, 0.0, 0
    # warm-up=K covers the first K top-level instances and all inside them: one more than the last cold one
    suggested, top_stage = 0, None
    for name, rows in by_stage.items():
        st = stages.get(name)
        if not st or not st["host_ns"].get("n"):
            continue
        med = st["host_ns"]["median"]
        worst = max(rows, key=lambda r: r["host_ns"])
        ratio = worst["host_ns"] / med if med > 0 else float("inf")
        ratios[name] = round(ratio, 2)
        n_cold += len(rows)
        for r in rows:
            k = r.get("top_occurrence", r["occurrence"]) + 1
            if k > suggested:
                suggested, top_stage = k, r.get("top_stage", name)
        if ratio > worst_ratio:
            worst_stage, worst_ratio = name, ratio
    if not ratios:
        return []
    names = ", ".join(f"'{k}'" for k in list(ratios)[:4]) + (f" and {len(ratios) - 4} more" if len(ratios) > 4 else "")
    top = (stages.get(top_stage) if top_stage is not None else None) or {}
    evidence: dict[str, Any] = {"cold_instances": n_cold, "worst_stage": worst_stage, "worst_ratio": round(worst_ratio, 2),
                                "ratio_by_stage": ratios, "session_warmup": warm_n, "excluded_from_headline": True,
                                "suggested_warmup": None, "top_stage": top_stage}
    command = None
    if suggested < top.get("instances", 0):
        k = evidence["suggested_warmup"] = max(suggested, warm_n)
        covered = (f"the first {'pipeline iteration' if k == 1 else f'{k} pipeline iterations'}, each from one '{top_stage}' "
                   "to the next" if report.get("warmup", {}).get("pipeline_head") == top_stage
                   else f"the first '{top_stage}' and everything inside it" if k == 1
                   else f"the first {k} '{top_stage}' and everything inside them")
        step = (f"Already excluded from the headline numbers. Declare them as warm-up so every tool agrees: "
                f"maxinstr.session(..., warmup={k}) ({covered}), or run warm-up iterations before the measured loop.")
        command = cmd.report(f"--warmup {k}")
    else:  # a larger warmup would leave no steady top-level instance at all
        step = (f"Already excluded from the headline numbers. They ran in the last '{top_stage}' instance, so no "
                f"warm-up count can cover them and keep a steady '{top_stage}': run more '{top_stage}' instances "
                f"(at least {suggested + 1}) or warm-up iterations before the measured loop.")
    return [Draft(
        "warmup_contamination",
        f"{n_cold} first-call instance(s) of {names} ran up to {worst_ratio:.1f}x the steady median "
        f"(cold start: compilation, allocation, cache fill)",
        "fact", worst_stage if len(ratios) == 1 else None, evidence, step, command, score=0.01)]


def rule_throttled(report: Report, cmd: Commands) -> list[Draft]:
    """Clocks held below their maximum, ranked by the time it can cost: the stage's weight x the
    throttled share x the clock shortfall (an upper bound for work that scales with the clock). A
    SW power cap is a fully loaded GPU at its power limit, not a fault; thermal and hardware
    slowdowns are."""
    out = []
    for st in report.get("stages", []):
        smp = st.get("samples") or {}
        share = smp.get("throttled_share")
        if share is None or share < THROTTLED_SHARE:
            continue
        reasons = list(smp.get("throttle_reasons") or [])
        named = [NVML_REASONS.get(r, r) for r in reasons] or ["reason not given"]
        clock, top = smp.get("sm_clock_mhz_mean"), smp.get("sm_clock_max_mhz")
        loss = max(0.0, 1.0 - clock / top) if clock and top else None
        # a power the stage table does not print (it describes what ran around the stage) is not quoted either
        power = None if smp.get("power_limited", smp.get("window_limited")) else smp.get("power_w_mean")
        limit = smp.get("power_limit_w")
        host = st.get("host_ns") or {}
        ev: dict[str, Any] = {"reason": ", ".join(named), "reasons": reasons, "throttled_share": round(share, 3),
                              "samples": smp.get("samples"), "sm_clock_mhz_mean": clock, "sm_clock_max_mhz": top,
                              "clock_shortfall": None if loss is None else round(loss, 3), "power_w_mean": power,
                              "power_source": smp.get("power_source"), "power_limit_w": limit,
                              "cost_upper_ns": None if loss is None or not host.get("n") else host["total"] * share * loss}
        cost = f": SM clock {clock:.0f} MHz against {top:.0f} MHz max, up to {loss:.0%} of its time" if loss is not None else ""
        if reasons and set(reasons) <= {"sw_power_cap"}:
            why = "the driver keeping the board under its power limit" + (
                f" ({limit:.0f} W; the stage draws {power:.0f} W)" if limit and power else "")
            title = f"'{st['name']}': clocks held down by NVML's {named[0]} in {share:.0%} of its samples ({why}){cost}"
            step = ("Power-bound, not a fault: a fully loaded GPU runs at its power limit. These numbers hold at "
                    "this limit; less data moved per token (lower precision, fewer copies) lowers the power it "
                    "takes. Check the enforced limit with the command.")
        else:
            title = f"'{st['name']}': clocks held down by {', '.join(named)} in {share:.0%} of its samples{cost}"
            step = ("Numbers from this run are not steady-state peak: check cooling, the power limit and other "
                    f"tenants ({NVIDIA_SMI_CLOCKS}), then re-run.")
        out.append(Draft(
            "throttled", title, "fact", st["name"], ev, step, NVIDIA_SMI_CLOCKS,
            # ranked by the time it can cost; without clocks, a tenth of the throttled share
            score=share * stage_weight(report, st) * (loss if loss is not None else 0.1)))
    return out
