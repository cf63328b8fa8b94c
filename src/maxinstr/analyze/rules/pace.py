"""What sets a stage's pace when the GPU's kernels do not: launches (``launch_bound``) or the host
(``host_bound``), judged per population where a stage has two (a graph replay, an eager step)."""

from __future__ import annotations

from typing import Any

from maxinstr._units import ns_text
from maxinstr.analyze.commands import Commands
from maxinstr.analyze.families import MAX_KERNEL
from maxinstr.analyze.rules.base import (HOST_BOUND_GPU_OVER_HOST, LAUNCH_BOUND_BUSY, Draft, PaceUnit, kernel_names,
                                         significant, stage_weight)
from maxinstr.analyze.schema import PopulationGroup, Report, Stage

LAUNCH_BOUND_MIN_KERNELS = 5
GRAPH_REPLAY_SHARE = 0.5
"""A stage (or population) whose instances mostly launch CUDA-graph nodes already replays a graph."""


def _pace_units(report: Report, st: Stage) -> list[tuple[Stage | PaceUnit, str | None, PopulationGroup | None]]:
    """The stage itself, or each of its two populations (one busy fraction for a graph replay and
    an eager step is neither's): (statistics, population label, the other population)."""
    groups = (st.get("populations") or {}).get("groups") or []
    if len(groups) != 2:
        return [(st, None, None)]
    basis = (st.get("populations") or {}).get("basis", "host_ns")
    times = [float((g.get(basis) or {}).get("total", 0.0)) for g in groups]
    total = sum(times) or 1.0
    out: list[tuple[Stage | PaceUnit, str | None, PopulationGroup | None]] = []
    for i, g in enumerate(groups):
        unit: PaceUnit = {**g, "name": st["name"], "leaf": st.get("leaf"), "steady": g["instances"],
                          "share_of_top": stage_weight(report, st) * times[i] / total}
        out.append((unit, g["label"], groups[1 - i]))
    return out


def _graph_advice(unit: Stage | PaceUnit, other: PopulationGroup | None, stage: Stage) -> str:
    """The launch-bound fix, without advising what the stage (or its other population) already does."""
    if (unit.get("cuda_graph_share") or 0.0) >= GRAPH_REPLAY_SHARE:
        return ("These instances already replay a CUDA graph: the gaps are between its nodes. Fewer, larger "
                "kernels (fusion, torch.compile, a MAX graph) or more work per node shorten it; a graph does not.")
    if other is not None and (other.get("cuda_graph_share") or 0.0) >= GRAPH_REPLAY_SHARE:
        span, theirs = (unit.get("gpu_proj_ns") or {}).get("median"), (other.get("gpu_proj_ns") or {}).get("median")
        return (f"The stage's other instances ({other['label']}) already replay a CUDA graph"
                + (f" ({ns_text(theirs)} of GPU span against {ns_text(span)} here)" if theirs and span else "")
                + ": run these from the graph too (find the shape, branch or input that misses the captured graph).")
    if any(MAX_KERNEL.search(name) for name in kernel_names(stage)):
        return ("Kernels are short and MAX's worker thread cannot launch them fast enough (it launches each "
                "graph op as its own kernel). Capture the step as a device graph (Model.capture(key, *inputs) "
                "once, then Model.replay(key, *inputs) each step: the inputs' shapes must stay fixed, so a KV "
                "cache preallocated, not grown by concat), or batch more sequences per step.")
    return ("Kernels are short and the host cannot launch them fast enough. Capture the stage in a CUDA/HIP "
            "graph, fuse small kernels (torch.compile, a MAX graph), or batch more work per launch.")


def rule_launch_bound(report: Report, cmd: Commands) -> list[Draft]:
    out = []
    for stage in report.get("stages", []):
        # a population has no more busy fractions than its stage: the cheap test first
        if (stage.get("gpu_busy_frac") or {}).get("n", 0) < 3 or not significant(report, stage):
            continue
        for st, population, other in _pace_units(report, stage):
            out += _launch_or_host_bound(report, cmd, st, population, other, stage)
    return out


