"""Scenario for the attribution rules nsys does not apply (captured under nsys on the H200).

Per step, on a CUDA device:

- ``prefill`` (maxinstr stage, main thread) launches matmuls itself: same-thread (nsys's rule).
- ``decode`` (maxinstr stage, main thread) hands the work to a worker thread that has no range
  of its own and waits for it; the main thread also launches a little: the worker's launches
  are cross-thread (nsys leaves them out).
- ``request`` is an NVTX start/end range (``torch.cuda.nvtx.range_start``) begun on the main
  thread, which launches inside it with no push/pop range open, and ended by a finisher
  thread after that thread launched too: a start/end range ended on another thread (nsys
  skips such ranges entirely).
- ``graph`` (maxinstr stage) replays a captured CUDA graph: node kernels belong to the range
  holding ``cudaGraphLaunch`` (needs ``nsys --cuda-graph-trace=node``).

Kernel counts per part are fixed (``--mm`` matmuls each) so tests can check them exactly.

    nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node -o /tmp/t \\
        python3 benchmarks/scenarios/threads_startend.py --run-dir /tmp/t-run
"""

from __future__ import annotations

import argparse
import threading

import torch

import maxinstr


def launch(x: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        x = torch.mm(x, w)
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--mm", type=int, default=4, help="matmuls per part")
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(args.size, args.size, device=dev, generator=g) / args.size**0.5
    x = torch.randn(args.size, args.size, device=dev, generator=g)
    # Warm cuBLAS up and capture the graph before the session so setup work is not in it.
    launch(x, w, 1)
    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(static_x, w, 1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = launch(static_x, w, args.mm)
    torch.cuda.synchronize()

    out: dict[str, torch.Tensor] = {}

    def worker(inp: torch.Tensor) -> None:  # no range of its own: cross-thread launches
        out["decode"] = launch(inp, w, args.mm)

    def finisher(inp: torch.Tensor, range_id: int) -> None:  # launches, then ends `request`
        out["request"] = launch(inp, w, args.mm)
        torch.cuda.nvtx.range_end(range_id)

    with maxinstr.session(args.run_dir, warmup=1, scenario="threads_startend", mm=args.mm):
        for step in range(args.steps):
            with maxinstr.stage("prefill", step=step):
                x = launch(x, w, args.mm)
            with maxinstr.stage("decode", step=step):
                t = threading.Thread(target=worker, args=(x,), name="decode-worker")
                t.start()
                t.join()
                x = launch(out["decode"], w, 1)
            rid = torch.cuda.nvtx.range_start("request")
            x = launch(x, w, args.mm)  # main thread, no push/pop range open
            t = threading.Thread(target=finisher, args=(x, rid), name="request-finisher")
            t.start()
            t.join()
            x = out["request"]
            with maxinstr.stage("graph", step=step):
                static_x.copy_(x)
                graph.replay()
                x = static_y.clone()
            x = x / x.norm()
        torch.cuda.synchronize()
    print(f"threads_startend: {args.steps} steps, {args.mm} matmuls per part; run dir {args.run_dir}")


if __name__ == "__main__":
    main()
