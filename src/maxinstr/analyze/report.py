"""Build the report: one JSON-serialisable dict (schema ``maxinstr-report``, version 1).

The report is data first: renderers (text, JSON, Markdown, and later Perfetto/HTML) are
functions of this dict only. Its keys and types are :class:`maxinstr.analyze.schema.Report`
(docs/report.md says what each field means). :func:`analyze` also
returns the in-memory columns (stage instances, per-op families) that ``compare`` uses for
noise bounds; :func:`build_report` returns just the dict.
"""

from __future__ import annotations

import datetime as _dt
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from maxinstr.analyze import instances as inst_mod
from maxinstr.analyze.families import MATMUL_FAMILIES
from maxinstr.analyze.footprint import footprint
from maxinstr.analyze.kernels import (FAMILY_NAMES, family_table, instance_op_work, kernel_table, op_durations,
                                     op_families, op_instance_pairs, stage_mix)
from maxinstr.analyze.populations import MIN_INSTANCES as POPULATION_MIN_INSTANCES
from maxinstr.analyze.populations import stage_populations
from maxinstr.analyze.schema import (SCHEMA, VERSION, Coverage, Environment, Footprint, GpuSection, PerStep, RanksSection, Report,
                                     ReproduceStep, SelfTimes, Sources, Stage, StageSamples, StartupRow, Statistic, SteadyGpu,
                                     StepBasis, StepWork)
from maxinstr.analyze.stats import group_summaries, step_trend
from maxinstr._units import ns_text
from maxinstr._version import __version__
from maxinstr.attribute import attribute
from maxinstr.attribute.model import JoinMethod
from maxinstr.columns import factorize
from maxinstr.traces.inprocess import FORMAT as INPROCESS_FORMAT

if TYPE_CHECKING:
    from maxinstr.attribute.model import Attribution
    from maxinstr.rundir import Run
    from maxinstr.traces.model import Trace

    TraceArg = str | Path | Trace
    """A trace: its file (or folder), or one already read."""

KERNELS_KEPT = 300
"""Distinct kernel names kept in ``gpu.kernels`` (by total time); enough for compare's
appeared/disappeared lists without making the JSON huge."""

STEADY_KERNELS_KEPT = 50
"""Distinct kernel names kept in ``gpu.steady.kernels`` (the views show the first ten)."""

STARTUP_KEPT = 50
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
    """The loaded run (records, meta, samples), when one was given."""
    trace: Trace | None = None
    """The :class:`~maxinstr.traces.model.Trace`, when one was given."""
    attribution: Attribution | None = None
    """The trace's :class:`~maxinstr.attribute.model.Attribution` (per-op stage, per-range spans)."""


def _load_run(run: str | Path | Run | None) -> Run | None:
    if run is None or not isinstance(run, (str, Path)):
        return run
    from maxinstr.rundir import load

    return load(run)


def _load_trace(trace: TraceArg | None) -> Trace | None:
    if trace is None or not isinstance(trace, (str, Path)):
        return trace
    from maxinstr.traces import open_trace  # H4's dispatcher

    return open_trace(trace)


def _inprocess_trace(run: Run) -> tuple[Trace | None, list[str]]:
    """Kernels a ``kernels=True`` session collected in-process (docs/kernels.md), when no
    --trace was given: (trace or None, notes)."""
    from maxinstr.traces.inprocess import read_run

    from maxinstr.errors import TraceError

    try:
        return read_run(run)
    except (ValueError, TraceError) as exc:  # a malformed activity file: the report goes on without kernels
        return None, [f"in-process kernels not read: {exc}"]


