"""Multi-rank runs: real torchrun-style processes (RANK / LOCAL_RANK / WORLD_SIZE) each write
their part of one run directory, with a real synchronisation between them (a TCP exchange in
the stage ``allreduce``, rank_worker.py); ``maxinstr report`` merges them, shows per-rank
stage statistics and names the straggler, and stays quiet when the ranks are balanced."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import maxinstr
from maxinstr.analyze import ranks as rk
from maxinstr.analyze.families import classify_one

from helpers.pin_times import part_records

HERE = Path(__file__).parent
DATA = HERE.parent / "data"
SRC = str(Path(maxinstr.__file__).parents[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAXINSTR_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(run_dir: Path, world: int, slow_rank: int, slow_s: float, base_s: float, steps: int,
              *extra: str) -> list[int]:
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(HERE / "rank_worker.py"), str(run_dir), str(slow_rank), str(slow_s),
                               str(base_s), str(steps), *extra],
                              env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    return [p.pid for p in procs]


def pin_steps(run_dir: Path, compute_ms: dict[int, float], outside_ms: dict[int, float] | None = None,
              base_ms: float = 10.0, exchange_ns: int = 100_000) -> None:
    """Every rank's recorded steps set to the timeline rank_worker.py gives with exact sleeps: step
    i of every rank begins at one instant (plus the rank's unstaged ``outside`` time), ``compute``
    lasts the rank's pace, ``allreduce`` lasts until the last rank has arrived plus ``exchange_ns``,
    and the ranks leave it together. The processes, the session and the parts are the real ones;
    only their host times are pinned: a sleep on a loaded machine overshoots by tens of ms (and the
    exchange waits for the scheduler), which made the verdicts depend on the load, not the rules."""
    from maxinstr.rundir import format as fmt

    outside_ms = outside_ms or {}
    parts = []
    for part, names, rows in part_records(run_dir):  # all read first: the timeline needs every rank
        rank = json.loads((part / fmt.PART_FILE).read_text())["rank"]
        ids = {s: i for i, s in names.items()}
        sel = {name: np.flatnonzero(rows["name_id"] == ids[name]) for name in ("step", "compute", "allreduce")}
        sel = {name: i[np.argsort(rows["host_start_ns"][i], kind="stable")] for name, i in sel.items()}
        assert len(set(map(len, sel.values()))) == 1 and len(rows) == 3 * len(sel["step"])  # nothing else recorded
        parts.append((part, rank, rows, sel))
    ms = 1_000_000
    lead = {r: int(outside_ms.get(r, 0.0) * ms) for _, r, _, _ in parts}
    pace = {r: int(compute_ms.get(r, base_ms) * ms) for _, r, _, _ in parts}
    busy = max(lead[r] + pace[r] for r in pace)  # the last rank reaches allreduce
    period = busy + exchange_ns + 50_000
    t0 = min(int(rows["host_start_ns"][sel["step"][0]]) for _, _, rows, sel in parts)  # one host: one clock
    for part, r, rows, sel in parts:
        begin = t0 + np.arange(len(sel["step"]), dtype=np.int64) * period + lead[r]
        leave = begin - lead[r] + busy + exchange_ns
        rows["host_start_ns"][sel["step"]], rows["host_end_ns"][sel["step"]] = begin, leave
        rows["host_start_ns"][sel["compute"]], rows["host_end_ns"][sel["compute"]] = begin, begin + pace[r]
        rows["host_start_ns"][sel["allreduce"]], rows["host_end_ns"][sel["allreduce"]] = begin + pace[r], leave
        rows.tofile(part / fmt.STAGES_FILE)


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "maxinstr", "report", *args, "--quiet"], env=_env(),
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ranks") / "run"
    run_ranks(run_dir, world=2, slow_rank=1, slow_s=0.03, base_s=0.01, steps=12)
    pin_steps(run_dir, {1: 30.0})
    return run_dir


def test_each_rank_writes_its_part(straggler_run):
    run = maxinstr.load(straggler_run)
    assert sorted(p["rank"] for p in run.parts) == [0, 1]
    assert all(p["world_size"] == 2 and p["local_rank"] == p["rank"] and p["host"] for p in run.parts)
    # 12 steps x (step, compute, allreduce) per rank
    assert np.bincount(run["rank"]).tolist() == [36, 36]


def test_report_names_the_straggler_with_numbers(straggler_run):
    out = report(str(straggler_run), "--format", "json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    sec = rep["ranks"]
    assert sec["world_size"] == 2 and [r["rank"] for r in sec["ranks"]] == [0, 1]
    stages = {s["stage"]: s for s in sec["stages"]}
    compute = {r["rank"]: r for r in stages["compute"]["per_rank"]}
    assert compute[1]["host_ns"]["median"] > 2 * compute[0]["host_ns"]["median"]
    assert compute[1]["slowest_share"] >= 0.9
    # 12 steps, the first is warm-up; each rank keeps one pace (pinned), so no step is a cold start
    assert [r for r in rep["startup"] if r["reason"] == "cold_start"] == []
    assert stages["compute"]["groups"] == 11
    ar = stages["allreduce"]
    assert ar["sync"] is True  # the ranks leave it together
    wait = {r["rank"]: r["wait_median_ns"] for r in ar["per_rank"]}
    assert wait[0] > 10e6 and wait[1] < 5e6  # rank 0 waits ~20 ms per step for rank 1
    assert [s["rank"] for s in sec["stragglers"]] == [1]
    sg = sec["stragglers"][0]
    assert [s["stage"] for s in sg["slowest_in"]] == ["compute"]  # not its parent 'step', not the wait
    assert [s["stage"] for s in sg["others_wait_in"]] == ["allreduce"]
    found = [f for f in rep["diagnosis"] if f["id"] == "straggler_rank"]
    assert len(found) == 1 and found[0]["evidence"]["rank"] == 1 and found[0]["stage"] == "compute"
    assert found[0]["evidence"]["rank0_wait_median_ns"] > 10e6

    text = report(str(straggler_run))
    assert text.returncode == 0, text.stderr
    assert "Per-rank stage statistics" in text.stdout and "allreduce [sync]" in text.stdout
    assert "rank 1 is the slowest at 'compute'" in " ".join(text.stdout.split())
    assert "the other ranks wait for rank 1 in 'allreduce'" in " ".join(text.stdout.split())
    md = report(str(straggler_run), "--format", "md").stdout
    assert "## Ranks" in md and "straggler: rank 1" in md and "| allreduce \\[sync] | 0 |" in md  # (the [ escaped: a name is text)
    html = report(str(straggler_run), "--format", "html").stdout
    assert '<section id="ranks">' in html and "straggler: rank 1" in html


def test_balanced_ranks_have_no_straggler(tmp_path):
    run_dir = tmp_path / "run"
    run_ranks(run_dir, world=2, slow_rank=-1, slow_s=0.0, base_s=0.01, steps=12)
    pin_steps(run_dir, {})  # both ranks at 10 ms: a loaded machine's sleeps made a step a cold start
    out = report(str(run_dir), "--format", "json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["ranks"]["world_size"] == 2
    assert rep["ranks"]["stragglers"] == []
    assert not [f for f in rep["diagnosis"] if f["id"] == "straggler_rank"]
    compute = {s["stage"]: s for s in rep["ranks"]["stages"]}["compute"]
    assert compute["groups"] == 11 and all(r["host_ns"]["n"] == 11 for r in compute["per_rank"])
    assert "no straggler" in report(str(run_dir)).stdout


def test_three_ranks_one_straggler(tmp_path):
    run_dir = tmp_path / "run"
    run_ranks(run_dir, world=3, slow_rank=2, slow_s=0.03, base_s=0.01, steps=8)
    pin_steps(run_dir, {2: 30.0})
    rep = json.loads(report(str(run_dir), "--format", "json").stdout)
    assert [s["rank"] for s in rep["ranks"]["stragglers"]] == [2]
    ar = {s["stage"]: s for s in rep["ranks"]["stages"]}["allreduce"]
    waits = {r["rank"]: r["wait_median_ns"] for r in ar["per_rank"]}
    assert waits[0] > 10e6 and waits[1] > 10e6 and waits[2] < 5e6


def test_slow_rank_is_not_a_cold_start(tmp_path):
    """Cold starts are judged per process: pooled over 3 ranks, the median and MAD were the fast
    ranks', and the slow rank's first steady steps (3x their pace) were thrown out as "cold
    start" with a false warmup_contamination (issue 17, point 1)."""
    run_dir = tmp_path / "run"
    run_ranks(run_dir, world=3, slow_rank=2, slow_s=0.03, base_s=0.01, steps=8)
    pin_steps(run_dir, {2: 30.0})
    rep = json.loads(report(str(run_dir), "--format", "json").stdout)
    # pooled, the slow rank's first 3 steady steps were all "cold" (3x the pooled median); per
    # process, each rank keeps one pace, so none is
    cold = [r for r in rep["startup"] if r["reason"] == "cold_start" and r["stage"] == "compute"]
    assert cold == [], cold
    contamination = [f for f in rep["diagnosis"] if f["id"] == "warmup_contamination"]
    assert not contamination or contamination[0]["evidence"]["ratio_by_stage"].get("compute", 0) < 2.5
    compute = {s["stage"]: s for s in rep["ranks"]["stages"]}["compute"]
    n = {r["rank"]: r["host_ns"]["n"] for r in compute["per_rank"]}
    assert n == {0: 7, 1: 7, 2: 7}  # 8 steps, the first warm-up
    # pooled over ranks the steps are two populations (10 ms and 30 ms), told apart by the process
    pops = next(s for s in rep["stages"] if s["name"] == "compute")["populations"]
    assert pops["by"] == "process" and sorted(g["instances"] for g in pops["groups"]) == sorted([n[2], n[0] + n[1]])


def test_straggler_outside_every_stage_is_named_by_its_late_arrival(tmp_path):
    """Rank 1's extra time is spent in no stage: its stages take as long as rank 0's, but it
    reaches the collective last every step and rank 0 waits there."""
    run_dir = tmp_path / "run"
    run_ranks(run_dir, 2, 1, 0.03, 0.01, 10, "outside")
    pin_steps(run_dir, {}, outside_ms={1: 20.0})
    rep = json.loads(report(str(run_dir), "--format", "json").stdout)
    (sg,) = rep["ranks"]["stragglers"]
    assert sg["rank"] == 1 and sg["slowest_in"] == []
    assert [s["stage"] for s in sg["others_wait_in"]] == ["allreduce"]
    assert sg["others_wait_in"][0]["arrival_median_ns"] > 10e6
    (f,) = [f for f in rep["diagnosis"] if f["id"] == "straggler_rank"]
    assert f["stage"] == "allreduce" and f["evidence"]["rank0_wait_median_ns"] > 10e6


def test_one_rank_run_has_no_rank_section(tmp_path):
    run_dir = tmp_path / "run"
    run_ranks(run_dir, world=1, slow_rank=-1, slow_s=0.0, base_s=0.001, steps=3)
    rep = json.loads(report(str(run_dir), "--format", "json").stdout)
    assert rep["ranks"] is None


# -- per-rank traces --------------------------------------------------------------------------
def _two_rank_run(tmp_path: Path) -> tuple[Path, object]:
    """A run directory of two ranks whose stage records mirror the maxinstr ranges of the real
    h200_decode capture (tests/data/nsys: ids = NVTX payloads), and that capture as each rank's
    trace (r0.sqlite, r1.sqlite). Both ranks carry the same record ids (as ranks on two hosts
    with the same pid would): each trace must join only its own rank's records."""
    from maxinstr.rundir import format as fmt
    from maxinstr.traces.nsys import read_nsys

    trace = read_nsys(DATA / "nsys" / "h200_decode.sqlite")
    R = trace.ranges
    names, name_id = np.unique(np.asarray(trace.strings, dtype=object)[R.name_id].astype(str), return_inverse=True)
    run = tmp_path / "run"
    (run / "parts").mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION,
                                               "status": "closed", "warmup": 0}))
    for r in (0, 1):
        part = run / "parts" / f"r{r}.p{465 + r}"
        part.mkdir()
        recs = np.zeros(len(R), fmt.STAGE_DTYPE)
        recs["id"], recs["parent_id"], recs["tid"] = R.payload, -1, R.tid
        recs["host_start_ns"], recs["host_end_ns"] = R.start_ns, R.end_ns
        recs["gpu_start_ns"] = recs["gpu_end_ns"] = recs["step"] = -1
        recs["name_id"] = name_id
        recs.tofile(part / fmt.STAGES_FILE)
        (part / fmt.STRINGS_FILE).write_text("".join(json.dumps({"id": i, "s": n}) + "\n" for i, n in enumerate(names)))
        (part / fmt.PART_FILE).write_text(json.dumps({"pid": 465 + r, "rank": r, "local_rank": r, "world_size": 2,
                                                      "host": "h", "status": "closed"}))
        shutil.copy(DATA / "nsys" / "h200_decode.sqlite", tmp_path / f"r{r}.sqlite")
    return run, trace


