"""Stages nested past 64 levels, stages that raised, and empty names: what every view says of them."""

from __future__ import annotations

import numpy as np

import maxinstr
from maxinstr import warmup
from maxinstr.analyze.report import build_report
from maxinstr.render import html, markdown, text

MAX_LEVELS = 64  # the levels the report shows (maxinstr.analyze.instances.MAX_LEVELS)


def _deep(n: int) -> None:
    if n:
        with maxinstr.stage("d"):
            _deep(n - 1)


def test_levels_are_exact_past_64_and_a_cycle_ends():
    chain = np.arange(-1, 99)  # each instance inside the one before: 100 levels
    assert warmup.levels(chain).tolist() == list(range(100))
    assert (warmup.top_ancestor(chain) == 0).all()
    flag = np.zeros(100, bool)
    flag[0] = True
    assert warmup.inside(chain, flag)[1:].all()  # the warm-up one 99 levels up still encloses it
    cycle = np.array([1, 0, -1])
    assert warmup.levels(cycle).tolist() == [warmup.ENDLESS, warmup.ENDLESS, 0]


def test_deep_stages_keep_their_own_keys(tmp_path):
    """100 levels of one name: the first 64 are a stage each, one instance, each the child of the one
    above; the 36 deeper are left out with a note (they folded into a key 'd/d' of 36 'siblings',
    its own parent)."""
    with maxinstr.session(tmp_path / "run", warmup=0):
        _deep(100)
    r = build_report(run=tmp_path / "run")
    stages = r["stages"]
    assert len(stages) == MAX_LEVELS
    assert [s["depth"] for s in stages] == list(range(MAX_LEVELS))
    assert all(s["instances"] == 1 for s in stages)
    assert [s["parent"] for s in stages[1:]] == [s["name"] for s in stages[:-1]]
    assert any("36 stage instances nested more than 64 levels deep" in n for n in r["sources"]["notes"])
    out = text.render(r, width=80)
    table = out.split("Stages (steady state)", 1)[1].split("Where the time goes", 1)[0]
    assert "d×40" in table and "d/d/d/d/d/d/d/d/d/d" not in table
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "d×9" in markdown.render(r) and "d×9" in html.render(r)


def test_a_stage_that_raised_is_named_in_every_view(tmp_path):
    with maxinstr.session(tmp_path / "run", warmup=0):
        for i in range(3):
            try:
                with maxinstr.stage("boom"):
                    if i == 1:
                        raise ValueError("x")
            except ValueError:
                pass
    r = build_report(run=tmp_path / "run")
    assert r["stages"][0]["exceptions"] == 1
    assert "raised an exception: boom (1 of 3 instances)" in text.render(r, width=80).replace("\n", " ")
    assert "Raised an exception: boom (1 of 3 instances)" in markdown.render(r)
    assert "Raised an exception: boom (1 of 3 instances)" in html.render(r)


def test_an_empty_name_is_shown(tmp_path):
    with maxinstr.session(tmp_path / "run", warmup=0):
        for _ in range(3):
            with maxinstr.stage(""):
                pass
    r = build_report(run=tmp_path / "run")
    assert r["stages"][0]["name"] == ""
    table = text.render(r, width=80).split("Stages (steady state)", 1)[1].split("\n")
    assert any(line.startswith("│ ''") for line in table)
    assert "| '' |" in markdown.render(r) or "|''|" in markdown.render(r).replace(" ", "")


def test_warmup_suggestion_of_one_reads_as_english():
    from helpers.fixture_columns import DATA
    from maxinstr.traces import open_trace

    r = build_report(trace=open_trace(DATA / "nsys/h200_kvcache.sqlite"))
    step = next(d for d in r["diagnosis"] if d["id"] == "warmup_contamination")["next_step"]
    assert "warmup=1" in step and "(the first 'request' and everything inside it)" in step


def test_the_watching_line_shows_a_deep_key_as_the_tables_do():
    from maxinstr.render._fmt import footprint_line

    line = footprint_line({"footprint": {"overall_share": 0.01, "overall_ns_by_source": {"stages": 5},
                                         "share_by_stage": {"d/d/d/d/sib": 0.5}}})
    assert line is not None and "of d×4/sib" in line, line
