"""Multi-rank analysis: per-rank stage statistics and stragglers. Ranks run the same program, so
the k-th instance of stage S on every rank is the same work: :func:`aligned_groups` pairs them
(a group is *full* when every rank has it). Over full, steady groups:

- **duration**: the rank whose instance took longest, and its excess over the other ranks'
  median: slowest in most groups by a clear margin is a *straggler*.
- **arrival**: how late each rank started the stage (across hosts on the wall clock, by each
  part's ``started_ns``/``started_unix_ns``).
- **synchronising stages**: ends much closer together than starts mean a collective inside: an
  early rank *waits* there (its duration over the group's shortest), and the one the others
  wait for has the shortest duration (no common clock needed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import numpy as np

from maxinstr.analyze.instances import StageInstances
from maxinstr.analyze.schema import (RankGpu, RankInfo, RanksSection, RankStage, RankStageRow, Straggler, StragglerSlow,
                                     StragglerWait)
from maxinstr.analyze.stats import occurrence_index, summarize
from maxinstr.warmup import parent_rows

SLOWEST_SHARE = 0.75
"""A straggler at a stage is the slowest (or the one waited for) in this share of its full groups,"""
EXCESS_REL = 0.10
"""... by a median margin of this fraction of the other ranks' median duration ..."""
EXCESS_MIN_NS = 200_000
"""... and this many ns (timer and scheduler noise stay below it)."""
MIN_GROUPS = 3
"""Stages with fewer full groups are listed per rank but not judged."""
SYNC_END_OVER_START = 0.5
"""A stage synchronises the ranks when its median end spread is below this fraction of its
median start spread (and the start spread clears EXCESS_MIN_NS)."""
STAGES_KEPT = 200


def _rank(part: dict) -> int:
    r = part.get("rank")
    return r if isinstance(r, int) and not isinstance(r, bool) and r >= 0 else -1


def part_ranks(parts: list[dict]) -> np.ndarray:
    """Rank of every part (-1 when the process had none)."""
    return np.array([_rank(p) for p in parts], np.int64)


def part_clock_offsets(parts: list[dict]) -> tuple[np.ndarray, str]:
    """Per part, ns to add to its host times to put every rank on one clock (0 on one host, else
    its ``started_unix_ns - started_ns``), and which clock."""
    hosts = {p.get("host") for p in parts if p.get("host")}
    off = np.zeros(len(parts), np.int64)
    if len(hosts) <= 1:
        return off, "CLOCK_MONOTONIC (one host)"
    for i, p in enumerate(parts):
        a, b = p.get("started_ns"), p.get("started_unix_ns")
        if isinstance(a, int) and isinstance(b, int):
            off[i] = b - a
    return off, "wall clock via each part's start (several hosts: as good as their time sync)"


def rank_table(parts: list[dict]) -> list[RankInfo]:
    """One row per rank: local rank, world size, host, pids and part names."""
    rows: dict[int, RankInfo] = {}
    for p in parts:
        r = _rank(p)
        if r < 0:
            continue
        row = rows.setdefault(r, {"rank": r, "local_rank": p.get("local_rank"), "world_size": p.get("world_size"),
                                  "host": p.get("host"), "pids": [], "parts": [], "records": 0})
        row["pids"].append(p.get("pid"))
        row["parts"].append(p.get("name"))
        row["records"] += int(p.get("rows") or 0)
        if p.get("status") == "running":
            row["unclosed"] = True
    return [rows[r] for r in sorted(rows)]


