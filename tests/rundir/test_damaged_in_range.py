"""Damage no single row check sees (adversarial review, findings 4, 6 and 10b): a copy of a real
run directory altered the way the review found it, read back with the note that says so.

- A skipped line's note named the first line that was not JSON, not the first skipped line.
- Rows written twice, a part folder copied, GPU times ending before they start, parents that form
  a cycle, a time 146 years out: all read silently (counts tripled, GPU columns gone, blank stage
  names, a 4345575707414x outlier finding).
- A closed run whose parts/ folder was deleted said "no parts yet: no stage was recorded"."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from maxinstr.analyze.report import build_report
from maxinstr.rundir import format as fmt
from maxinstr.rundir import load

DATA = Path(__file__).resolve().parents[1] / "data"
BLOCK = DATA / "max" / "block_run"  # one part, 152 rows, 96 nested, all GPU-timed
PART = "p1323"


@pytest.fixture
def run(tmp_path) -> Path:
    return Path(shutil.copytree(BLOCK, tmp_path / "run"))


def _rows(root: Path) -> np.ndarray:
    return np.fromfile(root / "parts" / PART / fmt.STAGES_FILE, dtype=fmt.STAGE_DTYPE)


def _write(root: Path, rows: np.ndarray) -> None:
    rows.tofile(root / "parts" / PART / fmt.STAGES_FILE)


def _notes(root: Path, file: str) -> list[str]:
    return [n for n in load(root).notes if file in n]


@pytest.mark.parametrize("file, lines, first", [
    (fmt.EVENTS_FILE, '[1]\n{"a":1}\n"str"\nxx\n', "first: line 1, not a JSON object: [1]"),
    (fmt.ATTRS_FILE, '[1]\nxx\n', 'first: line 1, not {"id": int64, "attrs": {...}}: [1]'),
    (fmt.STRINGS_FILE, '[1]\nxx\n', 'first: line 1, not {"id": int in [0, 2**31), "s": str}: [1]'),
])
def test_the_first_skipped_line_is_named_whatever_its_fault(run, file, lines, first):
    path = run / "parts" / PART / file
    path.write_text(lines)  # line 1 is JSON of the wrong shape, a later line not JSON
    said = _notes(run, file)
    assert len(said) == 1 and first in said[0], said


def test_rows_written_three_times_are_counted_once(run):
    rows = _rows(run)
    _write(run, np.concatenate([rows, rows, rows]))
    got = load(run)
    assert len(got) == len(rows) and len(np.unique(got["id"])) == len(rows)
    assert any(f"skipped {2 * len(rows)} of {3 * len(rows)} row(s) that are not stage records (first: row "
               f"{len(rows)}, it repeats row 0 (same record id and content))" in n for n in got.notes), got.notes


def test_a_reused_record_id_keeps_the_first_row(run):
    rows = _rows(run)
    other = rows[:1].copy()
    other["host_end_ns"] += 5
    _write(run, np.concatenate([rows, other]))
    got = load(run)
    assert len(got) == len(rows)
    assert got.stages[got["id"] == rows["id"][0]]["host_end_ns"][0] == rows["host_end_ns"][0]
    assert any(f"skipped 1 of {len(rows) + 1} row(s) that are not stage records (first: row {len(rows)}, it reuses "
               "the record id of row 0 (the earlier is kept))" in n for n in got.notes), got.notes


def test_a_copied_part_folder_is_counted_once(run):
    shutil.copytree(run / "parts" / PART, run / "parts" / "p1")  # sorts, and is read, first
    got = load(run)
    assert len(got) == len(_rows(run))
    assert [p["name"] for p in got.parts] == [PART]  # the folder its part.json names is kept
    assert any(f"parts/p1: holds the same {len(got)} stage record(s) as part {PART} (a copy of that part folder?)"
               in n for n in got.notes), got.notes


def test_gpu_times_ending_before_they_start_are_no_gpu_times(run):
    rows = _rows(run)
    rows["gpu_end_ns"][:10] = rows["gpu_start_ns"][:10] - 5
    _write(run, rows)
    got = load(run)
    assert len(got) == len(rows)
    bad = np.isin(got["id"], rows["id"][:10])
    assert (got.stages["flags"][bad] & fmt.GPU_TIMED == 0).all() and (got["gpu_start_ns"][bad] == -1).all()
    assert (got.stages["flags"][~bad] & fmt.GPU_TIMED != 0).all()
    assert any("10 row(s) have GPU times that cannot be" in n for n in got.notes), got.notes


@pytest.mark.parametrize("damage", ["cycle", "rolled"])
def test_parents_that_cannot_enclose_are_read_as_top_level(run, damage):
    rows = _rows(run)
    nested = np.flatnonzero(rows["parent_id"] >= 0)
    if damage == "cycle":
        a, b = nested[:2]
        rows["parent_id"][a], rows["parent_id"][b] = rows["id"][b], rows["id"][a]
        count = 2
    else:
        rows["parent_id"] = np.roll(rows["id"], 1)
        rows["depth"] = 1
        count = len(rows)
    _write(run, rows)
    got = load(run)
    assert len(got) == len(rows)
    assert any(f"{count} row(s) name a parent that cannot enclose them" in n for n in got.notes), got.notes
    report = build_report(run=got)
    assert all(s["name"] and not s["name"].startswith("/") for s in report["stages"]), report["stages"]


def test_a_time_far_outside_the_run_is_skipped(run):
    rows = _rows(run)
    rows["host_end_ns"][3] = 2**62 - 1
    rows["gpu_end_ns"][3] = rows["gpu_start_ns"][3] + 1
    rows["gpu_end_ns"][7] = 2**62 - 1  # the GPU column only: the row's host times stay
    _write(run, rows)
    got = load(run)
    assert len(got) == len(rows) - 1 and rows["id"][3] not in got["id"]
    assert (got.stages[got["id"] == rows["id"][7]]["flags"] & fmt.GPU_TIMED == 0).all()
    said = _notes(run, "stages.bin")
    assert len(said) == 1 and (f"skipped 1 of {len(rows)} row(s) that are not stage records (first: row 3, a host time "
                               "more than 24 h outside the part's window)") in said[0], said
    assert "; 1 row(s) have GPU times that cannot be" in said[0], said
    assert got["host_end_ns"].max() < 2**50


def test_the_real_fixtures_are_read_without_a_note():
    for meta in sorted(DATA.glob("*/*/meta.json")):
        if (meta.parent / "parts").is_dir():
            assert load(meta.parent).notes == [], meta.parent


def test_a_closed_run_without_its_parts_folder_says_they_are_missing(run):
    shutil.rmtree(run / "parts")
    got = load(run)
    assert got.notes == ["the run was closed but its parts folder is missing (deleted, or not copied): its stages "
                         "are not here"]
    finding = next(f for f in build_report(run=got)["diagnosis"] if f["id"] == "no_stages")
    assert "parts/ folder" in str(finding) and "Mark the pipeline" not in str(finding)
