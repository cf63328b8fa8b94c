"""What the rules share: finding ids, the draft a rule makes, common thresholds, stage helpers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from maxinstr._text import kernel_label
from maxinstr.analyze.commands import Commands
from maxinstr.analyze.schema import Finding, MixKernel, PopulationGroup, Report, Stage, StatisticKey

FindingId = Literal[
    "no_stages", "no_gpu_data", "no_kernels", "unattributed_gpu_time", "profiled_timings", "observer_cost",
    "warmup_contamination", "healthy_dense_decode", "attention_dominated_decode", "moe_decode", "moe_routing_overhead",
    "low_bit_weights", "low_bit_quant_overhead", "unfused_custom_architecture", "reprefill_quadratic", "launch_bound",
    "host_bound", "naive_matmul", "throttled", "dominant_kernel", "straggler_rank"]
"""Every rule's id (docs/report.md); a saved report's is a ``str``: a later maxinstr may add rules."""

MIX_FINDINGS: tuple[FindingId, ...] = (
    "moe_routing_overhead", "low_bit_quant_overhead", "unfused_custom_architecture", "attention_dominated_decode",
    "moe_decode", "low_bit_weights", "healthy_dense_decode")
"""Verdicts on a stage's kernel mix: diagnose keeps one per stage."""
MIX_HEALTHY: tuple[FindingId, ...] = ("moe_decode", "low_bit_weights", "healthy_dense_decode")
"""The mix verdicts that say nothing is wrong, in precedence order (an MoE stage is not also
"dense decode")."""
PACE_FINDINGS: tuple[FindingId, ...] = ("launch_bound", "host_bound")
"""Findings that say the GPU's kernels do not set the stage's pace (launches or the host do)."""
WORDS: dict[FindingId, str] = {
    "launch_bound": "launch limit", "host_bound": "host limit", "dominant_kernel": "its dominant kernel",
    "healthy_dense_decode": "its kernel mix", "attention_dominated_decode": "its attention share",
    "moe_decode": "its kernel mix", "moe_routing_overhead": "its MoE routing", "low_bit_weights": "its kernel mix",
    "low_bit_quant_overhead": "its quantization kernels", "unfused_custom_architecture": "its unfused kernels"}
"""Findings named in another finding's words, so its prose reads without the rule ids."""
PLURAL_WORDS: frozenset[FindingId] = frozenset({"low_bit_quant_overhead", "unfused_custom_architecture"})
"""Those whose words are plural ("its unfused kernels come second")."""

LAUNCH_BOUND_BUSY = 0.6
HOST_BOUND_GPU_OVER_HOST = 0.3
MIN_STAGE_SHARE = 0.05  # stages below this share of the top-level time are not diagnosed
DECODE_NAME = re.compile(r"decode|generat|next_?token|token_?step", re.IGNORECASE)


@dataclass(eq=False)
class Draft:
    """A finding as a rule makes it (``score``: the rough share of time at stake, 0..1), before
    :func:`maxinstr.analyze.diagnosis.diagnose` relates a stage's drafts (:meth:`finding`)."""

    id: FindingId
    title: str
    verdict: Literal["fact", "hypothesis"]
    stage: str | None
    evidence: dict[str, Any]
    next_step: str
    command: str | None = None
    validation: str | None = None
    score: float = 0.0
    pace: tuple[str, float] | None = None
    """launch_bound / host_bound: what limits the stage as a clause, and the share of the stage
    the GPU's kernels fill."""
    but: str | None = None
    """dominant_kernel: why a faster kernel would not shorten the stage yet, as a clause."""
    supersedes: list[FindingId] = field(default_factory=list)
    also: list[Draft] = field(default_factory=list)
    """Mix problems of the stage folded into this one."""
    paced_by: Draft | None = None
    """The stage's pace finding, where it makes this mix verdict secondary."""
    secondary: list[FindingId] = field(default_factory=list)
    """What this pace finding outranks on its stage."""

    def __post_init__(self) -> None:
        self.score = round(float(self.score), 4)

    @property
    def final_score(self) -> float:
        """A secondary mix verdict's score, scaled by the share of the stage the kernels fill."""
        return round(self.score * self.paced_by.pace[1], 4) if self.paced_by and self.paced_by.pace else self.score

    def finding(self) -> Finding:
        title, step, ev = self.title, self.next_step, dict(self.evidence)
        if self.supersedes:
            ev["supersedes"] = list(self.supersedes)
        if self.also:
            ev["also"] = [{"id": d.id, "title": d.title, "evidence": d.evidence} for d in self.also]
            prefix = f"'{self.stage}'"
            title += "; also " + "; ".join(d.title[len(prefix):].lstrip(" :") if d.title.startswith(prefix) else d.title
                                           for d in self.also)
            step += "".join(f" Also: {d.next_step}" for d in self.also)
        if self.paced_by and self.paced_by.pace:
            title += f" (secondary: {self.paced_by.pace[0]}, which sets the pace)"
            step = (f"The {WORDS[self.paced_by.id]} sets this stage's pace: fix it first; until then a better kernel mix "
                    "would not shorten the stage much. Then: " + step)
            ev["paced_by"] = self.paced_by.id
        if self.but:
            title += f" (but {self.but})"
        if self.secondary:
            said = " and ".join(WORDS[x] for x in self.secondary)
            one = len(self.secondary) == 1 and self.secondary[0] not in PLURAL_WORDS
            ev["secondary"] = list(self.secondary)
            title += f"; this sets the stage's pace, {said} come{'s' if one else ''} second"
            step = f"This limits the stage first: {said} matter{'s' if one else ''} once it is fixed. " + step
        return {"id": self.id, "title": title, "verdict": self.verdict, "stage": self.stage, "evidence": ev,
                "next_step": step, "command": self.command, "validation": self.validation, "score": self.final_score}


