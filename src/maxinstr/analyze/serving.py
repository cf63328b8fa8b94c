"""The serving loop of a model server, from the stages of MAX's preset (launch/presets.py): how
the steps batched, and how long each request waited for its first step: from ``max serve``'s
``queued`` mark (attr ``request``) to the model worker's ``prefill`` that lists it (attr
``requests``), one host clock. Over a window, only the steps and requests in it count.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxinstr.analyze.stats import summarize
from maxinstr.integrations.max_pipeline import QUEUED_MARK
from maxinstr.rundir import format as fmt
from maxinstr.rundir.reader import Run

STEP_STAGES = ("prefill", "decode", "drain")


def _attr_column(run: Run, ids: np.ndarray, key: str, default: Any) -> list[Any]:
    attrs = run.attrs
    return [attrs.get(int(i), {}).get(key, default) for i in ids]


def serving_summary(run: Run, start_ns: int | None = None, end_ns: int | None = None) -> dict[str, Any]:
    """Steps and queueing of the serving loop recorded in ``run``, over [start_ns, end_ns] of the
    host clock (the whole run when None). Durations in ns; every statistic says its ``n``."""
    s = run.stages
    names = run.stage_names()
    start = s["host_start_ns"] if len(s) else np.empty(0, np.int64)
    inside = np.ones(len(s), dtype=bool)
    if start_ns is not None:
        inside &= start >= start_ns
    if end_ns is not None:
        inside &= start <= end_ns
    is_mark = (s["flags"] & fmt.MARK) != 0 if len(s) else np.empty(0, bool)
    steps: dict[str, Any] = {}
    for name in STEP_STAGES:
        rows = np.flatnonzero(inside & ~is_mark & (names == name))
        if rows.size == 0:
            continue
        ids = s["id"][rows]
        steps[name] = {
            "n": int(rows.size),
            "host_ns": summarize(s["host_end_ns"][rows] - start[rows]),
            "batch": summarize(np.asarray(_attr_column(run, ids, "batch", -1), dtype=np.int64)),
            "tokens": summarize(np.asarray(_attr_column(run, ids, "tokens", -1), dtype=np.int64)),
        }
    tokenize = np.flatnonzero(inside & ~is_mark & (names == "tokenize"))
    return {
        "window_ns": None if start_ns is None and end_ns is None else [start_ns, end_ns],
        "steps": steps,
        "tokenize_ns": summarize(s["host_end_ns"][tokenize] - start[tokenize]),
        "queue": queue_waits(run, names, is_mark, inside),
    }


def queue_waits(run: Run, names: np.ndarray, is_mark: np.ndarray, inside: np.ndarray) -> dict[str, Any]:
    """Each request queued in the window: the wait from its ``queued`` mark to the first
    ``prefill`` listing it, even after the window (else counted in ``not_started``)."""
    s = run.stages
    marks = np.flatnonzero(inside & is_mark & (names == QUEUED_MARK))
    if marks.size == 0:
        return {"requests": 0, "started": 0, "not_started": 0, "wait_ns": {"n": 0}}
    mark_req = np.asarray([str(r) for r in _attr_column(run, s["id"][marks], "request", "")], dtype=object)
    mark_ns = s["host_start_ns"][marks]
    prefills = np.flatnonzero(~is_mark & (names == "prefill"))
    lists = _attr_column(run, s["id"][prefills], "requests", "")
    counts = np.fromiter((len(str(x).split(",")) if x else 0 for x in lists), dtype=np.int64, count=len(lists))
    step_req = np.asarray([r for x in lists if x for r in str(x).split(",")], dtype=object)
    step_ns = np.repeat(s["host_start_ns"][prefills], counts)
    wait = np.full(marks.size, -1, dtype=np.int64)
    if step_req.size:
        order = np.lexsort((step_ns, step_req))
        req_sorted, ns_sorted = step_req[order], step_ns[order]
        first = np.r_[True, req_sorted[1:] != req_sorted[:-1]]
        uniq, first_ns = req_sorted[first], ns_sorted[first]
        pos = np.clip(np.searchsorted(uniq, mark_req), 0, len(uniq) - 1)
        hit = uniq[pos] == mark_req
        wait[hit] = first_ns[pos[hit]] - mark_ns[hit]
    started = wait >= 0
    return {"requests": int(marks.size), "started": int(started.sum()), "not_started": int((~started).sum()),
            "wait_ns": summarize(wait[started])}
