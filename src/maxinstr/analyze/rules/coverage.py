"""Rules on what the input lacks: stages, GPU times, kernels, GPU time inside the stages."""

from __future__ import annotations

from typing import Any

from maxinstr._units import ns_text
from maxinstr.analyze.commands import Commands
from maxinstr.analyze.rules.base import HOST_BOUND_GPU_OVER_HOST, Draft, any_stage_has, significant, stage_weight
from maxinstr.analyze.schema import Report, Stage
from maxinstr.rundir.reader import PARTS_MISSING


def rule_no_stages(report: Report, cmd: Commands) -> list[Draft]:
    if report.get("stages"):
        return []
    gpu = report.get("gpu") or {}
    lost = PARTS_MISSING in (report.get("sources") or {}).get("notes", [])  # the stages were recorded, not copied
    return [Draft(
        "no_stages", "No stages in this input: only a whole-program kernel breakdown is possible", "fact", None,
        {"ops": gpu.get("ops", 0), "gpu_ns": gpu.get("gpu_ns", 0)},
        "Report the run directory whole, its parts/ folder included (the stages are there), or record again."
        if lost else "Mark the pipeline's stages with maxinstr.stage(...) (or NVTX/roctx ranges) and capture again.",
        cmd.rerun())]


def rule_no_gpu_data(report: Report, cmd: Commands) -> list[Draft]:
    stages = report.get("stages") or []
    if not stages or report.get("gpu") or any_stage_has(stages, "gpu_event_ns") or any_stage_has(stages, "gpu_proj_ns"):
        return []
    gpus = len(report.get("environment", {}).get("gpus") or [])
    if not gpus:
        # the command is the one for a GPU machine: on this one (none seen) it records the same
        step = ("Host times show where the program waits, not what the GPU does, and this machine has no GPU: "
                + ("run the same command on a GPU machine" if cmd.launch.maxinstr_command is not None
                   else "run it on a GPU machine with the command")
                + " (GPU events are on by default there; the profiler adds the kernels).")
    else:
        step = ("Host times show where the program waits, not what the GPU does. The GPU was seen but no stage "
                "timed it: pass stream= (docs/guide.md), and add a profiler trace for kernels.")
    return [Draft(
        "no_gpu_data", "Only host times: no GPU event times were recorded and no trace was given", "fact", None,
        {"stages": len(stages), "gpus_seen": gpus}, step, cmd.rerun(with_profiler=True))]


def rule_no_kernels(report: Report, cmd: Commands) -> list[Draft]:
    """A GPU run without a kernel trace: what its GPU events and samples show, and how to add kernels."""
    stages = report.get("stages") or []
    if report.get("gpu") is not None or not stages:
        return []
    # (stage, host median, GPU event median, GPU over host, NVML utilization)
    shown: list[tuple[Stage, float, float | None, float | None, float | None]] = []
    for st in stages:
        if not significant(report, st):
            continue
        host_stat, gpu_stat = st.get("host_ns") or {}, st.get("gpu_event_ns") or {}
        smp = st.get("samples") or {}
        util = None if smp.get("window_limited") else smp.get("gpu_util_pct_mean")
        if not host_stat.get("n") or not (gpu_stat.get("n") or util is not None):
            continue
        # per instance timed on both (with a GPU-timing budget, the two medians are of different instances)
        over = st.get("gpu_event_over_host") or {}
        ratio = over["median"] if over.get("n") else None
        shown.append((st, host_stat["median"], gpu_stat.get("median") if gpu_stat.get("n") else None, ratio, util))
    if not shown:
        return []
    cov = report.get("coverage") or {}
    outside = 1 - cov["in_stages_ns"] / cov["wall_ns"] if cov.get("wall_ns") else None

    def idle(x: tuple[Stage, float, float | None, float | None, float | None]) -> float:
        """The time at stake: little GPU time for its host time, or a low utilization."""
        st, _, _, ratio, util = x
        lack = max(1 - min(ratio, 1.0) if ratio is not None else 0.0, 1 - util / 100 if util is not None else 0.0)
        return lack * stage_weight(report, st)
    st, host, gpu, ratio, util = max(shown, key=idle)
    parts = []
    if gpu is not None and ratio is not None:
        n_timed = (st.get("gpu_event_over_host") or {}).get("n", 0)
        parts.append(f"'{st['name']}' takes {ns_text(gpu)} on its GPU stream and {ns_text(host)} on the host "
                     f"(medians; GPU over host {ratio:.0%} per instance, over the {n_timed} timed on both)")
    if util is not None:
        parts.append(f"a kernel ran in {util:.0f}% of its time (NVML utilization)"
                     + (": the GPU is idle most of the stage, so the host (Python, launches) sets its pace"
                        if util < 100 * HOST_BOUND_GPU_OVER_HOST else ""))
    if outside is not None and outside >= 0.05:
        parts.append(f"{outside:.0%} of the run is outside every stage")
    ev: dict[str, Any] = {"stage": st["name"], "host_ns_median": host, "gpu_event_ns_median": gpu, "gpu_over_host": ratio,
                          "gpu_util_pct_mean": util, "outside_stages_share": outside,
                          "per_stage": [{"stage": s["name"], "host_ns_median": h, "gpu_event_ns_median": g,
                                         "gpu_util_pct_mean": u} for s, h, g, _, u in shown]}
    step = ("The GPU events and samples say how much of each stage the GPU works, not what it runs. Capture the "
            "kernels: run the program under the profiler with the command below, or, without a profiler around it "
            "(a notebook, a server), maxinstr.session(..., kernels=True) collects them in the process (NVIDIA, "
            "pip install 'maxinstr[cupti]'); the report then says whether the stage is launch-, host- or kernel-bound.")
    if ratio is not None and ratio < HOST_BOUND_GPU_OVER_HOST:
        step = "The stage's GPU work is a small part of it: the host sets its pace (see host_ns). " + step
    elif util is not None and util < 100 * HOST_BOUND_GPU_OVER_HOST:
        step = ("The GPU stream spans the stage but a kernel runs in little of it: the stream waits on the host "
                "between launches. " + step)
    return [Draft(
        "no_kernels", "No kernel trace; what the GPU numbers show: " + "; ".join(parts), "fact", st["name"], ev,
        step, cmd.rerun(with_profiler=True), cmd.check("with the kernels, the stage's GPU busy and its findings"),
        score=0.5 * idle((st, host, gpu, ratio, util)))]


def rule_unattributed(report: Report, cmd: Commands) -> list[Draft]:
    gpu = report.get("gpu") or {}
    share = gpu.get("attributed_share")
    if share is None or not report.get("stages") or share >= 0.5:
        return []
    return [Draft(
        "unattributed_gpu_time", f"{(1 - share):.0%} of GPU time ran outside every stage", "fact", None,
        {"attributed_share": share, "gpu_ns": gpu.get("gpu_ns")},
        "Wrap the remaining GPU work in stages (or check the trace's correlation ids: see sources.notes).",
        score=1 - share)]
