"""What the views share: number formatting, and what each table shows of the report, so text,
Markdown and HTML show the same numbers."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, cast

from maxinstr._units import ns_text

if TYPE_CHECKING:
    from maxinstr.analyze.compare import AB, Check, DeltaRow
    from maxinstr.analyze.schema import (PopulationGroup, Report, Stage, StartupRow, Statistic, StatisticField,
                                         WarmupSummary)


ns = ns_text
"""A duration in ns as a short human string (:func:`maxinstr._units.ns_text`)."""


def pct(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{100 * value:.{digits}f}%"


def stat(s: Statistic | None, key: StatisticField = "median") -> float | None:
    """``s[key]`` when the statistic rests on at least one value, else None."""
    if not s or not s.get("n"):
        return None
    return s.get(key)


def gpu_stat(stage: Stage) -> tuple[str, Statistic | None]:
    """The stage's GPU time statistic to show: event-based when recorded, else trace-projected."""
    keys: tuple[tuple[Literal["gpu_event_ns", "gpu_proj_ns"], str], ...] = (("gpu_event_ns", "event"), ("gpu_proj_ns", "proj"))
    for key, label in keys:
        if (stage.get(key) or {}).get("n"):
            return label, stage[key]
    return "", None


def startup_gpu(row: StartupRow) -> tuple[str, int | None]:
    """A startup instance's GPU time by the stage table's rule (:func:`gpu_stat`): ("event"|"proj", ns)."""
    if row.get("gpu_event_ns") is not None:
        return "event", row.get("gpu_event_ns")
    return ("proj", row.get("gpu_proj_ns")) if row.get("gpu_proj_ns") is not None else ("", None)


def gpu_tables(report: Report) -> tuple[list[Any], list[Any], str, str]:
    """What the GPU family and kernel tables of every view cover: (families, kernels, the
    scope for their titles, a caption). The steady state when warm-up or cold-start instances
    held ops (a decode's weight load is not where its decode time goes), else the whole trace."""
    gpu = report.get("gpu") or {}
    own = gpu.get("own_ops") or {}
    own_note = (f"; maxinstr's own {own['count']} calibration kernels ({ns(own.get('gpu_ns'))}) not counted"
                if own.get("count") else "")
    if st := gpu.get("steady"):
        caption = (f"steady state: {st['ops']} ops, {ns(st['gpu_ns'])} of GPU time; the {st['startup_ops']} ops "
                   f"({ns(st['startup_gpu_ns'])}) of warm-up and cold-start instances not counted (whole trace: "
                   f"{gpu.get('ops')} ops, {ns(gpu.get('gpu_ns'))}){own_note}")
        return list(st.get("families") or []), list(st.get("kernels") or []), "steady state", caption
    caption = f"whole trace: {gpu.get('ops')} ops, {ns(gpu.get('gpu_ns'))} of GPU time{own_note}"
    return list(gpu.get("families") or []), list(gpu.get("kernels") or []), "whole trace", caption


def unexplained_populations(host_times: bool) -> str:
    """What an unexplained two-population split says, with the usual cause of one in host times."""
    text = "none of what the records hold (process, step, enclosing instance, CUDA graph, kernels) tells those apart"
    if host_times:
        text += ("; host times split this way when threads compete for the cores (BLAS thread pools, other "
                 "processes): compare with OMP_NUM_THREADS=1 or on an idle machine")
    return text


STARTUP_SHOWN = 8


def startup_shown(report: Report, n: int = STARTUP_SHOWN) -> tuple[list[StartupRow], str]:
    """The startup instances every view lists, in one order (cold starts first: the findings
    quote them; then the longest warm-up ones), and the caption saying what was left out."""
    rows = report.get("startup") or []
    total = f"{len(rows)}{'+' if len(rows) >= 50 else ''} instances"
    cold = sum(r["reason"] == "cold_start" for r in rows)
    shown = sorted(rows, key=lambda r: (r["reason"] != "cold_start", -r["host_ns"]))[:n]
    left = (f"{total}; the {n} longest shown; " if not cold else
            f"{total}; the cold starts, then the longest warm-up ones, {n} shown; ") if len(rows) > n else ""
    return shown, f"{left}nested: the instances inside each, kept out with it"


