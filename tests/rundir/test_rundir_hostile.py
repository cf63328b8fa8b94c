"""Run directories that are not what maxinstr wrote (issue 20, class 8): ``load`` and the
report give a Run (with notes) or a one-line RunDirError naming the file; they never hang, grow
without bound, or raise anything else.

- any file of a run replaced by a FIFO, a link to /dev/zero, a directory, a dangling or
  looping link (property test; each load runs in a thread that must finish);
- a stages.bin shorter than its closed part.json says (a note, not silence);
- meta.json holding odd JSON in any field (deep nesting, huge numbers, wrong types): the whole
  report and its views, or a RunDirError naming meta.json (property test);
- stage times that would make a duration overflow int64 are a damaged file, not -20 ns;
- the kernels=True files (activity.json, activity.bin, activity_names.jsonl) read the same way:
  special files, odd JSON, ids that would size memory; a part whose activity cannot be read
  loses its kernels with a note naming the file, the rest of the run is reported;
- any JSON value of any file of a real kernels=True run replaced by an odd one (huge, negative,
  float, 1e400, wrong type, deep): the report, or a RunDirError naming that file (property test);
- ids of strings.jsonl / attrs.jsonl and part folder names that are not ints of their column;
- damage to some rows or lines of a file (random rows in stages.bin or activity.bin, a line that
  is not JSON, an id out of its column's range) skips them, counted in one note per file naming
  the first one and why; every other record is read (copies of real runs in tests/data, the
  damage a new user made; docs/formats.md "Reading rules")."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxinstr.analyze.report import build_report
from maxinstr.errors import RunDirError, TraceError
from maxinstr.render import html as rhtml
from maxinstr.render import json as rjson
from maxinstr.render import markdown, text
from maxinstr.rundir import format as fmt
from maxinstr.rundir import load
from maxinstr.traces import open_trace

META = {"format": "maxinstr-run", "version": 1, "status": "closed", "warmup": 1, "command": ["python", "x.py"],
        "pid": 7, "session": {"pid": 7, "start_ns": 1000, "end_ns": 10**9}, "user": {"dtype": "bf16"},
        "gpus": [{"index": 0, "name": "H200"}], "env": {"CUDA_VISIBLE_DEVICES": "0"}}


def _rows(n: int = 6, start_ns: int = 1_000_000) -> np.ndarray:
    r = np.zeros(n, dtype=fmt.STAGE_DTYPE)
    r["id"] = (7 << 32) | np.arange(1, n + 1)
    r["parent_id"] = -1
    r["host_start_ns"] = start_ns + np.arange(n) * 10_000
    r["host_end_ns"] = r["host_start_ns"] + 5_000
    r["gpu_start_ns"] = r["gpu_end_ns"] = -1
    r["step"] = np.arange(n)
    return r


def _write_run(root: Path, meta: bytes | None = None, rows: np.ndarray | None = None, part: dict | None = None) -> Path:
    pdir = root / "parts" / "p7"
    pdir.mkdir(parents=True, exist_ok=True)
    rows = _rows() if rows is None else rows
    (root / "meta.json").write_bytes(json.dumps(META).encode() if meta is None else meta)
    (pdir / "stages.bin").write_bytes(rows.tobytes())
    (pdir / "strings.jsonl").write_text('{"id": 0, "s": "decode"}\n')
    (pdir / "attrs.jsonl").write_text(f'{{"id": {int(rows["id"][0]) if len(rows) else 1}, "attrs": {{"k": 1}}}}\n')
    (pdir / "events.jsonl").write_text('{"time_ns": 1, "kind": "warning", "message": "m"}\n')
    info = {"pid": 7, "status": "closed", "rows_written": len(rows)} if part is None else part
    (pdir / "part.json").write_text(json.dumps(info))
    (pdir / "samples.json").write_text("{}")
    return root


def _within(root: Path, work):
    """``work()`` in a thread that must finish (a hang fails instead of blocking); its result,
    or the RunDirError it raised (one line, naming a file of ``root``). Anything else fails."""
    box: dict = {}

    def run():
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - judged below
            box["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "load() did not finish (hung on a special file?)"
    exc = box.get("exc")
    if exc is not None:
        assert isinstance(exc, RunDirError), repr(exc)
        assert "\n" not in str(exc) and str(exc).startswith(str(root)), str(exc)
    return box.get("value"), exc


def _report(root: Path):
    """The report of ``root`` in every view."""
    r = build_report(run=load(root))
    text.render(r)
    markdown.render(r)
    rjson.render(r)
    rhtml.render(r)
    return r


def _outcome(root: Path, *, report: bool = False):
    """Run load (and the report) in a thread that must finish: a hang fails instead of blocking."""
    def work():
        run = load(root)
        if report:
            _report(root)
        return run

    return _within(root, work)


# a real kernels=True run (tests/data/PROVENANCE-extra.md, max/block_kernels): every file a part has
KRUN = Path(__file__).resolve().parents[1] / "data" / "max" / "block_kernels"
KPART = "parts/p1537"
ACTIVITY_FILES = [f"{KPART}/activity.json", f"{KPART}/activity.bin", f"{KPART}/activity_names.jsonl"]
FILES = ["meta.json"] + [f"{KPART}/{f}" for f in ("part.json", "stages.bin", "strings.jsonl", "attrs.jsonl", "events.jsonl",
                                                  "samples.json", "samples.bin")] + ACTIVITY_FILES
KINDS = ["fifo", "dev_zero", "directory", "dangling", "loop"]
_ROOT = Path(tempfile.mkdtemp(prefix="maxinstr-hostile-"))


def _replace(path: Path, kind: str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling":
        path.symlink_to(path.parent / "nothing-here")
    else:
        path.symlink_to(path)


def _stage_rows(report) -> list[tuple[str, int]]:
    return [(row["name"], row["instances"]) for row in report["stages"]]


@functools.cache
def _seed_report() -> dict:
    return build_report(run=load(KRUN))


def _kernels_left_out_naming(root: Path, path: Path) -> None:
    """The report of ``root`` says that one part's kernels were not read, naming ``path``; every
    stage is still reported; ``open_trace(root)`` (``--trace RUN``, deep-dive) is a one-line
    TraceError naming ``path``."""
    report, exc = _within(root, lambda: _report(root))
    assert exc is None, exc
    said = [n for n in report["sources"]["notes"] if f"in-process kernels not read: {path}: " in n]
    assert said, report["sources"]["notes"]
    assert report["sources"]["trace_format"] is None and _stage_rows(report) == _stage_rows(_seed_report())

    def trace_error() -> str:
        try:
            open_trace(root)
        except TraceError as e:
            return str(e)
        raise AssertionError("open_trace read a run whose only part's activity is unreadable")

    message, exc = _within(root, trace_error)
    assert exc is None and "\n" not in message and f"{path}: " in message, (exc, message)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(which=st.sampled_from(FILES), kind=st.sampled_from(KINDS))
def test_a_special_file_anywhere_is_an_error_naming_it_never_a_hang(which, kind):
    root = _ROOT / "special"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(KRUN, root)
    _replace(root / which, kind)
    if which in ACTIVITY_FILES:
        _kernels_left_out_naming(root, root / which)
        return
    run, exc = _outcome(root)
    if which.endswith(("samples.bin", "samples.json")):
        # samples are optional: a part's unreadable samples are a note
        assert exc is None and any(which.split("/")[-1] in n or "samples" in n for n in run.notes), run.notes
    elif which.endswith("part.json"):
        # part.json only describes its part: read as missing, said naming it (issue 29, point 8)
        assert exc is None and any(n.startswith(f"{root / which}: ") for n in run.notes), run.notes
    else:
        assert exc is not None and str(exc).startswith(str(root / which)), (which, kind, exc)


def test_a_stages_bin_shorter_than_its_closed_part_says_is_noted(tmp_path):
    root = _write_run(tmp_path / "run", part={"pid": 7, "status": "closed", "rows_written": 10})
    run, _ = _outcome(root)
    assert len(run) == 6
    assert any("4 of the 10 stage record(s) part.json says were written are missing" in n for n in run.notes), run.notes
    # a part still running (killed) has a stale count: nothing to compare
    root = _write_run(tmp_path / "running", part={"pid": 7, "status": "running", "rows_written": 10})
    assert not any("part.json says were written" in n for n in _outcome(root)[0].notes)


def _deep(n: int) -> str:
    return "[" * n + "]" * n


ODD = st.one_of(
    st.sampled_from([None, True, -1, 0, 1.5, 1e308, -1e308, "", "x", [], {}, [1, "a"], {"a": None}, [[[]]]]),
    st.builds(lambda: 10**4000), st.builds(lambda: -(10**300)), st.integers(min_value=2**62, max_value=2**70),
    st.recursive(st.integers(), lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=3), c, max_size=2),
                 max_leaves=6),
)
KEYS = sorted(set(META) | {"warmup", "status", "steady_state", "profiler", "frameworks", "git", "argv", "requested_path",
                           "capture", "nested_sessions", "kernels", "clock", "driver", "cuda", "host", "python"})


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(changes=st.dictionaries(st.sampled_from(KEYS), ODD, min_size=1, max_size=3))
def test_odd_json_in_meta_is_a_report_or_an_error_naming_meta_json(changes):
    root = _ROOT / "meta"
    shutil.rmtree(root, ignore_errors=True)
    meta = {**META, **changes}
    _write_run(root, meta=json.dumps(meta).encode())
    run, exc = _outcome(root, report=True)
    if exc is not None:
        assert str(exc).startswith(str(root / "meta.json")), str(exc)


@pytest.mark.parametrize("doc", [_deep(100_000), _deep(70), '{"format": "maxinstr-run", "version": 1, "warmup": '
                                 + "9" * 5000 + "}"])
def test_deep_or_huge_json_is_an_error_naming_the_file(tmp_path, doc):
    root = _write_run(tmp_path / "run", meta=doc.encode())
    run, exc = _outcome(root)
    assert exc is not None and str(exc).startswith(str(root / "meta.json"))
    other = _write_run(tmp_path / "bad-part.json")
    (other / "parts" / "p7" / "part.json").write_text(_deep(100_000))
    run, exc = _outcome(other)
    # part.json only describes its part: read as missing, said (issue 29, point 8)
    assert exc is None and len(run) == 6
    assert any(n.startswith(f"{other / 'parts' / 'p7' / 'part.json'}: not valid JSON (nested too deeply)") for n in run.notes)
    # one line of a JSON lines file is that line only: skipped and said
    for deep, why in ((_deep(100_000), "not JSON (nested too deeply)"),
                      (_deep(70), "nested deeper than 64 levels: not a file maxinstr wrote")):
        other = _write_run(tmp_path / f"bad-attrs-{len(deep)}")
        path = other / "parts" / "p7" / "attrs.jsonl"
        with open(path, "a") as f:
            f.write(deep + "\n")
        run, exc = _outcome(other)
        assert exc is None and len(run) == 6 and run.attrs == {int(run["id"][0]): {"k": 1}}
        assert f"{path}: skipped 1 of 2 line(s) (first: line 2, {why}); those records' attrs are not shown" in run.notes


@pytest.mark.parametrize("col, value", [("host_start_ns", -(2**63) + 10), ("host_end_ns", 2**63 - 10),
                                        ("host_start_ns", -5)])
def test_times_that_would_overflow_a_duration_are_a_damaged_row(tmp_path, col, value):
    """Such a row is not a stage record: skipped and said, never a negative duration; the others
    are read (the whole file is an error only when no row is a stage record)."""
    rows = _rows()
    rows[col][2] = value
    if col == "host_start_ns":
        rows["host_end_ns"][2] = 2**63 - 10 if value < -10 else rows["host_end_ns"][2]
    root = _write_run(tmp_path / "run", rows=rows)
    run, exc = _outcome(root, report=True)
    assert exc is None and run["id"].tolist() == np.delete(rows["id"], 2).tolist()
    assert (run["host_end_ns"] - run["host_start_ns"] >= 0).all()
    assert [n for n in run.notes if "stages.bin" in n] == [f"{root / 'parts/p7/stages.bin'}: skipped 1 of 6 row(s) that are not stage records (first: row 2, "
                         "a host time outside [0, 2**62) ns)"]
    rows[col][:] = value  # every row: not a stages.bin
    root = _write_run(tmp_path / "all", rows=rows)
    _, exc = _outcome(root)
    assert exc is not None and str(exc).startswith(f"{root / 'parts/p7/stages.bin'}: none of its 6 row(s) is a stage record")


def test_durations_near_the_bound_are_exact(tmp_path):
    rows = _rows(start_ns=2**62 - 10**9)
    rows["host_start_ns"][0] = 0
    root = _write_run(tmp_path / "run", rows=rows)
    run, exc = _outcome(root, report=True)
    assert exc is None
    assert (run["host_end_ns"] - run["host_start_ns"] >= 0).all()
    assert (run["host_end_ns"] - run["host_start_ns"] == 5_000).all()
    # a 146-year stage is far outside the part's window (docs/formats.md): skipped, said, never a wrapped duration
    assert rows["id"][0] not in run["id"] and len(run) == len(rows) - 1
    assert any("(first: row 0, a host time more than 24 h outside the part's window)" in n for n in run.notes), run.notes


# ---------------------------------------------------------------- odd JSON in any file of a real run
# (its events.jsonl is empty: no real run in tests/data has events)
JSON_FILES = ["meta.json"] + [f"{KPART}/{f}" for f in ("part.json", "samples.json", "activity.json", "strings.jsonl",
                                                      "attrs.jsonl", "activity_names.jsonl")]
# JSON texts of values a reader must not turn into an int, an index or a size unchecked
RAW_ODD = st.one_of(
    st.sampled_from(["1e400", "-1e400", "NaN", "1.5", "-5", "-1", "0", "1e2", str(2**31), str(2**62), str(2**63),
                     str(2**70), "300000000", "100000000000", "null", "true", '"x"', '"12"', "[1]", "[]", "{}",
                     "[[[]]]", _deep(100), "9" * 5000]),
    ODD.map(json.dumps),
)


def _leaf_paths(doc, path=()):
    """Where the values of ``doc`` are (every leaf, and every list or object as a whole)."""
    if path:
        yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaf_paths(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaf_paths(v, (*path, i))


def _with_raw(doc, path, raw: str) -> str:
    """``doc`` as JSON text with the value at ``path`` replaced by the JSON text ``raw``."""
    marker = "\x00odd\x00"
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = marker
    return json.dumps(doc).replace(json.dumps(marker), raw)


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(which=st.sampled_from(JSON_FILES), line=st.integers(0, 10**6), where=st.integers(0, 10**6), raw=RAW_ODD)
def test_an_odd_value_anywhere_in_a_real_run_is_a_report_or_an_error_naming_its_file(which, line, where, raw):
    """Any JSON value of any file of a real kernels=True run replaced by an odd one: the report
    in every view, or a one-line RunDirError naming that file; in an activity file, the part's
    kernels left out with a note naming it and every stage still reported."""
    root = _ROOT / "odd"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(KRUN, root)
    path = root / which
    if which.endswith(".jsonl"):
        lines = path.read_text().splitlines()
        k = line % len(lines)
        doc = json.loads(lines[k])
        paths = list(_leaf_paths(doc))
        lines[k] = _with_raw(doc, paths[where % len(paths)], raw)
        path.write_text("\n".join(lines) + "\n")
    else:
        doc = json.loads(path.read_text())
        paths = list(_leaf_paths(doc))
        path.write_text(_with_raw(doc, paths[where % len(paths)], raw))
    report, exc = _within(root, lambda: _report(root))
    if exc is not None:
        assert which not in ACTIVITY_FILES and not which.endswith(".jsonl") and str(exc).startswith(f"{path}: "), str(exc)
    elif which in ACTIVITY_FILES:
        assert _stage_rows(report) == _stage_rows(_seed_report())
    if which.endswith(".jsonl"):
        # one line changed: it is read or skipped, never the file refused. Skipped, it is that
        # line, or the other line naming the id it now names (the first name of an id is kept)
        assert exc is None
        said = [n for n in report["sources"]["notes"] if n.startswith(f"{path}: ")]
        assert len(said) <= 1, said
        if said and "skipped" in said[0]:
            assert said[0].startswith(f"{path}: skipped 1 of {len(lines)} line(s) (first: line "), said


def test_a_kernel_name_id_never_sizes_memory(tmp_path):
    """activity_names.jsonl ids index the names: an id past the number of lines is a skipped
    line (counted, the first quoted), not a list that long (a 17-byte file holding [300000000,
    "k"] took 84 s and 5.8 GB; 1e11 grew without bound). Peak memory stays a small multiple of
    the files' size."""
    import tracemalloc

    from maxinstr.rundir.activity import read_part_activity

    pdir = tmp_path / "p"
    pdir.mkdir()
    (pdir / "activity.json").write_text('{"format":"maxinstr-activity","version":1,"status":"closed"}')
    (pdir / "activity.bin").write_bytes(b"")
    shape = 'not [id, "name"] with an id from 0 to 0 (one line per id)'
    for line, said in (
        ('[1000000,"k"]', f"skipped 1 of 1 line(s) (first: line 1, {shape}: [1000000, \"k\"])"),
        ('[10000000,"k"]', f"skipped 1 of 1 line(s) (first: line 1, {shape}: [10000000, \"k\"])"),
        ('[1,"k"]', f"skipped 1 of 1 line(s) (first: line 1, {shape}: [1, \"k\"])"),
        ('[-5,"k"]', f"skipped 1 of 1 line(s) (first: line 1, {shape}: [-5, \"k\"])"),
        ('[1e400,"k"]', f"skipped 1 of 1 line(s) (first: line 1, {shape}: [Infinity, \"k\"])"),
        ('[1.0,"k"]', f"skipped 1 of 1 line(s) (first: line 1, {shape}: [1.0, \"k\"])"),
        ('[true,"k"]', f"skipped 1 of 1 line(s) (first: line 1, {shape}: [true, \"k\"])"),
        ('["0","k"]', f"skipped 1 of 1 line(s) (first: line 1, {shape}: [\"0\", \"k\"])"),
        ('[0,5]', f"skipped 1 of 1 line(s) (first: line 1, {shape}: [0, 5])"),
        ('[0]', f"skipped 1 of 1 line(s) (first: line 1, {shape}: [0])"),
        ('{"0":"k"}', f"skipped 1 of 1 line(s) (first: line 1, {shape}: {{\"0\": \"k\"}})"),
        ('[0,"a"]\n[0,"b"]\n[5,"c"]', 'skipped 2 of 3 line(s) (first: line 2, id 0 was named "a" before: [0, "b"])'),
    ):
        (pdir / "activity_names.jsonl").write_text(line + "\n")
        tracemalloc.start()
        try:
            meta, rows, names = read_part_activity(pdir)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 256 * 1024, (line, peak)
        assert len(names) == line.count("\n") + 1 and names[-1] == "<name %d missing in p>" % (len(names) - 1)
        note = f"{pdir / 'activity_names.jsonl'}: {said}; the kernels and API calls of a skipped name show as " \
               "<name N missing in p>"
        assert meta["notes"] == [note], (line, meta["notes"])
    (pdir / "activity_names.jsonl").write_text('[1,"b"]\n[0,"a"]\n')  # any order: each id once, below the count
    assert read_part_activity(pdir)[2] == ["a", "b"]


