"""Times that cannot be real (issue 20): every reader drops the rows of a table whose times are
damaged, counts them and says so, and reads everything else exactly as before.

The class: text, a float or NULL where the file holds integer times (SQL's conversion read 'abc'
as 0, and an nsys request 21 ms long spanned 8.18 s), an end before the start, a time beyond
2**62 ns, a start of 0 or less on a clock that never reads it (all but nsys), a JSON ``ts`` or
``dur`` that is no number. Property, over copies of the real fixtures with some rows of one
table damaged in one such way: the copy reads exactly like the same copy with those rows
deleted (every column of ops, calls and ranges, by name), plus one note naming the table, the
count, the first damaged row and its problem; when every row of the table is damaged, the read
is one TraceError line naming the file and the table. Both nsys backends agree.

Also: any top-level JSON that is not a trace object or a list of event objects is one
TraceError line from the Kineto reader.
"""

from __future__ import annotations

import atexit
import copy
import csv
import gzip
import json
import os
import re
import shutil
import sqlite3
import tempfile
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, reject, settings
from hypothesis import strategies as st

from maxinstr.errors import TraceError
from maxinstr.traces import _sqlite_columns as cols
from maxinstr.traces import open_trace
from maxinstr.traces.inprocess import read_run
from maxinstr.traces.kineto import read_kineto
from maxinstr.traces.model import Trace
from maxinstr.traces.nsys import read_nsys

DATA = Path(__file__).resolve().parents[1] / "data"
NSYS = DATA / "nsys" / "h200_decode.sqlite"
NATIVE = cols.native_module() is not None
_WORK = Path(tempfile.mkdtemp(prefix="maxinstr-times-"))
atexit.register(shutil.rmtree, _WORK, True)

SETTINGS = dict(
    deadline=None,
    database=None,
    derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)


def canonical(trace: Trace) -> dict:
    """Every column of the three tables, names as strings (string ids depend on interning order)."""
    out = {}
    for table in ("ranges", "calls", "ops"):
        tab = getattr(trace, table)
        for f in fields(tab):
            col = getattr(tab, f.name)
            if f.name in ("name_id", "domain_id"):
                out[f"{table}.{f.name}"] = [trace.name(int(i)) for i in col]
            else:
                out[f"{table}.{f.name}"] = col.tolist()
    return out


def assert_same_rows(damaged: Trace, deleted: Trace) -> None:
    a, b = canonical(damaged), canonical(deleted)
    for key in a:
        assert a[key] == b[key], key


def new_notes(damaged: Trace, deleted: Trace) -> list[str]:
    return [n for n in damaged.notes if n not in deleted.notes]


def note_pattern(table: str, count: int, total: int, first: str, problem: str, unit: str = "rows") -> str:
    return (f"{re.escape(table)}: {count} of {total} {unit} dropped, their times are not valid "
            f"\\(first: {re.escape(first)}: {problem}\\)")


def check_error(exc: TraceError, path: Path, table: str) -> None:
    text = str(exc)
    assert "\n" not in text and text.startswith(f"{path}: ") and table in text and "invalid times" in text, text


# ---- SQLite: nsys (both backends), RPD ---------------------------------------------------------

# (value or SQL expression, the problem the note names; {col} is the damaged column)
SQL_DAMAGE = {
    "text": ("'abc'", "{col} missing or not an integer"),
    "empty text": ("''", "{col} missing or not an integer"),
    "digits then text": ("'12x'", "{col} missing or not an integer"),  # SQL's conversion: 12
    "float": ("1.5", "{col} missing or not an integer"),
    "null": ("NULL", "{col} missing or not an integer"),
    # end = start - 1000, or start = end + 1000
    "end before start": (None, "ends 1000 ns before it starts"),
    "beyond 2**62": (str(1 << 62), r"{col} beyond 2\*\*62 ns"),
}


def damage_sql(table: str, col: str, how: str, where: str) -> str:
    value, _ = SQL_DAMAGE[how]
    if how == "end before start":
        value = "start - 1000" if col == "end" else '"end" + 1000'
    return f'UPDATE "{table}" SET "{col}" = {value} WHERE {where}'


