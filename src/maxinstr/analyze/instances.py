"""The stage-instance table: one row per stage instance, as numpy columns (missing int64 values
are ``-1``), from a run's stage records, a trace's host ranges with their attribution, or both
joined by record id. Analysis reads only this table and the per-op columns."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from maxinstr import warmup as warmup_rule
from maxinstr.analyze.schema import StatisticKey
from maxinstr.analyze.stats import COLD_START_MAX_PREFIX, cold_start_mask
from maxinstr.columns import isin_strings, occurrence_index, per_string
from maxinstr.rundir import format as fmt
from maxinstr.traces.model import RangeStyle

MAXINSTR_DOMAIN = "maxinstr"
UNPREFIXED_DOMAINS = frozenset({"", MAXINSTR_DOMAIN, "user_annotation"})
"""Domains whose range names are shown bare: maxinstr's, NVTX's default, PyTorch's record_function."""
FRAMEWORK_OP_DOMAINS = frozenset({"cpu_op", "python_function", "cuda_runtime", "cuda_driver", "cuBLAS", "cuDNN",
                                  "gpu_user_annotation", "kernel", "ac2g"})
"""Domains of ranges a framework or library emits by itself (one per aten op or API call), and
C++-qualified names (``aten::mm``: RPD/roctx op markers carry no domain): not stages (their ops
still count to the enclosing stage), unless nothing else exists."""


MAX_LEVELS = 64
"""Nesting levels the report shows as stages of their own: an instance nested deeper (or in a parent
cycle of a damaged file) is left out of the table, its time counted in its enclosing instance at the
last level shown (``Run.stages`` keeps every record). A key is the path of names above it: a deeper
one would be a line of hundreds of characters."""


def _i64(n: int, fill: int = -1) -> np.ndarray:
    return np.full(n, fill, dtype=np.int64)


