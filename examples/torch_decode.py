"""A PyTorch decode loop (prefill, N decode steps, sampling), its stages recorded by maxinstr.

    python examples/torch_decode.py [--run-dir runs/torch_decode] [--steps 32] [--requests 4]

A small GPT-style model (embedding, pre-norm attention with a KV cache through
`scaled_dot_product_attention`, SwiGLU MLP, LM head) generates tokens for a few prompts. Stages:

    load      build the model and move it to the device
    prefill   the prompt through every layer (fills the KV cache)
    decode    one step per token, holding
      forward   every layer on the new token (with per-layer `layer` stages inside)
      sample    temperature + top-k sampling (torch.multinomial)
    readback  the request's tokens to the host (the one synchronisation per request)

Every stage records its GPU events on torch's *current* stream (`stream=` the handle from
`maxinstr.integrations.torch.torch_stream_handle()`), so on a GPU each stage gets its GPU time;
on a CPU-only machine the same script records host times. Run it under
`maxinstr run -- python examples/torch_decode.py` for the kernels of each stage.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import maxinstr
from maxinstr.integrations.torch import torch_stream_handle


def build_model(torch, vocab: int, hidden: int, layers: int, heads: int, device, dtype):
    nn = torch.nn
    F = torch.nn.functional

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.RMSNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            self.out = nn.Linear(hidden, hidden, bias=False)
            self.norm2 = nn.RMSNorm(hidden)
            self.gate_up = nn.Linear(hidden, 2 * 4 * hidden, bias=False)
            self.down = nn.Linear(4 * hidden, hidden, bias=False)

        def forward(self, x, cache):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, heads, hidden // heads).transpose(1, 3).unbind(2)
            if cache is not None:
                k = torch.cat([cache[0], k], dim=2)
                v = torch.cat([cache[1], v], dim=2)
            # Causal within the prompt; a single new token sees the whole cache.
            a = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None and s > 1)
            x = x + self.out(a.transpose(1, 2).reshape(b, s, hidden))
            gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(gate) * up), (k, v)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.norm = nn.RMSNorm(hidden)
            self.head = nn.Linear(hidden, vocab, bias=False)

        def forward(self, tokens, caches, stream):
            x = self.embed(tokens)
            new_caches = []
            for i, layer in enumerate(self.layers):
                with maxinstr.stage("layer", stream=stream, layer=i):
                    x, cache = layer(x, caches[i] if caches else None)
                new_caches.append(cache)
            return self.head(self.norm(x[:, -1])), new_caches

    return Model().to(device=device, dtype=dtype).eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default="runs/torch_decode", help="run directory to write (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=4, help="prompts (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per request (default: %(default)s)")
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt tokens (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per request (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=None, help="layers (default: 8 on a GPU, 2 on the CPU)")
    parser.add_argument("--hidden", type=int, default=None, help="hidden size (default: 1024 on a GPU, 128 on the CPU)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up instances per stage (default: %(default)s)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    parser.add_argument("--kernels", action="store_true", help="collect kernels in-process (kernels=True, CUPTI)")
    parser.add_argument("--torch-profiler", metavar="TRACE_JSON", default=None,
                        help="also run under torch.profiler (CPU + CUDA activity) and write its trace here")  # fmt: skip
    parser.add_argument("--no-report", action="store_true", help="do not print the report at the end")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError as exc:
        print(f"torch_decode.py: PyTorch is not installed ({exc}); `pip install torch` first", file=sys.stderr)
        return 2

    on_gpu = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    layers = args.layers or (8 if on_gpu else 2)
    hidden = args.hidden or (1024 if on_gpu else 128)
    heads = max(1, hidden // 128)
    vocab = 32000 if on_gpu else 4096
    torch.manual_seed(args.seed)
    torch.set_grad_enabled(False)
    if not on_gpu:
        torch.set_num_threads(1)  # small matrices: threads only add contention on a shared CPU

    profiler = contextlib.nullcontext()
    if args.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    recording = maxinstr.session(
        args.run_dir,
        warmup=args.warmup,
        kernels=args.kernels,
        model="torch_decode",
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        layers=layers,
        hidden=hidden,
        batch=args.batch,
        prompt_len=args.prompt_len,
        steps=args.steps,
    )
    with profiler, recording:
        stream = torch_stream_handle() if on_gpu else None  # torch's current stream; None: host times
        with maxinstr.stage("load", stream=stream):
            model = build_model(torch, vocab, hidden, layers, heads, device, dtype)

        tokens_per_s: list[float] = []  # decode + readback of each request
        for request in range(args.requests):
            prompt = torch.randint(0, vocab, (args.batch, args.prompt_len), device=device)
            with maxinstr.stage("prefill", stream=stream, request=request, tokens=args.batch * args.prompt_len):
                logits, caches = model(prompt, None, stream)
            tokens = []
            t_request = time.perf_counter()
            for step in range(args.steps):
                with maxinstr.stage("decode", step=step, stream=stream):
                    with maxinstr.stage("sample", stream=stream):
                        top = torch.topk(logits.float() / 0.8, k=50, dim=-1)
                        pick = torch.multinomial(torch.softmax(top.values, dim=-1), 1)
                        token = top.indices.gather(-1, pick)  # [batch, 1], stays on the device
                    with maxinstr.stage("forward", stream=stream):
                        logits, caches = model(token, caches, stream)
                tokens.append(token)
            with maxinstr.stage("readback", stream=stream, request=request):
                generated = torch.cat(tokens, dim=1).cpu()  # the one sync of the request
            tokens_per_s.append(args.batch * args.steps / (time.perf_counter() - t_request))

    if args.torch_profiler:
        profiler.export_chrome_trace(args.torch_profiler)
    # under `maxinstr run` the session writes to the run's directory, not --run-dir
    run_dir = Path(args.run_dir) if recording.path in (None, Path(args.run_dir).absolute()) else recording.path
    print(
        f"torch_decode: {args.requests} requests x {args.batch} sequences x {args.steps} tokens, "
        f"{layers} layers, hidden {hidden}, {dtype} on {device}; decode tokens/s per request "
        f"{[round(x, 1) for x in tokens_per_s]}; first tokens {generated[0, :8].tolist()}; "
        f"run directory {run_dir}"
    )
    if not args.no_report:
        from maxinstr.cli import main as maxinstr_main

        return maxinstr_main(["report", str(run_dir), "--quiet"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
