"""Columnar SQLite reading: the native ``maxinstr._columns`` module, or Python's sqlite3 (the
reference and fallback: fetching millions of rows through Python objects costs seconds,
docs/benchmarks.md "Trace merge"). Both backends give identical arrays (:class:`ColumnBackend`).
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import numpy as np

from maxinstr import config
from maxinstr.columns import native_module
from maxinstr.traces.model import INVALID_NS


@dataclass(frozen=True)
class IntCol:
    """One integer result column: ``((ifnull(name, default) >> shift) & mask)``; the literal
    ``default`` (shifted and masked alike) when the table lacks the column.

    Kind ``t`` (a time, unshifted) reads a value that is not an integer (text, a float, a blob)
    as :data:`~maxinstr.traces.model.INVALID_NS`, as in query(); the direct scan never sees one
    (it declines such a table, and the query runs instead)."""

    name: str
    default: int = -1
    kind: str = "i"  # 'i' int64, 't' int64 time or 'n' int32 (out-of-range values -1), as in query()
    shift: int = 0
    mask: int | None = None

    def sql(self, present: set[str] | frozenset[str]) -> str:
        expr = f'ifnull("{self.name}", {self.default})' if self.name in present else str(self.default)
        if self.shift:
            expr = f"({expr} >> {self.shift})"
        if self.mask is not None:
            expr = f"({expr} & {self.mask})"
        return expr


class ColumnBackend(Protocol):
    name: str

    def query(self, path: str, sql: str, kinds: str) -> list[Any]:
        """One SELECT; ``kinds``, a letter per result column: ``i`` int64, ``t`` int64 time (a value
        that is not an integer, NULL included, reads as INVALID_NS where SQL would read 'abc' as 0),
        ``n`` int32 (ids, 24-bit pids/tids, enums: half the memory; out of range: -1), ``f`` float64,
        ``s`` text as (int32 codes, -1 for NULL; the distinct strings). Integer NULLs: ``ifnull``."""

    def query_many(self, path: str, queries: Sequence[tuple]) -> list[list[Any]]:
        """``[(sql, kinds[, filter_column, mask]), ...]``, on parallel threads in the native backend;
        with a uint8 ``mask``, only rows whose ``filter_column`` value v has ``mask[v] != 0`` are kept."""

    def strings_by_id(self, path: str, table: str, ids: np.ndarray) -> list[str]:
        """``value`` of the rows of ``table`` with each ``id`` of ``ids``, in order ("" when missing)."""

    def scan(self, path: str, table: str, columns: Sequence[IntCol], *, filter_col: int = -1,
             mask: np.ndarray | None = None, exclude: tuple[int, int] | None = None,
             expected_rows: int = 0, pieces: bool = False) -> list[Any] | None:
        """Integer columns of one table in rowid order, read straight from its b-tree (native), or
        None when that is not possible (then the same columns go through SQL). ``pieces``: each
        column a list of arrays, one per reader thread, for a caller that joins tables anyway."""


def _uri(path: str) -> str:
    # Read-only and immutable: fixtures live in read-only folders, and an exported trace is
    # never written while we read it. immutable=1 skips locking and journal checks.
    return f"file:{quote(os.path.abspath(path))}?mode=ro&immutable=1"


_BATCH = 1 << 16  # rows per fetchmany() in the Python backend


class PythonBackend:
    """The reference implementation over Python's sqlite3 (slow for millions of rows)."""

    name = "python-sqlite3"

    def query(self, path: str, sql: str, kinds: str) -> list[Any]:
        # Rows are fetched and converted in batches: a whole fetchall() of millions of rows
        # holds a tuple per row and an int object per value at once (GBs at 10M rows).
        tables: list[dict[str, int]] = [{} for _ in kinds]
        chunks: list[list[np.ndarray]] = [[] for _ in kinds]
        with closing(connect(path)) as con:
            cur = con.execute(sql)
            while True:
                rows = cur.fetchmany(_BATCH)
                if not rows:
                    break
                for c, (k, col) in enumerate(zip(kinds, zip(*rows))):
                    if k in _CONVERT:
                        chunks[c].append(_CONVERT[k](col))
                    else:
                        t = tables[c]
                        chunks[c].append(np.fromiter(
                            (-1 if v is None else t.setdefault(str(v), len(t)) for v in col),
                            dtype=np.int32, count=len(col)))  # fmt: skip
                del rows
        out: list[Any] = []
        for c, k in enumerate(kinds):
            if not chunks[c]:
                out.append(_empty(k))
                continue
            arr = np.concatenate(chunks[c])
            chunks[c] = []
            out.append((arr, list(tables[c])) if k == "s" else arr)
        return out

    def query_many(self, path: str, queries: Sequence[tuple]) -> list[list[Any]]:
        out = []
        for spec in queries:
            result = self.query(path, spec[0], spec[1])
            if len(spec) >= 4 and spec[3] is not None:
                result = apply_filter(result, spec[2], spec[3])
            out.append(result)
        return out

    def scan(self, path: str, table: str, columns: Sequence[IntCol], **_: Any) -> None:
        return None  # the reference path: always SQL

    def strings_by_id(self, path: str, table: str, ids: np.ndarray) -> list[str]:
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return []
        with closing(connect(path)) as con:
            found: dict[int, str] = {}
            step = 500  # stay under SQLite's host-parameter limit on old builds
            for i in range(0, len(ids), step):
                chunk = [int(x) for x in ids[i : i + step]]
                marks = ",".join("?" * len(chunk))
                for key, value in con.execute(f"SELECT id, value FROM {table} WHERE id IN ({marks})", chunk):
                    found[int(key)] = str(value)
        return [found.get(int(x), "") for x in ids]


