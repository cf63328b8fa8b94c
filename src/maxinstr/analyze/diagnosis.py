"""The diagnosis: every rule (analyze/rules/) over the report, the drafts of one stage related
(one kernel-mix verdict, the pace first, the most specific stage only), then made findings; and
the stages ranked as bottlenecks. A rule reads only the report dict and the commands it may
suggest (analyze/commands.py), so rules are tested on reports built from real fixtures.
"""

from __future__ import annotations

from collections.abc import Callable

from maxinstr.analyze.commands import Commands
from maxinstr.analyze.rules.base import MIX_FINDINGS, MIX_HEALTHY, Draft, any_stage_has
from maxinstr.analyze.rules.coverage import rule_no_gpu_data, rule_no_kernels, rule_no_stages, rule_unattributed
from maxinstr.analyze.rules.hot_kernels import rule_dominant_kernel, rule_naive_matmul
from maxinstr.analyze.rules.measurement import rule_observer_cost, rule_perturbed, rule_throttled, rule_warmup_contamination
from maxinstr.analyze.rules.mix import (rule_attention_dominated_decode, rule_healthy_decode, rule_low_bit, rule_moe_decode,
                                        rule_unfused)
from maxinstr.analyze.rules.pace import rule_launch_bound
from maxinstr.analyze.rules.reprefill import rule_reprefill
from maxinstr.analyze.rules.stragglers import rule_straggler
from maxinstr.analyze.schema import Bottleneck, Finding, Report, TimeKey
from maxinstr.rundir.launch_record import LaunchRecord

Rule = Callable[[Report, Commands], list[Draft]]
RULES: list[Rule] = [
    rule_no_stages, rule_no_gpu_data, rule_no_kernels, rule_unattributed, rule_perturbed, rule_observer_cost,
    rule_warmup_contamination, rule_healthy_decode, rule_attention_dominated_decode, rule_moe_decode, rule_low_bit,
    rule_unfused, rule_reprefill, rule_launch_bound, rule_naive_matmul, rule_throttled, rule_dominant_kernel,
    rule_straggler,
]


def diagnose(report: Report, launch: LaunchRecord | None = None) -> list[Finding]:
    """Every rule over ``report`` (``launch``: what `maxinstr run` recorded, for the commands);
    findings sorted by score (facts first on ties), a stage's pace finding ahead of its others."""
    cmd = Commands(report, launch)
    drafts = [d for rule in RULES for d in rule(report, cmd)]
    # one mix verdict per stage before dropping parents' duplicates: a parent whose inclusive mix
    # is low-bit (a child's low_bit_weights) is not then left with "healthy dense decode"
    drafts = _deepest_only(report, _one_mix_per_stage(drafts))
    _pace_first_notes(drafts)
    drafts.sort(key=lambda d: (-d.final_score, d.verdict != "fact"))
    # what limits a stage comes before the stage's other findings, whatever the scores
    for pace in [d for d in drafts if d.pace and d.stage]:
        i = drafts.index(pace)
        first = next(j for j, d in enumerate(drafts) if d.stage == pace.stage and (not d.pace or d is pace))
        if first < i:
            drafts.insert(first, drafts.pop(i))
    return [d.finding() for d in drafts]


def _one_mix_per_stage(drafts: list[Draft]) -> list[Draft]:
    """One kernel-mix verdict per stage ("healthy" never beside "misses fused kernels"): a problem
    or a re-prefill rules out the healthy verdicts, the top-scored problem is the verdict with the
    others folded in (``also``); else the first of MIX_HEALTHY that fired."""
    by_stage: dict[str, list[Draft]] = {}
    reprefill = {d.stage: d for d in drafts if d.id == "reprefill_quadratic"}
    for d in drafts:
        if d.id in MIX_FINDINGS and d.stage:
            by_stage.setdefault(d.stage, []).append(d)
    drop: set[int] = set()
    for stage, ds in by_stage.items():
        problems = sorted((d for d in ds if d.id not in MIX_HEALTHY), key=lambda d: -d.score)
        healthy = sorted((d for d in ds if d.id in MIX_HEALTHY), key=lambda d: MIX_HEALTHY.index(d.id))
        if problems or stage in reprefill:
            drop.update(id(d) for d in healthy)
            verdict = problems[0] if problems else reprefill[stage]
            if healthy:
                verdict.supersedes = [d.id for d in healthy]
            verdict.also = problems[1:]
            drop.update(id(d) for d in verdict.also)
        elif len(healthy) > 1:
            drop.update(id(d) for d in healthy[1:])
            healthy[0].supersedes = [d.id for d in healthy[1:]]
    return [d for d in drafts if id(d) not in drop]