def population_row(g: PopulationGroup) -> Stage:
    """One of a stage's two populations as a stage table's row: its statistics, its instances as the
    steady count; no warm-up, kernel mix or samples of its own, so those read as absent."""
    return cast("Stage", dict(g, steady=g["instances"]))


def excluded(stage: Stage) -> int:
    """Instances kept out of a stage's statistics: warm-up, cold start, and those nested in either."""
    return int(stage.get("warmup", 0) + stage.get("cold_start", 0) + stage.get("inside_startup", 0))


def warmup_line(w: WarmupSummary) -> str:
    """What the statistics leave out, in one sentence (after 'warm-up')."""
    inside = w.get("inside_startup_instances", 0)
    head = w.get("pipeline_head")
    n = w.get("n", 0)
    its = "pipeline iteration" if n == 1 else f"{n} pipeline iterations"
    if not n:
        declared = "none declared (warmup=N or --warmup N declares it)"
    elif head:
        declared = (f"{n} declared: the first {its} (each from one '{head}' to the next) and the first "
                    f"{'instance' if n == 1 else f'{n} instances'} of each stage")
    else:
        declared = f"{n} declared: the first {'instance' if n == 1 else f'{n} instances'} of each stage"
    return (f"{declared}; {w.get('instances', 0)} warm-up and "
            f"{w.get('cold_start_instances', 0)} cold-start instances"
            + (f", and the {inside} nested in them," if inside else "")
            + " kept out of the steady numbers (an instance inside a warm-up or cold-start instance "
              "of an enclosing stage is warm-up too)")


INDENT_LEVELS = 8
"""Nesting levels a stage table indents: a deeper stage is indented as this deep and its key, as shown,
cut in the middle past KEY_SHOWN characters, so its row stays one line at 80 columns."""
KEY_SHOWN = 40


def stage_name(name: str) -> str:
    """A stage key as views show it: an empty name as ``''`` (a blank cell reads as no stage), a run of
    three or more levels of one name (a recursion) as ``name×N`` (``d/d/d/d`` is ``d×4``); ``--format
    json`` has the key as it is."""
    if not name:
        return "''"
    parts = name.split("/")
    if len(parts) < 3:
        return name
    runs: list[list] = []
    for part in parts:
        if runs and runs[-1][0] == part:
            runs[-1][1] += 1
        else:
            runs.append([part, 1])
    shown: list[str] = []
    for part, k in runs:
        shown += [part] * k if k < 3 or not part else [f"{part}×{k}"]
    return "/".join(shown)


def stage_label(name: str, depth: int) -> tuple[int, str]:
    """(levels to indent, key as shown) of a stage table's row."""
    text = stage_name(name)
    if depth <= INDENT_LEVELS:
        return depth, text
    return INDENT_LEVELS, text if len(text) <= KEY_SHOWN else text[:12] + "…" + text[13 - KEY_SHOWN:]


def raised_note(stages: list) -> str | None:
    """Which stages raised an exception (``stages[].exceptions``), in how many of their instances."""
    raised = [s for s in stages if s.get("exceptions")]
    if not raised:
        return None
    listed = ", ".join(f"{stage_name(s['name'])} ({s['exceptions']} of {s['instances']} instance"
                       f"{'s' if s['instances'] > 1 else ''})" for s in raised[:5])
    more = f" and {len(raised) - 5} more stages" if len(raised) > 5 else ""
    return (f"raised an exception: {listed}{more}; an instance that raised is timed to the raise and counted "
            "as any other")


def short(name: str | None, n: int = 60) -> str:
    if not name:
        return "-"
    return name if len(name) <= n else name[: n - 1] + "…"


