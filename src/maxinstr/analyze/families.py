"""Kernel families: GPU op names classified by what they do, not by their exact name, which
changes with every GPU generation, library and vendor. The FIRST family whose pattern matches
(case-insensitive ``re.search``) wins, so specific families come before generic ones
(``fmha_cutlassF`` is attention, not GEMM; greedy sampling is an argmax, not a reduction).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

OTHER = "other"

NAME_SCAN_CHARS = 4096
"""Names are classified (and searched by the diagnosis) on their first this many characters: real
ones run to ~3,000, and ``blockwise.*gemm`` is quadratic in a hostile name's length."""


def scanned(name: str) -> str:
    return name[:NAME_SCAN_CHARS]


@dataclass(frozen=True)
class Family:
    name: str
    pattern: str
    description: str


FAMILIES: tuple[Family, ...] = (
    Family("maxinstr", r"^maxinstr_", "maxinstr's own GPU-floor calibration kernel (launched outside every stage)"),
    Family("memcpy", r"^memcpy|\bmemcpy\b|copybuffer|^copy(devicetodevice|hosttodevice|devicetohost)|\bdtoh\b|\bhtod\b",
           "GPU copies (host<->device, device<->device), including copy kernels the runtime launches"),
    Family("memset", r"^memset|\bmemset\b|fillbuffer", "GPU memory sets"),
    Family("collective", r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|alltoall|"
           r"cross_device|custom_ar|deep_?ep|ep_(dispatch|combine)|(moe|expert)_(dispatch|combine)|"
           r"\bdispatch_kernel|\bcombine_kernel|sendrecv|p2p_",
           "collectives (NCCL/RCCL, custom all-reduce, expert-parallel dispatch/combine)"),
    Family("attention", r"fmha|\bmha|mha_|_mha|flash|attention|attn|paged_att|mla_|_mla|\bmla|sdpa|"
           r"mem_?eff|xformers|fwd_splitkv|decode_?att|unified_att|ck_tile.*fmha",
           "attention (mha, fmha, flash, paged/MLA decode attention)"),
    Family("ssm", r"ssm_|selective_scan|mamba|gated_delta|causal_conv1d|linear_att|chunk_scan|state_passing",
           "state-space / linear-attention layers (Mamba, gated delta net, conv1d)"),
    Family("grouped_matmul", r"grouped_?(gemm|matmul|mm)|fused_moe|moe_?(gemm|matmul|mm)|gemm_?grouped|"
           r"block_?scaled|blockwise.*(gemm|matmul)|(gemm|matmul).*blockwise|_mxf[468]|mxfp[468].*(gemm|matmul|mm)|"
           r"nvfp4.*(gemm|matmul|mm)|ptr_?array|batched_?moe|expert.*(gemm|matmul)",
           "grouped / block-scaled matmul (MoE experts, MXFP/NVFP4 block scales)"),
    Family("routing", r"moe_create_indices|moe_align|moe_sum|moe_permute|moe_unpermute|"
           r"router|routing|gating|expert_?(index|indices|count)|token_?(sort|permute)",
           "MoE routing (router, gating, expert indices, token permutation)"),
    Family("quantization", r"quant|dequant|_q8_|q8_1|fp8_?(cast|convert|scale)|(cast|convert)_?to_?fp8|"
           r"scale_?(factor|inv)|compute_?scales|amax|swizzle_?scale|per_?token_?group|block_?scale_?interleave",
           "quantize / dequantize / scale computation"),
    Family("sampling", r"sampl|argmax|argmin|multinomial|gumbel|top_?p|min_?p|repetition_penalty|"
           r"distribution_|logits_?proc|temperature",
           "token sampling and random-number generation (argmax, multinomial, top-p, RNG)"),
    # top-k itself is neither: a sampler's top-k in a dense model, an MoE router's expert choice
    # in an MoE one (the MoE rule counts it as routing where the stage runs grouped matmuls)
    Family("top_k", r"topk|top_k|radix_?find_?kth", "top-k selection (a sampler's top-k, or an MoE router's expert choice)"),
    Family("gemv", r"gemv|mul_mat_vec|matvec|mat_vec|wvsplt|skinny|\bmv_|_mv_kernel|dot_kernel",
           "matrix-vector products (decode-shaped matmul)"),
    Family("convolution", r"convolution|conv_?[123]d|\bconv_|_conv_|implicit_gemm|fprop|dgrad|wgrad|scudnn|fft2d|fft_|winograd",
           "convolutions (cuDNN/MIOpen implicit GEMM, FFT, Winograd)"),
    Family("gemm", r"gemm|sgemm|hgemm|nvjet|cutlass|cublas|hipblaslt|rocblas|\bcijk_|xmma|wgmma|matmul|"
           r"\bmm_|_mm\b|bmm|mul_mat|splitkreduce|epilogue::impl|tensorop",
           "dense matmul (cuBLAS/cuBLASLt/nvjet, CUTLASS, hipBLASLt/Tensile, MAX/Mojo and framework matmuls)"),
    Family("normalization", r"rms_?norm|layer_?norm|layernorm|group_?norm|batch_?norm|instance_?norm|"
           r"l2_?norm|norm_kernel|normalize",
           "normalization (rms_norm, layer_norm, group/batch norm)"),
    Family("rope", r"rope|rotary|pos_?emb|apply_rotary|mrope",
           "rotary position embedding"),
    Family("softmax", r"softmax", "softmax / log-softmax"),
    Family("kv_cache", r"reshape_and_cache|kv_?cache|cache_?(write|store|append)|store_kv|paged_?kv",
           "KV-cache writes and layout"),
    Family("reduction", r"reduce|reduction|sum_functor|\bsum_|norm_?2|cumsum|\bscan|rocprim|cub::|radix|sort|"
           r"histogram|max_?pool|avg_?pool|average_pool|_rowwise",
           "reductions, scans, sorts and pooling (MAX's algorithm_gpu_rowwise: argmax, row max/sum)"),
    Family("elementwise", r"elementwise|pointwise|triton_poi|vectorized|unrolled|functor|unary|binary|"
           r"bin_bcast|bcast|silu|gelu|relu|swiglu|act_and_mul|sigmoid|tanh|exp_|fill|copy|cast|convert|"
           r"index|gather|scatter|get_rows|concat|catarray|\bcat|where|clamp|dropout|transpose|permute|"
           r"nchw|nhwc|arange|iota|axpy|scale_f|add_kernel|addition|subtract|multiply|mul_kernel|div_kernel|"
           r"^mogg_foreach",
           "elementwise / data movement kernels (activations, adds, casts, copies, gathers, fills; MAX's fused "
           "mogg_foreach)"),
)

