"""Diagnosis rules: each reads the report's evidence and says what it saw.

A rule is a function ``rule(report) -> list[finding]``; :data:`RULES` lists them in the order
they run. A finding is a plain dict:

``id``        stable rule id (docs/report.md explains each)
``title``     one line
``verdict``   ``"fact"`` (measured, holds by the numbers) or ``"hypothesis"`` (a likely cause
              the numbers point to, to be confirmed)
``stage``     the stage it concerns, or None
``evidence``  the numbers that fired it (units in the key names)
``next_step`` what to do next; ``command`` the exact command where there is one
``validation`` how to prove an optimisation it suggests worked
``score``     rough share of time at stake (0..1), used to rank

Rules only read the report dict, so they are tested on reports built from real fixtures.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from typing import Any, Literal

from maxinstr._text import kernel_label
from maxinstr._units import ns_text as _fmt_ns
from maxinstr.analyze.families import MATMUL_FAMILIES, scanned
from maxinstr.analyze.schema import (Bottleneck, Finding, MixKernel, PopulationGroup, Report, Stage, StartupRow,
                                     StatisticKey, StepTrend, TimeKey)

MATMUL = tuple(sorted(MATMUL_FAMILIES))
DECODE_NAME = re.compile(r"decode|generat|next_?token|token_?step", re.IGNORECASE)
PREFILL_NAME = re.compile(r"prefill|prompt|context|encode", re.IGNORECASE)

# thresholds, named so docs/report.md and tests can quote them
HEALTHY_MATMUL_SHARE = 0.5
ATTENTION_DOMINATES = 0.4
MOE_GROUPED_SHARE = 0.15
ROUTING_RIVALS = 0.5  # routing >= half the grouped matmul time
QUANT_VS_MATMUL = 0.25
UNFUSED_ELEMENTWISE_SHARE = 0.3
UNFUSED_SOFTMAX_SHARE = 0.02  # below this a softmax is more likely a loss's log-softmax than attention
REPREFILL_SPEARMAN = 0.8  # monotone trend: under no trend P(rho >= 0.8) = 1.1% at 8 steps, less with more
REPREFILL_WORK_GROWTH = 1.2  # last/first quarter of the steps, on GPU op time and on the matmul time (or op count)
REPREFILL_GROWTH = 1.5  # the same on a time span, when the input has no kernels (a run without a trace)
REPREFILL_MIN_STEPS = 8
REPREFILL_KERNEL_OVERLAP = 0.6
LAUNCH_BOUND_BUSY = 0.6
LAUNCH_BOUND_MIN_KERNELS = 5
HOST_BOUND_GPU_OVER_HOST = 0.3
THROTTLED_SHARE = 0.05
DOMINANT_KERNEL_SHARE = 0.4
NAIVE_MATMUL_SHARE = 0.1  # MAX's fallback matmul: a finding from this share of a stage's GPU time
MIN_STAGE_SHARE = 0.05  # stages below this share of the top-level time are not diagnosed


def _finding(id: str, title: str, verdict: Literal["fact", "hypothesis"], stage: str | None, evidence: dict[str, Any],
             next_step: str, command: str | None = None, validation: str | None = None, score: float = 0.0) -> Finding:
    assert verdict in ("fact", "hypothesis")
    return {"id": id, "title": title, "verdict": verdict, "stage": stage, "evidence": evidence,
            "next_step": next_step, "command": command, "validation": validation, "score": round(float(score), 4)}


def _fam_share(stage: Stage, *families: str) -> float:
    mix = stage.get("mix") or {}
    return float(sum(f["share"] for f in mix.get("families", []) if f["family"] in families))


def _stage_weight(report: Report, stage: Stage | PaceUnit) -> float:
    """Share of top-level time a stage accounts for (1.0 when unknown, e.g. a single stage)."""
    s = stage.get("share_of_top")
    # Reports built now have share_of_top <= 1 (report._share_of_top counts a stage only inside
    # steady top-level instances). Reports saved before that counted a child's steady instances
    # under warm-up parents too and can exceed 1 (tests/data/reports/h200_kvcache_b16.report.json:
    # decode 2.79); the rules still read those, and no stage accounts for more than all of the time.
    return 1.0 if s is None else min(float(s), 1.0)


def _any_stage_has(stages: list[Stage], key: StatisticKey) -> bool:
    """Whether some stage has values of statistic ``key`` (a report's rows always carry every
    statistic; a saved report of an older version may lack one)."""
    try:
        return any(st[key]["n"] for st in stages)
    except (KeyError, TypeError):
        return any((st.get(key) or {}).get("n") for st in stages)


def _significant(report: Report, stage: Stage) -> bool:
    return stage.get("steady", 0) > 0 and _stage_weight(report, stage) >= MIN_STAGE_SHARE


def _report_arg(report: Report) -> str:
    """The input of this report as `maxinstr report` / `deep-dive` arguments (shell-quoted):
    the run directory, with ``--trace`` when a trace came with it; a trace alone as ``--trace``."""
    src = report.get("sources", {})
    run, trace = src.get("run"), src.get("trace")
    if run and trace:
        return f"{shlex.quote(str(run))} --trace {shlex.quote(str(trace))}"
    if run:
        return shlex.quote(str(run))
    if trace:
        return f"--trace {shlex.quote(str(trace))}"
    return "REPORT.json"


def _deep_dive_arg(report: Report) -> str:
    """`maxinstr deep-dive`'s SOURCE (a run directory or a trace; a run's separate trace as --trace)."""
    src = report.get("sources", {})
    if src.get("trace") and not src.get("run"):
        return shlex.quote(str(src["trace"]))
    return _report_arg(report)


def _compare_cmd(report: Report) -> str:
    """compare before/after, with the inputs this report had, so that the command shows what
    the finding asks to check (kernels, GPU busy, matmul growth come from the trace). Each side
    best a folder of fresh-process repeats (maxinstr run --repeat 3), whose spread is what a
    verdict needs (one run a side "cannot tell"); compare finds a run's trace the way report does
    (meta.json), so only a trace given beside the run goes on the command line."""
    src = report.get("sources", {})
    run, trace = src.get("run"), src.get("trace")
    if not run:
        return f"maxinstr compare {shlex.quote(str(trace))} TRACE_AFTER" if trace else "maxinstr compare RUNS_BEFORE RUNS_AFTER"
    if trace and not _trace_found_with(report, str(run), str(trace)):
        return f"maxinstr compare {shlex.quote(str(run))} RUN_AFTER --trace {shlex.quote(str(trace))} --trace TRACE_AFTER"
    return f"maxinstr compare {shlex.quote(str(run))} RUNS_AFTER"


def _maxinstr_run(report: Report, *, with_profiler: bool = False) -> str:
    """The `maxinstr run` command that records this input's program again: the one the run
    recorded (launch.json's ``maxinstr_command``: its --stage specs, --warmup and every other
    option that shaped what it recorded), else ``maxinstr run -- PROGRAM``. ``with_profiler``
    (a step that asks for a profiler's kernels): a recorded ``--profiler none`` is left out."""
    words = _recorded_maxinstr_command(report)
    if words is None:
        cmd = report.get("environment", {}).get("command")
        script = shlex.join(str(c) for c in cmd) if isinstance(cmd, list) else "python YOUR_SCRIPT.py"
        return f"maxinstr run -- {script}"
    if with_profiler:
        cut = words.index("--") if "--" in words else len(words)
        opts = words[:cut]
        for i in range(len(opts) - 1, -1, -1):
            if opts[i] == "--profiler=none":
                del opts[i]
            elif opts[i] == "--profiler" and i + 1 < len(opts) and opts[i + 1] == "none":
                del opts[i:i + 2]
        words = opts + words[cut:]
    return shlex.join(words)


def _recorded_maxinstr_command(report: Report) -> list[str] | None:
    """``maxinstr_command`` of the run's launch.json (`maxinstr run` writes it), or None."""
    import json
    from pathlib import Path

    run = report.get("sources", {}).get("run")
    if not run:
        return None
    try:
        words = json.loads((Path(str(run)) / "launch.json").read_text(encoding="utf-8")).get("maxinstr_command")
    except (OSError, ValueError, AttributeError):
        return None
    return [str(w) for w in words] if isinstance(words, list) and words and all(isinstance(w, str) for w in words) else None


def _trace_found_with(report: Report, run: str, trace: str) -> bool:
    """Whether compare, given only the run directory, reads this trace too: the run's in-process
    kernels, or the trace its meta.json names (``maxinstr run`` records it)."""
    import os

    from maxinstr.rundir.format import run_artifact

    if report.get("sources", {}).get("trace_format") == "maxinstr-inprocess" or trace == run:
        return True
    prof = report.get("environment", {}).get("profiler")
    found = run_artifact(run, prof.get("trace")) if isinstance(prof, dict) else None
    return found is not None and os.path.realpath(found) == os.path.realpath(trace)


def _leaf_stages(report: Report) -> list[Stage]:
    """Stages that are no other stage's usual parent: where kernels are most specific."""
    parents = {s.get("parent") for s in report.get("stages", [])}
    return [s for s in report.get("stages", []) if s["name"] not in parents]


def _mixed_stages(report: Report) -> list[Stage]:
    return [s for s in report.get("stages", []) if s.get("mix") and _significant(report, s)]


def _kernel_id(name: str) -> str:
    """A kernel's identifier before its template/argument lists, without namespaces
    (``void at::native::<unnamed>::CatArrayBatchedCopy<...>(...)`` -> ``CatArrayBatchedCopy``), whole."""
    text = name.replace("<unnamed>", "").replace("(anonymous namespace)", "").replace("void ", "", 1).strip()
    base = re.split(r"[<(]", text, maxsplit=1)[0].strip()
    return base.split("::")[-1] or name


def _kernel_base(name: str) -> str:
    """:func:`_kernel_id` cut to 60 characters, to name a kernel in a sentence."""
    return _kernel_id(name)[:60]


def _kernel_regex(name: str, rivals: list[str] | tuple[str, ...] = ()) -> str:
    """A regex that picks this kernel out of a stage for `maxinstr deep-dive --kernel` (which takes
    the stage's top kernel the regex matches): its whole identifier before template/argument
    lists (a cut one could match another kernel), or, where that also matches one of ``rivals``
    (the kernels with as much of the stage's time or more), its whole name, anchored."""
    rx = re.escape(_kernel_id(name))
    if any(re.search(rx, other) for other in rivals if other != name):
        rx = f"^{re.escape(name)}$"
    return rx


# ----------------------------------------------------------------------------- rules
def rule_no_stages(report: Report) -> list[Finding]:
    if report.get("stages"):
        return []
    gpu = report.get("gpu") or {}
    return [_finding(
        "no_stages", "No stages in this input: only a whole-program kernel breakdown is possible", "fact", None,
        {"ops": gpu.get("ops", 0), "gpu_ns": gpu.get("gpu_ns", 0)},
        "Mark the pipeline's stages with maxinstr.stage(...) (or NVTX/roctx ranges) and capture again.",
        _maxinstr_run(report),
        score=0.0)]


def rule_no_gpu_data(report: Report) -> list[Finding]:
    stages = report.get("stages") or []
    if not stages or report.get("gpu"):
        return []
    if _any_stage_has(stages, "gpu_event_ns") or _any_stage_has(stages, "gpu_proj_ns"):
        return []
    gpus = len(report.get("environment", {}).get("gpus") or [])
    again = _recorded_maxinstr_command(report) is not None
    if not gpus:
        # the command is the one for a GPU machine: on this one (none seen) it records the same
        step = ("Host times show where the program waits, not what the GPU does, and this machine has no GPU: "
                + ("run the same command on a GPU machine" if again else "run it on a GPU machine with the command")
                + " (GPU events are on by default there; the profiler adds the kernels).")
    else:
        step = ("Host times show where the program waits, not what the GPU does. The GPU was seen but no stage "
                "timed it: pass stream= (docs/guide.md), and add a profiler trace for kernels.")
    return [_finding(
        "no_gpu_data", "Only host times: no GPU event times were recorded and no trace was given", "fact", None,
        {"stages": len(stages), "gpus_seen": gpus}, step,
        _maxinstr_run(report, with_profiler=True),
        score=0.0)]


def rule_no_kernels(report: Report) -> list[Finding]:
    """A GPU run without a kernel trace: say what its GPU events and samples already show (GPU
    time against host time per stage, utilization, time outside every stage) and the command
    that adds the kernels."""
    stages = report.get("stages") or []
    if report.get("gpu") is not None or not stages:
        return []
    # (stage, host median, GPU event median, GPU over host, NVML utilization)
    shown: list[tuple[Stage, float, float | None, float | None, float | None]] = []
    for st in stages:
        if not _significant(report, st):
            continue
        host_stat, gpu_stat = st.get("host_ns") or {}, st.get("gpu_event_ns") or {}
        smp = st.get("samples") or {}
        util = None if smp.get("window_limited") else smp.get("gpu_util_pct_mean")
        if not host_stat.get("n") or not (gpu_stat.get("n") or util is not None):
            continue
        # GPU over host per instance, over the instances timed on both (with a GPU-timing budget
        # only some are: the two medians would describe different instances)
        over = st.get("gpu_event_over_host") or {}
        ratio = over["median"] if over.get("n") else None
        shown.append((st, host_stat["median"], gpu_stat.get("median") if gpu_stat.get("n") else None, ratio, util))
    if not shown:
        return []
    cov = report.get("coverage") or {}
    outside = 1 - cov["in_stages_ns"] / cov["wall_ns"] if cov.get("wall_ns") else None
    # the stage with the most time at stake: little GPU time for its host time, or a low utilization
    def idle(x: tuple[Stage, float, float | None, float | None, float | None]) -> float:
        st, _, _, ratio, util = x
        lack = max(1 - min(ratio, 1.0) if ratio is not None else 0.0, 1 - util / 100 if util is not None else 0.0)
        return lack * _stage_weight(report, st)
    st, host, gpu, ratio, util = max(shown, key=idle)
    parts = []
    if gpu is not None and ratio is not None:
        n_timed = (st.get("gpu_event_over_host") or {}).get("n", 0)
        parts.append(f"'{st['name']}' takes {_fmt_ns(gpu)} on its GPU stream and {_fmt_ns(host)} on the host "
                     f"(medians; GPU over host {ratio:.0%} per instance, over the {n_timed} timed on both)")
    if util is not None:
        parts.append(f"a kernel ran in {util:.0f}% of its time (NVML utilization)"
                     + (": the GPU is idle most of the stage, so the host (Python, launches) sets its pace"
                        if util < 100 * HOST_BOUND_GPU_OVER_HOST else ""))
    if outside is not None and outside >= 0.05:
        parts.append(f"{outside:.0%} of the run is outside every stage")
    ev: dict[str, Any] = {"stage": st["name"], "host_ns_median": host, "gpu_event_ns_median": gpu, "gpu_over_host": ratio,
          "gpu_util_pct_mean": util, "outside_stages_share": outside,
          "per_stage": [{"stage": s["name"], "host_ns_median": h, "gpu_event_ns_median": g, "gpu_util_pct_mean": u}
                        for s, h, g, _, u in shown]}
    step = ("The GPU events and samples say how much of each stage the GPU works, not what it runs. Capture the "
            "kernels: run the program under the profiler with the command below, or, without a profiler around it "
            "(a notebook, a server), maxinstr.session(..., kernels=True) collects them in the process (NVIDIA, "
            "pip install 'maxinstr[cupti]'); the report then says whether the stage is launch-, host- or kernel-bound.")
    if ratio is not None and ratio < HOST_BOUND_GPU_OVER_HOST:
        step = "The stage's GPU work is a small part of it: the host sets its pace (see host_ns). " + step
    elif util is not None and util < 100 * HOST_BOUND_GPU_OVER_HOST:
        step = ("The GPU stream spans the stage but a kernel runs in little of it: the stream waits on the host "
                "between launches. " + step)
    return [_finding(
        "no_kernels", "No kernel trace; what the GPU numbers show: " + "; ".join(parts), "fact", st["name"], ev,
        step, _maxinstr_run(report, with_profiler=True),
        validation=_compare_cmd(report) + "  # with the kernels, the stage's GPU busy and its findings",
        score=0.5 * idle((st, host, gpu, ratio, util)))]


def rule_unattributed(report: Report) -> list[Finding]:
    gpu = report.get("gpu") or {}
    share = gpu.get("attributed_share")
    if share is None or not report.get("stages") or share >= 0.5:
        return []
    return [_finding(
        "unattributed_gpu_time", f"{(1 - share):.0%} of GPU time ran outside every stage", "fact", None,
        {"attributed_share": share, "gpu_ns": gpu.get("gpu_ns")},
        "Wrap the remaining GPU work in stages (or check the trace's correlation ids: see sources.notes).",
        score=1 - share)]


def rule_warmup_contamination(report: Report) -> list[Finding]:
    warm_n = report.get("warmup", {}).get("n", 0)
    by_stage: dict[str, list[StartupRow]] = {}
    for row in report.get("startup", []):
        if row["reason"] == "cold_start":
            by_stage.setdefault(row["stage"], []).append(row)
    stages = {s["name"]: s for s in report.get("stages", [])}
    ratios: dict[str, float] = {}
    worst_stage, worst_ratio, n_cold = None, 0.0, 0
    # warm-up=K covers the first K top-level instances and everything inside them, so the
    # suggestion is counted in top-level instances: one more than the last that held a cold start
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
    top_total = top.get("instances", 0)
    evidence: dict[str, Any] = {"cold_instances": n_cold, "worst_stage": worst_stage, "worst_ratio": round(worst_ratio, 2),
                "ratio_by_stage": ratios, "session_warmup": warm_n, "excluded_from_headline": True,
                "suggested_warmup": None, "top_stage": top_stage}
    head = report.get("warmup", {}).get("pipeline_head")
    if suggested < top_total:
        evidence["suggested_warmup"] = max(suggested, warm_n)
        k = evidence["suggested_warmup"]
        covered = (f"the first {'pipeline iteration' if k == 1 else f'{k} pipeline iterations'}, each from one '{top_stage}' "
                   "to the next" if head == top_stage
                   else f"the first {k} '{top_stage}' and everything inside them")
        step = (f"Already excluded from the headline numbers. Declare them as warm-up so every tool agrees: "
                f"maxinstr.session(..., warmup={k}) ({covered}), or run warm-up iterations before the measured "
                f"loop.")
        command = f"maxinstr report {_report_arg(report)} --warmup {evidence['suggested_warmup']}"
    else:
        # a larger warmup would leave no steady top-level instance at all
        step = (f"Already excluded from the headline numbers. They ran in the last '{top_stage}' instance, so no "
                f"warm-up count can cover them and keep a steady '{top_stage}': run more '{top_stage}' instances "
                f"(at least {suggested + 1}) or warm-up iterations before the measured loop.")
        command = None
    return [_finding(
        "warmup_contamination",
        f"{n_cold} first-call instance(s) of {names} ran up to {worst_ratio:.1f}x the steady median "
        f"(cold start: compilation, allocation, cache fill)",
        "fact", worst_stage if len(ratios) == 1 else None, evidence, step, command, score=0.01)]


def rule_healthy_decode(report: Report) -> list[Finding]:
    out = []
    for st in _mixed_stages(report):
        if not DECODE_NAME.search(scanned(st.get("leaf", st["name"]))):
            continue
        mm = _fam_share(st, *MATMUL)
        others = {f: _fam_share(st, f) for f in ("attention", "normalization", "elementwise", "softmax", "rope",
                                                  "reduction", "quantization", "routing")}
        biggest_other = max(others.items(), key=lambda kv: kv[1])
        busy = (st.get("gpu_busy_frac") or {}).get("median")
        if mm >= HEALTHY_MATMUL_SHARE and biggest_other[1] < mm:
            ev: dict[str, Any] = {"matmul_share": round(mm, 3), **{f"{k}_share": round(v, 3) for k, v in others.items() if v > 0}}
            if busy is not None:
                ev["gpu_busy_frac_median"] = round(busy, 3)
            busy_ns = (st.get("gpu_busy_ns") or {}).get("median") if (st.get("gpu_busy_ns") or {}).get("n") else None
            host_med = (st.get("host_ns") or {}).get("median") if (st.get("host_ns") or {}).get("n") else None
            if busy_ns is not None and host_med:
                ev["gpu_over_host"] = round(busy_ns / host_med, 3)
            title = (f"'{st['name']}' kernel mix is healthy dense decode: matmul {mm:.0%} of its GPU time, "
                     + (f"{biggest_other[0]} next at {biggest_other[1]:.0%}" if biggest_other[1] >= 0.01
                        else "no other compute family above 1%"))
            # when launch_bound / host_bound fire on the same stage, diagnose() says here that they set
            # the stage's pace (see _pace_notes): the mix is right, the time goes elsewhere
            step = ("With this mix decode is usually weight-bandwidth bound: gains come from fewer bytes "
                    "(lower-precision weights), larger batch, or faster matmul kernels; check the dominant "
                    "matmul's achieved bandwidth with a deep dive.")
            out.append(_finding("healthy_dense_decode", title, "fact", st["name"], ev, step,
                                _deep_dive(report, st, family="gemv"), score=0.0))
    return out


def rule_attention_dominated_decode(report: Report) -> list[Finding]:
    out = []
    for st in _mixed_stages(report):
        if not DECODE_NAME.search(scanned(st.get("leaf", st["name"]))):
            continue
        att, mm = _fam_share(st, "attention"), _fam_share(st, *MATMUL)
        if att < ATTENTION_DOMINATES or att <= mm:
            continue
        kernels = [k for k in (st.get("mix") or {})["top_kernels"] if k["family"] == "attention"]
        ev: dict[str, Any] = {"attention_share": round(att, 3), "matmul_share": round(mm, 3)}
        if kernels:
            ev.update({"attention_kernel": kernels[0]["name"], "attention_kernel_median_ns": kernels[0]["median_ns"],
                       "attention_per_instance": kernels[0].get("per_instance")})
        out.append(_finding(
            "attention_dominated_decode",
            f"'{st['name']}': attention takes {att:.0%} of decode GPU time, more than the matmuls ({mm:.0%})",
            "hypothesis", st["name"], ev,
            "At short context a decode step should be dominated by weight matmuls. Attention this large means a very "
            "long context, or an attention kernel not made for one query token (a prefill kernel, an unusual head "
            "dimension, no flash-decoding / paged-attention path). Check the head dimension and the attention backend.",
            _deep_dive(report, st, family="attention"),
            validation=_compare_cmd(report) + "  # attention share and decode median must fall beyond the noise bound",
            score=(att - mm) * _stage_weight(report, st)))
    return out


MOE_PERMUTATION = re.compile(r"sort|histogram|bincount|index_?add|indexFunc.*ReduceAdd|scatter_?add", re.IGNORECASE)
"""Generic kernels that, in a stage running grouped expert matmuls, are the routing path's token
permutation: sorting tokens by expert (and top-k's own sort of its k results), counting tokens
per expert, and the weighted scatter-add that combines expert outputs. Their names say nothing
about MoE (families: reduction), so the MoE rule counts them beside the routing family."""


ROUTING_FAMILIES = ("routing", "top_k")
"""Families a stage running grouped expert matmuls spends on routing: the router's own kernels
and its top-k (a bare top-k is the expert choice there, as it is a sampler's top-k elsewhere)."""


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


def rule_moe_decode(report: Report) -> list[Finding]:
    out = []
    for st in _mixed_stages(report):
        grouped = _fam_share(st, "grouped_matmul")
        if grouped < MOE_GROUPED_SHARE:
            continue
        routing_family = _fam_share(st, *ROUTING_FAMILIES)
        perm, perm_names = moe_permutation(st)
        routing = routing_family + perm
        ev: dict[str, Any] = {"grouped_matmul_share": round(grouped, 3), "routing_share": round(routing, 3),
              "routing_family_share": round(routing_family, 3), "permutation_share": round(perm, 3),
              "permutation_kernels": [_kernel_regex(n) for n in perm_names],
              "routing_over_grouped": round(routing / grouped, 3) if grouped else None}
        if routing >= ROUTING_RIVALS * grouped:
            counted = moe_routing_kernels(st)
            out.append(_finding(
                "moe_routing_overhead",
                f"'{st['name']}': MoE routing takes {routing:.0%} of GPU time, rivalling the expert matmuls ({grouped:.0%})"
                + (f"; {perm:.0%} of it in generic sort/histogram/scatter-add kernels (token permutation)" if perm else ""),
                "hypothesis", st["name"], ev,
                "Routing (top-k, index creation, permutation) should be a small fraction of the expert matmuls. "
                "Look for a fused top-k/routing kernel, or unfused sort/scan steps in the routing path.",
                # the largest kernel of what the title counts (a permutation sort can outweigh top-k)
                _deep_dive(report, st, kernel=counted[0] if counted else None),
                validation=_compare_cmd(report) + "  # routing share and stage median must drop beyond the noise bound",
                score=routing * _stage_weight(report, st)))
        else:
            out.append(_finding(
                "moe_decode", f"'{st['name']}' is MoE: grouped matmul {grouped:.0%}, routing {routing:.0%} (small)",
                "fact", st["name"], ev, "Routing is not the problem; the grouped expert matmuls are the work.",
                score=0.0))
    return out


def rule_low_bit(report: Report) -> list[Finding]:
    out = []
    for st in _mixed_stages(report):
        q = _fam_share(st, "quantization")
        mm = _fam_share(st, *MATMUL)
        if q <= 0 or mm <= 0:
            continue
        ratio = q / mm
        ev: dict[str, Any] = {"quantization_share": round(q, 3), "matmul_share": round(mm, 3), "quant_over_matmul": round(ratio, 3)}
        if ratio >= QUANT_VS_MATMUL:
            out.append(_finding(
                "low_bit_quant_overhead",
                f"'{st['name']}': quantize/dequantize/scale kernels cost {ratio:.0%} of the matmul time they feed",
                "hypothesis", st["name"], ev,
                "Activation quantization or weight dequantization runs as separate kernels. Fuse it into the matmul "
                "(prologue/epilogue), pre-quantize weights offline, or use a kernel that takes the low-bit format directly.",
                _deep_dive(report, st, family="quantization"),
                validation=_compare_cmd(report) + "  # quantization share must fall and the stage median drop beyond noise; check accuracy too",
                score=q * _stage_weight(report, st)))
        else:
            out.append(_finding(
                "low_bit_weights", f"'{st['name']}': low-bit path, quantization {ratio:.0%} of matmul time (small)",
                "fact", st["name"], ev, "Quantization overhead is small relative to the matmuls.", score=0.0))
    return out


def _names(st: Stage) -> list[str]:
    return [k["name"] for k in (st.get("mix") or {}).get("top_kernels", [])]


CONCAT_KERNEL = re.compile(r"CatArray|concat|\bcat_", re.IGNORECASE)
"""Concatenation kernels (PyTorch's torch.cat is CatArrayBatchedCopy): family elementwise by name;
in a decode stage the usual source is a KV cache extended by concatenation each step."""


def rule_unfused(report: Report) -> list[Finding]:
    out = []
    for st in _mixed_stages(report):
        names = " ".join(_names(st)).lower()
        mm = _fam_share(st, *MATMUL)
        att = _fam_share(st, "attention")
        ew = _fam_share(st, "elementwise")
        reasons = []
        ev: dict[str, Any] = {"matmul_share": round(mm, 3), "attention_share": round(att, 3),
                              "elementwise_share": round(ew, 3)}
        if mm > 0 and att == 0:
            soft = _fam_share(st, "softmax")
            manual_softmax = "exp_kernel" in names and "maxops" in names
            if soft >= UNFUSED_SOFTMAX_SHARE or manual_softmax:
                reasons.append("attention runs as matmul + softmax kernels (no fused attention kernel)")
                ev["softmax_share"] = round(soft, 3)
                ev["softmax_from_exp_and_max_reduce"] = manual_softmax
        if _fam_share(st, "normalization") == 0 and "rsqrt" in names and ("pow_tensor" in names or "meanops" in names):
            reasons.append("normalization is built from pow/mean/rsqrt kernels (no fused rms_norm/layer_norm)")
            ev["unfused_norm_markers"] = [m for m in ("pow_tensor", "meanops", "rsqrt") if m in names]
        if ("cos" in names and "sin" in names) and _fam_share(st, "rope") == 0 and "triton" not in names:
            reasons.append("rotary embedding computed with separate cos/sin elementwise kernels")
        concat = 0.0
        if mm > 0 and ew >= UNFUSED_ELEMENTWISE_SHARE:
            ew_kernels = [k for k in (st.get("mix") or {}).get("top_kernels", []) if k["family"] == "elementwise"]
            ev["top_elementwise_kernels"] = [{"kernel": _kernel_regex(k["name"]), "share": round(k["share"], 3)}
                                             for k in ew_kernels[:3]]
            cat = [k for k in ew_kernels if CONCAT_KERNEL.search(scanned(k["name"]))]
            concat = float(sum(k["share"] for k in cat))
            reason = f"elementwise kernels take {ew:.0%} of GPU time next to {mm:.0%} matmul"
            if concat >= 0.5 * ew:
                ev["concat_share"] = round(concat, 3)
                reason += (f", {concat:.0%} of the stage in concatenation ({_kernel_base(cat[0]['name'])}): "
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
        out.append(_finding(
            "unfused_custom_architecture",
            f"'{st['name']}' misses fused kernels: " + "; ".join(reasons),
            "hypothesis", st["name"], ev, step,
            _deep_dive(report, st, family="elementwise" if ew >= UNFUSED_ELEMENTWISE_SHARE else None),
            validation=_compare_cmd(report) + "  # the stage's kernels per instance must fall and its median beyond the noise bound",
            score=max(ew, _fam_share(st, "softmax", "reduction")) * _stage_weight(report, st)))
    return out


def _kernel_overlap(a: Stage, b: Stage) -> float:
    """Shared GPU time of two stages' kernel mixes: sum over kernel names of the smaller share.

    1.0 when both run the same kernels in the same proportions. Kernel names carry the tile
    shape (``nvjet_..._64x8_...`` for a decode GEMV-like matmul, ``..._64x64_...`` for prefill),
    so a decode step that re-runs the prompt shows the prefill's kernels, not just its families.
    """
    ka = {k["name"]: k["share"] for k in (a.get("mix") or {}).get("top_kernels", [])}
    kb = {k["name"]: k["share"] for k in (b.get("mix") or {}).get("top_kernels", [])}
    return float(sum(min(ka[n], kb[n]) for n in ka.keys() & kb.keys()))


def _grows(tr: StepTrend | None, ratio: float) -> bool:
    """A trend (stats.step_trend) rising with the step. Ratios are null in a saved report when the
    first quarter is 0 (a stage without matmuls): no growth."""
    if not tr:
        return False
    return (tr.get("n_steps") or 0) >= REPREFILL_MIN_STEPS \
        and (tr.get("spearman") or 0) >= REPREFILL_SPEARMAN and (tr.get("last_over_first") or 0) >= ratio


def _round(v: float | None, digits: int) -> float | None:
    """``round(v)``; None stays None (a ratio a saved report has as null: the first quarter was 0)."""
    return None if v is None else round(v, digits)


def _trend_ev(prefix: str, tr: StepTrend) -> dict[str, Any]:
    return {f"{prefix}_first_quarter_ns": tr["first_quarter_median_ns"],
            f"{prefix}_last_quarter_ns": tr["last_quarter_median_ns"],
            f"{prefix}_slope_ns_per_step": round(tr["slope_ns_per_step"], 1)}


def rule_reprefill(report: Report) -> list[Finding]:
    """A decode whose every step re-runs the whole sequence (no KV cache): O(n^2) overall.

    Two signals, both required when the trace gives the kernels (``stages[].step_work``):

    1. *Growth*: the GPU op time a step launches rises with the step index (Spearman >=
       REPREFILL_SPEARMAN and last/first quarter >= REPREFILL_WORK_GROWTH). Op time, not the
       step's time span: other tenants, launch gaps and syncs stretch spans, not kernels.
    2. *Prefill-shaped work*: the part of a step that a KV-cached decode keeps constant grows
       too. With a cache, a step multiplies ONE token's activations by the weights: its matmul
       work (FLOPs and bytes) and its op count do not depend on the step index; only attention
       (reading a longer cache) and cache writes grow. Re-running the sequence multiplies all
       of it, like the prefill does, so the matmul time (or the op count) rises with the same
       trend and ratio.

    The kernel overlap with a prefill stage (shared GPU time by kernel name) is added as
    evidence. Without kernels (host or event times only) the rule fires on the time trend alone
    with the stricter REPREFILL_GROWTH, and says that the kernel mix was not seen.
    """
    out = []
    stages = report.get("stages", [])
    prefills = None  # found once a stage needs them: a regex per stage of 50,000 otherwise
    for st in stages:
        tr = st.get("steps")
        if not tr or tr.get("n_steps", 0) < REPREFILL_MIN_STEPS or not _significant(report, st):
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
                       "ops_per_step_last_over_first": _round(n_t["last_over_first"], 3)})
            ev.update({"basis": "gpu_op_ns", **_trend_ev("op_time", op_t), **_trend_ev("matmul_time", mm_t)})
            ev.update({"ops_per_step_first_quarter": n_t["first_quarter_median_ns"],
                       "ops_per_step_last_quarter": n_t["last_quarter_median_ns"],
                       "ops_spearman": round(n_t["spearman"], 3),
                       "matmul_grows": mm_grows, "op_count_grows": ops_grow})
            ev["span_basis"] = tr.get("basis")
            ev["span_spearman"], ev["span_last_over_first"] = round(tr["spearman"], 3), _round(tr["last_over_first"], 3)
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
        out.append(_finding(
            "reprefill_quadratic",
            f"'{st['name']}' GPU work grows with the step index ({growth:.2f}x from first to last quarter, "
            f"Spearman {rho:.2f}){shaped}: the whole sequence may be re-run every step (O(n^2))",
            "hypothesis", st["name"], ev,
            "Check that the KV cache is used: each decode step should process one new token, not the whole prefix "
            "(pass past_key_values / use_cache=True, or the engine's cached decode path). A batch that grows "
            "step by step (continuous batching) also grows the matmuls: rule it out. Then re-run and compare.",
            _compare_cmd(report),
            validation=_compare_cmd(report) + "  # the stage median must fall beyond the noise bound and its matmul "
                                                "growth (last over first quarter of the steps) fall to about 1.0x",
            score=_stage_weight(report, st) * (1 - 1 / growth)))
    return out


