// Instantiations + launcher of the block-scaled FP8 linear decode kernel (kernel.cuh).
#include <atomic>
#include "fp8_linear/kernel.cuh"

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
  static Kernel get() { return fp8_linear_kernel<MT, kMode, kInt>; }
};

template <int MT>
Kernel pick_mode(int mode, bool cvt_int, int* smem) {
  switch (mode) {
    case 0: *smem = Cfg<MT, 0>::kSmemBytes; return cvt_int ? Entry<MT, 0, true>::get() : Entry<MT, 0, false>::get();
    case 1: *smem = Cfg<MT, 1>::kSmemBytes; return cvt_int ? Entry<MT, 1, true>::get() : Entry<MT, 1, false>::get();
    default: *smem = Cfg<MT, 2>::kSmemBytes; return cvt_int ? Entry<MT, 2, true>::get() : Entry<MT, 2, false>::get();
  }
}

int tile_index(int64_t M) {
  const int64_t t = (M + 7) / 8;
  for (int i = 0; i < kNumMt; ++i)
    if (kTileCounts[i] >= t) return i;
  return kNumMt - 1;
}

Kernel pick(int mt_index, int mode, bool cvt_int, int* smem) {
  switch (mt_index) {
    case 0: return pick_mode<1>(mode, cvt_int, smem);
    case 1: return pick_mode<2>(mode, cvt_int, smem);
    case 2: return pick_mode<3>(mode, cvt_int, smem);
    case 3: return pick_mode<4>(mode, cvt_int, smem);
    case 4: return pick_mode<6>(mode, cvt_int, smem);
    default: return pick_mode<8>(mode, cvt_int, smem);
  }
}

// cudaFuncAttributeMaxDynamicSharedMemorySize, set once per (device, kernel): one bit per device index for each
// of the 6 x 3 x 2 instances (no device query or attribute call after the first launch: graph-capture safe).
std::atomic<unsigned long long> g_smem_set[kNumMt * 3 * 2];
}  // namespace

cudaError_t launch_fp8_linear(const Fp8LinearParams& p, cudaStream_t stream) {
  bool pdl = false;
  cudaError_t e = pdl_enabled(g_fp8_linear_pdl, &pdl);
  if (e != cudaSuccess) return e;
  const int mt = tile_index(p.M);
  const bool cvt_int = p.cvt_int != 0;
  int smem = 0;
  const Kernel k = pick(mt, (int)p.scale_mode, cvt_int, &smem);
  int dev = 0;
  e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = 1ull << (dev & 63);
  std::atomic<unsigned long long>& flag = g_smem_set[(mt * 3 + (int)p.scale_mode) * 2 + (cvt_int ? 1 : 0)];
  if (!(flag.load(std::memory_order_acquire) & bit)) {
    e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    flag.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid((unsigned)((p.N + kTileN - 1) / kTileN), (unsigned)p.splits, (unsigned)p.G);
  return launch_kernel(k, grid, kThreads, smem, pdl, stream, p);
}

}  // namespace dsv4
