// mma.sync throughput on the GPU at hand: the FLOP ceiling of the instruction class every kernel of this
// project uses (SM120 has no wgmma; on the H100, torch's matmul rate is a wgmma rate, which mma.sync
// kernels cannot reach). Prints, per warps-per-scheduler count, the sustained m16n8k16 bf16 (fp32
// accumulate) rate as TFLOP/s and as SM cycles per mma per scheduler (sub-partition), for register-only
// operands and for a loop shaped like the sparse-decode kernel's S phase (B fragments by ldmatrix.x4 from
// shared memory). The mma and ldmatrix are the extension's own helpers (csrc/common/device.cuh), so this
// times the exact instruction forms the kernels issue.
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_120a,code=sm_120a \
//        benchmarks/mma_peak.cu -o build/mma_peak && build/mma_peak [--json FILE]
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../csrc/common/device.cuh"   // dsv4::mma_bf16_16816, dsv4::ldsm_x4

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "mma_peak: %s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, \
              __LINE__);                                                                      \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

constexpr int kChains = 8;     // independent accumulators per warp in the register mode
constexpr int kIters = 4096;   // loop trips; 8 mma per warp and trip in both modes
using dsv4::ldsm_x4;
using dsv4::mma_bf16_16816;

// FEED = 0: A and B in registers, kChains independent accumulators, back-to-back mma.
// FEED = 1: shaped like the S loop of the sparse-decode kernel (kernel_mma64.cuh): 4 accumulators per warp,
// each step one ldmatrix.x4 (from a distinct 16-row block of a shared-memory tile) feeding two dependent mma
// on the same accumulator (two k16 steps), i.e. 256 B of ldmatrix per mma.
template <int FEED>
__global__ void mma_loop(float* out, long long* cycles, uint32_t seed) {
  __shared__ __align__(16) uint16_t tile[64 * 40];
  for (int i = threadIdx.x; i < 64 * 40; i += blockDim.x) tile[i] = (uint16_t)(0x3c00 + ((i * 7 + seed) & 63));
  __syncthreads();
  const int lane = threadIdx.x & 31;
  uint32_t a[4], a2[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = 0x3f803f80u ^ (uint32_t)((lane + i + seed) & 7);
  for (int i = 0; i < 4; ++i) a2[i] = a[i] ^ 2u;
  b[0] = 0x3f803f80u ^ (uint32_t)(lane & 3);
  b[1] = b[0] ^ 1u;
  float acc[kChains][4];
  for (int c = 0; c < kChains; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
  // lane address of an ldmatrix.x4: row (lane & 15) of a 16-row block, 16-byte column half (lane >> 4)
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(tile + (lane & 15) * 40 + 8 * (lane >> 4));
  __syncwarp();
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    if (FEED) {
      // column half of the row (16 bf16 = 32 B) from a hash of the trip: addresses the compiler cannot see
      // repeat, so every ldmatrix stays in the loop (with `it & 1` they were CSE'd across unrolled trips)
      const uint32_t col = (((uint32_t)it * 2654435761u) >> 31) * 32u;
      // the step's four fragments, then its mma; ptxas still consumes each fragment right after its load here
      // (the kernel's S loop keeps several in flight), so this rate is a pessimistic bound for that loop
      uint32_t r[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t addr = base + (uint32_t)(j * 16 * 40 * 2) + col;
        ldsm_x4(r[j], addr);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {   // 4 accumulators (token n8 tiles), as sacc[j] in the S loop
        mma_bf16_16816(acc[j], a, r[j]);
        mma_bf16_16816(acc[j], a2, r[j] + 2);
      }
    } else {
#pragma unroll
      for (int c = 0; c < kChains; ++c) mma_bf16_16816(acc[c], a, b);
    }
  }
  const long long t1 = clock64();
  float s = 0.f;
  for (int c = 0; c < kChains; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

int main(int argc, char** argv) {
  const char* json = nullptr;
  for (int i = 1; i + 1 < argc; ++i)
    if (!strcmp(argv[i], "--json")) json = argv[i + 1];
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  printf("device %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, sms);
  float* out;
  long long* cyc;
  CHECK(cudaMalloc(&out, (size_t)sms * 1024 * sizeof(float)));
  CHECK(cudaMalloc(&cyc, (size_t)sms * sizeof(long long)));
  long long* hc = (long long*)malloc((size_t)sms * sizeof(long long));
  FILE* jf = json ? fopen(json, "w") : nullptr;
  if (jf) fprintf(jf, "{\"device\": \"%s\", \"sms\": %d, \"rows\": [\n", prop.name, sms);
  printf("%-10s %6s %12s %10s %20s\n", "operands", "warps", "TFLOP/s", "GHz(eff)", "cycles/mma/scheduler");
  bool first = true;
  for (int feed = 0; feed < 2; ++feed) {
    for (int wps = 1; wps <= 4; ++wps) {   // warps per scheduler: blocks of 4 * wps warps, one per SM
      const int threads = 128 * wps;
      cudaEvent_t e0, e1;
      CHECK(cudaEventCreate(&e0));
      CHECK(cudaEventCreate(&e1));
      float best_ms = 1e30f;
      for (int rep = 0; rep < 5; ++rep) {
        CHECK(cudaEventRecord(e0));
        if (feed) mma_loop<1><<<sms, threads>>>(out, cyc, 1u + rep);
        else mma_loop<0><<<sms, threads>>>(out, cyc, 1u + rep);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0 && ms < best_ms) best_ms = ms;
      }
      CHECK(cudaMemcpy(hc, cyc, (size_t)sms * sizeof(long long), cudaMemcpyDeviceToHost));
      double cmax = 0;
      for (int i = 0; i < sms; ++i) cmax = hc[i] > cmax ? (double)hc[i] : cmax;
      const double mmas_per_sched = (double)wps * kIters * 8;   // one scheduler's share of a block
      const double flops = (double)sms * 4 * mmas_per_sched * 16 * 8 * 16 * 2;
      const double tflops = flops / (best_ms * 1e-3) / 1e12;
      const double cpm = cmax / mmas_per_sched;
      const double ghz = cmax / (best_ms * 1e-3) / 1e9;   // loop cycles over kernel time: a lower bound
      printf("%-10s %6d %12.1f %10.2f %20.2f\n", feed ? "ldsm-S" : "registers", 4 * wps, tflops, ghz, cpm);
      if (jf) {
        fprintf(jf, "%s  {\"operands\": \"%s\", \"warps_per_block\": %d, \"tflops\": %.2f, \"cycles_per_mma\": %.3f}",
                first ? "" : ",\n", feed ? "ldsm-S" : "registers", 4 * wps, tflops, cpm);
        first = false;
      }
      CHECK(cudaEventDestroy(e0));
      CHECK(cudaEventDestroy(e1));
    }
  }
  if (jf) {
    fprintf(jf, "\n]}\n");
    fclose(jf);
  }
  CHECK(cudaFree(out));
  CHECK(cudaFree(cyc));
  free(hc);
  return 0;
}
