"""The H200 capture of benchmarks/scenarios/threads_startend.py: cross-thread launches, a
start/end range ended on another thread, graph replays, and the run-directory join.

The capture is made by benchmarks/device/20-traces.sh (into $OUT/traces/h200_threads.*); these
tests run there on the fresh capture (MAXINSTR_THREADS_CAPTURE=<sqlite>) and here once the
coordinator has copied it to tests/data/nsys/h200_threads.sqlite (with .stats/ and -run/).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest

from maxinstr.attribute import NSYS_RULES, JoinMethod, Rule, attribute
from maxinstr.attribute.summary import gpu_proj_sum, range_names
from maxinstr.traces.model import OpKind, RangeStyle
from maxinstr.traces.nsys import read_nsys

CAPTURE = Path(os.environ.get("MAXINSTR_THREADS_CAPTURE",
                              Path(__file__).resolve().parents[1] / "data" / "nsys" / "h200_threads.sqlite"))  # fmt: skip
STATS = CAPTURE.with_suffix(".stats")
RUN = CAPTURE.with_name(CAPTURE.stem + "-run")
STEPS, MM = 8, 4  # the scenario's defaults, used by the device script

pytestmark = pytest.mark.skipif(not CAPTURE.exists(), reason=f"no capture at {CAPTURE} (made on the H200)")


@pytest.fixture(scope="module")
def case():
    trace = read_nsys(CAPTURE)
    return trace, attribute(trace), attribute(trace, rules=NSYS_RULES), range_names(trace)


def kernels_by_rule(att, trace, rule):
    return int(((att.op_rule == rule) & (trace.ops.kind == OpKind.KERNEL)).sum())


def per_mm(att, names) -> int:
    """Kernels one torch.mm launches (1, or more if cuBLAS splits K): from `prefill`, which
    runs MM matmuls on the main thread."""
    pre = np.flatnonzero(names == "maxinstr:prefill")
    assert len(pre) == STEPS and len(set(att.kernel_count[pre].tolist())) == 1
    k = int(att.kernel_count[pre][0])
    assert k % MM == 0
    return k // MM


def test_start_end_range_ended_on_another_thread(case):
    trace, att, nsys_att, names = case
    R = trace.ranges
    req = np.flatnonzero(names == ":request")
    assert len(req) == STEPS
    assert np.all(R.style[req] == RangeStyle.START_END) and np.all(R.end_tid[req] != R.tid[req])
    # main thread's launches + the finisher's launches, no push/pop range on either
    assert np.all(att.kernel_count[req] == 2 * MM * per_mm(att, names))
    assert np.all(att.range_rules[req] == (1 << Rule.START_END))
    assert np.all(nsys_att.op_count[req] == 0)  # nsys skips ranges ended on another thread


def test_worker_launches_go_to_the_open_stage(case):
    trace, att, nsys_att, names = case
    dec = np.flatnonzero(names == "maxinstr:decode")
    assert len(dec) == STEPS
    k = per_mm(att, names)
    assert np.all(att.kernel_count[dec] == (MM + 1) * k)  # worker's MM + main's 1
    assert np.all(nsys_att.kernel_count[dec] == k)
    assert np.all(att.range_rules[dec] == (1 << Rule.CROSS_THREAD) | (1 << Rule.SAME_THREAD))
    assert kernels_by_rule(att, trace, Rule.CROSS_THREAD) == STEPS * MM * k


def test_graph_replays(case):
    trace, att, _, names = case
    gr = np.flatnonzero(names == "maxinstr:graph")
    k = per_mm(att, names)
    assert np.all(att.kernel_count[gr] >= MM * k)
    assert kernels_by_rule(att, trace, Rule.GRAPH) == STEPS * MM * k
    assert set(names[att.op_range[att.op_rule == Rule.GRAPH]]) == {"maxinstr:graph"}


def test_nsys_rule_equals_nsys_stats(case):
    trace, _, nsys_att, _ = case
    ref = list(csv.DictReader((STATS / "nvtx_gpu_proj_sum.csv").open()))
    ours = {r["Range"]: r for r in gpu_proj_sum(nsys_att)}
    assert set(ours) == {r["Range"] for r in ref}
    for row in ref:
        for col in ("Total Proj Time (ns)", "Range Instances", "Proj Min (ns)", "Proj Max (ns)", "Total GPU Ops"):
            assert int(ours[row["Range"]][col]) == int(row[col]), (row["Range"], col)


@pytest.mark.skipif(not RUN.is_dir(), reason="no run directory beside the capture")
def test_run_directory_joins_by_payload(case):
    trace, _, _, names = case
    from maxinstr.rundir import load

    run = load(RUN)
    att = attribute(trace, run)
    assert att.join_method == JoinMethod.PAYLOAD
    stage_ranges = np.flatnonzero(np.char.startswith(names.astype(str), "maxinstr:"))
    assert np.all(att.range_record_id[stage_ranges] >= 0)
    assert set(att.range_record_id[stage_ranges]) <= set(run.stages["id"].tolist())