def _runs_max(st: Stage) -> bool:
    """The stage's kernels are Modular MAX's (Mojo kernels carry their own naming)."""
    from maxinstr.analyze.families import MAX_KERNEL

    return any(MAX_KERNEL.search(name) for name in _names(st))


def rule_naive_matmul(report: Report) -> list[Finding]:
    """MAX's naive matmul (its fallback where no tuned kernel covers the dtype and shape)
    taking a real share of a stage's GPU time."""
    from maxinstr.analyze.families import NAIVE_MATMUL

    out = []
    for st in _leaf_stages(report):
        mix = st.get("mix") or {}
        naive = [k for k in mix.get("top_kernels", []) if NAIVE_MATMUL.search(k["name"])]
        share = sum(k["share"] for k in naive)
        if not naive or share < NAIVE_MATMUL_SHARE or not _significant(report, st):
            continue
        # the deep dive takes the largest, and prints its own share: the title says both
        largest = max(naive, key=lambda k: k["share"])
        title = (f"'{st['name']}': MAX's naive matmul kernel takes {share:.0%} of the stage's GPU time" if len(naive) == 1
                 else f"'{st['name']}': MAX's naive matmul kernels take {share:.0%} of the stage's GPU time "
                      f"({len(naive)} kernels; the largest, {_short(largest['name'])}, {largest['share']:.0%})")
        out.append(_finding(
            "naive_matmul", title,
            "fact", st["name"],
            {"naive_share": round(share, 3), "kernels": [_short(k["name"], 60) for k in naive],
             "largest_kernel": largest["name"], "largest_share": round(largest["share"], 3),
             "per_instance": round(sum(k["per_instance"] for k in naive), 2)},
            "MAX falls back to matmul_kernel_naive where none of its tuned matmuls covers the dtype and shape "
            "(float32, or odd shapes). Run the model in bfloat16 and keep matmul dimensions multiples of 64 so "
            "the tuned kernels (sm90_matmul, gemv_split_k) apply.",
            _deep_dive(report, st, kernel=largest),
            validation=_compare_cmd(report) + "  # the naive kernel must leave the stage's top kernels",
            score=share * _stage_weight(report, st)))
    return out


