"""Kernel-name classification against real names, and the per-step arithmetic of a profiler trace (merged busy time,
steps from graph replays)."""
import gzip
import json

import pytest

import e2e_env  # noqa: F401
import kernel_ops as ko

# (kernel name as the profiler shows it, op, where the name comes from). "trace": the top_kernels of setup (b)'s
# H200 traces in benchmarks/results/e2e.json's history (commits b47382e, 6a463c7); the others are the names the
# kernels carry in SGLang 0.5.17's sources and the bundle's libraries (sgl_kernel 0.4.5's sm90 common_ops and
# flashmla_ops symbols, SGLang's JIT csrc under kernels/jit/csrc, sgl-deep-gemm 0.1.5.post1's impls, TileLang's
# "<prim_func>_kernel" naming, Triton's "<jit function>" naming, cuBLAS's type-coded names).
KERNELS = [
    # --- MoE experts incl. routing
    ("void dsv4::fp4moe::fp4_moe_gemm1_kernel<true>(Fp4MoeDecodeParams)", "moe_experts", "trace: ours"),
    ("void dsv4::fp4moe::fp4_moe_gemm2_kernel<true>(Fp4MoeDecodeParams)", "moe_experts", "trace: ours"),
    ("_gemm1_kernel", "moe_experts", "trace: ours, ops/fp4_moe/kernels.py (was counted as fp8_linear)"),
    ("_gemm2_kernel", "moe_experts", "trace: ours"),
    ("_route_small_kernel", "moe_experts", "ours"),
    ("_swiglu_kernel", "moe_experts", "ours"),
    ("void device::marlin_moe::Marlin<__nv_bfloat16, 4, 256, 1, 8, 8, true, 4, 8, false>(int4 const*, int4 const*, "
     "int4*, int4*, int4 const*, int4 const*, int const*)", "moe_experts", "SGLang JIT gemm/marlin_moe (a), (c)"),
    ("void moe_align_block_size_small_batch_expert_kernel<int>(int const*, int*, int*, int*, int, int, unsigned long)",
     "moe_experts", "sgl_kernel"),
    ("void moe_sum_reduce_kernel_warp_token_topk<__nv_bfloat16, 6>(...)", "moe_experts", "sgl_kernel"),
    ("void (anonymous namespace)::moe_hash_topk_fused<256, 6>(HashTopKParams)", "moe_experts",
     "SGLang JIT deepseek_v4/hash_topk.cuh"),
    ("void moe_fused_gate_kernel_small_token<float>(...)", "moe_experts", "SGLang JIT moe"),
    ("triton_per_fused_add_gather_softplus_sqrt_topk_0", "moe_experts", "inductor: biased_topk_impl (sqrt-softplus)"),
    ("_unpack_packed_topk_kernel", "moe_experts", "SGLang Triton moe_runner/marlin.py"),
    ("void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>(...)", "moe_experts", "sgl_kernel"),
    ("void (anonymous namespace)::silu_mul_clamp_kernel<__nv_bfloat16>(...)", "moe_experts", "SGLang JIT"),
    # --- dense FP8 linears
    ("_w8a8_block_fp8_matmul", "fp8_linear", "trace: SGLang Triton block-FP8 GEMM (a), (b)"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 1024u, 64u, 128u, 128u, 1u, 8u>(float*, int*, unsigned int, "
     "...)", "fp8_linear", "DeepGEMM (c)"),
    ("fp8_linear_splitk_kernel", "fp8_linear", "ours (future fp8_linear op)"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<...fp8_blockwise...>>", "fp8_linear",
     "SGLang CUTLASS FP8 blockwise"),
    # --- bf16 linears
    ("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT", "bf16_linear", "trace: cuBLAS bf16 (lm_head, wo_a; was fp8_linear)"),
    ("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT", "bf16_linear", "trace"),
    ("nvjet_sm90_tss_64x8_64x16_4x1_v_bz_splitK_TNT", "bf16_linear", "trace: bf16 x bf16 -> fp32 (compressor gate)"),
    ("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT", "bf16_linear", "trace"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, float, float, float, true, "
     "false, false, false>(cublasLt::cublasSplitKParams<float>, float const*, float const*, float*, float const*, "
     "float const*, float const*, float const*, float*, void*, long, float*, int*)", "bf16_linear",
     "trace: cuBLAS split-K reduce (no input type)"),
    ("void (anonymous namespace)::router_gemm_kernel<__nv_bfloat16, float, 128, 8, 8, 256, 4096, true>(float*, "
     "__nv_bfloat16 const*, __nv_bfloat16 const*)", "bf16_linear", "trace: the router (was fp8_linear)"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, float, 128, 16, 4, 4, false, false, "
     "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, ...>>(...)", "bf16_linear",
     "cuBLAS bf16 GEMV"),
    # --- sparse MLA
    ("void dsv4::sparse_decode_ws_kernel<4, false>(SparseDecodeParams)", "sparse_mla", "trace: ours"),
    ("void dsv4::sparse_decode_combine_kernel<16, 1>(SparseDecodeParams)", "sparse_mla", "trace: ours"),
    ("_tiled_sparse_decode_kernel", "sparse_mla", "SGLang Triton SM120 fallback (a), flash_mla_sm120_triton.py"),
    ("void sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel<...>(...)", "sparse_mla", "FlashMLA (c)"),
    ("void smxx::decode::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512, 32, 64>(...)", "sparse_mla",
     "FlashMLA combine (c)"),
    ("void sm90::fwd::sparse_attn_fwd_kernel<...>", "sparse_mla", "FlashMLA sparse prefill"),
    # --- indexer
    ("fp8_paged_mqa_logits_kernel", "indexer", "SGLang TileLang indexer (a)"),
    ("_paged_kernel", "indexer", "ours, ops/indexer_logits.py"),
    ("_flat_kernel", "indexer", "ours"),
    ("void deep_gemm::sm90_fp8_paged_mqa_logits<1u, 64u, 128u, 64u, false, 3u, 3u, 128u, 128u>(...)", "indexer",
     "DeepGEMM (c)"),
    ("void deep_gemm::smxx_paged_mqa_logits_metadata<...>(...)", "indexer", "DeepGEMM metadata"),
    ("void (anonymous namespace)::topk_transform_kernel<512>(TopKParams)", "indexer", "SGLang JIT topk_v1 (top-512)"),
    ("void (anonymous namespace)::fused_q_indexer_rope_hadamard_quant<...>(...)", "indexer", "SGLang JIT indexer q"),
    # --- mHC incl. its GEMM wherever it runs
    ("mhc_post_tilelang_kernel", "mhc", "trace: SGLang TileLang"),
    ("hc_split_sinkhorn_kernel__kernel", "mhc", "trace: SGLang TileLang"),
    ("mhc_pre_big_fuse_tilelang_kernel", "mhc", "SGLang TileLang mHC pre (c)"),
    ("void dsv4::hcs::hc_prenorm_small_kernel<1, 3, 2, 4, false, true>(HcPrenormParams)", "mhc", "trace: ours"),
    ("dsv4::hcp::hc_prenorm_zero_kernel(HcPrenormParams)", "mhc", "trace: ours"),
    ("_fn_split_kernel", "mhc", "ours, Triton"),
    ("_hc_head_kernel", "mhc", "trace: SGLang Triton mhc_head.py (was other)"),
    ("void deep_gemm::sm90_tf32_hc_prenorm_gemm_impl<24u, 16384u, 64u, 32u, 64u, 1u, 3u, 128u, 128u>(...)", "mhc",
     "DeepGEMM (c)"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
     "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, ...>>(...)", "mhc",
     "cuBLAS fp32 GEMV: SGLang's torch mHC pre-GEMM (a) (was fp8_linear)"),
    ("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel",
     "mhc", "cuBLAS fp32 SIMT GEMM"),
    ("cutlass_80_simt_sgemm_128x32_8x5_tn_align1", "mhc", "cuBLAS fp32 GEMM"),
    # --- KV cache writes and compressors
    ("void (anonymous namespace)::fused_store_flashmla_cache<...>(...)", "kv_cache", "SGLang JIT store.cuh"),
    ("void (anonymous namespace)::fused_store_indexer_cache<...>(...)", "kv_cache", "SGLang JIT store.cuh"),
    ("void (anonymous namespace)::flash_c4_decode<...>(Compress4DecodeParams)", "kv_cache", "SGLang JIT c4.cuh"),
    ("void (anonymous namespace)::flash_c128_online_decode<...>(...)", "kv_cache", "SGLang JIT c128_online.cuh"),
    ("void (anonymous namespace)::fused_k_norm_rope_flashmla<...>(...)", "kv_cache", "SGLang JIT main_norm_rope.cuh"),
    ("_compress_norm_rope_kernel", "kv_cache", "SGLang Triton fused_compress_triton.py"),
    ("void (anonymous namespace)::plan_compress_decode_kernel(...)", "kv_cache", "SGLang JIT c_plan.cuh"),
    # --- norms / quant / rope
    ("void (anonymous namespace)::per_token_group_quant_flat_kernel<(anonymous namespace)::QuantTrait<__nv_bfloat16, "
     "__nv_fp8_e4m3, 128u, false, true, true, false>, true>(...)", "norm_quant_rope", "trace"),
    ("void (anonymous namespace)::deepseek_rope_kernel<true, true, long>((anonymous namespace)::FusedQKRopeParams)",
     "norm_quant_rope", "trace"),
    ("void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, "
     "unsigned int, unsigned int, unsigned int, float, float)", "norm_quant_rope", "trace"),
    ("void (anonymous namespace)::fused_q_norm_rope<__nv_bfloat16, 512l, 64l, long, true>((anonymous namespace)::"
     "FusedQNormRopeParams)", "norm_quant_rope", "trace"),
    ("act_quant_kernel__kernel", "norm_quant_rope", "SGLang TileLang act_quant"),
    # --- communication
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication", "NCCL (TP > 1)"),
    ("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 2>(...)", "communication", "custom all-reduce"),
    # --- other
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::BinaryFunctor<float, float, "
     "float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, ...)", "other", "trace"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, "
     "long, 4, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4, 4>)", "other",
     "trace: greedy sampling"),
    ("void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortSingleTileKernel<...>", "other", "trace"),
    ("Memcpy DtoD (Device -> Device)", "other", "trace"),
]