EVIDENCE_SHOWN: dict[str, tuple[str, ...]] = {
    "launch_bound": ("gpu_busy_frac_median", "kernels_per_instance_median", "idle_gap_ns_median",
                     "gpu_proj_ns_median", "instances"),
    "host_bound": ("gpu_busy_frac_median", "gpu_over_host", "kernels_per_instance_median",
                   "idle_gap_ns_median", "instances"),
    "dominant_kernel": ("share", "median_ns", "per_instance", "count"),
    "warmup_contamination": ("cold_instances", "worst_stage", "worst_ratio", "session_warmup", "suggested_warmup"),
    "profiled_timings": (),
    "healthy_dense_decode": ("matmul_share", "normalization_share", "elementwise_share", "attention_share"),
    "attention_dominated_decode": ("attention_share", "matmul_share", "attention_kernel_median_ns",
                                   "attention_per_instance"),
    "moe_decode": ("grouped_matmul_share", "routing_share", "permutation_share"),
    "moe_routing_overhead": ("grouped_matmul_share", "routing_share", "routing_family_share", "permutation_share"),
    "low_bit_weights": ("quantization_share", "matmul_share", "quant_over_matmul"),
    "low_bit_quant_overhead": ("quantization_share", "matmul_share", "quant_over_matmul"),
    "unfused_custom_architecture": ("matmul_share", "elementwise_share", "softmax_share", "concat_share",
                                    "op_time_last_over_first", "matmul_time_last_over_first"),
    "reprefill_quadratic": ("steps", "op_time_first_quarter_ns", "op_time_last_quarter_ns", "op_time_spearman",
                            "matmul_time_last_over_first", "last_over_first", "spearman"),
    "throttled": ("reason", "throttled_share", "cost_upper_ns", "sm_clock_mhz_mean", "power_w_mean"),
    "straggler_rank": ("rank", "slow_stage", "rank_median_ns", "other_ranks_median_ns", "excess_median_ns",
                       "sync_stage", "waited_for_share"),
    "unattributed_gpu_time": ("attributed_share", "gpu_ns"),
    "no_gpu_data": ("stages", "gpus_seen"),
    "naive_matmul": ("naive_share", "per_instance"),
    "no_kernels": ("stage", "host_ns_median", "gpu_event_ns_median", "gpu_over_host", "gpu_util_pct_mean",
                   "outside_stages_share"),
}
"""Per finding id, the few evidence keys a person reads, in order (views print at most
``limit`` of them; ``--format json`` keeps all of the evidence)."""

LABELS = {
    "gpu_busy_frac_median": "GPU busy", "kernels_per_instance_median": "kernels per instance",
    "idle_gap_ns_median": "GPU idle per instance", "gpu_proj_ns_median": "GPU span",
    "gpu_over_host": "GPU work / host time", "median_ns": "median", "per_instance": "per instance",
    "cold_instances": "cold starts", "worst_ratio": "worst vs steady median", "session_warmup": "declared warm-up",
    "suggested_warmup": "suggested warm-up", "quant_over_matmul": "quantization / matmul",
    "op_time_first_quarter_ns": "op time per step, first quarter", "op_time_last_quarter_ns": "last quarter",
    "op_time_spearman": "Spearman", "matmul_time_last_over_first": "matmul time last/first quarter",
    "op_time_last_over_first": "op time last/first quarter", "last_over_first": "last/first quarter",
    "throttled_share": "throttled", "cost_upper_ns": "time it can cost", "sm_clock_mhz_mean": "SM clock",
    "power_w_mean": "power", "rank_median_ns": "its median", "other_ranks_median_ns": "other ranks' median",
    "excess_median_ns": "excess per step", "waited_for_share": "waited for in", "attributed_share": "inside stages",
    "gpu_ns": "GPU time", "gpu_util_pct_mean": "GPU utilization", "gpus_seen": "GPUs",
    "host_ns_median": "host", "gpu_event_ns_median": "GPU (events)", "outside_stages_share": "outside every stage",
}


def _label(key: str) -> str:
    if key in LABELS:
        return LABELS[key]
    words = [w for w in key.split("_") if w not in ("ns", "w", "j", "pct", "mhz", "frac", "median", "mean")]
    return " ".join(words) or key


