"""examples/max_block.py end to end on the CPU: MAX compiles and runs the block, the stages land
in a run directory, and the report names them. Runs in CI (which installs `max`); skipped where
no interpreter with MAX is found (tests/examples/runner.py says where it looks)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

import maxinstr
from maxinstr.rundir import format as fmt

from examples_runner import python_with, run_example

REQUESTS, STEPS, WARMUP = 3, 6, 1

pytestmark = pytest.mark.slow  # a cold MAX compile takes 75-100 s on 2 cores; cached after


@pytest.fixture(scope="module")
def max_python() -> str:
    python = python_with("max.engine")
    if python is None:
        pytest.skip("MAX is not installed for any candidate interpreter (pip install max)")
    return python


@pytest.fixture(scope="module")
def max_run(max_python, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("max_block")
    done = run_example(
        max_python,
        "max_block.py",
        "--run-dir", "run", "--requests", str(REQUESTS), "--steps", str(STEPS), "--warmup", str(WARMUP), "--cpu",
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return cwd / "run", done


def test_stages_in_run_directory(max_run):
    run_dir, _ = max_run
    run = maxinstr.load(run_dir)
    assert run.meta["status"] == "closed"
    names = run.stage_names()
    counts = {n: int((names == n).sum()) for n in np.unique(names)}
    assert counts == {
        "build": 1,
        "compile": 1,
        "prefill": REQUESTS,
        "decode": REQUESTS * STEPS,
        "sample": REQUESTS * STEPS,
        "forward": REQUESTS * STEPS,
        "readback": REQUESTS,
    }
    s = run.stages
    # sample and forward sit inside decode, in that order, and carry its step
    by_id = {int(i): k for k, i in enumerate(s["id"])}
    for child in ("sample", "forward"):
        rows = s[names == child]
        parents = np.array([by_id[int(p)] for p in rows["parent_id"]])
        assert (names[parents] == "decode").all()
        assert (rows["step"] == s["step"][parents]).all()
        assert (rows["host_start_ns"] >= s["host_start_ns"][parents]).all()
        assert (rows["host_end_ns"] <= s["host_end_ns"][parents]).all()
    assert sorted(s["step"][names == "decode"].tolist()) == sorted(list(range(STEPS)) * REQUESTS)
    assert ((s["flags"] & fmt.EXCEPTION) == 0).all()
    # on the CPU there is no GPU time, and nothing pretends otherwise
    assert ((s["flags"] & fmt.GPU_TIMED) == 0).all() and (s["gpu_start_ns"] == -1).all()
    # the prefill attributes travel with their records
    prefill_ids = s["id"][names == "prefill"]
    assert sorted(run.attrs[int(i)]["request"] for i in prefill_ids) == list(range(REQUESTS))


def test_compile_dominates_and_meta_says_max(max_run):
    run_dir, _ = max_run
    run = maxinstr.load(run_dir)
    names, s = run.stage_names(), run.stages
    dur = s["host_end_ns"] - s["host_start_ns"]
    compile_ns = int(dur[names == "compile"][0])
    step_ns = float(np.median(dur[names == "decode"]))
    assert compile_ns > 10 * step_ns  # even from MAX's cache (25 ms vs 0.2 ms seen), loading costs far more than a step
    assert run.meta["frameworks"].get("max", "").startswith("2")  # MAX 2x.y
    assert run.meta["user"]["model"] == "max_block" and run.meta["user"]["device"] == "cpu:0"
    assert run.meta["warmup"] == WARMUP


def test_printed_report_names_the_stages(max_run):
    _, done = max_run
    out = done.stdout
    assert f"max_block: {REQUESTS} requests x {STEPS} tokens on CPU" in out
    assert "maxinstr report" in out
    for name in ("prefill", "decode", "sample", "forward", "readback", "compile"):
        assert name in out, name


def test_report_json_and_markdown(max_run, max_python, tmp_path):
    run_dir, _ = max_run
    from examples_runner import child_env

    md = tmp_path / "report.md"
    for args in (["--format", "json", "-o", str(tmp_path / "report.json")], ["--format", "md", "-o", str(md)]):
        done = subprocess.run(
            [max_python, "-m", "maxinstr", "report", str(run_dir), "--quiet", *args],
            env=child_env(max_python), capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["schema"] == "maxinstr-report"
    assert report["environment"]["user"]["model"] == "max_block"
    text = json.dumps(report["stages"])
    for name in ("prefill", "decode", "forward"):
        assert name in text
    assert "decode" in md.read_text()


def test_gpu_code_path_on_the_cpu_gives_the_same_tokens(max_run, max_python, tmp_path):
    """--buffers runs what a GPU runs (weights and inputs as MAX Buffers, a zero-length KV cache
    buffer) on the CPU device: same seed, same tokens as the numpy path."""
    _, plain = max_run
    done = run_example(
        max_python, "max_block.py", "--run-dir", "run", "--requests", str(REQUESTS), "--steps", str(STEPS),
        "--warmup", str(WARMUP), "--cpu", "--buffers", "--no-report", cwd=tmp_path, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tokens = [line.split("first tokens ")[1].split(";")[0] for line in (plain.stdout, done.stdout)]
    assert tokens[0] == tokens[1]


def test_maxinstr_run_times_maxs_own_execute_without_edits(max_python, tmp_path):
    """`maxinstr run --stage max.engine.api:Model.execute`: MAX's own pipeline code, no edits to
    it or the script (MAX assigns Model.execute in Python, so it can be wrapped): every graph
    execution is a stage, nested in the script's prefill/sample/forward stages."""
    from examples_runner import EXAMPLES, child_env

    done = subprocess.run(
        [max_python, "-m", "maxinstr", "run", "-y", "--profiler", "none", "--stage", "max.engine.api:Model.execute",
         "-o", str(tmp_path / "run"), "--", max_python, str(EXAMPLES / "max_block.py"), "--cpu", "--no-report",
         "--requests", "1", "--steps", "2", "--warmup", "0"],
        env=child_env(max_python), cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = maxinstr.load(tmp_path / "run")
    names, s = run.stage_names(), run.stages
    by_id = {int(i): k for k, i in enumerate(s["id"])}
    execs = np.flatnonzero(names == "Model.execute")
    assert len(execs) == 1 + 2 * 2  # prefill, then sample + forward per step
    assert sorted(names[by_id[int(p)]] for p in s["parent_id"][execs]) == ["forward", "forward", "prefill", "sample", "sample"]
