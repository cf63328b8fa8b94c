"""Kernel families on the real kernel names of every fixture (nsys, rocprofv3, RPD, Kineto)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.fixture_columns import KERNEL_FIXTURES, kernel_columns
from maxinstr.analyze import families
from maxinstr.analyze.families import FAMILIES, OTHER, classify_id_codes, classify_one, family_names


def classify(names):
    """Each name's family, as the report classifies a trace's ops (by their string-table ids)."""
    strings, ids = np.unique(np.asarray(names, dtype=object), return_inverse=True)
    return np.asarray(family_names(), dtype=object)[classify_id_codes(ids.reshape(-1), strings)]

# (fixture, a substring that picks real kernel names out of it, the family they must land in)
EXPECTED = [
    ("nsys/h200_decode.sqlite", "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_NNT", "gemm"),
    ("nsys/h200_decode.sqlite", "vectorized_layer_norm_kernel", "normalization"),
    ("nsys/h200_decode.sqlite", "silu_kernel", "elementwise"),
    ("nsys/h200_decode.sqlite", "ArgMaxOps", "sampling"),
    ("nsys/h200_decode.sqlite", "index_elementwise_kernel", "elementwise"),
    ("kineto/h200_decode.pt.trace.json.gz", "fmha_cutlassF_bf16_aligned", "attention"),
    ("nsys/cs336_two_threads_nsys2025.1.sqlite", "ampere_sgemm_128x64_tn", "gemm"),
    ("nsys/cs336_two_threads_nsys2025.1.sqlite", "cutlass_80_simt_sgemm", "gemm"),
    ("nsys/cs336_two_threads_nsys2025.1.sqlite", "cunn_SoftMaxForwardSmem", "softmax"),
    ("nsys/cs336_two_threads_nsys2025.1.sqlite", "DeviceRadixSortSingleTileKernel", "reduction"),
    ("nsys/cs336_two_threads_nsys2025.1.sqlite", "multi_tensor_apply_kernel", "elementwise"),
    ("nsys/cs336_nsys2026.2.sqlite", "cublasLt::splitKreduce_kernel", "gemm"),
    ("nsys/cs336_nsys2026.2.sqlite", "MeanOps", "reduction"),
    ("rocprof/rocprofv3_llamacpp_decode/decode_kernel_trace.csv", "quantize_q8_1", "quantization"),
    ("rocprof/rocprofv3_llamacpp_decode/decode_kernel_trace.csv", "mul_mat_vec_q", "gemv"),
    ("rocprof/rocprofv3_llamacpp_decode/decode_kernel_trace.csv", "rms_norm_f32", "normalization"),
    ("rocprof/rocprofv3_llamacpp_decode/decode_kernel_trace.csv", "gated_delta_net_cuda", "ssm"),
    ("rocprof/rocprofv3_llamacpp_decode/decode_kernel_trace.csv", "__amd_rocclr_copyBuffer", "memcpy"),
    ("rocprof/rocprofv3_llamacpp_decode/decode_kernel_trace.csv", "k_get_rows_float", "elementwise"),
    ("rocprof/rpd/mytrace.rpd.gz", "Cijk_Alik_Bljk_F8HS", "gemm"),
    ("rocprof/rpd/mytrace.rpd.gz", "FmhaFwdKernel", "attention"),
    ("rocprof/rpd/mytrace.rpd.gz", "rotary_embedding_kernel", "rope"),
    ("rocprof/rpd/mytrace.rpd.gz", "scaled_fp8_quant_kernel", "quantization"),
    ("rocprof/rpd/mytrace.rpd.gz", "reshape_and_cache_kernel", "kv_cache"),
    ("rocprof/rpd/mytrace.rpd.gz", "wvSpltK_hf_sml_", "gemv"),
    ("rocprof/rpd/mytrace.rpd.gz", "fused_add_rms_norm_kernel", "normalization"),
    ("rocprof/rpd/mytrace.rpd.gz", "cunn_SoftMaxForward", "softmax"),
    ("rocprof/rpd/matmul_result.rpd", "Cijk_Ailk_Bljk_SB_MT128x64x16", "gemm"),
    ("rocprof/rpd/matmul_result.rpd", "rocprim::detail::block_reduce_kernel", "reduction"),
    ("kineto/hta_benchmark_result_493459_1694039959_trace.json.gz", "sm80_xmma_fprop_implicit_gemm", "convolution"),
    ("kineto/hta_benchmark_result_493459_1694039959_trace.json.gz", "Memcpy HtoD", "memcpy"),
    ("kineto/hta_benchmark_result_493459_1694039959_trace.json.gz", "Memset (Device)", "memset"),
    ("kineto/hta_benchmark_result_493459_1694039959_trace.json.gz", "max_pool_forward_nchw", "reduction"),
    ("kineto/hta_benchmark_result_493459_1694039959_trace.json.gz", "epilogue::impl::globalKernel", "gemm"),
    ("kineto/hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz", "Cijk_Ailk_Bjlk_SB_Bias", "gemm"),
    ("kineto/hta_triton_example.json.gz", "triton_poi_fused_add_cos_sin_0", "elementwise"),
    ("nsys/pipit_saxpy_mpi_nsys2022.2.sqlite", "saxpy", "elementwise"),
    # Modular MAX's Mojo kernels on the H200 (tests/data/PROVENANCE-extra.md, max/): the decoder
    # (bf16, 8 layers) and max_block (float32, hidden 64, where MAX falls back to its naive matmul)
    ("max/decoder_nsys.sqlite", "sm90_matmul_bfloat16_bfloat16_bfloat16_True_", "gemm"),
    ("max/decoder_nsys.sqlite", "sm90_mha_depth128_bfloat16_bfloat16_nqh16_nkvh16_", "attention"),
    ("max/decoder_nsys.sqlite", "gemv_split_k_bfloat16_bfloat16_bfloat16_128_", "gemv"),
    ("max/decoder_nsys.sqlite", "gemv_split_k_epilogue_fn_bfloat16", "gemv"),
    ("max/decoder_nsys.sqlite", "rms_norm_fused_residual_gpu_block_bfloat16", "normalization"),
    ("max/decoder_nsys.sqlite", "algorithm_gpu_rowwise__BlockK", "reduction"),
    ("max/decoder_nsys.sqlite", "algorithm_gpu_rowwise__WarpKe", "reduction"),
    ("max/decoder_nsys.sqlite", "concat_fused_r4_w8_b256_gs_False_", "elementwise"),
    ("max/decoder_nsys.sqlite", "gather_r3_w8_b256_gs_False_", "elementwise"),
    ("max/decoder_nsys.sqlite", "mogg_foreach_r", "elementwise"),
    ("max/block_nsys.sqlite", "matmul_kernel_naive_float32_float32_float32_False_16_", "gemm"),
    ("max/block_nsys.sqlite", "gemv_split_k_compute_fn_float32", "gemv"),
    ("max/block_nsys.sqlite", "gemv_split_k_float32_float32_float32_256_", "gemv"),
    ("max/block_nsys.sqlite", "rms_norm_fused_residual_gpu_block_float32", "normalization"),
    ("max/block_nsys.sqlite", "elementwise_r2_w4_b256_gs_False_", "elementwise"),
    ("max/block_nsys.sqlite", "concat_fused_r", "elementwise"),
    ("max/block_nsys.sqlite", "gather_r3_w4_b256_gs_False_", "elementwise"),
    ("max/block_nsys.sqlite", "cutlass_80_tensorop_s1688gemm_64x64_16x6", "gemm"),  # cuBLAS, called by MAX
    ("max/block_nsys.sqlite", "cublasLt::splitKreduce_kernel", "gemm"),
]

MAX_FIXTURES = ["max/block_run/profile.sqlite", "max/block_nsys.sqlite", "max/block_maxprof_nsys.sqlite",
                "max/decoder_nsys.sqlite", "max/decoder_run/profile.sqlite"]
"""The nsys captures of MAX programs on the H200 (the kernels=True runs hold the same names:
tests/attribute/test_max_captures.py)."""


@pytest.mark.parametrize("fixture,fragment,family", EXPECTED, ids=[f"{e[2]}:{e[1][:30]}" for e in EXPECTED])
def test_real_names_land_in_their_family(fixture, fragment, family):
    names, _ = kernel_columns(fixture)
    hits = np.unique([n for n in names.astype(str) if fragment in n])
    assert len(hits), f"{fragment!r} is not a kernel name in {fixture}"
    got = classify(hits)
    assert set(got) == {family}, dict(zip(hits, got))


# The share of GPU time left "other" in each fixture: ML traces are fully classified; the
# CloverLeaf hydrodynamics code (no ML kernels) is honestly mostly "other".
OTHER_SHARE_MAX = {"nsys/pipit_cloverleaf_no_nvtx_nsys2024.5.sqlite": 1.0}


@pytest.mark.parametrize("fixture", KERNEL_FIXTURES)
def test_other_share_per_fixture(fixture):
    names, dur = kernel_columns(fixture)
    fam = classify(names)
    assert len(fam) == len(names)
    share = float(dur[fam == OTHER].sum() / max(dur.sum(), 1))
    limit = OTHER_SHARE_MAX.get(fixture, 0.02)
    assert share <= limit, (fixture, share, sorted(set(names[fam == OTHER].astype(str)))[:5])


@pytest.mark.parametrize("fixture", MAX_FIXTURES)
def test_every_max_kernel_has_a_family(fixture):
    """No kernel of a MAX capture is "other"; every kernel but the vendor libraries' (cuBLAS,
    CUTLASS, which MAX calls) and maxinstr's own carries MAX's Mojo name (MAX_KERNEL, what the
    launch-bound advice keys on), and NAIVE_MATMUL picks exactly MAX's fallback matmul."""
    names, dur = kernel_columns(fixture)
    distinct = np.unique(names.astype(str))
    assert (classify(names) != OTHER).all(), sorted(set(names[classify(names) == OTHER].astype(str)))
    vendor = [n for n in distinct if "cutlass" in n or "cublas" in n or n.startswith("maxinstr_")]
    mojo = [n for n in distinct if n not in vendor]
    assert len(mojo) >= 12 and all(families.MAX_KERNEL.search(n) for n in mojo), \
        [n for n in mojo if not families.MAX_KERNEL.search(n)]
    assert not any(families.MAX_KERNEL.search(n) for n in vendor), vendor
    naive = [n for n in distinct if families.NAIVE_MATMUL.search(n)]
    assert naive == [n for n in distinct if n.startswith("matmul_kernel_naive_")]
    assert bool(naive) == fixture.startswith("max/block")  # float32 hidden 64 only: bf16 has tuned kernels
    assert all(classify_one(n) == "gemm" for n in naive)