@pytest.mark.parametrize("name,op,source", KERNELS, ids=[f"{op}:{n[:40]}" for n, op, _ in KERNELS])
def test_real_kernel_names(name, op, source):
    assert ko.classify_kernel(name) == op, f"{name} ({source})"


def test_every_op_has_real_names_and_a_title():
    assert {op for _, op, _ in KERNELS} == set(ko.OPS)
    assert set(ko.OP_TITLES) == set(ko.OPS)
    assert {op for op, _, _ in ko.RULES} | {"other"} == set(ko.OPS)


def test_merged_busy_counts_overlap_once_and_clips():
    assert ko.merged_busy([(0, 10), (5, 15), (20, 30)]) == 25
    assert ko.merged_busy([(0, 10), (2, 3)]) == 10
    assert ko.merged_busy([(0, 10), (20, 30)], lo=5, hi=25) == 10
    assert ko.merged_busy([]) == 0


def _trace(steps=5, period=1000.0, graph_kernels=(("_w8a8_block_fp8_matmul", 300.0), ("_hc_head_kernel", 100.0),
                                                  ("void dsv4::sparse_decode_ws_kernel<4, false>(P)", 200.0)),
           cut_first=True):
    """A torch.profiler Chrome trace of ``steps`` CUDA-graph replays (one cudaGraphLaunch each, its kernels carrying
    the launch's correlation id), a sampling kernel outside the graph after each, and a kernel on a second stream
    overlapping the first."""
    ev = []
    for i in range(steps):
        t0 = 100.0 + i * period
        corr = 1000 + i
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t0 - 20, "dur": 5,
                   "args": {"correlation": corr}})
        t = t0
        for j, (name, dur) in enumerate(graph_kernels):
            if cut_first and i == 0 and j == 0:   # the profiler started inside the first replay
                t += dur
                continue
            ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur, "args": {"correlation": corr}})
            t += dur
        ev.append({"ph": "X", "cat": "kernel", "name": "_w8a8_block_fp8_matmul", "ts": t0 + 50, "dur": 100,
                   "args": {"correlation": corr, "stream": 2}})   # overlaps the first kernel: counted once in busy
        ev.append({"ph": "X", "cat": "kernel", "name": "void at::native::reduce_kernel<argmax>", "ts": t + 10,
                   "dur": 40, "args": {"correlation": 5000 + i}})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1e6})
    return ev


