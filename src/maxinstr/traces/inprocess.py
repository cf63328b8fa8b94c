"""Kernels collected in-process (``session(..., kernels=True)``) -> :class:`Trace` (docs/kernels.md).

The run's ``parts/*/activity.bin`` become ``ops`` (times moved from CUPTI's clock onto the stage
records' CLOCK_MONOTONIC through the clock pairs in activity.json) and ``calls`` (the API rows that
launched an op, on the stage record's thread when tagged with a stage); ``ranges`` are the run's
stage records (domain ``maxinstr``, payload = record id). ``meta["op_stage_id"]``: per op, the
stage innermost on the launching thread at the launch (CUPTI external correlation; -1 when none),
which attribution takes as the owner instead of comparing times.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from maxinstr.errors import RunDirError, TraceError
from maxinstr.rundir.activity import (ACTIVITY_FILE, KIND_DRIVER, KIND_EXTERNAL, KIND_MEMSET, KIND_RUNTIME,
                                      read_part_activity, to_host_clock)
from maxinstr.rundir import format as fmt
from maxinstr.rundir import load
from maxinstr.traces._util import TraceBuilder, call_rows, name_flags
from maxinstr.traces.nsys import MEMCPY_KINDS  # copies named as nsys names them: kernels tables read alike
from maxinstr.traces.model import NO_ID, CallKind, Calls, GpuOps, OpKind, Ranges, RangeStyle, StringTable, TimeCheck, Trace

FORMAT = "maxinstr-inprocess"
OP_STAGE_KEY = "op_stage_id"


def demangle(names: list[str]) -> list[str]:
    """C++ kernel names as nsys prints them (demangled), through ``c++filt`` when it is on PATH
    (one call for all names); unchanged otherwise."""
    mangled = [i for i, n in enumerate(names) if n.startswith("_Z")]
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return names
    try:
        p = subprocess.run([tool], input="\n".join(names[i] for i in mangled) + "\n", capture_output=True, text=True,
                           timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return names
    lines = p.stdout.split("\n")
    if p.returncode != 0 or len(lines) < len(mangled):
        return names
    out = list(names)
    for i, text in zip(mangled, lines):
        out[i] = text or names[i]
    return out


def has_activity(run_dir: str | Path) -> bool:
    """Whether a run directory holds in-process activity (any part's activity.json). Anything
    named so counts, a FIFO or a link to nothing too: reading it says what is wrong with it."""
    parts = Path(run_dir) / "parts"
    return parts.is_dir() and any(os.path.lexists(p / "activity.json") for p in parts.iterdir() if p.is_dir())


def read_run(run: Any) -> tuple[Trace | None, list[str]]:
    """The in-process trace of a run (a :class:`maxinstr.Run` or a run directory path), or
    None when no part collected activity; plus notes for the report (why there are no kernels,
    dropped records...)."""
    if isinstance(run, (str, Path)):
        run = load(run)
    root = getattr(run, "path", None)
    notes: list[str] = []
    if root is None:
        return None, notes
    parts = getattr(run, "parts", []) or []
    b = TraceBuilder(root, FORMAT, "CLOCK_MONOTONIC")
    domain = b.strings.intern("maxinstr")
    op_stage: list[np.ndarray] = []
    any_activity = False
    how: set[str] = set()  # how each part tied ops to stages (activity.json stage_correlation)
    pairs_all: list[Any] = []
    stages = run.stages
    stage_ids = stages["id"].astype(np.int64)
    order = np.argsort(stage_ids)
    sorted_ids = stage_ids[order]
    for part in parts:
        pdir = Path(root) / "parts" / str(part.get("name", ""))
        label = f"part {part.get('name')}"
        try:
            got = read_part_activity(pdir)
            if got is None:
                continue
            meta, rows, names = got
            rows = _valid_times(rows, pdir / ACTIVITY_FILE, label, notes)
        except (RunDirError, TraceError) as exc:  # damaged, or every row of a kind: this part's kernels left out
            any_activity = True
            notes.append(f"{label}: in-process kernels not read: {exc}")
            continue
        any_activity = True
        notes += meta["notes"]
        if meta.get("stage_correlation"):
            how.add(meta["stage_correlation"])
        if meta.get("status") == "unavailable":
            notes.append(f"kernels=True collected nothing in {label}: {meta.get('reason')}")
            continue
        if meta.get("status") == "collecting":
            notes.append(f"{label}: the kernel collector did not close (process killed?): records after the last flush are lost")
        for key, what in (("dropped_cupti", "dropped by CUPTI (no buffer in time)"),
                          ("dropped_queue", "dropped by maxinstr (queue full or unreadable buffer)")):  # fmt: skip
            if meta.get(key):
                notes.append(f"{label}: {int(meta[key])} activity records {what}: kernel counts are low by that much")
        pid = int(part.get("pid") or meta.get("pid") or -1)
        names = demangle(names)
        # a row's name_id indexes this (the reader checked -1 <= name_id < len(names)); -1, no
        # name, is the NO_ID at the end
        name_ids = np.array([b.strings.intern(n) for n in names] + [NO_ID], np.int32)
        kind = rows["kind"]
        pairs = meta.get("clock_pairs") or []
        pairs_all.append(pairs)
        if not pairs:
            notes.append(f"{label}: no clock pairs: GPU op times stay on CUPTI's clock (spans, not alignment, are right)")

        ext = rows[kind == KIND_EXTERNAL]
        want_kind = meta.get("external_kind")
        if want_kind is not None:
            ext = ext[ext["cbid"] == int(want_kind)]
        ext_corr = ext["correlation_id"].astype(np.int64)
        ext_id = np.r_[ext["external_id"].astype(np.int64), -1]  # (-1: no record of the call)

        def stage_of(corr: np.ndarray, ext_corr: np.ndarray = ext_corr, ext_id: np.ndarray = ext_id) -> np.ndarray:
            return ext_id[call_rows(corr, ext_corr)]

        is_op = kind <= KIND_MEMSET
        op = rows[is_op]
        complete = (op["start_ns"] > 0) & (op["end_ns"] >= op["start_ns"])
        if (~complete).any():
            notes.append(f"{label}: {int((~complete).sum())} GPU ops without timestamps (unfinished at close) left out")
            op = op[complete]
        start, end = _host_times(op, pairs)
        okind = op["kind"].astype(np.int8)
        oname = np.full(len(op), NO_ID, np.int32)
        kern = okind == OpKind.KERNEL
        oname[kern] = name_ids[op["name_id"][kern]]
        copy = okind == OpKind.MEMCPY
        for ck in np.unique(op["copy_kind"][copy]):
            oname[copy & (op["copy_kind"] == ck)] = b.strings.intern(f"[CUDA memcpy {MEMCPY_KINDS.get(int(ck), 'Unknown')}]")
        oname[okind == OpKind.MEMSET] = b.strings.intern("[CUDA memset]")
        gnode = op["graph_node_id"].astype(np.int64)
        b.add(GpuOps, start_ns=start, end_ns=end, kind=okind, name_id=oname, device_id=op["device_id"],
              stream_id=op["stream_id"], pid=pid, correlation_id=op["correlation_id"],
              graph_node_id=np.where(gnode > 0, gnode, NO_ID), bytes=op["bytes"])
        op_stage.append(stage_of(op["correlation_id"].astype(np.int64)))

        api = rows[(kind == KIND_RUNTIME) | (kind == KIND_DRIVER)]
        launched = np.isin(api["correlation_id"], op["correlation_id"])
        api = api[launched]
        a_stage = stage_of(api["correlation_id"].astype(np.int64))
        a_tid = api["tid"].astype(np.int64)
        if len(api) and len(sorted_ids):
            pos = np.minimum(np.searchsorted(sorted_ids, a_stage), len(sorted_ids) - 1)
            hit = (a_stage >= 0) & (sorted_ids[pos] == a_stage)
            a_tid = np.where(hit, stages["tid"][order[pos]].astype(np.int64), a_tid)
        a_start, a_end = _host_times(api, pairs)
        a_name = name_ids[api["name_id"]]
        ckind = np.where(api["kind"] == KIND_DRIVER, CallKind.DRIVER, CallKind.RUNTIME).astype(np.int8)
        ckind[name_flags(b.strings, a_name, lambda name: "GraphLaunch" in name)] = CallKind.GRAPH
        b.add(Calls, start_ns=a_start, end_ns=a_end, tid=a_tid, pid=pid, correlation_id=api["correlation_id"],
              name_id=a_name, kind=ckind)
        if not len(ext_corr) and len(op):
            notes.append(f"{label}: no external correlation records: GPU ops cannot be tied to stages")
        unlaunched = int((~np.isin(op["correlation_id"], api["correlation_id"])).sum()) if len(op) else 0
        if unlaunched:
            notes.append(f"{label}: {unlaunched} GPU ops have no launch-call record (their API function was not traced): "
                         "they are counted outside any stage")

    if not any_activity:
        kmeta = (getattr(run, "meta", None) or {}).get("kernels")
        if isinstance(kmeta, dict) and kmeta.get("requested"):
            notes.append(f"kernels=True was requested but no activity was written: {kmeta.get('reason') or kmeta.get('status')}")
        return None, notes
    if not b.parts[GpuOps]:
        return None, notes
    ranges = stage_ranges(run, b.strings, domain)
    ops = b.table(GpuOps, sort=False)
    order = np.argsort(ops.start_ns, kind="stable")  # the ops by start, and their owners with them
    owner = np.concatenate(op_stage).astype(np.int64)[order]
    b.notes, b.clock = list(notes), "CLOCK_MONOTONIC" if all(pairs_all) else "cupti"
    meta = {OP_STAGE_KEY: owner, "collector": "cupti",
            "stage_correlation": ", ".join(sorted(how)) or "CUPTI external correlation"}
    return b.trace(calls=b.table(Calls, sort=False), ops=ops.take(order), ranges=ranges, meta=meta), notes


def _host_times(rows: np.ndarray, pairs: list) -> tuple[np.ndarray, np.ndarray]:
    """Start and end on the host clock (the span kept as CUPTI measured it)."""
    start, _ = to_host_clock(rows["start_ns"], pairs)
    return start, start + (rows["end_ns"].astype(np.int64) - rows["start_ns"].astype(np.int64))


def _valid_times(rows: np.ndarray, path: Path, label: str, notes: list[str]) -> np.ndarray:
    """``rows`` without the timed GPU ops and the API calls whose times cannot be real (ending
    before they start), dropped and counted by model.TimeCheck. An op CUPTI never timed (start
    or end 0 or -1, unfinished at close) is not damage: it is left out later, with its own note."""
    kind, start, end = rows["kind"], rows["start_ns"], rows["end_ns"]
    check = TimeCheck(path, notes)
    drop = np.zeros(len(rows), bool)
    timed_op = (kind <= KIND_MEMSET) & (start > 0) & (end > 0)
    for what, sel in (("GPU ops", timed_op), ("API calls", (kind == KIND_RUNTIME) | (kind == KIND_DRIVER))):
        idx = np.flatnonzero(sel)

        def row(i: int, idx: np.ndarray = idx) -> str:
            return f"row {idx[i]}"  # (from 0, as the activity.bin reader counts)

        keep = check.keep(f"{label}: {ACTIVITY_FILE} {what}", start[idx].astype(np.int64), end[idx].astype(np.int64),
                          row=row)
        if keep is not None:
            drop[idx[~keep]] = True
    return rows[~drop] if drop.any() else rows


def stage_ranges(run: Any, strings: StringTable, domain: int) -> Ranges:
    """The run's stage records as trace ranges on the host clock (payload = record id)."""
    st = run.stages
    names = run.stage_names() if len(st) else np.empty(0, object)
    mark = (st["flags"] & fmt.MARK) != 0
    return Ranges(start_ns=st["host_start_ns"].astype(np.int64), end_ns=st["host_end_ns"].astype(np.int64),
                  name_id=strings.ids_for(names) if len(st) else np.empty(0, np.int32),
                  domain_id=np.full(len(st), domain, np.int32), tid=st["tid"].astype(np.int64),
                  end_tid=st["tid"].astype(np.int64), pid=st["pid"].astype(np.int64),
                  style=np.where(mark, RangeStyle.MARK, RangeStyle.PUSH_POP).astype(np.int8),
                  payload=st["id"].astype(np.int64))


__all__ = ["FORMAT", "OP_STAGE_KEY", "has_activity", "read_run", "stage_ranges", "to_host_clock"]
