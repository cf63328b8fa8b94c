"""examples/max_decoder.py end to end on the CPU: the decoder built from `max.nn` layers compiles
and generates, its serving stages land in a run directory, and the report names them. Runs in
CI (which installs `max`); on the H200 the same script runs the 8-layer bf16 model
(benchmarks/device/65-max.sh, docs/max.md)."""

from __future__ import annotations

import numpy as np
import pytest

import maxinstr

from examples_runner import python_with, run_example

REQUESTS, STEPS = 2, 3

pytestmark = pytest.mark.slow  # a cold MAX compile of its three graphs: minutes on 2 cores; cached after


@pytest.fixture(scope="module")
def decoder_run(tmp_path_factory):
    python = python_with("max.engine")
    if python is None:
        pytest.skip("MAX is not installed for any candidate interpreter (pip install max)")
    cwd = tmp_path_factory.mktemp("max_decoder")
    done = run_example(
        python, "max_decoder.py", "--run-dir", "run", "--requests", str(REQUESTS), "--steps", str(STEPS),
        "--prompt-len", "8", "--cpu", cwd=cwd, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return cwd / "run", done


def test_stages_nest_as_the_serving_loop_does(decoder_run):
    run_dir, done = decoder_run
    run = maxinstr.load(run_dir)
    names, s = run.stage_names(), run.stages
    counts = {n: int((names == n).sum()) for n in np.unique(names)}
    assert counts == {"load": 1, "request": REQUESTS, "prefill": REQUESTS, "decode": REQUESTS * STEPS,
                      "sample": REQUESTS * STEPS, "forward": REQUESTS * STEPS, "readback": REQUESTS}  # fmt: skip
    by_id = {int(i): k for k, i in enumerate(s["id"])}
    for child, parent in (("prefill", "request"), ("decode", "request"), ("readback", "request"),
                          ("sample", "decode"), ("forward", "decode")):  # fmt: skip
        parents = [by_id[int(p)] for p in s["parent_id"][names == child]]
        assert (names[parents] == parent).all(), child
    assert run.meta["user"]["model"] == "max_decoder" and run.meta["user"]["attention"] == "plain"
    out = done.stdout
    assert f"max_decoder: 2 layers, hidden 128, float32, plain attention, on CPU; {REQUESTS} requests" in out
    for name in ("prefill", "decode", "sample", "forward", "readback"):
        assert name in out, name
