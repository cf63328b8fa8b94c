"""What watching cost (analyze/footprint.py): the report's estimate of maxinstr's own share of
each stage's time, from the stage cost the session measured when it opened and the counters it
recorded. Runs made here, on the CPU, with real sessions."""

from __future__ import annotations

import json

import numpy as np
import pytest

import maxinstr
from maxinstr.analyze.footprint import _subtree_sums
from maxinstr.analyze.report import analyze
from helpers.fixture_columns import DATA


def _run(path, steps: int, inner_work: int):
    """decode > (sample, forward > layer x 4): the nested shape of a decode step; ``inner_work``
    iterations of a Python loop in each layer."""
    with maxinstr.session(path, sample_hz=0, warmup=1):
        for step in range(steps):
            with maxinstr.stage("decode", step=step):
                with maxinstr.stage("sample"):
                    pass
                with maxinstr.stage("forward"):
                    for _ in range(4):
                        with maxinstr.stage("layer"):
                            for _ in range(inner_work):
                                pass
    return maxinstr.load(path)


def test_the_session_measures_what_a_stage_costs_and_keeps_no_record_of_it(tmp_path):
    run = _run(tmp_path / "r", steps=5, inner_work=0)
    part = json.loads(next((tmp_path / "r" / "parts").glob("*/part.json")).read_text())
    stage_ns = part["footprint"]["stage_ns"]
    assert 10 < stage_ns < 1_000_000  # a real measurement, in ns
    # the probe's 2000 stages left nothing: only the program's 5 x 7
    assert len(run.stages) == 35 and "maxinstr.probe" not in set(run.stage_names().tolist())


def test_a_parent_carries_the_cost_of_what_is_nested_in_it(tmp_path):
    an = analyze(_run(tmp_path / "r", steps=40, inner_work=200))
    fp = an.report["footprint"]
    assert fp is not None and fp["op_ns"] is None and fp["gpu_timed_instances"] == 0  # CPU: stages only
    inst = an.instances
    n_sub = _subtree_sums(inst, np.ones(len(inst)))
    names = inst.key.astype(str)
    # decode holds itself, sample, forward and 4 layers: 7 stages' costs; forward 5; layer 1
    assert set(n_sub[names == "decode"]) == {7.0} and set(n_sub[names == "forward"]) == {5.0}
    assert set(n_sub[names == "layer"]) == {1.0}
    steady = inst.steady & (names == "decode")
    # no GPU driver here: a stage is felt at its probed cost (STAGE_FELT is for stages between launches)
    assert fp["stage_felt"] == 1.0
    expect = 7 * fp["stage_ns"] * fp["stage_felt"] * steady.sum() / inst.host_ns[steady].sum()
    assert fp["share_by_stage"]["decode"] == pytest.approx(min(expect, 1.0), rel=1e-9)
    # an empty stage is all cost; a stage around real work much less
    assert fp["share_by_stage"]["sample"] > fp["share_by_stage"]["layer"]
    assert fp["overall_share"] == pytest.approx(fp["share_by_stage"]["decode"], rel=1e-9)  # decode is the top level


def test_stages_around_almost_nothing_get_the_finding_with_the_cheaper_setting(tmp_path):
    report = analyze(_run(tmp_path / "r", steps=50, inner_work=0)).report
    assert report["footprint"]["overall_share"] > 0.05
    (finding,) = [f for f in report["diagnosis"] if f["id"] == "observer_cost"]
    assert finding["verdict"] == "hypothesis" and "mark fewer, coarser stages" in finding["next_step"]
    # the cost is the stages' enter/exit, timed host-only: turning their GPU timing off saves none of it
    assert "gpu=False" not in finding["next_step"], finding["next_step"]
    assert finding["evidence"]["by_source"].startswith("stages 100%")
    from maxinstr.render.text import render

    text = render(report, width=120)
    assert "watching maxinstr's own work ~" in text and "of the staged time" in text


def test_stages_around_real_work_cost_little_and_say_nothing(tmp_path):
    report = analyze(_run(tmp_path / "r", steps=20, inner_work=200_000)).report
    assert report["footprint"]["overall_share"] < 0.01
    assert not [f for f in report["diagnosis"] if f["id"] == "observer_cost"]


def test_a_run_recorded_before_the_probe_has_no_estimate():
    """The H200 decoder run in tests/data was recorded before sessions measured a stage's cost."""
    report = analyze(DATA / "kineto" / "h200_torch_decode-run").report
    assert report["footprint"] is None
    from maxinstr.render.text import render

    assert "watching" not in render(report, width=120)