class PaceUnit(PopulationGroup, total=False):
    """One population of a stage, named and weighted as its share of the stage (pace rules)."""

    name: str
    leaf: str | None
    steady: int
    share_of_top: float


def fam_share(stage: Stage, *families: str) -> float:
    mix = stage.get("mix") or {}
    return float(sum(f["share"] for f in mix.get("families", []) if f["family"] in families))


def stage_weight(report: Report, stage: Stage | PaceUnit) -> float:
    """Share of top-level time a stage accounts for (1.0 when unknown, e.g. a single stage)."""
    s = stage.get("share_of_top")
    # reports saved before it was bounded (h200_kvcache_b16.report.json: decode 2.79) are still read
    return 1.0 if s is None else min(float(s), 1.0)


def any_stage_has(stages: list[Stage], key: StatisticKey) -> bool:
    """Whether some stage has values of statistic ``key`` (a saved report of an older version may lack one)."""
    try:
        return any(st[key]["n"] for st in stages)
    except (KeyError, TypeError):
        return any((st.get(key) or {}).get("n") for st in stages)


def significant(report: Report, stage: Stage) -> bool:
    return stage.get("steady", 0) > 0 and stage_weight(report, stage) >= MIN_STAGE_SHARE


def leaf_stages(report: Report) -> list[Stage]:
    """Stages that are no other stage's usual parent: where kernels are most specific."""
    parents = {s.get("parent") for s in report.get("stages", [])}
    return [s for s in report.get("stages", []) if s["name"] not in parents]


def median(stage: Stage | PaceUnit, key: StatisticKey) -> float | None:
    stat = stage.get(key) or {}
    return stat.get("median") if stat.get("n") else None


def kernel_names(st: Stage) -> list[str]:
    return [k["name"] for k in (st.get("mix") or {}).get("top_kernels", [])]


def kernel_id(name: str) -> str:
    """A kernel's identifier without namespaces and template/argument lists
    (``void at::native::<unnamed>::CatArrayBatchedCopy<...>(...)`` -> ``CatArrayBatchedCopy``)."""
    text = name.replace("<unnamed>", "").replace("(anonymous namespace)", "").replace("void ", "", 1).strip()
    base = re.split(r"[<(]", text, maxsplit=1)[0].strip()
    return base.split("::")[-1] or name


def kernel_regex(name: str, rivals: list[str] | tuple[str, ...] = ()) -> str:
    """A regex that picks this kernel out of a stage for `maxinstr deep-dive --kernel` (the top
    kernel it matches): its whole identifier, or its whole name, anchored, where that also
    matches one of ``rivals`` (kernels with as much of the stage's time or more)."""
    rx = re.escape(kernel_id(name))
    if any(re.search(rx, other) for other in rivals if other != name):
        rx = f"^{re.escape(name)}$"
    return rx


def short(name: str, n: int = 70) -> str:
    """A kernel's label (maxinstr._text.kernel_label), cut to ``n``."""
    name = kernel_label(name)
    return name if len(name) <= n else name[: n - 1] + "…"


def deep_dive(cmd: Commands, st: Stage, family: str | None = None, kernel: MixKernel | None = None) -> str | None:
    """deep-dive into the stage's top kernel (of ``family`` where it has one), or ``kernel``."""
    top: list[MixKernel] = (st.get("mix") or {}).get("top_kernels", [])
    kernels = [kernel] if kernel is not None else top
    if family and kernel is None:
        kernels = [k for k in kernels if k["family"] == family] or kernels
    if not kernels:
        return None
    k = kernels[0]
    return cmd.deep_dive(kernel_regex(k["name"], [o["name"] for o in top if o["share"] >= k["share"]]), st["name"])
