"""Fuzzing open_trace with mutations of the real fixtures: the only outcomes allowed are a
valid Trace or a one-line TraceError naming the file.

Mutations: truncation, byte flips, inserted/deleted slices (on the raw and the decompressed
bytes), dropped CSV columns and fields, JSON values replaced by wrong types at random paths,
and SQLite tables/columns dropped, values set to NULL / text, or rows made to end before they
start (a valid Trace has none: Trace.validate() checks; test_invalid_times.py checks that such
rows are dropped and said, exactly).

``test_fuzz_open_trace`` runs ~500 generated inputs (CI); ``test_fuzz_open_trace_10k`` runs
10,000 and is marked ``slow``. Nsight Systems inputs (H3's reader) are fuzzed separately so a
failure there is attributed to that reader.
"""

from __future__ import annotations

import atexit
import copy
import csv
import gzip
import io
import json
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
import rocprof_samples as rs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxinstr.errors import TraceError
from maxinstr.traces import open_trace
from maxinstr.traces.model import Trace

DATA = Path(__file__).resolve().parents[1] / "data"
_WORK = Path(tempfile.mkdtemp(prefix="maxinstr-fuzz-"))
atexit.register(shutil.rmtree, _WORK, True)


def _seed_files() -> dict[str, tuple[str, bytes]]:
    """name -> (kind, bytes) of the real inputs mutated below."""
    seeds: dict[str, tuple[str, bytes]] = {}
    for f in sorted((DATA / "rocprof" / "rocprofv3_docs").glob("*_trace.csv")):
        seeds[f.name] = ("csv", f.read_bytes())
    for f in sorted((DATA / "rocprof" / "rocprofv3_llamacpp_decode").glob("*.csv")):
        seeds[f.name] = ("csv", f.read_bytes())
    for name in ("hta_triton_example.json.gz", "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz"):
        raw = (DATA / "kineto" / name).read_bytes()
        seeds[name] = ("gz", raw)
        seeds[name[:-3]] = ("json", gzip.decompress(raw))
    matmul = (DATA / "rocprof" / "rpd" / "matmul_result.rpd").read_bytes()
    seeds["matmul_result.rpd"] = ("sqlite", matmul)
    seeds["matmul_result.rpd.gz"] = ("gzsqlite", gzip.compress(matmul, mtime=0))  # like mytrace.rpd.gz
    seeds["run_results.json"] = ("json", json.dumps(rs.rocprof_json()).encode())
    v1 = DATA / "rocprof" / "rocprof_v1_kokkos"
    seeds["results.db"] = ("sqlite", (v1 / "results.db").read_bytes())  # rocprof v1
    seeds["results.json"] = ("json", (v1 / "results.json").read_bytes())
    seeds["matmul_result.json"] = ("json", (DATA / "rocprof" / "rpd" / "matmul_result.json").read_bytes())  # rpd2tracing
    db = _WORK / "seed_results.db"
    rs.write_rocpd(db)
    seeds["run_results.db"] = ("sqlite", db.read_bytes())
    return seeds


SEEDS = _seed_files()
NSYS_SEED = ("h200_small.sqlite", (DATA / "nsys" / "h200_small.sqlite").read_bytes())

WRONG = st.sampled_from([None, "x", "", 1.5, -1, 0, True, [], {}, [1], [[1]], [1, "a"], {"a": None}, 2**70, -(2**63), 1e308]).map(
    copy.deepcopy  # a fresh object each time: a shared list would let a later mutation make a cycle
)


# ---- mutations -------------------------------------------------------------------------------


@st.composite
def byte_mutation(draw, data: bytes) -> bytes:
    n = len(data)
    how = draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
    if how == "truncate":
        return data[: draw(st.integers(0, n))]
    if how == "flip":
        buf = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            if buf:
                buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
        return bytes(buf)
    at = draw(st.integers(0, n))
    if how == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=64)) + data[at:]
    return data[:at] + data[at + draw(st.integers(1, 256)) :]


@st.composite
def csv_mutation(draw, data: bytes) -> bytes:
    table = list(csv.reader(io.StringIO(data.decode())))
    how = draw(st.sampled_from(["drop_column", "drop_field", "bad_value", "header_only"]))
    if how == "header_only":
        table = table[:1]
    elif how == "drop_column" and table and table[0]:
        i = draw(st.integers(0, len(table[0]) - 1))
        table = [[c for j, c in enumerate(r) if j != i] for r in table]
    elif len(table) > 1 and all(table[1:]):
        r = draw(st.integers(1, len(table) - 1))
        c = draw(st.integers(0, len(table[r]) - 1))
        if how == "drop_field":
            del table[r][c]
        else:
            table[r][c] = draw(st.sampled_from(["", "abc", "-1", "1e9", "99999999999999999999999", "Agent", "nan"]))
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL).writerows(table)
    return out.getvalue().encode()


@st.composite
def json_mutation(draw, data: bytes) -> bytes:
    doc = json.loads(data)
    for _ in range(draw(st.integers(1, 3))):
        node = doc
        parent, key = None, None
        for _depth in range(draw(st.integers(0, 6))):
            if isinstance(node, dict) and node:
                k = draw(st.sampled_from(sorted(node)))
            elif isinstance(node, list) and node:
                k = draw(st.integers(0, len(node) - 1))
            else:
                break
            parent, key, node = node, k, node[k]
        if parent is None:
            doc = draw(WRONG)
            break
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[key]
        else:
            parent[key] = draw(WRONG)
    return json.dumps(doc).encode()