def analyze(run: str | Path | Run | None = None,
            trace: TraceArg | list[TraceArg] | tuple[TraceArg, ...] | None = None,
            attribution: Attribution | None = None, samples: Any = None,
            unprofiled_run: str | Path | Run | None = None, warmup: int | None = None,
            trace_ranks: list[int] | None = None) -> Analysis:
    """Everything :func:`build_report` computes, plus the columns behind it.

    ``run`` and ``unprofiled_run`` may be run directories (paths) or loaded runs; ``trace`` a
    path or a :class:`~maxinstr.traces.model.Trace`. Attribution is computed when a trace is
    given without one. ``warmup`` overrides the session's ``warmup=N`` (and sets it for
    trace-only reports). ``trace`` may be a list, one trace per rank of a multi-rank run, with
    ``trace_ranks`` saying whose each is (default: the run's ranks in order); they are merged and
    each joins only its rank's records (see :mod:`maxinstr.traces.merge`).
    """
    run = _load_run(run)
    unprofiled_run = _load_run(unprofiled_run)
    op_rank = None
    if isinstance(trace, (list, tuple)):
        trace, run, op_rank = _rank_traces(list(trace), run, trace_ranks)
    trace = _load_trace(trace)
    kernel_notes: list[str] = []
    inprocess_kernels = False
    if trace is None and run is not None and getattr(run, "path", None) is not None:
        trace, kernel_notes = _inprocess_trace(run)
        inprocess_kernels = trace is not None
    placed_note = None
    if trace is not None and attribution is None and run is not None:
        from maxinstr.attribute.join import place_run_stages

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
        fam = op_families(trace)
        dur = op_durations(trace)
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
        samples = getattr(run, "samples", None) or None
    part_names = [p.get("name", "") for p in getattr(run, "parts", [])] if run is not None else []
    sample_stats = _stage_samples(inst, samples, part_names)

    report: Report = {
        "schema": SCHEMA,
        "version": VERSION,
        "generated": {
            "maxinstr": _version(),
            "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        },
        "sources": _sources(run, trace, attribution, unprofiled_run, inst),
        "environment": _environment(run, trace),
    }
    if trace is None and kernel_notes:  # kernels=True was asked for and produced nothing: say why
        report["sources"]["notes"] += kernel_notes
    if run is not None and trace is not None:
        problem, note = capture_check(getattr(run, "meta", None) or {}, len(trace.ops), inst)
        if problem:
            report["sources"]["capture_problem"] = problem
        if note:
            report["sources"]["notes"].append(note)
    perturbed, why = _perturbed(run, trace)
    report["perturbed"] = perturbed
    report["perturbed_reason"] = why
    report["headline_source"] = "unprofiled_run" if head is not None else ("run" if run is not None else "trace")
    report["warmup"] = {
        "n": int(run.warmup if (run is not None and warmup is None) else (warmup or 0)),
        "instances": int(inst.warmup.sum()),
        "cold_start_instances": int((inst.cold & ~inst.warmup).sum()),
        # nested in a warm-up or cold-start instance of an enclosing stage: startup too
        "inside_startup_instances": int(inst.inside_startup.sum()) if len(inst.inside_startup) == len(inst) else 0,
        "pipeline_head": inst.pipeline_head,
    }
    attrs = getattr(run, "attrs", None) if run is not None else None
    report["stages"] = _stage_rows(inst, head, mix, sample_stats, work, attrs, graph_ops)
    report["ranks"] = _ranks(inst, run, trace, fam, dur, op_rank)
    if inst.is_mark.any():
        marks, mark_code = factorize(inst.key[inst.is_mark])
        mark_counts = np.bincount(mark_code, minlength=len(marks))
    else:
        marks, mark_counts = np.empty(0, object), np.empty(0, np.int64)
    report["marks"] = {str(k): int(c) for k, c in zip(marks, mark_counts)}
    report["startup"] = _startup_rows(inst)
    report["gpu"] = _gpu_section(trace, attribution, fam, dur, startup_op)
    report["coverage"] = _coverage(inst)
    report["samples"] = sample_stats.get("_overall") if sample_stats else None
    report["footprint"] = cast("Footprint | None", footprint(inst, run, inprocess_kernels=inprocess_kernels))
    report["reproduce"] = _reproduce(run, trace, unprofiled_run)
    from maxinstr.analyze.diagnosis import diagnose, rank_bottlenecks

    report["diagnosis"] = diagnose(report)
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
    """Several traces, one per rank: merged into one trace in which each rank's NVTX payloads
    point only at that rank's records (record ids re-numbered to row positions: ids can repeat
    across hosts). Returns (trace, run, rank per op)."""
    from dataclasses import replace

    from maxinstr.analyze.ranks import dense_record_ids, part_ranks, payload_rows
    from maxinstr.traces.merge import merge_rank_traces

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
        attrs = getattr(run, "attrs", None) or {}
        moved = {int(i): attrs[int(old)] for i, old in enumerate(stages["id"].tolist()) if int(old) in attrs} if attrs else {}
        run = replace(run, stages=new, attrs=moved)  # attrs follow their records to the new ids
        mine = np.isin(new["rank"], ranks)
        if not mine.all():
            run.notes = list(run.notes) + [f"{int((~mine).sum())} stage records of ranks without a trace: no GPU columns for them"]
    return merged, run, rows["ops"]


def _ranks(inst: inst_mod.StageInstances, run: Run | None, trace: Trace | None, fam: np.ndarray, dur: np.ndarray,
           op_rank: np.ndarray | None) -> RanksSection | None:
    """``report["ranks"]``: per-rank statistics and stragglers (None for a one-rank run)."""
    if run is None or not getattr(run, "parts", None):
        return None
    from maxinstr.analyze.kernels import FAMILY_NAMES
    from maxinstr.analyze.ranks import gpu_by_rank, op_ranks_from_pids, rank_section

    gpu = None
    if trace is not None and len(dur):
        if op_rank is None:
            op_rank = op_ranks_from_pids(np.asarray(trace.ops.pid, np.int64), run.parts)
        if (op_rank >= 0).any():
            gpu = gpu_by_rank(op_rank, np.asarray(fam), np.asarray(dur), list(FAMILY_NAMES))
    return rank_section(inst, run.parts, gpu)


# ----------------------------------------------------------------------------- sections
def _version() -> str:
    return __version__


def _sources(run: Run | None, trace: Trace | None, attribution: Attribution | None, unprofiled_run: Run | None,
             inst: inst_mod.StageInstances) -> Sources:
    notes: list[str] = []
    if run is not None:
        notes += list(getattr(run, "notes", []) or [])
        notes += _event_notes(run)
    if trace is not None:
        notes += list(getattr(trace, "notes", []) or [])
    if attribution is not None:
        notes += list(getattr(attribution, "notes", []) or [])
    notes += list(getattr(inst, "notes", []) or [])
    notes += _sampled_out_note(run)
    notes += _max_markers_note(run, trace)
    join = None
    joined = None
    join_problem = None
    if attribution is not None and run is not None:
        join = getattr(getattr(attribution, "join_method", None), "name", None)
        join = join.lower() if join else None
        joined = int((inst.range_index >= 0).sum())
        if joined == 0 and len(inst) and trace is not None:
            notes.append("no stage record joined a trace range: GPU projection per stage is unavailable")
            join_problem = _join_problem(trace)
    return {
        "run": str(run.path) if run is not None and getattr(run, "path", None) else None,
        "trace": str(trace.source) if trace is not None else None,
        "trace_format": str(trace.format) if trace is not None else None,
        "trace_clock": str(trace.clock) if trace is not None else None,
        "unprofiled_run": str(unprofiled_run.path) if unprofiled_run is not None and getattr(unprofiled_run, "path", None) else None,
        "join": join,
        "records_joined": joined,
        "attribution_rules": _rules_used(attribution),
        "join_problem": join_problem,
        "notes": notes,
    }


CAPTURE_FIX = "rerun with `maxinstr run --capture all -- CMD` (the whole process; the report still keeps warm-up apart)"


def capture_check(meta: dict[str, Any], n_ops: int, inst: inst_mod.StageInstances) -> tuple[str | None, str | None]:
    """What a steady-state capture (meta.json ``capture``, ``maxinstr run --capture steady``) missed:
    (a line for the report's top, a note). At the top: a capture holding no GPU op while the
    program ran steady instances (with the GPU time their stages timed on their streams, when
    they did), or a capture the session could not start. A note: steady instances that ran
    outside the capture range (before it started, after its window ended), which hold no op."""
    cap = meta.get("capture")
    if not isinstance(cap, dict) or not len(inst):
        return None, None
    steady = inst.steady & ~inst.is_mark
    n_steady = int(steady.sum())
    if cap.get("started") is False:
        return ("the session could not start the profiler's capture range (profiler_start was refused), so the "
                f"trace holds only what the profiler recorded by itself; {CAPTURE_FIX}"), None
    if n_ops == 0 and n_steady:
        timed = inst.gpu_event_ns > 0
        launched = (f"; its stages timed {ns_text(float(inst.gpu_event_ns[timed].sum()))} of GPU work on their streams "
                    f"({int(timed.sum())} instances)" if timed.any() else "")
        ss = meta.get("steady_state")
        at = f" at the start of a '{ss['name']}'" if isinstance(ss, dict) and ss.get("name") else ""
        return (f"the capture holds no GPU op, though the program ran {n_steady} steady stage instances{launched}: "
                f"the capture range started{at} and holds none of that work; {CAPTURE_FIX}"), None
    start, stop = cap.get("start_ns"), cap.get("stop_ns")
    if not isinstance(start, int):
        return None, None
    outside = steady & ((inst.host_start_ns < start) | ((inst.host_end_ns > stop) if isinstance(stop, int) else False))
    if outside.any():
        k = int(outside.sum())
        return None, (f"{k} of {n_steady} steady stage instances ran outside the capture range (before it started or "
                      "after it stopped): they hold no op, and their GPU columns are empty; `maxinstr run --capture "
                      "all` or a longer --window covers them")
    unjoined = (inst.range_index < 0) & ~inst.is_mark
    if unjoined.any() and not (unjoined & (inst.host_start_ns >= start)).any():
        # why the join note counts records without a range: all of them began before the capture
        return None, (f"the {int(unjoined.sum())} stage records with no range in the trace all began before the "
                      "capture started (a steady-state capture: meta.json capture.start_ns); every steady instance "
                      "is in it")
    return None, None


def _join_problem(trace: Trace) -> str:
    """Why no stage record joined the trace, and what to do, in one line for the report's top."""
    if trace.format == "kineto":
        return ("the run's stages could not be placed on this torch.profiler trace (it records no NVTX ranges, and "
                "the run or the trace lacks the wall-clock base that places them): per-stage kernels unavailable; "
                "pass the run directory the traced program wrote, or capture with: maxinstr run -- CMD")
    return ("no trace range is one of the run's stages (a trace captured without NVTX, e.g. nsys -t cuda only, or "
            "of another run): per-stage kernels unavailable; capture with: maxinstr run -- CMD (nsys -t cuda,nvtx) "
            "or pass the run directory that recorded this trace")


EVENT_NOTES_KEPT = 10


def _event_notes(run: Any) -> list[str]:
    """The warnings and errors the recording wrote into its parts' events.jsonl (what the run
    went without: MAX's op ranges, kernels=True falling back, a failed write), each distinct
    message once, with how many parts said it."""
    said: dict[tuple[str, str], set[str]] = {}
    for ev in getattr(run, "events", None) or []:
        kind, message = ev.get("kind"), ev.get("message")
        # kernels=True's own fallback is also in its activity.json, which the kernel note reads
        if kind in ("warning", "error") and isinstance(message, str) and message and not message.startswith("kernels=True:"):
            said.setdefault((kind, message), set()).add(str(ev.get("part")))
    out = [f"recorded {kind}: {message}" + (f" ({len(parts)} parts)" if len(parts) > 1 else "")
           for (kind, message), parts in said.items()]
    if len(out) > EVENT_NOTES_KEPT:
        out = out[:EVENT_NOTES_KEPT] + [f"and {len(out) - EVENT_NOTES_KEPT} more recorded warnings in the parts' "
                                        "events.jsonl"]
    return out


def _sampled_out_note(run: Run | None) -> list[str]:
    """Say when the GPU-timing budget left stage instances without GPU events."""
    from maxinstr.rundir import format as fmt

    stages = getattr(run, "stages", None) if run is not None else None
    if stages is None or not len(stages):
        return []
    flags = np.asarray(stages["flags"])
    out = int(((flags & fmt.GPU_SAMPLED_OUT) != 0).sum())
    if not out:
        return []
    timed = int(((flags & fmt.GPU_TIMED) != 0).sum())
    return [f"GPU event times from {timed} of {timed + out} stage instances: the GPU-timing budget left {out} "
            "untimed (whole top-level stages) to keep event work within its share of wall time; "
            "MAXINSTR_GPU_BUDGET=0 times every stage"]


MAX_MARKERS_COST = "H200 decoder, docs/max.md: 915 against 1527 tokens/s plain"
"""What MAX's op markers were measured to cost MAX, quoted wherever the report speaks of them."""


def _max_markers_note(run: Run | None, trace: Trace | None) -> list[str]:
    """Whether MAX's own op markers were on in a run of a MAX program, and what that means: on,
    the times include their cost; off under a profiler, how to see MAX's ops inside the stages."""
    meta = getattr(run, "meta", None) if run is not None else None
    if not isinstance(meta, dict) or not (meta.get("frameworks") or {}).get("max"):
        return []
    level = str((meta.get("env") or {}).get("MODULAR_ENABLE_PROFILING", "off")).strip().lower()
    cost = (f"MAX compiled its graphs with them and they cost it host time ({MAX_MARKERS_COST}); these times "
            "include that")
    if level not in ("", "off", "0", "false"):
        return [f"MAX's op markers were on (MODULAR_ENABLE_PROFILING={level}): {cost}"]
    # the environment at start says off, yet the program can turn them on itself
    # (enable_max_profiling(), the examples' --max-profiling): the trace then holds their ranges
    others = _other_domain_ranges(trace) if trace is not None else 0
    if others:
        return [f"MAX's op markers were on (the trace holds {others} ranges besides maxinstr's stages, though "
                f"MODULAR_ENABLE_PROFILING was not set when the run started: the program turned them on): {cost}"]
    if trace is not None and trace.format != INPROCESS_FORMAT:
        return ["MAX's op ranges were off: `maxinstr run --max-ops detailed` shows MAX's ops inside each stage, at a "
                f"cost to MAX ({MAX_MARKERS_COST})"]
    return []


def _other_domain_ranges(trace: Trace) -> int:
    """How many ranges of the trace are neither maxinstr's stages nor marks: MAX's op ranges in a
    MAX program. 0 where the trace cannot tell them apart (no maxinstr domain)."""
    from maxinstr.attribute.attribute import stage_domain_mask
    from maxinstr.traces.model import RangeStyle

    stage = stage_domain_mask(trace)
    if stage is None:
        return 0
    return int((~stage & (np.asarray(trace.ranges.style) != RangeStyle.MARK)).sum())


def _rules_used(attribution: Attribution | None) -> dict[str, int] | None:
    if attribution is None or len(getattr(attribution, "op_rule", [])) == 0:
        return None
    from maxinstr.attribute.model import Rule

    counts = np.bincount(np.asarray(attribution.op_rule, np.int64), minlength=len(Rule))
    return {Rule(i).name.lower(): int(c) for i, c in enumerate(counts) if c}


_META_KEYS = ("command", "maxinstr_command", "cwd", "git", "host", "python", "maxinstr", "gpus", "driver", "cuda", "rocm",
              "frameworks", "env", "user", "profiler", "warmup", "clock")


def _environment(run: Run | None, trace: Trace | None) -> Environment:
    env: Environment = {}
    if run is not None:
        meta = getattr(run, "meta", {}) or {}
        env = cast(Environment, {k: meta.get(k) for k in _META_KEYS if meta.get(k) not in (None, "", {}, [])})
    if trace is not None and getattr(trace, "meta", None):
        env["trace_meta"] = {k: v for k, v in trace.meta.items() if isinstance(v, (str, int, float, bool))}
    sweep = _sweep(run)
    if sweep:
        env["sweep"] = sweep
    return env


def _sweep(run: Run | None) -> dict[str, str] | None:
    """The ``maxinstr run --sweep`` value this run had (its launch.json), so that compare lists it
    among the settings that differ: the ``sweep`` record, else the run's label (``BATCH=8.r2``)."""
    from maxinstr.errors import RunDirError
    from maxinstr.rundir.reader import read_launch

    path = getattr(run, "path", None) if run is not None else None
    if path is None:
        return None
    try:
        launch = read_launch(path)
    except RunDirError:
        return None  # a damaged launch record only loses the sweep label
    if launch is None:
        return None
    if isinstance(launch.get("sweep"), dict):
        return {str(k): str(v) for k, v in launch["sweep"].items()} or None
    label = str(launch.get("label") or "")
    name, sep, value = label.rpartition(".r")[0].partition("=") if ".r" in label else label.partition("=")
    return {name: value} if sep and name else None


def _perturbed(run: Run | None, trace: Trace | None) -> tuple[bool, str | None]:
    meta = getattr(run, "meta", {}) or {} if run is not None else {}
    prof = meta.get("profiler") if isinstance(meta, dict) else None
    if prof:
        name = prof.get("name", "a profiler") if isinstance(prof, dict) else str(prof)
        return True, f"captured under {name}: timings include its overhead"
    if trace is not None and trace.format == "maxinstr-inprocess":
        return True, "kernels collected in-process (kernels=True, CUPTI): timings include its overhead (docs/kernels.md)"
    if trace is not None:
        return True, f"timings come from a {trace.format} trace: captured under a profiler, which adds overhead"
    return False, None


def _stage_rows(inst: inst_mod.StageInstances, head: inst_mod.StageInstances | None, mix: dict[str, Any], sample_stats: dict[str, Any],
                work: dict[str, np.ndarray] | None = None, attrs: dict[int, dict[str, Any]] | None = None,
                graph_ops: np.ndarray | None = None) -> list[Stage]:
    """One row per stage key. Columnar over all stages at once (grouped statistics, one slice
    of a stage-sorted index per stage): a run of 50,000 distinct names made a per-stage mask
    over every instance (quadratic) and eight numpy calls per stage, 179 s. ``attrs`` and
    ``graph_ops`` (CUDA-graph ops per instance) explain two-population stages."""
    if len(inst) == 0:
        return []
    uniq, code = inst.key_codes()
    n_stages = len(uniq)
    # pipeline order: by first host start
    first_start = np.full(n_stages, np.iinfo(np.int64).max)
    np.minimum.at(first_start, code, inst.host_start_ns)
    order_u = np.argsort(first_start, kind="stable")
    steady = inst.steady
    host = inst.host_ns
    proj = inst.proj_ns
    has_span = inst.proj_start_ns >= 0
    share_of_top = _share_of_top(inst, code, n_stages)
    self_time = _self_times(inst, {"host_ns": host, "gpu_event_ns": inst.gpu_event_ns, "gpu_proj_ns": proj,
                                   "gpu_busy_ns": np.where(has_span, inst.busy_ns, -1)})

    def count(mask: np.ndarray) -> np.ndarray:
        return np.bincount(code[mask], minlength=n_stages)

    instances, n_steady = count(np.ones(len(inst), bool)), count(steady)
    n_warmup, n_cold, n_exc = count(inst.warmup), count(inst.cold & ~inst.warmup), count(inst.exception)
    n_inside = count(inst.inside_startup) if len(inst.inside_startup) == len(inst) else np.zeros(n_stages, np.int64)
    only_marks = count(inst.is_mark) == instances
    step_marked = count(inst.step_marked) > 0
    depth = np.full(n_stages, np.iinfo(np.int64).max)
    np.minimum.at(depth, code, inst.level)
    first_of = np.full(n_stages, len(inst))
    np.minimum.at(first_of, code, np.arange(len(inst)))
    parent_of = _most_common_parent(inst, code, n_stages)
    sc = code[steady]

    def stats(values: np.ndarray) -> list[Statistic]:
        return group_summaries(sc, values[steady], n_stages)

    cols = {
        "host_ns": stats(host),
        "gpu_event_ns": stats(inst.gpu_event_ns),
        "gpu_proj_ns": stats(proj),
        "gpu_busy_ns": stats(np.where(has_span, inst.busy_ns, -1)),
        "gpu_busy_frac": stats(inst.busy_frac),
        "idle_gap_ns": stats(np.where(has_span, inst.idle_gap_ns, -1)),
        "kernels_per_instance": stats(np.where(inst.range_index >= 0, inst.kernel_count, -1)),
    }
    with np.errstate(divide="ignore", invalid="ignore"):
        c_over = stats(np.where((inst.gpu_event_ns >= 0) & (host > 0), inst.gpu_event_ns / np.maximum(host, 1), np.nan))
    self_ns = []
    for k, v in self_time.items():
        present = steady & (v >= 0)
        self_ns.append((k, np.bincount(code[present], weights=v[present], minlength=n_stages).tolist(),
                        (count(present) > 0).tolist()))
    # each stage's steady instances, as one slice of a stage-sorted index
    by_stage = np.flatnonzero(steady)[np.argsort(sc, kind="stable")]
    bounds = np.concatenate(([0], np.cumsum(n_steady))).tolist()
    per_steps = _per_steps(inst, by_stage, code[by_stage], n_stages) if step_marked.any() else None
    head_rows = _headline_stats(head, uniq) if head is not None else None
    # per-stage values as Python lists: the loop below runs once per stage (50,000 and more)
    names_l, depth_l, leaf_l = uniq.tolist(), depth.tolist(), inst.name[first_of].tolist()
    counts_l = list(zip(instances.tolist(), n_steady.tolist(), n_warmup.tolist(), n_cold.tolist(), n_inside.tolist(),
                        n_exc.tolist()))
    # share of each stage's steady, joined instances that launch CUDA-graph nodes (None without any)
    graph_share_l: list[float | None] = [None] * n_stages
    if graph_ops is not None:
        joined = steady & (inst.range_index >= 0)
        n_joined, n_graph = count(joined).tolist(), count(joined & (graph_ops > 0)).tolist()
        graph_share_l = [g / j if j else None for g, j in zip(n_graph, n_joined)]
    marks_l, step_marked_l = only_marks.tolist(), step_marked.tolist()
    share_l = None if share_of_top is None else share_of_top.astype(np.float64).tolist()
    series = {"gpu_event_ns": inst.gpu_event_ns, "gpu_proj_ns": proj, "host_ns": host}

    c_host, c_event, c_proj, c_busy = cols["host_ns"], cols["gpu_event_ns"], cols["gpu_proj_ns"], cols["gpu_busy_ns"]
    c_frac, c_gap, c_kpi = cols["gpu_busy_frac"], cols["idle_gap_ns"], cols["kernels_per_instance"]
    rows: list[Stage] = []
    for u in order_u.tolist():
        if marks_l[u]:
            continue  # instant marks have no duration: counted in report["marks"]
        name = str(names_l[u])
        n_all, n_st, n_wu, n_cs, n_in, n_ex = counts_l[u]
        host_stat = c_host[u]
        row: Stage = {
            "name": name,
            "parent": parent_of[u],
            "depth": depth_l[u],
            "leaf": str(leaf_l[u]),
            "instances": n_all,
            "steady": n_st,
            "warmup": n_wu,
            "cold_start": n_cs,
            "inside_startup": n_in,
            "exceptions": n_ex,
            "host_ns": host_stat,
            "gpu_event_ns": c_event[u],
            "gpu_proj_ns": c_proj[u],
            "gpu_busy_ns": c_busy[u],
            "gpu_busy_frac": c_frac[u],
            "idle_gap_ns": c_gap[u],
            "kernels_per_instance": c_kpi[u],
            "share_of_top": None if share_l is None else share_l[u],
            "self_ns": cast(SelfTimes, {k: total[u] for k, total, present in self_ns if present[u]}),
            "steps_marked": step_marked_l[u],
            "steps": None,
            "mix": mix.get(name),
            "samples": _window_note(sample_stats.get(name), host_stat) if sample_stats else None,
        }
        # step trend on the best GPU measure available, else host time
        basis: StepBasis = ("gpu_event_ns" if row["gpu_event_ns"]["n"]
                            else ("gpu_proj_ns" if row["gpu_proj_ns"]["n"] else "host_ns"))
        if n_st >= STEP_WORK_MIN_STEPS:  # fewer instances cannot span the 4 steps a trend needs
            st = by_stage[bounds[u]:bounds[u + 1]]
            values = series[basis]
            trend = step_trend(inst.step[st], values[st])
            if trend.get("n_steps", 0) >= 4:
                trend["basis"] = basis
                row["steps"] = trend
                if work is not None:
                    row["step_work"] = _step_work(inst.step[st], {k: v[st] for k, v in work.items()})
        row.setdefault("step_work", None)
        # fewer steady instances cannot form two populations (populations.MIN_INSTANCES)
        row["populations"] = stage_populations(inst, by_stage[bounds[u]:bounds[u + 1]], basis, attrs, graph_ops,
                                               values=series[basis]) if n_st >= POPULATION_MIN_INSTANCES else None
        row["cuda_graph_share"] = graph_share_l[u]
        if c_over[u].get("n"):
            row["gpu_event_over_host"] = c_over[u]
        if row["steps_marked"] and per_steps is not None:  # (there are per_steps when a stage marked steps)
            row["per_step"] = _per_step(per_steps, u, basis)
        if head_rows is not None and head_rows[u] is not None:
            row["headline_from"] = "unprofiled_run"
            row["headline_host_ns"], row["headline_gpu_event_ns"] = head_rows[u]
        else:  # no unprofiled run, or it lacks this stage: the profiled numbers, marked as such
            row["headline_from"] = "run"
            row["headline_host_ns"] = row["host_ns"]
            row["headline_gpu_event_ns"] = row["gpu_event_ns"]
        rows.append(row)
    return _tree_order(rows)


def _most_common_parent(inst: inst_mod.StageInstances, code: np.ndarray, n_stages: int) -> list[str | None]:
    """Per stage: the stage key its instances' parents most often have (ties: the first key in
    sort order), None for a stage whose instances have no parent."""
    out: list[str | None] = [None] * n_stages
    child = np.flatnonzero(inst.parent >= 0)
    if len(child) == 0:
        return out
    keys = inst.key_codes()[0]
    pcode = code[inst.parent[child]]  # parents are stages too: their key codes index the same keys
    pair, counts = np.unique(code[child] * n_stages + pcode, return_counts=True)
    stage_of, parent_of = pair // n_stages, pair % n_stages
    # per stage, the parent key with the most instances; ties go to the first key in sort order
    best = np.lexsort((parent_of, -counts, stage_of))
    first = best[np.r_[True, stage_of[best][1:] != stage_of[best][:-1]]]
    for s, p in zip(stage_of[first].tolist(), parent_of[first].tolist()):
        out[s] = str(keys[p])
    return out


def _headline_stats(head: inst_mod.StageInstances, uniq: np.ndarray) -> list[tuple[Statistic, Statistic] | None]:
    """Per stage of ``uniq``: (host, GPU-event) statistics over the unprofiled run's steady
    instances of the same key, None where that run has none."""
    keys = head.key
    pos = np.searchsorted(uniq, keys)
    pos = np.minimum(pos, len(uniq) - 1)
    hit = (uniq[pos] == keys) & head.steady
    host = group_summaries(pos[hit], head.host_ns[hit], len(uniq))
    gpu = group_summaries(pos[hit], head.gpu_event_ns[hit], len(uniq))
    present = np.bincount(pos[hit], minlength=len(uniq)) > 0
    return [(host[i], gpu[i]) if present[i] else None for i in range(len(uniq))]


def _share_of_top(inst: inst_mod.StageInstances, code: np.ndarray, n_stages: int) -> np.ndarray | None:
    """Per stage (``code``: each instance's stage, 0..n_stages-1): the share of the steady
    top-level host time its steady instances account for; None without steady top-level time.

    Numerator and denominator cover the same top-level instances: a steady instance counts only
    inside a steady top-level ancestor. (Counting every steady instance while dividing by the
    steady top-level time gave 50x on a capture whose first request, warm-up with compilation,
    held most of the "steady" decode steps.) An instance with an ancestor of its own stage is
    left out (its time is in that ancestor's); so is one whose parent chain does not end (a cycle,
    or deeper than the levels :func:`~maxinstr.analyze.instances.stage_keys` follows)."""
    parent = inst.parent
    steady = inst.steady
    host = inst.host_ns
    top = steady & (inst.level == 0)
    top_total = float(host[top].sum())
    if top_total <= 0:
        return None
    # each instance's top-level ancestor, one nesting level per pass over the rows still climbing
    root = np.arange(len(inst))
    cur = parent.copy()
    nested_in_same = np.zeros(len(inst), dtype=bool)
    live = np.flatnonzero(cur >= 0)
    for _ in range(inst_mod._MAX_LEVELS):
        if len(live) == 0:
            break
        up = cur[live]
        root[live] = up
        nested_in_same[live] |= code[up] == code[live]
        cur[live] = parent[up]
        live = live[cur[live] >= 0]
    counted = steady & (cur < 0) & ~nested_in_same & top[root]
    inside = np.bincount(code[counted], weights=host[counted].astype(np.float64), minlength=n_stages)
    # <= 1 when a stage's instances under one top-level instance run one after another inside it
    # (one thread). Parent links that cross threads can put concurrent instances under one
    # parent, whose host times then add up to more than its wall time: a share is still at most all.
    return np.minimum(inside / top_total, 1.0)


def _tree_order(rows: list[Stage]) -> list[Stage]:
    """Rows (in pipeline order) reordered so each stage follows its parent, depth first:
    indentation by depth then reads as the tree (a root that starts between a parent and its
    child no longer sits between them)."""
    present = {r["name"] for r in rows}
    children: dict[str | None, list[Stage]] = {}
    for r in rows:
        parent = r.get("parent") if r.get("parent") in present and r.get("parent") != r["name"] else None
        children.setdefault(parent, []).append(r)
    out: list[Stage] = []
    seen: set[str] = set()
    stack = list(reversed(children.get(None, [])))
    while stack:
        r = stack.pop()
        if r["name"] in seen:
            continue
        seen.add(r["name"])
        out.append(r)
        stack.extend(reversed(children.get(r["name"], [])))
    out += [r for r in rows if r["name"] not in seen]  # parent cycles: keep them, in pipeline order
    return out


NVML_UTIL_WINDOW_MIN_NS = 166_666_667
"""NVML averages utilization over a sample period of 1/6 s to 1 s (by GPU; power over ~1 s on
Hopper): a stage shorter than the shortest period cannot be judged by the samples taken in it."""


def _window_note(samples: StageSamples | None, host: Statistic) -> StageSamples | None:
    """The stage's sampler numbers, with ``window_limited`` set when utilization and power
    cannot be told for the stage itself. Utilization is attributed by the NVML windows its
    values describe (:mod:`maxinstr.sample.attribute`); ``util_window_share`` is the share of
    those windows' time the stage filled. Below
    :data:`~maxinstr.sample.attribute.WINDOW_SHARE_MIN` the value describes mostly other
    stages or idle time; no window at all (a stage after the last window the sampler saw) is
    limited too. Without a share (samples not from NVML), a median instance shorter than
    NVML's shortest window is."""
    if not samples:
        return samples
    from maxinstr.sample.attribute import WINDOW_SHARE_MIN

    out = StageSamples(**samples)
    median = host.get("median") if host.get("n") else None
    share = out.get("util_window_share")
    if "util_window_share" in out and out.get("gpu_util_pct_mean") is None:
        out["window_limited"] = True  # no window covers the stage
    elif share is not None:
        out["window_limited"] = bool(share < WINDOW_SHARE_MIN)
    else:
        out["window_limited"] = bool(median is not None and median < NVML_UTIL_WINDOW_MIN_NS)
    # power: from the energy counter, judged on the readings around the stage (interpolated
    # linearly between them); from NVML's reading, on the same windows as utilization
    e_share = out.get("energy_window_share")
    if out.get("power_source") == "energy" and e_share is not None:
        out["power_limited"] = bool(e_share < WINDOW_SHARE_MIN)
    else:
        out["power_limited"] = bool(out["window_limited"])
    out["sampler_window_min_ns"] = NVML_UTIL_WINDOW_MIN_NS
    return out


def _self_times(inst: inst_mod.StageInstances, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per instance: its value minus its direct child instances' values (-1 where the value is
    missing), clipped at 0. Exact per instance, so children that are warm-up still come off
    their parent."""
    out = {}
    has_parent = inst.parent >= 0
    for key, v in columns.items():
        v = np.asarray(v, np.float64)
        child = has_parent & (v >= 0)
        sums = np.bincount(inst.parent[child], weights=v[child], minlength=len(inst)) if len(inst) else np.zeros(0)
        out[key] = np.where(v >= 0, np.maximum(v - sums, 0.0), -1.0)
    return out


STEP_WORK_MIN_STEPS = 4


def _step_work(step: np.ndarray, work: dict[str, np.ndarray]) -> StepWork | None:
    """How the GPU work a stage launches changes with the step index, from the trace's ops (not
    from time spans, which other tenants, launch gaps and syncs stretch): step trends of the
    summed op time (``gpu_op_ns``), of the matmul ops' time (``matmul_ns``: GEMV/GEMM/grouped)
    and of the op count (``ops``) per instance. The re-prefill rule reads them: a KV-cached
    decode step's matmuls and op count do not depend on the step index."""
    out: StepWork = {}
    keys: tuple[tuple[Literal["gpu_op_ns", "matmul_ns", "ops"], str], ...] = (
        ("gpu_op_ns", "op_ns"), ("matmul_ns", "family_ns"), ("ops", "ops"))
    for key, col in keys:
        tr = step_trend(step, work[col])
        if tr.get("n_steps", 0) < STEP_WORK_MIN_STEPS:
            return None
        out[key] = tr
    return out


