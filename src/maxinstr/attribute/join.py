"""Join trace ranges to a run directory's stage records (docs/formats.md, "How records join"): ``PAYLOAD``
where a range of NVTX domain ``maxinstr`` carries a record id as payload; else ``THREAD_NAME_ORDER``
(roctx has no payload): the k-th range named N on thread T is the k-th such record by start, marks
with marks. Only domain ``maxinstr``'s ranges take part when the trace has it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from maxinstr.attribute.model import Attribution, JoinMethod
from maxinstr.columns import factorize, occurrence_index
from maxinstr.rundir import load
from maxinstr.rundir.format import MARK
from maxinstr.traces.inprocess import stage_ranges
from maxinstr.traces.model import RangeStyle, StringTable, Trace

MAXINSTR_DOMAIN = "maxinstr"


def in_maxinstr_domain(trace: Trace) -> np.ndarray:  # per range, whether it is in NVTX domain ``maxinstr``
    strings = np.asarray(trace.strings, dtype=object)
    dom = np.flatnonzero(strings == MAXINSTR_DOMAIN) if len(strings) else np.empty(0, np.int64)
    return np.isin(trace.ranges.domain_id, dom) if len(dom) else np.zeros(len(trace.ranges), bool)


def join_records(att: Attribution, run: Any) -> None:
    """Fill ``att.range_record_id`` and ``att.join_method`` from the run's stage records."""
    trace = att.trace
    R = trace.ranges
    run = load(run) if isinstance(run, (str, Path)) else run
    stages = run.stages
    rec_names = run.stage_names() if hasattr(run, "stage_names") else np.asarray(run.names)[stages["name_id"]]
    rec_names = np.asarray(rec_names, dtype=object)
    att.range_record_id = np.full(len(R), -1, np.int64)
    att.join_method = JoinMethod.NONE
    in_domain = in_maxinstr_domain(trace)  # the ranges that may be stages
    cand = np.flatnonzero(in_domain) if in_domain.any() else np.arange(len(R))
    if not len(stages) or not len(cand):
        att.notes.append("no stage records or no candidate ranges: ranges not joined to the run")
        return
    ids = stages["id"].astype(np.int64)
    sorted_ids, payload = np.sort(ids), R.payload[cand]
    pos = np.minimum(np.searchsorted(sorted_ids, payload), len(sorted_ids) - 1)
    hit = (payload >= 0) & (sorted_ids[pos] == payload)
    if hit.any():
        att.range_record_id[cand[hit]] = payload[hit]
        att.join_method = JoinMethod.PAYLOAD
        _note(att, int(hit.sum()), len(cand), len(stages), "NVTX payload == record id")
        return

    # (thread, name, mark?) groups on both sides, then the k-th of each group pairs up.
    r_names = np.array([trace.name(int(i)) for i in R.name_id[cand]], dtype=object)
    r_mark = (R.style[cand] == RangeStyle.MARK).astype(np.int64)
    s_mark = ((stages["flags"] & MARK) != 0).astype(np.int64)
    name_code = factorize(np.concatenate([r_names, rec_names]))[1]
    name_code = name_code.reshape(-1).astype(np.int64)
    tid = np.concatenate([R.tid[cand], stages["tid"].astype(np.int64)])
    mark = np.concatenate([r_mark, s_mark])
    start = np.concatenate([R.start_ns[cand], stages["host_start_ns"].astype(np.int64)])
    _, group = np.unique(np.stack([tid, name_code, mark], axis=1), axis=0, return_inverse=True)
    group = group.reshape(-1).astype(np.int64)
    side = np.r_[np.zeros(len(cand), np.int64), np.ones(len(stages), np.int64)]
    rank = occurrence_index(group * 2 + side, start)  # the k-th of its group on its side, by start
    key = group * (int(rank.max()) + 1) + rank
    rec_key, rng_key = key[len(cand):], key[: len(cand)]
    srt = np.argsort(rec_key)
    p = np.minimum(np.searchsorted(rec_key[srt], rng_key), len(srt) - 1)
    ok = rec_key[srt][p] == rng_key
    att.range_record_id[cand[ok]] = ids[srt[p[ok]]]
    if ok.any():
        att.join_method = JoinMethod.THREAD_NAME_ORDER
    _note(att, int(ok.sum()), len(cand), len(stages), "(thread, name, order)")


def _note(att: Attribution, joined: int, ranges: int, records: int, how: str) -> None:
    att.notes.append(
        f"{joined} of {ranges} candidate ranges joined to the run's {records} stage records by {how}"
        + (f"; {records - joined} records have no range in the trace" if records > joined else "")
    )


def place_run_stages(trace: Trace, run: Any) -> tuple[Trace, str] | None:
    """(the trace with the run's stage records added as ranges of domain ``maxinstr`` on its clock, note),
    where it has none of its own and a wall clock (torch.profiler: docs/attribution.md); else None."""
    if trace.format != "kineto" or run is None:
        return None
    if isinstance(run, (str, Path)):
        run = load(run)
    strings = np.asarray(trace.strings, dtype=object)
    if len(strings) and (strings == MAXINSTR_DOMAIN).any():
        return None
    clock = (getattr(run, "meta", None) or {}).get("clock") or {}
    mono, real = clock.get("monotonic_ns"), clock.get("realtime_ns")
    if not isinstance(mono, int) or not isinstance(real, int) or not len(run.stages):
        return None
    base = trace.meta.get("base_time_ns") if isinstance(trace.meta, dict) else None
    if not isinstance(base, int):
        if trace.session_start_utc_ns is None:
            return None  # timestamps of an unknown origin
        base = 0  # absolute Unix time
    table = StringTable()
    for s in strings:
        table.intern(str(s))
    added = stage_ranges(run, table, table.intern(MAXINSTR_DOMAIN))
    added.start_ns = added.start_ns + (real - mono - base)
    added.end_ns = added.end_ns + (real - mono - base)
    R = trace.ranges
    ranges = type(R)(**{name: np.concatenate([getattr(R, name), getattr(added, name)]) for name in R.__dataclass_fields__})
    placed = Trace(source=trace.source, format=trace.format, strings=table.to_array(), ranges=ranges,
                   calls=trace.calls, ops=trace.ops, thread_names=trace.thread_names, clock=trace.clock,
                   session_start_utc_ns=trace.session_start_utc_ns, notes=list(trace.notes), meta=dict(trace.meta))  # fmt: skip
    placed.validate()
    note = (f"joined by clock: torch.profiler records no NVTX, so the run's {len(added)} stage records were placed on "
            "the trace's wall clock through the run's (monotonic, realtime) clock pair, and each launch call tied to "
            "the stage open on its thread at its time")
    return placed, note
