// Instantiations + launcher of the MXFP4 MoE decode kernels (see kernel.cuh).
#include <atomic>
#include <stdlib.h>
#include <string.h>
#include "fp4_moe/kernel.cuh"

namespace dsv4 {

static std::atomic<unsigned long long> g_fp4_pdl_checked{0};
static std::atomic<unsigned long long> g_fp4_pdl_ok{0};

// PDL needs cc >= 9.0; read once per device (no attribute query on the hot path after the first call).
static cudaError_t fp4_moe_pdl(bool* pdl) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = 1ull << (dev & 63);
  if (!(g_fp4_pdl_checked.load(std::memory_order_acquire) & bit)) {
    int major = 0;
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess) return e;
    const char* env = getenv("DSV4_FP4_MOE_PDL");   // "0": plain launches
    if (major >= 9 && !(env != nullptr && strcmp(env, "0") == 0)) g_fp4_pdl_ok.fetch_or(bit, std::memory_order_release);
    g_fp4_pdl_checked.fetch_or(bit, std::memory_order_release);
  }
  *pdl = (g_fp4_pdl_ok.load(std::memory_order_acquire) & bit) != 0;
  return cudaSuccess;
}

cudaError_t launch_fp4_moe_decode(const Fp4MoeDecodeParams& p, cudaStream_t stream) {
  using namespace fp4moe;
  bool pdl = false;
  cudaError_t e = fp4_moe_pdl(&pdl);
  if (e != cudaSuccess) return e;
  const unsigned slots = (unsigned)(p.M * p.topk);
  e = launch_kernel(p.s13_f32 ? fp4_moe_gemm1_kernel<true> : fp4_moe_gemm1_kernel<false>,
                    dim3((unsigned)(p.inter / kGemm1Rows), slots), kThreads, 0, pdl, stream, p);
  if (e != cudaSuccess) return e;
  return launch_kernel(p.s2_f32 ? fp4_moe_gemm2_kernel<true> : fp4_moe_gemm2_kernel<false>,
                       dim3((unsigned)(p.hidden / kGemm2Rows), slots), kThreads, 0, pdl, stream, p);
}

}  // namespace dsv4
