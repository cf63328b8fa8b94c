"""The terminal stage table: what it says about sampler numbers of short stages, GPU-time
sources, and that it fits a 100-column terminal."""

from __future__ import annotations

import copy
import json

import pytest

from helpers.fixture_columns import DATA
from maxinstr.analyze.report import build_report
from maxinstr.analyze.stage_table import NVML_UTIL_WINDOW_MIN_NS
from maxinstr.render.text import render

RUN = DATA / "nsys/h200_threads-run"
TRACE = DATA / "nsys/h200_threads.sqlite"


@pytest.fixture(scope="module")
def threads_report() -> dict:
    from maxinstr.traces import open_trace

    return build_report(run=RUN, trace=open_trace(TRACE))


def _stage(report: dict, name: str) -> dict:
    return next(s for s in report["stages"] if s["name"] == name)


def test_short_stage_samples_are_flagged_window_limited(threads_report):
    """decode (1.26 ms median) holds one NVML row reading 0 % while its kernels keep the GPU
    68 % busy: the value describes a window before the work (the sampler stopped before any
    window holding it was published), so decode gets no utilization rather than 0 %, and the
    analysis says so."""
    dec = _stage(threads_report, "decode")
    assert dec["samples"]["samples"] == 1 and dec["gpu_busy_frac"]["median"] > 0.5
    assert dec["samples"]["gpu_util_pct_mean"] is None
    assert dec["host_ns"]["median"] < NVML_UTIL_WINDOW_MIN_NS
    assert dec["samples"]["window_limited"] is True
    json.dumps(threads_report)  # still plain JSON


