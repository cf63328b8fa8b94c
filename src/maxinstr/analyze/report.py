"""Build the report: one JSON-serialisable dict (:class:`maxinstr.analyze.schema.Report`,
docs/report.md), of which renderers are functions. :func:`analyze` also returns the columns
behind it (stage instances, per-op families) that ``compare`` uses for noise bounds.
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from maxinstr._version import __version__
from maxinstr.analyze import instances as inst_mod
from maxinstr.analyze.commands import reproduce
from maxinstr.analyze.diagnosis import diagnose, rank_bottlenecks
from maxinstr.analyze.families import MATMUL_FAMILIES
from maxinstr.analyze.footprint import footprint
from maxinstr.analyze.kernels import (FAMILY_NAMES, family_table, instance_op_work, kernel_table, op_durations,
                                     op_families, op_instance_pairs, stage_mix)
from maxinstr.analyze.ranks import (dense_record_ids, gpu_by_rank, op_ranks_from_pids, part_ranks, payload_rows,
                                    rank_section)
from maxinstr.analyze.samples import stage_sample_stats
from maxinstr.analyze.schema import SCHEMA, VERSION, Footprint, GpuSection, RanksSection, Report, SteadyGpu
from maxinstr.analyze.sources import capture_check, environment, perturbed, sources
from maxinstr.analyze.stage_table import coverage, stage_rows, startup_rows
from maxinstr.attribute import attribute
from maxinstr.attribute.join import place_run_stages
from maxinstr.attribute.model import Attribution, JoinMethod
from maxinstr.errors import TraceError
from maxinstr.rundir import Run, load
from maxinstr.rundir.launch_record import launch_record
from maxinstr.traces import open_trace
from maxinstr.traces.inprocess import read_run
from maxinstr.traces.merge import merge_rank_traces
from maxinstr.traces.model import Trace

TraceArg = str | Path | Trace
"""A trace: its file (or folder), or one already read."""

KERNELS_KEPT = 300
"""Distinct kernel names kept in ``gpu.kernels`` (by total time): enough for compare's lists."""
STEADY_KERNELS_KEPT = 50
MIX_TOP_KERNELS = 15
"""Top kernels kept per stage (the diagnosis rules look for markers among them)."""


@dataclass
class Analysis:
    """The report dict plus the columns it was computed from (not serialised)."""

    report: Report
    instances: inst_mod.StageInstances
    headline_instances: inst_mod.StageInstances | None = None
    op_family: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int16))
    """Family code per op (names in ``maxinstr.analyze.kernels.FAMILY_NAMES``)."""
    op_ns: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    run: Run | None = None
    trace: Trace | None = None
    attribution: Attribution | None = None


def _load_trace(trace: TraceArg | None) -> Trace | None:
    return open_trace(trace) if isinstance(trace, (str, Path)) else trace