def _int64(col: tuple) -> np.ndarray:
    """An int64 column as sqlite3_column_int64 reads it (NULL and non-numbers give 0)."""
    try:
        return np.array(col, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):  # only in damaged files: value by value
        return np.array([_sqlite_int(v) for v in col], dtype=np.int64)


def _time64(col: tuple) -> np.ndarray:
    """Kind 't': int64 where the value is an integer, INVALID_NS for anything else (str, float,
    bytes, None), as the native reader does."""
    if all(type(v) is int for v in col):
        return np.array(col, dtype=np.int64)  # (sqlite3 ints fit int64)
    return np.array([v if type(v) is int else INVALID_NS for v in col], dtype=np.int64)


def _narrow(col: np.ndarray) -> np.ndarray:
    """int64 -> int32 as the native reader does it: out-of-range values become -1."""
    return np.where((col < np.iinfo(np.int32).min) | (col > np.iinfo(np.int32).max), -1, col).astype(np.int32)


def _sqlite_int(v: object) -> int:
    if isinstance(v, int):
        return max(min(v, (1 << 63) - 1), -(1 << 63))
    if isinstance(v, float):
        return 0 if v != v else int(max(min(v, 9.2e18), -9.2e18))
    if isinstance(v, str):
        m = re.match(r"\s*([+-]?\d+)", v)
        return _sqlite_int(int(m.group(1))) if m else 0
    return 0


def _float64(col: tuple) -> np.ndarray:
    try:
        return np.array([np.nan if v is None else v for v in col], dtype=np.float64)
    except (TypeError, ValueError):
        out = []
        for v in col:
            try:
                out.append(np.nan if v is None else float(v))
            except (TypeError, ValueError):
                out.append(0.0)
        return np.array(out, dtype=np.float64)


_CONVERT = {"i": _int64, "t": _time64, "n": lambda col: _narrow(_int64(col)), "f": _float64}


