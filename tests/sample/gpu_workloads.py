"""Workloads for the sampler's GPU proofs (run on the H200; needs torch and a CUDA GPU).

    python tests/sample/gpu_workloads.py matmul SECONDS   # bf16 8192^3 matmuls back to back
    python tests/sample/gpu_workloads.py tiny SECONDS     # Python loop: one tiny kernel, then a sync
    python tests/sample/gpu_workloads.py narrow SECONDS   # back-to-back kernels of one 32-thread block (cupy)
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


NARROW_SRC = r"""
extern "C" __global__ void spin(float *x, long long cycles) {
    long long t0 = clock64();
    float v = x[threadIdx.x];
    while (clock64() - t0 < cycles) { v = v * 0.999f + 0.001f; }
    x[threadIdx.x] = v;
}
"""


def narrow(seconds: float) -> int:
    """A kernel is always running (NVML utilization ~100 %) but it fills one SM of 132:
    SM activity ~1 %. What utilization alone cannot tell from a busy GPU."""
    import cupy as cp

    kernel = cp.RawKernel(NARROW_SRC, "spin")
    x = cp.ones(32, dtype=cp.float32)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(50):
            kernel((1,), (32,), (x, cp.int64(2_000_000)))  # ~1 ms at ~2 GHz
        cp.cuda.Device().synchronize()
        n += 50
    return n


if __name__ == "__main__":
    mode, secs = sys.argv[1], float(sys.argv[2])
    if mode == "idle":
        time.sleep(secs)
        count = 0
    else:
        count = {"matmul": matmul, "tiny": tiny, "narrow": narrow}[mode](secs)
    print(f"{mode}: {count} iterations in {secs:g} s", file=sys.stderr)