GRAPH_REPLAY_SHARE = 0.5
"""A stage (or population) whose instances mostly launch CUDA-graph nodes already replays a graph."""


class PaceUnit(PopulationGroup, total=False):
    """What launch_bound / host_bound judge of a stage with two populations: one population's
    statistics, named and weighted as (its share of) its stage."""

    name: str
    leaf: str | None
    steady: int
    share_of_top: float


def _pace_units(report: Report, st: Stage) -> list[tuple[Stage | PaceUnit, str | None, PopulationGroup | None]]:
    """What launch_bound / host_bound judge for a stage: the stage itself, or, when its steady
    instances form two populations (``stages[].populations``), each population on its own (one
    busy fraction for a graph replay and an eager step is neither's). Each unit: (statistics,
    population label or None, the other population or None)."""
    pops = st.get("populations") or {}
    groups = pops.get("groups") or []
    if len(groups) != 2:
        return [(st, None, None)]
    basis = pops.get("basis", "host_ns")
    times = [float((g.get(basis) or {}).get("total", 0.0)) for g in groups]
    total = sum(times) or 1.0
    out: list[tuple[Stage | PaceUnit, str | None, PopulationGroup | None]] = []
    for i, g in enumerate(groups):
        unit: PaceUnit = {**g, "name": st["name"], "leaf": st.get("leaf"), "steady": g["instances"],
                          "share_of_top": _stage_weight(report, st) * times[i] / total}
        out.append((unit, g["label"], groups[1 - i]))
    return out