PER_STEP_KEPT = 10_000


def _per_steps(inst: inst_mod.StageInstances, idx: np.ndarray, stage: np.ndarray, n_stages: int) -> tuple[list[tuple[int, int]], tuple[Any, ...]]:
    """Over the instances ``idx`` (``stage``: their stage codes), per (stage, marked step): the
    instance count, the median host time and the median GPU time by each GPU measure; the first
    PER_STEP_KEPT steps of each stage. Every stage at once, by one sort of (stage, step).
    Returns (per stage its (lo, hi) slice, (steps, n, host medians, {measure: GPU medians}))."""
    from maxinstr.analyze.stats import group_medians

    step = inst.step[idx]
    ok = step >= 0
    s, st, i = stage[ok], step[ok], idx[ok]
    if len(s) == 0:
        return [(0, 0)] * n_stages, ([], [], [], {"gpu_event_ns": [], "gpu_proj_ns": []})
    order = np.lexsort((st, s))
    s, st, i = s[order], st[order], i[order]
    new_pair = np.r_[True, (s[1:] != s[:-1]) | (st[1:] != st[:-1])]
    pcode = np.cumsum(new_pair) - 1
    n_pairs = int(pcode[-1]) + 1
    pair_stage, pair_step = s[new_pair], st[new_pair]
    first_pair = np.searchsorted(pair_stage, np.arange(n_stages))
    kept_pair = np.arange(n_pairs) - first_pair[pair_stage] < PER_STEP_KEPT
    keep = kept_pair[pcode]
    counts = np.bincount(pcode[keep], minlength=n_pairs).tolist()
    host = group_medians(pcode[keep], inst.host_ns[i][keep], n_pairs).tolist()
    gpu = {}
    for key, col in (("gpu_event_ns", inst.gpu_event_ns), ("gpu_proj_ns", inst.proj_ns)):
        g = col[i]
        good = keep & (g >= 0)
        gpu[key] = group_medians(pcode[good], g[good], n_pairs).tolist()
    steps = pair_step.astype(int).tolist()
    ends = np.minimum(np.r_[first_pair[1:], n_pairs], first_pair + PER_STEP_KEPT).tolist()
    return list(zip(first_pair.tolist(), ends)), (steps, counts, host, gpu)