def connect(path: str | Path) -> sqlite3.Connection:
    """A read-only sqlite3 connection that never raises on undecodable text."""
    con = sqlite3.connect(_uri(str(path)), uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    return con


def apply_filter(columns: list[Any], col: int, mask: np.ndarray) -> list[Any]:
    """Keep the rows whose ``columns[col]`` value v has ``mask[v] != 0`` (what the native
    reader does while stepping)."""
    v = columns[col]
    keep = (v >= 0) & (v < len(mask))
    keep[keep] = np.asarray(mask, np.uint8)[v[keep]] != 0
    if any(isinstance(c, tuple) for c in columns):
        raise ValueError("row filters are for queries without text columns")
    return [c[keep] for c in columns]


_DTYPES = {"i": np.int64, "t": np.int64, "n": np.int32, "f": np.float64}


def _empty(kind: str) -> Any:
    return np.empty(0, _DTYPES[kind]) if kind in _DTYPES else (np.empty(0, np.int32), [])


class NativeBackend:
    """``maxinstr._columns``: steps statements in C++ straight into numpy buffers."""

    name = "native"

    def __init__(self, module: Any) -> None:
        self._m = module

    def query(self, path: str, sql: str, kinds: str) -> list[Any]:
        return self._m.query_many(_uri(path), [(sql, kinds)], 1)[0]

    def query_many(self, path: str, queries: Sequence[tuple]) -> list[list[Any]]:
        threads = max(1, min(len(queries), worker_count()))
        return self._m.query_many(_uri(path), list(queries), threads, _TRIM)

    def strings_by_id(self, path: str, table: str, ids: np.ndarray) -> list[str]:
        return self._m.strings_by_id(_uri(path), table, np.ascontiguousarray(ids, dtype=np.int64))

    def scan(self, path: str, table: str, columns: Sequence[IntCol], *, filter_col: int = -1,
             mask: np.ndarray | None = None, exclude: tuple[int, int] | None = None,
             expected_rows: int = 0, pieces: bool = False) -> list[Any] | None:
        if config.no_direct_scan():
            return None
        layout = table_layout(path, table)
        if layout is None:
            return None
        root, order = layout
        specs = []
        for c in columns:
            src = order.get(c.name, -1)  # (-1 for a column the table lacks: its default)
            if c.name in order and src < 0:
                return None  # the rowid alias, a generated column, or a column with a default
            if c.kind not in ("i", "t", "n") or not (0 <= c.shift < 64) or not (-(1 << 63) <= c.default < (1 << 63)):
                return None
            # ('t' is 'i' here: the scan reads integers and NULLs only, and declines anything else)
            kind = "i" if c.kind == "t" else c.kind
            specs.append((src, int(c.default), kind, int(c.shift), -1 if c.mask is None else int(c.mask)))
        ex_col, ex_val = exclude if exclude is not None else (-1, 0)
        if mask is not None:
            mask = np.ascontiguousarray(mask, np.uint8)
        threads = max(1, worker_count())
        return self._m.scan_table(os.path.abspath(path), root, specs, filter_col, mask, ex_col, ex_val, threads,
                                  int(expected_rows), bool(pieces))


def worker_count() -> int:
    """CPUs this process may run on (parallel slices for the native reader)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def concat_results(parts: list[list[Any]]) -> list[Any]:
    """Join the column lists of several slices of one query, in order (strings re-interned)."""
    if len(parts) == 1:
        return parts[0]
    out: list[Any] = []
    for c in range(len(parts[0])):
        first = parts[0][c]
        # (slices are dropped column by column so peak memory stays near one copy)
        if isinstance(first, tuple):
            table: dict[str, int] = {}
            codes = []
            for p in parts:
                pc, pv = p[c]
                remap = np.array([table.setdefault(v, len(table)) for v in pv], dtype=np.int32)
                codes.append(np.where(pc >= 0, remap[np.maximum(pc, 0)] if len(remap) else -1, -1).astype(np.int32))
            out.append((np.concatenate(codes), list(table)))
        else:
            out.append(np.concatenate([p[c] for p in parts]))
        for p in parts:
            p[c] = None
    return out


_TRIM = True


def keep_freed_memory() -> None:
    """For a process that goes on to use as much memory as a read frees (``maxinstr report``):
    reads no longer hand freed heap memory back to the OS (:func:`release_memory`), which the
    next phase would fault back in, page by page."""
    global _TRIM
    _TRIM = False


def release_memory() -> None:
    """Give freed heap memory back to the OS when the native module is there (glibc only),
    unless :func:`keep_freed_memory` was called."""
    if not _TRIM:
        return
    module = native_module()
    if module is not None:
        module.release_memory()


def backend(prefer: str = "auto") -> ColumnBackend:
    """``"native"``, ``"python"``, or ``"auto"`` (native when it loads, else Python)."""
    if prefer == "python":
        return PythonBackend()
    module = native_module()
    if module is None:
        if prefer == "native":
            raise RuntimeError("maxinstr._columns is not available (not built, or libsqlite3.so.0 not found)")
        return PythonBackend()
    return NativeBackend(module)


def table_layout(path: str | Path, table: str) -> tuple[int, dict[str, int]] | None:
    """(root page, column name -> index in the stored record) of an ordinary rowid table, for
    the direct scan; a column that cannot be read from its record position maps to -1 (the
    INTEGER PRIMARY KEY, which is stored as NULL and read as the rowid; a column with a DEFAULT,
    which rows written before an ALTER TABLE ADD COLUMN take without storing it). None for
    anything but an ordinary table (views, virtual, WITHOUT ROWID, generated columns)."""
    with closing(connect(path)) as con:
        row = con.execute("SELECT rootpage, sql FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone()
        if row is None or not row[0] or row[1] is None:
            return None
        if "WITHOUT ROWID" in " ".join(str(row[1]).upper().split()):
            return None
        info = con.execute(f"PRAGMA table_xinfo('{table}')").fetchall()
    order: dict[str, int] = {}
    pos = 0
    for _cid, name, ctype, _notnull, default, pk, *rest in info:
        if rest and rest[0]:
            return None  # generated columns: the stored record order is not the declared order
        alias = pk == 1 and str(ctype).strip().upper() == "INTEGER" and sum(1 for r in info if r[5]) == 1
        order[str(name)] = -1 if (alias or default is not None) else pos
        pos += 1
    return int(row[0]), order


def table_columns(path: str | Path) -> dict[str, set[str]]:
    """Every table of the database and its column names (schema probing is tiny: Python is fine)."""
    with closing(connect(path)) as con:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: {r[1] for r in con.execute(f"PRAGMA table_info('{n}')")} for n in names}
