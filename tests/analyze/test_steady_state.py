"""Warm-up is decided per pipeline: an instance inside a warm-up or cold-start instance of an
enclosing stage is startup too (issue 17, point 1).

Before, warm-up was counted per stage name: with ``warmup=2`` and 3 requests, the decode steps of
the two warm-up requests (first-time compilation per sequence length, ~60 ms each) counted as
steady, so the KV-cache capture's decode had a p90 of 62.85 ms against a 1.31 ms median, and the
re-prefill trace's 13.2 s cold request left its 160 decode steps in the statistics.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.fixture_columns import DATA

from maxinstr.analyze.report import analyze, build_report

NSYS = DATA / "nsys"


def _stage(report: dict, name: str) -> dict:
    return next(s for s in report["stages"] if s["name"] == name)


@pytest.fixture(scope="module")
def kvcache():
    return analyze(run=NSYS / "h200_kvcache-run", trace=NSYS / "h200_kvcache.sqlite")


def test_decode_steps_of_warmup_requests_are_warmup(kvcache):
    inst, rep = kvcache.instances, kvcache.report
    top = inst.parent.copy()
    while (inst.parent[np.maximum(top, 0)] >= 0).any():
        top = np.where((top >= 0) & (inst.parent[np.maximum(top, 0)] >= 0), inst.parent[np.maximum(top, 0)], top)
    decode = inst.key.astype(str) == "decode"
    # every steady decode step ran inside the one steady request (warmup=2 of 3 requests)
    steady_requests = np.flatnonzero((inst.key.astype(str) == "request") & inst.steady)
    assert len(steady_requests) == 1
    assert set(top[decode & inst.steady].tolist()) == set(steady_requests.tolist())
    d = _stage(rep, "decode")
    assert d["steady"] == 160 and d["inside_startup"] == 318 and d["warmup"] == 2
    # the compilation steps (~60 ms) are gone from the statistics: p90 within 2x of the median
    assert d["host_ns"]["p90"] < 2 * d["host_ns"]["median"]
    assert rep["warmup"]["inside_startup_instances"] == sum(s["inside_startup"] for s in rep["stages"])


def test_cold_request_takes_its_steps_along():
    """The re-prefill trace alone (no declared warm-up): its first request (13.2 s, cuDNN graph
    builds per sequence length) is a cold start, and its 160 decode steps with it."""
    rep = build_report(trace=NSYS / "h200_reprefill.sqlite")
    cold = [r for r in rep["startup"] if r["reason"] == "cold_start"]
    assert [(r["stage"], r["occurrence"]) for r in cold] == [("request", 0)]
    assert cold[0]["host_ns"] > 10e9 and cold[0]["nested"] == 1 + 2 * 160
    assert _stage(rep, "decode")["steady"] == 320 and _stage(rep, "decode")["inside_startup"] == 160


def test_suggested_warmup_converges_and_keeps_a_steady_request():
    """The warm-up suggestion counts top-level instances: following it removes the cold starts
    instead of suggesting a larger number each time, and never leaves a top stage empty."""
    rep = build_report(trace=NSYS / "h200_decode.sqlite")
    f = next(x for x in rep["diagnosis"] if x["id"] == "warmup_contamination")
    k = f["evidence"]["suggested_warmup"]
    # the first request is the cold start (its first calls: 44.7 ms sample, ...); nothing after it
    # is a first call (the second request's first sample had 24 before it)
    assert k == 1 and f["command"].endswith("--warmup 1")
    again = build_report(trace=NSYS / "h200_decode.sqlite", warmup=k)
    assert not [x for x in again["diagnosis"] if x["id"] == "warmup_contamination"]
    assert _stage(again, "request")["steady"] == 2


@pytest.mark.parametrize("name", ["h200_kvcache-run", "h200_reprefill-run"])
def test_run_to_run_noise_is_no_cold_start(name):
    """The last request's first `sample` (1.5-2.2x the median) had 320 `sample`s before it, in two
    warm-up requests: it is no first call, and nothing is reported as a cold start (issue 28.6:
    the report told the user to run more requests to cover it)."""
    rep = build_report(run=NSYS / name)
    assert rep["warmup"]["cold_start_instances"] == 0
    assert not [x for x in rep["diagnosis"] if x["id"] == "warmup_contamination"]
    assert _stage(rep, "sample")["steady"] == 159 + 1


# A pipeline whose stages are siblings: examples/torch_decode.py marks, per request, `prefill`,
# then one `decode` per token, then `readback`, with no stage around the request. Per stage name
# the first 2 decode *steps* were warm-up, so the steps of the two warm-up requests (request 0 ran
# ~44 ms a step, compiling per sequence length) counted as steady: decode read 187 (+5), median
# 5.22 ms, p90 37.9 ms, two "populations" that nothing told apart, and a --warmup suggestion (9,
# then 16) that never converged.
KINETO = DATA / "kineto"


@pytest.fixture(scope="module")
def torch_decode():
    return analyze(run=KINETO / "h200_torch_decode-run")


def test_sibling_stages_count_warmup_in_pipeline_iterations(torch_decode):
    inst, rep = torch_decode.instances, torch_decode.report
    assert inst.pipeline_head == "prefill" and rep["warmup"]["pipeline_head"] == "prefill"
    name = inst.key.astype(str)
    prefill_starts = np.sort(inst.host_start_ns[name == "prefill"])
    assert len(prefill_starts) == 3
    # steady top-level instances are exactly those from the third prefill on (warmup=2)
    top = (inst.level == 0) & ~inst.is_mark
    assert np.array_equal(inst.steady[top], inst.host_start_ns[top] >= prefill_starts[2])
    # every decode step of a steady request is steady, every one of a warm-up request is not
    d = _stage(rep, "decode")
    assert d["steady"] == 64 and d["warmup"] == 128 and d["cold_start"] == 0
    assert d["host_ns"]["p90"] < 1.5 * d["host_ns"]["median"]
    assert _stage(rep, "prefill")["steady"] == 1 and _stage(rep, "readback")["steady"] == 1
    # nothing left over for a cold-start or a two-population reading of one steady request
    assert d.get("populations") is None
    assert "warmup_contamination" not in {f["id"] for f in rep["diagnosis"]}
    from maxinstr.render._fmt import warmup_line

    assert warmup_line(rep["warmup"]).startswith(
        "2 declared: the first 2 pipeline iterations (each from one 'prefill' to the next) and the first 2 instances")


def test_iterations_follow_the_head_and_nested_instances_their_top_level_one(torch_decode):
    inst = torch_decode.instances
    name = inst.key.astype(str)
    top = (inst.level == 0) & ~inst.is_mark
    # load ran before the first prefill: iteration -1; each request's stages share one iteration
    assert set(inst.iteration[name == "load"].tolist()) == {-1}
    for it in range(3):
        in_it = top & (inst.iteration == it)
        assert np.count_nonzero(in_it & (name == "decode")) == 64
        assert np.count_nonzero(in_it & (name == "readback")) == 1
    from maxinstr.warmup import top_ancestor
    assert np.array_equal(inst.iteration, inst.iteration[top_ancestor(inst.parent)])


def test_one_top_level_stage_per_iteration_keeps_per_name_warmup():
    """Where the head repeats as often as every other top-level stage (a request stage around
    everything, or a training step's data/forward/backward side by side), iterations are the
    per-name occurrences: the earlier captures read as before."""
    a = analyze(run=NSYS / "h200_kvcache-run", trace=NSYS / "h200_kvcache.sqlite")
    assert a.instances.pipeline_head is None
    top = (a.instances.level == 0) & ~a.instances.is_mark
    assert np.array_equal(a.instances.iteration[top], a.instances.occurrence[top])


def _flat_pipeline(slow_prefill_ms: float, slow_readback_ms: float):
    """6 iterations of prefill (2 ms), 10 decode steps (1 ms), readback (2 ms), side by side, as a
    program records them; iteration 1's prefill and readback take the times given."""
    from maxinstr.analyze.instances import StageInstances, _finish

    names, starts, ends = [], [], []
    t = 10**9
    for it in range(6):
        for name, ms in [("prefill", slow_prefill_ms if it == 1 else 2.0)] + [("decode", 1.0)] * 10 + \
                        [("readback", slow_readback_ms if it == 1 else 2.0)]:
            names.append(name)
            starts.append(t)
            t += int(ms * 1e6)
            ends.append(t)
            t += 20_000
    n = len(names)
    z = np.zeros(n, np.int64)
    inst = StageInstances(name=np.array(names, object), host_start_ns=np.array(starts), host_end_ns=np.array(ends),
                          gpu_event_ns=z - 1, proj_start_ns=z - 1, proj_end_ns=z - 1, busy_ns=z - 1, kernel_ns=z,
                          kernel_count=z, op_count=z, idle_gap_ns=z - 1, memcpy_ns=z, step=z - 1,
                          step_marked=np.zeros(n, bool), parent=z - 1, depth=z, part=z, tid=z,
                          record_id=np.arange(n), range_index=z - 1, is_mark=np.zeros(n, bool),
                          exception=np.zeros(n, bool))
    return _finish(inst, warmup_n=1)


def test_a_cold_head_instance_takes_its_iteration_along():
    """A new user's flat pipeline (warmup=1): iteration 1's prefill and readback ran 2x slow but
    its decode steps did not, so the iteration as a whole did not stand out. The prefill (the
    head) and the readback were cold starts, and the Startup table said the prefill kept its 11
    siblings out, but the 10 decode steps stayed in the steady numbers. A cold head instance
    takes its iteration along (as a cold enclosing instance takes what it encloses)."""
    inst = _flat_pipeline(4.0, 4.0)
    name = inst.key.astype(str)
    assert inst.pipeline_head == "prefill"
    assert np.count_nonzero(inst.steady & (name == "decode")) == 40  # iterations 2..5
    assert np.count_nonzero(inst.steady & (name == "readback")) == 4
    head = np.flatnonzero(inst.iteration_head & inst.cold)
    assert len(head) == 1 and inst.iteration[head[0]] == 1


def test_a_cold_sibling_keeps_only_itself_out():
    """Only iteration 1's readback (not the head) is slow: it alone is a cold start, as a cold
    readback nested in a request would be; the iteration's decode steps stay steady."""
    inst = _flat_pipeline(2.0, 4.0)
    name = inst.key.astype(str)
    assert np.count_nonzero(inst.steady & (name == "decode")) == 50
    cold = np.flatnonzero(inst.cold)
    assert name[cold].tolist() == ["readback"] and not inst.iteration_head[cold].any()