def _per_step(per_steps: tuple[list[tuple[int, int]], tuple[Any, ...]], stage: int, basis: StepBasis) -> PerStep:
    """Per marked step: instance count and median host (and GPU, on ``basis``) time, as
    parallel lists (one stage's part of :func:`_per_steps`)."""
    lo, hi = per_steps[0][stage]
    marked, n, host, gpu = per_steps[1]
    out: PerStep = {"step": marked[lo:hi], "n": n[lo:hi], "host_median_ns": host[lo:hi]}
    if basis != "host_ns":
        out["gpu_basis"] = basis
        out["gpu_median_ns"] = gpu[basis][lo:hi]
    return out


def _startup_rows(inst: inst_mod.StageInstances) -> list[StartupRow]:
    """The instances kept out as warm-up or cold start (their own, not those nested in one),
    with the pipeline iteration each ran in (``top_stage``: the stage that begins iterations,
    ``top_occurrence``: the iteration): declaring warm-up up to that one covers it, since
    nested instances follow their ancestors and later siblings their iteration."""
    idx = np.flatnonzero(inst.warmup | inst.cold)
    if len(idx) == 0:
        return []
    idx = idx[np.argsort(inst.host_start_ns[idx], kind="stable")][:STARTUP_KEPT]
    host, proj = inst.host_ns, inst.proj_ns
    top = inst_mod.top_ancestor(inst.parent)
    nested = inst_mod.descendant_counts(inst.parent)
    # a cold pipeline iteration's head instance keeps its whole iteration out, siblings included
    head = inst.iteration_head if len(inst.iteration_head) == len(inst) else np.zeros(len(inst), bool)
    nested = np.where(inst.cold & head, np.maximum(nested, inst_mod.iteration_sizes(inst)), nested)
    return [
        {
            "stage": str(inst.key[i]),
            "occurrence": int(inst.occurrence[i]),
            "reason": "warmup" if inst.warmup[i] else "cold_start",
            "host_ns": int(host[i]),
            "gpu_event_ns": int(inst.gpu_event_ns[i]) if inst.gpu_event_ns[i] >= 0 else None,
            "gpu_proj_ns": int(proj[i]) if proj[i] >= 0 else None,
            "robust_z": round(float(inst.cold_z[i]), 2) if inst.cold[i] else None,
            "top_stage": inst.pipeline_head if inst.pipeline_head is not None else str(inst.key[top[i]]),
            "top_occurrence": int(inst.iteration[i]),
            "nested": int(nested[i]),
        }
        for i in idx
    ]