def _graph_advice(unit: Stage | PaceUnit, other: PopulationGroup | None, stage: Stage) -> str:
    """The launch-bound fix, without advising what the stage (or its other population) already does.
    ``stage``: the stage the unit is (part of), whose kernel mix says whether MAX runs it."""
    mine = unit.get("cuda_graph_share") or 0.0
    theirs = (other or {}).get("cuda_graph_share") or 0.0
    if mine >= GRAPH_REPLAY_SHARE:
        return ("These instances already replay a CUDA graph: the gaps are between its nodes. Fewer, larger "
                "kernels (fusion, torch.compile, a MAX graph) or more work per node shorten it; a graph does not.")
    if other is not None and theirs >= GRAPH_REPLAY_SHARE:
        def span(g: Stage | PaceUnit | PopulationGroup) -> float | None:
            return (g.get("gpu_proj_ns") or {}).get("median")

        return (f"The stage's other instances ({other['label']}) already replay a CUDA graph"
                + (f" ({_fmt_ns(span(other))} of GPU span against {_fmt_ns(span(unit))} here)" if span(other) and span(unit) else "")
                + ": run these from the graph too (find the shape, branch or input that misses the captured graph).")
    if _runs_max(stage):
        return ("Kernels are short and MAX's worker thread cannot launch them fast enough (it launches each "
                "graph op as its own kernel). Capture the step as a device graph (Model.capture(key, *inputs) "
                "once, then Model.replay(key, *inputs) each step: the inputs' shapes must stay fixed, so a KV "
                "cache preallocated, not grown by concat), or batch more sequences per step.")
    return ("Kernels are short and the host cannot launch them fast enough. Capture the stage in a CUDA/HIP "
            "graph, fuse small kernels (torch.compile, a MAX graph), or batch more work per launch.")


