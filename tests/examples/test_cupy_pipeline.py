"""examples/cupy_pipeline.py: without CuPy or a GPU it says so and exits 0 without writing a run;
on the H200 its h2d/compute/d2h stages are GPU-timed on their own two streams."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import maxinstr
from maxinstr.rundir import format as fmt
from examples_runner import python_with, run_example


def test_skips_clearly_without_gpu(tmp_path):
    """No CuPy, or CuPy with every GPU hidden: one line on stderr, status 0, no run directory."""
    python = python_with("cupy") or sys.executable
    done = run_example(python, "cupy_pipeline.py", "--run-dir", "run", cwd=tmp_path, timeout=120, CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0, done.stderr
    assert "cupy_pipeline: skipped:" in done.stderr and "needs CuPy and a CUDA GPU" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.gpu
def test_two_streams_gpu_timed(tmp_path):
    python = python_with("cupy")
    if python is None:
        pytest.skip("CuPy is not installed for any candidate interpreter")
    batches = 8
    done = run_example(
        python, "cupy_pipeline.py", "--run-dir", "run", "--batches", str(batches), "--rows", "2048", "--cols", "1024",
        "--warmup", "1", cwd=tmp_path, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = maxinstr.load(tmp_path / "run")
    names, s = run.stage_names(), run.stages
    for name in ("h2d", "compute", "d2h"):
        rows = s[names == name]
        assert len(rows) == batches
        assert ((rows["flags"] & fmt.GPU_TIMED) != 0).all(), name
    batch = s[names == "batch"]
    assert len(batch) == batches and ((batch["flags"] & fmt.GPU_TIMED) == 0).all()  # gpu=False
    # per batch, the copy in finishes on the GPU before its compute ends (events order them)
    h2d = np.sort(s[names == "h2d"], order="step")
    comp = np.sort(s[names == "compute"], order="step")
    assert (h2d["gpu_end_ns"] <= comp["gpu_end_ns"]).all()
    assert "compute" in done.stdout
