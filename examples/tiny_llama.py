"""Make a tiny Llama with random weights in a local Hugging Face folder, for running MAX's own
pipelines (`max generate`, `max serve`) with no network and no download.

    python examples/tiny_llama.py runs/tiny-llama                    # 2 layers, hidden 64 (CPU tests)
    python examples/tiny_llama.py runs/llama-8x2048 --layers 8 --hidden 2048 --heads 16 --kv-heads 16 \\
        --intermediate 5632 --vocab 32000 --dtype bfloat16           # the size of examples/max_decoder.py
    HF_HUB_OFFLINE=1 max generate --model-path runs/tiny-llama --devices cpu \\
        --quantization-encoding float32 --prompt "hello world" --max-new-tokens 8

The folder holds what MAX's Llama reads: `config.json` (LlamaForCausalLM), `tokenizer.json` (a
byte-level BPE trained here on a few sentences, with its `tokenizer_config.json`),
`generation_config.json` and `model.safetensors` (normal(0, 0.02) weights, seeded: the same
folder every time). Nothing is downloaded; the output is nonsense text of the asked length.
Needs numpy, safetensors and tokenizers (MAX's serve extras bring both).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# What the tokenizer learns from: a few sentences, enough for a vocabulary of a few hundred.
CORPUS = [
    "hello world, this is a tiny model with random weights.",
    "the quick brown fox jumps over the lazy dog.",
    "maxinstr marks the stages of a program and reports where the time goes.",
    "prefill reads the prompt once; decode makes one token a step.",
    "a sampler picks the next token from the logits of the last position.",
    "once upon a time there was a server that answered completions.",
]
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>"]


def train_tokenizer(vocab_size: int) -> dict:
    """A byte-level BPE tokenizer (tokenizer.json as a dict) trained on CORPUS, with the Llama
    3 special tokens for the start and the end of a text. A vocabulary larger than the corpus
    gives is filled with reserved tokens, so that every id the model can emit decodes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_special_tokens([AddedToken(f"<|reserved_{i}|>", special=True) for i in range(missing)])
    bos = tok.token_to_id(SPECIAL[0])
    # the prompt starts with <|begin_of_text|>, as a Llama 3 tokenizer does
    tok.post_processor = processors.TemplateProcessing(single=f"{SPECIAL[0]} $A", special_tokens=[(SPECIAL[0], bos)])
    return json.loads(tok.to_str())


def weights(cfg: dict, dtype: str, seed: int) -> dict[str, np.ndarray]:
    """Random Llama weights under Hugging Face's names (normal(0, 0.02); norms at 1)."""
    rng = np.random.default_rng(seed)
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head_dim = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    vocab = cfg["vocab_size"]

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    out: dict[str, np.ndarray] = {"model.embed_tokens.weight": rand(vocab, h), "model.norm.weight": np.ones(h, np.float32),
                                  "lm_head.weight": rand(vocab, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
            p + "self_attn.q_proj.weight": rand(h, h),
            p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h),
            p + "self_attn.o_proj.weight": rand(h, h),
            p + "mlp.gate_proj.weight": rand(inter, h),
            p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
        })
    return out


def save_safetensors(tensors: dict[str, np.ndarray], path: Path, dtype: str) -> None:
    """model.safetensors in float32 or bfloat16 (bfloat16: the top 16 bits of each float32,
    rounded to nearest even, written as raw bytes: numpy has no bfloat16)."""
    if dtype == "float32":
        from safetensors.numpy import save_file

        save_file(tensors, str(path), metadata={"format": "pt"})
        return
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}  # type: ignore[dict-item]
    blobs, offset = [], 0
    for name, array in tensors.items():
        bits = array.astype(np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        blob = rounded.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for blob in blobs:
            f.write(blob)


def make(out: Path, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
         intermediate: int = 128, vocab: int = 320, max_positions: int = 512, dtype: str = "float32",
         seed: int = 0) -> dict:
    """Write the model folder; returns its config.json."""
    if hidden % heads or heads % kv_heads:
        raise SystemExit(f"tiny_llama: --hidden {hidden} must divide by --heads {heads}, and --heads by --kv-heads {kv_heads}")
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab)
    vocab_size = 1 + max([*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"])])
    bos = next(t["id"] for t in tok["added_tokens"] if t["content"] == SPECIAL[0])
    eos = next(t["id"] for t in tok["added_tokens"] if t["content"] == SPECIAL[1])
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hidden // heads,
        "vocab_size": vocab_size, "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": dtype, "initializer_range": 0.02,
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}, indent=2) + "\n")
    (out / "tokenizer.json").write_text(json.dumps(tok) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[0], "eos_token": SPECIAL[1],
        "model_max_length": max_positions, "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")
    save_safetensors(weights(cfg, dtype, seed), out / "model.safetensors", dtype)
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the folder to write (made if missing; its files are replaced)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=320,
                    help="vocabulary size (beyond what the corpus trains: reserved tokens; 32000 for the GPU size)")
    ap.add_argument("--max-positions", type=int, default=512)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "max_positions"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    t0 = time.perf_counter()
    cfg = make(a.out, layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, intermediate=a.intermediate,
               vocab=a.vocab, max_positions=a.max_positions, dtype=a.dtype, seed=a.seed)
    h, v, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    params = 2 * v * h + h + n * (2 * h + 2 * h * h + 2 * kv * h + 3 * h * cfg["intermediate_size"])
    print(f"tiny_llama: {a.out}: {n} layers, hidden {h}, vocab {v}, {params:,} parameters, {a.dtype}, "
          f"made in {time.perf_counter() - t0:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