def rule_launch_bound(report: Report) -> list[Finding]:
    out = []
    for stage in report.get("stages", []):
        # a population has no more busy fractions than its stage: the cheap test first
        if (stage.get("gpu_busy_frac") or {}).get("n", 0) < 3 or not _significant(report, stage):
            continue
        for st, population, other in _pace_units(report, stage):
            out += _launch_or_host_bound(report, st, population, other, stage)
    return out


def _launch_or_host_bound(report: Report, st: Stage | PaceUnit, population: str | None, other: PopulationGroup | None,
                          stage: Stage) -> list[Finding]:
    out: list[Finding] = []
    busy = st.get("gpu_busy_frac") or {}
    host = st.get("host_ns") or {}
    proj = st.get("gpu_proj_ns") or {}
    busy_ns = st.get("gpu_busy_ns") or {}
    if busy.get("n", 0) < 3 or not host.get("n"):
        return out
    kpi = (st.get("kernels_per_instance") or {}).get("median")
    gaps = (st.get("idle_gap_ns") or {}).get("median")
    who = f"'{st['name']}'" + (f" ({population}, {st['instances']} instances)" if population else "")
    pop_ev: dict[str, Any] = {"population": population} if population else {}
    gap_ev = {**pop_ev, "gpu_busy_frac_median": round(busy["median"], 3), "idle_gap_ns_median": gaps,
              "gpu_proj_ns_median": proj.get("median"), "kernels_per_instance_median": kpi, "instances": busy["n"]}
    if busy["median"] < LAUNCH_BOUND_BUSY and (kpi or 0) >= LAUNCH_BOUND_MIN_KERNELS:
        out.append(_finding(
            "launch_bound",
            f"{who}: the GPU is busy only {round(busy['median'], 3):.0%} of the stage's GPU span "
            f"({kpi:.0f} kernels per instance with idle gaps between them)",
            "fact", st["name"], {**gap_ev, "cuda_graph_share": st.get("cuda_graph_share")},
            _graph_advice(st, other, stage),
            validation=_compare_cmd(report) + "  # the stage's GPU busy must rise and its median fall beyond the noise bound",
            score=(1 - busy["median"]) * _stage_weight(report, st)))
    elif busy["median"] < LAUNCH_BOUND_BUSY:
        out.append(_finding(
            "host_bound",
            f"{who}: the GPU is busy only {round(busy['median'], 3):.0%} of the stage's GPU span, between "
            f"{kpi or 0:.0f} ops per instance: it waits on the host",
            "fact", st["name"], gap_ev,
            "Few GPU ops with long idle gaps: the host side (Python, synchronisation, host copies) sets the pace. "
            "Look at what the host does between the ops (the trace's CPU rows, py-spy), overlap copies, avoid syncs.",
            validation=_compare_cmd(report) + "  # the stage's median must fall beyond the noise bound and its GPU busy rise",
            score=(1 - busy["median"]) * _stage_weight(report, st) * 0.5))
        return out
    if busy_ns.get("n") and host.get("median", 0) > 0:
        ratio = busy_ns["median"] / host["median"]
        if ratio < HOST_BOUND_GPU_OVER_HOST and busy["median"] >= LAUNCH_BOUND_BUSY:
            out.append(_finding(
                "host_bound",
                f"{who}: its GPU ops run {_fmt_ns(busy_ns['median'])} of the {_fmt_ns(host['median'])} it takes on "
                f"the host ({round(ratio, 3):.0%}, medians): the host side dominates",
                "fact", st["name"],
                {**pop_ev, "gpu_busy_ns_median": busy_ns["median"], "host_ns_median": host["median"],
                 "gpu_over_host": round(ratio, 3)},
                "Profile the host side of this stage (Python, data preparation, synchronisation): "
                "py-spy or the trace's CPU rows show where it waits.",
                validation=_compare_cmd(report) + "  # the stage's host median must fall beyond the noise bound",
                score=(1 - ratio) * _stage_weight(report, st) * 0.5))
    return out


