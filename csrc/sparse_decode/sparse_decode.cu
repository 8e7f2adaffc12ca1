// Instantiation + launcher of the sparse FP8 MLA decode kernels (see kernel.cuh).
#include <atomic>
#include <stdlib.h>
#include <string.h>
#include "kernel_ws.cuh"

namespace dsv4 {

// cudaFuncSetAttribute once per device (not in the hot path; graph-capture safe afterwards:
// the first call on a device happens at the first eager call, before any capture).
static std::atomic<unsigned long long> g_smem_configured{0};
static std::atomic<unsigned long long> g_pdl_ok{0};   // device supports PDL (cc >= 9.0)

static cudaError_t ensure_smem_attr() {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = 1ull << (dev & 63);
  if (g_smem_configured.load(std::memory_order_acquire) & bit) return cudaSuccess;
  e = cudaFuncSetAttribute(sparse_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(sparse_decode_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMmaSmemBytes);
  if (e != cudaSuccess) return e;
  for (auto k : {sparse_decode_mma64_kernel<4, false>, sparse_decode_mma64_kernel<4, true>,
                 sparse_decode_mma64_kernel<2, true>, sparse_decode_mma64_kernel<1, true>}) {
    e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kM64SmemBytes);
    if (e != cudaSuccess) return e;
  }
  for (auto k : {sparse_decode_ws_kernel<4>, sparse_decode_ws_kernel<2>, sparse_decode_ws_kernel<1>,
                 sparse_decode_ws_kernel<1, true>}) {
    e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kWsSmemBytes);
    if (e != cudaSuccess) return e;
  }
  int major = 0;
  e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e != cudaSuccess) return e;
  const char* pdl_env = getenv("DSV4_SPARSE_DECODE_PDL");   // off: plain launches (no PDL)
  if (major >= 9 && !switch_off(pdl_env)) g_pdl_ok.fetch_or(bit, std::memory_order_release);
  g_smem_configured.fetch_or(bit, std::memory_order_release);
  return cudaSuccess;
}

cudaError_t launch_sparse_decode(const SparseDecodeParams& p, cudaStream_t stream) {
  cudaError_t e = ensure_smem_attr();
  if (e != cudaSuccess) return e;
  int dev = 0;
  e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const bool pdl_ok = (g_pdl_ok.load(std::memory_order_acquire) >> (dev & 63)) & 1ull;
  // the first grid: with PDL unless the call asks for a plain launch (params.h, plain_launch); the combine: with PDL
  const bool pdl = pdl_ok && p.plain_launch == 0;
  const int64_t rows = p.b * p.s_q;
  if (p.impl >= 5 && p.impl <= 8) {
    // warp-specialised block (kernel_ws.cuh; 384 threads), 64 / 32 / 16 heads (MT = 4 / 2 / 1; impl 8: 16 heads with
    // the deep gather): grid as impl 2-4's
    const int64_t hpb = p.impl >= 7 ? kM64Heads / 4 : p.impl == 6 ? kM64Heads / 2 : kM64Heads;
    const int64_t head_blocks = (p.h_q + hpb - 1) / hpb;
    if (rows * head_blocks > 2147483647LL) return cudaErrorInvalidValue;
    e = launch_kernel(p.impl == 8   ? sparse_decode_ws_kernel<1, true>
                      : p.impl == 7 ? sparse_decode_ws_kernel<1>
                      : p.impl == 6 ? sparse_decode_ws_kernel<2>
                                    : sparse_decode_ws_kernel<4>,
                      dim3((unsigned)(rows * head_blocks), 1u, (unsigned)p.num_splits), kWsThreads, kWsSmemBytes, pdl,
                      stream, p);
  } else if (p.impl >= 2 && p.impl <= 4) {
    // grid.x = row * head_blocks + head block (the head blocks of a row are adjacent: shared K rows hit L2);
    // impl 3 / 4: 32 / 16 heads per block (the kernel's MT = 2 / 1)
    const int64_t hpb = p.impl == 4 ? kM64Heads / 4 : p.impl == 3 ? kM64Heads / 2 : kM64Heads;
    const int64_t head_blocks = (p.h_q + hpb - 1) / hpb;
    if (rows * head_blocks > 2147483647LL) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)(rows * head_blocks), 1u, (unsigned)p.num_splits);
    // K/V layout: swizzled except for unsplit 64-head blocks (kernel_mma64.cuh, kM64KTile; H100)
    e = launch_kernel(p.impl == 4   ? sparse_decode_mma64_kernel<1, true>
                      : p.impl == 3 ? sparse_decode_mma64_kernel<2, true>
                      : p.num_splits > 1 ? sparse_decode_mma64_kernel<4, true>
                                         : sparse_decode_mma64_kernel<4, false>,
                      grid, kM64Threads, kM64SmemBytes, pdl, stream, p);
  } else if (p.impl == 1) {
    const int head_tiles = (int)((p.h_q + kMmaHeads - 1) / kMmaHeads);
    e = launch_kernel(sparse_decode_mma_kernel, dim3((unsigned)rows, (unsigned)head_tiles, (unsigned)p.num_splits),
               kMmaThreads, kMmaSmemBytes, pdl, stream, p);
  } else {
    const int head_tiles = (int)((p.h_q + kHeadTile - 1) / kHeadTile);
    e = launch_kernel(sparse_decode_kernel, dim3((unsigned)rows, (unsigned)head_tiles, (unsigned)p.num_splits),
               kThreads, kSmemBytes, pdl, stream, p);
  }
  if (e != cudaSuccess || p.num_splits == 1) return e;
  // the combine grid (PDL): scheduled while the split grid drains, waits in pdl_wait(). kChunk (kernel.cuh): 4 for
  // <= 4 splits, 24 for 17-24 (one round trip), 16 otherwise; small grids split each head row over two blocks.
  const bool two = p.num_splits > 4 && rows * p.h_q <= kCombineSmallGrid;
  auto* kern = p.num_splits <= 4 ? sparse_decode_combine_kernel<4, 1>
               : p.num_splits > 16 && p.num_splits <= 24
                   ? (two ? sparse_decode_combine_kernel<24, 2> : sparse_decode_combine_kernel<24, 1>)
                   : (two ? sparse_decode_combine_kernel<16, 2> : sparse_decode_combine_kernel<16, 1>);
  return launch_kernel(kern, dim3((unsigned)rows, (unsigned)p.h_q, two ? 2u : 1u), two ? 64 : 128, 0, pdl_ok, stream,
                       p);
}

}  // namespace dsv4
