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

// Blocks per SM a kernel reaches (asked once per kernel and device: no query after the first call, so a
// graph capture sees only the launches).
int stream_occupancy(StreamKernel k, int dev, cudaError_t* err) {
  struct Entry {
    StreamKernel k;
    int dev, occ;
  };
  static std::mutex mu;
  static Entry cache[64];
  static int n = 0;
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < n; ++i)
    if (cache[i].k == k && cache[i].dev == dev) return cache[i].occ;
  int occ = 0;
  *err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, fp4moe::kThreads, 0);
  if (*err != cudaSuccess) return 0;
  if (n < 64) cache[n++] = {k, dev, occ};
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
cudaError_t launch_stream_one(StreamKernel k, const Fp4MoeStreamParams& p, int64_t tiles, int64_t nsteps, int64_t wpi,
                              int nsm, int dev, bool pdl, cudaStream_t stream) {
  cudaError_t e = cudaSuccess;
  int occ = stream_occupancy(k, dev, &e);
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
  return launch_kernel(k, dim3((unsigned)blocks), fp4moe::kThreads, 0, pdl, stream, p);
}

template <int kSt, int kMinB>
cudaError_t launch_stream_variant(const Fp4MoeStreamParams& p, bool pdl, cudaStream_t stream) {
  using namespace fp4moe;
  using stream::fp4_moe_stream_kernel;
  int dev = 0, nsm = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  e = cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  StreamKernel k1 =
      p.d.s13_f32 ? fp4_moe_stream_kernel<true, 1, kSt, kMinB> : fp4_moe_stream_kernel<false, 1, kSt, kMinB>;
  StreamKernel k2 =
      p.d.s2_f32 ? fp4_moe_stream_kernel<true, 2, kSt, kMinB> : fp4_moe_stream_kernel<false, 2, kSt, kMinB>;
  e = launch_stream_one(k1, p, p.d.inter / kGemm1Rows, p.d.hidden / kStepK, p.wpi1, nsm, dev, pdl, stream);
  if (e != cudaSuccess) return e;
  return launch_stream_one(k2, p, p.d.hidden / kGemm2Rows, p.d.inter / kStepK, p.wpi2, nsm, dev, pdl, stream);
}

}  // namespace

cudaError_t launch_fp4_moe_stream(const Fp4MoeStreamParams& p, cudaStream_t stream) {
  bool pdl = false;
  cudaError_t e = pdl_enabled(g_fp4_pdl, &pdl);
  if (e != cudaSuccess) return e;
  // variant 0: 3 weight steps per warp in the ring (2 in flight), 3 blocks per SM (<= 168 registers, as the
  // two-launch kernels); variant 1: 2 steps (1 in flight), 4 blocks per SM (<= 128 registers): more warps to
  // interleave the decode's instruction stream. Which one is faster is the GPU round's question.
  return p.variant == 1 ? launch_stream_variant<2, 4>(p, pdl, stream) : launch_stream_variant<3, 3>(p, pdl, stream);
}

}  // namespace dsv4