NVML_REASONS = {"sw_power_cap": "SW power cap", "hw_slowdown": "HW slowdown", "sw_thermal": "SW thermal slowdown",
                "hw_thermal": "HW thermal slowdown", "hw_power_brake": "HW power brake slowdown",
                "current_limit": "current limit", "throttled_unknown": "throttled, reason not given"}
"""Throttle reasons as NVML (nvmlClocksEventReasons) and AMD SMI name them."""


def rule_throttled(report: Report) -> list[Finding]:
    """Clocks held below their maximum by a limit, named as NVML names it and ranked by the time
    it can cost: the stage's weight x the throttled share x the clock shortfall (1 - mean SM clock
    / max SM clock), an upper bound for work that scales with the clock. A SW power cap is the
    driver keeping the board under its power limit: power-bound, what a fully loaded GPU is, not a
    fault; thermal and hardware slowdowns are."""
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
        # a power the stage table does not print (it describes what ran around the stage) is
        # not quoted as the stage's either
        power = None if smp.get("power_limited", smp.get("window_limited")) else smp.get("power_w_mean")
        limit = smp.get("power_limit_w")
        host = st.get("host_ns") or {}
        ev: dict[str, Any] = {"reason": ", ".join(named), "reasons": reasons, "throttled_share": round(share, 3),
              "samples": smp.get("samples"), "sm_clock_mhz_mean": clock, "sm_clock_max_mhz": top,
              "clock_shortfall": None if loss is None else round(loss, 3), "power_w_mean": power,
              "power_source": smp.get("power_source"), "power_limit_w": limit,
              "cost_upper_ns": None if loss is None or not host.get("n") else host["total"] * share * loss}
        power_only = set(reasons) <= {"sw_power_cap"} and reasons
        cost = (f": SM clock {clock:.0f} MHz against {top:.0f} MHz max, up to {loss:.0%} of its time"
                if loss is not None else "")
        if power_only:
            why = "the driver keeping the board under its power limit" + (
                f" ({limit:.0f} W; the stage draws {power:.0f} W)" if limit and power else "")
            title = (f"'{st['name']}': clocks held down by NVML's {named[0]} in {share:.0%} of its samples ({why})"
                     f"{cost}")
            step = ("Power-bound, not a fault: a fully loaded GPU runs at its power limit. These numbers hold at "
                    "this limit; less data moved per token (lower precision, fewer copies) lowers the power it "
                    "takes. Check the enforced limit with the command.")
        else:
            title = f"'{st['name']}': clocks held down by {', '.join(named)} in {share:.0%} of its samples{cost}"
            step = ("Numbers from this run are not steady-state peak: check cooling, the power limit and other "
                    "tenants (nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE), then re-run.")
        out.append(_finding(
            "throttled", title, "fact", st["name"], ev, step, "nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE",
            # ranked by the time it can cost; without clocks, a tenth of the throttled share
            score=share * _stage_weight(report, st) * (loss if loss is not None else 0.1)))
    return out


def _deep_dive(report: Report, st: Stage, family: str | None = None, kernel: MixKernel | None = None) -> str | None:
    """deep-dive into the stage's top kernel (of ``family`` where it has one), or ``kernel``
    (one of its top kernels): the command picks that very kernel, whose share it then prints."""
    top: list[MixKernel] = (st.get("mix") or {}).get("top_kernels", [])
    kernels = [kernel] if kernel is not None else top
    if family and kernel is None:
        kernels = [k for k in kernels if k["family"] == family] or kernels
    if not kernels:
        return None
    k = kernels[0]
    rivals = [o["name"] for o in top if o["share"] >= k["share"]]
    # the stage key (``prefill/attention``), which deep-dive resolves as the report does
    return (f"maxinstr deep-dive {_deep_dive_arg(report)} --stage {shlex.quote(st['name'])} "
            f"--kernel {shlex.quote(_kernel_regex(k['name'], rivals))}")


def _not_gpu_paced(st: Stage) -> str | None:
    """Why the GPU's kernels do not set this stage's pace, as a clause for a title ("the GPU is
    busy only 18% of the stage"), or None when they may: the launch_bound / host_bound tests."""
    busy = (st.get("gpu_busy_frac") or {}).get("median") if (st.get("gpu_busy_frac") or {}).get("n") else None
    if busy is not None and busy < LAUNCH_BOUND_BUSY:
        return f"the GPU is busy only {busy:.0%} of the stage"
    busy_ns = (st.get("gpu_busy_ns") or {}).get("median") if (st.get("gpu_busy_ns") or {}).get("n") else None
    host = (st.get("host_ns") or {}).get("median") if (st.get("host_ns") or {}).get("n") else None
    if busy_ns is not None and host and busy_ns / host < HOST_BOUND_GPU_OVER_HOST:
        return f"GPU work is only {busy_ns / host:.0%} of the stage's host time"
    return None


COPY_FAMILIES = ("memcpy", "memset")
_COPY_STEP = ("A copy, not a kernel: Nsight Compute cannot profile it. Check its direction and size in the trace; "
              "use pinned host memory, overlap it with compute on another stream, or keep the data on the GPU.")