def copies(src: Path, name: str) -> tuple[Path, Path]:
    folder = _WORK / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    a, b = folder / "damaged.sqlite", folder / "deleted.sqlite"
    shutil.copyfile(src, a)
    shutil.copyfile(src, b)
    return a, b


def run_sql(path: Path, *statements: str) -> list:
    con = sqlite3.connect(path)
    try:
        out = [con.execute(s).fetchall() for s in statements]
        con.commit()
        return out
    except sqlite3.IntegrityError:  # NULL in a NOT NULL column: SQLite itself refuses that damage
        reject()
    finally:
        con.close()


_NVTX_RANGES = "eventType IN (59, 60, 70, 71)"  # push/pop and start/end ranges (NvtxPushPopRange...)
_NVTX_TIMED = "eventType IN (34, 59, 60, 65, 70, 71)"  # ranges and marks: the rows read as ranges
_LAUNCHES = ("correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL UNION "
             "SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY) AND eventClass != 67")

NSYS_TABLES = {
    # table: (rows whose times the reader uses, how the note names the table, row label)
    "CUPTI_ACTIVITY_KIND_KERNEL": ("1", "CUPTI_ACTIVITY_KIND_KERNEL", "rowid"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("1", "CUPTI_ACTIVITY_KIND_MEMCPY", "rowid"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (_LAUNCHES, "CUPTI_ACTIVITY_KIND_RUNTIME (launch calls)", "correlationId"),
    "NVTX_EVENTS": (_NVTX_TIMED, "NVTX_EVENTS", "rowid"),
}


@st.composite
def nsys_damage(draw):
    table = draw(st.sampled_from(sorted(NSYS_TABLES)))
    col = draw(st.sampled_from(["start", "end"]))
    how = draw(st.sampled_from(sorted(SQL_DAMAGE)))
    used, _, _ = NSYS_TABLES[table]
    if table == "NVTX_EVENTS":
        if col == "end" or how == "end before start":
            # a mark's end is not read (a mark is an instant); a range without an end never ended
            used = f'{_NVTX_RANGES} AND "end" IS NOT NULL'
        if col == "end" and how == "null":
            how = "text"  # a range's NULL end is no damage: the range never ended
    modulus = draw(st.sampled_from([1, 2, 3, 7, 50, 1000]))
    residue = draw(st.integers(0, modulus - 1))
    return table, col, how, f"({used}) AND rowid % {modulus} = {residue}"


@settings(max_examples=40, **SETTINGS)
@given(nsys_damage())
@example(("CUPTI_ACTIVITY_KIND_KERNEL", "start", "text", "1 AND rowid % 3 = 0"))  # the issue's two inputs
@example(("CUPTI_ACTIVITY_KIND_KERNEL", "end", "end before start", "1 AND rowid % 7 = 0"))
def test_nsys_damaged_times_read_as_deleted_rows(case):
    table, col, how, where = case
    damaged, deleted = copies(NSYS, "nsys")
    used, label, row_kind = NSYS_TABLES[table]
    key = "correlationId" if row_kind == "correlationId" else "NULL"
    hit, total = run_sql(damaged, f'SELECT rowid, {key} FROM "{table}" WHERE {where} ORDER BY rowid',
                         f'SELECT count(*) FROM "{table}" WHERE {used}')
    run_sql(damaged, damage_sql(table, col, how, where))
    run_sql(deleted, f'DELETE FROM "{table}" WHERE {where}')
    backends = ["python"] + (["native"] if NATIVE else [])
    if not hit:
        event("no row damaged")
        for backend in backends:
            assert_same_rows(read_nsys(damaged, backend=backend), read_nsys(deleted, backend=backend))
        return
    if len(hit) == total[0][0]:
        for backend in backends:
            with pytest.raises(TraceError) as info:
                read_nsys(damaged, backend=backend)
            check_error(info.value, damaged, label)
        event("every row damaged: error")
        return
    first = f"rowid {hit[0][0]}" if row_kind == "rowid" else f"correlationId {hit[0][1]}"
    problem = SQL_DAMAGE[how][1].format(col=col)
    for backend in backends:
        got, want = read_nsys(damaged, backend=backend), read_nsys(deleted, backend=backend)
        assert_same_rows(got, want)
        got.validate()
        notes = new_notes(got, want)
        event("some rows dropped")
        assert len(notes) == 1, notes
        assert re.fullmatch(note_pattern(label, len(hit), total[0][0], first, problem), notes[0]), notes[0]


def test_nsys_issue_inputs_report_real_times():
    """The issue's inputs, through the whole report: text in 1 of 3 kernel starts made the
    `request` GPU span 8.18 s (really 21 ms) and the GPU total 4,392 s; 1 of 7 kernels ending
    1 us before they start were summed as negative time. Now the report says which rows went, and
    no span or total exceeds the undamaged trace's."""
    from maxinstr.analyze.report import build_report

    clean = build_report(trace=NSYS)
    request = next(s for s in clean["stages"] if s["name"] == "request")
    for name, statement in (("text", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start='abc' WHERE rowid%3=0"),
                            ("negative", 'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end"=start-1000 WHERE rowid%7=0')):
        damaged, _ = copies(NSYS, name)
        run_sql(damaged, statement)
        r = build_report(trace=damaged)
        assert any(n.startswith("CUPTI_ACTIVITY_KIND_KERNEL: ") and "rows dropped" in n for n in r["sources"]["notes"])
        got = next(s for s in r["stages"] if s["name"] == "request")
        assert got["gpu_proj_ns"]["max"] <= request["gpu_proj_ns"]["max"]
        assert 0 < r["gpu"]["gpu_ns"] < clean["gpu"]["gpu_ns"]
        assert r["gpu"]["ops"] < clean["gpu"]["ops"]


RPD = DATA / "rocprof" / "rpd" / "matmul_result.rpd"
_RPD_OPS = ("opType_id IN (SELECT id FROM rocpd_string WHERE string IN ('KernelExecution', 'Task', 'FillBuffer') "
            "OR string LIKE 'Copy%' OR string LIKE 'Memset%')")  # the ops read (barriers are not)


@settings(max_examples=25, **SETTINGS)
@given(table=st.sampled_from(["rocpd_api", "rocpd_op"]), col=st.sampled_from(["start", "end"]),
       how=st.sampled_from(sorted(SQL_DAMAGE) + ["zero"]), modulus=st.sampled_from([1, 2, 5, 40]), data=st.data())
def test_rpd_damaged_times_read_as_deleted_rows(table, col, how, modulus, data):
    residue = data.draw(st.integers(0, modulus - 1))
    used = "1" if table == "rocpd_api" else _RPD_OPS
    where = f"({used}) AND rowid % {modulus} = {residue}"
    damaged, deleted = copies(RPD, "rpd")
    hit, total = run_sql(damaged, f'SELECT id FROM "{table}" WHERE {where} ORDER BY id',
                         f'SELECT count(*) FROM "{table}" WHERE {used}')
    if how == "zero":  # rpd_tracer's CLOCK_MONOTONIC never reads 0
        statement, problem = f'UPDATE "{table}" SET start = 0 WHERE {where}', "start 0 ns: this clock never reads 0 or less"
    else:
        statement, problem = damage_sql(table, col, how, where), SQL_DAMAGE[how][1].format(col=col)
    run_sql(damaged, statement)
    run_sql(deleted, f'DELETE FROM "{table}" WHERE {where}')
    if not hit:
        event("no row damaged")
        return
    if len(hit) == total[0][0]:
        with pytest.raises(TraceError) as info:
            open_trace(damaged)
        check_error(info.value, damaged, table)
        event("every row damaged: error")
        return
    got, want = open_trace(damaged), open_trace(deleted)
    assert_same_rows(got, want)
    notes = new_notes(got, want)
    event("some rows dropped")
    assert len(notes) == 1, notes
    assert re.fullmatch(note_pattern(table, len(hit), total[0][0], f"id {hit[0][0]}", problem), notes[0]), notes[0]


ROCPROF_V1 = DATA / "rocprof" / "rocprof_v1_kokkos" / "results.db"


@settings(max_examples=30, **SETTINGS)
@given(table=st.sampled_from(["OPS", "COPY", "HIP", "rocTX"]), col=st.sampled_from(["BeginNs", "EndNs"]),
       how=st.sampled_from(sorted(SQL_DAMAGE) + ["zero"]), modulus=st.sampled_from([1, 2, 5, 40]), data=st.data())
def test_rocprof_v1_damaged_times_read_as_deleted_rows(table, col, how, modulus, data):
    residue = data.draw(st.integers(0, modulus - 1))
    where = f"rowid % {modulus} = {residue}"
    damaged, deleted = copies(ROCPROF_V1, "rocprof_v1")
    hit, total = run_sql(damaged, f'SELECT rowid FROM "{table}" WHERE {where} ORDER BY rowid',
                         f'SELECT count(*) FROM "{table}"')
    if how == "zero":  # the HSA system clock never reads 0
        statement, problem = f'UPDATE "{table}" SET BeginNs = 0 WHERE {where}', "BeginNs 0 ns: this clock never reads 0 or less"
    elif how == "end before start":
        value = "BeginNs - 1000" if col == "EndNs" else "EndNs + 1000"
        statement, problem = f'UPDATE "{table}" SET "{col}" = {value} WHERE {where}', SQL_DAMAGE[how][1]
    else:
        statement = f'UPDATE "{table}" SET "{col}" = {SQL_DAMAGE[how][0]} WHERE {where}'
        problem = SQL_DAMAGE[how][1].format(col=col)
    run_sql(damaged, statement)
    run_sql(deleted, f'DELETE FROM "{table}" WHERE {where}')
    if not hit:
        event("no row damaged")
        return
    if len(hit) == total[0][0]:
        with pytest.raises(TraceError) as info:
            open_trace(damaged)
        check_error(info.value, damaged, table)
        event("every row damaged: error")
        return
    got, want = open_trace(damaged), open_trace(deleted)
    assert_same_rows(got, want)
    notes = new_notes(got, want)
    event("some rows dropped")
    assert len(notes) == 1, notes
    assert re.fullmatch(note_pattern(table, len(hit), total[0][0], f"row {hit[0][0]}", problem), notes[0]), notes[0]


# ---- Kineto ------------------------------------------------------------------------------------

KINETO = {name: json.loads(gzip.decompress((DATA / "kineto" / name).read_bytes()))
          for name in ("h200_decode.pt.trace.json.gz", "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz")}
CATEGORIES = ["user_annotation", "cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_user_annotation"]
_MISSING = object()
KINETO_DAMAGE = {
    # (field, value, problem); the issue's input is a negative dur
    "negative dur": ("dur", -5, r"ends 5000 ns before it starts"),
    "negative fractional dur": ("dur", -0.001, r"ends 1 ns before it starts"),
    "ts text": ("ts", "abc", "ts missing or not a number"),
    "ts numeric text": ("ts", "12.5", "ts missing or not a number"),
    "ts null": ("ts", None, "ts missing or not a number"),
    "ts true": ("ts", True, "ts missing or not a number"),
    "ts missing": ("ts", _MISSING, "ts missing or not a number"),
    "ts list": ("ts", [1], "ts missing or not a number"),
    "ts zero": ("ts", 0, "ts 0 ns: this clock never reads 0 or less"),
    "ts negative": ("ts", -1.5, "ts -1500 ns: this clock never reads 0 or less"),
    "ts huge": ("ts", 1e300, r"ts beyond 2\*\*62 ns"),
    "dur text": ("dur", "x", "dur missing or not a number"),
    "dur huge": ("dur", 1e300, r"dur beyond 2\*\*62 ns"),
}


@settings(max_examples=40, **SETTINGS)
@given(name=st.sampled_from(sorted(KINETO)), cat=st.sampled_from(CATEGORIES), how=st.sampled_from(sorted(KINETO_DAMAGE)),
       modulus=st.sampled_from([1, 2, 3, 10, 100]), data=st.data())
@example(name="h200_decode.pt.trace.json.gz", cat="kernel", how="negative dur", modulus=5, data=None)
def test_kineto_damaged_times_read_as_deleted_events(name, cat, how, modulus, data):
    residue = data.draw(st.integers(0, modulus - 1)) if data is not None else 0
    doc = copy.deepcopy(KINETO[name])
    events = doc["traceEvents"]
    ours = [i for i, e in enumerate(events) if e.get("ph") == "X" and e.get("cat") == cat]
    hit = ours[residue::modulus]
    key, value, problem = KINETO_DAMAGE[how]
    folder = _WORK / "kineto"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    deleted = dict(doc, traceEvents=[e for i, e in enumerate(events) if i not in set(hit)])
    for i in hit:
        if value is _MISSING:
            events[i].pop(key, None)
        else:
            events[i][key] = copy.deepcopy(value)
    damaged_path, deleted_path = folder / "damaged.json", folder / "deleted.json"
    damaged_path.write_text(json.dumps(doc))
    deleted_path.write_text(json.dumps(deleted))
    if not hit:
        event("no row damaged")
        return
    if len(hit) == len(ours):
        with pytest.raises(TraceError) as info:
            read_kineto(damaged_path)
        check_error(info.value, damaged_path, f"'{cat}' events")
        event("every row damaged: error")
        return
    got, want = read_kineto(damaged_path), read_kineto(deleted_path)
    assert_same_rows(got, want)
    if "gpu_annotations" in want.meta:
        a, b = got.meta["gpu_annotations"], want.meta["gpu_annotations"]
        assert a.start_ns.tolist() == b.start_ns.tolist() and a.end_ns.tolist() == b.end_ns.tolist()
    notes = new_notes(got, want)
    event("some rows dropped")
    assert len(notes) == 1, notes
    pattern = note_pattern(f"'{cat}' events", len(hit), len(ours), f"traceEvents[{hit[0]}]", problem, unit="events")
    assert re.fullmatch(pattern, notes[0]), notes[0]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, **SETTINGS)
@given(top=st.one_of(JSON, st.builds(lambda v: {"traceEvents": v}, JSON),
                     st.lists(JSON, min_size=1, max_size=4), st.builds(lambda v: {"traceEvents": v}, st.lists(JSON, min_size=1))))
@example(top=[1, 2, 3])  # the issue's input: AttributeError: 'int' object has no attribute 'get'
@example(top={"traceEvents": [{"ph": "X"}, 5]})
def test_kineto_top_level_of_any_shape_is_a_trace_or_one_line_error(top):
    path = _WORK / "shape.json"
    path.write_text(json.dumps(top))
    events = top if isinstance(top, list) else top.get("traceEvents") if isinstance(top, dict) else None
    try:
        trace = read_kineto(path)
    except TraceError as exc:
        text = str(exc)
        assert text.startswith(f"{path}: ") and "\n" not in text, text
        if isinstance(events, list) and any(not isinstance(e, dict) for e in events):
            assert "not a Kineto / Chrome trace: " in text and "not an event object" in text, text
        return
    assert isinstance(events, list) and all(isinstance(e, dict) for e in events)
    trace.validate()


# ---- rocprofv3 CSV -----------------------------------------------------------------------------

LLAMA = DATA / "rocprof" / "rocprofv3_llamacpp_decode"
CSV_DAMAGE = {
    "text": ("abc", "{col} missing or not an integer"),
    "empty": ("", "{col} missing or not an integer"),
    "fraction": ("1.5", "{col} missing or not an integer"),
    "zero": ("0", None),
    "end before start": (None, r"ends \d+ ns before it starts"),
}


@settings(max_examples=25, **SETTINGS)
@given(file=st.sampled_from(["decode_kernel_trace.csv", "decode_hip_api_trace.csv"]),
       col=st.sampled_from(["Start_Timestamp", "End_Timestamp"]), how=st.sampled_from(sorted(CSV_DAMAGE)),
       modulus=st.sampled_from([1, 2, 9, 100]), data=st.data())
def test_rocprof_csv_damaged_times_read_as_deleted_rows(file, col, how, modulus, data):
    residue = data.draw(st.integers(0, modulus - 1))
    with open(LLAMA / file, newline="") as fh:
        table = list(csv.reader(fh))
    header, body = table[0], table[1:]
    s, e = header.index("Start_Timestamp"), header.index("End_Timestamp")
    hit = list(range(residue, len(body), modulus))
    value, problem = CSV_DAMAGE[how]
    damaged = [list(r) for r in body]
    for i in hit:
        if how == "end before start":
            damaged[i][e] = str(int(damaged[i][s]) - 1000)
        else:
            damaged[i][header.index(col)] = value
    if how == "zero":
        problem = "Start_Timestamp 0 ns: this clock never reads 0 or less" if col == "Start_Timestamp" else \
            r"ends \d+ ns before it starts"
    if how == "end before start":
        problem = r"ends 1000 ns before it starts"
    for name, rows in (("damaged", damaged), ("deleted", [r for i, r in enumerate(body) if i not in set(hit)])):
        folder = _WORK / "csv" / name
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(LLAMA, folder)
        with open(folder / file, "w", newline="") as fh:
            csv.writer(fh, quoting=csv.QUOTE_ALL).writerows([header, *rows])
    damaged_dir, deleted_dir = _WORK / "csv" / "damaged", _WORK / "csv" / "deleted"
    if len(hit) == len(body):
        with pytest.raises(TraceError) as info:
            open_trace(damaged_dir)
        check_error(info.value, damaged_dir, file)
        event("every row damaged: error")
        return
    got, want = open_trace(damaged_dir), open_trace(deleted_dir)
    assert_same_rows(got, want)
    notes = new_notes(got, want)
    event("some rows dropped")
    assert len(notes) == 1, notes
    assert re.fullmatch(note_pattern(file, len(hit), len(body), f"row {hit[0] + 1}", problem.format(col=col)), notes[0]), notes[0]


# ---- in-process activity (a kernels=True run) --------------------------------------------------

BLOCK = DATA / "max" / "block_kernels"


@settings(max_examples=12, **SETTINGS)
@given(what=st.sampled_from(["GPU ops", "API calls"]), modulus=st.sampled_from([1, 3, 50]), data=st.data())
def test_inprocess_ops_ending_before_they_start_read_as_deleted_rows(what, modulus, data):
    from maxinstr.rundir.activity import ACTIVITY_DTYPE, KIND_DRIVER, KIND_MEMSET, KIND_RUNTIME

    residue = data.draw(st.integers(0, modulus - 1))
    (part,) = (BLOCK / "parts").iterdir()
    rows = np.fromfile(part / "activity.bin", dtype=ACTIVITY_DTYPE)
    kind = rows["kind"]
    if what == "GPU ops":
        sel = np.flatnonzero((kind <= KIND_MEMSET) & (rows["start_ns"] > 0) & (rows["end_ns"] > 0))
    else:
        sel = np.flatnonzero((kind == KIND_RUNTIME) | (kind == KIND_DRIVER))
    hit = sel[residue::modulus]
    damaged = rows.copy()
    damaged["end_ns"][hit] = damaged["start_ns"][hit] - 1000
    runs = {}
    for name, data_rows in (("damaged", damaged), ("deleted", np.delete(rows, hit))):
        folder = _WORK / "inprocess" / name
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(BLOCK, folder)
        data_rows.tofile(folder / "parts" / part.name / "activity.bin")
        runs[name] = folder
    got, notes = read_run(runs["damaged"])
    want, want_notes = read_run(runs["deleted"])
    label = f"part {part.name}: activity.bin {what}"
    if len(hit) == len(sel):
        # the part's kernels are left out, said (the run's other parts would still be read)
        assert got is None
        assert any(f"{label}: all {len(hit)} rows have invalid times" in n for n in notes), notes
        return
    assert got is not None and want is not None
    assert_same_rows(got, want)
    added = [n for n in notes if n not in want_notes]
    assert len(added) == 1, added
    assert re.fullmatch(note_pattern(label, len(hit), len(sel), f"row {hit[0]}", r"ends 1000 ns before it starts"), added[0])


def test_a_whole_float_beyond_int64_is_no_time(tmp_path):
    """A time column that pandas reads as floats, one of them whole but beyond int64 (1.5e73, from
    the readers' fuzz test): that row is dropped and said, like any time that is no integer; it
    used to stop the read with an OverflowError."""
    real = Path(__file__).resolve().parents[1] / "data" / "rocprof" / "rocprofv3_llamacpp_decode"
    rows = list(csv.reader(open(real / "decode_kernel_trace.csv", newline="")))
    header, body = rows[0], rows[1:6]
    body[0][header.index("Start_Timestamp")] = "1.5e73"
    with open(tmp_path / "decode_kernel_trace.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([header, *body])
    trace = open_trace(tmp_path / "decode_kernel_trace.csv")
    assert len(trace.ops) == 4
    assert any("1 of 5 rows dropped" in n and "Start_Timestamp missing or not an integer" in n for n in trace.notes)
