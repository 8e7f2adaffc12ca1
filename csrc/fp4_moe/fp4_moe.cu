// Instantiations + launchers of the MXFP4 MoE decode kernels: the two-launch kernels (kernel.cuh) and their
// streaming form on a persistent grid (kernel_stream.cuh).
#include <mutex>

#include "fp4_moe/kernel.cuh"
#include "fp4_moe/kernel_stream.cuh"

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

namespace {

using StreamKernel = void (*)(Fp4MoeStreamParams);

// Blocks per SM a kernel reaches with `dyn` bytes of dynamic shared memory, which is also allowed for it here
// (asked once per kernel and device: no query after the first call, so a graph capture sees only the launches).
int stream_occupancy(StreamKernel k, int dyn, int dev, cudaError_t* err) {
  struct Entry {
    StreamKernel k;
    int dev, occ;
  };
  static std::mutex mu;
  static Entry cache[128];
  static int n = 0;
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < n; ++i)
    if (cache[i].k == k && cache[i].dev == dev) return cache[i].occ;
  if (dyn > 0) {   // static + dynamic > 48 KB needs the opt-in; all of the SM's shared memory for the blocks per SM
    *err = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn);
    if (*err != cudaSuccess) return 0;
    *err = cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (*err != cudaSuccess) return 0;
  }
  int occ = 0;
  *err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, fp4moe::kThreads, dyn);
  if (*err != cudaSuccess) return 0;
  if (n < 128) cache[n++] = {k, dev, occ};
  return occ;
}

// Warps per item as the kernel clamps it (make_groups): 1, 2 or 4, at most the K steps.
int stream_wpi(int64_t req, int64_t nsteps) {
  int w = (req == 2 || req == 4) ? (int)req : 1;
  while (w > 1 && w > nsteps) w >>= 1;
  return w;
}

// Grid of one streaming kernel: enough groups for the most items any routing of this call can have (passes <=
// min(E, S) + S / 8), at most the blocks that are resident at once (a persistent grid: each group then takes
// items i, i + G, ...).
cudaError_t launch_stream_one(StreamKernel k, int dyn, const Fp4MoeStreamParams& p, int64_t tiles, int64_t nsteps,
                              int64_t wpi, int nsm, int dev, bool pdl, cudaStream_t stream) {
  cudaError_t e = cudaSuccess;
  int occ = stream_occupancy(k, dyn, dev, &e);
  if (e != cudaSuccess) return e;
  if (occ < 1) occ = 1;
  if (p.blocks_per_sm > 0 && p.blocks_per_sm < occ) occ = (int)p.blocks_per_sm;
  const int64_t S = p.d.M * p.d.topk;
  const int64_t passes = (p.d.E < S ? p.d.E : S) + S / fp4moe::kCols;
  const int64_t gpb = fp4moe::kWarps / stream_wpi(wpi, nsteps);
  int64_t blocks = (passes * tiles + gpb - 1) / gpb;
  const int64_t cap = (int64_t)nsm * occ;
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  return launch_kernel(k, dim3((unsigned)blocks), fp4moe::kThreads, dyn, pdl, stream, p);
}