def test_cloverleaf_is_reported_as_mostly_other():
    names, dur = kernel_columns("nsys/pipit_cloverleaf_no_nvtx_nsys2024.5.sqlite")
    fam = classify(names)
    share = dur[fam == OTHER].sum() / dur.sum()
    assert 0.8 < share < 1.0  # its reductions are still recognised
    assert "reduction" in set(fam)


def test_each_distinct_name_is_matched_once(monkeypatch):
    names, _ = kernel_columns("nsys/cs336_two_threads_nsys2025.1.sqlite")
    calls = []
    real = families.classify_one
    monkeypatch.setattr(families, "classify_one", lambda n, t=FAMILIES: calls.append(n) or real(n, t))
    fam = classify(names)
    assert len(calls) == len(np.unique(names.astype(str)))
    assert len(fam) == len(names) == 17032


def test_classify_ids_uses_string_table_and_minus_one_is_other():
    names, _ = kernel_columns("nsys/h200_decode.sqlite")
    strings, ids = np.unique(names.astype(str), return_inverse=True)
    ids = np.r_[ids, -1]
    fam = np.asarray(family_names(), dtype=object)[classify_id_codes(ids, strings.astype(object))]
    assert fam[-1] == OTHER
    assert list(fam[:-1]) == list(classify(names))


