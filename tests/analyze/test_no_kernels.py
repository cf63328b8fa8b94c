"""A GPU run without a kernel trace is not a dead end (issue 17, point 3): the report says what
its GPU events and samples show and names the command that adds the kernels."""

from __future__ import annotations

import pytest

from helpers.fixture_columns import DATA

from maxinstr.analyze.report import build_report
from maxinstr.render.text import render


@pytest.mark.parametrize("name", ["h200_kvcache-plain-run", "h200_reprefill-plain-run", "h200_window-run"])
def test_gpu_run_without_trace_says_what_it_knows_and_what_to_run(name):
    r = build_report(run=DATA / "nsys" / name)
    assert r["gpu"] is None
    (f,) = [x for x in r["diagnosis"] if x["id"] == "no_kernels"]
    ev = f["evidence"]
    st = next(s for s in r["stages"] if s["name"] == ev["stage"])
    # the numbers it quotes are the stage's own
    assert ev["host_ns_median"] == st["host_ns"]["median"] and ev["gpu_event_ns_median"] == st["gpu_event_ns"]["median"]
    assert "keeps its GPU stream" in f["title"]
    assert f["command"].startswith("maxinstr run -- ") and "kernels=True" in f["next_step"]
    assert "[no_kernels]" in render(r, width=100)


def test_time_outside_every_stage_is_said():
    """h200_window-run: its decode/sample steps cover under a tenth of the time from the first
    stage to the last: what the stages' GPU numbers say is a small part of the run."""
    r = build_report(run=DATA / "nsys/h200_window-run")
    (f,) = [x for x in r["diagnosis"] if x["id"] == "no_kernels"]
    cov = r["coverage"]
    assert cov["in_stages_ns"] < cov["wall_ns"] and f["evidence"]["outside_stages_share"] > 0.5
    assert "outside every stage" in f["title"]


def test_not_given_when_the_kernels_are_there():
    r = build_report(run=DATA / "nsys/h200_kvcache-run", trace=DATA / "nsys/h200_kvcache.sqlite")
    assert "no_kernels" not in {x["id"] for x in r["diagnosis"]}
