"""The native direct table scan (``maxinstr._columns.scan_table``): integer columns read straight
from SQLite's table b-tree must equal what SQL gives for the same expressions, row for row, or
the scan must decline (None) so that the caller asks SQLite. Every storage case a table can
have: NULLs, each integer width, the 0/1 constants, negative values, short records after ALTER
TABLE ADD COLUMN, multi-level trees, several page sizes, text and floats in other columns, and
the cases it declines (floats or text in a column it reads, overflow pages, WAL mode, the rowid
alias, WITHOUT ROWID)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from maxinstr.traces import _sqlite_columns as cols
from maxinstr.traces._sqlite_columns import IntCol

NATIVE = cols.native_module() is not None and hasattr(cols.native_module(), "scan_table")
pytestmark = pytest.mark.skipif(not NATIVE, reason="maxinstr._columns (with scan_table) not built")
DATA = Path(__file__).resolve().parents[1] / "data"


def _native() -> cols.NativeBackend:
    return cols.NativeBackend(cols.native_module())


def _by_sql(path: Path, table: str, columns: list[IntCol], where_not=None, filter_col=-1, mask=None):
    present = cols.table_columns(path)[table]
    sql = f"SELECT {', '.join(c.sql(present) for c in columns)} FROM {table}"
    if where_not is not None:
        sql += f" WHERE {columns[where_not[0]].sql(present)} != {where_not[1]}"
    got = cols.PythonBackend().query(str(path), sql, "".join(c.kind for c in columns))
    return cols.apply_filter(got, filter_col, mask) if mask is not None else got


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and np.array_equal(x, y)


VALUES = [None, 0, 1, -1, 5, 127, -128, 128, 255, 32767, -32768, 40000, 2**23, -(2**23), 2**24 + 3, 2**31 - 1,
          -(2**31), 2**31, 2**40, -(2**47), 2**47 + 1, 2**62, -(2**63), 2**63 - 1]


def _table(path: Path, rows: int, page_size: int = 4096, seed: int = 0) -> None:
    rng = random.Random(seed)
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size={page_size}")
    con.execute("CREATE TABLE t (a INTEGER NOT NULL, b INTEGER, label TEXT, c INTEGER, r REAL, d INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)",
                    [(rng.choice(VALUES[1:]), rng.choice(VALUES), "x" * rng.randrange(0, 40) if rng.random() < 0.7 else None,
                      rng.choice(VALUES), rng.random() if rng.random() < 0.5 else None, rng.randrange(-5, 2**30))
                     for _ in range(rows)])  # fmt: skip
    con.commit()
    con.close()


COLUMNS = [IntCol("a", 0), IntCol("b", -1), IntCol("c", -1, "n"), IntCol("c", 0, "i", 24, 0xFFFFFF),
           IntCol("d", 7, "n", 0, 0xFFFFFF), IntCol("missing", -3), IntCol("missing", 2**30, "n", 4, 0xFF),
           IntCol("b", 0, "i", 63)]


@pytest.mark.parametrize("page_size,rows", [(512, 3000), (4096, 20), (4096, 60_000), (65536, 20_000)])
def test_scan_equals_sql(tmp_path, page_size, rows):
    path = tmp_path / "t.sqlite"
    _table(path, rows, page_size)
    got = _native().scan(str(path), "t", COLUMNS, expected_rows=rows)
    assert got is not None
    _same(got, _by_sql(path, "t", COLUMNS))


def test_scan_filters_like_sql(tmp_path, monkeypatch):
    path = tmp_path / "t.sqlite"
    _table(path, 30_000, 1024, seed=3)
    mask = np.zeros(1 << 20, np.uint8)
    mask[np.random.default_rng(0).integers(0, 1 << 20, 200_000)] = 1
    columns = [IntCol("d", -1), IntCol("a", 0), IntCol("b", 0, "n", 0, 3)]
    for threads in (1, 3):  # contiguous leaf ranges per thread, joined in order
        monkeypatch.setattr(cols, "worker_count", lambda n=threads: n)
        got = _native().scan(str(path), "t", columns, filter_col=0, mask=mask, exclude=(2, 1), expected_rows=10)
        _same(got, _by_sql(path, "t", columns, where_not=(2, 1), filter_col=0, mask=mask))


def test_short_records_after_add_column_read_as_null(tmp_path):
    path = tmp_path / "t.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a INTEGER)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(500)])
    con.execute("ALTER TABLE t ADD COLUMN e INTEGER")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(i, -i) for i in range(500)])
    con.commit()
    con.close()
    columns = [IntCol("a", 0), IntCol("e", 99), IntCol("e", 99, "n", 1, 0xFF)]
    _same(_native().scan(str(path), "t", columns), _by_sql(path, "t", columns))


def test_scan_declines_what_sql_must_convert(tmp_path):
    path = tmp_path / "t.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a INTEGER, f, s, big)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", [(i, 1.5 if i == 70 else i, "7" if i == 3 else "x",
                                                          "y" * (6000 if i == 90 else 10)) for i in range(100)])  # fmt: skip
    con.commit()
    con.close()
    be = _native()
    assert be.scan(str(path), "t", [IntCol("f", 0)]) is None  # a float where an integer is read
    assert be.scan(str(path), "t", [IntCol("s", 0)]) is None  # text where an integer is read
    assert be.scan(str(path), "t", [IntCol("a", 0)]) is None  # a row on overflow pages
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("DELETE FROM t WHERE rowid = 91")
    con.execute("VACUUM")
    con.close()
    got = be.scan(str(path), "t", [IntCol("a", 0)])
    assert got is not None and got[0].tolist() == [i for i in range(100) if i != 90]


def test_scan_declines_other_layouts(tmp_path):
    be = _native()
    path = tmp_path / "pk.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER DEFAULT 4, w INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i * 3, i, -i) for i in range(50)])
    con.execute("CREATE TABLE nr (k INTEGER PRIMARY KEY, v INTEGER) WITHOUT ROWID")
    con.execute("INSERT INTO nr VALUES (1, 2)")
    con.commit()
    con.close()
    assert be.scan(str(path), "t", [IntCol("id", 0)]) is None  # the rowid alias is stored as NULL
    assert be.scan(str(path), "t", [IntCol("v", 0)]) is None  # a DEFAULT: short records take it
    assert be.scan(str(path), "t", [IntCol("w", 0)])[0].tolist() == [-i for i in range(50)]
    assert be.scan(str(path), "nr", [IntCol("v", 0)]) is None
    assert be.scan(str(path), "absent", [IntCol("v", 0)]) is None
    wal = tmp_path / "wal.sqlite"
    con = sqlite3.connect(wal)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (a INTEGER)")
    con.execute("INSERT INTO t VALUES (1)")
    con.commit()
    assert be.scan(str(wal), "t", [IntCol("a", 0)]) is None  # pages may be in the -wal file
    con.close()


def test_damaged_pages_decline_or_read_in_bounds(tmp_path):
    """Random damage to a real export's pages: the scan returns columns or None, never crashes
    (the reader then gets SQLite's own verdict on the file)."""
    seed = (DATA / "nsys" / "h200_small.sqlite").read_bytes()
    rng = random.Random(7)
    path = tmp_path / "damaged.sqlite"
    columns = [IntCol("start", 0), IntCol("correlationId", -1), IntCol("globalTid", 0, "n", 24, 0xFFFFFF)]
    root = cols.table_layout(DATA / "nsys" / "h200_small.sqlite", "CUPTI_ACTIVITY_KIND_RUNTIME")[0]
    mod = cols.native_module()
    for _ in range(60):
        data = bytearray(seed)
        for _ in range(rng.choice([1, 8, 64, 512])):
            data[rng.randrange(100, len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        got = mod.scan_table(str(path), root, [(0, 0, "i", 0, -1), (4, -1, "i", 0, -1), (3, 0, "n", 24, 0xFFFFFF)],
                             -1, None, -1, 0, 2, 0)
        assert got is None or (len(got) == len(columns) and len({len(c) for c in got}) == 1)


@pytest.mark.parametrize("path", sorted((DATA / "nsys").glob("*.sqlite")) + sorted((DATA / "max").glob("*.sqlite")),
                         ids=lambda p: p.stem)
def test_fixtures_are_scanned_not_queried(path):
    """The real exports are read by the direct scan (no fallback to SQL), with SQL's values."""
    schema = cols.table_columns(path)
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        if table not in schema:
            continue
        columns = [IntCol("start", 0), IntCol("end", 0), IntCol("correlationId", -1),
                   IntCol("globalPid" if "globalPid" in schema[table] else "globalTid", 0, "n", 24, 0xFFFFFF)]
        got = _native().scan(str(path), table, columns)
        assert got is not None, table
        _same(got, _by_sql(path, table, columns))


def test_time_kind_reads_only_integers(tmp_path):
    """Kind 't' (times): an integer reads as itself; text, a float, a blob, NULL read as
    INVALID_NS, in the native query and the Python backend alike, where kind 'i' takes SQLite's
    conversion ('12x' -> 12, 1.5 -> 1, NULL -> 0). The scan reads a 't' column like 'i' and
    declines the table when such a value is in it."""
    from maxinstr.traces.model import INVALID_NS

    path = tmp_path / "t.sqlite"
    stored = [5, "12x", "abc", "", 1.5, None, b"\x01", 2**62, -(2**63), 0, 3]
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (start INTEGER)")
    con.executemany("INSERT INTO t VALUES (?)", [(v,) for v in stored])
    con.commit()
    con.close()
    sql, want_t = "SELECT start, start FROM t", [5] + [INVALID_NS] * 6 + [2**62, -(2**63), 0, 3]
    for backend in (cols.PythonBackend(), _native()):
        as_time, as_int = backend.query(str(path), sql, "ti")
        assert as_time.dtype == np.int64 and as_time.tolist() == want_t
        assert as_int.tolist()[:6] == [5, 12, 0, 0, 1, 0]
    assert _native().scan(str(path), "t", [IntCol("start", INVALID_NS, "t")]) is None
    ok = tmp_path / "ok.sqlite"
    con = sqlite3.connect(ok)
    con.execute("CREATE TABLE t (start INTEGER)")
    con.executemany("INSERT INTO t VALUES (?)", [(5,), (None,), (2**40,)])
    con.commit()
    con.close()
    columns = [IntCol("start", INVALID_NS, "t")]
    _same(_native().scan(str(ok), "t", columns), _by_sql(ok, "t", columns))