def test_scale_one_million_ops_from_a_real_fixture(monkeypatch):
    """A million ops (the real fixture's 17k kernels tiled), given as a report gives them: ids
    into the trace's string table. Each op gets its name's family, and the patterns run once per
    distinct name, not once per op: what keeps this fast, counted here; the time is
    benchmarks/families_scale.py's (docs/benchmarks.md), not a unit test's."""
    names, _ = kernel_columns("nsys/cs336_two_threads_nsys2025.1.sqlite")
    strings, fixture_ids = np.unique(names.astype(object), return_inverse=True)
    ids = np.tile(fixture_ids.reshape(-1), 1_000_000 // len(names) + 1)[:1_000_000]
    calls = []

    def counted(name, table=FAMILIES):
        calls.append(name)
        return classify_one(name, table)

    monkeypatch.setattr(families, "classify_one", counted)
    codes = classify_id_codes(ids, strings)
    assert len(codes) == 1_000_000
    assert sorted(calls) == sorted(strings.tolist())  # each distinct name classified exactly once
    monkeypatch.undo()
    expected = np.array([family_names().index(classify_one(s)) for s in strings], dtype=np.int16)[ids]
    assert np.array_equal(codes, expected)  # every op, by its own name
    assert len(set(codes.tolist())) == 4  # the fixture's gemm, elementwise, reduction and softmax kernels


def test_table_is_data_and_first_match_wins():
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names))
    assert OTHER not in names
    # the attention row precedes gemm: fmha_cutlassF contains "cutlass"
    assert names.index("attention") < names.index("gemm")
    assert classify_one("fmha_cutlassF_bf16_aligned_32x128_gmem_sm80") == "attention"
    extra = FAMILIES + (families.Family("clover", r"clover::", "CloverLeaf hydro kernels"),)
    assert classify_one("void clover::par_ranged2d_kernel<advec_mom_kernel>", extra) == "clover"


def test_only_the_first_characters_of_a_name_are_searched():
    """issue 20, class 8: a 200 MB Kineto kernel name took minutes in the patterns (some are
    quadratic, ``blockwise.*gemm``); names are classified on their first NAME_SCAN_CHARS."""
    from maxinstr.analyze.families import NAME_SCAN_CHARS, classify_one

    assert classify_one("gemm" + "x" * 10**6) == "gemm"
    assert classify_one("x" * NAME_SCAN_CHARS + "gemm") == "other"
    hostile = "blockwise" * 2_000_000  # 18 MB of what the quadratic patterns backtrack over
    assert classify_one(hostile) == "other"