def test_each_rank_trace_joins_its_rank(tmp_path):
    run, trace = _two_rank_run(tmp_path)
    n_ranges, n_ops = len(trace.ranges), len(trace.ops)
    out = report(str(run), "--trace", str(tmp_path / "r0.sqlite"), "--trace", str(tmp_path / "r1.sqlite"), "--format", "json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["sources"]["join"] == "payload"
    assert rep["sources"]["records_joined"] == 2 * n_ranges  # every record of both ranks, none twice
    assert rep["gpu"]["ops"] == 2 * n_ops
    gpu = {g["rank"]: g for g in rep["ranks"]["gpu"]}
    assert sorted(gpu) == [0, 1] and gpu[0]["ops"] == gpu[1]["ops"] == n_ops
    assert gpu[0]["gpu_ns"] == gpu[1]["gpu_ns"] == rep["gpu"]["gpu_ns"] / 2
    assert gpu[0]["collective_share"] == 0.0  # no NCCL kernel in this capture
    # both ranks ran the same trace: per-rank GPU numbers of every stage are equal, and nobody straggles
    for st in rep["ranks"]["stages"]:
        a, b = st["per_rank"]
        assert st["gpu_basis"] == "gpu_proj_ns" and a["gpu_proj_ns"] == b["gpu_proj_ns"] and a["gpu_proj_ns"]["n"] > 0
    assert rep["ranks"]["stragglers"] == []
    assert any("process ids clash" in n for n in rep["sources"]["notes"])
    assert f"--trace 1={tmp_path / 'r1.sqlite'}" in rep["reproduce"][-1]["command"]
    # one rank's trace alone joins that rank only
    one = json.loads(report(str(run), "--trace", str(tmp_path / "r1.sqlite"), "--format", "json").stdout)
    assert one["sources"]["records_joined"] == n_ranges
    assert [g["rank"] for g in one["ranks"]["gpu"]] == [1]
    # RANK=FILE works whatever the names; a duplicate rank is a one-line error
    swapped = report(str(run), "--trace", f"1={tmp_path / 'r0.sqlite'}", "--trace", f"0={tmp_path / 'r1.sqlite'}", "--format", "json")
    assert swapped.returncode == 0, swapped.stderr
    bad = report(str(run), "--trace", str(tmp_path / "r0.sqlite"), "--trace", f"0={tmp_path / 'r1.sqlite'}")
    assert bad.returncode != 0 and "two traces for rank 0" in bad.stderr and "Traceback" not in bad.stderr


def test_rank_reports_match_the_schema(straggler_run, tmp_path):
    """``ranks`` of a real multi-rank run (stragglers named) and of per-rank traces (GPU per rank)
    holds the keys and types of maxinstr/analyze/schema.py (tests/analyze/test_schema.py has the rest)."""
    from helpers.schema_check import problems
    from maxinstr.analyze import schema

    run, _ = _two_rank_run(tmp_path)
    for args in ((str(straggler_run),), (str(run), "--trace", str(tmp_path / "r0.sqlite"), "--trace", str(tmp_path / "r1.sqlite"))):
        out = report(*args, "--format", "json")
        assert out.returncode == 0, out.stderr
        rep = json.loads(out.stdout)
        assert rep["ranks"] is not None and problems(rep, schema.Report) == []


def test_assign_trace_ranks():
    assert rk.assign_trace_ranks(["out/r0.sqlite", "out/r1.sqlite"], [0, 1]) == [(0, "out/r0.sqlite"), (1, "out/r1.sqlite")]
    assert rk.assign_trace_ranks(["t_rank-3.nsys-rep"], [0, 3]) == [(3, "t_rank-3.nsys-rep")]
    assert rk.assign_trace_ranks(["2=a.sqlite"], [0, 2]) == [(2, "a.sqlite")]
    assert rk.assign_trace_ranks(["a.sqlite", "b.sqlite"], [0, 1]) == [(0, "a.sqlite"), (1, "b.sqlite")]  # by order
    with pytest.raises(ValueError, match="cannot tell which rank"):
        rk.assign_trace_ranks(["a.sqlite", "r1.sqlite"], [0, 1])
    with pytest.raises(ValueError, match="the run has ranks"):
        rk.assign_trace_ranks(["r5.sqlite"], [0, 1])
    assert rk.trace_rank_from_name("/x/run3/prof.sqlite") is None  # only the file name counts


def test_collective_kernels_are_classified_as_collectives():
    for name in ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_AllGather_RING_LL_Sum_int8_t",
                 "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "ncclDevKernel_SendRecv",
                 "void ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm *, unsigned long, ncclWork *)",
                 "rcclGenericKernel<1, false>", "cross_device_reduce_1stage"):
        assert classify_one(name) == "collective", name


