"""Workloads for the sampler's GPU proofs (run on the H200; needs torch and a CUDA GPU).

    python tests/sample/gpu_workloads.py matmul SECONDS   # bf16 8192^3 matmuls back to back
    python tests/sample/gpu_workloads.py tiny SECONDS     # Python loop: one tiny kernel, then a sync
    python tests/sample/gpu_workloads.py idle SECONDS
"""

from __future__ import annotations

import sys
import time


def matmul(seconds: float) -> int:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):
            a @ b
        torch.cuda.synchronize()
        n += 8
    return n


def tiny(seconds: float) -> int:
    import torch

    x = torch.zeros(16, device="cuda")
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        x.add_(1.0)
        torch.cuda.synchronize()
        n += 1
    return n


if __name__ == "__main__":
    mode, secs = sys.argv[1], float(sys.argv[2])
    if mode == "idle":
        time.sleep(secs)
        count = 0
    else:
        count = {"matmul": matmul, "tiny": tiny}[mode](secs)
    print(f"{mode}: {count} iterations in {secs:g} s", file=sys.stderr)
