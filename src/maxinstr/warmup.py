"""The warm-up rule, written once (docs/sessions.md, "Warm-up and steady state"): which stage instances a
run's ``warmup=N`` keeps out of steady state (:func:`warmup_flags`, for the report and
``Run.warmup_mask()``), and the instant the steady-state capture may start (:func:`steady_can_begin`,
which the native core's ``steady_watch`` fires at; the tests replay real runs through the core against
it): a steady instance always has at the top of its nesting one whose name had started N times before.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from maxinstr.columns import occurrence_index

MAX_LEVELS = 64  # nesting levels followed up a parent chain (a deeper or cyclic chain stops there)


def parent_rows(ids: np.ndarray, parent_ids: np.ndarray) -> np.ndarray:
    """Per record, the row of its parent record (-1: none, or a parent not among ``ids``)."""
    ids, parent_ids = np.asarray(ids, np.int64), np.asarray(parent_ids, np.int64)
    n = len(ids)
    if n == 0:
        return np.empty(0, np.int64)
    order = np.argsort(ids, kind="stable")
    pos = np.clip(np.searchsorted(ids, parent_ids, sorter=order), 0, n - 1)
    found = (parent_ids >= 0) & (ids[order[pos]] == parent_ids)
    return np.where(found, order[pos], -1).astype(np.int64)


def _up(parent: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Up the parent chains a level at a time (at most MAX_LEVELS): who has a parent there, and it."""
    cur = np.asarray(parent, np.int64).copy()
    live = np.flatnonzero(cur >= 0)
    for _ in range(MAX_LEVELS):
        if len(live) == 0:
            break
        yield live, cur[live]
        cur[live] = parent[cur[live]]
        live = live[cur[live] >= 0]


def levels(parent: np.ndarray) -> np.ndarray:  # per instance, its nesting level (0: none enclosing)
    level = np.zeros(len(parent), np.int64)
    for live, _ in _up(parent):
        level[live] += 1
    return level


def inside(parent: np.ndarray, flag: np.ndarray) -> np.ndarray:  # per instance: has an enclosing one ``flag``?
    out = np.zeros(len(parent), dtype=bool)
    for live, above in _up(parent):
        out[live] |= flag[above]
    return out


def top_ancestor(parent: np.ndarray) -> np.ndarray:  # per instance: its outermost enclosing one (or itself)
    root = np.arange(len(parent))
    for live, above in _up(parent):
        root[live] = above
    return root


def occurrences(part_code: np.ndarray, name_code: np.ndarray, is_mark: np.ndarray,
                host_start_ns: np.ndarray) -> np.ndarray:
    """Per instance, how many of its name started before it in its process, at any level (marks apart)."""
    if len(name_code) == 0:
        return np.empty(0, np.int64)
    n_names = int(np.max(name_code)) + 1
    key = (np.asarray(part_code, np.int64) * n_names + np.asarray(name_code, np.int64)) * 2 + np.asarray(is_mark, np.int64)
    return occurrence_index(key, host_start_ns)


def pipeline_iterations(part_code: np.ndarray, name_code: np.ndarray, level: np.ndarray, is_mark: np.ndarray,
                        host_start_ns: np.ndarray, occurrence: np.ndarray, parent: np.ndarray,
                        warmup_n: int) -> tuple[np.ndarray, dict[int, int]]:
    """Per instance the pipeline iteration it ran in (step 1 of the rule; nested: its top-level ancestor's),
    and per process (part code) with a head, the head's name code."""
    if len(name_code) == 0:
        return np.empty(0, np.int64), {}
    top = (level == 0) & ~is_mark
    it_top = np.asarray(occurrence, np.int64).copy()  # no head: per-name occurrences
    heads: dict[int, int] = {}
    for p in np.unique(part_code[top]).tolist():
        rows = np.flatnonzero(top & (part_code == p))
        rows = rows[np.argsort(host_start_ns[rows], kind="stable")]
        names = name_code[rows]
        counts = np.bincount(names)
        repeating = np.flatnonzero(counts > max(warmup_n, 1))
        if len(repeating) == 0:
            continue
        first_pos = np.full(len(counts), len(rows), np.int64)
        np.minimum.at(first_pos, names, np.arange(len(rows), dtype=np.int64))
        head = int(repeating[np.argmin(first_pos[repeating])])
        if counts[head] >= counts[repeating].max():
            continue  # the head repeats as often as any: per-name occurrences say the same
        head_starts = host_start_ns[rows[names == head]]
        it_top[rows] = np.searchsorted(head_starts, host_start_ns[rows], side="right") - 1
        heads[int(p)] = head
    return it_top[top_ancestor(parent)], heads


