// How fast can one wave of blocks stream x for hc_prenorm at m = 512 (docs/hc_prenorm.md)?
// x bf16 [512, 16384] (16 MiB), grid (8 m tiles of 64 rows, 16 K slices of 1024): each block reads 128 KiB,
// the shape of the compiled kernel with SGLang's 16 splits. Times, per launch, in CUDA graphs of kReps
// launches rotating over kBufs copies of x (larger than the L2, so x comes from DRAM), no PDL:
//   hc_S16      the compiled kernel (csrc/hc_prenorm/kernel.cuh), kFast instance, num_splits 16, P 1
//   hc_S16 general  the same call on the general instance (predicated loads, scalar epilogue stores)
//   hc_P16      the general instance, num_splits 1, P 16 (the last block sums the partials)
//   parts fn.. mma..  reg_d1 plus the fn loads (else fn loaded once) and / or the bf16x2 split and 48 mma per
//               chunk: the main loop without bounds checks or epilogue
//   reg_d1      its main loop's loads alone (one 32-wide K chunk ahead per warp, 16 B per lane and n8 tile),
//               square-sum only, no MMA
//   reg_all     every load of the block's 128 KiB issued at once (32 x 16 B per thread), then the sum
//   bulk<NS,KS> cp.async.bulk (one bulk copy per x row and stage) into NS shared-memory stages of 64 rows x
//               KS K values, mbarrier completion, square-sum from shared memory
//   flat xN     a grid-stride read of the 16 MiB by N = 1 / 2 / 4 blocks per SM (the best case for these bytes)
//   empty       an empty kernel (the launch cost inside a graph)
// SM90 / SM120 shared ISA only (cp.async.bulk without multicast, mbarrier, ld.global).
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_120a,code=sm_120a -Icsrc \
//        tools/hc_stream_probe.cu -o build/hc_probe && build/hc_probe
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "hc_prenorm/kernel.cuh"