MAX_KERNEL = re.compile(r"_gs_(True|False)_[0-9a-f]{8}$|^(gemv_split_k|mogg_|algorithm_gpu_rowwise|sm90_(matmul|mha)|"
                        r"matmul_kernel_naive|rms_norm_fused|concat_fused|gather_r\d)")
"""Kernel names that Modular MAX's Mojo kernels carry (a specialisation hash at the end)."""
NAIVE_MATMUL = re.compile(r"^matmul_kernel_naive")
"""MAX's fallback matmul, used where no tuned kernel covers the dtype and shape."""


@lru_cache(maxsize=8)
def _compiled(table: tuple[Family, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(f.pattern, re.IGNORECASE) for f in table)


def family_names(table: tuple[Family, ...] = FAMILIES) -> list[str]:
    """Family names in table order, then ``other``."""
    return [f.name for f in table] + [OTHER]


def classify_one(name: str, table: tuple[Family, ...] = FAMILIES) -> str:
    """The family of one kernel name (``other`` when nothing matches)."""
    name = scanned(name)
    for family, pattern in zip(table, _compiled(table)):
        if pattern.search(name):
            return family.name
    return OTHER


def classify_id_codes(name_ids: np.ndarray, strings: np.ndarray, table: tuple[Family, ...] = FAMILIES) -> np.ndarray:
    """Family codes (int16 into :func:`family_names`) of ops given as ids into a string table
    (``-1``: ``other``), each id that occurs classified once."""
    ids = np.asarray(name_ids, dtype=np.int64)
    if ids.size == 0:
        return np.empty(0, dtype=np.int16)
    index = {n: i for i, n in enumerate(family_names(table))}

    def codes(used: list[int]) -> list[int]:
        return [index[OTHER] if i < 0 else index[classify_one(str(strings[i]), table)] for i in used]

    lo, hi = int(ids.min()), int(ids.max())
    if lo >= -1 and hi < max(1 << 20, 4 * ids.size):
        # ids index a string table: dense small integers, so the distinct ones are a bincount
        # and the broadcast a table lookup (np.unique's sort of a million ids costs ~0.1 s)
        used = np.flatnonzero(np.bincount(ids + 1, minlength=hi + 2)) - 1
        lut = np.zeros(hi + 2, np.int16)
        lut[used + 1] = codes(used.tolist())
        return lut[ids + 1]
    used_ids, inverse = np.unique(ids, return_inverse=True)
    return np.array(codes(used_ids.tolist()), dtype=np.int16)[inverse]


MATMUL_FAMILIES = frozenset({"gemv", "gemm", "grouped_matmul"})
"""Families that are matrix multiplies, whatever their shape."""
