"""A CuPy pipeline on two streams (copy and compute overlapped), its stages recorded by maxinstr.

    python examples/cupy_pipeline.py [--run-dir runs/cupy_pipeline] [--batches 24]

Each batch is copied to the GPU on a copy stream while the previous batch is processed on a
compute stream (a matmul, a fused elementwise kernel, a row reduction), and the result comes
back on the copy stream. CUDA events order the two streams; the host never waits inside the
loop. Stages:

    setup     allocate pinned host buffers, device buffers and weights
    batch     one per batch (host-only: it spans both streams), holding
      h2d       copy the next batch in             (events on the copy stream)
      compute   matmul + GELU + row norm            (events on the compute stream)
      d2h       copy the result out                 (events on the copy stream)
    drain     wait for the last batch

Every stage passes its own stream (`stream=copy_stream` / `compute_stream`: maxinstr reads
`.ptr`), because both are non-blocking streams: events on the legacy default stream would not
wait for their work. Without CuPy or a CUDA GPU the script says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import maxinstr


def _gpu_unavailable() -> str | None:
    """Why this machine cannot run the pipeline, or None when it can."""
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not installed ({exc})"
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device"
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return f"no CUDA device ({exc})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default="runs/cupy_pipeline", help="run directory to write (default: %(default)s)")
    parser.add_argument("--batches", type=int, default=24, help="batches to push through (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=8192, help="rows per batch (default: %(default)s)")
    parser.add_argument("--cols", type=int, default=2048, help="columns (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up instances per stage (default: %(default)s)")
    parser.add_argument("--no-report", action="store_true", help="do not print the report at the end")
    args = parser.parse_args(argv)

    why = _gpu_unavailable()
    if why:
        print(f"cupy_pipeline: skipped: {why}; this example needs CuPy and a CUDA GPU", file=sys.stderr)
        return 0

    import cupy as cp
    import cupyx
    import numpy as np

    gelu = cp.ElementwiseKernel(
        "T x", "T y", "y = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)))", "maxinstr_gelu"
    )

    recording = maxinstr.session(
        args.run_dir, warmup=args.warmup, model="cupy_pipeline", dtype="float32", rows=args.rows, cols=args.cols
    )
    with recording:
        copy_stream = cp.cuda.Stream(non_blocking=True)
        compute_stream = cp.cuda.Stream(non_blocking=True)
        with maxinstr.stage("setup"):
            shape = (args.rows, args.cols)
            # Two slots of everything: batch i computes in one while batch i+1 arrives in the other.
            # Pinned host buffers: copies from and to them run asynchronously on their stream.
            host_in = [cupyx.empty_pinned(shape, np.float32) for _ in range(2)]
            host_out = [cupyx.empty_pinned(args.rows, np.float32) for _ in range(2)]
            dev_in = [cp.empty(shape, cp.float32) for _ in range(2)]
            dev_out = [cp.empty(args.rows, cp.float32) for _ in range(2)]
            weight = cp.random.standard_normal((args.cols, args.cols), dtype=cp.float32) / np.sqrt(args.cols)
            rng = np.random.default_rng(0)
            for h in host_in:
                h[...] = rng.standard_normal(shape, dtype=np.float32)
            cp.cuda.Device().synchronize()
        arrived = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
        computed = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
        copied_out = [cp.cuda.Event(disable_timing=True) for _ in range(2)]

        for i in range(args.batches):
            slot = i % 2
            # The batch stage spans two streams, so it keeps host times only (gpu=False); its
            # children carry the GPU times, each on its own stream.
            with maxinstr.stage("batch", step=i, gpu=False):
                with copy_stream:
                    with maxinstr.stage("h2d", stream=copy_stream):
                        if i >= 2:
                            copy_stream.wait_event(computed[slot])  # slot free again
                        dev_in[slot].set(host_in[slot], stream=copy_stream)
                        arrived[slot].record(copy_stream)
                with compute_stream:
                    with maxinstr.stage("compute", stream=compute_stream):
                        compute_stream.wait_event(arrived[slot])
                        if i >= 2:
                            compute_stream.wait_event(copied_out[slot])  # its last result is out
                        y = gelu(dev_in[slot] @ weight)
                        cp.sqrt((y * y).sum(axis=1), out=dev_out[slot])
                        computed[slot].record(compute_stream)
                with copy_stream:
                    with maxinstr.stage("d2h", stream=copy_stream):
                        copy_stream.wait_event(computed[slot])
                        cp.asnumpy(dev_out[slot], stream=copy_stream, out=host_out[slot], blocking=False)
                        copied_out[slot].record(copy_stream)
        with maxinstr.stage("drain"):
            copy_stream.synchronize()
            compute_stream.synchronize()
        checksum = float(host_out[(args.batches - 1) % 2].sum())

    # under `maxinstr run` the session writes to the run's directory, not --run-dir
    run_dir = Path(args.run_dir) if recording.path in (None, Path(args.run_dir).absolute()) else recording.path
    print(
        f"cupy_pipeline: {args.batches} batches of {args.rows}x{args.cols} float32 on two streams; "
        f"last checksum {checksum:.4g}; run directory {run_dir}"
    )
    if not args.no_report:
        from maxinstr.cli import main as maxinstr_main

        return maxinstr_main(["report", str(run_dir), "--quiet"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
