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
  return launch_kernel(hc_prenorm_kernel, dim3(m_tiles, (unsigned)(p.num_splits * p.sub_splits)), kThreads, 0,
                       pdl, stream, p);
}

}  // namespace dsv4