@pytest.mark.parametrize("doc", [
    _deep(100_000),
    '{"format":"maxinstr-activity","version":[1],"status":"closed"}',
    '{"format":"maxinstr-activity","version":null,"status":"closed"}',
    '{"format":"maxinstr-activity","version":1e400,"status":"closed"}',
    '{"format":"maxinstr-activity","version":"1","status":"closed"}',
    '{"format":"maxinstr-activity","version":2,"status":"closed"}',
    '{"format":"maxinstr-activity","version":1,"clock_pairs":[[1e400,1]]}',
    '{"format":"maxinstr-activity","version":1,"clock_pairs":[[1,2,3]]}',
    '{"format":"maxinstr-activity","version":1,"dropped_cupti":1e400}',
    '{"format":"maxinstr-activity","version":1,"external_kind":[5]}',
    '{"format":"maxinstr-activity","version":1,"notes":5}',
])
def test_odd_activity_json_leaves_out_the_kernels_naming_it(tmp_path, doc):
    """The audit's cases (RecursionError, TypeError, OverflowError before): `maxinstr report RUN`
    still reports every stage and says, naming activity.json, why the kernels are missing."""
    root = tmp_path / "run"
    shutil.copytree(KRUN, root)
    (root / KPART / "activity.json").write_text(doc)
    _kernels_left_out_naming(root, root / KPART / "activity.json")


