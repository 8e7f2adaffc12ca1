// Instantiation + launcher of the sparse FP8 MLA decode kernels (see kernel.cuh).
#include <atomic>
#include "kernel_mma.cuh"

namespace dsv4 {

// cudaFuncSetAttribute once per device (not in the hot path; graph-capture safe afterwards:
// the first call on a device happens at the first eager call, before any capture).
static std::atomic<unsigned long long> g_smem_configured{0};

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
  g_smem_configured.fetch_or(bit, std::memory_order_release);
  return cudaSuccess;
}

cudaError_t launch_sparse_decode(const SparseDecodeParams& p, cudaStream_t stream) {
  cudaError_t e = ensure_smem_attr();
  if (e != cudaSuccess) return e;
  const int64_t rows = p.b * p.s_q;
  if (p.impl == 1) {
    const int head_tiles = (int)((p.h_q + kMmaHeads - 1) / kMmaHeads);
    dim3 grid((unsigned)rows, (unsigned)head_tiles, (unsigned)p.num_splits);
    sparse_decode_mma_kernel<<<grid, kMmaThreads, kMmaSmemBytes, stream>>>(p);
  } else {
    const int head_tiles = (int)((p.h_q + kHeadTile - 1) / kHeadTile);
    dim3 grid((unsigned)rows, (unsigned)head_tiles, (unsigned)p.num_splits);
    sparse_decode_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  }
  e = cudaGetLastError();
  if (e != cudaSuccess || p.num_splits == 1) return e;
  dim3 grid2((unsigned)rows, (unsigned)p.h_q);
  sparse_decode_combine_kernel<<<grid2, 128, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4