// One variant: kSt ring steps, kMinB blocks per SM, weight source, accumulator chains, diagnostic (kernel_stream.cuh).
template <int kSt, int kMinB, int kSrc, int kAcc, int kDiag>
cudaError_t launch_stream_variant(const Fp4MoeStreamParams& p, bool pdl, cudaStream_t stream) {
  using namespace fp4moe;
  using stream::fp4_moe_stream_kernel;
  int dev = 0, nsm = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  e = cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  StreamKernel k1, k2;
  if (kDiag != 0) {   // the diagnostics exist for uint8 scales only (api.cu refuses the others)
    if (p.d.s13_f32 || p.d.s2_f32) return cudaErrorInvalidValue;
    k1 = fp4_moe_stream_kernel<false, 1, kSt, kMinB, kSrc, kAcc, kDiag>;
    k2 = fp4_moe_stream_kernel<false, 2, kSt, kMinB, kSrc, kAcc, kDiag>;
  } else {
    k1 = p.d.s13_f32 ? fp4_moe_stream_kernel<true, 1, kSt, kMinB, kSrc, kAcc, 0>
                     : fp4_moe_stream_kernel<false, 1, kSt, kMinB, kSrc, kAcc, 0>;
    k2 = p.d.s2_f32 ? fp4_moe_stream_kernel<true, 2, kSt, kMinB, kSrc, kAcc, 0>
                    : fp4_moe_stream_kernel<false, 2, kSt, kMinB, kSrc, kAcc, 0>;
  }
  const int dyn = stream::ring_smem_bytes(kSrc, kSt);
  e = launch_stream_one(k1, dyn, p, p.d.inter / kGemm1Rows, p.d.hidden / kStepK, p.wpi1, nsm, dev, pdl, stream);
  if (e != cudaSuccess) return e;
  return launch_stream_one(k2, dyn, p, p.d.hidden / kGemm2Rows, p.d.inter / kStepK, p.wpi2, nsm, dev, pdl, stream);
}

}  // namespace

cudaError_t launch_fp4_moe_stream(const Fp4MoeStreamParams& p, cudaStream_t stream) {
  using fp4moe::stream::kSrcRegs;
  using fp4moe::stream::kSrcSmem;
  using fp4moe::stream::kDiagLoads;
  using fp4moe::stream::kDiagCompute;
  bool pdl = false;
  cudaError_t e = pdl_enabled(g_fp4_pdl, &pdl);
  if (e != cudaSuccess) return e;
  // 0: 3 register ring steps (2 in flight), 3 blocks per SM (<= 168 registers, as the two-launch kernels); 1: 2 steps,
  // 4 blocks (<= 128 registers). H200, I 2048 (docs/fp4_moe.md): 37-48 % / 35-53 % of the weight floor at 1-256
  // tokens, 1 the faster from 2 tokens on. 2 / 3: the ring in shared memory (cp.async; 4 stages at 3 blocks, 3 at 4
  // blocks: 62 / 52 KB per block), 4 / 5: variants 0 / 3 with two MMA chains per tile. Diagnostics: bench only.
  switch (p.variant) {
    case 0: return launch_stream_variant<3, 3, kSrcRegs, 1, 0>(p, pdl, stream);
    case 1: return launch_stream_variant<2, 4, kSrcRegs, 1, 0>(p, pdl, stream);
    case 2: return launch_stream_variant<4, 3, kSrcSmem, 1, 0>(p, pdl, stream);
    case 3: return launch_stream_variant<3, 4, kSrcSmem, 1, 0>(p, pdl, stream);
    case 4: return launch_stream_variant<3, 3, kSrcRegs, 2, 0>(p, pdl, stream);
    case 5: return launch_stream_variant<3, 4, kSrcSmem, 2, 0>(p, pdl, stream);
    case DSV4_FP4_MOE_DIAG_LOADS | 0: return launch_stream_variant<3, 3, kSrcRegs, 1, kDiagLoads>(p, pdl, stream);
    case DSV4_FP4_MOE_DIAG_LOADS | 1: return launch_stream_variant<2, 4, kSrcRegs, 1, kDiagLoads>(p, pdl, stream);
    case DSV4_FP4_MOE_DIAG_LOADS | 3: return launch_stream_variant<3, 4, kSrcSmem, 1, kDiagLoads>(p, pdl, stream);
    case DSV4_FP4_MOE_DIAG_COMPUTE | 0: return launch_stream_variant<3, 3, kSrcRegs, 1, kDiagCompute>(p, pdl, stream);
    case DSV4_FP4_MOE_DIAG_COMPUTE | 1: return launch_stream_variant<2, 4, kSrcRegs, 1, kDiagCompute>(p, pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace dsv4
