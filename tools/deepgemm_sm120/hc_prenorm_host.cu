// Host code (ours) that launches sgl-deep-gemm's SM120 mHC pre-norm GEMM kernel
// (deep_gemm/impls/sm120_tf32_hc_prenorm_gemm.cuh, copied from the installed wheel by tools/deepgemm_sm120.py into a
// temporary directory, its arch guard relaxed there so that it builds for sm_90a) for timing only. The launch is the
// one the kernel itself implies: a 2-D TMA descriptor for x (bf16 [m, K], box 64 x BLOCK_M, 128-byte swizzle, read in
// bf16 elements) and one for fn (fp32 [N, K], box 32 x BLOCK_N, 128-byte swizzle: the kernel's two 32-float atoms per
// BLOCK_K; rows past N read as zeros), grid = ceil(m / BLOCK_M) * kNumSplits, 128 math + 128 TMA threads, dynamic
// shared memory kNumStages * (A + B stage) + 2 * kNumStages barriers. Output: d [splits, m, N], sqr_sum [splits, m].
// Template values: those sgl-deep-gemm 0.1.5.post1 instantiates for DeepSeek-V4 (N 24, K 16384, BLOCK_M 64,
// BLOCK_N 32, BLOCK_K 64, 3 stages; /work/shared/specs/proxy_fidelity.md read them off its SASS).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>

#include <deep_gemm/impls/sm120_tf32_hc_prenorm_gemm.cuh>

namespace {
constexpr uint32_t kN = 24, kK = 16384, kBlockM = 64, kBlockN = 32, kBlockK = 64, kStages = 3;
constexpr uint32_t kMath = 128, kTma = 128;
constexpr uint32_t kSmem = kStages * (kBlockM * kBlockK * 2 + kBlockN * kBlockK * 4) + 2 * kStages * 8;

char g_err[512];

int encode(CUtensorMap* map, CUtensorMapDataType dtype, void* ptr, uint64_t inner, uint64_t outer, uint64_t stride_bytes,
           uint32_t box_inner, uint32_t box_outer, const char* what) {
    cuuint64_t dims[2] = {inner, outer};
    cuuint64_t strides[1] = {stride_bytes};
    cuuint32_t box[2] = {box_inner, box_outer};
    cuuint32_t elem[2] = {1, 1};
    // the driver's entry point through the runtime (no -lcuda at link time)
    static PFN_cuTensorMapEncodeTiled_v12000 encode_fn = nullptr;
    if (encode_fn == nullptr) {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &q);
        if (e != cudaSuccess || fn == nullptr) {
            snprintf(g_err, sizeof(g_err), "cudaGetDriverEntryPoint(cuTensorMapEncodeTiled): %s", cudaGetErrorString(e));
            return 1;
        }
        encode_fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
    CUresult r = encode_fn(map, dtype, 2, ptr, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                           CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        snprintf(g_err, sizeof(g_err), "cuTensorMapEncodeTiled(%s) failed: CUresult %d", what, int(r));
        return 1;
    }
    return 0;
}

template <uint32_t kSplits>
int launch(const void* x, const float* fn, float* d, float* sq, uint32_t m, cudaStream_t stream) {
    auto kernel = &deep_gemm::sm120_tf32_hc_prenorm_gemm_impl<kN, kK, kBlockM, kBlockN, kBlockK, kSplits, kStages,
                                                              kMath, kTma>;
    CUtensorMap a, b;
    if (encode(&a, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, const_cast<void*>(x), kK, m, uint64_t(kK) * 2, kBlockK, kBlockM,
               "x") ||
        encode(&b, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, const_cast<float*>(fn), kK, kN, uint64_t(kK) * 4, 32, kBlockN, "fn"))
        return 1;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e != cudaSuccess) {
        snprintf(g_err, sizeof(g_err), "cudaFuncSetAttribute(smem %u): %s", kSmem, cudaGetErrorString(e));
        return 1;
    }
    const uint32_t grid = (m + kBlockM - 1) / kBlockM * kSplits;
    cute::TmaDescriptor ta = *reinterpret_cast<cute::TmaDescriptor*>(&a), tb = *reinterpret_cast<cute::TmaDescriptor*>(&b);
    kernel<<<grid, kMath + kTma, kSmem, stream>>>(m, ta, tb, d, sq);
    e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(g_err, sizeof(g_err), "launch (grid %u, smem %u): %s", grid, kSmem, cudaGetErrorString(e));
        return 1;
    }
    return 0;
}
}  // namespace

extern "C" const char* dg_sm120_error() { return g_err; }

// Splits compiled: 1 (num_splits None) and SGLang's counts for DeepSeek-V4 on a 132-SM H200 (64 at m <= 128, 33 at
// m 256) and on a 188-SM RTX PRO 6000 (47 at m 256), plus powers of two.
extern "C" int dg_sm120_hc_prenorm(const void* x, const float* fn, float* d, float* sq, uint32_t m, uint32_t splits,
                                   void* stream) {
    auto s = reinterpret_cast<cudaStream_t>(stream);
    switch (splits) {
        case 1: return launch<1>(x, fn, d, sq, m, s);
        case 2: return launch<2>(x, fn, d, sq, m, s);
        case 4: return launch<4>(x, fn, d, sq, m, s);
        case 8: return launch<8>(x, fn, d, sq, m, s);
        case 16: return launch<16>(x, fn, d, sq, m, s);
        case 32: return launch<32>(x, fn, d, sq, m, s);
        case 33: return launch<33>(x, fn, d, sq, m, s);
        case 47: return launch<47>(x, fn, d, sq, m, s);
        case 64: return launch<64>(x, fn, d, sq, m, s);
        default:
            snprintf(g_err, sizeof(g_err), "splits must be one of 1, 2, 4, 8, 16, 32, 33, 47, 64 (compiled), got %u",
                     splits);
            return 1;
    }
}
