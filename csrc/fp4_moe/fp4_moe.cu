// Instantiations + launcher of the MXFP4 MoE decode kernels (see kernel.cuh).
#include "fp4_moe/kernel.cuh"

namespace dsv4 {

static PdlSwitch g_fp4_pdl("DSV4_FP4_MOE_PDL");   // "0": plain launches

cudaError_t launch_fp4_moe_decode(const Fp4MoeDecodeParams& p, cudaStream_t stream) {
  using namespace fp4moe;
  bool pdl = false;
  cudaError_t e = pdl_enabled(g_fp4_pdl, &pdl);
  if (e != cudaSuccess) return e;
  const unsigned slots = (unsigned)(p.M * p.topk);
  e = launch_kernel(p.s13_f32 ? fp4_moe_gemm1_kernel<true> : fp4_moe_gemm1_kernel<false>,
                    dim3((unsigned)(p.inter / kGemm1Rows), slots), kThreads, 0, pdl, stream, p);
  if (e != cudaSuccess) return e;
  return launch_kernel(p.s2_f32 ? fp4_moe_gemm2_kernel<true> : fp4_moe_gemm2_kernel<false>,
                       dim3((unsigned)(p.hidden / kGemm2Rows), slots), kThreads, 0, pdl, stream, p);
}

}  // namespace dsv4