@dataclass
class WarmupFlags:  # the rule's columns, one value per instance
    occurrence: np.ndarray  # how many instances of its name started before it in its process
    level: np.ndarray  # nesting level (0: top level)
    iteration: np.ndarray  # the pipeline iteration (-1: before the first)
    heads: dict[int, int]  # per process (part code) with a pipeline head, the head's name code
    warmup: np.ndarray  # warm-up by steps 1 and 2 of the rule (the instance's own)
    nested: np.ndarray  # inside a warm-up instance (step 3), and not warm-up itself
    is_mark: np.ndarray  # instant marks (never warm-up: they have no time to keep out)

    @property
    def kept_out(self) -> np.ndarray:  # warm-up and the stages nested in it
        return (self.warmup | self.nested) & ~self.is_mark


def warmup_flags(part_code: np.ndarray, name_code: np.ndarray, parent: np.ndarray, host_start_ns: np.ndarray,
                 is_mark: np.ndarray, warmup_n: int, level: np.ndarray | None = None) -> WarmupFlags:
    """The rule over stage instances: ``part_code`` the process, ``parent`` the enclosing instance's row
    (-1 none), ``level`` the nesting level when already known."""
    part_code, name_code, parent, host_start_ns = (np.asarray(a, np.int64) for a in (part_code, name_code, parent, host_start_ns))
    is_mark = np.asarray(is_mark, bool)
    n = len(name_code)
    level = levels(parent) if level is None else np.asarray(level, np.int64)
    occurrence = occurrences(part_code, name_code, is_mark, host_start_ns)
    iteration, heads = pipeline_iterations(part_code, name_code, level, is_mark, host_start_ns, occurrence, parent,
                                           warmup_n)
    warm = (((occurrence < warmup_n) | ((level == 0) & (iteration < warmup_n))) & ~is_mark if warmup_n > 0 and n
            else np.zeros(n, bool))
    nested = inside(parent, warm) & ~warm if n else np.zeros(0, bool)
    return WarmupFlags(occurrence=occurrence, level=level, iteration=iteration, heads=heads, warmup=warm,
                       nested=nested, is_mark=is_mark)


def steady_can_begin(part_code: np.ndarray, name_code: np.ndarray, level: np.ndarray, is_mark: np.ndarray,
                     host_start_ns: np.ndarray, warmup_n: int) -> np.ndarray:
    """Per instance, whether steady state can begin at its start: per process, the first top-level one
    whose name had started ``warmup_n`` times before, at any level."""
    out = np.zeros(len(name_code), bool)
    if len(out) == 0:
        return out
    part_code, is_mark = np.asarray(part_code, np.int64), np.asarray(is_mark, bool)
    occurrence = occurrences(part_code, np.asarray(name_code, np.int64), is_mark, np.asarray(host_start_ns, np.int64))
    can = np.flatnonzero((np.asarray(level) == 0) & ~is_mark & (occurrence >= max(warmup_n, 0)))
    if len(can) == 0:
        return out
    can = can[np.lexsort((np.asarray(host_start_ns)[can], part_code[can]))]
    out[can[np.r_[True, part_code[can][1:] != part_code[can][:-1]]]] = True
    return out