def analyze(run: str | Path | Run | None = None,
            trace: TraceArg | list[TraceArg] | tuple[TraceArg, ...] | None = None,
            attribution: Attribution | None = None, samples: Any = None,
            unprofiled_run: str | Path | Run | None = None, warmup: int | None = None,
            trace_ranks: list[int] | None = None) -> Analysis:
    """Everything :func:`build_report` computes, plus the columns behind it.

    ``run`` and ``unprofiled_run``: run directories or loaded runs; ``trace``: a path or a
    :class:`~maxinstr.traces.model.Trace` (attributed here when no ``attribution`` is given), or a
    list, one per rank, ``trace_ranks`` saying whose each is (default: the run's ranks in order;
    :mod:`maxinstr.traces.merge`). ``warmup`` overrides the session's ``warmup=N``.
    """
    run = load(run) if isinstance(run, (str, Path)) else run
    unprofiled_run = load(unprofiled_run) if isinstance(unprofiled_run, (str, Path)) else unprofiled_run
    op_rank = None
    if isinstance(trace, (list, tuple)):
        trace, run, op_rank = _rank_traces(list(trace), run, trace_ranks)
    trace = _load_trace(trace)
    kernel_notes: list[str] = []
    inprocess_kernels = False
    if trace is None and run is not None and run.path is not None:
        # kernels a kernels=True session collected in-process (docs/kernels.md)
        try:
            trace, kernel_notes = read_run(run)
        except (ValueError, TraceError) as exc:  # a malformed activity file: the report goes on without kernels
            kernel_notes = [f"in-process kernels not read: {exc}"]
        inprocess_kernels = trace is not None
    placed_note = None
    if trace is not None and attribution is None and run is not None:
        placed = place_run_stages(trace, run)
        if placed is not None:
            trace, placed_note = placed
    if trace is not None and attribution is None:
        attribution = attribute(trace, run=run)
        if placed_note:
            # the placed ranges carry their record ids: that they join by them says nothing more
            # than the placement, which is the join (the header's `join clock`)
            attribution.notes = [placed_note] + [n for n in attribution.notes if not n.endswith("by NVTX payload == record id")]
            if attribution.join_method == JoinMethod.PAYLOAD:
                attribution.join_method = JoinMethod.CLOCK
    if run is not None:
        inst = inst_mod.from_run(run, trace, attribution, warmup_n=warmup)
    elif trace is not None:
        inst = inst_mod.from_trace(trace, attribution, warmup_n=warmup or 0)
    else:
        inst = inst_mod.StageInstances()
    head = inst_mod.from_run(unprofiled_run, warmup_n=warmup) if unprofiled_run is not None else None

    if trace is not None and len(trace.ops):
        fam, dur = op_families(trace), op_durations(trace)
    else:
        fam, dur = np.empty(0, dtype=np.int16), np.empty(0, dtype=np.int64)
    mix, work, graph_ops = {}, None, None
    startup_op = np.zeros(len(dur), bool)
    if trace is not None:
        pairs = op_instance_pairs(inst, trace, attribution)
        if len(pairs[0]):
            # an op held by a warm-up or cold-start instance (or one nested in it) is startup work
            startup_op[pairs[0][~(inst.steady | inst.is_mark)[pairs[1]]]] = True
        mix = stage_mix(inst, trace, attribution, fam, dur, top=MIX_TOP_KERNELS, pairs=pairs)
        if len(pairs[0]):
            matmul_codes = [i for i, n in enumerate(FAMILY_NAMES) if n in MATMUL_FAMILIES]
            work = instance_op_work(inst, fam, dur, pairs, matmul_codes)
            graph = np.asarray(trace.ops.graph_node_id, np.int64)[pairs[0]] >= 0
            graph_ops = np.bincount(pairs[1][graph], minlength=len(inst))
    if samples is None and run is not None:
        samples = run.samples or None
    try:
        sample_stats = stage_sample_stats(inst, samples, [p.get("name", "") for p in run.parts] if run is not None else [])
    except Exception as exc:  # noqa: BLE001 - a sampler format change must not break the report
        sample_stats = {"_overall": {"error": f"samples not analysed: {type(exc).__name__}: {exc}"}}
    launch = (launch_record(run.path, run.meta or {}, str(trace.source) if trace is not None else None)
              if run is not None and run.path else None)

    report: Report = {
        "schema": SCHEMA, "version": VERSION,
        "generated": {"maxinstr": __version__, "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")},
        "sources": sources(run, trace, attribution, unprofiled_run, inst),
        "environment": environment(run, trace, launch.sweep if launch else None)}
    if trace is None and kernel_notes:  # kernels=True was asked for and produced nothing: say why
        report["sources"]["notes"] += kernel_notes
    if run is not None and trace is not None:
        problem, note = capture_check(run.meta or {}, len(trace.ops), inst)
        if problem:
            report["sources"]["capture_problem"] = problem
        if note:
            report["sources"]["notes"].append(note)
    report["perturbed"], report["perturbed_reason"] = perturbed(run, trace)
    report["headline_source"] = "unprofiled_run" if head is not None else ("run" if run is not None else "trace")
    report["warmup"] = {
        "n": int(run.warmup if (run is not None and warmup is None) else (warmup or 0)),
        "instances": int(inst.warmup.sum()),
        "cold_start_instances": int((inst.cold & ~inst.warmup).sum()),
        # nested in a warm-up or cold-start instance of an enclosing stage: startup too
        "inside_startup_instances": int(inst.inside_startup.sum()) if len(inst.inside_startup) == len(inst) else 0,
        "pipeline_head": inst.pipeline_head,
    }
    report["stages"] = stage_rows(inst, head, mix, sample_stats, work, run.attrs if run is not None else None, graph_ops)
    report["ranks"] = _ranks(inst, run, trace, fam, dur, op_rank)
    report["marks"] = dict(sorted(Counter(str(k) for k in inst.key[inst.is_mark].tolist()).items()))
    report["startup"] = startup_rows(inst)
    report["gpu"] = _gpu_section(trace, attribution, fam, dur, startup_op)
    report["coverage"] = coverage(inst)
    report["samples"] = sample_stats.get("_overall") if sample_stats else None
    report["footprint"] = cast("Footprint | None", footprint(inst, run, inprocess_kernels=inprocess_kernels))
    report["reproduce"] = reproduce(run, trace, unprofiled_run)
    report["diagnosis"] = diagnose(report, launch)
    report["bottlenecks"] = rank_bottlenecks(report)
    return Analysis(report=report, instances=inst, headline_instances=head, op_family=fam, op_ns=dur,
                    run=run, trace=trace, attribution=attribution)


def build_report(run: str | Path | Run | None = None,
                 trace: TraceArg | list[TraceArg] | tuple[TraceArg, ...] | None = None,
                 attribution: Attribution | None = None, samples: Any = None,
                 unprofiled_run: str | Path | Run | None = None, warmup: int | None = None,
                 trace_ranks: list[int] | None = None) -> Report:
    """The report dict (schema ``maxinstr-report`` v1, see docs/report.md) for a run, a trace, or both."""
    return analyze(run, trace, attribution, samples, unprofiled_run, warmup, trace_ranks).report


