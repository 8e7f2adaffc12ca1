// Instantiations + launcher of the block-scaled FP8 linear decode kernel (kernel.cuh).
#include <atomic>
#include "fp8_linear/kernel.cuh"
#include "fp8_linear/kernel_ring.cuh"

namespace dsv4 {

static PdlSwitch g_fp8_linear_pdl("DSV4_FP8_LINEAR_PDL");   // "0": plain launches

namespace {
using namespace fp8lin;
using Kernel = void (*)(Fp8LinearParams);

// Token tiles (n = 8 each) by M: 1, 2, 3, 4, 6, 8 (M <= 8, 16, 24, 32, 48, 64).
constexpr int kTileCounts[6] = {1, 2, 3, 4, 6, 8};
constexpr int kNumMt = 6;

template <int MT, int kMode, bool kInt>
struct Entry {
  static Kernel get(bool ring) {
    return ring ? fp8_linear_ring_kernel<MT, kMode, kInt> : fp8_linear_kernel<MT, kMode, kInt>;
  }
  static int smem(bool ring) { return ring ? RingCfg<MT>::kSmemBytes : Cfg<MT, kMode>::kSmemBytes; }
};

template <int MT, int kMode>
Kernel pick_decode(bool cvt_int, bool ring, int* smem) {
  *smem = Entry<MT, kMode, false>::smem(ring);
  return cvt_int ? Entry<MT, kMode, true>::get(ring) : Entry<MT, kMode, false>::get(ring);
}

template <int MT>
Kernel pick_mode(int mode, bool cvt_int, bool ring, int* smem) {
  switch (mode) {
    case 0: return pick_decode<MT, 0>(cvt_int, ring, smem);
    case 1: return pick_decode<MT, 1>(cvt_int, ring, smem);
    default: return pick_decode<MT, 2>(cvt_int, ring, smem);
  }
}

int tile_index(int64_t M) {
  const int64_t t = (M + 7) / 8;
  for (int i = 0; i < kNumMt; ++i)
    if (kTileCounts[i] >= t) return i;
  return kNumMt - 1;
}

Kernel pick(int mt_index, int mode, bool cvt_int, bool ring, int* smem) {
  switch (mt_index) {
    case 0: return pick_mode<1>(mode, cvt_int, ring, smem);
    case 1: return pick_mode<2>(mode, cvt_int, ring, smem);
    case 2: return pick_mode<3>(mode, cvt_int, ring, smem);
    case 3: return pick_mode<4>(mode, cvt_int, ring, smem);
    case 4: return pick_mode<6>(mode, cvt_int, ring, smem);
    default: return pick_mode<8>(mode, cvt_int, ring, smem);
  }
}

// cudaFuncAttributeMaxDynamicSharedMemorySize, set once per (device, kernel): one bit per device index for each
// of the 2 x 6 x 3 x 2 instances (no device query or attribute call after the first launch: graph-capture safe).
std::atomic<unsigned long long> g_smem_set[2 * kNumMt * 3 * 2];
}  // namespace

cudaError_t launch_fp8_linear(const Fp8LinearParams& p, cudaStream_t stream) {
  bool pdl = false;
  cudaError_t e = pdl_enabled(g_fp8_linear_pdl, &pdl);
  if (e != cudaSuccess) return e;
  const int mt = tile_index(p.M);
  const bool cvt_int = p.cvt_int != 0;
  const bool ring = p.kernel == DSV4_FP8_LINEAR_KERNEL_RING;
  int smem = 0;
  const Kernel k = pick(mt, (int)p.scale_mode, cvt_int, ring, &smem);
  int dev = 0;
  e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = 1ull << (dev & 63);
  std::atomic<unsigned long long>& flag =
      g_smem_set[((ring ? kNumMt : 0) + mt) * 6 + (int)p.scale_mode * 2 + (cvt_int ? 1 : 0)];
  if (!(flag.load(std::memory_order_acquire) & bit)) {
    e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    flag.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid((unsigned)((p.N + kTileN - 1) / kTileN), (unsigned)p.splits, (unsigned)p.G);
  if (ring) {   // x -> f16 fragments once per call (p.xf), then the linear kernel (PDL: its weight stages overlap)
    const int64_t units = p.G * (p.K / kStepK) * 8 * kTileCounts[mt] * 16;
    e = launch_kernel(fp8_linear_prep_x, dim3((unsigned)((units + kPrepThreads - 1) / kPrepThreads)), kPrepThreads, 0,
                      pdl, stream, p);
    if (e != cudaSuccess) return e;
  }
  return launch_kernel(k, grid, kThreads, smem, pdl, stream, p);
}

}  // namespace dsv4
