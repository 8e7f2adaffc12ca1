// run 54: how fast can an SM gather DeepSeek-V4 cache rows (576-byte data row + 8-byte scale row per token, random
// slots of a paged pool) into shared memory, with no compute? One block per "batch row" of T tokens (as the decode
// kernel's unsplit blocks), 256 threads, 8 threads per token, 32-token tiles, a ring of S staging tiles (cp.async,
// wait_group S - 1; slot indices loaded one tile ahead). Prints us per call and GB/s of row bytes (584 per token), cold rows (a rotating window of a
// large pool). Build: nvcc -O3 -arch=sm_90a gather_probe.cu -o gather_probe
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)
constexpr int kRow = 576, kScale = 8, kTok = 32, kPage = 64;
__device__ __forceinline__ void cp16(void* s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(s)), "l"(g));
}
__device__ __forceinline__ void cp8(void* s, const void* g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"((unsigned)__cvta_generic_to_shared(s)), "l"(g));
}
template <int S>
__global__ void __launch_bounds__(256) gather(const unsigned char* pool, const int* idx, int T, long long page_stride,
                                              int* sink) {
  extern __shared__ __align__(16) unsigned char sm[];
  const int gn = threadIdx.x >> 3, gj = threadIdx.x & 7;
  const int* ix = idx + (long long)blockIdx.x * T;
  const int ntiles = T / kTok;
  // the slot index of a tile is loaded one issue ahead (as the decode kernel's index_async does), so that a tile's
  // copies wait for the rows' round trip only
  int next_id = ntiles > 0 ? __ldg(ix + gn) : 0;
  auto issue = [&](int t) {
    unsigned char* dst = sm + (t % S) * (kTok * (kRow + kScale)) + gn * kRow;
    const int id = next_id;
    if (t + 1 < ntiles) next_id = __ldg(ix + (t + 1) * kTok + gn);
    const unsigned char* pg = pool + (long long)(id / kPage) * page_stride;
    const unsigned char* row = pg + (id % kPage) * kRow;
#pragma unroll
    for (int k = 0; k < 4; ++k) cp16(dst + 16 * (gj + 8 * k), row + 16 * (gj + 8 * k));
    if (gj < 4) cp16(dst + 16 * (32 + gj), row + 16 * (32 + gj));
    if (gj == 7) cp8(sm + (t % S) * (kTok * (kRow + kScale)) + kTok * kRow + gn * kScale, pg + kPage * kRow + (id % kPage) * kScale);
    asm volatile("cp.async.commit_group;\n");
  };
  for (int t = 0; t < S - 1 && t < ntiles; ++t) issue(t);
  int acc = 0;
  for (int t = 0; t < ntiles; ++t) {
    if (t + S - 1 < ntiles) issue(t + S - 1); else asm volatile("cp.async.commit_group;\n");
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 1));
    __syncthreads();
    acc += sm[(t % S) * (kTok * (kRow + kScale)) + threadIdx.x * 4];   // touch the tile
    __syncthreads();
  }
  if (acc == 12345) sink[0] = acc;
}
template <int S>
float run(const unsigned char* pool, const int* idx, int blocks, int T, long long ps, int* sink, int reps) {
  const int smem = S * kTok * (kRow + kScale);
  CK(cudaFuncSetAttribute(gather<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  std::vector<float> ts;
  for (int r = 0; r < reps; ++r) {
    const int* ix = idx + (long long)(r % 8) * blocks * T;   // 8 index sets over the pool: rows mostly cold
    CK(cudaEventRecord(a));
    gather<S><<<blocks, 256, smem>>>(pool, ix, T, ps, sink);
    CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b)); CK(cudaGetLastError());
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); ts.push_back(ms * 1e3f);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}
int main() {
  const long long pages = 262144 / kPage * 8;   // 2M tokens, ~1.2 GB: cold rows
  const long long ps = kPage * (kRow + kScale);
  unsigned char* pool; CK(cudaMalloc(&pool, pages * ps)); CK(cudaMemset(pool, 1, pages * ps));
  int* sink; CK(cudaMalloc(&sink, 4));
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> d(0, (int)(pages * kPage - 1));
  const int maxn = 1024 * 640 * 8;
  std::vector<int> h(maxn); for (auto& x : h) x = d(rng);
  int* idx; CK(cudaMalloc(&idx, maxn * 4)); CK(cudaMemcpy(idx, h.data(), maxn * 4, cudaMemcpyHostToDevice));
  // copy bandwidth of this GPU (read + write, 512 MiB)
  { unsigned char *x, *y; CK(cudaMalloc(&x, 512 << 20)); CK(cudaMalloc(&y, 512 << 20));
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); float best = 1e9;
    for (int r = 0; r < 10; ++r) { CK(cudaEventRecord(a)); CK(cudaMemcpy(y, x, 512 << 20, cudaMemcpyDeviceToDevice));
      CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); best = std::min(best, ms); }
    printf("copy: %.0f GB/s (read + write)\n", 2.0 * (512 << 20) / (best * 1e-3) / 1e9); CK(cudaFree(x)); CK(cudaFree(y)); }
  printf("%6s %6s %3s %10s %10s\n", "blocks", "tokens", "S", "us", "GB/s");
  for (int blocks : {32, 128, 256, 1024}) for (int T : {640}) {
    const double bytes = (double)blocks * T * (kRow + kScale);
    float t1 = run<1>(pool, idx, blocks, T, ps, sink, 40), t2 = run<2>(pool, idx, blocks, T, ps, sink, 40),
          t3 = run<3>(pool, idx, blocks, T, ps, sink, 40), t5 = run<5>(pool, idx, blocks, T, ps, sink, 40);
    printf("%6d %6d %3d %10.2f %10.0f\n", blocks, T, 1, t1, bytes / (t1 * 1e-6) / 1e9);
    printf("%6d %6d %3d %10.2f %10.0f\n", blocks, T, 2, t2, bytes / (t2 * 1e-6) / 1e9);
    printf("%6d %6d %3d %10.2f %10.0f\n", blocks, T, 3, t3, bytes / (t3 * 1e-6) / 1e9);
    printf("%6d %6d %3d %10.2f %10.0f\n", blocks, T, 5, t5, bytes / (t5 * 1e-6) / 1e9);
  }
  return 0;
}
