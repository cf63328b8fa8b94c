"""Inputs built to be expensive stay linear, and a name is shown cut to a display length in every
view (issue 29, point 4). The times themselves are benchmarks (benchmarks/report_hostile_inputs.py,
docs/benchmarks.md "Hostile inputs"); these tests check what makes them linear, in memory and in
output, which does not depend on the machine's speed.

- One name of 3 MB took the text report 33 s and 25 MB of output (rich folds it into a hundred
  thousand lines): every view shows ``_text.DISPLAY_CHARS`` of it and says how much is cut; the
  JSON report keeps it whole (it is data).
- ``np.unique(names.astype(str))`` and ``np.char`` on name columns make a fixed-width copy of the
  column, rows x the longest name x 4 bytes: one 3 MB name made the HTML report 2.3 GB, one 50 MB
  NVTX text 1.3 GB. Name columns are factorized instead (``columns.factorize``).
- The HTML timeline compared every stage key with every instance (quadratic); it now takes the
  keys with a stage instance in one pass: the same keys, as the old definition gives them.
"""
from __future__ import annotations

import json
import shutil
import sqlite3
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from maxinstr.analyze.report import analyze, build_report
from maxinstr.analyze.timeline import timeline
from maxinstr.render import html as rhtml
from maxinstr.render import json as rjson
from maxinstr.render import markdown, perfetto, text
from maxinstr.rundir import format as fmt
from maxinstr.rundir import load
from maxinstr.traces import open_trace
from maxinstr.traces.model import StringTable

DATA = Path(__file__).resolve().parents[1] / "data"
BIG = 2 << 20  # a 2 MB name


def _run(root: Path, names: list[str], n: int) -> Path:
    part = root / "parts" / "p7"
    part.mkdir(parents=True)
    rows = np.zeros(n, dtype=fmt.STAGE_DTYPE)
    rows["id"] = (7 << 32) | np.arange(1, n + 1)
    rows["parent_id"] = -1
    rows["tid"] = 7
    rows["host_start_ns"] = 10**9 + np.arange(n) * 10_000
    rows["host_end_ns"] = rows["host_start_ns"] + 5_000 + (np.arange(n) % 7) * 100
    rows["gpu_start_ns"] = rows["gpu_end_ns"] = -1
    rows["step"] = np.arange(n) // len(names)
    rows["name_id"] = np.arange(n) % len(names)
    (part / fmt.STAGES_FILE).write_bytes(rows.tobytes())
    (part / fmt.STRINGS_FILE).write_text("".join(json.dumps({"id": i, "s": s}) + "\n" for i, s in enumerate(names)))
    (root / fmt.META_FILE).write_text(json.dumps({"format": "maxinstr-run", "version": 1, "status": "closed", "warmup": 1}))
    return root


@pytest.fixture(scope="module")
def big_name(tmp_path_factory):
    root = _run(tmp_path_factory.mktemp("big") / "run", ["decode", "attn/" + "q" * BIG, "sample"], 60)
    return analyze(run=load(root))


@pytest.mark.parametrize("view", ["text", "markdown", "html", "perfetto"])
def test_a_huge_name_is_cut_in_every_view(big_name, view):
    report = big_name.report
    if view == "text":
        out = text.render(report, width=100)
    elif view == "markdown":
        out = markdown.render(report)
    elif view == "html":
        out = rhtml.render(report, big_name)
    else:
        out = perfetto.render(report, big_name)
    assert len(out) < 400_000, len(out)  # the name alone is 2 MB: it is never written whole
    from maxinstr._text import DISPLAY_CHARS

    # the cut said ("…" is "\u2026" in the Perfetto JSON)
    assert f" (+{BIG + 5 - DISPLAY_CHARS:,} characters)" in out


def test_the_json_report_keeps_the_name_whole(big_name):
    doc = json.loads(rjson.render(big_name.report))
    assert "attn/" + "q" * BIG in {s["name"] for s in doc["stages"]}


def test_name_columns_take_no_fixed_width_copy():
    """200,000 rows, one of them a 4 MB name: the fixed-width copy would be 3.2 TB."""
    from maxinstr.columns import factorize, isin_strings

    col = np.array(["decode", "sample"] * 100_000, dtype=object)
    col[123] = "x" * (4 << 20)
    tracemalloc.start()
    try:
        uniques, codes = factorize(col)
        ids = StringTable().ids_for(col)
        hits = isin_strings(col, ["sample"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
    assert list(uniques) == ["decode", "sample", "x" * (4 << 20)] and (uniques[codes] == col).all()
    assert len(set(ids.tolist())) == 3 and hits.sum() == 100_000 - 1  # row 123 was a "sample"


@pytest.mark.parametrize("seed", range(5))
def test_factorize_is_np_unique_of_the_strings(seed):
    from maxinstr.columns import factorize

    rng = np.random.default_rng(seed)
    words = np.array(["", "a", "b", "ab", "é", "\u2028", "a b", None, 3], dtype=object)
    col = words[rng.integers(0, len(words), 500)]
    u, c = factorize(col)
    u2, c2 = np.unique(col.astype(str), return_inverse=True)
    assert u.tolist() == u2.tolist() and (c == c2.reshape(-1)).all()


def test_an_nsys_trace_with_a_huge_nvtx_text_reads_in_bounded_memory(tmp_path):
    """The real H200 nsys fixture with one range's text made 8 MB: read and reported within a
    few copies of that text (the old path copied it once per distinct range name, x 4 bytes)."""
    path = tmp_path / "nvtx.sqlite"
    shutil.copy(DATA / "nsys" / "h200_decode.sqlite", path)
    con = sqlite3.connect(path)
    con.execute("UPDATE NVTX_EVENTS SET text = ?, textId = NULL WHERE rowid = 3", ("decode/" + "k" * (8 << 20),))
    con.commit()
    con.close()
    tracemalloc.start()
    try:
        report = build_report(trace=open_trace(path))
        out = text.render(report, width=120)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 160 << 20, peak  # 8 MB text; the old path reached 30 distinct names x 32 MB
    assert len(out) < 200_000 and "characters)" in out


def test_html_timeline_keys_are_the_old_definitions(tmp_path):
    """The timeline's stage strips are the report's first 12 keys (depth <= 2) that have an
    instance other than a mark: the one-pass selection equals the per-key mask it replaced."""
    root = _run(tmp_path / "run", [f"req/{i}" for i in range(40)], 400)
    analysis = analyze(run=load(root))
    report = analysis.report
    inst = timeline(analysis).inst
    keys = inst.key.astype(str)
    old = [s["name"] for s in report["stages"] if (keys == s["name"]).any() and not inst.is_mark[keys == s["name"]].all()]
    old = [k for k in old if next(s for s in report["stages"] if s["name"] == k).get("depth", 0) <= 2][:12]
    assert len(old) == 12
    section = rhtml.timeline_section(report, analysis)
    strips = [k for k in (s["name"] for s in report["stages"]) if f">{k}</text>" in section]
    assert strips == old
