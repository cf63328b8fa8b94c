"""Merge the traces of several ranks (``--trace r0.sqlite --trace r1.sqlite``, each rank profiled on
its own) into one :class:`~maxinstr.traces.model.Trace`: every row kept and tagged with its rank,
names re-interned into one table, NVTX payloads (record ids, which can repeat across ranks) mapped
through ``payload_map(rank, payload)`` so a rank's ranges join only its own records, clashing
process ids re-numbered so (pid, correlation id) stays unique. Each trace keeps its own timebase:
attribution works within one process, and spans across ranks are not compared on trace clocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

import numpy as np

from maxinstr.traces.model import Calls, GpuOps, Ranges, Trace

PID_SHIFT = 22
"""Re-numbered pid = ``(trace index + 1) << PID_SHIFT | pid`` (Linux pids are below 2**22)."""


def merge_rank_traces(traces: list[Trace], ranks: list[int],
                      payload_map: Callable[[int, np.ndarray], np.ndarray] | None = None) -> tuple[Trace, dict[str, np.ndarray]]:
    """One trace holding every rank's rows, and ``{"ops": rank per op, "ranges": rank per range,
    "calls": rank per call}``."""
    if len(traces) != len(ranks):
        raise ValueError("one rank per trace")
    table: dict[str, int] = {}

    def remap(strings: np.ndarray) -> np.ndarray:  # (the last slot: -1 stays -1)
        return np.array([table.setdefault(str(s), len(table)) for s in strings] + [-1], np.int32)

    seen_pids: set[int] = set()
    parts: dict[str, list[Any]] = {"ranges": [], "calls": [], "ops": []}
    row_rank: dict[str, list[Any]] = {"ranges": [], "calls": [], "ops": []}
    notes: list[str] = []
    for ti, (t, rank) in enumerate(zip(traces, ranks)):
        m = remap(np.asarray(t.strings, dtype=object))
        pids = set(np.unique(np.r_[np.asarray(t.ranges.pid), np.asarray(t.calls.pid), np.asarray(t.ops.pid)]).tolist())
        clash = bool(pids & seen_pids)
        seen_pids |= pids
        if clash:
            notes.append(f"{t.source}: process ids clash with another rank's trace: re-numbered")
        for attr, cls in (("ranges", Ranges), ("calls", Calls), ("ops", GpuOps)):
            tab = getattr(t, attr)
            cols = {f.name: np.asarray(getattr(tab, f.name)) for f in fields(cls)}
            for key in ("name_id", "domain_id"):
                if key in cols:
                    cols[key] = m[np.where(cols[key] >= 0, cols[key], -1)]
            pid = np.asarray(cols["pid"], np.int64)
            cols["pid"] = ((ti + 1) << PID_SHIFT) | pid if clash else pid
            if "payload" in cols and payload_map is not None:
                cols["payload"] = np.asarray(payload_map(rank, cols["payload"]), np.int64)
            parts[attr].append(cols)
            row_rank[attr].append(np.full(len(tab), rank, np.int64))
        notes += [f"rank {rank}: {n}" for n in t.notes]

    def cat(attr: str, cls):
        return cls(**{f.name: np.concatenate([c[f.name] for c in parts[attr]]) if parts[attr] else getattr(cls(), f.name)
                      for f in fields(cls)})

    first = traces[0]
    thread_names: dict[int, str] = {}
    for t in traces:
        thread_names.update(t.thread_names)
    formats = sorted({t.format for t in traces})
    merged = Trace(source=" + ".join(str(t.source) for t in traces),
                   format=formats[0] if len(formats) == 1 else "+".join(formats),
                   strings=np.array(list(table), dtype=object), ranges=cat("ranges", Ranges), calls=cat("calls", Calls),
                   ops=cat("ops", GpuOps), thread_names=thread_names,
                   clock=first.clock if len({t.clock for t in traces}) == 1 else "per-rank",
                   session_start_utc_ns=first.session_start_utc_ns, notes=notes,
                   meta={"ranks": [int(r) for r in ranks], "rank_sources": [str(t.source) for t in traces]})
    return merged, {k: np.concatenate(v) if v else np.empty(0, np.int64) for k, v in row_rank.items()}