def _value(key: str, v: Any) -> str | None:
    """A value with the unit its key names; None for what a sentence cannot hold (lists, dicts, flags)."""
    if v is None or isinstance(v, (bool, list, dict)):
        return None
    if isinstance(v, str):
        return stage_name(v) if key.endswith("stage") else v
    parts = key.split("_")
    if "ns" in parts:
        return ns(v)
    if parts[-1] in ("share", "frac", "host", "matmul") or "frac" in parts:
        return pct(v)
    if "pct" in parts:
        return f"{v:.0f}%"
    for unit, text in (("w", "W"), ("j", "J"), ("mhz", "MHz")):
        if unit in parts:
            return f"{v:.0f} {text}"
    if key.endswith(("over_first", "ratio")):
        return f"{v:.2f}x"
    if key.endswith("spearman"):
        return f"{v:.2f}"
    return f"{v:.0f}" if float(v).is_integer() or abs(v) >= 100 else f"{v:.3g}"


def evidence_text(evidence: dict[str, Any], finding_id: str | None = None, limit: int = 5) -> str:
    """A few named numbers with units, for people: the keys EVIDENCE_SHOWN lists for the finding
    (the first scalar ones otherwise), each as 'label value'. The full evidence is in the JSON."""
    if (keys := EVIDENCE_SHOWN.get(finding_id or "")) is None:
        keys = tuple(k for k, v in evidence.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    parts = []
    for k in keys:
        if (v := _value(k, evidence.get(k))) is not None:
            parts.append(f"{_label(k)} {v}")
        if len(parts) == limit:
            break
    return ", ".join(parts)


def at_stake(score: float | None) -> str:
    """A finding's score as a reader's number: the rough share of the time at stake."""
    return "-" if score is None else f"{100 * score:.0f}% at stake"


NOTHING_AT_STAKE = 0.005
"""A finding scored below this (shown as 0% at stake) says how to read the numbers, not what to do."""


def finding_groups(findings: list[Any]) -> list[tuple[str, list[Any]]]:
    """The diagnosis as every view lists it: facts, then hypotheses, each by the time at stake;
    then what has nothing at stake (a profiler's overhead, a healthy mix, a missing input), so a
    0%-at-stake fact never stands above a 23%-at-stake hypothesis. Empty groups are left out."""
    def at(x: Any) -> bool:
        return (x.get("score") or 0.0) >= NOTHING_AT_STAKE

    groups = [("Facts", [x for x in findings if x["verdict"] == "fact" and at(x)]),
              ("Hypotheses", [x for x in findings if x["verdict"] != "fact" and at(x)]),
              ("Also noted (nothing at stake)", [x for x in findings if not at(x)])]
    return [(title, xs) for title, xs in groups if xs]


def delta_rows(rows: list[DeltaRow]) -> list[tuple[str, DeltaRow]]:
    """compare's delta rows as (stage cell, row): each stage, then a row per population under it when
    they were compared one by one ('· CUDA graph replay', as the report's stage table shows them)."""
    out: list[tuple[str, DeltaRow]] = []
    for r in rows:
        out.append((r["stage"], r))
        out += [(f"  · {p['population']}", p) for p in r["populations"]["rows"]] if "populations" in r else []
    return out


def compare_notes(rows: list[DeltaRow]) -> list[str]:
    """What a compare delta table shows, said from its rows: only the cases it holds (a note
    about pooled runs under a table of single runs misleads)."""
    if not (shown := [r for _, r in delta_rows(rows) if "a" in r]):
        return []
    pooled = any(max(r["a"].get("runs", 1), r["b"].get("runs", 1)) > 1 for r in shown)
    notes = ["n A/B: steady instances on each side" + (", (runs) the fresh-process runs pooled into it" if pooled else "")]
    multi = [r for r in shown if r.get("run_to_run_bound_ns") is not None]
    single = [r for r in shown if r.get("run_to_run_bound_ns") is None]
    if multi:
        notes.append("noise ±" + (" with 2+ runs a side" if single else "") + ": 95% bound, the larger of the spread "
                     "of the sides' run medians (run to run) and that of their instances")
    if single:
        notes.append("noise ±" + (" with one run on a side" if multi else "") + ": 95% bound from the spread of "
                     "the run's own instances; fresh processes of one program differ by more")
    if any(str(r.get("noise_method", "")).endswith("mad") and r.get("verdict") != "too few instances" for r in shown):
        notes.append("where only summaries exist (a population, a saved report) the instances' spread is 2 "
                     "standard errors of the medians, from their MADs")
    verdicts = {r.get("verdict") for r in shown}
    if "cannot tell" in verdicts:
        notes.append("cannot tell: beyond the run's own spread, but one run a side cannot show how far a fresh "
                     "process moves: give each side a folder of repeats (maxinstr run --repeat 3)")
    if "too few instances" in verdicts:
        notes.append("too few instances: under 2 steady instances on a side")
    return notes + [line for r in rows if (line := population_note(r))]


def population_note(row: DeltaRow) -> str | None:
    """What compare says of a stage whose instances form two populations on either side."""
    if not (p := row.get("populations")):
        return None
    sides = [(x, side) for x, side in (("A", p["a"]), ("B", p["b"])) if side]
    which = "both sides" if len(sides) == 2 else f"side {sides[0][0]} only"
    by = sides[0][1]["by"]
    line = f"{row['stage']}: two populations on {which} (" + (f"told apart by {by}" if by else
                                                               "nothing recorded tells them apart") + ")"
    if any(side["median_in_gap"] for _, side in sides):
        line += "; its median lies between them, a time no instance took"
    if p.get("rows"):
        line += "; the rows under it (·) compare each population, from its summary"
    elif p.get("not_split"):
        line += f"; not compared per population: {p['not_split']}"
    return line


def signed_rel(v: float | None) -> str:
    """A relative change: '+37.2%'; '-' when there is none."""
    return "-" if v is None or not math.isfinite(v) else f"{v:+.1%}"


def signed_points(share: float | None) -> str:
    """A change of a share in percentage points: '+64.5 pt'."""
    return "-" if share is None or not math.isfinite(share) else f"{100 * share:+.1f} pt"


def runs_n(row: DeltaRow) -> str:
    """'n A/B' of a compare row, with the runs pooled on each side when more than one."""
    a, b = row["a"], row["b"]
    runs = f" ({a.get('runs', 1)}/{b.get('runs', 1)} runs)" if max(a.get("runs", 1), b.get("runs", 1)) > 1 else ""
    return f"{a['n']}/{b['n']}{runs}"


def check_rows(checks: list[Check]) -> tuple[list[str], list[list[str]]]:
    """compare's per-stage checks as table rows, each value 'A -> B'."""
    def one(v: Any, fmt: Callable[[Any], str]) -> str:
        return fmt(v) if isinstance(v, (int, float)) and math.isfinite(v) else "-"

    def arrow(v: AB, fmt: Callable[[Any], str]) -> str:
        a, b = one(v["a"], fmt), one(v["b"], fmt)
        return "-" if a == b == "-" else f"{a} -> {b}"

    shares = any(c.get("shares") for c in checks)
    header = ["stage", "GPU busy", "kernels per instance", "matmul growth"] + ["share of GPU time"] * shares + ["findings"]
    rows = []
    for c in checks:
        fs = c["findings"]
        said = "; ".join([f"gone: {', '.join(fs['gone'])}"] * bool(fs["gone"]) + [f"new: {', '.join(fs['new'])}"] * bool(fs["new"])
                         + [f"still: {', '.join(x for x in fs['b'] if x in fs['a'])}"] * bool(set(fs["a"]) & set(fs["b"])))
        row = [c["stage"], arrow(c["gpu_busy_frac"], pct), arrow(c["kernels_per_instance"], lambda v: f"{v:.0f}"),
               arrow(c["matmul_growth"], lambda v: f"{v:.2f}x")]
        if shares:
            row.append("; ".join(f"{w} {arrow(v, pct)}" for w, v in (c.get("shares") or {}).items()) or "-")
        rows.append(row + [said or "-"])
    return header, rows


def signed_ns(v: float | None) -> str:
    """A duration delta with its sign: '+2.00 ms', '-149.4 us'."""
    if v is None or not math.isfinite(v):
        return "-"
    return ("+" if v > 0 else "") + ns(v)


def setting(value: Any) -> str:
    """A meta value for display: command lists as a shell line."""
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return shlex.join(value)
    return "-" if value is None else str(value)


RULE_WORDS = {"same_thread": "launched on the stage's thread", "cross_thread": "launched by another thread (a runtime's worker)",
              "graph": "graph replays", "start_end": "start/end ranges", "time_overlap": "by GPU time only (no launch call)"}
INSIDE_TITLE = "Inside the stages: the ranges their GPU work ran under (MAX ops, framework ranges)"


def inside_stages(report: Report, n_stages: int = 4, n_ranges: int = 6) -> tuple[list[dict[str, Any]], list[str]]:
    """What every view shows of ``stages[].mix.ranges`` / ``mix.rules``: per leaf stage (most GPU
    time first), its top ranges of other domains as rows {stage, range, share, per_instance,
    gpu_per_instance_ns}, and one line per stage whose ops were tied to it otherwise than on its
    own thread ("forward: 100% launched by another thread (a runtime's worker)")."""
    stages = report.get("stages") or []
    parents = {s.get("parent") for s in stages}
    leaves = [s for s in stages if s["name"] not in parents and s.get("mix")]
    # steady stages first (most GPU time first); a stage that ran only as warm-up (its mix is
    # over every instance) after them, and labelled so
    leaves.sort(key=lambda s: ((s.get("mix") or {}).get("instances_used") == "all",
                               -float((s.get("mix") or {}).get("gpu_ns") or 0)))
    rows: list[dict[str, Any]] = []
    tied: list[str] = []
    for s in leaves[:n_stages]:
        mix = s.get("mix") or {}
        n_inst = max(int(mix.get("instances") or 1), 1)
        label = s["name"] + (" (warm-up only)" if mix.get("instances_used") == "all" else "")
        for r in (mix.get("ranges") or [])[:n_ranges]:
            rows.append({"stage": label, "range": r["name"] or "-", "share": r["share"],
                         "per_instance": r["per_instance"], "gpu_per_instance_ns": r["gpu_ns"] / n_inst})
        rules = mix.get("rules") or {}
        if set(rules) - {"same_thread"}:
            total = sum(rules.values()) or 1
            tied.append(f"{s['name']}: " + ", ".join(f"{pct(c / total)} {RULE_WORDS.get(k, k)}" for k, c in rules.items()))
    return rows, tied


def footprint_line(report: Report) -> str | None:
    """What watching cost, in one sentence (after 'watching'), or None when not estimated."""
    fp = report.get("footprint") or {}
    if (share := fp.get("overall_share")) is None:
        return None
    by = {k: float(v) for k, v in (fp.get("overall_ns_by_source") or {}).items() if isinstance(v, (int, float)) and v > 0}
    total = sum(by.values())
    words = {"stages": "stage enter/exit", "gpu_events": "GPU events", "kernels": "kernels=True"}

    def share_text(x: float) -> str:
        return "under 0.1%" if x < 0.001 else "nearly all" if x >= 0.995 else f"~{pct(x, 1)}"

    split = ", ".join(f"{words.get(k, k)} {100 * share * v / total:.1f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
    line = f"maxinstr's own work {share_text(share)} of the staged time" + (f": {split} points" if len(by) > 1 else "")
    stages = fp.get("share_by_stage") or {}
    worst = max(stages.items(), key=lambda kv: kv[1]) if stages else None
    if worst and worst[1] >= 2 * share and worst[1] >= 0.02:
        line += f", {share_text(worst[1])} of {stage_name(worst[0])}"
    return line + " (estimated; a profiler's own cost comes on top)"