def _coverage(inst: inst_mod.StageInstances) -> Coverage | None:
    """How much of the run's wall time (first top-level start to last end) some top-level stage
    covers, and its GPU event time: what a run without a kernel trace can say about the GPU
    between stages. None without stages."""
    top = (inst.level == 0) & ~inst.is_mark if len(inst) else np.zeros(0, bool)
    if not top.any():
        return None
    start, end = inst.host_start_ns[top], inst.host_end_ns[top]
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    # union of the intervals: a new run starts where a start passes every end before it
    new = np.r_[True, s[1:] > e[:-1]]
    run_end = np.maximum.reduceat(e, np.flatnonzero(new))
    covered = int((run_end - s[new]).sum())
    gpu = inst.gpu_event_ns[top]
    return {"wall_ns": int(e[-1] - s[0]), "in_stages_ns": covered,
            "gpu_event_ns": int(gpu[gpu >= 0].sum()) if (gpu >= 0).any() else None,
            "gpu_event_instances": int((gpu >= 0).sum())}


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
    span = 0
    if n:
        span = int(np.asarray(trace.ops.end_ns).max() - np.asarray(trace.ops.start_ns).min())
    steady: SteadyGpu | None = None
    if startup_op is not None and len(startup_op) == n and (keep & startup_op).any():
        st = keep & ~startup_op
        steady = {"ops": int(st.sum()), "gpu_ns": float(dur[st].sum()),
                  "families": family_table(dur[st], np.asarray(fam)[st]),
                  "kernels": kernel_table(trace, fam, dur, mask=st, limit=STEADY_KERNELS_KEPT),
                  "startup_ops": int((keep & startup_op).sum()), "startup_gpu_ns": float(dur[keep & startup_op].sum())}
    return {
        "steady": steady,
        "ops": int(keep.sum()),
        "own_ops": {"count": int(own.sum()), "gpu_ns": float(dur[own].sum())},
        "gpu_ns": float(dur[sel].sum()),
        "span_ns": span,
        "attributed_share": attributed,
        "families": fams,
        "other_share": float(other),
        "distinct_kernels": int(distinct),
        "kernels": kernels,
        "kernels_truncated": distinct > len(kernels),
    }


