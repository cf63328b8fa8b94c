"""Scenario for multi-rank runs: a data-parallel-like loop under torchrun, one straggler rank.

Each step: ``compute`` runs bf16 matmuls on the rank's GPU (the straggler rank runs
``--slow-factor`` times as many), then ``allreduce`` all-reduces a CUDA tensor through
torch.distributed and waits for it. Every rank leaves ``allreduce`` when the last one has
arrived, so the fast ranks' ``allreduce`` is long: that is waiting for the straggler, which
``maxinstr report`` names (report["ranks"], finding ``straggler_rank``).

Backend: ``nccl`` when every rank has a GPU of its own (one process per GPU), else ``gloo``
on CUDA tensors (NCCL refuses two ranks on one GPU). Stages carry NVTX ranges (domain
"maxinstr", payload = record id), so per-rank nsys traces join their rank's records.

    torchrun --nproc-per-node 2 benchmarks/scenarios/ranks_collective.py --run-dir runs/ranks --straggler 1
    # per-rank nsys traces:
    torchrun --nproc-per-node 2 --no-python nsys profile -t cuda,nvtx -o r%q{RANK} \\
        python3 benchmarks/scenarios/ranks_collective.py --run-dir runs/ranks --straggler 1
    maxinstr report runs/ranks --trace r0.nsys-rep --trace r1.nsys-rep
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import maxinstr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--matmuls", type=int, default=16, help="matmuls per step on a normal rank")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--straggler", type=int, default=1, help="rank that does more work (-1: none)")
    ap.add_argument("--slow-factor", type=float, default=3.0)
    ap.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"])
    ap.add_argument("--elements", type=int, default=1 << 22, help="all-reduced fp32 elements (16 MiB)")
    args = ap.parse_args()

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    n_gpu = torch.cuda.device_count()
    own_gpu = n_gpu >= int(os.environ.get("LOCAL_WORLD_SIZE", world))
    backend = args.backend if args.backend != "auto" else ("nccl" if own_gpu and n_gpu else "gloo")
    if n_gpu:
        dev = torch.device("cuda", local % n_gpu)
        torch.cuda.set_device(dev)
        sync = lambda: torch.cuda.synchronize(dev)  # noqa: E731
    else:  # a dry run on a machine without a GPU: gloo on CPU tensors
        dev, sync = torch.device("cpu"), (lambda: None)
    dist.init_process_group(backend, device_id=dev if backend == "nccl" else None)
    dtype = torch.bfloat16 if n_gpu else torch.float32
    a = torch.randn(args.size, args.size, device=dev, dtype=dtype)
    b = torch.randn(args.size, args.size, device=dev, dtype=dtype)
    grad = torch.ones(args.elements, device=dev, dtype=torch.float32)
    n_mm = int(args.matmuls * (args.slow_factor if rank == args.straggler else 1))
    if rank == 0:
        print(f"world {world}, backend {backend}, {n_gpu} GPU(s) visible, straggler rank {args.straggler}: "
              f"{int(args.matmuls * args.slow_factor)} matmuls per step vs {args.matmuls} on the others", flush=True)
    dist.barrier()
    with maxinstr.session(args.run_dir, warmup=args.warmup, backend=backend, straggler=args.straggler):
        for step in range(args.steps):
            with maxinstr.stage("step", step=step):
                with maxinstr.stage("compute", step=step):
                    c = a
                    for _ in range(n_mm):
                        c = torch.matmul(c, b)
                        c = c * (1.0 / args.size ** 0.5)
                    sync()
                with maxinstr.stage("allreduce", step=step):
                    dist.all_reduce(grad)
                    sync()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
