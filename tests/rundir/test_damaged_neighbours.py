"""A damaged neighbour never refuses what was recorded (issue 29, points 8 and 4).

- One torn part.json (a kill mid-write, a full disk) made the whole multi-process run a
  RunDirError, while a deleted one did not: now it reads as a missing one, said in a note.
- A part whose stages.bin holds no stage record (another file, random bytes) is left out of a
  run of several parts with a note; only a run of which no part can be read is an error.
- stages.bin is read a chunk at a time, holes of a sparse file skipped unread: a 20 GB sparse
  stages.bin was read whole, then ``MemoryError``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from maxinstr.errors import RunDirError
from maxinstr.rundir import format as fmt
from maxinstr.rundir import load

PROGRAM = textwrap.dedent("""
    import multiprocessing as mp, sys
    import maxinstr

    def work(k):
        for i in range(20):
            with maxinstr.stage("child", k=k, i=i):
                pass

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        with maxinstr.session(sys.argv[1]):
            procs = [ctx.Process(target=work, args=(k,)) for k in range(2)]
            for p in procs:
                p.start()
            for i in range(30):
                with maxinstr.stage("parent", i=i):
                    pass
            for p in procs:
                p.join()
""")


@pytest.fixture(scope="module")
def three_parts(tmp_path_factory) -> Path:
    """A real run of three processes (the parent and two spawned children)."""
    root = tmp_path_factory.mktemp("mp") / "run"
    script = root.parent / "prog.py"
    script.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAXINSTR_")}
    res = subprocess.run([sys.executable, str(script), str(root)], env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    run = load(root)
    assert len(run.parts) == 3 and len(run) == 70
    return root


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _child_part(root: Path) -> Path:
    return next(p for p in sorted((root / "parts").iterdir())
                if json.loads((p / "part.json").read_text()).get("role") == "child")


@pytest.mark.parametrize("damage", ["torn", "not an object", "wrong type", "fifo", "deleted"])
def test_one_damaged_part_json_does_not_refuse_the_run(three_parts, tmp_path, damage):
    root = _copy(three_parts, tmp_path / "run")
    part = _child_part(root)
    path = part / "part.json"
    text = path.read_text()
    if damage == "torn":
        path.write_text(text[: len(text.rstrip()) // 2])  # cut mid-write (the file is padded with spaces)
    elif damage == "not an object":
        path.write_text("[1, 2]")
    elif damage == "wrong type":
        path.write_text(json.dumps({**json.loads(text), "rows_written": "many"}))
    elif damage == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:
        path.unlink()
    run = load(root)
    assert len(run) == 70 and len(run.parts) == 3  # every record, every part
    names = run.stage_names()
    assert (names == "child").sum() == 40
    said = [n for n in run.notes if n.startswith(f"{path}: ")]
    if damage == "deleted":
        assert said == []
    else:
        assert len(said) == 1 and "the part is read without it" in said[0], run.notes
    info = next(p for p in run.parts if p["name"] == part.name)
    assert info["pid"] == int(part.name.rsplit("p", 1)[1])  # from the folder name


def test_a_part_that_holds_no_stage_record_is_left_out_the_others_read(three_parts, tmp_path):
    root = _copy(three_parts, tmp_path / "run")
    part = _child_part(root)
    (part / "stages.bin").write_bytes(os.urandom(72 * 40))
    run = load(root)
    assert len(run.parts) == 2 and len(run) == 50
    said = [n for n in run.notes if n.startswith(f"{part / 'stages.bin'}: none of its 40 row(s) is a stage record")]
    assert len(said) == 1 and said[0].endswith(f"that part ({part.name}) is left out"), run.notes
    assert run.stages["part"].max() == 1  # part indices stay those of run.parts


def test_a_run_of_which_no_part_can_be_read_is_the_error(three_parts, tmp_path):
    root = _copy(three_parts, tmp_path / "run")
    parts = sorted((root / "parts").iterdir())
    for p in parts:
        (p / "stages.bin").write_bytes(b"\xff" * 72 * 3)
    with pytest.raises(RunDirError, match=r"stages.bin: none of its 3 row\(s\) is a stage record") as err:
        load(root)
    assert str(err.value).startswith(str(parts[0] / "stages.bin"))


def _rows(n: int, pid: int = 7, first: int = 1) -> np.ndarray:
    r = np.zeros(n, dtype=fmt.STAGE_DTYPE)
    r["id"] = (pid << 32) | np.arange(first, first + n)
    r["parent_id"] = -1
    r["host_start_ns"] = 1_000_000 + np.arange(first, first + n) * 1000
    r["host_end_ns"] = r["host_start_ns"] + 500
    r["gpu_start_ns"] = r["gpu_end_ns"] = r["step"] = -1
    return r


def _run_with_stages(root: Path) -> Path:
    part = root / "parts" / "p7"
    part.mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps({"format": "maxinstr-run", "version": 1, "status": "closed"}))
    (part / "strings.jsonl").write_text('{"id": 0, "s": "step"}\n')
    return part / "stages.bin"


def test_a_sparse_20_gb_stages_bin_is_read_in_bounded_memory(tmp_path):
    """100 real rows, a 20 GB hole, 100 more: the 200 records are read, the hole's rows are
    counted as skipped zero rows without being read, and memory stays that of a chunk."""
    path = _run_with_stages(tmp_path / "run")
    width = fmt.STAGE_DTYPE.itemsize
    hole_rows = (20 << 30) // width
    with open(path, "wb") as fh:
        fh.write(_rows(100).tobytes())
        fh.seek((100 + hole_rows) * width)
        fh.write(_rows(100, first=101).tobytes())
    if os.stat(path).st_blocks * 512 > 1 << 30:
        pytest.skip("this file system does not keep sparse files sparse")
    tracemalloc.start()
    try:
        run = load(path.parents[2])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(run) == 200
    assert peak < 64 << 20, peak  # the file is 20 GB; the old reader held all of it
    said = [n for n in run.notes if n.startswith(f"{path}: ")]
    assert said == [f"{path}: skipped {hole_rows} of {hole_rows + 200} row(s) that are not stage records "
                    "(first: row 100, record id 0 has sequence 0 (a zero-filled row?))"]


def test_chunked_reading_matches_whole_reading(tmp_path, monkeypatch):
    """Chunks of 7 rows (bad rows in several chunks): the same records and the same note as one
    read of the whole file."""
    from maxinstr.rundir import reader

    path = _run_with_stages(tmp_path / "run")
    rows = _rows(50)
    rows["flags"][[3, 17, 18, 44]] = 0x8000  # not a flag maxinstr writes
    path.write_bytes(rows.tobytes() + b"\x01" * 30)
    whole = load(path.parents[2])
    monkeypatch.setattr(reader, "STAGE_CHUNK_ROWS", 7)
    chunked = load(path.parents[2])
    assert np.array_equal(whole.stages, chunked.stages) and len(chunked) == 46
    assert whole.notes == chunked.notes
    assert any("skipped 4 of 50 row(s) that are not stage records (first: row 3, flags 0x8000" in n for n in chunked.notes)


@pytest.mark.parametrize("edit", [
    lambda doc: doc["row"]["fields"][0].update(name="x"),  # no t_ns: was a ValueError inside the HTML view
    lambda doc: doc["row"]["fields"][0].update(type="<f8"),  # t_ns not an integer
    lambda doc: doc.update(devices="gpu0"),
    lambda doc: doc.update(errors=[1, 2]),
])
def test_a_samples_layout_without_its_columns_is_a_note_and_every_view_renders(three_parts, tmp_path, edit):
    from maxinstr.analyze.report import analyze
    from maxinstr.render import html as rhtml
    from maxinstr.render import text

    root = _copy(three_parts, tmp_path / "run")
    part = next(p for p in sorted((root / "parts").iterdir()) if (p / "samples.json").exists())
    doc = json.loads((part / "samples.json").read_text())
    edit(doc)
    (part / "samples.json").write_text(json.dumps(doc))
    analysis = analyze(run=root)
    assert any(n.startswith(f"{part}: samples not read") for n in analysis.run.notes), analysis.run.notes
    assert rhtml.render(analysis.report, analysis) and text.render(analysis.report)
