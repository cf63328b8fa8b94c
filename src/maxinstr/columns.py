"""The columnar primitives readers and analysis share, below both, and the native column module
(``maxinstr._columns``: the SQLite scan, group statistics, joins), looked up once; every caller
keeps a numpy path for when it is not built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from maxinstr import config


def native_module() -> Any | None:
    """The native module, or None (not built, or the system SQLite cannot be loaded)."""
    if config.no_native_columns():
        return None
    try:
        # at first use, not at import: the switch above decides first, and a process that never reads a trace never loads it
        import maxinstr._columns as _columns  # type: ignore[import-untyped]  # built from csrc, no stubs

        return _columns if _columns.available() else None
    except Exception:  # noqa: BLE001 - not built, or a broken build: the Python path
        return None


FUNCTIONS: dict[str, Callable[..., Any] | None] = {}  # by name (None: not built); tests set None for the numpy path


def function(name: str) -> Callable[..., Any] | None:
    """``maxinstr._columns.<name>`` when the native module is built and has it, else None."""
    if name not in FUNCTIONS:
        FUNCTIONS[name] = getattr(native_module(), name, None)
    return FUNCTIONS[name]


def searchsorted(a: np.ndarray, v: np.ndarray, side: Literal["left", "right"] = "left") -> np.ndarray:
    """``np.searchsorted(a, v, side)`` (int64); for int columns the native galloping search when
    built: nearly sorted keys (ids, times) cost a few steps."""
    native = function("searchsorted_i64") if len(v) >= 4096 else None
    if native is not None and a.dtype.kind == "i" and v.dtype.kind == "i" and a.itemsize <= 8 and v.itemsize <= 8:
        return native(a, v, side == "right")
    return np.searchsorted(a, v, side=side).astype(np.int64, copy=False)


def factorize(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values.astype(str), return_inverse=True)`` without its fixed-width copy of the
    column (one 50 MB name among a million rows asks for 200 TB): a dict lookup a value, the sort
    only over distinct values."""
    seq = values.tolist() if isinstance(values, np.ndarray) else list(values)
    index: dict[str, int] = {}
    setdefault = index.setdefault
    codes = np.fromiter((setdefault(v if type(v) is str else str(v), len(index)) for v in seq), np.int64, len(seq))
    first = np.empty(len(index), dtype=object)
    first[:] = list(index)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return first[order], rank[codes] if len(codes) else codes


def isin_strings(values: Any, wanted: Any) -> np.ndarray:
    """``np.isin(values.astype(str), wanted)`` for a column of strings, without its fixed-width copy."""
    return per_string(values, {str(w) for w in wanted}.__contains__)


def per_string(values: Any, test: Callable[[str], bool]) -> np.ndarray:
    """``test`` of each value of a column of strings (a bool array), called once per distinct value."""
    uniques, codes = factorize(values)
    hit = np.fromiter((bool(test(u)) for u in uniques.tolist()), bool, len(uniques))
    return hit[codes] if len(codes) else np.zeros(0, bool)