def test_the_audit_reproduction_through_the_command(tmp_path, capsys):
    """`maxinstr report RUN` with the audit's three files (the id 10**6 rather than 3*10**8: the
    same class, and a return of the bug would cost 8 MB here, not 5.8 GB)."""
    from maxinstr.cli import main

    root = tmp_path / "run"
    shutil.copytree(KRUN, root)
    pdir = root / KPART
    (pdir / "activity.json").write_text('{"format":"maxinstr-activity","version":1,"status":"closed"}')
    (pdir / "activity.bin").write_bytes(b"")
    names = pdir / "activity_names.jsonl"
    for text_, said in (('[1000000,"k"]\n', f"{names}: skipped 1 of 1 line(s) (first: line 1, not [id, \"name\"]"),
                        ('[1000000,"k"]', f"{names}: ignored a torn last line")):  # no newline: cut by a kill
        names.write_text(text_)
        assert main(["report", str(root), "--format", "json", "--quiet"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert any(said in n for n in report["sources"]["notes"]), report["sources"]["notes"]
        assert _stage_rows(report) == _stage_rows(_seed_report())


@pytest.mark.parametrize("file, line", [
    ("strings.jsonl", '{"id": 1e400, "s": "x"}'), ("strings.jsonl", '{"id": -1e400, "s": "x"}'),
    ("strings.jsonl", '{"id": 1.5, "s": "x"}'), ("strings.jsonl", '{"id": -5, "s": "x"}'),
    ("strings.jsonl", f'{{"id": {2**31}, "s": "x"}}'), ("strings.jsonl", '{"id": "3", "s": "x"}'),
    ("strings.jsonl", '{"id": true, "s": "x"}'), ("strings.jsonl", '{"id": NaN, "s": "x"}'),
    ("attrs.jsonl", '{"id": 1e400, "attrs": {}}'), ("attrs.jsonl", f'{{"id": {2**63}, "attrs": {{}}}}'),
    ("attrs.jsonl", f'{{"id": {-(2**63) - 1}, "attrs": {{}}}}'), ("attrs.jsonl", '{"id": 2.0, "attrs": {}}'),
    ("attrs.jsonl", '{"id": null, "attrs": {}}'), ("attrs.jsonl", '{"id": 1, "attrs": [["k", 1]]}'),
])
def test_an_id_that_is_not_an_int_of_its_column_is_a_skipped_line(tmp_path, file, line):
    """`echo '{"id": 1e400, "s": "x"}' >> RUN/parts/pN/strings.jsonl` raised OverflowError, then
    refused the whole run: now that line is skipped, with its number, and only it is lost."""
    root = tmp_path / "run"
    shutil.copytree(KRUN, root)
    path = root / KPART / file
    before = len(path.read_text().splitlines())
    with open(path, "a") as f:
        f.write(line + "\n")
    run, exc = _outcome(root, report=True)
    seed = load(KRUN)
    assert exc is None and run.attrs == seed.attrs and run["name"].tolist() == seed["name"].tolist()
    said = [n for n in run.notes if n.startswith(f"{path}: ")]
    shape = '{"id": int in [0, 2**31), "s": str}' if file == "strings.jsonl" else '{"id": int64, "attrs": {...}}'
    assert len(said) == 1 and said[0].startswith(f"{path}: skipped 1 of {before + 1} line(s) (first: line {before + 1}, "
                                                 f"not {shape}: "), said


@pytest.mark.parametrize("folder, pid, rank", [("p99999999999999999999", -1, -1), ("r99999999999999.p7", 7, -1),
                                              ("p\u00b2", -1, -1), ("r\u0663.p7", 7, -1), ("p-5", -1, -1),
                                              ("r3.p", -1, 3)])
def test_a_part_folder_name_that_is_no_pid_is_no_pid(tmp_path, folder, pid, rank):
    """A part.json without pid/rank falls back on the folder name: a number too big for the
    pid/rank columns (OverflowError before) or digits int() refuses ("²": ValueError) name none."""
    root = tmp_path / "run"
    shutil.copytree(KRUN, root)
    part = json.loads((root / KPART / "part.json").read_text())
    del part["pid"], part["rank"]
    (root / KPART / "part.json").write_text(json.dumps(part))
    (root / KPART).rename(root / "parts" / folder)
    run, exc = _outcome(root, report=True)
    assert exc is None and len(run) == len(load(KRUN))
    assert (run["pid"] == pid).all() and (run["rank"] == rank).all()


@pytest.mark.parametrize("local_rank, world_size, shown", [(-1, 8, (-1, 8)), (1e400, "x", (None, None)),
                                                           (2**70, [1], (None, None)), (True, None, (None, None))])
def test_environment_fields_of_part_json_are_shown_not_trusted(tmp_path, local_rank, world_size, shown):
    """local_rank / world_size come from the program's environment (LOCAL_RANK=-1 is legal there):
    never an error that would lose the run; one that is no int32 reads as none."""
    root = tmp_path / "run"
    shutil.copytree(KRUN, root)
    part = json.loads((root / KPART / "part.json").read_text())
    part.update(local_rank=local_rank, world_size=world_size)
    (root / KPART / "part.json").write_text(json.dumps(part))
    run, exc = _outcome(root, report=True)
    assert exc is None and (run.parts[0]["local_rank"], run.parts[0]["world_size"]) == shown


# ---------------------------------------------------------------- damage to some rows or lines of a real run
# What a new user did to copies of good run directories, each refused whole before (exit 2, the
# other records unseen): now the damaged rows or lines are skipped, counted and said in one note
# per file; everything else is read (docs/formats.md "Reading rules").
KVRUN = Path(__file__).resolve().parents[1] / "data" / "nsys" / "h200_kvcache-run"
REAL_RUNS = {"block_kernels": (KRUN, KPART), "h200_kvcache": (KVRUN, "parts/p2512")}


@pytest.fixture(params=sorted(REAL_RUNS))
def real_run(request, tmp_path):
    """(a copy of a real run directory, its part folder in the copy, the original's Run)."""
    seed, part = REAL_RUNS[request.param]
    root = tmp_path / request.param
    shutil.copytree(seed, root)
    return root, root / part, load(seed)


def _cli_notes(root: Path, capsys) -> list[str]:
    """`maxinstr report RUN --format json`: exit 0, and the report's notes."""
    from maxinstr.cli import main

    assert main(["report", str(root), "--format", "json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)["sources"]["notes"]


def test_random_rows_in_stages_bin_are_skipped_and_counted(real_run, capsys):
    root, pdir, seed = real_run
    path = pdir / "stages.bin"
    data = bytearray(path.read_bytes())
    rows = np.frombuffer(bytes(data), fmt.STAGE_DTYPE)
    rng = np.random.default_rng(20)
    for row in (5, 40):
        data[row * 72:(row + 1) * 72] = rng.integers(0, 256, 72, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))
    flags = int(np.frombuffer(bytes(data), fmt.STAGE_DTYPE)["flags"][5])
    assert flags & ~fmt.KNOWN_FLAGS  # this seed's row 5 has flag bits no maxinstr writes
    run, exc = _outcome(root, report=True)
    assert exc is None
    kept = np.delete(rows, [5, 40])
    assert sorted(run["id"].tolist()) == sorted(kept["id"].tolist())  # every other record, once
    by_id = dict(zip(seed["id"].tolist(), seed["name"].tolist(), strict=True))
    assert all(by_id[i] == n for i, n in zip(run["id"].tolist(), run["name"].tolist(), strict=True))
    assert run.attrs == seed.attrs
    said = (f"{path}: skipped 2 of {len(rows)} row(s) that are not stage records (first: row 5, flags 0x{flags:04x} has "
            "bits maxinstr does not write)")
    assert [n for n in run.notes if n.startswith(f"{path}: ")] == [said]
    assert said in _cli_notes(root, capsys)


def test_a_garbage_line_in_events_jsonl_is_skipped(real_run, capsys):
    """`printf 'garbage\\n' >> parts/*/events.jsonl`: only the warnings log, never the run."""
    root, pdir, seed = real_run
    path = pdir / "events.jsonl"
    with open(path, "ab") as f:
        f.write(b"garbage\n")
    run, exc = _outcome(root, report=True)
    assert exc is None and run["id"].tolist() == seed["id"].tolist() and run.events == seed.events
    said = f"{path}: skipped 1 of 1 line(s) (first: line 1, not JSON (Expecting value: line 1 column 1 (char 0)))"
    assert [n for n in run.notes if n.startswith(f"{path}: ")] == [said]
    assert said in _cli_notes(root, capsys)


@pytest.mark.parametrize("file, line, shape", [
    ("strings.jsonl", '{"id": 99999999999999999999999, "s": "x"}', '{"id": int in [0, 2**31), "s": str}'),
    ("attrs.jsonl", '{"id": 99999999999999999999999, "attrs": {"k": 1}}', '{"id": int64, "attrs": {...}}'),
])
def test_a_huge_id_appended_is_a_skipped_line_with_its_number(real_run, capsys, file, line, shape):
    """A line with a huge id appended to strings.jsonl or attrs.jsonl: that line is skipped and the
    note says which (the old error gave no line number); nothing else is lost, and the id sizes
    nothing: loading takes no more memory than loading the undamaged copy."""
    import tracemalloc

    root, pdir, seed = real_run
    path = pdir / file
    before = len([x for x in path.read_text().splitlines() if x.strip()])
    load(root)  # warm: imports and caches are not the damage's memory
    tracemalloc.start()
    load(root)
    clean_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    with open(path, "a") as f:
        f.write(line + "\n")
    tracemalloc.start()
    try:
        run, exc = _outcome(root)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc is None and peak < clean_peak + 64 * 1024, (peak, clean_peak)
    assert run["name"].tolist() == seed["name"].tolist() and run.attrs == seed.attrs
    said = (f"{path}: skipped 1 of {before + 1} line(s) (first: line {before + 1}, not {shape}: {line})"
            + ("; those records' attrs are not shown" if file == "attrs.jsonl" else ""))
    assert [n for n in run.notes if n.startswith(f"{path}: ")] == [said]
    assert said in _cli_notes(root, capsys)


def test_a_stage_whose_name_line_is_damaged_reads_as_a_placeholder(real_run):
    """The strings.jsonl line of a used name id damaged: that stage's records all read as the
    placeholder `<name N missing in PART>`, no other stage changes, none is merged."""
    root, pdir, seed = real_run
    path = pdir / "strings.jsonl"
    lines = path.read_text().splitlines()
    k = 2  # block_kernels: "prefill"; h200_kvcache: "decode"
    doc = json.loads(lines[k])
    lines[k] = lines[k].replace(json.dumps(doc["s"]), doc["s"])  # the name's quotes lost: not JSON
    path.write_text("\n".join(lines) + "\n")
    run, exc = _outcome(root, report=True)
    assert exc is None and run["id"].tolist() == seed["id"].tolist()
    placeholder = f"<name {doc['id']} missing in {pdir.name}>"
    want = [placeholder if n == doc["s"] else n for n in seed["name"].tolist()]
    assert run["name"].tolist() == want and placeholder in want
    assert len(run.names) == len(seed.names)
    said = [n for n in run.notes if n.startswith(f"{path}: ")]
    at = lines[k].index(doc["s"])  # where the JSON parser stops: the unquoted name
    assert said == [f"{path}: skipped 1 of {len(lines)} line(s) (first: line {k + 1}, not JSON (Expecting value: line 1 "
                    f"column {at + 1} (char {at}))); 1 name id(s) used by stages are not defined, shown as {placeholder}"], said
    report = build_report(run=run)
    assert placeholder in {row["name"] for row in report["stages"]}


def test_one_note_per_file_for_a_damaged_line_and_a_torn_tail(real_run):
    root, pdir, seed = real_run
    path = pdir / "strings.jsonl"
    total = len(path.read_text().splitlines())
    torn = b'{"id": 7, "s": "cut by a ki'
    with open(path, "ab") as f:
        f.write(b"[1, 2]\n" + torn)
    run, exc = _outcome(root)
    assert exc is None and run["name"].tolist() == seed["name"].tolist()
    assert [n for n in run.notes if n.startswith(f"{path}: ")] == [
        f'{path}: skipped 1 of {total + 1} line(s) (first: line {total + 1}, not {{"id": int in [0, 2**31), "s": str}}: '
        f"[1, 2]); ignored a torn last line ({len(torn)} bytes without a newline)"]


def test_random_rows_in_activity_bin_are_skipped_and_the_kernels_still_reported(tmp_path):
    """kernels=True's activity.bin with two random rows: those two are skipped (counted, the first
    said), every other GPU op and API call is read and attributed."""
    from maxinstr.rundir.activity import ACTIVITY_DTYPE
    from maxinstr.traces.inprocess import read_run

    root = tmp_path / "run"
    shutil.copytree(KRUN, root)
    path = root / KPART / "activity.bin"
    data = bytearray(path.read_bytes())
    rows = np.frombuffer(bytes(data), ACTIVITY_DTYPE)
    rng = np.random.default_rng(20)
    for row in (5, 40):
        data[row * 80:(row + 1) * 80] = rng.integers(0, 256, 80, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))
    kind = int(np.frombuffer(bytes(data), ACTIVITY_DTYPE)["kind"][5])
    assert not 0 <= kind <= 5  # this seed's row 5 has a kind no collector writes
    trace, notes = read_run(load(root))
    seed_trace, _ = read_run(load(KRUN))
    said = (f"{path}: skipped 2 of {len(rows)} row(s) that are not activity records (first: row 5, kind {kind} is not "
            "0 to 5)")
    assert said in notes
    lost_ops = int(np.isin(rows["kind"][[5, 40]], [0, 1, 2]).sum())  # were rows 5 and 40 GPU ops?
    assert len(trace.ops) == len(seed_trace.ops) - lost_ops
    report, exc = _within(root, lambda: _report(root))
    assert exc is None and said in report["sources"]["notes"] and report["sources"]["trace_format"] is not None
    assert _stage_rows(report) == _stage_rows(_seed_report())


def test_a_damaged_kernel_name_line_reads_as_a_placeholder(tmp_path):
    """kernels=True's activity_names.jsonl with the line of a kernel damaged: every op of that
    kernel is still read, named by the placeholder; no other op's name changes."""
    from maxinstr.traces.inprocess import read_run

    root = tmp_path / "run"
    shutil.copytree(KRUN, root)
    path = root / KPART / "activity_names.jsonl"
    lines = path.read_text().splitlines()
    k = next(i for i, x in enumerate(lines) if "matmul_kernel_naive" in x)
    name_id, name = json.loads(lines[k])
    lines[k] = "{" + lines[k]
    path.write_text("\n".join(lines) + "\n")
    trace, notes = read_run(load(root))
    seed_trace, _ = read_run(load(KRUN))
    placeholder = f"<name {name_id} missing in {Path(KPART).name}>"
    op_names = np.asarray(trace.strings, dtype=object)[trace.ops.name_id].tolist()
    seed_names = np.asarray(seed_trace.strings, dtype=object)[seed_trace.ops.name_id].tolist()
    assert name in seed_names and op_names == [placeholder if n == name else n for n in seed_names]
    said = [n for n in notes if n.startswith(f"{path}: ")]
    assert len(said) == 1 and said[0].startswith(f"{path}: skipped 1 of {len(lines)} line(s) (first: line {k + 1}, "
                                                 "not JSON"), said
    assert said[0].endswith(f"the kernels and API calls of a skipped name show as <name N missing in {Path(KPART).name}>")


def test_kernels_whose_name_lines_are_cut_off_keep_their_records(tmp_path):
    """activity_names.jsonl cut to its first half: every activity row is still read, the ops of
    the names cut off named by placeholders (one per distinct id, numbered on after the file's
    lines); a row's name id of 2**31-1 adds one placeholder, not a list that long."""
    from maxinstr.rundir.activity import ACTIVITY_DTYPE, read_part_activity

    root = tmp_path / "run"
    shutil.copytree(KRUN, root)
    pdir = root / KPART
    lines = (pdir / "activity_names.jsonl").read_text().splitlines()
    (pdir / "activity_names.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    seed_meta, seed_rows, seed_names = read_part_activity(KRUN / KPART)
    meta, rows, names = read_part_activity(pdir)
    assert len(rows) == len(seed_rows) and (rows["start_ns"] == seed_rows["start_ns"]).all()
    half = len(lines) // 2
    cut = sorted({i for i in seed_rows["name_id"].tolist() if i >= half})
    assert cut  # the fixture's rows use names of the second half

    def name(i: int, of: list[str]) -> str | None:
        return None if i < 0 else of[i]

    want = [name(i, seed_names) if i < half else f"<name {i} missing in {pdir.name}>" for i in seed_rows["name_id"].tolist()]
    assert [name(i, names) for i in rows["name_id"].tolist()] == want
    assert len(names) == half + len(cut)
    assert meta["notes"] == [f"{pdir / 'activity_names.jsonl'}: {len(cut)} name id(s) used by activity rows are not "
                             f"defined, shown as <name {cut[0]} missing in {pdir.name}> ..."]
    one = np.frombuffer((pdir / "activity.bin").read_bytes()[:80], ACTIVITY_DTYPE).copy()
    one["name_id"] = 2**31 - 1
    (pdir / "activity.bin").write_bytes(one.tobytes())
    assert read_part_activity(pdir)[2][-1] == f"<name {2**31 - 1} missing in {pdir.name}>"
    assert len(read_part_activity(pdir)[2]) == half + 1


def test_a_zero_filled_block_is_not_read_as_stages(tmp_path):
    """A crash can leave a zero-filled block at the end of stages.bin (a file system that
    allocated the space before the data reached it): all-zero rows passed every check and
    read as stages at time 0. Record ids have a sequence from 1, so they are skipped and said."""
    import shutil

    from maxinstr.rundir import format as fmt, load

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "nsys" / "h200_kvcache-run", run)
    (stages,) = run.glob("parts/*/stages.bin")
    before = len(load(run))
    with open(stages, "ab") as f:
        f.write(bytes(fmt.STAGE_DTYPE.itemsize * 4))
    got = load(run)
    assert len(got) == before
    assert any("skipped 4 of" in n and "sequence 0" in n for n in got.notes), got.notes


def test_recording_the_git_state_runs_nothing_the_repository_names(tmp_path):
    """A run records the commit and whether the tree is dirty (meta.json ``git``). The repository
    the script lives in is data: its config may name a program for `git status` to run
    (core.fsmonitor); recording never runs it."""
    import shutil
    import subprocess

    from maxinstr.rundir.metadata import git_info

    if shutil.which("git") is None:
        pytest.skip("no git on this machine")
    repo = tmp_path / "repo"
    repo.mkdir()
    ran = tmp_path / "ran"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {ran}\nexit 1\n")
    hook.chmod(0o755)

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "one")
    git("config", "core.fsmonitor", str(hook))
    (repo / "a.py").write_text("x = 2\n")
    info = git_info(repo)
    assert info is not None and info["dirty"] is True and len(info["commit"]) == 40
    assert not ran.exists(), "git status ran the repository's fsmonitor program"
