"""A small transformer-like block in Modular MAX, its decode loop instrumented with maxinstr.

    pip install max                                   # MAX 26.x; runs on the CPU too
    python examples/max_block.py [--run-dir runs/max_block] [--steps 16] [--requests 3]

The block is built with `max.graph` (embedding gather, RMS norm, q/k/v matmuls, an attention
over a growing KV cache, a SiLU MLP, the LM head) and a second graph samples the next token
(Gumbel-max: argmax of logits/T plus Gumbel noise). Both compile in one `max.graph.Module`
and run with `max.engine.InferenceSession` on the first accelerator, or on the CPU when there
is none.

The pipeline's stages are maxinstr stages inside a session with warm-up:

    build     the Python graph construction
    compile   InferenceSession.load_all: graph compilation and weight binding
    prefill   the prompt through the block (fills the KV cache)
    decode    one step per generated token, holding
      sample    the sampling graph (next token stays on the device)
      forward   the block on that token
    readback  the request's tokens back to the host (the one synchronisation per request)

On a GPU every stage records its events on MAX's own queue
(`device.default_queue.native_stream_handle`): MAX runs graphs on a non-blocking stream that
events on the legacy default stream would not wait for. At the end the script prints the
per-stage report (`maxinstr report RUN_DIR`); under `maxinstr run` / nsys, add the trace.

Cold, the compile stage is most of the run: MAX compiles every kernel for this machine
(75 to 100 s on a 2-core CPU); later runs load it from MAX's cache (~/.cache/modular) in
well under a second. The numbers are in README.md, "MAX example".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import maxinstr
from maxinstr.integrations.max import enable_max_profiling, max_profiling_problem, max_stream_handle

# Model size: small enough that a cold CPU compile stays near a minute and a decode step is
# well under a millisecond on the CPU; the structure, not the size, is the point.
BATCH = 1
HIDDEN = 64
FFN = 128
VOCAB = 256
TEMPERATURE = 0.8


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {
        "embed": (VOCAB, HIDDEN),
        "wq": (HIDDEN, HIDDEN),
        "wk": (HIDDEN, HIDDEN),
        "wv": (HIDDEN, HIDDEN),
        "wo": (HIDDEN, HIDDEN),
        "w_up": (HIDDEN, FFN),
        "w_down": (FFN, HIDDEN),
        "lm_head": (HIDDEN, VOCAB),
    }
    weights = {name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32) for name, shape in shapes.items()}
    for name in ("norm_attn", "norm_mlp", "norm_out"):
        weights[name] = np.ones(HIDDEN, np.float32)
    return weights


def build_module(device_ref, weights: dict[str, np.ndarray]):
    """The block and the sampler as one `max.graph.Module` (one compilation unit)."""
    from max.dtype import DType
    from max.graph import Graph, Module, TensorType, Weight, ops

    f32 = DType.float32

    def block(tokens, k_cache, v_cache):
        w = {name: Weight(name, f32, array.shape, device_ref) for name, array in weights.items()}
        x = ops.gather(w["embed"], tokens, axis=0)  # [B, S, D]
        h = ops.rms_norm(x, w["norm_attn"], epsilon=1e-5)
        q, k, v = h @ w["wq"], h @ w["wk"], h @ w["wv"]
        k_all = ops.concat([k_cache, k], axis=1)  # [B, past + S, D]
        v_all = ops.concat([v_cache, v], axis=1)
        # Single-head attention over the cache. No causal mask: the example times stages, and
        # masking would only add one more kernel to compile.
        scores = (q @ ops.transpose(k_all, 1, 2)) * float(1.0 / np.sqrt(HIDDEN))
        x = x + (ops.softmax(scores) @ v_all) @ w["wo"]
        h = ops.rms_norm(x, w["norm_mlp"], epsilon=1e-5)
        x = x + ops.silu(h @ w["w_up"]) @ w["w_down"]
        x = ops.rms_norm(x, w["norm_out"], epsilon=1e-5)
        logits = ops.squeeze(x[:, -1:, :] @ w["lm_head"], 1)  # [B, V], last position only
        return logits, k_all, v_all

    module = Module()
    with Graph(
        "block",
        input_types=[
            TensorType(DType.int64, [BATCH, "seq"], device=device_ref),
            TensorType(f32, [BATCH, "past", HIDDEN], device=device_ref),
            TensorType(f32, [BATCH, "past", HIDDEN], device=device_ref),
        ],
        module=module,
    ) as graph:
        graph.output(*block(*(value.tensor for value in graph.inputs)))
    with Graph(
        "sample",
        input_types=[TensorType(f32, [BATCH, VOCAB], device=device_ref), TensorType(f32, [BATCH, VOCAB], device=device_ref)],
        module=module,
    ) as graph:
        logits, uniform = (value.tensor for value in graph.inputs)
        gumbel = -ops.log(-ops.log(uniform))
        graph.output(ops.argmax(logits / TEMPERATURE + gumbel, axis=-1))  # [B, 1] int64
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default="runs/max_block", help="run directory to write (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=4, help="prompts to generate for (default: %(default)s)")
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=16, help="decode steps per request (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up instances per stage (default: %(default)s)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when an accelerator is present")
    parser.add_argument(
        "--buffers", action="store_true", help="on the CPU too, pass MAX Buffers as on a GPU (tests the GPU code path)"
    )
    parser.add_argument(
        "--max-profiling",
        choices=("off", "on", "detailed"),
        default="off",
        help="MAX's own NVTX markers (GPU only), nested under maxinstr's stages in nsys (default: %(default)s)",
    )
    parser.add_argument("--kernels", action="store_true", help="collect kernels in-process (kernels=True, CUPTI)")
    parser.add_argument("--no-report", action="store_true", help="do not print the report at the end")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # where MAX's markers would abort MAX (no NVTX v2 library on a CUDA machine): one line, before MAX loads
    problem = max_profiling_problem() if args.max_profiling != "off" and not args.cpu else None
    if problem:
        print(f"max_block.py: --max-profiling {args.max_profiling}: {problem}", file=sys.stderr)
        return 2

    try:
        from max.driver import CPU, Accelerator, Buffer, accelerator_count
        from max.engine import InferenceSession
        from max.graph import DeviceRef
    except ImportError as exc:
        print(f"max_block.py: MAX is not installed ({exc}); `pip install max` first", file=sys.stderr)
        return 2

    on_gpu = accelerator_count() > 0 and not args.cpu
    device = Accelerator() if on_gpu else CPU()
    stream = max_stream_handle(device)  # None on the CPU: host times only
    rng = np.random.default_rng(args.seed)
    weights = _weights(args.seed)

    host_arrays: list[np.ndarray] = []

    def to_device(array: np.ndarray):
        """A MAX Buffer on the device (a GPU copy), or on the CPU the numpy array itself."""
        if not (on_gpu or args.buffers):
            return array
        host = np.ascontiguousarray(array)
        # Buffer.from_numpy is a view of `host` and .to() copies only to another device: on the
        # CPU the buffer reads `host` for as long as MAX uses it, so keep it alive.
        host_arrays.append(host)
        return Buffer.from_numpy(host).to(device)

    recording = maxinstr.session(
        args.run_dir,
        warmup=args.warmup,
        kernels=args.kernels,
        model="max_block",
        device=("gpu:" if on_gpu else "cpu:") + str(device.id),
        dtype="float32",
        hidden=HIDDEN,
        vocab=VOCAB,
        prompt_len=args.prompt_len,
        steps=args.steps,
        max_profiling=args.max_profiling,
    )
    with recording:
        with maxinstr.stage("build"):
            module = build_module(DeviceRef.from_device(device), weights)

        session = InferenceSession(devices=[device])
        if on_gpu and args.max_profiling != "off":
            enable_max_profiling(args.max_profiling, session=session)  # before load: affects the compile
        t0 = time.perf_counter()
        with maxinstr.stage("compile", stream=stream):
            registry = {name: to_device(array) for name, array in weights.items()}
            models = session.load_all(module, weights_registry=registry)
            block, sampler = models["block"], models["sample"]
        compile_s = time.perf_counter() - t0

        empty_cache = np.zeros((BATCH, 0, HIDDEN), np.float32)
        generated: list[np.ndarray] = []
        for request in range(args.requests):
            prompt = rng.integers(0, VOCAB, (BATCH, args.prompt_len)).astype(np.int64)
            # Host-side noise for the sampler, made before the loop so the loop times MAX alone.
            noise = [to_device(rng.uniform(1e-6, 1.0 - 1e-6, (BATCH, VOCAB)).astype(np.float32)) for _ in range(args.steps)]
            with maxinstr.stage("prefill", stream=stream, request=request, tokens=args.prompt_len):
                logits, k_cache, v_cache = block.execute(to_device(prompt), to_device(empty_cache), to_device(empty_cache))
            tokens = []
            for step in range(args.steps):
                with maxinstr.stage("decode", step=step, stream=stream):
                    with maxinstr.stage("sample", stream=stream):
                        (token,) = sampler.execute(logits, noise[step])
                    with maxinstr.stage("forward", stream=stream):
                        logits, k_cache, v_cache = block.execute(token, k_cache, v_cache)
                tokens.append(token)
            with maxinstr.stage("readback", stream=stream, request=request):
                generated.append(np.concatenate([t.to_numpy() for t in tokens], axis=1))

    # under `maxinstr run` the session writes to the run's directory, not --run-dir
    run_dir = Path(args.run_dir) if recording.path in (None, Path(args.run_dir).absolute()) else recording.path
    print(
        f"max_block: {args.requests} requests x {args.steps} tokens on {'GPU' if on_gpu else 'CPU'}; "
        f"compile {compile_s:.1f} s; first tokens {generated[0][0, :8].tolist()}; run directory {run_dir}"
    )
    if not args.no_report:
        from maxinstr.cli import main as maxinstr_main

        return maxinstr_main(["report", str(run_dir), "--quiet"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
