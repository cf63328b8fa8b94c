"""nsys's tables over an attribution (``gpu_proj_sum``, ``nvtx_sum``, ``kern_sum``: the rows and columns
of ``nsys stats``, held to its output on the fixtures), and :func:`kernels_by_range`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from maxinstr.attribute.model import Attribution
from maxinstr.traces.model import OpKind, RangeStyle, Trace

_STYLE = {int(RangeStyle.PUSH_POP): "PushPop", int(RangeStyle.START_END): "StartEnd", int(RangeStyle.MARK): "Mark"}


def range_names(trace: Trace) -> np.ndarray:
    """``domain:text`` per range, as nsys names them (``:text`` without a domain)."""
    R = trace.ranges
    pairs, inv = np.unique(np.stack([R.domain_id, R.name_id], axis=1), axis=0, return_inverse=True)
    labels = np.array([f"{trace.name(int(d))}:{trace.name(int(t))}" for d, t in pairs], dtype=object)
    return labels[inv.reshape(-1)] if len(R) else np.empty(0, dtype=object)


def _stats(values: np.ndarray) -> dict[str, float]:
    v = values.astype(np.float64)
    return {"total": float(v.sum()), "avg": float(v.mean()), "med": float(np.median(v)), "min": float(v.min()),
            "max": float(v.max()), "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0}


def _groups(labels: np.ndarray, mask: np.ndarray) -> list[tuple[Any, np.ndarray]]:
    rows = np.flatnonzero(mask)
    uniq, inv = np.unique(labels[rows], return_inverse=True)
    order = np.argsort(inv.reshape(-1), kind="stable")
    counts = np.bincount(inv.reshape(-1), minlength=len(uniq))
    return list(zip(uniq, np.split(rows[order], np.cumsum(counts)[:-1])))


def gpu_proj_sum(att: Attribution) -> list[dict[str, object]]:
    """nsys ``nvtx_gpu_proj_sum``: per (range name, style) over the instances owning GPU ops, by projected
    time. "GPU Ops" counts launches."""
    trace = att.trace
    R = trace.ranges
    projected = att.proj_start_ns >= 0
    proj, host = att.proj_end_ns - att.proj_start_ns, R.end_ns - R.start_ns
    child_of = att.range_parent[projected & (att.range_parent >= 0)]
    children = np.bincount(child_of, minlength=len(R))[: len(R)]
    out: list[dict[str, Any]] = []
    for name, style, rows in _range_groups(trace, projected):
        s = _stats(proj[rows])
        out.append({
            "Range": name, "Style": style,
            "Total Proj Time (ns)": int(s["total"]), "Total Range Time (ns)": int(host[rows].sum()),
            "Range Instances": len(rows), "Proj Avg (ns)": s["avg"], "Proj Med (ns)": s["med"],
            "Proj Min (ns)": int(s["min"]), "Proj Max (ns)": int(s["max"]), "Proj StdDev (ns)": s["std"],
            "Total GPU Ops": int(att.launch_count[rows].sum()), "Avg GPU Ops": float(att.launch_count[rows].mean()),
            "Avg Range Lvl": float(att.range_depth[rows].mean()), "Avg Num Child": float(children[rows].mean()),
            "Total Ops": int(att.op_count[rows].sum()), "Total Busy (ns)": int(att.busy_ns[rows].sum()),
        })  # fmt: skip
    out.sort(key=lambda r: (-int(r["Total Proj Time (ns)"]), str(r["Range"])))
    return out


def nvtx_sum(trace: Trace) -> list[dict[str, object]]:
    """Host time per (range name, style) over every range instance (nsys ``nvtx_sum``)."""
    R = trace.ranges
    host = R.end_ns - R.start_ns
    return _shares([{"Range": name, "Style": style, **_time_row(host[rows])}
                    for name, style, rows in _range_groups(trace, R.style != RangeStyle.MARK)], "Range")


def kern_sum(trace: Trace) -> list[dict[str, object]]:
    """Kernel time per kernel name (nsys ``cuda_gpu_kern_sum``)."""
    O, dur = trace.ops, trace.ops.end_ns - trace.ops.start_ns
    return _shares([{"Name": trace.name(int(name_id)), **_time_row(dur[rows])}
                    for name_id, rows in _groups(O.name_id, O.kind == OpKind.KERNEL)], "Name")


def _range_groups(trace: Trace, mask: np.ndarray) -> list[tuple[str, str, np.ndarray]]:  # per (name, style)
    key = np.array([f"{n}\x00{_STYLE[int(s)]}" for n, s in zip(range_names(trace), trace.ranges.style)], dtype=object)
    return [(*str(label).split("\x00"), rows) for label, rows in _groups(key, mask)]  # type: ignore[misc]


def _time_row(values: np.ndarray) -> dict[str, Any]:
    s = _stats(values)
    return {"Total Time (ns)": int(s["total"]), "Instances": len(values), "Avg (ns)": s["avg"], "Med (ns)": s["med"],
            "Min (ns)": int(s["min"]), "Max (ns)": int(s["max"]), "StdDev (ns)": s["std"]}


def _shares(rows: list[dict[str, Any]], name: str) -> list[dict[str, object]]:
    """Each row's share of the total time, the rows by time (then name), as nsys orders them."""
    total = sum(int(r["Total Time (ns)"]) for r in rows) or 1
    for r in rows:
        r["Time (%)"] = 100.0 * int(r["Total Time (ns)"]) / total
    return sorted(rows, key=lambda r: (-int(r["Total Time (ns)"]), str(r[name])))


@dataclass
class RangeKernels:  # kernels per range instance, one row per (range, kernel name)
    range_index: np.ndarray  # index into trace.ranges
    name_id: np.ndarray  # kernel name id into trace.strings
    count: np.ndarray
    total_ns: np.ndarray


def kernels_by_range(att: Attribution, inclusive: bool = True) -> RangeKernels:
    """Kernel names with counts and GPU time per range instance, from ``op_range``: credited to
    every enclosing range too with ``inclusive`` (nsys's convention), else the innermost only."""
    O = att.trace.ops
    k = np.flatnonzero((O.kind == OpKind.KERNEL) & (att.op_range >= 0))
    ops_l, rng_l = [k], [att.op_range[k]]
    if inclusive:
        cur_ops, cur = k, att.op_range[k]
        while True:
            up = att.range_parent[cur]
            keep = up >= 0
            cur_ops, cur = cur_ops[keep], up[keep]
            if not len(cur_ops):
                break
            ops_l.append(cur_ops)
            rng_l.append(cur)
    ops_all, rng_all = np.concatenate(ops_l), np.concatenate(rng_l)
    names, dur = O.name_id[ops_all].astype(np.int64), (O.end_ns - O.start_ns)[ops_all]
    packed = (rng_all << 32) | (names & 0xFFFFFFFF)
    uniq, inv, counts = np.unique(packed, return_inverse=True, return_counts=True)
    total = np.bincount(inv.reshape(-1), weights=dur, minlength=len(uniq)).astype(np.int64)
    return RangeKernels(uniq >> 32, (uniq & 0xFFFFFFFF).astype(np.int32), counts.astype(np.int64), total)
