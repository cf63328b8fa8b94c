"""One warm-up rule (maxinstr.warmup), and the steady-state capture that follows it as the program
runs: the report, ``Run.warmup_mask()`` and the capture start agree on the real H200 runs in
tests/data, and a short steady phase is captured whole (issue 28 point 9, issue 27 point 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import maxinstr
from maxinstr import config
from maxinstr import warmup as rule
from maxinstr.analyze.report import analyze
from maxinstr.rundir import format as fmt

DATA = Path(__file__).parents[1] / "data"
# every run directory in tests/data that holds stage records (the cupti/ fixtures are part dumps)
REAL_RUNS = ["kineto/h200_torch_decode-run", "nsys/h200_kvcache-run", "nsys/h200_kvcache-plain-run",
             "nsys/h200_reprefill-run", "nsys/h200_moe-run", "nsys/h200_threads-run", "nsys/h200_window-run",
             "max/block_run", "max/block_nsys", "max/block_kernels", "max/decoder_run", "max/decoder_kernels"]


def _columns(run):
    s = run.stages
    parent = rule.parent_rows(s["id"], s["parent_id"])
    return s, parent, rule.levels(parent), (s["flags"] & fmt.MARK) != 0


@pytest.mark.parametrize("name", REAL_RUNS)
def test_the_run_the_report_and_the_capture_share_one_warmup_rule(name):
    run = maxinstr.load(DATA / name)
    s, parent, level, is_mark = _columns(run)
    inst = analyze(run).instances  # the report's instances: one per record, in the run's order
    assert len(inst) == len(s) and np.array_equal(inst.record_id, s["id"])
    # Run.warmup_mask() is the report's warm-up and what is nested in it (the report adds only
    # the cold starts it finds in the timings, and what they hold)
    mask = run.warmup_mask()
    assert np.array_equal(mask, (inst.warmup | rule.inside(inst.parent, inst.warmup)) & ~inst.is_mark)
    assert not (mask & inst.steady).any()
    # the capture's start: no instance the report calls steady begins before it
    can = rule.steady_can_begin(s["part"], s["name_id"], level, is_mark, s["host_start_ns"], run.warmup)
    assert can.sum() == 1
    assert s["host_start_ns"][inst.steady].min() >= s["host_start_ns"][can][0]


def test_pipeline_warmup_is_the_runs_warmup_too():
    """torch_decode marks prefill, decode (64 a request) and readback side by side: warm-up=2
    is the first two requests' pipeline iterations, in Run.warmup_mask() as in the report (a
    per-name count kept only the first two decode steps out)."""
    run = maxinstr.load(DATA / "kineto/h200_torch_decode-run")
    names = run.stage_names()
    top = run["depth"] == 0
    mask = run.warmup_mask()
    assert mask[top & (names == "decode")].sum() == 128 and mask[top & (names == "prefill")].sum() == 2
    assert mask[names == "load"].all()
    report = analyze(run).report  # no cold start here: the report keeps out exactly the run's warm-up
    assert report["warmup"]["cold_start_instances"] == 0
    assert report["warmup"]["instances"] + report["warmup"]["inside_startup_instances"] == mask.sum() == 1169


def _replay(run, stage):
    """Enter and exit the run's stage records, nested as they were, in start order: the calls
    the program made. Returns the record rows in the order they were entered."""
    s, parent, _, is_mark = _columns(run)
    order = np.argsort(s["host_start_ns"], kind="stable")
    order = order[~is_mark[order]]
    children: dict[int, list[int]] = {}
    for i in order.tolist():
        children.setdefault(int(parent[i]), []).append(i)
    names = run.stage_names()
    entered: list[int] = []

    def enter(i: int) -> None:
        entered.append(i)
        with stage(str(names[i])):
            for c in children.get(i, []):
                enter(c)

    for i in children.get(-1, []):
        enter(i)
    return entered


@pytest.mark.parametrize("name", REAL_RUNS)
def test_the_core_starts_the_capture_where_the_rule_says(name, tmp_path, native, stage, monkeypatch):
    """The real stage sequences replayed through the core under MAXINSTR_CAPTURE: the capture
    starts as the instance steady_can_begin names is entered, before it is open."""
    run = maxinstr.load(DATA / name)
    s, parent, level, is_mark = _columns(run)
    entered: list[int] = []
    starts: list[int] = []
    monkeypatch.setenv(config.CAPTURE, "1")
    monkeypatch.setattr(native, "profiler_start", lambda: starts.append(len(entered)) or True, raising=False)
    monkeypatch.setattr(native, "profiler_stop", lambda: True, raising=False)

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, name):
            entered.append(0)
            return self.inner(name)

    with maxinstr.session(tmp_path / "replay", warmup=run.warmup, sample_hz=0, flush_interval_s=60):
        rows = _replay(run, Counting(stage))
    can = rule.steady_can_begin(s["part"], s["name_id"], level, is_mark, s["host_start_ns"], run.warmup)
    assert len(starts) == 1
    # starts[0] stages had been asked for when the capture started: it fired in the enter of that one
    assert rows[starts[0] - 1] == int(np.flatnonzero(can)[0])
    meta = json.loads((tmp_path / "replay" / "meta.json").read_text())
    assert meta["steady_state"]["name"] == str(run.stage_names()[can][0])


STAND_IN = textwrap.dedent("""
    import sys, time
    import maxinstr

    def busy(seconds):  # the GPU's work, on the CPU
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    with maxinstr.session(sys.argv[1], warmup=2, sample_hz=0):
        with maxinstr.stage("compile"):
            busy(0.05)
        for step in range(12):
            with maxinstr.stage("decode", step=step):
                busy(0.0004)
""")


def test_a_short_steady_phase_is_captured_whole(tmp_path):
    """Issue 27's program: one compile, then 12 decode steps of ~0.4 ms with warmup=2, under
    `maxinstr run`'s capture (MAXINSTR_RUN_DIR, MAXINSTR_CAPTURE): the whole steady phase was
    over before a flusher polling every 10 ms saw the warm-up end, and nsys caught 0 GPU ops.
    The capture must start before the first instance the report calls steady."""
    script = tmp_path / "short.py"
    script.write_text(STAND_IN)
    env = dict(os.environ, PYTHONPATH=str(Path(maxinstr.__file__).parents[1]), MAXINSTR_RUN_DIR=str(tmp_path / "run"),
               MAXINSTR_CAPTURE="1")
    env.pop("MAXINSTR_WARMUP", None)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "own")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    run = maxinstr.load(tmp_path / "run")
    meta = run.meta
    assert meta["warmup"] == 2 and meta["capture"]["requested"] == "1"
    inst = analyze(run).instances
    decode = inst.name == "decode"
    assert decode.sum() == 12 and inst.steady[decode].sum() == 10
    first_steady = int(inst.host_start_ns[inst.steady].min())
    assert meta["steady_state"]["name"] == "decode"
    # (no profiler on this machine: started is False, but the call was made, and when)
    assert meta["capture"]["start_ns"] < first_steady
    ended = inst.host_end_ns[decode]
    assert meta["capture"]["start_ns"] > np.sort(ended)[1]  # after the warm-up's two decode steps
