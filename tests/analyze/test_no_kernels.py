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
    assert "on its GPU stream" in f["title"]
    assert ev["gpu_over_host"] == st["gpu_event_over_host"]["median"]
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


def test_gpu_over_host_is_per_instance_over_the_instances_timed_on_both():
    """h200_torch_decode-run (the GPU-timing budget timed 745 of 1753 instances, mostly early
    ones): the ratio of the two medians described different instances (42.8 ms of GPU time
    against 5.2 ms of host time, "819%"); per instance, over those timed on both, the stage's
    GPU stream spans about its host time."""
    r = build_report(run=DATA / "kineto/h200_torch_decode-run")
    st = {s["name"]: s for s in r["stages"]}
    over = st["decode"]["gpu_event_over_host"]
    assert 0 < over["n"] <= st["decode"]["steady"] and 0.8 < over["median"] < 1.25
    (f,) = [x for x in r["diagnosis"] if x["id"] == "no_kernels"]
    assert f["evidence"]["gpu_over_host"] == st[f["evidence"]["stage"]]["gpu_event_over_host"]["median"]
    # NVML says the GPU is idle most of the stage: the finding says what that means
    assert f["evidence"]["gpu_util_pct_mean"] < 30 and "the host (Python, launches) sets its pace" in f["title"]