def aligned_groups(key_code: np.ndarray, rank: np.ndarray, start_ns: np.ndarray, n_ranks: int,
                   ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pair the k-th instance (by start) of each stage across ranks: ``(rows, group_key)``, a
    (G, R) matrix of instance indexes per *full* group (columns as ``ranks``) and its stage code."""
    n = len(key_code)
    if n == 0 or n_ranks < 2:
        return np.empty((0, n_ranks), np.int64), np.empty(0, np.int64)
    col = np.searchsorted(ranks, rank)
    col = np.where((col < len(ranks)) & (ranks[np.minimum(col, len(ranks) - 1)] == rank), col, -1)
    ok = col >= 0
    idx = np.flatnonzero(ok)
    occ = occurrence_index(key_code[idx] * (n_ranks + 1) + col[idx], start_ns[idx])
    gid = key_code[idx].astype(np.int64) * (int(occ.max()) + 1 if len(occ) else 1) + occ
    order = np.lexsort((col[idx], gid))
    g_sorted = gid[order]
    heads = np.r_[0, np.flatnonzero(np.diff(g_sorted)) + 1] if len(order) else np.empty(0, np.int64)
    counts = np.diff(np.r_[heads, len(order)])
    full_heads = heads[counts == n_ranks]
    rows = idx[order][full_heads[:, None] + np.arange(n_ranks)[None, :]]
    return rows.astype(np.int64), key_code[rows[:, 0]].astype(np.int64)


def group_metrics(start_ns: np.ndarray, end_ns: np.ndarray) -> dict[str, np.ndarray]:
    """Per group (rows) and rank (columns) of aligned instances: duration, excess over the other
    ranks' median, arrival lag, wait; per group the slowest and last column and the spreads."""
    dur = end_ns - start_ns
    G, R = dur.shape
    if R < 2:
        raise ValueError("group_metrics needs at least two ranks")
    # median of the other ranks, per cell: with R columns, drop the cell's own value
    srt = np.sort(dur, axis=1)
    others_med = np.empty((G, R), np.float64)
    for r in range(R):  # R is the world size: a handful of columns
        others_med[:, r] = np.median(np.delete(dur, r, axis=1), axis=1)
    return {
        "dur_ns": dur,
        "excess_ns": dur - others_med,
        "others_median_ns": others_med,
        "arrival_ns": start_ns - start_ns.min(axis=1, keepdims=True),
        "wait_ns": dur - srt[:, :1],
        "slowest": np.argmax(dur, axis=1),
        "last": np.argmax(start_ns, axis=1),
        "least_wait": np.argmin(dur, axis=1),
        "start_spread_ns": start_ns.max(axis=1) - start_ns.min(axis=1),
        "end_spread_ns": end_ns.max(axis=1) - end_ns.min(axis=1),
    }


def judge_stage(m: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per-rank verdicts for one stage's group metrics (columns = ranks)."""
    G, R = m["dur_ns"].shape
    slow_share, last_share, least_share = (np.bincount(m[k], minlength=R) / max(G, 1)
                                           for k in ("slowest", "last", "least_wait"))
    # per rank: the least any *other* rank waited, per step (all the others wait for it)
    others_min_wait = np.empty((G, R), np.float64)
    for r in range(R):
        others_min_wait[:, r] = np.delete(m["wait_ns"], r, axis=1).min(axis=1)
    others_wait_med = np.median(others_min_wait, axis=0) if G else np.zeros(R)
    excess_med = np.median(m["excess_ns"], axis=0)
    others_med = np.median(m["others_median_ns"], axis=0)
    start_spread = float(np.median(m["start_spread_ns"]))
    end_spread = float(np.median(m["end_spread_ns"]))
    sync = G >= MIN_GROUPS and start_spread >= EXCESS_MIN_NS and end_spread < SYNC_END_OVER_START * start_spread
    arrival_med = np.median(m["arrival_ns"], axis=0)
    judged = G >= MIN_GROUPS
    # in a synchronising stage a long duration is waiting for the others, not slowness
    slow = judged & (not sync) & (slow_share >= SLOWEST_SHARE) & (excess_med >= np.maximum(EXCESS_MIN_NS, EXCESS_REL * others_med))
    # in a synchronising stage the rank that waits least (shortest duration) is the one the
    # others wait for; durations need no common clock, unlike arrival times
    waited_for = judged & sync & (least_share >= SLOWEST_SHARE) & (others_wait_med >= EXCESS_MIN_NS)
    return {"slow_share": slow_share, "last_share": last_share, "least_wait_share": least_share,
            "others_wait_median_ns": others_wait_med, "excess_median_ns": excess_med,
            "others_median_ns": others_med, "start_spread_ns": start_spread, "end_spread_ns": end_spread,
            "sync": bool(sync), "arrival_median_ns": arrival_med, "slow": slow, "waited_for": waited_for}


def rank_section(inst: StageInstances, parts: list[dict], gpu_by_rank: list[RankGpu] | None = None) -> RanksSection | None:
    """``report["ranks"]`` (docs/report.md): None unless the run has two or more ranks."""
    p_rank = part_ranks(parts)
    ranks = np.unique(p_rank[p_rank >= 0])
    if len(ranks) < 2 or len(inst) == 0:
        return None
    R = len(ranks)
    part = np.asarray(inst.part, np.int64)
    in_run = (part >= 0) & (part < len(parts))
    rank = np.where(in_run, p_rank[np.clip(part, 0, max(len(parts) - 1, 0))], -1)
    offsets, clock = part_clock_offsets(parts)
    off = np.where(in_run, offsets[np.clip(part, 0, max(len(offsets) - 1, 0))], 0)
    start = inst.host_start_ns + off
    end = inst.host_end_ns + off
    host = inst.host_ns
    use = ~inst.is_mark & (rank >= 0)
    counted = use & inst.steady
    keys, key_code = inst.key_codes()
    gpu_basis: Literal["gpu_event_ns", "gpu_proj_ns"] | None = (
        "gpu_event_ns" if (inst.gpu_event_ns[counted] >= 0).any()
        else "gpu_proj_ns" if (inst.proj_ns[counted] >= 0).any() else None)
    gpu_col = inst.proj_ns if gpu_basis == "gpu_proj_ns" else inst.gpu_event_ns

    idx = np.flatnonzero(use)
    rows, gkey = aligned_groups(key_code[idx], rank[idx], start[idx], R, ranks)
    rows = idx[rows] if len(rows) else rows
    steady_group = inst.steady[rows].all(axis=1) if len(rows) else np.zeros(0, bool)
    rows, gkey = rows[steady_group], gkey[steady_group]

    # a parent stage key of every stage, to prefer the deepest flagged stage
    parent_key: dict[int, int] = {}
    has_p = inst.parent >= 0
    if has_p.any():
        pk = key_code[inst.parent[has_p]]
        ck = key_code[has_p]
        for c, p in zip(*np.unique(np.stack([ck, pk]), axis=1)):
            parent_key.setdefault(int(c), int(p))

    totals = np.bincount(key_code[counted], weights=host[counted], minlength=len(keys))
    stage_rows: list[RankStage] = []
    flagged: list[tuple[int, int, str, dict]] = []  # (rank col, key code, kind, numbers)
    for k in np.argsort(-totals, kind="stable")[:STAGES_KEPT]:
        sel_k = counted & (key_code == k)
        if not sel_k.any():
            continue
        per_rank: list[RankStageRow] = []
        for r in ranks:
            s = sel_k & (rank == r)
            row: RankStageRow = {"rank": int(r), "host_ns": summarize(host[s])}
            if gpu_basis is not None:
                row[gpu_basis] = summarize(gpu_col[s])
            per_rank.append(row)
        g = rows[gkey == k]
        entry: RankStage = {"stage": str(keys[k]), "parent": None, "groups": int(len(g)), "per_rank": per_rank,
                                 "gpu_basis": gpu_basis, "judged": bool(len(g) >= MIN_GROUPS)}
        if int(k) in parent_key:
            entry["parent"] = str(keys[parent_key[int(k)]])
        if len(g):
            m = group_metrics(start[g], end[g])
            v = judge_stage(m)
            entry.update({"sync": v["sync"], "start_spread_median_ns": v["start_spread_ns"],
                          "end_spread_median_ns": v["end_spread_ns"]})
            for c, row in enumerate(per_rank):
                row["slowest_share"] = float(v["slow_share"][c])
                row["last_arrival_share"] = float(v["last_share"][c])
                row["excess_median_ns"] = float(v["excess_median_ns"][c])
                row["arrival_median_ns"] = float(v["arrival_median_ns"][c])
                if v["sync"]:
                    row["least_wait_share"] = float(v["least_wait_share"][c])
                    row["wait_median_ns"] = float(np.median(m["wait_ns"][:, c]))
                    row["wait_total_ns"] = float(m["wait_ns"][:, c].sum())
                if v["slow"][c]:
                    flagged.append((c, int(k), "slowest", {"excess_total_ns": float(np.clip(m["excess_ns"][:, c], 0, None).sum())}))
                if v["waited_for"][c]:
                    others = np.delete(m["wait_ns"], c, axis=1)
                    flagged.append((c, int(k), "waited_for", {"excess_total_ns": float(others.sum())}))
        stage_rows.append(entry)

    return {"ranks": rank_table(parts), "world_size": int(R), "clock": clock, "stages": stage_rows,
            "stragglers": _stragglers(flagged, ranks, keys, parent_key, stage_rows), "gpu": gpu_by_rank or None,
            "thresholds": {"slowest_share": SLOWEST_SHARE, "excess_rel": EXCESS_REL, "excess_min_ns": EXCESS_MIN_NS,
                           "min_groups": MIN_GROUPS, "sync_end_over_start": SYNC_END_OVER_START}}


def _stragglers(flagged: list[tuple[int, int, str, dict[str, float]]], ranks: np.ndarray, keys: np.ndarray,
                parent_key: dict[int, int], stage_rows: list[RankStage]) -> list[Straggler]:
    """Per straggler rank: the (deepest) stages where it is slowest, and where the others wait for it."""
    by_name = {s["stage"]: s for s in stage_rows}
    out: list[Straggler] = []
    for c in sorted({f[0] for f in flagged}):
        mine = [f for f in flagged if f[0] == c]
        # deepest only: a parent 'step' that ends with the collective synchronises too
        covered: dict[str, set[int]] = {"slowest": set(), "waited_for": set()}
        for _, k, kind, _ in mine:
            seen, p = {k}, parent_key.get(k)
            while p is not None and p not in seen:
                covered[kind].add(p)
                seen.add(p)
                p = parent_key.get(p)
        r = int(ranks[c])
        slow: list[StragglerSlow] = []
        late: list[StragglerWait] = []
        for _, k, kind, nums in mine:
            st = by_name[str(keys[k])]
            mine_row = next(x for x in st["per_rank"] if x["rank"] == r)
            if k in covered[kind]:
                continue
            if kind == "slowest":
                others = [x for x in st["per_rank"] if x["rank"] != r]
                slow.append({"stage": st["stage"], "groups": st["groups"], "excess_total_ns": nums["excess_total_ns"],
                             "slowest_share": mine_row["slowest_share"], "excess_median_ns": mine_row["excess_median_ns"],
                             "median_ns": mine_row["host_ns"].get("median"),
                             "others_median_ns": float(np.median([x["host_ns"].get("median", 0.0) for x in others]))})
            elif kind == "waited_for":
                late.append({"stage": st["stage"], "groups": st["groups"], "excess_total_ns": nums["excess_total_ns"],
                             "least_wait_share": mine_row["least_wait_share"],
                             "last_arrival_share": mine_row["last_arrival_share"],
                             "arrival_median_ns": mine_row["arrival_median_ns"],
                             "wait_median_ns": {str(x["rank"]): x.get("wait_median_ns") for x in st["per_rank"]}})
        if not slow and not late:
            continue
        slow.sort(key=lambda s: -s["excess_total_ns"])
        late.sort(key=lambda s: -s["excess_total_ns"])
        out.append({"rank": r, "slowest_in": slow, "others_wait_in": late,
                    "others_wait_total_ns": float(sum(s["excess_total_ns"] for s in late)),
                    "excess_total_ns": float(sum(s["excess_total_ns"] for s in slow))})
    out.sort(key=lambda s: -(s["others_wait_total_ns"] + s["excess_total_ns"]))
    return out


def gpu_by_rank(op_rank: np.ndarray, family_code: np.ndarray, op_ns: np.ndarray, family_names: list[str]) -> list[RankGpu]:
    """Per rank: GPU op time, and the time and share of collective kernels (NCCL/RCCL...)."""
    out: list[RankGpu] = []
    coll = family_names.index("collective") if "collective" in family_names else -1
    for r in np.unique(op_rank[op_rank >= 0]):
        s = op_rank == r
        total = float(op_ns[s].sum())
        c = float(op_ns[s & (family_code == coll)].sum()) if coll >= 0 else 0.0
        fams = np.bincount(family_code[s].astype(np.int64), weights=op_ns[s].astype(np.float64), minlength=len(family_names))
        top = int(np.argmax(fams)) if total > 0 else -1
        out.append({"rank": int(r), "ops": int(s.sum()), "gpu_ns": total, "collective_ns": c,
                    "collective_share": c / total if total > 0 else None,
                    "top_family": family_names[top] if top >= 0 else None})
    return out


_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|r)[-_]?(\d+)(?=[^0-9]|$)", re.IGNORECASE)


def trace_rank_from_name(path: str) -> int | None:
    """The rank a trace file's name gives (``r0.sqlite``, ``rank1.nsys-rep``, ``trace_rank-2``)."""
    name = Path(path).name
    found = _RANK_IN_NAME.findall(name.split(".")[0]) or _RANK_IN_NAME.findall(name)
    return int(found[-1]) if found else None


def dense_record_ids(stages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(id, parent_id)`` re-numbered to row positions in ``stages`` (a run's merged table), a
    parent looked up in its record's part: record ids can repeat across hosts or containers."""
    n = len(stages)
    ids, parent = np.asarray(stages["id"], np.int64), np.asarray(stages["parent_id"], np.int64)
    new_parent = np.full(n, -1, np.int64)
    part = np.asarray(stages["part"], np.int64)
    for p in np.unique(part):
        rows = np.flatnonzero(part == p)
        found = parent_rows(ids[rows], parent[rows])
        new_parent[rows[found >= 0]] = rows[found[found >= 0]]
    return np.arange(n, dtype=np.int64), new_parent


def payload_rows(stages: np.ndarray, rank: int, payload: np.ndarray) -> np.ndarray:
    """For NVTX payloads (record ids) of rank ``rank``'s trace: the row in ``stages`` of that
    rank's record with that id (-1: none), so a trace joins only its rank's records."""
    payload = np.asarray(payload, np.int64)
    rows = np.flatnonzero(np.asarray(stages["rank"]) == rank)
    if not len(rows):
        return np.full(len(payload), -1, np.int64)
    found = parent_rows(np.asarray(stages["id"], np.int64)[rows], payload)
    return np.where(found >= 0, rows[np.maximum(found, 0)], -1)


def assign_trace_ranks(specs: list[str], run_ranks: list[int]) -> list[tuple[int, str]]:
    """``(rank, path)`` for each ``--trace`` value: ``RANK=PATH``, else the rank in the file name,
    else (no name gives one, as many traces as ranks) the ranks in order. Else ValueError."""
    out: list[tuple[int | None, str]] = []
    for spec in specs:
        head, sep, tail = spec.partition("=")
        if sep and head.strip().isdigit():
            out.append((int(head), tail))
        else:
            out.append((trace_rank_from_name(spec), spec))
    if all(r is None for r, _ in out) and len(out) == len(run_ranks):
        out = [(r, p) for r, (_, p) in zip(sorted(run_ranks), out)]
    missing = [p for r, p in out if r is None]
    if missing:
        raise ValueError(f"{missing[0]}: cannot tell which rank this trace is (name it r<N>..., or pass --trace N={missing[0]})")
    given = [(r, p) for r, p in out if r is not None]  # every one, after the check above
    ranks = [r for r, _ in given]
    dup = sorted({r for r in ranks if ranks.count(r) > 1})
    if dup:
        raise ValueError(f"two traces for rank {dup[0]}: give one trace per rank")
    if run_ranks:
        unknown = [r for r in ranks if r not in run_ranks]
        if unknown:
            raise ValueError(f"trace for rank {unknown[0]}, but the run has ranks {sorted(run_ranks)}")
    return [(int(r), p) for r, p in given]


def op_ranks_from_pids(op_pid: np.ndarray, parts: list[dict]) -> np.ndarray:
    """Rank of every GPU op of one trace, through its process id and the parts' pids (-1 unknown)."""
    pr = part_ranks(parts)
    pids = np.array([p.get("pid") if isinstance(p.get("pid"), int) else -1 for p in parts], np.int64)
    out = np.full(len(op_pid), -1, np.int64)
    if not len(pids):
        return out
    order = np.argsort(pids)
    pos = np.clip(np.searchsorted(pids[order], op_pid), 0, len(pids) - 1)
    hit = pids[order][pos] == op_pid
    out[hit] = pr[order][pos[hit]]
    return out