class StringTable:
    """Interns names while a reader builds its columns."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self._values: list[str] = []

    def intern(self, value: str) -> int:
        found = self._index.get(value)
        if found is None:
            found = self._index[value] = len(self._values)
            self._values.append(value)
        return found

    def ids_for(self, values: np.ndarray) -> np.ndarray:
        uniques, inverse = factorize(values)  # no fixed-width copy of the column (a 50 MB name)
        mapping = np.fromiter((self.intern(u) for u in uniques), dtype=np.int32, count=len(uniques))
        return mapping[inverse].astype(np.int32, copy=False)

    def to_array(self) -> np.ndarray:
        out = np.empty(len(self._values), dtype=object)
        out[:] = self._values
        return out


JOIN_BLOCK = 1 << 21  # left rows per step of correlation_join (bounds its temporaries)


def correlation_join(
    left_pid: np.ndarray, left_corr: np.ndarray, right_pid: np.ndarray, right_corr: np.ndarray,
    right_rank: np.ndarray | None = None,
) -> np.ndarray:
    """Per left row, the right row with the same (pid, correlation id), or -1.

    Of right rows sharing a key the lowest ``right_rank`` (small ints) wins, then the first;
    negative ids never match. Dense ids: a direct-address table; else one stable sort of the right
    keys and a ``searchsorted``. The left side is taken in blocks: the temporaries stay small."""
    nl = len(left_corr)
    out = np.full(nl, -1, np.int64)
    if not nl or not len(right_corr):
        return out
    right_corr = np.asarray(right_corr)
    right_pid = np.asarray(right_pid)
    rows = None  # right rows that take part (None: all)
    if right_corr.min() < 0:
        rows = np.flatnonzero(right_corr >= 0)
        if not len(rows):
            return out
    rc = np.asarray(right_corr if rows is None else right_corr[rows], np.int64)
    rp = right_pid if rows is None else right_pid[rows]
    lmax = int(np.max(left_corr))
    if lmax < 0:
        return out
    hi = max(lmax, int(rc.max())) + 1
    n_rank = 1
    if right_rank is not None:
        rr = np.asarray(right_rank)
        rr = rr if rows is None else rr[rows]
        n_rank = int(rr.max()) + 1 if len(rr) else 1
    lp_lo, lp_hi = int(np.min(left_pid)), int(np.max(left_pid))
    pids = None  # several processes: keys are (pid rank, id)
    if not (lp_lo == lp_hi == int(rp.min()) == int(rp.max())):
        pids = np.union1d(np.unique(left_pid), np.unique(rp)).astype(np.int64)
    remap = None  # absurd ids (a damaged file): dense ranks of every id first
    if (1 if pids is None else len(pids)) * hi * n_rank >= (1 << 61):
        remap = np.unique(np.concatenate([np.unique(np.asarray(left_corr)[np.asarray(left_corr) >= 0]), rc]))
        rc, hi = np.searchsorted(remap, rc), len(remap)
    if pids is not None:
        rkey = np.searchsorted(pids, np.asarray(rp, np.int64)) * hi + rc
        hi = len(pids) * hi
    else:
        rkey = rc  # one process: the id is the key
    del rc, rp

    def left_key(lo: int, up: int) -> tuple[np.ndarray, np.ndarray]:
        raw = np.asarray(left_corr[lo:up], np.int64)
        bad = raw < 0
        lc = raw if remap is None else np.searchsorted(remap, raw)
        if pids is not None:
            lp = np.asarray(left_pid[lo:up], np.int64)
            at = np.minimum(np.searchsorted(pids, lp), len(pids) - 1)
            lc = at * (hi // len(pids)) + lc
        return np.where(bad, 0, lc), bad

    if hi <= 2 * (nl + len(rkey)) + (1 << 20):  # dense ids: a table (page faults cost more than a search beyond that)
        table = np.full(hi, -1, np.int32 if len(right_corr) < (1 << 31) else np.int64)
        ranks = [None] if n_rank == 1 else list(range(n_rank - 1, -1, -1))  # best rank written last
        for r in ranks:
            sel = np.arange(len(rkey), dtype=np.int64) if r is None else np.flatnonzero(rr == r)
            target = sel if rows is None else rows[sel]
            table[rkey[sel[::-1]]] = target[::-1]  # reversed: with repeated keys the first row wins
            del sel, target
        for lo in range(0, nl, JOIN_BLOCK):
            key, bad = left_key(lo, lo + JOIN_BLOCK)
            found = table[key]
            found[bad] = -1
            out[lo : lo + len(key)] = found
        return out
    # Sort path: keys scaled by the number of ranks so one stable sort orders by (key, rank, row).
    skey = rkey if n_rank == 1 else rkey * n_rank + rr
    del rkey
    if len(skey) < 2 or bool(np.all(skey[1:] >= skey[:-1])):
        row_of = rows  # already sorted: no sort
    else:
        order = np.argsort(skey, kind="stable")
        skey = skey[order]
        row_of = order if rows is None else rows[order]
        del order
    last = len(skey) - 1
    for lo in range(0, nl, JOIN_BLOCK):
        key, bad = left_key(lo, lo + JOIN_BLOCK)
        if n_rank > 1:
            key *= n_rank
        found = searchsorted(skey, key)  # leftmost: the best rank, then first row, of the key
        np.minimum(found, last, out=found)
        if n_rank > 1:
            # key is id * n_rank: the same id exactly when skey[found] - key is in [0, n_rank)
            hit = skey[found] - key
            hit = (hit >= 0) & (hit < n_rank)
        else:
            hit = skey[found] == key
        hit &= ~bad
        if row_of is not None:
            found = row_of[found]
        found[~hit] = -1
        out[lo : lo + len(key)] = found
    return out


def occurrence_index(keys: np.ndarray, order: np.ndarray) -> np.ndarray:
    """For each row, how many earlier rows (by ``order``, ties in input order) share its key.
    ``keys``: any sortable array (ints, or strings as object arrays)."""
    keys = np.asarray(keys)
    n = len(keys)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    counts = function("running_counts")
    if counts is not None and keys.dtype.kind in "iu" and (keys.dtype.kind == "i" or keys.max() < (1 << 63)):
        # the rows by order (stable: ties keep input order), then a running count per key
        perm = np.argsort(np.asarray(order), kind="stable")
        out = np.empty(n, dtype=np.int64)
        out[perm] = counts(keys.astype(np.int64, copy=False)[perm])
        return out
    _, key_codes = np.unique(keys, return_inverse=True)
    key_codes = key_codes.reshape(-1)
    perm = np.lexsort((np.arange(n), np.asarray(order), key_codes))
    sorted_keys = key_codes[perm]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_keys)) + 1]
    group_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    out = np.empty(n, dtype=np.int64)
    out[perm] = np.arange(n) - group_start
    return out
