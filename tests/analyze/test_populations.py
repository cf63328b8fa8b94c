"""Stages with two populations (issue 17, point 2).

h200_decode replays a CUDA graph every other decode step: per-step GPU spans are 162-294 us or
716-1015 us, the reported median (505 us before warm-up was fixed, 457 us after) is a time no
step took, and launch_bound advised capturing a CUDA graph, which the program does.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.fixture_columns import DATA

from maxinstr.analyze import populations as pop
from maxinstr.analyze.report import analyze, build_report


def _stage(report: dict, name: str) -> dict:
    return next(s for s in report["stages"] if s["name"] == name)


@pytest.fixture(scope="module")
def decode():
    return analyze(trace=DATA / "nsys/h200_decode.sqlite")


def test_graph_and_eager_steps_are_two_populations(decode):
    d = _stage(decode.report, "decode")
    p = d["populations"]
    assert p["by"] == "CUDA graph replay" and p["explained"] and p["basis"] == "gpu_proj_ns"
    graph, eager = sorted(p["groups"], key=lambda g: g["gpu_proj_ns"]["median"])
    assert graph["label"] == "CUDA graph replay" and graph["cuda_graph_share"] == 1.0
    assert eager["label"] == "no CUDA graph" and eager["cuda_graph_share"] == 0.0
    # each population's numbers are its own steps': 162-294 us and 716-1015 us
    assert 150e3 < graph["gpu_proj_ns"]["min"] <= graph["gpu_proj_ns"]["max"] < 300e3
    assert 700e3 < eager["gpu_proj_ns"]["min"] <= eager["gpu_proj_ns"]["max"] < 1020e3
    # the pooled median lies in the gap between them
    assert p["median_in_gap"] and graph["gpu_proj_ns"]["max"] < d["gpu_proj_ns"]["median"] < eager["gpu_proj_ns"]["min"]
    # membership comes from the cause (graph ops), which is also the even steps here
    inst = decode.instances
    rows = np.flatnonzero((inst.key.astype(str) == "decode") & inst.steady)
    assert set((inst.step[rows] % 2).tolist()) == {0, 1}


def test_no_advice_to_do_what_a_population_already_does(decode):
    fs = [f for f in decode.report["diagnosis"] if f["stage"] == "decode" and f["id"] == "launch_bound"]
    by = {f["evidence"]["population"]: f for f in fs}
    assert set(by) == {"CUDA graph replay", "no CUDA graph"}
    assert "Capture the stage in a CUDA" not in by["CUDA graph replay"]["next_step"]
    assert "already replay a CUDA graph" in by["CUDA graph replay"]["next_step"]
    assert "already replay a CUDA graph" in by["no CUDA graph"]["next_step"]
    assert "run these from the graph too" in by["no CUDA graph"]["next_step"]
    # the eager steps cost more: they lead
    assert by["no CUDA graph"]["score"] > by["CUDA graph replay"]["score"]


@pytest.mark.parametrize("name", ["h200_kvcache", "h200_reprefill", "h200_moe", "h200_threads"])
def test_one_population_stays_one(name):
    """The other real decode loops run one kind of step: no split (the test is not tuned to fire)."""
    r = build_report(run=DATA / "nsys" / f"{name}-run", trace=DATA / "nsys" / f"{name}.sqlite")
    assert [s["name"] for s in r["stages"] if s.get("populations")] == []


def test_modes_is_scale_free_and_needs_a_gap():
    rng = np.random.default_rng(0)
    one = np.exp(rng.normal(12, 0.4, 400))  # one wide lognormal population
    assert pop.modes(one) is None and pop.modes(one * 1000) is None
    two = np.r_[np.exp(rng.normal(12, 0.05, 100)), np.exp(rng.normal(13.5, 0.05, 100))]
    m = pop.modes(two)
    assert m is not None and m["separation"] > pop.MIN_SEPARATION
    assert pop.modes(two * 1000)["separation"] == pytest.approx(m["separation"])
    assert pop.modes(two[:10]) is None  # too few to judge


def test_views_print_each_population_under_its_stage(decode):
    from maxinstr.render import markdown, text

    out = text.render(decode.report, width=120)
    rows = [ln for ln in out.split("Stages (steady state)")[1].splitlines() if ln.startswith("│")]
    names = [r.split("│")[1].strip() for r in rows]
    assert names[names.index("decode") + 1: names.index("decode") + 3] == ["· CUDA graph replay", "· no CUDA graph"]
    assert "decode: two populations" in out and "told apart by CUDA graph" in out
    md = markdown.render(decode.report)
    assert "· CUDA graph replay | 24 |" in md and "`decode` has two populations" in md


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_one_kv_cache_request_is_not_two_populations(warmup):
    """h200_torch_decode-run: its steady decode steps are one population whose time grows with
    the KV cache. Per-name warm-up left request 0's ~44 ms compiling steps in (a "two populations
    nothing tells apart" split); after it, the 17 GPU-timed steps of the next request split 6/11
    by the cache's growth. Neither is two kinds of step: no split, whatever the warm-up."""
    r = build_report(run=DATA / "kineto/h200_torch_decode-run", warmup=warmup)
    assert [s["name"] for s in r["stages"] if s.get("populations")] == []


def test_unexplained_population_labels_are_times_with_units():
    """Two modes that nothing in the records tells apart are labelled by the time that splits
    them, as a reader writes it ("< 1.23 ms"), not a raw nanosecond count."""
    from maxinstr.analyze.instances import StageInstances

    rng = np.random.default_rng(1)
    n = 80
    host = np.r_[np.exp(rng.normal(14, 0.05, n // 2)), np.exp(rng.normal(16, 0.05, n // 2))].astype(np.int64)
    rng.shuffle(host)
    z = np.zeros(n, np.int64)
    inst = StageInstances(name=np.full(n, "s", object), host_start_ns=np.arange(n) * 10**8,
                          host_end_ns=np.arange(n) * 10**8 + host, gpu_event_ns=z - 1, proj_start_ns=z - 1,
                          proj_end_ns=z - 1, busy_ns=z - 1, kernel_count=z, op_count=z, idle_gap_ns=z - 1,
                          memcpy_ns=z, step=z - 1, step_marked=np.zeros(n, bool), parent=z - 1, part=z, tid=z,
                          record_id=np.arange(n), range_index=z - 1, is_mark=np.zeros(n, bool),
                          exception=np.zeros(n, bool), kernel_ns=z, depth=z, occurrence=np.arange(n),
                          iteration=np.arange(n))
    got = pop.stage_populations(inst, np.arange(n), "host_ns")
    assert got is not None and not got["explained"]
    labels = [g["label"] for g in got["groups"]]
    assert labels[0].startswith("lower mode (< ") and labels[1].startswith("upper mode (>= ")
    assert all(lab.endswith((" us)", " ms)")) for lab in labels), labels
