"""A multi-layer decoder built with MAX's model API (`max.nn`), its serving loop instrumented.

    pip install max                                     # MAX 26.x
    python examples/max_decoder.py [--run-dir runs/max_decoder] [--requests 3] [--steps 32]

The model is a Llama-style decoder made of `max.nn` layers (`Embedding`, `RMSNorm`, `Linear`,
`MLP` with SiLU gating, `LayerList`) and an attention layer of its own over a KV cache that the
graphs take and return (one key and one value tensor per layer). Random weights, no
downloads. On a GPU it runs in bfloat16 at a size where the GPU matters (8 layers, hidden
2048, 16 heads, FFN 5632, vocabulary 32000: about 0.5 G parameters, 1.1 GB of weights) with
MAX's flash-attention kernel; on the CPU it runs in float32 at a small size (`--small`, the
default there) with a plain softmax attention, so CI can run it.

Three graphs are compiled into one `max.graph.Module`:

    prefill   the prompt through every layer, causal attention; returns the KV cache
    decode    one token through every layer, attending to the whole cache; returns it grown
    sample    Gumbel-max sampling of the next token, which stays on the device

The serving loop's stages (maxinstr, with warm-up: the first requests compile and fill caches):

    load        build the graphs and compile them (with the weights)
    request     one prompt, holding
      prefill     the prompt through the model
      decode      one step per generated token, holding
        sample      the sampling graph
        forward     the decode graph on that token
      readback    the request's tokens to the host (the one synchronisation per request)

On a GPU every stage records its events on MAX's own queue
(`device.default_queue.native_stream_handle`): MAX runs graphs on a non-blocking stream.
For the kernels of each stage: `maxinstr run -- python examples/max_decoder.py`, or `--kernels`
(in-process, CUPTI); `--max-profiling detailed` adds MAX's own op ranges under the stages.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import maxinstr
from maxinstr.integrations.max import enable_max_profiling, max_profiling_problem, max_stream_handle


@dataclass(frozen=True)
class Config:
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


LARGE = Config(layers=8, hidden=2048, heads=16, ffn=5632, vocab=32000)
SMALL = Config(layers=2, hidden=128, heads=4, ffn=256, vocab=512)
TEMPERATURE = 0.8


def build_model(cfg: Config, dtype, device_ref, attention: str):
    """The decoder as `max.nn` modules: call it inside a `Graph` to stage its ops."""
    from max.dtype import DType
    from max.graph import ops
    from max.nn import MLP, Embedding, LayerList, Linear, Module, RMSNorm

    class Attention(Module):
        """Multi-head self-attention over a KV cache passed in and out of the graph."""

        def __init__(self) -> None:
            super().__init__()
            self.q_proj = Linear(cfg.hidden, cfg.hidden, dtype, device_ref)
            self.k_proj = Linear(cfg.hidden, cfg.hidden, dtype, device_ref)
            self.v_proj = Linear(cfg.hidden, cfg.hidden, dtype, device_ref)
            self.o_proj = Linear(cfg.hidden, cfg.hidden, dtype, device_ref)

        def __call__(self, x, k_cache, v_cache, causal: bool):
            batch, seq = x.shape[0], x.shape[1]
            heads = [batch, seq, cfg.heads, cfg.head_dim]
            q = ops.reshape(self.q_proj(x), heads)
            k = ops.concat([k_cache, ops.reshape(self.k_proj(x), heads)], axis=1)  # [B, past + S, H, Dh]
            v = ops.concat([v_cache, ops.reshape(self.v_proj(x), heads)], axis=1)
            scale = float(cfg.head_dim**-0.5)
            if attention == "flash":
                from max.nn.attention import MHAMaskVariant
                from max.nn.kernels import flash_attention_gpu

                # prefill: no cache, causal; decode: one query attends to every cached position
                mask = MHAMaskVariant.CAUSAL_MASK if causal else MHAMaskVariant.NULL_MASK
                out = flash_attention_gpu(q, k, v, mask_variant=mask, scale=scale)
            else:
                qh, kh, vh = (ops.transpose(t, 1, 2) for t in (q, k, v))  # [B, H, S, Dh]
                scores = (qh @ ops.transpose(kh, 2, 3)).cast(DType.float32) * scale
                if causal:  # lower triangle kept; the rest pushed to -1e9 before the softmax
                    keep = ops.band_part(scores * 0.0 + 1.0, num_upper=0)
                    scores = scores + (keep - 1.0) * 1e9
                out = ops.transpose(ops.softmax(scores).cast(x.dtype) @ vh, 1, 2)  # [B, S, H, Dh]
            return self.o_proj(ops.reshape(out, [batch, seq, cfg.hidden])), k, v

    class Block(Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_norm = RMSNorm(cfg.hidden, dtype, eps=1e-5)
            self.self_attn = Attention()
            self.post_attention_norm = RMSNorm(cfg.hidden, dtype, eps=1e-5)
            self.mlp = MLP(dtype, None, cfg.hidden, cfg.ffn, [device_ref], activation_function="silu")

        def __call__(self, x, k_cache, v_cache, causal: bool):
            attn, k, v = self.self_attn(self.input_norm(x), k_cache, v_cache, causal)
            x = x + attn
            # MAX's MLP takes tokens as rows ([tokens, hidden], as its ragged pipelines do)
            rows = ops.reshape(self.post_attention_norm(x), [-1, cfg.hidden])
            return x + ops.reshape(self.mlp(rows), x.shape), k, v

    class Decoder(Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = Embedding(cfg.vocab, cfg.hidden, dtype, device_ref)
            self.layers = LayerList([Block() for _ in range(cfg.layers)])
            self.norm = RMSNorm(cfg.hidden, dtype, eps=1e-5)
            self.lm_head = Linear(cfg.hidden, cfg.vocab, dtype, device_ref)

        def __call__(self, tokens, caches, causal: bool):
            x = self.embed_tokens(tokens)  # [B, S, D]
            grown = []
            for i, layer in enumerate(self.layers):
                x, k, v = layer(x, caches[2 * i], caches[2 * i + 1], causal)
                grown += [k, v]
            x = self.norm(x)
            last = ops.squeeze(x[:, -1:, :], 1)  # [B, D]: the next token's position only
            return self.lm_head(last).cast(DType.float32), grown

    return Decoder()


def build_module(cfg: Config, weights: dict, dtype, device_ref, batch: int, attention: str):
    """The prefill, decode and sample graphs as one `max.graph.Module`. Each model graph stages
    its own instance of the decoder (a weight belongs to the graph that first staged it); both
    name their weights alike, so they share the one set of values at load."""
    from max.dtype import DType
    from max.graph import Graph, Module, TensorType, ops

    module = Module()
    cache_type = TensorType(dtype, [batch, "past", cfg.heads, cfg.head_dim], device=device_ref)
    for name, causal in (("prefill", True), ("decode", False)):
        model = build_model(cfg, dtype, device_ref, attention)
        model.load_state_dict(weights)  # gives each weight its full name, which the graph uses
        seq = "seq" if causal else 1
        with Graph(
            name,
            input_types=[TensorType(DType.int64, [batch, seq], device=device_ref), *[cache_type] * (2 * cfg.layers)],
            module=module,
        ) as graph:
            tokens, *caches = (value.tensor for value in graph.inputs)
            logits, grown = model(tokens, caches, causal)
            graph.output(logits, *grown)
    f32 = DType.float32
    with Graph(
        "sample",
        input_types=[TensorType(f32, [batch, cfg.vocab], device=device_ref), TensorType(f32, [batch, cfg.vocab], device=device_ref)],
        module=module,
    ) as graph:
        logits, uniform = (value.tensor for value in graph.inputs)
        gumbel = -ops.log(-ops.log(uniform))
        graph.output(ops.argmax(logits / TEMPERATURE + gumbel, axis=-1))  # [B, 1] int64
    return module


def random_weights(cfg: Config, dtype, device_ref, seed: int) -> dict:
    """Random values for every weight of the decoder, in its dtype (bfloat16 through its bits)."""
    from max.driver import Buffer
    from max.dtype import DType

    rng = np.random.default_rng(seed)
    out = {}
    for name, weight in build_model(cfg, dtype, device_ref, "plain").raw_state_dict().items():
        shape = tuple(int(d) for d in weight.shape)
        if name.endswith("norm.weight") or "norm." in name:
            values = np.ones(shape, np.float32)
        else:
            values = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))
        if dtype == DType.bfloat16:  # numpy has no bfloat16: its top 16 bits, viewed as one
            bits = (values.view(np.uint32) >> 16).astype(np.uint16)
            out[name] = Buffer.from_numpy(bits).view(DType.bfloat16)
        else:
            out[name] = values
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default="runs/max_decoder", help="run directory to write (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=3, help="prompts to generate for (default: %(default)s)")
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt tokens (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per request (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per request (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up requests (default: %(default)s)")
    parser.add_argument("--small", action="store_true", help="the small model (the default on the CPU)")
    parser.add_argument("--layers", type=int, help="override the number of layers")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when an accelerator is present")
    parser.add_argument("--attention", choices=("auto", "flash", "plain"), default="auto",
                        help="flash: MAX's flash-attention kernel (GPU only); plain: matmul + softmax (default: flash on a GPU)")  # fmt: skip
    parser.add_argument("--kernels", action="store_true", help="collect kernels in-process (kernels=True, CUPTI)")
    parser.add_argument("--max-profiling", choices=("off", "on", "detailed"), default="off",
                        help="MAX's own NVTX ranges, nested under maxinstr's stages (default: %(default)s)")  # fmt: skip
    parser.add_argument("--no-report", action="store_true", help="do not print the report at the end")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # where MAX's markers would abort MAX (no NVTX v2 library on a CUDA machine): one line, before MAX loads
    problem = max_profiling_problem() if args.max_profiling != "off" and not args.cpu else None
    if problem:
        print(f"max_decoder.py: --max-profiling {args.max_profiling}: {problem}", file=sys.stderr)
        return 2

    try:
        from max.driver import CPU, Accelerator, Buffer, accelerator_count
        from max.dtype import DType
        from max.engine import InferenceSession
        from max.graph import DeviceRef
    except ImportError as exc:
        print(f"max_decoder.py: MAX is not installed ({exc}); `pip install max` first", file=sys.stderr)
        return 2

    on_gpu = accelerator_count() > 0 and not args.cpu
    cfg = SMALL if (args.small or not on_gpu) else LARGE
    if args.layers:
        cfg = Config(args.layers, cfg.hidden, cfg.heads, cfg.ffn, cfg.vocab)
    attention = args.attention if args.attention != "auto" else ("flash" if on_gpu else "plain")
    dtype = DType.bfloat16 if on_gpu else DType.float32
    device = Accelerator() if on_gpu else CPU()
    device_ref = DeviceRef.from_device(device)
    stream = max_stream_handle(device)  # None on the CPU: host times only
    rng = np.random.default_rng(args.seed)

    def to_device(array: np.ndarray):
        return Buffer.from_numpy(np.ascontiguousarray(array)).to(device)

    recording = maxinstr.session(
        args.run_dir,
        warmup=args.warmup,
        kernels=args.kernels,
        model="max_decoder",
        device=("gpu:" if on_gpu else "cpu:") + str(device.id),
        dtype=str(dtype).split(".")[-1],
        layers=cfg.layers,
        hidden=cfg.hidden,
        heads=cfg.heads,
        vocab=cfg.vocab,
        batch=args.batch,
        prompt_len=args.prompt_len,
        steps=args.steps,
        attention=attention,
        max_profiling=args.max_profiling,
    )
    with recording:
        session = InferenceSession(devices=[device])
        if on_gpu and args.max_profiling != "off":
            enable_max_profiling(args.max_profiling, session=session)  # before load: affects the compile
        t0 = time.perf_counter()
        with maxinstr.stage("load", stream=stream):
            weights = random_weights(cfg, dtype, device_ref, args.seed)
            module = build_module(cfg, weights, dtype, device_ref, args.batch, attention)
            models = session.load_all(module, weights_registry=weights)
            prefill, decode, sampler = models["prefill"], models["decode"], models["sample"]
        load_s = time.perf_counter() - t0

        empty = Buffer.zeros((args.batch, 0, cfg.heads, cfg.head_dim), dtype, device=device)
        generated: list[np.ndarray] = []
        decode_s = 0.0
        for request in range(args.requests):
            prompt = rng.integers(0, cfg.vocab, (args.batch, args.prompt_len)).astype(np.int64)
            noise = [to_device(rng.uniform(1e-6, 1.0 - 1e-6, (args.batch, cfg.vocab)).astype(np.float32)) for _ in range(args.steps)]
            with maxinstr.stage("request", stream=stream, request=request):
                with maxinstr.stage("prefill", stream=stream, tokens=args.prompt_len):
                    logits, *cache = prefill.execute(to_device(prompt), *[empty] * (2 * cfg.layers))
                tokens = []
                t1 = time.perf_counter()
                for step in range(args.steps):
                    with maxinstr.stage("decode", step=step, stream=stream):
                        with maxinstr.stage("sample", stream=stream):
                            (token,) = sampler.execute(logits, noise[step])
                        with maxinstr.stage("forward", stream=stream):
                            logits, *cache = decode.execute(token, *cache)
                    tokens.append(token)
                with maxinstr.stage("readback", stream=stream):
                    generated.append(np.concatenate([t.to_numpy() for t in tokens], axis=1))
                if request >= args.warmup:
                    decode_s += time.perf_counter() - t1

    steady = max(0, args.requests - args.warmup)
    rate = f"{steady * args.steps * args.batch / decode_s:.1f} tokens/s steady" if decode_s > 0 else "no steady request"
    run_dir = Path(args.run_dir) if recording.path in (None, Path(args.run_dir).absolute()) else recording.path
    print(
        f"max_decoder: {cfg.layers} layers, hidden {cfg.hidden}, {str(dtype).split('.')[-1]}, {attention} attention, on "
        f"{'GPU' if on_gpu else 'CPU'}; {args.requests} requests x {args.steps} tokens; load {load_s:.1f} s; {rate}; "
        f"first tokens {generated[0][0, :8].tolist()}; run directory {run_dir}"
    )
    if not args.no_report:
        from maxinstr.cli import main as maxinstr_main

        return maxinstr_main(["report", str(run_dir), "--quiet"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
