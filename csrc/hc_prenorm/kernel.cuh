// mHC pre-norm GEMM + square-sum (DeepGEMM's tf32_hc_prenorm_gemm, docs/hc_prenorm.md), for m >= 16 with
// DeepSeek-V4's shape (16 / 32-row tiles at decode sizes, ops/hc_prenorm.mma_rows_pick; 64-row tiles above), else
// from m >= 256 (>= 64 with the caller's splits) where Triton builds mma.sync (ops/hc_prenorm.auto_prefers_cuda):
//   out[s, i, j] = sum_{k in split s} x[i, k] * fn[j, k],   sqrsum[s, i] = sum_{k in split s} x[i, k]^2
// SM80+ ISA only (mma.sync m16n8k16 bf16, griddepcontrol), shared by SM90 and SM120.
//
// Shape of the work: n = 24 outputs per row, so the GEMM is a stream of x (bf16, 32 KB per row at
// K = 16384) against a small fp32 fn that stays in L2. The MMA takes fn as the A operand and x as the B
// operand (out^T = fn x^T):
//   A = [hi rows 0..n-1 | lo rows 0..n-1] (fn split into bf16 hi + lo, "bf16x2": 16 mantissa bits of fn,
//       x exact), padded to 48 rows = three m16 tiles, no padding wasted at n = 24. The three fn rows a
//       lane needs (g, g + 8, g + 16) give both their hi and lo fragments in the same lane, so the split
//       is done in registers with no shuffle.
//   B = x^T: lane (g, t4) loads 16 contiguous bytes (8 k values) of x row g of each n8 tile straight from
//       global memory into registers (evict-first: x is read once). The 8 values serve as its B fragment
//       entries of two k16 steps (k positions 2t4, 2t4+1 / 2t4+8, 2t4+9 of each step, a permutation of k
//       applied to A and B alike, which leaves the dot product unchanged). x is read once, as full
//       32-byte sectors, and the square-sum comes from the same registers. (A per-warp cp.async ring,
//       3 chunks deep, was slower on the H100: 118 -> 137-146 us at m = 8192, docs/hc_prenorm.md.)
// Block = kR = 64 x rows (8 n8 tiles per warp; 16 / 32 rows: kFast, below) x one K sub-slice; its 8 warps take
// interleaved 32-wide K chunks (x and fn of the next chunk in flight during the MMAs of the current one) and
// their partials are summed through shared memory in a fixed order. Grid (m tiles, S * P): the caller's split s is cut
// into P sub-slices (DeepGEMM's 64-block partition, twice) when m tiles x S would leave SMs idle; then
// each block writes its partial to a workspace and the P partials are summed in a fixed order
// (deterministic, graph-safe) by
//   kFast shapes (see hc_prenorm_kernel): hc_prenorm_reduce_kernel, a second small grid launched with PDL
//     (docs/hc_prenorm.md);
//   the general kernel: the last block of an (m tile, split) group to arrive (an atomic counter, reset by
//     it), in the same launch, in sub-slice order.
#pragma once
#include <cuda_bf16.h>
#include <type_traits>
#include "common/device.cuh"
#include "hc_prenorm/params.h"