def _stage_samples(inst: inst_mod.StageInstances, samples: Any, part_names: list[str]) -> dict[str, Any]:
    """Per-stage sampler statistics (utilisation, clocks, power, throttle reasons)."""
    from maxinstr.analyze.samples import stage_sample_stats

    try:
        return stage_sample_stats(inst, samples, part_names)
    except Exception as exc:  # noqa: BLE001 - a sampler format change must not break the report
        return {"_overall": {"error": f"samples not analysed: {type(exc).__name__}: {exc}"}}


def _reproduce(run: Run | None, trace: Trace | None, unprofiled: Run | None) -> list[ReproduceStep]:
    out: list[ReproduceStep] = []
    meta = getattr(run, "meta", None) or {}
    def words(value: Any) -> str | None:  # a command as recorded: a list of words (data: checked)
        if isinstance(value, list) and value and all(isinstance(w, str) for w in value):
            return shlex.join(value)
        return value if isinstance(value, str) and value else None

    text = words(meta.get("command"))
    if text:
        out.append({"what": "the program, as run", "command": text})
    rerun = meta.get("maxinstr_command")
    if isinstance(rerun, list) and rerun and all(isinstance(w, str) for w in rerun):
        # `maxinstr run` recorded how it ran the program: its --stage specs, warm-up, profiler
        out.append({"what": "the run, as maxinstr run made it", "command": shlex.join(rerun)})
    prof = meta.get("profiler")
    pc = words(prof.get("command")) if isinstance(prof, dict) else None
    if pc:
        out.append({"what": "the profiler capture", "command": pc})
    parts = ["maxinstr", "report"]
    if run is not None and getattr(run, "path", None):
        parts.append(str(run.path))
    if trace is not None and (trace.meta or {}).get("rank_sources"):
        for r, src in zip(cast("list[int]", trace.meta["ranks"]), cast("list[str]", trace.meta["rank_sources"])):
            parts += ["--trace", f"{r}={src}"]
    elif trace is not None and trace.format != "maxinstr-inprocess":  # in-process kernels are read from the run itself
        parts += ["--trace", str(trace.source)]
    if unprofiled is not None and getattr(unprofiled, "path", None):
        parts += ["--unprofiled", str(unprofiled.path)]
    out.append({"what": "this report", "command": shlex.join(parts)})
    return out
