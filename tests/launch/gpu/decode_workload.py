"""GPU workload for benchmarks/device/50-run.sh: a decode-like PyTorch loop in a maxinstr
session with warm-up. Warm-up steps also run a warm-up-only kernel (cumsum), so a trace that
contains it captured warm-up.   usage: python decode_workload.py STEPS [WARMUP]"""
import sys
import time

import torch

import maxinstr

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
warmup = int(sys.argv[2]) if len(sys.argv) > 2 else 3
torch.manual_seed(0)
d, layers = 4096, 4
W = [torch.randn(d, d, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(layers)]
x = torch.randn(1, d, device="cuda", dtype=torch.bfloat16)
with maxinstr.session("runs/decode-workload", warmup=warmup, workload="decode_workload"):
    with maxinstr.stage("prefill"):
        h = torch.randn(512, d, device="cuda", dtype=torch.bfloat16)
        for w in W:
            h = torch.nn.functional.silu(h @ w)
    for step in range(steps):
        with maxinstr.stage("decode", step=step):
            if step < warmup:
                torch.cumsum(x.float(), dim=-1)  # warm-up-only kernel: must not be in the capture
            y = x
            for w in W:
                y = torch.nn.functional.rms_norm(torch.nn.functional.silu(y @ w), (d,))
        with maxinstr.stage("sample", step=step):
            tok = torch.argmax(y, dim=-1)
            x = y / (1 + tok.to(y.dtype))
        torch.cuda.synchronize()
        time.sleep(0.02)
print("steps", steps, "last", int(tok[0]))