def test_text_does_not_print_util_of_short_stages(threads_report):
    text = render(threads_report, width=100)
    table = text.split("Stages (steady state)", 1)[1].split("Where the time goes", 1)[0]
    assert "util, power not shown for decode: NVML's utilization is an average over windows" in table
    assert "and power NVML's trailing reading" in table
    assert " 0%" not in table.split("util, power", 1)[0]  # no misleading 0 % in the rows
    assert "GPU: CUDA/HIP events on the stage's stream" in table
    assert max(len(line) for line in table.splitlines()) <= 100
    # one line per stage: no row wrapped into a second line
    rows = [ln for ln in table.splitlines() if ln.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["prefill", "decode", "graph"]


def test_long_and_short_stages_side_by_side(threads_report):
    """A stage that fills its windows keeps its util; a window-limited one shows none ("-")."""
    report = copy.deepcopy(threads_report)
    pre = _stage(report, "prefill")
    pre["samples"] = dict(_stage(report, "decode")["samples"], gpu_util_pct_mean=97.0, power_w_mean=600.0,
                          window_limited=False, power_limited=False)
    text = render(report, width=120)
    table = text.split("Stages (steady state)", 1)[1].split("Where the time goes", 1)[0]
    assert "util, power not shown for decode: NVML's utilization is an average" in table
    rows = {r.split("│")[1].strip(): r for r in table.splitlines() if r.startswith("│")}
    assert "97%" in rows["prefill"] and "600 W" in rows["prefill"]
    util_cell, power_cell = [c.strip() for c in rows["decode"].split("│")[-3:-1]]
    assert util_cell == "-" and power_cell == "-"  # no misleading 0 % / 117 W


def _rows_split_a_number(text: str) -> list[str]:
    """Table lines where a duration was broken over two lines ('813.7' then 'us' below)."""
    import re

    lines = text.splitlines()
    return [a for a, b in zip(lines, lines[1:])
            if re.search(r"│\s+\d+(\.\d+)?\s+│", a) and re.search(r"│\s+(us|ms|ns|s)\s+│", b)]


@pytest.mark.parametrize("rel", ["nsys/h200_decode.sqlite", "rocprof/rpd/mytrace.rpd.gz",
                                 "kineto/h200_graph_threads.pt.trace.json.gz"])
def test_report_fits_100_columns_without_splitting_numbers(rel):
    from maxinstr.traces import open_trace

    report = build_report(trace=open_trace(DATA / rel))
    text = render(report, width=100)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert not _rows_split_a_number(text), _rows_split_a_number(text)[:3]
    wide = render(report, width=160)
    assert "host p90" in wide and "left out" not in wide  # nothing dropped when there is room


def test_compare_same_kernel_from_two_tools_is_one_kernel():
    """nsys and Kineto spell one kernel differently ((int)512 vs 512, <unnamed> vs (anonymous
    namespace), (T3) vs the concrete parameter list): compare must not list it as both gone and new."""
    from maxinstr.analyze.compare import Side, compare, kernel_key
    from maxinstr.render.text import render_compare
    from maxinstr.traces import open_trace

    a = build_report(trace=open_trace(DATA / "nsys/h200_decode.sqlite"))
    b = build_report(trace=open_trace(DATA / "kineto/h200_decode.pt.trace.json.gz"))
    (c,) = compare([Side("A", a), Side("B", b)])["comparisons"]
    only = [k["name"] for k in c["kernels_appeared"] + c["kernels_disappeared"]]
    assert not any("reduce_kernel" in n or "layer_norm" in n for n in only), only
    assert any("fmha_cutlassF" in n for n in only)  # a kernel really only in the Kineto run
    names_a = {kernel_key(k["name"]) for k in a["gpu"]["kernels"]}
    names_b = {kernel_key(k["name"]) for k in b["gpu"]["kernels"]}
    assert len(names_a & names_b) >= 2
    text = render_compare({"comparisons": [c]}, width=100)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "only in A" in text and "Kernels only in B" in text
    assert not _rows_split_a_number(text)


def test_diagnosis_wraps_under_its_own_indent():
    """A finding's wrapped lines stay indented under it (they ran back to the panel's edge)."""
    from maxinstr.traces import open_trace

    text = render(build_report(trace=open_trace(DATA / "nsys/h200_decode.sqlite")), width=100)
    panel = text.split("Diagnosis", 1)[1].split("╰", 1)[0]
    body = [ln[2:-1] for ln in panel.splitlines() if ln.startswith("│")]  # less the border and its padding
    assert body and all(ln.startswith(("Facts", "Hypotheses", "Also noted", "  ")) or not ln.strip() for ln in body), body
    assert any(ln.startswith("      $ maxinstr deep-dive") for ln in body)


def test_startup_table_says_when_it_shows_only_some(threads_report):
    report = copy.deepcopy(threads_report)
    report["startup"] = report["startup"] * 3  # 12 rows: more than the 8 shown
    text = render(report, width=100)
    assert "Startup (kept out of the numbers above)" in text
    cold = any(r["reason"] == "cold_start" for r in report["startup"])
    assert ("12 instances; the cold starts, then the longest warm-up ones, 8 shown" if cold
            else "12 instances; the 8 longest shown") in text
    assert "8 shown" not in render(threads_report, width=100)  # all 4 shown: nothing to say


def test_startup_table_shows_the_cold_start_the_findings_quote():
    """cs336_nsys2026.2 with --warmup 2: 7 startup instances, the cold start (a 'computing final
    matmul' the warmup_contamination finding is about, 210.6 us) shorter than the 3 longest warm-up
    ones: a cut on time alone would leave it out of a table of 3; every view lists cold starts first."""
    from maxinstr.render import _fmt

    report = build_report(trace=DATA / "nsys/cs336_nsys2026.2.sqlite", warmup=2)
    cold = [r for r in report["startup"] if r["reason"] == "cold_start"]
    assert len(report["startup"]) > 3 and cold
    assert sorted(r["host_ns"] for r in report["startup"])[-3] > min(r["host_ns"] for r in cold)  # the old cut
    shown, caption = _fmt.startup_shown(report, n=3)
    assert shown[: len(cold)] == cold and "the cold starts, then the longest warm-up ones, 3 shown" in caption
    table = render(report, width=120).split("Startup (kept out of the numbers above)", 1)[1]
    assert table.count("cold start") >= len(cold)


def test_stages_seen_only_in_warmup_are_pointed_to_startup(threads_report):
    report = copy.deepcopy(threads_report)
    pre = _stage(report, "prefill")
    pre["warmup"], pre["steady"] = pre["warmup"] + pre["steady"], 0
    text = render(report, width=120)
    assert "prefill ran only as warm-up: see Startup below" in text
    assert "ran only as warm-up" not in render(threads_report, width=120)


def test_html_defines_busy_by_the_span_it_is_computed_over(threads_report):
    """decode's event GPU median (1.17 ms) is far longer than its kernels' trace span: the HTML
    must not define busy against the span it shows (280 us busy / 1.17 ms is not the 68 % shown)."""
    from maxinstr.render.html import render as html

    dec = _stage(threads_report, "decode")
    busy, frac, event = dec["gpu_busy_ns"]["median"], dec["gpu_busy_frac"]["median"], dec["gpu_event_ns"]["median"]
    assert abs(busy / event - frac) > 0.3  # the two spans really differ here
    page = html(threads_report)
    assert "Busy = GPU busy time / GPU span;" not in page
    assert "first kernel start to last kernel end" in page


def test_ranked_table_one_line_per_stage_with_plain_basis():
    from maxinstr.traces import open_trace

    text = render(build_report(trace=open_trace(DATA / "nsys/h200_decode.sqlite")), width=120)
    table = text.split("Where the time goes (ranked)", 1)[1].split("└", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("│")]
    assert len(rows) == 3 and "self time, total" in table  # decode, sample, prefill: no wrapped rows
    assert "(GPU busy)" in rows[0] and "gpu_busy" not in table and "45% nvjet_sm90" in rows[0]


def test_a_report_of_thousands_of_stages_shows_the_largest_and_says_so():
    """issue 20, class 8: 50,000 distinct names made the terminal table take a minute to lay out;
    the terminal shows the stages with the most steady host time, the other views all of them."""
    from maxinstr.render import markdown, text

    stages = [{"name": f"s{i:05d}", "depth": 0, "steady": 2, "warmup": 0, "cold_start": 0,
               "host_ns": {"n": 2, "median": float(i), "p90": float(i), "total": 2.0 * i}} for i in range(5000)]
    report = {"stages": stages, "warmup": {}, "sources": {}}
    out = text.render(report, width=200)
    shown = [f"s{i:05d}" for i in range(5000) if f"s{i:05d}" in out]
    assert shown == [f"s{i:05d}" for i in range(5000 - text.STAGES_SHOWN, 5000)]
    assert f"{5000 - text.STAGES_SHOWN:,} more stages not shown" in out
    assert markdown.render(report).count("| s0") == 5000
