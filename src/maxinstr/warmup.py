"""The warm-up rule, written once (docs/sessions.md, "Warm-up and steady state"): which stage instances a
run's ``warmup=N`` keeps out of steady state (:func:`warmup_flags`, for the report and
``Run.warmup_mask()``), and the instant the steady-state capture may start (:func:`steady_can_begin`,
which the native core's ``steady_watch`` fires at; the tests replay real runs through the core against
it): a steady instance always has at the top of its nesting one whose name had started N times before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from maxinstr.columns import occurrence_index


def parent_rows(ids: np.ndarray, parent_ids: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Per record, the row of its parent record (-1: none, or a parent not among ``ids``); ``order``:
    ``ids``' stable argsort when the caller has it."""
    ids, parent_ids = np.asarray(ids, np.int64), np.asarray(parent_ids, np.int64)
    n = len(ids)
    if n == 0:
        return np.empty(0, np.int64)
    order = np.argsort(ids, kind="stable") if order is None else order
    pos = np.clip(np.searchsorted(ids, parent_ids, sorter=order), 0, n - 1)
    found = (parent_ids >= 0) & (ids[order[pos]] == parent_ids)
    return np.where(found, order[pos], -1).astype(np.int64)


ENDLESS = 2**31  # the level of an instance whose parent chain never ends (a cycle)


def _chains(parent: np.ndarray, flag: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per instance: (its nesting level, its outermost enclosing instance or itself, whether an enclosing
    one is ``flag``), by pointer doubling: log2 of the depth passes, exact at any depth (a pass a level
    stopped at 64 and gave the deeper ones wrong levels and keys). A chain that never ends (a parent cycle
    in a damaged file) gets the level :data:`ENDLESS`, itself as the outermost, and stops the passes."""
    parent = np.asarray(parent, np.int64)
    n = len(parent)
    has = parent >= 0
    up = np.where(has, parent, np.arange(n))  # the 2**k-th enclosing instance, or the outermost
    level = has.astype(np.int64)  # how many levels up ``up`` is
    above = has & (np.asarray(flag, bool)[up] if flag is not None else False)
    for _ in range(n.bit_length() + 1):
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        level, above, up = level + level[up], above | above[up], nxt
    endless = has[up] | (up[up] != up)  # the outermost found has a parent still: a cycle
    if endless.any():
        level[endless], up[endless] = ENDLESS, np.flatnonzero(endless)
    return level, up, above


def levels(parent: np.ndarray) -> np.ndarray:  # per instance, its nesting level (0: none enclosing)
    return _chains(parent)[0]


def inside(parent: np.ndarray, flag: np.ndarray) -> np.ndarray:  # per instance: has an enclosing one ``flag``?
    return _chains(parent, flag)[2]


def top_ancestor(parent: np.ndarray) -> np.ndarray:  # per instance: its outermost enclosing one (or itself)
    return _chains(parent)[1]


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
