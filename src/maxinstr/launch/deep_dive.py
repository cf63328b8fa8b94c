"""`maxinstr deep-dive` (docs/cli.md): choose a stage's dominant kernel as the report counts it, place it
(``--launch-skip`` in process-wide launch order), build the ``ncu`` command, read its CSV back into a
:class:`Verdict`; on AMD, :func:`amd_equivalent`."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from maxinstr.columns import correlation_join
from maxinstr.errors import MaxinstrError
from maxinstr.traces.model import OpKind

DEFAULT_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")
# Local-memory instructions executed: non-zero means register spills (or local arrays).
SPILL_METRICS = ("sm__sass_inst_executed_op_local_ld.sum", "sm__sass_inst_executed_op_local_st.sum")
LATENCY_BOUND_PCT = 60.0  # below this % of peak for SM and memory, ncu's SOLBottleneck rule says latency-bound


@dataclass
class KernelChoice:  # the kernel to deep-dive and where its steady-state instance is
    name: str
    stage: str | None
    total_ns: int = 0
    count: int = 0
    share: float | None = None  # of the stage's GPU time
    launch_skip: int = 0
    source: str = ""
    notes: list[str] = field(default_factory=list)
    candidates: list[tuple[str, int, int]] = field(default_factory=list)  # top kernels: (name, total_ns, count)

    def to_json(self) -> dict:
        return asdict(self)


def function_name(name: str) -> str:
    """A kernel's bare function name, as ncu's ``--kernel-name-base function`` gives it.

    >>> function_name("void at::native::reduce_kernel<(int)512, (int)1>(T3)")
    'reduce_kernel'"""
    text = name.replace("(anonymous namespace)", "").replace("<unnamed>", "").strip()
    if text.startswith("void "):
        text = text[5:]
    head = text[: next((i for i, ch in enumerate(text) if ch in "<("), len(text))].strip()
    return head.split("::")[-1].split()[-1] if head else name


def stage_ops(analysis: Any, stage: str) -> tuple[np.ndarray, np.ndarray, int, str]:
    """The ops the report's ``stages[].mix`` counts for ``stage`` (a key, or a name taking its every key):
    (op indices, one per enclosing steady instance (all when none); their instances; instances used; keys)."""
    from maxinstr.analyze.kernels import op_instance_pairs  # (here: the analysis is loaded for a trace only)

    inst, trace = analysis.instances, analysis.trace
    # compared as objects: a fixed-width copy of the names is instances x the longest name
    keys = np.asarray(inst.key, dtype=object) if len(inst) else np.empty(0, dtype=object)
    sel = np.fromiter((k == stage for k in keys.tolist()), bool, len(keys))
    if not sel.any():
        sel = np.fromiter((k == stage for k in np.asarray(inst.name, dtype=object).tolist()), bool, len(keys))
    if not sel.any():
        raise MaxinstrError(f"{trace.source}: no range named {stage!r} in the trace")
    matched = ", ".join(sorted(set(keys[sel].tolist())))
    op_i, inst_i = op_instance_pairs(inst, trace, analysis.attribution)
    stage_inst = sel & ~np.asarray(inst.is_mark, bool)
    use = stage_inst & inst.steady if (stage_inst & inst.steady).any() else stage_inst
    keep = use[inst_i] if len(inst_i) else np.zeros(0, bool)
    return op_i[keep], inst_i[keep], int(use.sum()), matched


def choose_from_trace(trace: Any, *, stage: str | None = None, kernel: str | None = None,
                      warmup_instances: int | None = 0, top: int = 5, run: Any = None, analysis: Any = None) -> KernelChoice:
    """The dominant kernel of ``stage`` (or the trace), or the top one matching ``kernel``, counted as the
    report counts (``run``, ``warmup_instances``: `report RUN --trace T --warmup N`); ``launch_skip``:
    the earlier launches of its function name, in process-wide launch order."""
    ops, strings = trace.ops, np.asarray(trace.strings, dtype=object)
    is_kernel = ops.kind == OpKind.KERNEL
    notes: list[str] = []
    dur = np.maximum((ops.end_ns - ops.start_ns).astype(np.int64), 0)
    if stage is not None:
        if analysis is None:
            from maxinstr.analyze.report import analyze  # (here: ~0.1 s of imports, for a trace only)

            analysis = analyze(run=run, trace=trace, warmup=warmup_instances)
        op_idx, _inst, n_inst, matched = stage_ops(analysis, stage)
        if matched != stage:
            notes.append(f"stage {stage!r} matches the report's stage(s) {matched}")
        if not is_kernel[op_idx].any():
            raise MaxinstrError(f"{trace.source}: no kernel was launched inside a steady-state instance of {stage!r} "
                                f"({n_inst} instances used, as the report counts them)")
    else:
        op_idx = np.arange(len(ops))
        if not is_kernel.any():
            raise MaxinstrError(f"{trace.source}: the trace has no kernels")
    # Per distinct op name over the stage's ops (copies included: the share's denominator).
    uniq, inv = np.unique(ops.name_id[op_idx], return_inverse=True)
    inv = inv.reshape(-1)
    totals = np.bincount(inv, weights=dur[op_idx], minlength=len(uniq)).astype(np.int64)
    counts = np.bincount(inv, minlength=len(uniq)).astype(np.int64)
    name_is_kernel = np.zeros(len(uniq), bool)
    name_is_kernel[inv[is_kernel[op_idx]]] = True
    rank = [i for i in np.argsort(-totals, kind="stable") if name_is_kernel[i]]
    candidates = [(str(strings[uniq[i]]), int(totals[i]), int(counts[i])) for i in rank[:top]]
    where = f"stage {stage!r}" if stage else "the trace"
    pick = rank[_pick([str(strings[uniq[i]]) for i in rank], kernel, f"{trace.source}: no kernel in {where} matches {kernel!r}")]
    name_id = int(uniq[pick])
    name, stage_total = str(strings[name_id]), int(totals.sum())
    # place it: the kernel names sharing its function name (per name, not per op) are what ncu's filter counts
    base, kernel_ids = function_name(name), np.unique(ops.name_id[is_kernel])
    same_base = np.array([i for i in kernel_ids.tolist() if function_name(str(strings[i])) == base], dtype=np.int64)
    launch_t = ops.start_ns.astype(np.int64)  # per op, its launch call's start, else its own
    if len(calls := trace.calls):  # (correlation ids are per process: joined on both)
        call = correlation_join(ops.pid, ops.correlation_id, calls.pid, calls.correlation_id)
        launch_t = np.where(call >= 0, calls.start_ns[call], launch_t)
    cand = np.flatnonzero(is_kernel & np.isin(ops.name_id, same_base))
    cand = cand[np.lexsort((ops.start_ns[cand], launch_t[cand]))]
    chosen = np.flatnonzero(np.isin(cand, op_idx) & (ops.name_id[cand] == name_id))
    launch_skip = int(chosen[0]) if len(chosen) else 0
    if len(same_base) > 1:
        notes.append(f"{len(same_base)} kernel names share the function name {base!r}: launch-skip counts them all")
    if len(np.unique(ops.pid[cand])) > 1:
        notes.append("the kernel ran in several processes: the launch count is over all of them")
    return KernelChoice(name=name, stage=stage, total_ns=int(totals[pick]), count=int(counts[pick]),
                        share=(float(totals[pick]) / stage_total) if stage_total else None, launch_skip=launch_skip,
                        source=str(trace.source), notes=notes, candidates=candidates)


def _pick(names: list[str], kernel: str | None, missing: str) -> int:  # the first matching regex ``kernel``
    if kernel is None:
        return 0
    rx = re.compile(kernel)
    if (hit := next((i for i, name in enumerate(names) if rx.search(name)), None)) is None:
        raise MaxinstrError(missing)
    return hit


def _kernel_rows(obj: Any) -> list[tuple[str, int, int, float | None]]:
    """(name, GPU ns, count, the report's share) per kernel of a report's list, by time; no copies."""
    rows = [(str(k["name"]), int(k["gpu_ns"]), int(k.get("count") or 0),
             k.get("share") if isinstance(k.get("share"), (int, float)) else None)
            for k in obj if isinstance(k, dict) and "name" in k and isinstance(k.get("gpu_ns"), (int, float))
            and k.get("family") not in ("memcpy", "memset")] if isinstance(obj, list) else []
    return sorted(rows, key=lambda r: -r[1])


def choose_from_report(data: dict, *, stage: str | None = None, kernel: str | None = None, source: str = "report") -> KernelChoice:
    """Pick from a `maxinstr report --format json` document: the stage's ``mix.top_kernels``, else
    ``gpu.kernels``. No launch order there: ``launch_skip`` 0, said (the trace places it exactly)."""
    if stage is not None:
        obj = next((s for s in data.get("stages") or [] if isinstance(s, dict) and s.get("name") == stage), None)
        if obj is None:
            raise MaxinstrError(f"{source}: no stage named {stage!r} in the report")
        rows = _kernel_rows((obj.get("mix") or {}).get("top_kernels"))
    else:
        rows = _kernel_rows((data.get("gpu") or {}).get("kernels"))
    if not rows:
        raise MaxinstrError(f"{source}: the report lists no kernels{' for stage ' + repr(stage) if stage else ''}")
    pick = rows[_pick([r[0] for r in rows], kernel, f"{source}: no kernel matches {kernel!r}")]
    total = sum(r[1] for r in rows)
    # the report's own share (of all the stage's GPU time, copies included) when it has one
    share = pick[3] if pick[3] is not None else (pick[1] / total if total else None)
    return KernelChoice(name=pick[0], stage=stage, total_ns=pick[1], count=pick[2], share=share, launch_skip=0,
                        source=source, candidates=[r[:3] for r in rows[:5]],
                        notes=["the report has no launch order: launch-skip 0 (give --trace to land on a steady-state instance)"])


def ncu_command(choice: KernelChoice, app: list[str], *, output: str | Path, ncu: str = "ncu",
                sections: tuple[str, ...] = DEFAULT_SECTIONS, metrics: tuple[str, ...] = SPILL_METRICS,
                from_capture_start: bool = False, launch_count: int = 1) -> list[str]:
    """The Nsight Compute command that profiles one steady-state launch of the chosen kernel: named by its
    bare function name, which nsys and ncu agree on (their signatures differ: ``(int)512`` vs ``512``)."""
    rx = f"regex:(^|::){re.escape(function_name(choice.name))}$"
    cmd = [ncu, "--target-processes", "all", "--kernel-name-base", "function", "--kernel-name", rx, "--launch-skip",
           str(choice.launch_skip), "--launch-count", str(launch_count), "--clock-control", "none"]
    cmd += [word for s in sections for word in ("--section", s)]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    if from_capture_start:
        cmd += ["--profile-from-start", "off"]
    cmd += ["--force-overwrite", "--export", str(output)]
    return cmd + list(app)


def ncu_import_command(report: str | Path, ncu: str = "ncu") -> list[str]:  # the details page as CSV, base units
    return [ncu, "--import", str(report), "--csv", "--page", "details", "--print-units", "base"]


def amd_equivalent(choice: KernelChoice | None, app: list[str]) -> str:  # where Nsight Compute does not apply
    kernel = f" --kernel '{choice.name}'" if choice else ""
    return ("Nsight Compute is NVIDIA-only. On AMD use ROCm Compute Profiler: "
            f"`rocprof-compute profile -n deepdive{kernel} -- {' '.join(app) or 'CMD'}` then "
            "`rocprof-compute analyze -p workloads/deepdive/<GPU>` (occupancy, roofline, memory chart).")


@dataclass
class NcuLaunch:  # one profiled launch from ``ncu --csv --page details``
    id: str
    kernel: str
    block: str = ""
    grid: str = ""
    device: str = ""
    cc: str = ""
    metrics: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # (section, name) -> (unit, raw)
    rules: list[dict[str, str]] = field(default_factory=list)

    def value(self, name: str, section: str | None = None) -> float | None:
        """A metric as a number (thousands separators removed); None when absent or n/a."""
        for (sec, metric), (_unit, raw) in self.metrics.items():
            if metric == name and (section is None or sec == section):
                try:
                    return float(raw.strip().replace(",", ""))
                except ValueError:
                    return None
        return None

    def unit(self, name: str) -> str | None:
        return next((unit for (_sec, metric), (unit, _raw) in self.metrics.items() if metric == name), None)


def parse_ncu_csv(text: str, source: str = "ncu output") -> list[NcuLaunch]:
    """One :class:`NcuLaunch` per ``ID`` of ``ncu --csv --page details`` output, in file order."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID","Process ID"')), None)
    if start is None:
        raise MaxinstrError(f"{source}: no ncu CSV header (\"ID\",\"Process ID\",...) found")
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    launches: dict[str, NcuLaunch] = {}
    for row in reader:
        if not row.get("ID") or not (row["ID"].strip().isdigit()):
            continue
        get = lambda key, row=row: row.get(key) or ""  # noqa: E731 - an empty cell and a missing column alike
        if (launch := launches.get(row["ID"])) is None:
            launch = launches[row["ID"]] = NcuLaunch(id=row["ID"], kernel=get("Kernel Name"), block=get("Block Size"),
                                                     grid=get("Grid Size"), device=get("Device"), cc=get("CC"))
        section, metric, rule = get("Section Name"), get("Metric Name"), get("Rule Name")
        if metric:
            launch.metrics[(section, metric)] = (get("Metric Unit"), get("Metric Value"))
        if rule:
            launch.rules.append({"section": section, "rule": rule, "type": get("Rule Type"),
                                 "description": get("Rule Description"), "speedup": get("Estimated Speedup")})
    if not launches:
        raise MaxinstrError(f"{source}: the ncu CSV holds no profiled launch (did the kernel filter match?)")
    return list(launches.values())


@dataclass
class Verdict:  # why this kernel is as fast as it is, in a few numbers and one classification
    kernel: str
    duration_ns: float | None
    sm_throughput_pct: float | None
    memory_throughput_pct: float | None
    dram_throughput_pct: float | None
    achieved_occupancy_pct: float | None
    theoretical_occupancy_pct: float | None
    occupancy_limiter: str | None
    registers_per_thread: float | None
    local_memory_instructions: float | None
    block: str
    grid: str
    waves_per_sm: float | None
    bound: str  # compute-bound, memory-bound, latency-bound or unknown
    facts: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


_TIME_SCALE_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_LIMITERS = (("Block Limit Registers", "registers"), ("Block Limit Shared Mem", "shared memory"),
             ("Block Limit Warps", "warps per SM (block size)"), ("Block Limit SM", "blocks per SM"),
             ("Block Limit Barriers", "barriers"))


def make_verdict(launch: NcuLaunch) -> Verdict:
    """Compute-, memory- or latency-bound; occupancy and its limiter; registers and spills: facts with numbers."""
    v = launch.value
    sm, mem, dram = v("Compute (SM) Throughput"), v("Memory Throughput"), v("DRAM Throughput")
    dur, unit = v("Duration"), (launch.unit("Duration") or "ns").strip()
    duration_ns = dur * _TIME_SCALE_NS.get(unit, 1.0) if dur is not None else None
    achieved, theoretical = v("Achieved Occupancy"), v("Theoretical Occupancy")
    regs, waves = v("Registers Per Thread"), v("Waves Per SM")
    spills = [x for x in (v(m) for m in SPILL_METRICS) if x is not None]
    local = float(sum(spills)) if spills else None
    limits = [(n, label) for n, label in ((v(metric), label) for metric, label in _LIMITERS) if n is not None]
    limiter = min(limits)[1] if limits and theoretical is not None and theoretical < 99.5 else None
    if sm is None or mem is None:
        bound, fact, tip = "unknown", "SpeedOfLight metrics missing: cannot classify", None
    elif max(sm, mem) < LATENCY_BOUND_PCT:
        bound, fact, tip = ("latency-bound", f"SM {sm:.1f}% and memory {mem:.1f}% of peak, both below {LATENCY_BOUND_PCT:.0f}%",
                            "neither unit is busy: look at occupancy, waves and warp stalls (too few warps, dependent loads, tiny grid)")
    elif mem >= sm:
        bound, fact, tip = ("memory-bound", f"memory throughput {mem:.1f}% of peak is above SM {sm:.1f}%",
                            "reduce bytes moved (fusion, lower precision, better reuse/caching) before tuning math")
    else:
        bound, fact, tip = ("compute-bound", f"SM throughput {sm:.1f}% of peak is above memory {mem:.1f}%",
                            "use faster math paths (tensor cores, lower precision) or do less work")
    facts, advice = [fact], ([tip] if tip else [])
    if achieved is not None and theoretical is not None:
        facts.append(f"achieved occupancy {achieved:.1f}% of theoretical {theoretical:.1f}%")
        if limiter:
            facts.append(f"theoretical occupancy is limited by {limiter}")
        if theoretical > 0 and achieved < 0.8 * theoretical:
            advice.append("achieved occupancy is well below theoretical: load imbalance, a partial last wave"
                          + (f" ({waves:.2f} waves per SM)" if waves is not None else "") + " or too few blocks")
    if regs is not None:
        facts.append(f"{regs:.0f} registers per thread")
    if local is not None:
        if local > 0:
            facts.append(f"{local:.0f} local-memory load/store instructions executed (register spills or local arrays)")
            advice.append("local memory traffic: cap registers (__launch_bounds__/maxrregcount) carefully or shrink per-thread state")
        else:
            facts.append("no local-memory instructions: no register spills")
    return Verdict(kernel=launch.kernel, duration_ns=duration_ns, sm_throughput_pct=sm, memory_throughput_pct=mem,
                   dram_throughput_pct=dram, achieved_occupancy_pct=achieved, theoretical_occupancy_pct=theoretical,
                   occupancy_limiter=limiter, registers_per_thread=regs, local_memory_instructions=local,
                   block=launch.block, grid=launch.grid, waves_per_sm=waves, bound=bound, facts=facts, advice=advice)


def verdict_lines(verdict: Verdict, rules: list[dict[str, str]] | None = None) -> list[str]:  # for the terminal
    def pct(x: float | None, form: str = "{:.1f}%") -> str:
        return "n/a" if x is None else form.format(x)

    dur = pct(None if verdict.duration_ns is None else verdict.duration_ns / 1e3, "{:.1f} us")
    lines = [
        f"kernel: {verdict.kernel}",
        f"  verdict: {verdict.bound}  (duration {dur}, block {verdict.block or '?'}, grid {verdict.grid or '?'})",
        f"  SM throughput {pct(verdict.sm_throughput_pct)} of peak, memory {pct(verdict.memory_throughput_pct)} "
        f"(DRAM {pct(verdict.dram_throughput_pct)})",
        f"  occupancy: achieved {pct(verdict.achieved_occupancy_pct)}, theoretical {pct(verdict.theoretical_occupancy_pct)}"
        + (f", limited by {verdict.occupancy_limiter}" if verdict.occupancy_limiter else ""),
        f"  registers/thread: {pct(verdict.registers_per_thread, '{:.0f}')}, local-memory instructions: "
        + pct(verdict.local_memory_instructions, "{:.0f}"),
    ]
    lines += [f"  fact: {f}" for f in verdict.facts]
    lines += [f"  next: {a}" for a in verdict.advice]
    for r in (rules or [])[:3]:
        if r.get("type") in ("OPT", "WRN"):
            sp = f" (est. speedup {r['speedup']}%)" if r.get("speedup") else ""
            lines.append(f"  ncu {r['rule']}{sp}: {r['description'][:200]}")
    return lines


def load_report_json(path: str | Path) -> dict:
    """A saved report, checked as `maxinstr report REPORT.json` checks it, or a one-line error."""
    from maxinstr.analyze.schema_check import read_report  # (here: a saved report's path only)

    return dict(read_report(path))
