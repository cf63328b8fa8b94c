"""examples/torch_decode.py end to end: on the CPU (host times) where torch is installed, and on
a GPU (GPU-timed stages on torch's current stream) on the lent H200."""

from __future__ import annotations

import numpy as np
import pytest

import maxinstr
from maxinstr.rundir import format as fmt

from examples_runner import python_with, run_example

REQUESTS, STEPS, LAYERS, WARMUP = 2, 4, 2, 1


@pytest.fixture(scope="module")
def torch_python() -> str:
    python = python_with("torch")
    if python is None:
        pytest.skip("PyTorch is not installed for any candidate interpreter")
    return python


def _run(python, cwd, *extra):
    done = run_example(
        python,
        "torch_decode.py",
        "--run-dir", "run", "--requests", str(REQUESTS), "--steps", str(STEPS), "--layers", str(LAYERS),
        "--hidden", "128", "--batch", "2", "--prompt-len", "16", "--warmup", str(WARMUP), *extra,
        cwd=cwd, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return maxinstr.load(cwd / "run"), done


def _check_structure(run):
    names, s = run.stage_names(), run.stages
    counts = {n: int((names == n).sum()) for n in np.unique(names)}
    forwards = REQUESTS * (STEPS + 1)  # the prefill runs every layer too
    assert counts == {
        "load": 1, "prefill": REQUESTS, "decode": REQUESTS * STEPS, "sample": REQUESTS * STEPS,
        "forward": REQUESTS * STEPS, "layer": forwards * LAYERS, "readback": REQUESTS,
    }
    by_id = {int(i): k for k, i in enumerate(s["id"])}
    layer_rows = np.flatnonzero(names == "layer")
    parent_names = {names[by_id[int(s["parent_id"][k])]] for k in layer_rows}
    assert parent_names == {"prefill", "forward"}
    assert sorted({run.attrs[int(s["id"][k])]["layer"] for k in layer_rows}) == list(range(LAYERS))
    assert ((s["flags"] & fmt.EXCEPTION) == 0).all()


def test_torch_decode_cpu(torch_python, tmp_path):
    run, done = _run(torch_python, tmp_path, "--cpu")
    _check_structure(run)
    assert ((run.stages["flags"] & fmt.GPU_TIMED) == 0).all()
    assert run.meta["user"]["device"] == "cpu"
    assert "decode" in done.stdout and "forward/layer" in done.stdout  # the report's nested stage


@pytest.mark.gpu
def test_torch_decode_gpu(torch_python, tmp_path):
    run, _ = _run(torch_python, tmp_path)
    _check_structure(run)
    names, s = run.stage_names(), run.stages
    assert run.meta["user"]["device"] == "cuda"
    for name in ("prefill", "decode", "sample", "forward", "layer"):
        rows = s[names == name]
        timed = (rows["flags"] & fmt.GPU_TIMED) != 0
        sampled = (rows["flags"] & fmt.GPU_SAMPLED_OUT) != 0  # left untimed by the GPU-timing budget
        assert timed.any() and (timed | sampled).all(), f"{name}: {int((~timed & ~sampled).sum())} of {len(rows)} lost GPU time"
        assert (rows["gpu_end_ns"][timed] >= rows["gpu_start_ns"][timed]).all()
    # the GPU runs behind the host: a decode step's GPU work cannot start before it was launched
    dec = s[names == "decode"]
    dec = dec[(dec["flags"] & fmt.GPU_TIMED) != 0]
    assert (dec["gpu_start_ns"] >= dec["host_start_ns"] - 50_000).all()