def _deepest_only(report: Report, drafts: list[Draft]) -> list[Draft]:
    """Drop a finding when a stage nested in its stage has the same one: the most specific stage
    is the actionable one (a launch-bound decode inside a request)."""
    parent = {s["name"]: s.get("parent") for s in report.get("stages", [])}
    ancestors_with: set[tuple[str, str]] = set()
    for fid, stage in {(d.id, d.stage) for d in drafts if d.stage}:
        seen, p = {stage}, parent.get(stage)
        while p is not None and p not in seen:
            ancestors_with.add((fid, p))
            seen.add(p)
            p = parent.get(p)
    return [d for d in drafts if not d.stage or (d.id, d.stage) not in ancestors_with]


def _pace_first_notes(drafts: list[Draft]) -> None:
    """Where launch_bound / host_bound fire they set the stage's pace: the stage's mix verdict is
    secondary to it (``paced_by``), dominant_kernel's "(but ...)" quotes its number, and the pace
    finding names what it outranks (``secondary``)."""
    # with two populations, the one that costs more speaks for the stage
    pace_by_stage = {d.stage: d for d in sorted(drafts, key=lambda d: d.score) if d.pace and d.stage}
    for stage, pace in pace_by_stage.items():
        assert pace.pace is not None
        mix = [d for d in drafts if d.stage == stage and d.id in MIX_FINDINGS]
        others = [d for d in drafts if d.stage == stage and d.id == "dominant_kernel"]
        for d in mix:
            d.paced_by = pace
        for d in others:
            if d.but:  # one number for the stage's pace in every finding: the pace finding's own
                d.but = pace.pace[0]
        pace.secondary = [d.id for d in mix + others]


def rank_bottlenecks(report: Report) -> list[Bottleneck]:
    """Stages ranked by their *self* time (``stages[].self_ns``), so a parent's own work (the
    matmuls between nested attention stages) competes with its children and nothing counts twice.
    One basis for all: GPU busy time when a trace is joined, else GPU event time, else projected
    span, else host time. ``share`` is of the summed self time."""
    rows: list[Bottleneck] = []
    findings = report.get("diagnosis", [])
    stages = report.get("stages", [])
    bases: tuple[TimeKey, ...] = ("gpu_busy_ns", "gpu_event_ns", "gpu_proj_ns", "host_ns")
    basis = next((key for key in bases if any_stage_has(stages, key)), None)
    if basis is None:
        return []
    parents = {st.get("parent") for st in stages}
    found: dict[str, set[str]] = {}  # stage -> its findings (a scan per stage is quadratic in 50k stages)
    for f in findings:
        stage = f.get("stage")
        if stage is not None and f["id"] not in MIX_HEALTHY:
            found.setdefault(stage, set()).add(f["id"])
    for st in stages:
        stat = st.get(basis) or {}
        if not stat.get("n"):
            continue
        total = float(stat.get("total", 0.0))
        own = float((st.get("self_ns") or {}).get(basis, total))
        if own <= 0:
            continue
        mix = st.get("mix")
        fam = (mix.get("families") or [{}])[0] if mix else {}
        top = (mix.get("top_kernels") or [{}])[0] if mix else {}
        name = st["name"]
        ids = found.get(name)
        rows.append({
            "stage": name, "basis": basis, "self_ns": own, "total_ns": total,
            "median_ns": stat["median"], "instances": stat["n"],
            "has_children": name in parents,
            "top_family": fam.get("family"), "top_family_share": fam.get("share"),
            "top_kernel": top.get("name"), "top_kernel_share": top.get("share"),
            "findings": sorted(ids) if ids else [],
        })
    grand = sum(r["self_ns"] for r in rows)
    rows.sort(key=lambda r: -r["self_ns"])
    for i, r in enumerate(rows, 1):
        r["share"] = r["self_ns"] / grand if grand > 0 else 0.0
        r["rank"] = i
    return rows
