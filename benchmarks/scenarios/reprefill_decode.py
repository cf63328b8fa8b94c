"""Scenario for the report's re-prefill rule: a decode loop WITHOUT a KV cache, which re-runs
the whole sequence (prompt + tokens so far) every step, so step time grows with the step
index (O(n^2) overall) and each decode step runs the prefill's kernels. ``--mode kvcache``
runs the same model with a KV cache (one token per step) as the healthy contrast.

Stages are marked with maxinstr (NVTX domain "maxinstr", payload = record id), so the run
directory joins the nsys trace exactly.

Sizing. A matmul of T rows against the weights costs max(weight read, 2*T*params FLOPs): below
the GPU's ridge point (a few hundred rows for bf16 on an H200) it takes the same time for 1 or
T rows, and a re-prefill is barely slower than a cached step. ``--batch B`` decodes B sequences
at once, so a re-prefilling step multiplies B*(prompt + step) rows: with the defaults 40-report.sh
uses (``--batch 16 --prompt 32 --d-model 4096 --steps 160``) that is 528 -> 3,072 rows, compute-
bound throughout, and the matmul time of a step should grow ~3x from the first to the last
quarter of the steps ((32 + 140) / (32 + 20)), against a flat 16 rows per step with the cache.
(The 2026-12-03 capture, batch 1, d_model 8192, prompt 128: 129 -> 288 rows, partly under the
ridge, grew 1.47x.)

Attention runs on PyTorch's flash / memory-efficient SDPA kernels (``--sdpa flash``, default),
not cuDNN's: cuDNN's SDPA builds a graph for every new sequence length. In the 2026-12-03
capture (tests/data/nsys/h200_reprefill.sqlite) each decode step of the first request waited
~58 ms between the QKV matmul and the first layer's SDPA (the second layer's: 0.09 ms), so the
first request of each run took ~13 s.
``--sdpa default`` leaves the choice to PyTorch.

    python3 benchmarks/scenarios/reprefill_decode.py --mode reprefill --run-dir runs/rp
    python3 benchmarks/scenarios/reprefill_decode.py --mode kvcache  --run-dir runs/kv
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.nn.functional as F

import maxinstr


def build(d: int, layers: int, vocab: int, device: str):
    g = torch.Generator(device=device).manual_seed(0)
    s = d ** -0.5

    def w(*shape, scale=s):
        return (torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=g) * scale)

    ff = int(3.5 * d) // 128 * 128
    return {
        "emb": w(vocab, d, scale=1.0),
        "head": w(vocab, d),
        "layers": [{"qkv": w(3 * d, d), "o": w(d, d), "gate_up": w(2 * ff, d), "down": w(d, ff, scale=ff ** -0.5)}
                   for _ in range(layers)],
    }


def forward(m, x, heads: int, cache=None):
    """x: (B, T, d) hidden states of the tokens to process. With ``cache`` (list per layer of
    [K, V] (B, heads, T_past, hd)), attends to the cached keys and appends the new ones.
    Returns the logits of each sequence's last position, (B, 1, vocab)."""
    B, T, d = x.shape
    hd = d // heads
    for i, L in enumerate(m["layers"]):
        h = F.rms_norm(x, (d,))
        q, k, v = (h @ L["qkv"].T).split(d, dim=-1)
        q, k, v = (t.view(B, T, heads, hd).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            if len(cache) <= i:
                cache.append([k, v])
            else:
                cache[i][0] = torch.cat([cache[i][0], k], dim=2)
                cache[i][1] = torch.cat([cache[i][1], v], dim=2)
                k, v = cache[i]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=(T > 1))
        x = x + a.transpose(1, 2).reshape(B, T, d) @ L["o"].T
        h = F.rms_norm(x, (d,))
        gate, up = (h @ L["gate_up"].T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ L["down"].T
    return F.rms_norm(x[:, -1:], (d,)) @ m["head"].T


def sdpa_backends(choice: str):
    """A context choosing the SDPA kernels: flash / memory-efficient (math as a last resort),
    or PyTorch's default choice."""
    if choice == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("reprefill", "kvcache"), default="reprefill")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--d-model", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    ap.add_argument("--steps", type=int, default=192)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--sdpa", choices=("flash", "default"), default="flash")
    args = ap.parse_args()
    dev = "cuda"
    m = build(args.d_model, args.layers, args.vocab, dev)
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt), device=dev,
                           generator=torch.Generator(device=dev).manual_seed(1))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with sdpa_backends(args.sdpa), \
         maxinstr.session(args.run_dir, warmup=2, mode=args.mode, d_model=args.d_model, layers=args.layers,
                          prompt=args.prompt, batch=args.batch, steps=args.steps, dtype="bf16", sdpa=args.sdpa):
        for _ in range(args.requests):
            with maxinstr.stage("request"):
                tokens = prompt.clone()
                cache = [] if args.mode == "kvcache" else None
                with maxinstr.stage("prefill"):
                    logits = forward(m, m["emb"][tokens], args.heads, cache)
                for step in range(args.steps):
                    with maxinstr.stage("sample"):
                        nxt = torch.argmax(logits, dim=-1)  # (B, 1)
                        tokens = torch.cat([tokens, nxt], dim=1)
                    with maxinstr.stage("decode", step=step):
                        if args.mode == "kvcache":
                            logits = forward(m, m["emb"][nxt], args.heads, cache)
                        else:  # the bug under study: no cache, the whole sequence again
                            logits = forward(m, m["emb"][tokens], args.heads)
                torch.cuda.synchronize()
    print(f"{args.mode}: {args.requests} x {args.batch} x ({args.prompt} prompt + {args.steps} steps) in "
          f"{time.perf_counter() - t0:.2f} s; run dir {args.run_dir}")


if __name__ == "__main__":
    main()