def test_analyse_uses_graph_replays_as_steps():
    got = ko.analyse(_trace(steps=5), fallback_steps=99)
    # 5 replays, the first cut by the profiler's start: 3 whole steps between the 4 complete ones
    assert got["step_method"] == "graph replays" and got["steps"] == 3
    assert got["trace_us_per_step"] == pytest.approx(1000.0)
    # per step: graph kernels 600 us + the second-stream kernel 100 (overlapping) + sampling 40
    assert got["kernel_us_per_step"] == pytest.approx(740.0)
    assert got["gpu_busy_us_per_step"] == pytest.approx(640.0)
    assert got["gpu_busy_fraction_in_trace"] == pytest.approx(0.64)
    assert got["us_per_step"] == {"fp8_linear": pytest.approx(400.0), "sparse_mla": pytest.approx(200.0),
                                  "mhc": pytest.approx(100.0), "other": pytest.approx(40.0)}
    assert got["top_kernels"][0]["name"] == "_w8a8_block_fp8_matmul" and got["top_kernels"][0]["op"] == "fp8_linear"
    assert abs(sum(got["share"].values()) - 1) < 1e-9


def test_analyse_without_graph_launches_falls_back_to_the_profilers_steps():
    ev = [e for e in _trace(steps=3, cut_first=False) if e.get("name") != "cudaGraphLaunch"]
    got = ko.analyse(ev, fallback_steps=3)
    assert got["step_method"] == "kernel span / profiler steps" and got["steps"] == 3
    assert got["kernel_us_per_step"] == pytest.approx(740.0)
    assert ko.analyse([], fallback_steps=3)["step_method"] == "no kernels"


def test_analyse_files_reads_gzip(tmp_path):
    path = tmp_path / "1-TP-0.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": _trace(steps=4)}, f)
    assert ko.analyse_files([str(path)], 20)["steps"] == 2
    assert ko.analyse_files([], 20) is None