@st.composite
def sqlite_mutation(draw, data: bytes) -> bytes:
    path = _WORK / "mutating.db"
    path.write_bytes(data)
    con = sqlite3.connect(path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
        table = draw(st.sampled_from(sorted(tables)))
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
        how = draw(st.sampled_from(["drop_table", "drop_column", "null", "text", "delete_rows", "end_before_start"]))
        # views would block dropping what they use; the readers must cope without them
        for (view,) in con.execute("SELECT name FROM sqlite_master WHERE type='view'").fetchall():
            con.execute(f'DROP VIEW "{view}"')
        if how == "drop_table":
            con.execute(f'DROP TABLE "{table}"')
        elif how == "drop_column" and len(cols) > 1:
            col = draw(st.sampled_from(cols))
            for (index,) in con.execute(
                "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name=? AND sql IS NOT NULL", (table,)
            ).fetchall():
                con.execute(f'DROP INDEX "{index}"')
            try:
                con.execute(f'ALTER TABLE "{table}" DROP COLUMN "{col}"')
            except sqlite3.OperationalError:  # primary key column: drop the table instead
                con.execute(f'DROP TABLE "{table}"')
        elif how in ("null", "text") and cols:
            col = draw(st.sampled_from(cols))
            value = None if how == "null" else draw(st.sampled_from(["x", "", "0x1f", "9" * 30]))
            try:
                con.execute(f'UPDATE "{table}" SET "{col}" = ? WHERE rowid % 3 = 0', (value,))
            except sqlite3.IntegrityError:  # INTEGER PRIMARY KEY or NOT NULL: delete rows instead
                con.execute(f'DELETE FROM "{table}" WHERE rowid % 3 = 0')
        elif how == "end_before_start" and {"start", "end"} <= set(cols):
            con.execute(f'UPDATE "{table}" SET "end" = "start" - ? WHERE rowid % ? = 0',
                        (draw(st.sampled_from([1, 1000, 2**40])), draw(st.sampled_from([1, 3, 7]))))
        else:
            con.execute(f'DELETE FROM "{table}" WHERE rowid % 2 = 0')
        con.commit()
    finally:
        con.close()
    return path.read_bytes()


class Case:
    """One generated input; a short repr so a failure report stays readable."""

    def __init__(self, name: str, data: bytes, how: str) -> None:
        self.name, self.data, self.how = name, data, how

    def __repr__(self) -> str:
        import hashlib

        return f"Case({self.name!r}, {self.how}, {len(self.data)} bytes, sha1 {hashlib.sha1(self.data).hexdigest()[:12]})"


@st.composite
def fuzz_input(draw, seeds=SEEDS) -> Case:
    name = draw(st.sampled_from(sorted(seeds)))
    name_, data_, how = draw(_mutate(name, seeds))
    return Case(name_, data_, how)


@st.composite
def _mutate(draw, name: str, seeds) -> tuple[str, bytes, str]:
    kind, data = seeds[name]
    if kind == "csv" and draw(st.booleans()):
        return name, draw(csv_mutation(data)), "csv"
    if kind == "json" and draw(st.booleans()):
        return name, draw(json_mutation(data)), "json"
    if kind == "gz":
        inner = gzip.decompress(data)
        if draw(st.booleans()):
            if draw(st.booleans()):
                return name, gzip.compress(draw(json_mutation(inner)), mtime=0), "gz(json)"
            return name, gzip.compress(draw(byte_mutation(inner)), mtime=0), "gz(bytes)"
    if kind == "sqlite" and draw(st.booleans()):
        return name, draw(sqlite_mutation(data)), "sqlite"
    if kind == "gzsqlite" and draw(st.booleans()):
        return name, gzip.compress(draw(sqlite_mutation(gzip.decompress(data))), mtime=0), "gz(sqlite)"
    return name, draw(byte_mutation(data)), "bytes"


def check(case: Case) -> None:
    name, data = case.name, case.data
    folder = _WORK / "case"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    path = folder / name
    path.write_bytes(data)
    try:
        trace = open_trace(path)
    except TraceError as exc:
        text = str(exc)
        assert str(folder) in text and "\n" not in text, text
        return
    assert isinstance(trace, Trace)
    trace.validate()


_SETTINGS = dict(
    deadline=None,
    database=None,
    # The same inputs every run, so CI is repeatable; MAXINSTR_FUZZ_RANDOM=1 explores new ones
    # (how the one-line rule was found to break on SQLite's quoted schema SQL).
    derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@settings(max_examples=500, **_SETTINGS)
@given(fuzz_input())
def test_fuzz_open_trace(case):
    check(case)


@pytest.mark.slow
@settings(max_examples=10_000, **_SETTINGS)
@given(fuzz_input())
def test_fuzz_open_trace_10k(case):
    check(case)


def _has_nsys() -> bool:
    try:
        from maxinstr.traces.nsys import read_nsys  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _has_nsys(), reason="maxinstr.traces.nsys not written yet")
@settings(max_examples=150, **_SETTINGS)
@given(fuzz_input(seeds={NSYS_SEED[0]: ("sqlite", NSYS_SEED[1])}))
def test_fuzz_open_trace_nsys(case):
    check(case)
