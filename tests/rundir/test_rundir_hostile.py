"""Run directories that are not what maxinstr wrote (issue 20, class 8): ``load`` and the
report give a Run (with notes) or a one-line RunDirError naming the file; they never hang, grow
without bound, or raise anything else.

- any file of a run replaced by a FIFO, a link to /dev/zero, a directory, a dangling or
  looping link (property test; each load runs in a thread that must finish);
- a stages.bin shorter than its closed part.json says (a note, not silence);
- meta.json holding odd JSON in any field (deep nesting, huge numbers, wrong types): the whole
  report and its views, or a RunDirError naming meta.json (property test);
- stage times that would make a duration overflow int64 are a damaged file, not -20 ns."""

from __future__ import annotations

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
from maxinstr.errors import RunDirError
from maxinstr.render import html as rhtml
from maxinstr.render import json as rjson
from maxinstr.render import markdown, text
from maxinstr.rundir import format as fmt
from maxinstr.rundir import load

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


def _outcome(root: Path, *, report: bool = False):
    """Run load (and the report) in a thread that must finish: a hang fails instead of blocking."""
    box: dict = {}

    def work():
        try:
            run = load(root)
            if report:
                r = build_report(run=run)
                text.render(r)
                markdown.render(r)
                rjson.render(r)
                rhtml.render(r)
            box["run"] = run
        except BaseException as exc:  # noqa: BLE001 - judged below
            box["exc"] = exc

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "load() did not finish (hung on a special file?)"
    exc = box.get("exc")
    if exc is not None:
        assert isinstance(exc, RunDirError), repr(exc)
        assert "\n" not in str(exc) and str(exc).startswith(str(root)), str(exc)
    return box.get("run"), exc


FILES = ["meta.json", "parts/p7/part.json", "parts/p7/stages.bin", "parts/p7/strings.jsonl", "parts/p7/attrs.jsonl",
         "parts/p7/events.jsonl", "parts/p7/samples.json", "parts/p7/samples.bin"]
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


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(which=st.sampled_from(FILES), kind=st.sampled_from(KINDS))
def test_a_special_file_anywhere_is_an_error_naming_it_never_a_hang(which, kind):
    root = _ROOT / "special"
    shutil.rmtree(root, ignore_errors=True)
    _write_run(root)
    _replace(root / which, kind)
    run, exc = _outcome(root)
    if which == "parts/p7/samples.bin" or which == "parts/p7/samples.json":
        # samples are optional: a part's unreadable samples are a note
        assert exc is None and any(which.split("/")[-1] in n or "samples" in n for n in run.notes), run.notes
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
    for name in ("part.json", "attrs.jsonl"):
        other = _write_run(tmp_path / f"bad-{name}")
        (other / "parts" / "p7" / name).write_text(_deep(100_000) + "\n")
        run, exc = _outcome(other)
        assert exc is not None and str(exc).startswith(str(other / "parts" / "p7" / name)), exc


@pytest.mark.parametrize("col, value", [("host_start_ns", -(2**63) + 10), ("host_end_ns", 2**63 - 10),
                                        ("host_start_ns", -5)])
def test_times_that_would_overflow_a_duration_are_a_damaged_file(tmp_path, col, value):
    rows = _rows()
    rows[col][2] = value
    if col == "host_start_ns":
        rows["host_end_ns"][2] = 2**63 - 10 if value < -10 else rows["host_end_ns"][2]
    root = _write_run(tmp_path / "run", rows=rows)
    _, exc = _outcome(root)
    assert exc is not None and "not stage records" in str(exc)


def test_durations_near_the_bound_are_exact(tmp_path):
    rows = _rows(start_ns=2**62 - 10**9)
    rows["host_start_ns"][0] = 0
    root = _write_run(tmp_path / "run", rows=rows)
    run, exc = _outcome(root, report=True)
    assert exc is None
    assert (run["host_end_ns"] - run["host_start_ns"] >= 0).all()
    assert int(run["host_end_ns"][0] - run["host_start_ns"][0]) == 2**62 - 10**9 + 5_000