#define CHECK(x)                                                                                        \
  do {                                                                                                  \
    cudaError_t e_ = (x);                                                                               \
    if (e_ != cudaSuccess) {                                                                            \
      fprintf(stderr, "hc_stream_probe: %s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      exit(1);                                                                                          \
    }                                                                                                   \
  } while (0)

constexpr int kM = 512, kK = 16384, kRowsB = 64, kSlice = 1024, kThr = 256;
constexpr int kBufs = 8, kReps = 16;

__device__ __forceinline__ float sq8(uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float lo = __uint_as_float(w[e] << 16), hi = __uint_as_float(w[e] & 0xffff0000u);
    s = fmaf(lo, lo, s);
    s = fmaf(hi, hi, s);
  }
  return s;
}

__global__ void empty_kernel(float*) {}

// chunk c (32 K values) of the block's 64 rows in the compiled kernel's lane layout: lane (g, t4) 16 B of row
// 8 j + g at k 8 t4 for j < 8 (zeros past the block's slice)
__device__ __forceinline__ void load_chunk(const __nv_bfloat16* x, int row0, int kbeg, int g, int t4, int c,
                                           uint4 (&v)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    v[j] = c < kSlice / 32 ? dsv4::hcp::ld_stream(x + (int64_t)(row0 + 8 * j + g) * kK + kbeg + 32 * c + 8 * t4)
                           : make_uint4(0, 0, 0, 0);
}

// the compiled kernel's load pattern: warp w takes 32-wide K chunks w, w + 8, ..; lane (g, t4) 16 B of row
// 8 j + g at k 8 t4 for j < 8; one chunk ahead
__global__ void __launch_bounds__(kThr, 1) reg_d1(const __nv_bfloat16* x, float* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * kRowsB, kbeg = blockIdx.y * kSlice;
  auto load = [&](int c, uint4 (&v)[8]) { load_chunk(x, row0, kbeg, g, t4, c, v); };
  uint4 a[8], b[8];
  float s = 0.f;
  load(warp, a);
  for (int c = warp; c < kSlice / 32; c += 16) {
    load(c + 8, b);
#pragma unroll
    for (int j = 0; j < 8; ++j) s += sq8(a[j]);
    if (c + 8 >= kSlice / 32) break;
    load(c + 16, a);
#pragma unroll
    for (int j = 0; j < 8; ++j) s += sq8(b[j]);
  }
  out[(blockIdx.y * gridDim.x + blockIdx.x) * kThr + threadIdx.x] = s;
}

// reg_d1 plus parts of the compiled kernel's compute, to see what costs: FN loads fn of every chunk (else once,
// reused), MMA runs the bf16x2 split and the 48 mma per chunk (else only the square-sum; fn values summed)
template <bool FN, bool MMA>
__global__ void __launch_bounds__(kThr, 1) reg_parts(const __nv_bfloat16* x, const float* fn, float* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * kRowsB, kbeg = blockIdx.y * kSlice;
  auto load = [&](int c, uint4 (&v)[8]) { load_chunk(x, row0, kbeg, g, t4, c, v); };
  auto load_fn = [&](int c, float4 (&fv)[3][2]) {
    const int k = kbeg + 32 * (FN ? c : warp) + 8 * t4;
#pragma unroll
    for (int rr = 0; rr < 3; ++rr) {
      const float* f = fn + (int64_t)(g + 8 * rr) * kK + k;
      const bool ok = c < kSlice / 32;
      fv[rr][0] = ok ? __ldg((const float4*)f) : make_float4(0.f, 0.f, 0.f, 0.f);
      fv[rr][1] = ok ? __ldg((const float4*)(f + 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  float acc[3][8][4] = {};
  float s = 0.f;
  auto compute = [&](const uint4 (&xv)[8], const float4 (&fv)[3][2]) {
    if (MMA) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t hi0[3], hi1[3], lo0[3], lo1[3];
#pragma unroll
        for (int rr = 0; rr < 3; ++rr) {
          dsv4::hcp::split_bf16x2(fv[rr][h].x, fv[rr][h].y, hi0[rr], lo0[rr]);
          dsv4::hcp::split_bf16x2(fv[rr][h].z, fv[rr][h].w, hi1[rr], lo1[rr]);
        }
        const uint32_t a0[4] = {hi0[0], hi0[1], hi1[0], hi1[1]};
        const uint32_t a1[4] = {hi0[2], lo0[0], hi1[2], lo1[0]};
        const uint32_t a2[4] = {lo0[1], lo0[2], lo1[1], lo1[2]};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t b[2] = {h ? xv[j].z : xv[j].x, h ? xv[j].w : xv[j].y};
          dsv4::mma_bf16_16816(acc[0][j], a0, b);
          dsv4::mma_bf16_16816(acc[1][j], a1, b);
          dsv4::mma_bf16_16816(acc[2][j], a2, b);
        }
      }
    } else {
#pragma unroll
      for (int rr = 0; rr < 3; ++rr) s += fv[rr][0].x + fv[rr][1].w;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) s += sq8(xv[j]);
  };
  uint4 a[8], b[8];
  float4 fa[3][2], fb[3][2];
  load(warp, a);
  load_fn(warp, fa);
  if (!FN) load_fn(warp, fb);
  for (int c = warp; c < kSlice / 32; c += 16) {
    load(c + 8, b);
    if (FN) load_fn(c + 8, fb);
    compute(a, fa);
    if (c + 8 >= kSlice / 32) break;
    load(c + 16, a);
    if (FN) load_fn(c + 16, fa);
    compute(b, fb);
  }
#pragma unroll
  for (int t = 0; t < 3; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j) s += acc[t][j][0] + acc[t][j][1] + acc[t][j][2] + acc[t][j][3];
  out[(blockIdx.y * gridDim.x + blockIdx.x) * kThr + threadIdx.x] = s;
}

// all 128 KiB of the block in flight at once: thread t loads 32 x 16 B (rows t / 4 .. in steps, coalesced)
__global__ void __launch_bounds__(kThr, 1) reg_all(const __nv_bfloat16* x, float* out) {
  const int row0 = blockIdx.x * kRowsB, kbeg = blockIdx.y * kSlice;
  uint4 v[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int u = threadIdx.x + i * kThr;          // 16-byte unit of the block: 128 per row
    v[i] = dsv4::hcp::ld_stream(x + (int64_t)(row0 + u / 128) * kK + kbeg + 8 * (u % 128));
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) s += sq8(v[i]);
  out[(blockIdx.y * gridDim.x + blockIdx.x) * kThr + threadIdx.x] = s;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}

// NS stages of 64 rows x KS K values (row pitch KS * 2 + 64 bytes: conflict-free 16-byte reads of two rows per
// quarter warp); warp 0's lanes issue the 64 row copies of a stage (2 each), all threads wait on its mbarrier
template <int NS, int KS>
__global__ void __launch_bounds__(kThr, 1) bulk(const __nv_bfloat16* x, float* out) {
  constexpr int kPitch = KS * 2 + 64, kStage = kRowsB * kPitch, kStages = kSlice / KS;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bars[NS];
  const int row0 = blockIdx.x * kRowsB, kbeg = blockIdx.y * kSlice;
  if (threadIdx.x == 0) {
    for (int i = 0; i < NS; ++i) mbar_init(&bars[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int st) {   // warp 0
    const int buf = st % NS, lane = threadIdx.x;
    if (lane == 0) mbar_expect_tx(&bars[buf], kRowsB * KS * 2);
    __syncwarp();
    for (int r = lane; r < kRowsB; r += 32)
      bulk_g2s(smem + buf * kStage + r * kPitch, x + (int64_t)(row0 + r) * kK + kbeg + st * KS, KS * 2, &bars[buf]);
  };
  if (threadIdx.x < 32)
    for (int st = 0; st < NS && st < kStages; ++st) issue(st);
  float s = 0.f;
  for (int st = 0; st < kStages; ++st) {
    const int buf = st % NS;
    mbar_wait(&bars[buf], (st / NS) & 1);
    const uint8_t* base = smem + buf * kStage;
    for (int u = threadIdx.x; u < kRowsB * KS / 8; u += kThr) {
      const int r = u / (KS / 8), c = u % (KS / 8);
      s += sq8(*(const uint4*)(base + r * kPitch + 16 * c));
    }
    __syncthreads();   // stage buf read by everyone before it is refilled
    if (threadIdx.x < 32 && st + NS < kStages) issue(st + NS);
  }
  out[(blockIdx.y * gridDim.x + blockIdx.x) * kThr + threadIdx.x] = s;
}

__global__ void __launch_bounds__(kThr) flat(const __nv_bfloat16* x, float* out) {
  const uint4* v = (const uint4*)x;
  const int64_t n = (int64_t)kM * kK / 8;
  float s = 0.f;
  for (int64_t i = blockIdx.x * kThr + threadIdx.x; i < n; i += (int64_t)gridDim.x * kThr * 4) {
    uint4 a[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t j = i + (int64_t)u * gridDim.x * kThr;
      a[u] = j < n ? dsv4::hcp::ld_stream(v + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) s += sq8(a[u]);
  }
  out[blockIdx.x * kThr + threadIdx.x] = s;
}

struct Ctx {
  std::vector<__nv_bfloat16*> xs;
  float *fn, *out, *sq, *ws, *scratch;
  int32_t* counters;
  int sms;
};

template <class F>
float time_graph(F launch, int iters = 20) {
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int i = 0; i < kBufs; ++i) launch(i, st);   // warm-up (and a launch error shows here)
  CHECK(cudaStreamSynchronize(st));
  CHECK(cudaGetLastError());
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kReps; ++i) launch(i % kBufs, st);
  CHECK(cudaStreamEndCapture(st, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ts;
  for (int it = 0; it < iters; ++it) {
    CHECK(cudaEventRecord(a, st));
    CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1e3f / kReps);
  }
  std::sort(ts.begin(), ts.end());
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaStreamDestroy(st));
  return ts[ts.size() / 2];
}

int main() {
  Ctx c;
  CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t xbytes = (size_t)kM * kK * 2;
  for (int i = 0; i < kBufs; ++i) {
    __nv_bfloat16* p;
    CHECK(cudaMalloc(&p, xbytes));
    CHECK(cudaMemset(p, 0x3c, xbytes));
    c.xs.push_back(p);
  }
  CHECK(cudaMalloc(&c.fn, 24 * kK * 4));
  CHECK(cudaMemset(c.fn, 0, 24 * kK * 4));
  CHECK(cudaMalloc(&c.out, 16 * kM * 24 * 4));
  CHECK(cudaMalloc(&c.sq, 16 * kM * 4));
  CHECK(cudaMalloc(&c.ws, 16 * 8 * 1600 * 4));
  CHECK(cudaMalloc(&c.counters, 4096 * 4));
  CHECK(cudaMemset(c.counters, 0, 4096 * 4));
  CHECK(cudaMalloc(&c.scratch, 1 << 22));
  const dim3 grid(kM / kRowsB, kK / kSlice);
  const double floor_bytes = (double)xbytes;

  auto hc = [&](int S, int P, bool FAST) {
    return [&, S, P, FAST](int i, cudaStream_t st) {
      HcPrenormParams p{};
      p.x = c.xs[i]; p.x_stride = kK; p.fn = c.fn; p.fn_stride = kK;
      p.out = c.out; p.out_stride_s = (int64_t)kM * 24; p.out_stride_m = 24; p.out_stride_n = 1;
      p.sqrsum = c.sq; p.sq_stride_s = kM; p.sq_stride_m = 1; p.ws = c.ws; p.counters = c.counters;
      p.m = kM; p.n = 24; p.K = kK; p.num_splits = S; p.sub_splits = P;
      if (FAST) dsv4::hcp::hc_prenorm_kernel<true><<<dim3(kM / 64, S * P), 256, 0, st>>>(p);
      else dsv4::hcp::hc_prenorm_kernel<false><<<dim3(kM / 64, S * P), 256, 0, st>>>(p);
    };
  };
  struct Row { const char* name; float us; };
  std::vector<Row> rows;
  rows.push_back({"empty", time_graph([&](int, cudaStream_t st) { empty_kernel<<<1, 32, 0, st>>>(c.scratch); })});
  rows.push_back({"hc_S16", time_graph(hc(16, 1, true))});
  rows.push_back({"hc_S16 general", time_graph(hc(16, 1, false))});
  rows.push_back({"hc_P16", time_graph(hc(1, 16, false))});
  rows.push_back({"reg_d1", time_graph([&](int i, cudaStream_t st) { reg_d1<<<grid, kThr, 0, st>>>(c.xs[i], c.scratch); })});
#define PARTS(FN, MMA)                                                                                   \
  rows.push_back({"parts fn" #FN " mma" #MMA, time_graph([&](int i, cudaStream_t st) {                     \
                    reg_parts<FN, MMA><<<grid, kThr, 0, st>>>(c.xs[i], c.fn, c.scratch); })});
  PARTS(true, false)
  PARTS(false, true)
  PARTS(true, true)
  rows.push_back({"reg_all", time_graph([&](int i, cudaStream_t st) { reg_all<<<grid, kThr, 0, st>>>(c.xs[i], c.scratch); })});
#define BULK(NS, KS)                                                                                     \
  {                                                                                                      \
    const int sm = NS * kRowsB * (KS * 2 + 64);                                                          \
    CHECK(cudaFuncSetAttribute(bulk<NS, KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));         \
    rows.push_back({"bulk<" #NS "," #KS ">", time_graph([&](int i, cudaStream_t st) {                    \
                      bulk<NS, KS><<<grid, kThr, sm, st>>>(c.xs[i], c.scratch); })});                    \
  }
  BULK(2, 256)
  BULK(3, 128)
  BULK(4, 128)
  BULK(5, 128)
  BULK(6, 64)
  BULK(10, 64)
  for (int bps : {1, 2, 4})
    rows.push_back({bps == 1 ? "flat x1" : bps == 2 ? "flat x2" : "flat x4", time_graph([&, bps](int i, cudaStream_t st) {
                      flat<<<c.sms * bps, kThr, 0, st>>>(c.xs[i], c.scratch); })});
  printf("x bf16 [%d, %d] = %.2f MiB per launch, %d SMs, graphs of %d launches over %d buffers\n", kM, kK,
         xbytes / 1048576.0, c.sms, kReps, kBufs);
  printf("%-20s %9s %12s\n", "variant", "us", "GB/s of x");
  for (auto& r : rows) printf("%-20s %9.2f %12.0f\n", r.name, r.us, floor_bytes / (r.us * 1e-6) / 1e9);
  return 0;
}
