"""Scenario for the report's MoE rules: decode steps through mixture-of-experts layers
(router -> top-k -> tokens sorted by expert -> grouped expert matmuls -> weighted combine).

Uses torch._grouped_mm (one grouped GEMM per projection, as MoE engines do) when this torch
has it on this GPU; otherwise a loop of per-expert matmuls, and says so. Stages are marked
with maxinstr. Prints which path ran.

    python3 benchmarks/scenarios/moe_decode.py --run-dir runs/moe
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import maxinstr


def grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, counts: list[int] | None, use_grouped: bool):
    """x (T_sorted, K) @ w[e] (K, N) for each expert's contiguous slice of rows."""
    if use_grouped:
        return torch._grouped_mm(x, w, offs=offs)
    out, start = [], 0
    for e, c in enumerate(counts):
        out.append(x[start:start + c] @ w[e])
        start += c
    return torch.cat(out)


def moe_layer(x, L, top_k: int, use_grouped: bool):
    T, d = x.shape
    E = L["router"].shape[1]
    h = F.rms_norm(x, (d,))
    probs = torch.softmax(h @ L["router"], dim=-1)
    weight, expert = torch.topk(probs, top_k, dim=-1)  # routing
    flat = expert.reshape(-1)
    order = torch.argsort(flat)
    token_of = order // top_k
    counts_t = torch.bincount(flat, minlength=E)
    offs = torch.cumsum(counts_t, 0).to(torch.int32)
    counts = None if use_grouped else counts_t.tolist()
    xs = h[token_of]
    gate_up = grouped(xs, L["w1"], offs, counts, use_grouped)
    g, u = gate_up.chunk(2, dim=-1)
    y = grouped(F.silu(g) * u, L["w2"], offs, counts, use_grouped)
    y = y * weight.reshape(-1)[order, None].to(y.dtype)
    return x + torch.zeros_like(x).index_add_(0, token_of, y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=48)
    args = ap.parse_args()
    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    d, E, f = args.d_model, args.experts, args.ffn
    layers = [{"router": torch.randn(d, E, device=dev, dtype=bf, generator=g) * d ** -0.5,
               # stored (E, N, K) and used transposed: the column-major B that grouped GEMMs take
               "w1": (torch.randn(E, 2 * f, d, device=dev, dtype=bf, generator=g) * d ** -0.5).transpose(-2, -1),
               "w2": (torch.randn(E, d, f, device=dev, dtype=bf, generator=g) * f ** -0.5).transpose(-2, -1)}
              for _ in range(args.layers)]
    head = torch.randn(d, 32000, device=dev, dtype=bf, generator=g) * d ** -0.5
    x0 = torch.randn(args.batch, d, device=dev, dtype=bf, generator=g)
    use_grouped = hasattr(torch, "_grouped_mm")
    if use_grouped:
        try:
            moe_layer(x0, layers[0], args.top_k, True)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - report and fall back
            print(f"torch._grouped_mm unavailable here ({type(exc).__name__}: {str(exc)[:120]}): per-expert loop")
            use_grouped = False
    t0 = time.perf_counter()
    with maxinstr.session(args.run_dir, warmup=2, experts=E, top_k=args.top_k, d_model=d, ffn=f,
                          batch=args.batch, grouped_mm=use_grouped, dtype="bf16"):
        x = x0
        for step in range(args.steps):
            with maxinstr.stage("decode", step=step):
                for L in layers:
                    x = moe_layer(x, L, args.top_k, use_grouped)
            with maxinstr.stage("sample"):
                nxt = torch.argmax(F.rms_norm(x, (d,)) @ head, dim=-1)
                x = x0 + 0.01 * nxt[:, None].to(bf)
        torch.cuda.synchronize()
    print(f"moe: {args.steps} steps, {'torch._grouped_mm' if use_grouped else 'per-expert loop'}, "
          f"{time.perf_counter() - t0:.2f} s; run dir {args.run_dir}")


if __name__ == "__main__":
    main()