@dataclass
class StageInstances:
    """Columns of stage instances (all the same length). ``range_index``: the row in
    ``trace.ranges`` the instance came from or joined. ``step``: the ``step=`` the user marked
    (``step_marked``), else the position among same-named siblings under its parent (the k-th
    decode of a request is step k). ``inside_startup``: nested in a warm-up or cold-start
    instance (a warm-up request's decode steps ran its compilations too); ``steady``: none of
    ``warmup``, ``cold``, ``inside_startup``, and not a mark."""

    name: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    host_start_ns: np.ndarray = field(default_factory=lambda: _i64(0))
    host_end_ns: np.ndarray = field(default_factory=lambda: _i64(0))
    gpu_event_ns: np.ndarray = field(default_factory=lambda: _i64(0))
    proj_start_ns: np.ndarray = field(default_factory=lambda: _i64(0))
    proj_end_ns: np.ndarray = field(default_factory=lambda: _i64(0))
    busy_ns: np.ndarray = field(default_factory=lambda: _i64(0))
    kernel_ns: np.ndarray = field(default_factory=lambda: _i64(0))
    kernel_count: np.ndarray = field(default_factory=lambda: _i64(0))
    op_count: np.ndarray = field(default_factory=lambda: _i64(0))
    idle_gap_ns: np.ndarray = field(default_factory=lambda: _i64(0))
    memcpy_ns: np.ndarray = field(default_factory=lambda: _i64(0))
    step: np.ndarray = field(default_factory=lambda: _i64(0))
    step_marked: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    parent: np.ndarray = field(default_factory=lambda: _i64(0))
    depth: np.ndarray = field(default_factory=lambda: _i64(0))
    part: np.ndarray = field(default_factory=lambda: _i64(0))
    tid: np.ndarray = field(default_factory=lambda: _i64(0))
    record_id: np.ndarray = field(default_factory=lambda: _i64(0))
    range_index: np.ndarray = field(default_factory=lambda: _i64(0))
    is_mark: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    exception: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    unclosed: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    """Still open when its process ended: its end is the close time."""
    warmup: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    cold: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    cold_z: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.float64))
    inside_startup: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    occurrence: np.ndarray = field(default_factory=lambda: _i64(0))
    iteration: np.ndarray = field(default_factory=lambda: _i64(0))
    """The pipeline iteration an instance ran in (-1: before the first; maxinstr.warmup)."""
    iteration_head: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    """Whether the instance begins its pipeline iteration (a top-level instance of the head stage)."""
    pipeline_head: str | None = None
    """The top-level stage that begins each pipeline iteration (None: each name counts its own)."""
    key: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    """The stage a statistic groups by: the name, or ``parent/.../name`` when the same name occurs
    under different parents (``prefill/attention``, ``decode/attention``)."""
    level: np.ndarray = field(default_factory=lambda: _i64(0))
    key_code: np.ndarray = field(default_factory=lambda: _i64(0))
    keys: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    """The distinct keys, sorted: ``keys[key_code] == key``."""
    notes: list = field(default_factory=list)
    """What building the table had to work around."""

    def __len__(self) -> int:
        return len(self.name)

    @property
    def host_ns(self) -> np.ndarray:
        return self.host_end_ns - self.host_start_ns

    @property
    def proj_ns(self) -> np.ndarray:
        """Projected GPU span (first op start to last op end), -1 when the instance owns no op."""
        return np.where(self.proj_start_ns >= 0, self.proj_end_ns - self.proj_start_ns, -1)

    @property
    def busy_frac(self) -> np.ndarray:
        """GPU busy time / projected GPU span (NaN without a span): 1.0 = no launch gaps."""
        span = self.proj_ns
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where((span > 0) & (self.busy_ns >= 0), self.busy_ns / np.maximum(span, 1), np.nan)

    def statistic_values(self, rows: np.ndarray | slice = slice(None)) -> dict[StatisticKey, np.ndarray]:
        """Per instance of ``rows``, the value of each statistic a stage row carries (< 0 or NaN: none)."""
        has_span = self.proj_start_ns[rows] >= 0
        return {"host_ns": self.host_ns[rows], "gpu_event_ns": self.gpu_event_ns[rows], "gpu_proj_ns": self.proj_ns[rows],
                "gpu_busy_ns": np.where(has_span, self.busy_ns[rows], -1), "gpu_busy_frac": self.busy_frac[rows],
                "idle_gap_ns": np.where(has_span, self.idle_gap_ns[rows], -1),
                "kernels_per_instance": np.where(self.range_index[rows] >= 0, self.kernel_count[rows], -1)}

    @property
    def steady(self) -> np.ndarray:
        startup = self.warmup | self.cold | self.is_mark
        if len(self.inside_startup) == len(startup):
            startup = startup | self.inside_startup
        if len(self.unclosed) == len(startup):
            startup = startup | self.unclosed
        return ~startup

    def key_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct keys sorted, each instance's index in them): ``np.unique(key)``."""
        if len(self.key_code) == len(self.key) and (len(self.key) == 0 or len(self.keys)):
            return self.keys, self.key_code
        keys, code = np.unique(self.key, return_inverse=True)
        return keys, code.reshape(-1)

    def steady_by_key(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """(distinct keys sorted, per key the indexes of its steady instances): one sort, not a
        mask over every instance per key (quadratic in the number of stages)."""
        keys, code = self.key_codes()
        idx = np.flatnonzero(self.steady)
        idx = idx[np.argsort(code[idx], kind="stable")]
        bounds = np.searchsorted(code[idx], np.arange(len(keys) + 1)).tolist()
        return keys, [idx[bounds[k]:bounds[k + 1]] for k in range(len(keys))]


def name_codes(names: np.ndarray) -> np.ndarray:
    """Dense int codes of the names, kept Python strings (a fixed-width copy is as wide as the
    longest name for every row)."""
    if len(names) == 0:
        return np.empty(0, np.int64)
    return np.unique(np.asarray(names, dtype=object), return_inverse=True)[1].reshape(-1).astype(np.int64)


def stage_keys(names: np.ndarray, parent: np.ndarray,
               name_code: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(key, level, key code, sorted distinct keys) per instance (:attr:`StageInstances.key`).
    Per nesting level on integer codes (``name_code``: equal exactly when the names are): a path
    is its parent's path code and its own name code, so a name holding '/' cannot be mistaken
    for two levels when the shortest telling suffix is chosen."""
    n = len(names)
    names = np.asarray(names, dtype=object)
    level = warmup_rule.levels(parent)
    if n == 0:
        return np.empty(0, dtype=object), level, _i64(0), np.empty(0, dtype=object)
    name_code = np.asarray(name_code, np.int64)
    n_names = int(name_code.max()) + 1
    # a path code per instance: its name's code at level 0, then a new one per distinct
    # (parent's path code, name)
    pcode = name_code.copy()
    made_of: dict[int, tuple[int, int]] = {}  # path code -> (parent's path code, an instance it ends in)
    next_code = n_names
    for lv in range(1, int(level.max()) + 1):
        sel = np.flatnonzero(level == lv)
        up = pcode[parent[sel]]
        pair, first, inv = np.unique(up * n_names + name_code[sel], return_index=True, return_inverse=True)
        for k, (u, i) in enumerate(zip(up[first].tolist(), sel[first].tolist())):
            made_of[next_code + k] = (u, i)
        pcode[sel] = next_code + inv.reshape(-1)
        next_code += len(pair)
    codes, code_first, code_inv = np.unique(pcode, return_index=True, return_inverse=True)
    first_of_name = np.full(n_names, -1, np.int64)
    first_of_name[name_code[::-1]] = np.arange(n - 1, -1, -1)
    listed: dict[int, tuple[str, ...]] = {}

    def parts_of(code: int) -> tuple[str, ...]:
        if code not in listed:
            if code < n_names:
                listed[code] = (str(names[first_of_name[code]]),)
            else:
                up, i = made_of[code]
                listed[code] = parts_of(up) + (str(names[i]),)
        return listed[code]

    code_parts = [parts_of(c) for c in codes.tolist()]
    # paths that spell the same (a name holding '/') are one path, as their strings were; its
    # names are those of the path its first instance is on
    path_of_code = np.array(["/".join(p) for p in code_parts], dtype=object)
    upath, path_of = np.unique(path_of_code, return_inverse=True)
    path_of = path_of.reshape(-1)
    first_inst = np.full(len(upath), n, np.int64)
    np.minimum.at(first_inst, path_of, code_first)
    parts: list[tuple[str, ...]] = [()] * len(upath)
    for j in np.flatnonzero(code_first == first_inst[path_of]).tolist():
        parts[path_of[j]] = code_parts[j]
    inv = path_of[code_inv.reshape(-1)]
    # per distinct path (few): the shortest '/'-suffix that tells it apart from the other
    # paths ending in the same name ("Step 1/Forward", not "Run/Warm-up/Step 1/Forward")
    by_leaf: dict[str, list[int]] = {}
    for i, ps in enumerate(parts):
        by_leaf.setdefault(ps[-1], []).append(i)
    display = np.empty(len(parts), dtype=object)
    display[:] = [ps[-1] for ps in parts]
    for idx in by_leaf.values():
        if len(idx) == 1:
            continue
        suffix = {i: "/".join(parts[i]) for i in idx}
        for k in range(2, max(len(parts[i]) for i in idx) + 1):
            suffix = {i: "/".join(parts[i][-k:]) for i in idx}
            if len(set(suffix.values())) == len(idx):
                break
        for i in idx:
            display[i] = suffix[i]
    # two paths can show as one key (a name holding '/'): the key, not the path, is the stage
    distinct, key_of_path = np.unique(display, return_inverse=True)
    code = key_of_path.reshape(-1)[inv.reshape(-1)]
    return distinct[code], level, code.astype(np.int64), distinct


def _finish(inst: StageInstances, warmup_n: int, detect_cold: bool = True,
            name_code: np.ndarray | None = None) -> StageInstances:
    """Stage keys, occurrence order, warm-up (:mod:`maxinstr.warmup`'s rule, which
    ``Run.warmup_mask()`` and the steady-state capture follow too) and cold-start flags.
    ``name_code``: equal exactly when the names are (the run's name ids), else found. Cold starts
    are looked for level by level from the top, among instances not already inside a startup
    instance, so a request's cold start takes its decode steps with it."""
    n = len(inst)
    name_code = name_codes(inst.name) if name_code is None else np.asarray(name_code, np.int64)
    part_code = np.unique(inst.part, return_inverse=True)[1].reshape(-1).astype(np.int64) if n else _i64(0)
    # the rule over every instance (as Run.warmup_mask() has it), then the deepest left out
    rule = warmup_rule.warmup_flags(part_code, name_code, inst.parent, inst.host_start_ns, inst.is_mark, warmup_n)
    deep = rule.level >= MAX_LEVELS
    if deep.any():
        keep = np.flatnonzero(~deep)
        new_row = np.cumsum(~deep) - 1
        for f in fields(inst):
            col = getattr(inst, f.name)
            if isinstance(col, np.ndarray) and len(col) == n:
                setattr(inst, f.name, col[keep])
        for f in fields(rule):
            col = getattr(rule, f.name)
            if isinstance(col, np.ndarray):
                setattr(rule, f.name, col[keep])
        inst.parent = np.where(inst.parent >= 0, new_row[np.maximum(inst.parent, 0)], -1)
        name_code, part_code, n = name_code[keep], part_code[keep], len(keep)
        k = int(deep.sum())
        inst.notes.append(f"{k} stage instance{'s' if k > 1 else ''} nested more than {MAX_LEVELS} levels deep (or in "
                          f"a parent cycle): not shown as stages of {'their' if k > 1 else 'its'} own; "
                          f"{'their' if k > 1 else 'its'} time is in the enclosing stage at depth {MAX_LEVELS - 1}")
    inst.key, inst.level, inst.key_code, inst.keys = stage_keys(inst.name, inst.parent, name_code)
    n_names = int(name_code.max()) + 1 if n else 1
    inst.occurrence, inst.iteration, inst.warmup = rule.occurrence, rule.iteration, rule.warmup
    inst.pipeline_head = _head_name(inst, part_code, name_code, rule.heads)
    if n:  # without a marked step: the position among same-named siblings of the same parent
        pos = occurrence_index((inst.parent + 1) * n_names + name_code, inst.host_start_ns)
        inst.step = np.where(inst.step_marked, inst.step, pos)
    inst.cold = np.zeros(n, dtype=bool)
    inst.cold_z = np.zeros(n, dtype=np.float64)
    inst.inside_startup = rule.nested.copy()
    # siblings kept out with a cold pipeline iteration: top-level, so inside() never finds them
    groups = _iteration_groups(inst, part_code) if n and inst.pipeline_head is not None else None
    inst.iteration_head = np.zeros(n, dtype=bool)
    if groups is not None:
        inst.iteration_head[groups[0][groups[2]]] = True
    in_cold_iteration = (_cold_iterations(inst, part_code, groups) if detect_cold and groups is not None
                         else np.zeros(n, dtype=bool))
    inst.inside_startup |= in_cold_iteration
    if detect_cold and n:
        # cold starts are outliers within one population: one stage key in one process. Pooling
        # processes (ranks) would judge a slow rank's ordinary first steps by the fast ranks'
        # median and call them cold starts.
        codes = inst.key_code * (int(part_code.max()) + 1) + part_code
        # a first call is among the first few runs of its stage in its process, warm-up included:
        # the 321st `sample` (320 ran in two warm-up requests) is slow for another reason
        first_call = occurrence_index(codes, inst.host_start_ns) < warmup_n + COLD_START_MAX_PREFIX
        for lv in range(int(inst.level.max()) + 1):
            at = (inst.level == lv) & ~inst.warmup & ~inst.inside_startup & ~inst.is_mark
            if len(inst.unclosed) == n:
                at &= ~inst.unclosed
            if not at.any():
                continue
            for values in (inst.host_ns, inst.proj_ns):
                mask, z = cold_start_mask(codes, inst.occurrence, values, at & (values >= 0), first_calls=first_call)
                inst.cold |= mask
                inst.cold_z = np.maximum(inst.cold_z, np.where(mask, z, 0.0))
            if lv == 0 and groups is not None:
                # a cold head instance takes its iteration along, as a cold enclosing instance
                # takes what it encloses; a cold sibling (a readback) only itself
                top, row, is_head = groups
                cold_rows = np.unique(row[is_head & inst.cold[top]])
                in_cold_iteration[top[np.isin(row, cold_rows) & ~inst.cold[top]]] = True
            inst.inside_startup = warmup_rule.inside(inst.parent, inst.warmup | inst.cold | in_cold_iteration) | in_cold_iteration
    inst.inside_startup &= ~(inst.warmup | inst.cold)
    return inst


def _head_name(inst: StageInstances, part_code: np.ndarray, name_code: np.ndarray, heads: dict[int, int]) -> str | None:
    """The pipeline head's name (:func:`maxinstr.warmup.pipeline_iterations`) in the process
    with the most instances, or None."""
    if not heads:
        return None
    sizes = {p: int(np.count_nonzero(part_code == p)) for p in heads}
    biggest = max(sizes, key=lambda p: sizes[p])
    at = np.flatnonzero((part_code == biggest) & (name_code == heads[biggest]) & (inst.level == 0) & ~inst.is_mark)
    return str(inst.name[at[0]]) if len(at) else None


def _iteration_groups(inst: StageInstances, part_code: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top-level instances of pipeline iterations (not warm-up ones): (their rows, per row
    its (iteration, process) group, whether it is the first of its group: the head instance)."""
    top = np.flatnonzero((inst.level == 0) & ~inst.is_mark & (inst.iteration >= 0) & ~inst.warmup)
    if len(top) == 0:
        return top, _i64(0), np.zeros(0, bool)
    n_parts = int(part_code.max()) + 1
    _, row = np.unique(inst.iteration[top] * n_parts + part_code[top], return_inverse=True)
    row = row.reshape(-1).astype(np.int64)
    order = np.lexsort((inst.host_start_ns[top], row))
    is_head = np.zeros(len(top), bool)
    is_head[order[np.r_[True, row[order][1:] != row[order][:-1]]]] = True
    return top, row, is_head


def _cold_iterations(inst: StageInstances, part_code: np.ndarray,
                     groups: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Cold-start pipeline iterations, judged like cold-start instances on each iteration's wall
    time: the head instance of a cold iteration is marked cold, and the top-level instances kept
    out with it (as the steps of a cold request are) are returned."""
    out = np.zeros(len(inst), dtype=bool)
    top, row, is_head = groups
    if len(top) == 0:
        return out
    n_groups = int(row.max()) + 1
    first = np.full(n_groups, np.iinfo(np.int64).max)
    last = np.full(n_groups, np.iinfo(np.int64).min)
    np.minimum.at(first, row, inst.host_start_ns[top])
    np.maximum.at(last, row, inst.host_end_ns[top])
    head_rows = top[is_head]  # one per group, in group order after the sort below
    head_rows = head_rows[np.argsort(row[is_head])]
    part_of, it_of = part_code[head_rows], inst.iteration[head_rows]
    cold, z = cold_start_mask(part_of, it_of, (last - first).astype(np.float64), np.ones(n_groups, bool))
    if not cold.any():
        return out
    inst.cold[head_rows[cold]] = True
    inst.cold_z[head_rows[cold]] = z[cold]
    out[top[cold[row] & ~is_head]] = True
    return out


def iteration_sizes(inst: StageInstances) -> np.ndarray:
    """Per instance: how many others share its pipeline iteration and process (0 without a head)."""
    n = len(inst)
    if inst.pipeline_head is None or n == 0:
        return np.zeros(n, np.int64)
    part_code = np.unique(inst.part, return_inverse=True)[1].reshape(-1).astype(np.int64)
    key = (inst.iteration + 1) * (int(part_code.max()) + 1) + part_code
    _, row, counts = np.unique(key, return_inverse=True, return_counts=True)
    return np.where(inst.iteration >= 0, counts[row.reshape(-1)] - 1, 0)


def descendant_counts(parent: np.ndarray) -> np.ndarray:
    """Per instance: how many instances are nested in it, at any depth."""
    n = len(parent)
    out = np.zeros(n, dtype=np.int64)
    cur = parent.copy()
    live = np.flatnonzero(cur >= 0)
    for _ in range(MAX_LEVELS):
        if len(live) == 0:
            break
        out += np.bincount(cur[live], minlength=n)
        cur[live] = parent[cur[live]]
        live = live[cur[live] >= 0]
    return out


def _distinct_ranges(trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per range its (domain, text) pair's index, each pair's domain, its text; '' when none): a
    trace has a million ranges and a few hundred distinct names, each string handled once."""
    r = trace.ranges
    strings = np.asarray(trace.strings, dtype=object)
    n_s = len(strings) + 1
    key = (np.asarray(r.domain_id, np.int64) + 1) * n_s + (np.asarray(r.name_id, np.int64) + 1)
    pairs, inv = np.unique(key, return_inverse=True)
    dom_id, name_id = pairs // n_s - 1, pairs % n_s - 1
    text = np.where(name_id >= 0, strings[np.maximum(name_id, 0)] if len(strings) else "", "").astype(object)
    dom = np.where(dom_id >= 0, strings[np.maximum(dom_id, 0)] if len(strings) else "", "").astype(object)
    return inv.reshape(-1), dom, text


def _display_names(dom: np.ndarray, text: np.ndarray) -> np.ndarray:
    """The text, prefixed ``domain:`` unless the domain is empty or maxinstr's own."""
    prefixed = ~isin_strings(dom, UNPREFIXED_DOMAINS)
    out = text.copy()
    # one string a distinct (domain, text) pair (np.char on a fixed-width copy made a 50 MB text
    # of one range cost 50 MB x 4 for every other range too)
    out[prefixed] = [f"{d}:{t}" for d, t in zip(dom[prefixed].tolist(), text[prefixed].tolist())]
    return out


def range_names(trace) -> np.ndarray:
    """Display names of the trace's ranges (:func:`_display_names`)."""
    if len(trace.ranges) == 0:
        return np.empty(0, dtype=object)
    inv, dom, text = _distinct_ranges(trace)
    return _display_names(dom, text)[inv]


def from_trace(trace, attribution=None, warmup_n: int = 0) -> StageInstances:
    """Stage instances from a trace's host ranges (marks dropped), with attribution's GPU columns."""
    r = trace.ranges
    keep_mask = np.asarray(r.style) != RangeStyle.MARK
    n_all = len(r)
    if n_all:
        pair, dom, text = _distinct_ranges(trace)
        # C++-qualified op names (aten::mm, _C::rms_norm) are framework op markers whatever the domain
        framework = (isin_strings(dom, FRAMEWORK_OP_DOMAINS) | per_string(text, lambda t: "::" in t))[pair]
        if (keep_mask & ~framework).any():
            keep_mask &= ~framework
        keep = np.flatnonzero(keep_mask)
        pair_names = _display_names(dom, text)
        kept_pair = pair[keep]
        # name_codes() of the few distinct pairs, not a sort of every instance's string
        present = np.flatnonzero(np.bincount(kept_pair, minlength=len(pair_names))) if len(keep) else kept_pair
        code_of_pair = np.full(len(pair_names), -1, np.int64)
        if len(present):
            code_of_pair[present] = name_codes(pair_names[present])
        names, name_code = pair_names[kept_pair], code_of_pair[kept_pair]
    else:
        keep = np.empty(0, np.int64)
        names, name_code = np.empty(0, dtype=object), _i64(0)
    inst = StageInstances(
        name=names.astype(object),
        host_start_ns=np.asarray(r.start_ns, np.int64)[keep],
        host_end_ns=np.asarray(r.end_ns, np.int64)[keep],
        gpu_event_ns=_i64(len(keep)),
        step=_i64(len(keep)),
        step_marked=np.zeros(len(keep), bool),
        part=np.asarray(r.pid, np.int64)[keep],
        tid=np.asarray(r.tid, np.int64)[keep],
        record_id=_i64(len(keep)),
        range_index=keep.astype(np.int64),
        is_mark=np.zeros(len(keep), bool),
        exception=np.zeros(len(keep), bool),
    )
    _fill_from_attribution(inst, attribution, keep, n_all)
    return _finish(inst, warmup_n, name_code=name_code)


def _fill_from_attribution(inst: StageInstances, attribution, rows: np.ndarray, n_ranges: int) -> None:
    """Attribution's per-range columns for ``rows`` (indexes into trace.ranges, -1 none)."""
    n = len(inst)
    have = attribution is not None and len(getattr(attribution, "proj_start_ns", [])) == n_ranges and n_ranges > 0
    ok = (rows >= 0) & have
    safe = np.where(ok, rows, 0)

    def col(name: str) -> np.ndarray:
        if not have:
            return _i64(n)
        return np.where(ok, np.asarray(getattr(attribution, name), np.int64)[safe], -1)

    inst.proj_start_ns = col("proj_start_ns")
    inst.proj_end_ns = col("proj_end_ns")
    no_ops = inst.proj_start_ns < 0
    for name in ("busy_ns", "kernel_ns", "kernel_count", "op_count", "idle_gap_ns", "memcpy_ns"):
        values = col(name)
        # a joined range that owns no op has 0 of everything, not "missing"
        setattr(inst, name, np.where(ok & no_ops, 0, values) if have else values)
    if have:
        parent_range = np.asarray(attribution.range_parent, np.int64)
        pos_of_range = _i64(n_ranges)
        pos_of_range[rows[ok]] = np.flatnonzero(ok)
        pr = np.where(ok, parent_range[safe], -1)
        inst.parent = np.where(pr >= 0, pos_of_range[np.maximum(pr, 0)], -1)
        inst.depth = np.where(ok, np.asarray(attribution.range_depth, np.int64)[safe], 0)
    elif len(inst.parent) != n:
        inst.parent = _i64(n)
        inst.depth = np.zeros(n, np.int64)


def from_run(run, trace=None, attribution=None, warmup_n: int | None = None) -> StageInstances:
    """Stage instances from a run's records; GPU projection columns joined from the trace's
    attribution by record id (``attribution.range_record_id``) when given."""
    s = run.stages  # a structured array (RUN_STAGE_DTYPE), empty or not
    n = len(s)
    flags = np.asarray(s["flags"])
    ids, step = np.asarray(s["id"], np.int64), np.asarray(s["step"], np.int64)

    def col(name: str) -> np.ndarray:
        return np.asarray(s[name], np.int64)

    inst = StageInstances(
        name=run.stage_names().astype(object), host_start_ns=col("host_start_ns"), host_end_ns=col("host_end_ns"),
        gpu_event_ns=np.where((flags & fmt.GPU_TIMED) != 0, col("gpu_end_ns") - col("gpu_start_ns"), -1).astype(np.int64),
        step=step, step_marked=step >= 0, parent=warmup_rule.parent_rows(ids, s["parent_id"]).astype(np.int64),
        depth=col("depth"), part=col("part"), tid=col("tid"), record_id=ids, range_index=_i64(n),
        is_mark=(flags & fmt.MARK) != 0, exception=(flags & fmt.EXCEPTION) != 0, unclosed=(flags & fmt.UNCLOSED) != 0)
    if inst.unclosed.any():
        k = int(inst.unclosed.sum())
        inst.notes.append(f"{k} stage instance{'s were' if k > 1 else ' was'} still open when {'their' if k > 1 else 'its'} "
                          "process or session ended (killed or interrupted): the end recorded is the close time, so "
                          f"{'they are' if k > 1 else 'it is'} left out of the statistics")
    rows = _i64(n)
    n_ranges = 0
    if trace is not None and attribution is not None:
        n_ranges = len(trace.ranges)
        rec = np.asarray(getattr(attribution, "range_record_id", _i64(0)), np.int64)
        if len(rec) == n_ranges and n:
            joined = np.flatnonzero(rec >= 0)
            row = warmup_rule.parent_rows(ids, rec[joined])  # the record with the range's id
            rows[row[row >= 0]] = joined[row >= 0]
    if (rows >= 0).any():
        # a join must agree on the name: a record id that matches a range of another name means
        # the trace is not this run's (ids restart at 1 in every process)
        joined = np.flatnonzero(rows >= 0)
        name_id = np.asarray(trace.ranges.name_id, np.int64)[rows[joined]]
        strings = np.asarray(trace.strings, dtype=object)
        text = np.where(name_id >= 0, strings[np.maximum(name_id, 0)] if len(strings) else "", "").tolist()
        r_tid = np.asarray(trace.ranges.tid, np.int64)[rows[joined]]
        rec_tid = inst.tid[joined]
        other_name = np.fromiter((a != b for a, b in zip(text, inst.name[joined].tolist())),
                                 bool, len(joined))
        other_thread = (r_tid > 0) & (rec_tid > 0) & (r_tid != rec_tid)
        if other_thread.mean() > 0.5:
            # most pairs disagree: a systematic tid mapping (PID namespaces, a profiler's own
            # numbering), not a foreign trace; judge by name only
            other_thread[:] = False
            inst.notes.append("trace thread ids differ from the run's (PID namespace?): join checked by name only")
        bad = joined[other_name | other_thread]
        if other_name.mean() > 0.5:
            bad = joined  # most ids point at ranges of other names: the trace is not this run's
        if len(bad):
            rows[bad] = -1
            inst.notes.append(f"{len(bad)} of {len(joined)} trace ranges matched a stage record's id but not its "
                              "name or thread: not used (is the trace from this run?)")
    inst.range_index = rows
    keep_parent, keep_depth = inst.parent, inst.depth
    _fill_from_attribution(inst, attribution if n_ranges else None, rows, n_ranges)
    inst.parent, inst.depth = keep_parent, keep_depth  # the run's own nesting is exact
    return _finish(inst, run.warmup if warmup_n is None else warmup_n, name_code=col("name_id"))