def rule_dominant_kernel(report: Report) -> list[Finding]:
    out = []
    for st in _leaf_stages(report):
        if not st.get("mix") or not _significant(report, st):
            continue
        top = (st.get("mix") or {})["top_kernels"][:1]
        if not top or top[0]["share"] < DOMINANT_KERNEL_SHARE:
            continue
        k = top[0]
        copy = k["family"] in COPY_FAMILIES
        pace = None if copy else _not_gpu_paced(st)
        step = _COPY_STEP if copy else "Worth a deep dive: read its achieved bandwidth/throughput against the GPU's peak."
        if pace and not copy:
            step = ("A faster kernel would not shorten this stage yet: fix the launch or host limit first "
                    "(the finding above); then a deep dive reads its achieved bandwidth/throughput against the GPU's peak.")
        out.append(_finding(
            "dominant_kernel",
            f"'{st['name']}': one {'copy' if copy else 'kernel'} takes {round(k['share'], 3):.0%} of its GPU time "
            f"({k['family']}: {_short(k['name'])})" + (f" (but {pace})" if pace else ""),
            "fact", st["name"],
            {"kernel": k["name"], "family": k["family"], "share": round(k["share"], 3), "count": k["count"],
             "median_ns": k["median_ns"], "per_instance": k.get("per_instance")},
            step, None if copy else _deep_dive(report, st),
            score=k["share"] * _stage_weight(report, st) * (0.25 if pace else 0.5)))
    gpu = report.get("gpu") or {}
    if not report.get("stages") and gpu.get("kernels"):
        gk = gpu["kernels"][0]
        if gk["share"] >= DOMINANT_KERNEL_SHARE:
            copy = gk["family"] in COPY_FAMILIES
            out.append(_finding(
                "dominant_kernel", f"one {'copy' if copy else 'kernel'} takes {round(gk['share'], 3):.0%} of all GPU time "
                f"({gk['family']}: {_short(gk['name'])})",
                "fact", None, {"kernel": gk["name"], "family": gk["family"], "share": round(gk["share"], 3)},
                _COPY_STEP if copy else "Worth a deep dive.",
                None if copy else
                f"maxinstr deep-dive {_deep_dive_arg(report)} --kernel "
                f"{shlex.quote(_kernel_regex(gk['name'], [o['name'] for o in gpu['kernels'] if o['share'] >= gk['share']]))}",
                score=gk["share"] * 0.5))
    return out


def rule_perturbed(report: Report) -> list[Finding]:
    if not report.get("perturbed") or report.get("headline_source") == "unprofiled_run":
        return []
    return [_finding(
        "profiled_timings", "Timings were taken under a profiler: absolute numbers include its overhead",
        "fact", None, {"reason": report.get("perturbed_reason")},
        "Use this capture for attribution (which kernels, which stage); take headline timings from the same "
        "program run without the profiler, and pass it with --unprofiled.",
        f"maxinstr report {_report_arg(report)} --unprofiled RUN_WITHOUT_PROFILER",
        score=0.0)]


def rule_observer_cost(report: Report) -> list[Finding]:
    """maxinstr's own estimated share of the staged time (report["footprint"],
    analyze/footprint.py) past FOOTPRINT_THRESHOLD: what it costs and the cheaper setting."""
    from maxinstr.analyze.footprint import THRESHOLD_SHARE

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
    return [_finding(
        "observer_cost", f"maxinstr's own work is an estimated {share:.0%} of the staged time",
        "hypothesis", None,
        {"estimated_share": round(float(share), 4), "by_source": parts, "stage_ns": fp.get("stage_ns"),
         "event_ns": fp.get("event_ns"), "op_ns": fp.get("op_ns")},
        f"Watching this program slows it: {cheaper}. The times above include it.",
        validation="run the program once without maxinstr (MAXINSTR_DISABLE=1) and compare its own throughput",
        score=float(share))]


def rule_straggler(report: Report) -> list[Finding]:
    """A rank that the others wait for (report["ranks"]["stragglers"], analyze/ranks.py)."""
    sec = report.get("ranks") or {}
    out: list[Finding] = []
    if not sec.get("stragglers"):
        return out
    top_total = sum(float((st.get("host_ns") or {}).get("total", 0.0)) for st in report.get("stages", [])
                    if st.get("depth", 0) == 0)
    per_rank_total = top_total / max(int(sec.get("world_size") or 1), 1)
    gpu = {g["rank"]: g for g in (sec.get("gpu") or [])}
    for sg in sec.get("stragglers") or []:
        r = sg["rank"]
        slow = sg.get("slowest_in") or []
        late = sg.get("others_wait_in") or []
        ev: dict[str, Any] = {"rank": r}
        parts = []
        if slow:
            s0 = slow[0]
            ev.update({"slow_stage": s0["stage"], "rank_median_ns": s0["median_ns"],
                       "other_ranks_median_ns": s0["others_median_ns"]})
        if late:
            l0 = late[0]
            ev["sync_stage"] = l0["stage"]
            for k, v in (l0.get("wait_median_ns") or {}).items():
                if k != str(r) and v is not None:
                    ev[f"rank{k}_wait_median_ns"] = v
        if slow:
            ev.update({"slowest_in_share": round(s0["slowest_share"], 3),
                       "excess_median_ns": s0["excess_median_ns"], "groups": s0["groups"]})
            parts.append(f"slowest at '{s0['stage']}' in {s0['slowest_share']:.0%} of {s0['groups']} steps")
        if late:
            l0 = late[0]
            ev.update({"waited_for_share": round(l0["least_wait_share"], 3),
                       "arrives_last_share": round(l0["last_arrival_share"], 3),
                       "arrival_lag_median_ns": l0["arrival_median_ns"],
                       "others_wait_total_ns": sg["others_wait_total_ns"]})
            parts.append(f"the other ranks wait for it in '{l0['stage']}' in {l0['least_wait_share']:.0%} of "
                         f"{l0['groups']} steps")
            for other, g in gpu.items():
                other_share = g.get("collective_share")
                if other != r and other_share is not None:
                    ev[f"rank{other}_collective_gpu_share"] = round(other_share, 3)
            own_share = gpu[r].get("collective_share") if r in gpu else None
            if own_share is not None:
                ev[f"rank{r}_collective_gpu_share"] = round(own_share, 3)
        cost = max(sg.get("others_wait_total_ns", 0.0), sg.get("excess_total_ns", 0.0))
        score = min(cost / per_rank_total, 1.0) if per_rank_total > 0 else 0.0
        stage = (slow[0]["stage"] if slow else late[0]["stage"])
        out.append(_finding(
            "straggler_rank", f"Rank {r} is the straggler: " + "; ".join(parts), "fact", stage, ev,
            f"Find why rank {r} is slower at '{stage}': uneven data or work per rank, a slower or throttled GPU, "
            "a busy host CPU, or its own I/O. Compare its per-rank statistics with the others; profile that rank.",
            validation="After the fix, the per-rank table shows the stage's medians within 10% of each other "
                       "and no rank slowest in most steps.",
            score=score))
    return out


def _short(name: str, n: int = 70) -> str:
    """A kernel's label (no namespaces, parameters or wrappers: maxinstr._text.kernel_label), cut to ``n``."""
    name = kernel_label(name)
    return name if len(name) <= n else name[: n - 1] + "…"


RULES: list[Callable[[Report], list[Finding]]] = [
    rule_no_stages,
    rule_no_gpu_data,
    rule_no_kernels,
    rule_unattributed,
    rule_perturbed,
    rule_observer_cost,
    rule_warmup_contamination,
    rule_healthy_decode,
    rule_attention_dominated_decode,
    rule_moe_decode,
    rule_low_bit,
    rule_unfused,
    rule_reprefill,
    rule_launch_bound,
    rule_naive_matmul,
    rule_throttled,
    rule_dominant_kernel,
    rule_straggler,
]


def diagnose(report: Report, rules: list[Callable[[Report], list[Finding]]] | None = None) -> list[Finding]:
    """Run every rule over ``report``; findings sorted by score (facts first on ties)."""
    findings: list[Finding] = []
    for rule in rules or RULES:
        findings.extend(rule(report))
    # one mix verdict per stage before dropping parents' duplicates: a parent whose inclusive mix
    # is low-bit (a child's low_bit_weights) is not then left with "healthy dense decode"
    findings = _one_mix_per_stage(findings)
    findings = _deepest_only(report, findings)
    _pace_notes(findings)
    findings.sort(key=lambda f: (-f["score"], f["verdict"] != "fact"))
    return _pace_first(findings)


MIX_FINDINGS = ("moe_routing_overhead", "low_bit_quant_overhead", "unfused_custom_architecture",
                "attention_dominated_decode", "moe_decode", "low_bit_weights", "healthy_dense_decode")