# -- the numpy functions themselves ---------------------------------------------------------
def test_aligned_groups_keep_only_steps_every_rank_has():
    # stage 0 on ranks 0 and 1 three times, rank 1 misses the third; stage 1 once each
    key = np.array([0, 0, 0, 0, 0, 1, 1])
    rank = np.array([0, 0, 0, 1, 1, 0, 1])
    start = np.array([10, 20, 30, 11, 21, 5, 6])
    rows, gkey = rk.aligned_groups(key, rank, start, 2, np.array([0, 1]))
    assert gkey.tolist() == [0, 0, 1]
    assert rows.tolist() == [[0, 3], [1, 4], [5, 6]]


def test_judge_stage_wait_versus_slowness():
    g = 6
    # a collective: rank 1 arrives 20 ms late, both leave together
    start = np.array([[0, 20_000_000]] * g, np.int64) + np.arange(g)[:, None] * 10**8
    end = start[:, :1] + 21_000_000 + np.array([0, 1000])
    v = rk.judge_stage(rk.group_metrics(start, end))
    assert v["sync"] and v["waited_for"].tolist() == [False, True] and not v["slow"].any()
    # a compute stage: rank 1 takes 3x longer, starts together
    start = np.zeros((g, 2), np.int64)
    end = np.array([[10_000_000, 30_000_000]] * g, np.int64)
    v = rk.judge_stage(rk.group_metrics(start, end))
    assert not v["sync"] and v["slow"].tolist() == [False, True]
    # noise: 1% apart, alternating
    end = np.array([[10_000_000, 10_100_000], [10_100_000, 10_000_000]] * 3, np.int64)
    v = rk.judge_stage(rk.group_metrics(start, end))
    assert not v["slow"].any() and not v["waited_for"].any()


def test_record_ids_renumbered_per_part_and_payloads_per_rank():
    from maxinstr.rundir.reader import RUN_STAGE_DTYPE

    st = np.zeros(5, RUN_STAGE_DTYPE)
    # two parts (ranks 0 and 1) with the same ids; parent 7 -> 9 in each part
    st["id"] = [7, 9, 7, 9, 11]
    st["parent_id"] = [9, -1, 9, -1, 7]
    st["part"] = [0, 0, 1, 1, 1]
    st["rank"] = [0, 0, 1, 1, 1]
    ids, parents = rk.dense_record_ids(st)
    assert ids.tolist() == [0, 1, 2, 3, 4]
    assert parents.tolist() == [1, -1, 3, -1, 2]  # each parent found in its own part
    assert rk.payload_rows(st, 1, np.array([9, 7, 11, 5, -1])).tolist() == [3, 2, 4, -1, -1]
    assert rk.payload_rows(st, 0, np.array([11, 7])).tolist() == [-1, 0]
