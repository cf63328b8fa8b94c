"""Where a report's numbers come from: ``sources`` (the inputs, the join, notes on what they
lacked), ``environment`` (the run's meta.json) and ``perturbed`` (a profiler around the timings)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from maxinstr._units import ns_text
from maxinstr.analyze import instances as inst_mod
from maxinstr.analyze.schema import Environment, Sources
from maxinstr.attribute.attribute import stage_domain_mask
from maxinstr.attribute.model import Attribution, Rule
from maxinstr.rundir import Run
from maxinstr.rundir import format as fmt
from maxinstr.traces.inprocess import FORMAT as INPROCESS_FORMAT
from maxinstr.traces.model import RangeStyle, Trace

CAPTURE_FIX = "rerun with `maxinstr run --capture all -- CMD` (the whole process; the report still keeps warm-up apart)"
EVENT_NOTES_KEPT = 10
MAX_MARKERS_COST = "H200 decoder, docs/max.md: 915 against 1527 tokens/s plain"
"""What MAX's op markers were measured to cost MAX, quoted wherever the report speaks of them."""
_META_KEYS = ("command", "maxinstr_command", "cwd", "git", "host", "python", "maxinstr", "gpus", "driver", "cuda", "rocm",
              "frameworks", "env", "user", "profiler", "warmup", "clock")


def sources(run: Run | None, trace: Trace | None, attribution: Attribution | None, unprofiled_run: Run | None,
            inst: inst_mod.StageInstances) -> Sources:
    notes: list[str] = list(run.notes) + _event_notes(run) if run is not None else []
    notes += (trace.notes if trace is not None else []) + (attribution.notes if attribution is not None else [])
    notes += list(inst.notes) + _sampled_out_note(run) + _max_markers_note(run, trace)
    join = joined = join_problem = None
    if attribution is not None and run is not None:
        join = attribution.join_method.name.lower()
        joined = int((inst.range_index >= 0).sum())
        if joined == 0 and len(inst) and trace is not None:
            notes.append("no stage record joined a trace range: GPU projection per stage is unavailable")
            join_problem = _join_problem(trace)
    return {
        "run": str(run.path) if run is not None and run.path else None,
        "trace": str(trace.source) if trace is not None else None,
        "trace_format": str(trace.format) if trace is not None else None,
        "trace_clock": str(trace.clock) if trace is not None else None,
        "unprofiled_run": str(unprofiled_run.path) if unprofiled_run is not None and unprofiled_run.path else None,
        "join": join,
        "records_joined": joined,
        "attribution_rules": _rules_used(attribution),
        "join_problem": join_problem,
        "notes": notes,
    }


def capture_check(meta: dict[str, Any], n_ops: int, inst: inst_mod.StageInstances) -> tuple[str | None, str | None]:
    """What a steady-state capture (meta.json ``capture``) missed: (a line for the report's top,
    a note). At the top: a capture holding no GPU op while steady instances ran, or one the
    session could not start. A note: steady instances that ran outside the capture range."""
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


def _event_notes(run: Run) -> list[str]:
    """The warnings and errors in the parts' events.jsonl (what the run went without), each
    distinct message once, with how many parts said it."""
    said: dict[tuple[str, str], set[str]] = {}
    for ev in run.events:
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
    if run is None or not len(run.stages):
        return []
    flags = np.asarray(run.stages["flags"])
    out = int(((flags & fmt.GPU_SAMPLED_OUT) != 0).sum())
    if not out:
        return []
    timed = int(((flags & fmt.GPU_TIMED) != 0).sum())
    return [f"GPU event times from {timed} of {timed + out} stage instances: the GPU-timing budget left {out} "
            "untimed (whole top-level stages) to keep event work within its share of wall time; "
            "MAXINSTR_GPU_BUDGET=0 times every stage"]


def _max_markers_note(run: Run | None, trace: Trace | None) -> list[str]:
    """Whether MAX's op markers were on in a run of a MAX program: on, the times include their
    cost; off under a profiler, how to see MAX's ops inside the stages."""
    meta = run.meta if run is not None else None
    if not isinstance(meta, dict) or not (meta.get("frameworks") or {}).get("max"):
        return []
    loaded = meta.get("frameworks_loaded")  # at close; runs before it say only what is installed
    if isinstance(loaded, list) and "max" not in loaded:
        return []  # MAX installed beside a program that never imported it (a PyTorch decoder)
    level = str((meta.get("env") or {}).get("MODULAR_ENABLE_PROFILING", "off")).strip().lower()
    cost = (f"MAX compiled its graphs with them and they cost it host time ({MAX_MARKERS_COST}); these times "
            "include that")
    if level not in ("", "off", "0", "false"):
        return [f"MAX's op markers were on (MODULAR_ENABLE_PROFILING={level}): {cost}"]
    # off at start, but the program can turn them on (enable_max_profiling()): then the trace holds their ranges
    stage = stage_domain_mask(trace) if trace is not None else None
    others = 0 if stage is None or trace is None else int((~stage & (np.asarray(trace.ranges.style) != RangeStyle.MARK)).sum())
    if others:
        return [f"MAX's op markers were on (the trace holds {others} ranges besides maxinstr's stages, though "
                f"MODULAR_ENABLE_PROFILING was not set when the run started: the program turned them on): {cost}"]
    if trace is not None and trace.format != INPROCESS_FORMAT:
        return ["MAX's op ranges were off: `maxinstr run --max-ops detailed` shows MAX's ops inside each stage, at a "
                f"cost to MAX ({MAX_MARKERS_COST})"]
    return []


def _rules_used(attribution: Attribution | None) -> dict[str, int] | None:
    if attribution is None or len(attribution.op_rule) == 0:
        return None
    counts = np.bincount(np.asarray(attribution.op_rule, np.int64), minlength=len(Rule))
    return {Rule(i).name.lower(): int(c) for i, c in enumerate(counts) if c}


def environment(run: Run | None, trace: Trace | None, sweep: dict[str, str] | None) -> Environment:
    """The run's meta.json keys that have a value, the trace's scalar metadata and the
    ``maxinstr run --sweep`` value."""
    env: Environment = {}
    if run is not None:
        meta = run.meta or {}
        env = cast(Environment, {k: meta.get(k) for k in _META_KEYS if meta.get(k) not in (None, "", {}, [])})
    if trace is not None and trace.meta:
        env["trace_meta"] = {k: v for k, v in trace.meta.items() if isinstance(v, (str, int, float, bool))}
    if sweep:
        env["sweep"] = sweep
    return env


def perturbed(run: Run | None, trace: Trace | None) -> tuple[bool, str | None]:
    meta = (run.meta or {}) if run is not None else {}
    prof = meta.get("profiler") if isinstance(meta, dict) else None
    if prof:
        name = prof.get("name", "a profiler") if isinstance(prof, dict) else str(prof)
        return True, f"captured under {name}: timings include its overhead"
    if trace is not None and trace.format == INPROCESS_FORMAT:
        return True, "kernels collected in-process (kernels=True, CUPTI): timings include its overhead (docs/kernels.md)"
    if trace is not None:
        return True, f"timings come from a {trace.format} trace: captured under a profiler, which adds overhead"
    return False, None
