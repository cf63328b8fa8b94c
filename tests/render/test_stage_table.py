"""The terminal stage table: what it says about sampler numbers of short stages, GPU-time
sources, and that it fits a 100-column terminal."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "analyze"))

from fixture_columns import DATA  # noqa: E402
from maxinstr.analyze.report import NVML_UTIL_WINDOW_MIN_NS, build_report  # noqa: E402
from maxinstr.render.text import render  # noqa: E402

RUN = DATA / "nsys/h200_threads-run"
TRACE = DATA / "nsys/h200_threads.sqlite"


@pytest.fixture(scope="module")
def threads_report() -> dict:
    from maxinstr.traces import open_trace

    return build_report(run=RUN, trace=open_trace(TRACE))


def _stage(report: dict, name: str) -> dict:
    return next(s for s in report["stages"] if s["name"] == name)


def test_short_stage_samples_are_flagged_window_limited(threads_report):
    """decode (1.26 ms median) holds one NVML sample reading 0 % while its kernels keep the GPU
    68 % busy: the sample describes the 1/6-1 s before it, and the analysis says so."""
    dec = _stage(threads_report, "decode")
    assert dec["samples"]["gpu_util_pct_mean"] == 0.0 and dec["gpu_busy_frac"]["median"] > 0.5
    assert dec["host_ns"]["median"] < NVML_UTIL_WINDOW_MIN_NS
    assert dec["samples"]["window_limited"] is True
    json.dumps(threads_report)  # still plain JSON


def test_text_does_not_print_util_of_short_stages(threads_report):
    text = render(threads_report, width=100)
    table = text.split("Stages (steady state)", 1)[1].split("Where the time goes", 1)[0]
    assert "util, power not shown" in table and "decode is shorter than NVML's averaging window" in table
    assert " 0%" not in table.split("util, power", 1)[0]  # no misleading 0 % in the rows
    assert "GPU: CUDA/HIP events on the stage's stream" in table
    assert max(len(line) for line in table.splitlines()) <= 100
    # one line per stage: no row wrapped into a second line
    rows = [ln for ln in table.splitlines() if ln.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["prefill", "decode", "graph"]


def test_long_and_short_stages_side_by_side(threads_report):
    """A stage longer than the window keeps its util; a short one shows it in parentheses."""
    report = copy.deepcopy(threads_report)
    pre = _stage(report, "prefill")
    pre["samples"] = dict(_stage(report, "decode")["samples"], gpu_util_pct_mean=97.0, power_w_mean=600.0,
                          window_limited=False)
    text = render(report, width=120)
    table = text.split("Stages (steady state)", 1)[1].split("Where the time goes", 1)[0]
    assert "(util, power) in parentheses: decode is shorter" in table
    rows = {r.split("│")[1].strip(): r for r in table.splitlines() if r.startswith("│")}
    assert "97%" in rows["prefill"] and "600 W" in rows["prefill"]
    assert "(0%)" in rows["decode"] and "(117 W)" in rows["decode"]