"""Verdicts on a stage's kernel mix: what kind of model it is (dense decode, MoE, low-bit) and
whether the mix is right. :func:`diagnose` keeps one per stage."""
MIX_HEALTHY = ("moe_decode", "low_bit_weights", "healthy_dense_decode")
"""The mix verdicts that say nothing is wrong, in precedence order: an MoE stage is not also
"dense decode", a low-bit one is called low-bit."""
PACE_FINDINGS = ("launch_bound", "host_bound")
WORDS = {"launch_bound": "launch limit", "host_bound": "host limit",
         "dominant_kernel": "its dominant kernel", "healthy_dense_decode": "its kernel mix",
         "attention_dominated_decode": "its attention share", "moe_decode": "its kernel mix",
         "moe_routing_overhead": "its MoE routing", "low_bit_weights": "its kernel mix",
         "low_bit_quant_overhead": "its quantization kernels", "unfused_custom_architecture": "its unfused kernels"}
"""Findings named in another finding's words, so its prose reads without the rule ids."""
"""Findings that say the GPU's kernels do not set the stage's pace (launches or the host do)."""


def _one_mix_per_stage(findings: list[Finding]) -> list[Finding]:
    """One kernel-mix verdict per stage, so that "healthy" never stands beside "misses fused
    kernels" or "MoE routing overhead" on the same stage:

    - any problem (a hypothesis: routing overhead, quantization overhead, unfused kernels,
      attention-dominated decode) rules out the healthy verdicts; the problem with the highest
      score is the stage's verdict and the others are folded into it (``evidence.also``, its
      title and next step), not listed as separate mix findings;
    - without a problem, the first of MIX_HEALTHY that fired (MoE, low-bit, dense) is the
      verdict, the others dropped (``evidence.supersedes``);
    - a re-prefill on the stage rules out a healthy verdict too: a matmul-dominated mix is what
      re-running the prompt every step looks like.
    """
    mix_by_stage: dict[str, list[Finding]] = {}
    reprefill = {f["stage"]: f for f in findings if f["id"] == "reprefill_quadratic"}
    for f in findings:
        stage = f.get("stage")
        if f["id"] in MIX_FINDINGS and stage:
            mix_by_stage.setdefault(stage, []).append(f)
    drop: set[int] = set()
    for stage, fs in mix_by_stage.items():
        problems = sorted((f for f in fs if f["id"] not in MIX_HEALTHY), key=lambda f: -f["score"])
        healthy = sorted((f for f in fs if f["id"] in MIX_HEALTHY), key=lambda f: MIX_HEALTHY.index(f["id"]))
        if problems or stage in reprefill:
            drop.update(id(f) for f in healthy)
            if healthy and not problems:
                reprefill[stage]["evidence"]["supersedes"] = [f["id"] for f in healthy]
            if not problems:
                continue
            primary, rest = problems[0], problems[1:]
            if healthy:
                primary["evidence"]["supersedes"] = [f["id"] for f in healthy]
            if rest:
                drop.update(id(f) for f in rest)
                primary["evidence"]["also"] = [{"id": f["id"], "title": f["title"], "evidence": f["evidence"]}
                                               for f in rest]
                prefix = f"'{stage}'"
                primary["title"] += "; also " + "; ".join(
                    (f["title"][len(prefix):].lstrip(" :") if f["title"].startswith(prefix) else f["title"])
                    for f in rest)
                primary["next_step"] += "".join(f" Also: {f['next_step']}" for f in rest)
        elif len(healthy) > 1:
            drop.update(id(f) for f in healthy[1:])
            healthy[0]["evidence"]["supersedes"] = [f["id"] for f in healthy[1:]]
    return [f for f in findings if id(f) not in drop]


def _pace_clause(pace: Finding) -> tuple[str, float]:
    """What a launch_bound / host_bound finding measured, as a clause, and the share of the
    stage the GPU's kernels fill (what faster kernels could shorten at today's pace)."""
    ev = pace["evidence"]
    # a population's finding (two populations, e.g. with and without a CUDA graph) measured its
    # instances, not the whole stage: say whose number it is, as the finding's own title does
    whose = f"its {ev['population']} instances" if ev.get("population") else "the stage"
    if ev.get("gpu_busy_frac_median") is not None:
        busy = float(ev["gpu_busy_frac_median"])
        return f"the GPU is busy only {busy:.0%} of {whose}", busy
    ratio = float(ev.get("gpu_over_host") or 0.0)
    return f"GPU work is only {ratio:.0%} of {whose}' host time" if ev.get("population") else \
        f"GPU work is only {ratio:.0%} of the stage's host time", ratio


def _pace_notes(findings: list[Finding]) -> None:
    """Where launch_bound / host_bound fire, they set the stage's pace: the stage's kernel-mix
    finding says it is secondary (title, next step, ``evidence.paced_by``; its score is scaled by
    the share of the stage the kernels fill), and the pace finding names what it outranks
    (``evidence.secondary``). dominant_kernel says the same through its own "(but ...)" clause."""
    # with two populations, the one that costs more speaks for the stage
    pace_by_stage = {f["stage"]: f for f in sorted(findings, key=lambda f: f["score"])
                     if f["id"] in PACE_FINDINGS and f.get("stage")}
    for stage, pace in pace_by_stage.items():
        clause, fill = _pace_clause(pace)
        mix = [f for f in findings if f.get("stage") == stage and f["id"] in MIX_FINDINGS]
        others = [f for f in findings if f.get("stage") == stage and f["id"] == "dominant_kernel"]
        for f in mix:
            f["title"] += f" (secondary: {clause}, which sets the pace)"
            f["next_step"] = (f"The {WORDS[pace['id']]} sets this stage's pace: fix it first; until then a better kernel mix "
                              f"would not shorten the stage much. Then: " + f["next_step"])
            f["evidence"]["paced_by"] = pace["id"]
            f["score"] = round(f["score"] * fill, 4)
        for f in others:
            # one number for the stage's pace in every finding: the pace finding's own
            if f["title"].endswith(")") and " (but " in f["title"]:
                f["title"] = f["title"][: f["title"].rindex(" (but ")] + f" (but {clause})"
        secondary = [f["id"] for f in mix + others]
        if secondary:
            said = " and ".join(WORDS.get(x, x) for x in secondary)
            pace["evidence"]["secondary"] = secondary
            pace["title"] += f"; this sets the stage's pace, {said} come{'s' if len(secondary) == 1 else ''} second"
            pace["next_step"] = (f"This limits the stage first: {said} matter{'s' if len(secondary) == 1 else ''} "
                                 "once it is fixed. " + pace["next_step"])


def _pace_first(findings: list[Finding]) -> list[Finding]:
    """Sorted findings, with each launch_bound / host_bound moved ahead of the other findings of
    its stage: what limits a stage comes first, whatever the scores."""
    out = list(findings)
    for pace in [f for f in findings if f["id"] in PACE_FINDINGS and f.get("stage")]:
        i = out.index(pace)
        first = next(j for j, f in enumerate(out)
                     if f.get("stage") == pace["stage"] and (f["id"] not in PACE_FINDINGS or f is pace))
        if first < i:
            out.insert(first, out.pop(i))
    return out


def _deepest_only(report: Report, findings: list[Finding]) -> list[Finding]:
    """Drop a finding when a stage nested inside its stage has the same finding: the most
    specific stage is the actionable one (a launch-bound decode inside a request)."""
    parent = {s["name"]: s.get("parent") for s in report.get("stages", [])}
    fired = {(f["id"], stage) for f in findings if (stage := f.get("stage"))}
    ancestors_with: set[tuple[str, str]] = set()
    for fid, stage in fired:
        seen, p = {stage}, parent.get(stage)
        while p is not None and p not in seen:
            ancestors_with.add((fid, p))
            seen.add(p)
            p = parent.get(p)
    return [f for f in findings if not f.get("stage") or (f["id"], f["stage"]) not in ancestors_with]


def rank_bottlenecks(report: Report) -> list[Bottleneck]:
    """Stages ranked by their *self* time (``stages[].self_ns``: per steady instance, its time
    minus its direct child instances' time), so a parent's own work (the matmuls between nested attention
    stages) competes with its children and nothing is counted twice. One basis for all: GPU
    busy time when a trace is joined, else GPU event time, else projected span, else host
    time. Each row carries the stage's top family and kernel (inclusive mix) and the findings
    about it; ``share`` is of the summed self time."""
    rows: list[Bottleneck] = []
    findings = report.get("diagnosis", [])
    stages = report.get("stages", [])
    bases: tuple[TimeKey, ...] = ("gpu_busy_ns", "gpu_event_ns", "gpu_proj_ns", "host_ns")
    basis = next((key for key in bases if _any_stage_has(stages, key)), None)
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