def _launch_or_host_bound(report: Report, cmd: Commands, st: Stage | PaceUnit, population: str | None,
                          other: PopulationGroup | None, stage: Stage) -> list[Draft]:
    busy, host = st.get("gpu_busy_frac") or {}, st.get("host_ns") or {}
    busy_ns = st.get("gpu_busy_ns") or {}
    if busy.get("n", 0) < 3 or not host.get("n"):
        return []
    kpi = (st.get("kernels_per_instance") or {}).get("median")
    who = f"'{st['name']}'" + (f" ({population}, {st['instances']} instances)" if population else "")
    whose = f"its {population} instances" if population else "the stage"
    pop_ev: dict[str, Any] = {"population": population} if population else {}
    frac = round(busy["median"], 3)
    gap_ev = {**pop_ev, "gpu_busy_frac_median": frac, "idle_gap_ns_median": (st.get("idle_gap_ns") or {}).get("median"),
              "gpu_proj_ns_median": (st.get("gpu_proj_ns") or {}).get("median"), "kernels_per_instance_median": kpi,
              "instances": busy["n"]}
    busy_pace = (f"the GPU is busy only {frac:.0%} of {whose}", frac)
    if busy["median"] < LAUNCH_BOUND_BUSY and (kpi or 0) >= LAUNCH_BOUND_MIN_KERNELS:
        return [Draft(
            "launch_bound",
            f"{who}: the GPU is busy only {frac:.0%} of the stage's GPU span "
            f"({kpi:.0f} kernels per instance with idle gaps between them)",
            "fact", st["name"], {**gap_ev, "cuda_graph_share": st.get("cuda_graph_share")},
            _graph_advice(st, other, stage), validation=cmd.check(
                "the stage's GPU busy must rise and its median fall beyond the noise bound"),
            score=(1 - busy["median"]) * stage_weight(report, st), pace=busy_pace)]
    if busy["median"] < LAUNCH_BOUND_BUSY:
        return [Draft(
            "host_bound",
            f"{who}: the GPU is busy only {frac:.0%} of the stage's GPU span, between "
            f"{kpi or 0:.0f} ops per instance: it waits on the host",
            "fact", st["name"], gap_ev,
            "Few GPU ops with long idle gaps: the host side (Python, synchronisation, host copies) sets the pace. "
            "Look at what the host does between the ops (the trace's CPU rows, py-spy), overlap copies, avoid syncs.",
            validation=cmd.check("the stage's median must fall beyond the noise bound and its GPU busy rise"),
            score=(1 - busy["median"]) * stage_weight(report, st) * 0.5, pace=busy_pace)]
    if not (busy_ns.get("n") and host.get("median", 0) > 0):
        return []
    ratio = busy_ns["median"] / host["median"]
    if ratio >= HOST_BOUND_GPU_OVER_HOST:
        return []
    over = round(ratio, 3)
    return [Draft(
        "host_bound",
        f"{who}: its GPU ops run {ns_text(busy_ns['median'])} of the {ns_text(host['median'])} it takes on "
        f"the host ({over:.0%}, medians): the host side dominates",
        "fact", st["name"],
        {**pop_ev, "gpu_busy_ns_median": busy_ns["median"], "host_ns_median": host["median"], "gpu_over_host": over},
        "Profile the host side of this stage (Python, data preparation, synchronisation): "
        "py-spy or the trace's CPU rows show where it waits.",
        validation=cmd.check("the stage's host median must fall beyond the noise bound"),
        score=(1 - ratio) * stage_weight(report, st) * 0.5,
        pace=(f"GPU work is only {over:.0%} of {whose}' host time" if population
              else f"GPU work is only {over:.0%} of the stage's host time", over))]