def _rank_traces(specs: list[TraceArg], run: Run | None, trace_ranks: list[int] | None
                 ) -> tuple[Trace | None, Run | None, np.ndarray | None]:
    """Several traces, one per rank, merged so that each rank's NVTX payloads point only at its
    records (ids re-numbered to row positions): (trace, run, rank per op)."""
    traces = [t for t in (_load_trace(s) for s in specs) if t is not None]
    if len(traces) == 1 and trace_ranks is None:
        return traces[0], run, None
    run_ranks = sorted(set(part_ranks(run.parts).tolist()) - {-1}) if run is not None else []
    ranks = list(trace_ranks) if trace_ranks is not None else run_ranks[: len(traces)]
    if len(ranks) != len(traces):
        raise ValueError(f"{len(traces)} traces but {len(ranks)} ranks to give them to")
    stages = run.stages if run is not None else None
    payload_map = (lambda r, payload: payload_rows(stages, r, payload)) if stages is not None and len(stages) else None
    merged, rows = merge_rank_traces(traces, ranks, payload_map)
    if run is not None and stages is not None and len(stages):
        new = stages.copy()
        new["id"], new["parent_id"] = dense_record_ids(stages)
        attrs = run.attrs
        moved = {int(i): attrs[int(old)] for i, old in enumerate(stages["id"].tolist()) if int(old) in attrs} if attrs else {}
        run = replace(run, stages=new, attrs=moved)  # attrs follow their records to the new ids
        mine = np.isin(new["rank"], ranks)
        if not mine.all():
            run.notes = list(run.notes) + [f"{int((~mine).sum())} stage records of ranks without a trace: no GPU columns for them"]
    return merged, run, rows["ops"]


def _ranks(inst: inst_mod.StageInstances, run: Run | None, trace: Trace | None, fam: np.ndarray, dur: np.ndarray,
           op_rank: np.ndarray | None) -> RanksSection | None:
    """``report["ranks"]``: per-rank statistics and stragglers (None for a one-rank run)."""
    if run is None or not run.parts:
        return None
    gpu = None
    if trace is not None and len(dur):
        if op_rank is None:
            op_rank = op_ranks_from_pids(np.asarray(trace.ops.pid, np.int64), run.parts)
        if (op_rank >= 0).any():
            gpu = gpu_by_rank(op_rank, np.asarray(fam), np.asarray(dur), list(FAMILY_NAMES))
    return rank_section(inst, run.parts, gpu)


def _gpu_section(trace: Trace | None, attribution: Attribution | None, fam: np.ndarray, dur: np.ndarray,
                 startup_op: np.ndarray | None = None) -> GpuSection | None:
    if trace is None:
        return None
    n = len(dur)
    # maxinstr's own GPU-floor calibration kernels are the profiler's work, not the program's
    own = np.asarray(fam) == list(FAMILY_NAMES).index("maxinstr") if n else np.zeros(0, bool)
    keep = ~own
    # usually no op is maxinstr's own: then every column is taken whole (views, not copies)
    sel = slice(None) if keep.all() else keep
    attributed = None
    if attribution is not None and len(getattr(attribution, "op_range", [])) == n and keep.any():
        attributed = float(dur[keep & (np.asarray(attribution.op_range) >= 0)].sum() / max(dur[sel].sum(), 1))
    fams = family_table(dur[sel], np.asarray(fam)[sel])
    other = next((f["share"] for f in fams if f["family"] == "other"), 0.0)
    kernels = kernel_table(trace, fam, dur, mask=None if isinstance(sel, slice) else keep, limit=KERNELS_KEPT)
    # distinct names (ids index the string table, -1 for none: a bincount, not a sort)
    distinct = int(np.count_nonzero(np.bincount(np.asarray(trace.ops.name_id, np.int64)[sel] + 1))) if n and keep.any() else 0
    span = int(np.asarray(trace.ops.end_ns).max() - np.asarray(trace.ops.start_ns).min()) if n else 0
    steady: SteadyGpu | None = None
    if startup_op is not None and len(startup_op) == n and (keep & startup_op).any():
        st = keep & ~startup_op
        steady = {"ops": int(st.sum()), "gpu_ns": float(dur[st].sum()),
                  "families": family_table(dur[st], np.asarray(fam)[st]),
                  "kernels": kernel_table(trace, fam, dur, mask=st, limit=STEADY_KERNELS_KEPT),
                  "startup_ops": int((keep & startup_op).sum()), "startup_gpu_ns": float(dur[keep & startup_op].sum())}
    return {"steady": steady, "ops": int(keep.sum()), "own_ops": {"count": int(own.sum()), "gpu_ns": float(dur[own].sum())},
            "gpu_ns": float(dur[sel].sum()), "span_ns": span, "attributed_share": attributed, "families": fams,
            "other_share": float(other), "distinct_kernels": int(distinct), "kernels": kernels,
            "kernels_truncated": distinct > len(kernels)}