namespace dsv4 {
namespace hcp {

constexpr int kThreads = 256;                  // 8 warps, 255 registers each (sm_120a): one block per SM (kR = 64)
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 64;                      // x rows per block: 8 n8 tiles per warp (MMA N side)
constexpr int kTiles = kRows / 8;
constexpr int kChunk = 32;                     // K per warp step: two k16 MMA steps, 8 k values per lane
constexpr int kKBlock = DSV4_HC_PRENORM_KBLOCK;   // DeepGEMM's split granularity (params.h)
constexpr int kN = DSV4_HC_PRENORM_MAX_N;      // 24 fn rows: A = 48 rows (hi, lo) = 3 m16 tiles
constexpr int kPitch = 28;                     // smem floats per x row of a partial (24 used; 28 makes
                                               // the fragment-order stores conflict-free)
constexpr int kPart = kRows * kPitch + kRows;  // 1856 floats: out partial, then sqrsum partial
constexpr int kOut = kRows * kN + kRows;       // 1600 floats: one block partial in the workspace
// warps 4..7 hand their partials to warps 0..3, which add theirs and leave 4 partials:
constexpr int kSmemBytes = (kWarps / 2) * kPart * 4;         // 29696 B static (<= 48 KB: no opt-in)
static_assert(kSmemBytes + 16 <= 101376, "SM120: at most 101376 B shared memory per block (+ s_last)");
constexpr int kPerThread = (kOut + kThreads - 1) / kThreads; // 7 partial elements per thread in a reduction
constexpr int kSumBatch = 8;                   // partials loaded per round trip of the last block's sum
static_assert(kN == 24, "the fragment mapping below assumes A = 3 m16 tiles of hi / lo rows");

// bf16 hi and lo of a pair of fp32 values: hi = rn(a), lo = rn(a - hi) (a - hi is exact in fp32)
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  hi = *(const uint32_t*)&h;
  lo = *(const uint32_t*)&l;
}

// L2 prefetch size of the x loads (PTX .L2::64B / 128B / 256B, sm_75+, so SM90 and SM120): a lane reads
// 16 B, a warp 64 contiguous bytes of each x row per chunk, and warps w .. w + 3 take consecutive chunks,
// so the hint lets the L2 fetch the 256-byte segment they read next in one DRAM access. H100
// (docs/hc_prenorm.md, same call, 2 rounds alternating): 256 B 2-4 % faster than no hint at every m from
// 512 to 8192 (m = 1024: 20.1 -> 19.6 us; 8192: 109.9 -> 106.5), 128 B about the same as 256 B.
// 0: no hint. (Build-time switch for A/B runs: DSV4_NVCC_FLAGS=-D...)
#ifndef DSV4_HC_X_PREFETCH
#define DSV4_HC_X_PREFETCH 256
#endif
#if DSV4_HC_X_PREFETCH == 0
#define DSV4_HC_X_LD "ld.global.cs.v4.u32"
#elif DSV4_HC_X_PREFETCH == 64
#define DSV4_HC_X_LD "ld.global.cs.L2::64B.v4.u32"
#elif DSV4_HC_X_PREFETCH == 128
#define DSV4_HC_X_LD "ld.global.cs.L2::128B.v4.u32"
#elif DSV4_HC_X_PREFETCH == 256
#define DSV4_HC_X_LD "ld.global.cs.L2::256B.v4.u32"
#else
#error "DSV4_HC_X_PREFETCH: 0, 64, 128 or 256"
#endif

// x straight into registers, streamed (evict-first)
__device__ __forceinline__ uint4 ld_stream(const void* ptr) {
  uint4 v;
  asm volatile(DSV4_HC_X_LD " {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  return v;
}

// kFast (the launcher's choice, hc_prenorm.cu): P == 1 (no sub-slices), m >= 64, K % 32 == 0, n == 24, out
// row-contiguous (out [S, m, 24] with unit n stride, 16-byte aligned base and S stride), i.e. SGLang's calls
// with its own splits. Then no load carries a predicate but the chunk count: the last m tile is shifted
// back to end at row m (it recomputes rows of the tile before it and stores only its own), every chunk is
// whole and all 24 fn rows exist; and the block's out rows leave shared memory as float4 sums and float4
// stores. H100 (docs/hc_prenorm.md, tools/hc_stream_probe.cu, m = 512, 16 splits): 11.4 -> 10.0 us;
// the scalar store loop of the general epilogue alone was ~1.2 us. With P > 1 (n = 24, K % 32 == 0, m >= 64,
// any out strides) the launcher points out / sqrsum at the workspace, laid out as [S * P, m, 24] and
// [S * P, m], so block (mt, z = s P + q) stores its partial as z; hc_prenorm_reduce_kernel sums them. (The
// last-block hand-off of the general kernel, compiled into this one, made its sm_120a build spill 4-16 B:
// the main loop is at the 255-register limit; H100.)
// kR (kFast only below 64; p.mma_rows): x rows per block, 16 or 32 at decode sizes (hc_prenorm.py mma_rows_pick),
// two blocks per SM (<= 128 registers: acc 3 x kR / 8 x 4, x and fn of two chunks in flight); shared memory
// 4 x (kR x kPitch + kR) floats (7424 / 14848 B). With 64 rows a decode call (m <= 128) is one or two row tiles, so
// the grid is P sub-slices of long K ranges on a few dozen SMs; 16-row tiles with 32-64 sub-slices of 256-512 put
// one or two chunks on each warp of 100-260 blocks (H100, num_splits None: m = 48 5.5 -> 4.4 us, m = 64
// 5.4 -> 4.5; with SGLang's 64 splits, against the few-rows FMA kernel: m = 48 4.9 -> 4.0).
// kAtomic (kFast only; p.atomic_sum, one caller split, P > 1): every block adds its float4 sums into the caller's out
// [m, 24] and sqrsum (out_stride_s = sq_stride_s = 0 from the launcher), zeroed by hc_prenorm_zero_kernel just before;
// its PDL wait comes before those atomics, not before the loads, as in the few-rows kernel (kernel_small.cuh).
template <bool kFast, bool kAtomic = false, int kR = kRows>
__global__ void __launch_bounds__(kThreads, kR <= 32 ? 2 : 1) hc_prenorm_kernel(const HcPrenormParams p) {
  static_assert(kFast || !kAtomic, "the atomic sum is an epilogue of the kFast kernel");
  static_assert(kFast || kR == kRows, "the general kernel (its workspace partials, kOut) has 64-row blocks");
  static_assert(kR % 16 == 0 && kR <= kRows, "row tiles of 16, 32, 48 or 64 x rows");
  constexpr int kT = kR / 8;   // n8 tiles of x rows per warp
  __shared__ __align__(16) float red[kWarps / 2][kR * kPitch + kR];
  __shared__ int s_last;
  if constexpr (!kAtomic) pdl_wait();   // x / fn may come from the previous kernel of the stream

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t mt = blockIdx.x, m_tiles = gridDim.x;
  const int64_t row0 = mt * kR;
  // rows computed: [rb, rb + kR); kFast: the last tile ends at row m
  const int64_t rb = kFast ? min(row0, p.m - kR) : row0;
  // K range: DeepGEMM's partition of the 64-wide blocks over the S splits (the first nb % S get one
  // more), then the same partition of split s over its P sub-slices; a range may be empty. kFast: in
  // 32-bit (the operands fit: nb < 2^31, S * P < 2^16), where the sm_120a build spills with int64 (16 B);
  // the general kernel keeps int64, with which its sm_90a build spills less (16 B, not 28) and is 3-6 %
  // faster on the H100.
  using PI = typename std::conditional<kFast, int, int64_t>::type;
  const PI P = (PI)p.sub_splits, S = (PI)p.num_splits;
  const PI s = (PI)blockIdx.y / P, q = (PI)blockIdx.y - s * P;
  const PI nb = (PI)((p.K + kKBlock - 1) / kKBlock);
  const PI b0 = s * (nb / S) + min(s, nb % S), bc = nb / S + (s < nb % S ? 1 : 0);
  const PI c0 = b0 + q * (bc / P) + min(q, bc % P), cc = bc / P + (q < bc % P ? 1 : 0);
  const int64_t kbeg = (int64_t)c0 * kKBlock, kend = min((int64_t)(c0 + cc) * kKBlock, p.K);
  const int nchunks = kend > kbeg ? (int)((kend - kbeg + kChunk - 1) / kChunk) : 0;

  const __nv_bfloat16* xb = (const __nv_bfloat16*)p.x;
  // kFast: the lane's x row rb + g and fn row g at chunk 0; rows 8 j + g and 8 rr + g are multiples of
  // xs8 / fs8 further
  const __nv_bfloat16* xl = xb + (rb + g) * p.x_stride + kbeg + 8 * t4;
  const int64_t xs8 = 8 * p.x_stride;
  const float* fl = p.fn + (int64_t)g * p.fn_stride + kbeg + 8 * t4;
  const int64_t fs8 = 8 * p.fn_stride;
  // chunk c: lane's 8 k values k0 + 8 t4 .. + 7 of x rows rb + 8 j + g and of fn rows g, g + 8, g + 16
  // (K % 8 == 0 and kend is a multiple of 8, so the 8 values are all in range or all out; out of range,
  // out-of-bounds rows and fn rows >= n load zeros, which add nothing)
  auto load_x = [&](int c, uint4 (&xv)[kT]) {
    if (kFast) {
      const bool ok = c < nchunks;
#pragma unroll
      for (int j = 0; j < kT; ++j)
        xv[j] = ok ? ld_stream(xl + j * xs8 + (int64_t)c * kChunk) : make_uint4(0u, 0u, 0u, 0u);
    } else {
      const int64_t k = kbeg + (int64_t)c * kChunk + 8 * t4;
      const bool kok = c < nchunks && k + 8 <= kend;
#pragma unroll
      for (int j = 0; j < kT; ++j) {
        const int64_t r = row0 + 8 * j + g;
        xv[j] = (kok && r < p.m) ? ld_stream(xb + r * p.x_stride + k) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  auto load_fn = [&](int c, float4 (&fv)[3][2]) {
    if (kFast) {
      const bool ok = c < nchunks;
#pragma unroll
      for (int rr = 0; rr < 3; ++rr) {
        const float* f = fl + rr * fs8 + (int64_t)c * kChunk;
        fv[rr][0] = ok ? __ldg((const float4*)f) : make_float4(0.f, 0.f, 0.f, 0.f);
        fv[rr][1] = ok ? __ldg((const float4*)(f + 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    } else {
      const int64_t k = kbeg + (int64_t)c * kChunk + 8 * t4;
      const bool kok = c < nchunks && k + 8 <= kend;
#pragma unroll
      for (int rr = 0; rr < 3; ++rr) {
        const int jr = g + 8 * rr;
        const float* f = p.fn + (int64_t)jr * p.fn_stride + k;
        const bool ok = kok && jr < p.n;
        fv[rr][0] = ok ? __ldg((const float4*)f) : make_float4(0.f, 0.f, 0.f, 0.f);
        fv[rr][1] = ok ? __ldg((const float4*)(f + 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  };
  float acc[3][kT][4];
#pragma unroll
  for (int t = 0; t < 3; ++t)
#pragma unroll
    for (int j = 0; j < kT; ++j) acc[t][j][0] = acc[t][j][1] = acc[t][j][2] = acc[t][j][3] = 0.f;
  float sq[kT];
#pragma unroll
  for (int j = 0; j < kT; ++j) sq[j] = 0.f;

  // k16 step h of a chunk: lane values 4h .. 4h + 3 of its 8 (k positions 2t4, 2t4+1, 2t4+8, 2t4+9)
  auto compute = [&](const uint4 (&xv)[kT], const float4 (&fv)[3][2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t hi0[3], hi1[3], lo0[3], lo1[3];
#pragma unroll
      for (int rr = 0; rr < 3; ++rr) {
        split_bf16x2(fv[rr][h].x, fv[rr][h].y, hi0[rr], lo0[rr]);
        split_bf16x2(fv[rr][h].z, fv[rr][h].w, hi1[rr], lo1[rr]);
      }
      const uint32_t a0[4] = {hi0[0], hi0[1], hi1[0], hi1[1]};   // A rows 0..15: hi of fn rows g, g + 8
      const uint32_t a1[4] = {hi0[2], lo0[0], hi1[2], lo1[0]};   // rows 16..31: hi of g + 16, lo of g
      const uint32_t a2[4] = {lo0[1], lo0[2], lo1[1], lo1[2]};   // rows 32..47: lo of g + 8, g + 16
#pragma unroll
      for (int j = 0; j < kT; ++j) {
        const uint32_t b[2] = {h ? xv[j].z : xv[j].x, h ? xv[j].w : xv[j].y};
        mma_bf16_16816(acc[0][j], a0, b);
        mma_bf16_16816(acc[1][j], a1, b);
        mma_bf16_16816(acc[2][j], a2, b);
      }
    }
#pragma unroll
    for (int j = 0; j < kT; ++j) {   // squares of the bf16 values (exact in fp32)
      const uint32_t w[4] = {xv[j].x, xv[j].y, xv[j].z, xv[j].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float lo = __uint_as_float(w[e] << 16), hi = __uint_as_float(w[e] & 0xffff0000u);
        sq[j] = fmaf(lo, lo, sq[j]);
        sq[j] = fmaf(hi, hi, sq[j]);
      }
    }
  };

  // main loop: warp w takes chunks w, w + 8, ...; the next chunk's loads are in flight during the MMAs
  {
    uint4 xa[kT], xn[kT];
    float4 fa[3][2], fnx[3][2];
    load_x(warp, xa);
    load_fn(warp, fa);
    for (int c = warp; c < nchunks; c += 2 * kWarps) {
      load_x(c + kWarps, xn);
      load_fn(c + kWarps, fnx);
      compute(xa, fa);
      if (c + kWarps >= nchunks) break;
      load_x(c + 2 * kWarps, xa);
      load_fn(c + 2 * kWarps, fa);
      compute(xn, fnx);
    }
  }

  // ---- warp partials -> 4 in shared memory (warps 4..7 store, warps 0..3 add theirs; fixed order).
  //      Lane values of x row 8 j + 2 t4 + e: fn row g = hi (tile 0, row g) + lo (tile 1, row g + 8),
  //      g + 8 = tile 0 row g + 8 + tile 2 row g, g + 16 = tile 1 row g + tile 2 row g + 8.
  auto put = [&](float* d, bool add) {
#pragma unroll
    for (int j = 0; j < kT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float* o = d + (8 * j + 2 * t4 + e) * kPitch + g;
        float v0 = acc[0][j][e] + acc[1][j][2 + e];
        float v1 = acc[0][j][2 + e] + acc[2][j][e];
        float v2 = acc[1][j][e] + acc[2][j][2 + e];
        if (add) { v0 += o[0]; v1 += o[8]; v2 += o[16]; }
        o[0] = v0; o[8] = v1; o[16] = v2;
      }
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      float v = sq[j];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      float* o = d + kR * kPitch + 8 * j + g;
      if (t4 == 0) *o = add ? v + *o : v;
    }
  };
  if (warp >= kWarps / 2) put(red[warp - kWarps / 2], false);
  __syncthreads();
  if (warp < kWarps / 2) put(red[warp], true);
  __syncthreads();

  if (kFast) {
    // float4 t (< 384) of the block result: x row rb + t / 6, fn rows 4 (t % 6) .. + 3; the four warp partials
    // summed in warp order as above. Then the 64 sqrsum values, one per thread. Stored as split z = s P + q
    // (z = s when P = 1; P > 1: out is the workspace, see above).
    const int64_t z = blockIdx.y;
    constexpr int kVecOut = kR * kN / 4;
    if constexpr (kAtomic) pdl_wait();   // out / sqrsum zeroed by the zero kernel
    for (int t = tid; t < kVecOut; t += kThreads) {
      const int off = (t / (kN / 4)) * kPitch + 4 * (t % (kN / 4));
      float4 v = *(const float4*)(&red[0][off]);
#pragma unroll
      for (int w = 1; w < kWarps / 2; ++w) {
        const float4 u = *(const float4*)(&red[w][off]);
        v.x += u.x; v.y += u.y; v.z += u.z; v.w += u.w;
      }
      const int64_t r = rb + t / (kN / 4);
      if (r >= row0) {
        float4* o = (float4*)(p.out + z * p.out_stride_s + r * kN + 4 * (t % (kN / 4)));
        if constexpr (kAtomic) atomicAdd(o, v); else *o = v;
      }
    }
    if (tid < kR && rb + tid >= row0) {
      const int off = kR * kPitch + tid;
      const float v = ((red[0][off] + red[1][off]) + red[2][off]) + red[3][off];
      float* o = p.sqrsum + z * p.sq_stride_s + (rb + tid) * p.sq_stride_m;
      if constexpr (kAtomic) atomicAdd(o, v); else *o = v;
    }
    return;
  }

  // block partial element i (< kOut): x row i / kN, fn row i % kN, or sqrsum of row i - kRows * kN
  auto smem_index = [](int i) {
    return i < kRows * kN ? (i / kN) * kPitch + i % kN : kRows * kPitch + i - kRows * kN;
  };
  auto write = [&](int i, float v) {
    if (i < kRows * kN) {
      const int64_t r = row0 + i / kN;
      const int j = i % kN;
      if (r < p.m && j < p.n) p.out[s * p.out_stride_s + r * p.out_stride_m + j * p.out_stride_n] = v;
    } else {
      const int64_t r = row0 + i - kRows * kN;
      if (r < p.m) p.sqrsum[s * p.sq_stride_s + r * p.sq_stride_m] = v;
    }
  };
  if (P == 1) {
    for (int i = tid; i < kOut; i += kThreads) {
      const int si = smem_index(i);
      write(i, ((red[0][si] + red[1][si]) + red[2][si]) + red[3][si]);
    }
    return;
  }
  // ---- P > 1: partial to the workspace; the last block of the (m tile, split) group sums all P
  const int64_t grp = s * m_tiles + mt;
  float* ws = p.ws + grp * P * kOut;
  for (int i = tid; i < kOut; i += kThreads) {
    const int si = smem_index(i);
    ws[q * kOut + i] = ((red[0][si] + red[1][si]) + red[2][si]) + red[3][si];
  }
  __threadfence();   // this thread's partial is visible device-wide before the block arrives
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(p.counters + grp, 1) == (int)P - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();   // the other blocks' partials (their fences precede their arrival) are seen
  // every thread sums kPerThread elements over the P partials in sub-slice order, kSumBatch partials per
  // round trip (all their loads in flight; a loop of dependent loads made the hand-off the largest cost)
  float v[kPerThread];
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) v[e] = 0.f;
  for (int q0 = 0; q0 < (int)P; q0 += kSumBatch) {
    float t[kSumBatch][kPerThread];
#pragma unroll
    for (int u = 0; u < kSumBatch; ++u)
#pragma unroll
      for (int e = 0; e < kPerThread; ++e) {
        const int i = tid + e * kThreads;
        t[u][e] = (q0 + u < (int)P && i < kOut) ? __ldcg(ws + (int64_t)(q0 + u) * kOut + i) : 0.f;
      }
#pragma unroll
    for (int u = 0; u < kSumBatch; ++u)
#pragma unroll
      for (int e = 0; e < kPerThread; ++e) v[e] += t[u][e];
  }
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {
    const int i = tid + e * kThreads;
    if (i < kOut) write(i, v[e]);
  }
  if (tid == 0) p.counters[grp] = 0;   // ready for the next launch / graph replay
}

// ---- the P > 1 sum of the kFast kernel's partials (ws: out partials [S * P, m, 24], then sqrsum partials
//      [S * P, m]; out / sqrsum with any strides). A unit is one float4 of out (split s, row r, fn rows
//      4 j .. 4 j + 3; S m 6 of them) or one sqrsum value (the next S m). Block = kRedWarps warps over 32
//      consecutive units (lane = unit: coalesced 512-byte loads); warp w sums the partials w, w + kRedWarps,
//      ... of its lane's unit in sub-slice order, then warp 0 adds the kRedWarps warp sums in warp order
//      (shared memory): deterministic. Launched with PDL after the GEMM grid, which does not trigger it
//      early: its blocks are placed as GEMM blocks exit, over all SMs, and pdl_wait() waits for the partials.
//      H100 (docs/hc_prenorm.md, num_splits None, the auto P): one thread per unit summing all P
//      (128-thread blocks) was 1.18x slower at m = 256, 1.03x at 512, equal from 1024; a trigger at the GEMM's
//      start (the reduce blocks then crowd the few SMs the GEMM grid leaves free) 1.09 / 1.05 / 1.03x slower
//      at m = 256 / 512 / 1024 than none.
constexpr int kRedWarps = 8;   // 256 threads, 4 KB of static shared memory

// ---- the atomic sum's first grid (p.atomic_sum): zeroes the caller's out [m, n] and sqrsum [m] (one split, any
//      strides), which the next grid (the few-rows or the kFast kernel with kAtomic) adds its sub-slice sums into.
//      It waits for the previous kernel of the stream first (out's memory may still be read there) and only then
//      lets the next grid launch, which is what lets that grid load x / fn before its own PDL wait. Why a second
//      grid before instead of the reduce grid after: this one has nothing to wait for but the previous kernel,
//      while the reduce grid waits for the slowest GEMM block and reads every partial back from L2 (H100,
//      num_splits None: m = 16 4.2 against 5.1 us, m = 512 10.0 against 11.3).
constexpr int kZeroThreads = 256;
constexpr int kZeroMaxBlocks = 1024;   // grid-stride beyond m (n + 1) = 262144 values
__global__ void __launch_bounds__(kZeroThreads) hc_prenorm_zero_kernel(const HcPrenormParams p) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t w = p.n + 1, tot = p.m * w;
  for (int64_t i = (int64_t)blockIdx.x * kZeroThreads + threadIdx.x; i < tot; i += (int64_t)gridDim.x * kZeroThreads) {
    const int64_t r = i / w, j = i - r * w;
    if (j < p.n) p.out[r * p.out_stride_m + j * p.out_stride_n] = 0.f;
    else p.sqrsum[r * p.sq_stride_m] = 0.f;
  }
}
__global__ void __launch_bounds__(32 * kRedWarps) hc_prenorm_reduce_kernel(const HcPrenormParams p) {
  __shared__ float4 acc[kRedWarps][32];
  pdl_wait();
  const int P = (int)p.sub_splits, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t m = p.m, S = p.num_splits;
  const int64_t part = m * kN;
  const int64_t nvec = S * m * (kN / 4);
  const int64_t u = (int64_t)blockIdx.x * 32 + lane;
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  int64_t s = 0, r = 0;
  int j = 0;
  if (u < nvec) {
    s = u / (m * (kN / 4));
    const int64_t rem = u - s * m * (kN / 4);
    r = rem / (kN / 4);
    j = 4 * (int)(rem - r * (kN / 4));
    const float* src = p.ws + s * P * part + r * kN + j;
    for (int q = w; q < P; q += kRedWarps) {
      const float4 t = __ldcg((const float4*)(src + (int64_t)q * part));
      v.x += t.x; v.y += t.y; v.z += t.z; v.w += t.w;
    }
  } else if (u < nvec + S * m) {
    const int64_t i = u - nvec;
    s = i / m;
    r = i - s * m;
    const float* src = p.ws + S * P * part + s * P * m + r;
    for (int q = w; q < P; q += kRedWarps) v.x += __ldcg(src + (int64_t)q * m);
  }
  acc[w][lane] = v;
  __syncthreads();
  if (w != 0 || u >= nvec + S * m) return;
#pragma unroll
  for (int k = 1; k < kRedWarps; ++k) {
    const float4 t = acc[k][lane];
    v.x += t.x; v.y += t.y; v.z += t.z; v.w += t.w;
  }
  if (u < nvec) {
    float* o = p.out + s * p.out_stride_s + r * p.out_stride_m + j * p.out_stride_n;
    o[0] = v.x;
    o[p.out_stride_n] = v.y;
    o[2 * p.out_stride_n] = v.z;
    o[3 * p.out_stride_n] = v.w;
  } else {
    p.sqrsum[s * p.sq_stride_s + r * p.sq_stride_m] = v.x;
  }
}

}  // namespace hcp
}  // namespace dsv4
