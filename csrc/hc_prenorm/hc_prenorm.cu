// Launcher of the hc_prenorm GEMM kernel (see kernel.cuh).
#include "hc_prenorm/kernel.cuh"

namespace dsv4 {

static PdlSwitch g_hc_pdl("DSV4_HC_PRENORM_PDL");   // "0": plain launches (same switch as the Triton path)

cudaError_t launch_hc_prenorm(const HcPrenormParams& p, cudaStream_t stream) {
  using namespace hcp;
  bool pdl = false;
  cudaError_t e = pdl_enabled(g_hc_pdl, &pdl);
  if (e != cudaSuccess) return e;
  const unsigned m_tiles = (unsigned)((p.m + kRows - 1) / kRows);
  // the kFast kernel's conditions (kernel.cuh): no sub-slices, at least one whole tile of rows, whole
  // chunks, 24 fn rows, out row-contiguous with 16-byte aligned rows (its S stride matters only when S > 1)
  const bool fast = p.sub_splits == 1 && p.m >= kRows && p.K % kChunk == 0 && p.n == kN &&
                    p.out_stride_n == 1 && p.out_stride_m == kN &&
                    (p.num_splits == 1 || p.out_stride_s % 4 == 0) && ((uintptr_t)p.out & 15) == 0;
  return launch_kernel(fast ? hc_prenorm_kernel<true> : hc_prenorm_kernel<false>,
                       dim3(m_tiles, (unsigned)(p.num_splits * p.sub_splits)), kThreads, 0, pdl, stream, p);
}

}  // namespace dsv4
