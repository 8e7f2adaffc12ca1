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
  const dim3 grid(m_tiles, (unsigned)(p.num_splits * p.sub_splits));
  // the kFast kernel's conditions (kernel.cuh): at least one whole tile of rows, whole chunks, 24 fn rows;
  // P = 1: out row-contiguous with 16-byte aligned rows (its S stride matters only when S > 1)
  const bool fast_shape = p.m >= kRows && p.K % kChunk == 0 && p.n == kN;
  if (p.sub_splits > 1 && fast_shape && ((uintptr_t)p.ws & 15) == 0) {
    // P > 1: the kFast kernel stores the S * P partials into the workspace as its out [S * P, m, 24] and
    // sqrsum [S * P, m], the reduce grid (PDL) sums them into the caller's out / sqrsum
    HcPrenormParams q = p;
    q.out = p.ws;
    q.out_stride_s = p.m * kN;
    q.out_stride_m = kN;
    q.out_stride_n = 1;
    q.sqrsum = p.ws + p.num_splits * p.sub_splits * p.m * kN;
    q.sq_stride_s = p.m;
    q.sq_stride_m = 1;
    e = launch_kernel(hc_prenorm_kernel<true>, grid, kThreads, 0, pdl, stream, q);
    if (e != cudaSuccess) return e;
    const int64_t units = p.num_splits * p.m * (kN / 4 + 1);   // float4s of out + sqrsum values
    return launch_kernel(hc_prenorm_reduce_kernel, dim3((unsigned)((units + 31) / 32)), 32 * kRedWarps, 0, pdl,
                         stream, p);
  }
  const bool fast = p.sub_splits == 1 && fast_shape && p.out_stride_n == 1 && p.out_stride_m == kN &&
                    (p.num_splits == 1 || p.out_stride_s % 4 == 0) && ((uintptr_t)p.out & 15) == 0;
  return launch_kernel(fast ? hc_prenorm_kernel<true> : hc_prenorm_kernel<false>, grid, kThreads, 0, pdl,
                       stream, p);
}

}  // namespace dsv4
