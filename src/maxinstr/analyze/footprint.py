"""What watching cost: per stage, the share of its host time that was maxinstr's own work,
estimated per instance over everything nested in it from what the run recorded about itself:

* **stages**: each enter+exit costs ``stage_ns`` (timed by the session: record/footprint.py),
  times STAGE_FELT, what a launch-bound step was measured to feel;
* **GPU events**: the host ns the core counted in its event calls (part.json ``gpu_cost_ns``);
* **kernels=True**: OP_STAGE_RATIO stage costs per GPU op the in-process collector tied to it.

The constants and their check are ``benchmarks/decoder_ab.py`` (docs/benchmarks.md, "What
watching costs"). A profiler around the program is not in the estimate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxinstr.analyze.instances import StageInstances

STAGE_FELT = 4.0
"""A launch-bound decode step felt each stage at about this many times the probe's direct cost,
the session's threads included (H100, decoder_ab 2026-12-05: ~2.7 us a stage against ~0.35-0.7)."""
OP_STAGE_RATIO = 7.5
"""kernels=True per GPU op, in the session's measured stage cost (so it follows the machine's
speed): H100, decoder_ab 2026-12-05, 1.5 us an op where a stage probed 204 ns."""
THRESHOLD_SHARE = 0.05
"""Past this share of a top-level stage's time, the report has a finding with the cheaper setting."""


def _subtree_sums(inst: StageInstances, values: np.ndarray) -> np.ndarray:
    """Per instance: ``values`` summed over it and everything nested in it, deepest level first."""
    out = values.astype(np.float64).copy()
    parent = np.asarray(inst.parent, np.int64)
    depth = np.asarray(inst.depth, np.int64)
    if not len(out):
        return out
    for d in range(int(depth.max()), 0, -1):
        rows = np.flatnonzero((depth == d) & (parent >= 0))
        np.add.at(out, parent[rows], out[rows])
    return out


def _median_stage_ns(parts: list[dict[str, Any]]) -> float | None:
    values = []
    for part in parts:
        fp = part.get("footprint")
        v = fp.get("stage_ns") if isinstance(fp, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e7:
            values.append(float(v))
    return float(np.median(values)) if values else None


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62 else None


def _event_cost_ns(parts: list[dict[str, Any]]) -> int:
    """The ns the core spent in event calls during the parts' sessions: its counter (the
    process's, which may have held other sessions) at close less at open."""
    total = 0
    for part in parts:
        native, fp = part.get("native"), part.get("footprint")
        end = _count(native.get("gpu_cost_ns")) if isinstance(native, dict) else None
        start = _count(fp.get("gpu_cost_ns_at_open")) if isinstance(fp, dict) else None
        if end is not None:
            total += max(end - (start or 0), 0) if start is None or start <= end else end
    return total


def _gpu_run(parts: list[dict[str, Any]]) -> bool:
    """Whether a part's core loaded a GPU driver (part.json ``native.gpu_backend``)."""
    return any(isinstance(p.get("native"), dict) and p["native"].get("gpu_backend") not in (None, "", "none")
               for p in parts)


def footprint(inst: StageInstances, run: Any, *, inprocess_kernels: bool) -> dict[str, Any] | None:
    """The report's ``footprint`` (docs/report.md); None without a run or a measured stage cost."""
    if run is None or not len(inst):
        return None
    parts = [p for p in getattr(run, "parts", []) if isinstance(p, dict)]
    stage_ns = _median_stage_ns(parts)
    if stage_ns is None:
        return None
    # STAGE_FELT was measured where stages sit between GPU launches; a program with no GPU
    # driver felt its stages at about their probed cost (CPU A/B on the dev VM, 155 against 151 ns)
    felt = STAGE_FELT if _gpu_run(parts) else 1.0
    real = ~np.asarray(inst.is_mark, bool)
    n_sub = _subtree_sums(inst, real.astype(np.float64))
    timed = (np.asarray(inst.gpu_event_ns, np.int64) >= 0) & real
    n_timed = int(timed.sum())
    event_ns = _event_cost_ns(parts) / n_timed if n_timed else 0.0
    timed_sub = _subtree_sums(inst, timed.astype(np.float64))
    ops = np.asarray(inst.op_count, np.int64) if inprocess_kernels and len(inst.op_count) == len(inst) else None
    per_op_ns = OP_STAGE_RATIO * stage_ns
    op_ns = np.maximum(ops, 0) * per_op_ns if ops is not None else np.zeros(len(inst))
    est = n_sub * stage_ns * felt + timed_sub * event_ns + op_ns
    host = np.asarray(inst.host_ns, np.float64)
    steady = np.asarray(inst.steady, bool) & real & (host > 0)
    uniq, code = inst.key_codes()
    spent = np.bincount(code[steady], weights=est[steady], minlength=len(uniq))
    held = np.bincount(code[steady], weights=host[steady], minlength=len(uniq))
    # a share is of the stage's own time: an estimate past it (a stage around nothing) is all of it
    shares = {str(k): min(float(s / h), 1.0) for k, s, h in zip(uniq, spent, held) if h > 0}
    top = steady & (np.asarray(inst.depth, np.int64) == 0)
    top_host = float(host[top].sum())
    overall = min(float(est[top].sum() / top_host), 1.0) if top_host > 0 else None
    parts_of = {"stages": float((n_sub * stage_ns * felt)[top].sum()),
                "gpu_events": float((timed_sub * event_ns)[top].sum()),
                "kernels": float(op_ns[top].sum())}
    return {"stage_ns": stage_ns, "stage_felt": felt, "event_ns": float(event_ns), "gpu_timed_instances": n_timed,
            "op_ns": per_op_ns if ops is not None else None, "share_by_stage": shares, "overall_share": overall,
            "overall_ns_by_source": parts_of if top_host > 0 else None}
