// Block-scaled FP8 linear at decode sizes, second kernel (the default): weights stream through a ring of kStages
// shared-memory stages filled by cp.async (16 B per thread and copy, L2::256B), x converted once per call by a prep
// kernel. Same semantics, scale forms, split-K and precision as kernel.cuh (docs/fp8_linear.md):
//
//  * prep (fp8_linear_prep_x): x bf16 [M, G, K] -> f16 B fragments in the MMA's order (fragments.cuh x_chunk_slot,
//    one power-of-two scale per (token, 128-K group)) in the per-call buffer p.xf, once per call instead of once per
//    block and piece (at M = 64 the old kernel spent more instructions converting x than on its MMAs, and paid x's L2
//    latency on every step). PDL: it waits for the previous kernel, then lets the linear kernel start at once, whose
//    first weight stages are issued before its own griddepcontrol.wait.
//  * stage = one 128-K step of the block's 128 rows (16 KB of weights; 16-byte chunk j of row r at chunk
//    j ^ 4 (r & 1): conflict-free LDS.128 for the A fragments) + that step's x fragments (MT x 2 KB) + the 2^-s of
//    its tokens + the 128 rows' weight-scale words. Every thread copies 4 weight chunks per stage; one commit group
//    per stage, kStages - 1 stages ahead: 64 KB of weights in flight per SM at MT 1, 48 KB at MT 2-4, 32 KB at MT 6-8
//    (the ring takes what 101376 B of shared memory leave beside the x fragments), one block per SM.
//  * warp w: row group wr = w / 2 (rows 32 wr + [0, 32): two m16 tiles, WT = 2) and K half wk = w % 2 (MMAs
//    4 wk .. 4 wk + 3 of the step's 8): each x fragment read from shared memory feeds both weight tiles (half the
//    B traffic per weight byte of kernel.cuh at the same M), the two K halves are summed through shared memory at the
//    end (fixed order: deterministic).
//  * per step the fp32 partial is folded once: acc += w_scale[row] * 2^-s[token] * partial, as in kernel.cuh.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "fp8_linear/params.h"
#include "fp8_linear/fragments.cuh"
#include "fp8_linear/kernel.cuh"
#include "fp8_linear/epilogue.cuh"
#include "common/device.cuh"

namespace dsv4 {
namespace fp8lin {

constexpr int kSmemLimit = 101376;   // SM120's (and sm_90's opt-in is larger) dynamic shared memory per block
constexpr int kPrepThreads = 256;

template <int MT>
struct RingCfg {
  static constexpr int kStageW = kTileN * kStepK;        // weights of one step: 16 KB
  static constexpr int kStageX = MT * 4 * 32 * 16;       // x fragments of one step
  static constexpr int kStageI = MT * 8 * 4;             // 2^-s per token
  static constexpr int kStageS = kTileN * 4;             // raw scale word per row
  static constexpr int kStage = kStageW + kStageX + kStageI + kStageS;
  static constexpr int kFit = kSmemLimit / kStage;
  static constexpr int kStages = kFit > 5 ? 5 : kFit;   // MT 1: 5, MT 2-4: 4, MT 6-8: 3
  static constexpr int kSmemBytes = kStages * kStage;    // (the K-half exchange, MT x 4 KB, reuses the ring)
  static_assert(kStages >= 3, "at least 2 stages ahead");
  static_assert(MT * 4096 <= kSmemBytes, "exchange fits");
};

__device__ __forceinline__ void cp_async16_l2(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
// wait until at most n (0..3, block-uniform) of this thread's newest commit groups are pending
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  if (n <= 0)
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  else if (n == 1)
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  else if (n == 2)
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
  else
    asm volatile("cp.async.wait_group 3;\n" ::: "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}

// ---- prep: x -> f16 fragments of every step, once per call ------------------------------------------------------
// One thread per 8-value chunk (j = u % 16 of token m of step q of group g): the 16 chunks of a (token, step) are
// half a warp (max |x| by shuffles), padding tokens M .. 8 MT - 1 get zeros (their columns are never stored).
__device__ __forceinline__ int token_tiles_of(int64_t M) {   // fp8_linear.cu kTileCounts: 1, 2, 3, 4, 6, 8
  const int t = (int)((M + 7) / 8);
  return t <= 4 ? t : t <= 6 ? 6 : 8;
}

__global__ void __launch_bounds__(kPrepThreads) fp8_linear_prep_x(Fp8LinearParams p) {
  const int mt = token_tiles_of(p.M);
  pdl_wait();               // x: from the previous kernel of the stream; p.xf: read by the previous call's kernel
  pdl_launch_dependents();  // the linear kernel's blocks start their weight stages now
  const int64_t steps = p.K / kStepK, toks = 8 * mt;
  const int64_t units = p.G * steps * toks * 16;
  const int64_t u = (int64_t)blockIdx.x * kPrepThreads + threadIdx.x;
  if (u >= units) return;   // (whole half-warps: units is a multiple of 16)
  const int j = (int)(u & 15);
  const int64_t rest = u >> 4;
  const int m = (int)(rest % toks);
  const int64_t gq = rest / toks;   // g * steps + q
  const int64_t q = gq % steps, g = gq / steps;
  uint4* xf = reinterpret_cast<uint4*>(p.xf);
  float* xinv = reinterpret_cast<float*>(xf + p.G * steps * mt * 128);
  const XSlot d = x_chunk_slot(m, j);
  uint4* dst = xf + (gq * mt + d.t) * 128 + d.piece * 32 + d.lane;
  const unsigned half_mask = 0xFFFFu << (threadIdx.x & 16);
  if (m >= p.M) {   // (uniform over the half warp)
    *dst = make_uint4(0u, 0u, 0u, 0u);
    if (j == 0) xinv[gq * toks + m] = 0.f;
    return;
  }
  const uint4 v = *reinterpret_cast<const uint4*>(reinterpret_cast<const __nv_bfloat16*>(p.x) + m * p.x_stride_m +
                                                  g * p.x_stride_g + q * kStepK + 8 * j);
  uint32_t a = __vmaxu2(__vmaxu2(v.x & 0x7FFF7FFFu, v.y & 0x7FFF7FFFu), __vmaxu2(v.z & 0x7FFF7FFFu, v.w & 0x7FFF7FFFu));
  a = max(a & 0xFFFFu, a >> 16);
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) a = max(a, __shfl_xor_sync(half_mask, a, o, 16));
  const XScale sc = x_group_scale(a);
  uint32_t r0 = bf16x2_to_f16x2_scaled(v.x, sc), r1 = bf16x2_to_f16x2_scaled(v.y, sc);
  uint32_t r2 = bf16x2_to_f16x2_scaled(v.z, sc), r3 = bf16x2_to_f16x2_scaled(v.w, sc);
  if (p.cvt_int) {   // pairs {x0, x2}, {x1, x3} per word pair, as the integer weight decode pairs its bytes
    const uint32_t t0 = __byte_perm(r0, r1, 0x5410u), t1 = __byte_perm(r0, r1, 0x7632u);
    const uint32_t t2 = __byte_perm(r2, r3, 0x5410u), t3 = __byte_perm(r2, r3, 0x7632u);
    r0 = t0, r1 = t1, r2 = t2, r3 = t3;
  }
  *dst = make_uint4(r0, r1, r2, r3);
  if (j == 0) xinv[gq * toks + m] = sc.inv;
}

// ---- the linear kernel ------------------------------------------------------------------------------------------
template <int MT, int kMode, bool kIntCvt>
__global__ void __launch_bounds__(kThreads, 1) fp8_linear_ring_kernel(Fp8LinearParams p) {
  using C = RingCfg<MT>;
  constexpr int S = C::kStages;
  extern __shared__ uint4 smem[];
  const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int wr = warp >> 1, wk = warp & 1;
  const int tile = blockIdx.x, split = blockIdx.y, grp = blockIdx.z;
  const int tiles = gridDim.x;
  const int64_t steps = p.K / kStepK;
  const int q0 = (int)((int64_t)split * steps / p.splits), q1 = (int)((int64_t)(split + 1) * steps / p.splits);
  const int nsteps = q1 - q0;   // >= 1: splits <= K / 128 (checked at the C ABI)

  // copy roles: weight chunk j = tid % 8 of rows tid / 8 + 32 k (k = 0..3), rows past N clamped (read, never stored)
  const int cj = tid & 7, crow = tid >> 3;
  const uint8_t* wsrc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    int64_t r = (int64_t)tile * kTileN + crow + 32 * k;
    r = r < p.N ? r : p.N - 1;
    wsrc[k] = reinterpret_cast<const uint8_t*>(p.w) + (int64_t)grp * p.w_stride_g + r * p.w_stride_n +
              (int64_t)q0 * kStepK + cj * 16;
  }
  const uint32_t wdst = (uint32_t)(crow * 128 + ((cj ^ ((crow & 1) << 2)) * 16));   // + 4096 k
  // scale word of row tid (< 128) per step: mode 0 the tile's float, mode 1 the aligned word holding its byte, mode 2
  // the row's packed word (4 steps per word)
  const int esz = kMode == 1 ? 1 : 4;
  const uint8_t* sg = reinterpret_cast<const uint8_t*>(p.scale) + (int64_t)grp * p.s_stride_g * esz;
  const uint8_t* srow;
  if (kMode == 2) {
    int64_t r = (int64_t)tile * kTileN + (tid & 127);
    r = r < p.N ? r : p.N - 1;
    srow = sg + r * p.s_stride_n * 4;
  } else {
    srow = sg + (int64_t)tile * p.s_stride_n * esz;
  }
  const uint4* xf = reinterpret_cast<const uint4*>(p.xf) + (int64_t)grp * steps * MT * 128;
  const float* xinv_g = reinterpret_cast<const float*>(reinterpret_cast<const uint4*>(p.xf) + p.G * steps * MT * 128) +
                        (int64_t)grp * steps * MT * 8;

  auto issue_weights = [&](int i) {   // step q0 + i into slot i % S: weights and scale words
    const uint32_t st = sbase + (uint32_t)((i % S) * C::kStage);
#pragma unroll
    for (int k = 0; k < 4; ++k) cp_async16_l2(st + wdst + 4096 * k, wsrc[k] + (int64_t)i * kStepK);
    const int q = q0 + i;
    if (kMode == 2 ? tid < kTileN : tid == 0) {
      const uint8_t* s1 = srow + (int64_t)q * p.s_stride_k;   // mode 1: the aligned word holding the byte
      const uint8_t* s = kMode == 0 ? srow + (int64_t)q * p.s_stride_k * 4
                       : kMode == 1 ? reinterpret_cast<const uint8_t*>((uintptr_t)s1 & ~(uintptr_t)3)
                                    : srow + (int64_t)(q >> 2) * p.s_stride_k * 4;
      cp_async4(st + C::kStageW + C::kStageX + C::kStageI + 4 * tid, s);
    }
  };
  auto issue_x = [&](int i) {         // x fragments and 2^-s of step q0 + i (after pdl_wait: the prep kernel's output)
    const uint32_t st = sbase + (uint32_t)((i % S) * C::kStage) + C::kStageW;
    const uint4* src = xf + (int64_t)(q0 + i) * MT * 128;
#pragma unroll
    for (int u = tid; u < MT * 128; u += kThreads) cp_async16_s(st + 16 * u, src + u);
    const uint4* inv = reinterpret_cast<const uint4*>(xinv_g + (int64_t)(q0 + i) * MT * 8);
    if (tid < 2 * MT) cp_async16_s(st + C::kStageX + 16 * tid, inv + tid);
  };

#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (i < nsteps) issue_weights(i);
    cp_async_commit();
  }
  pdl_wait();               // x fragments (the prep kernel), the workspace and the counters
  pdl_launch_dependents();
#pragma unroll
  for (int i = 0; i < S - 1; ++i)
    if (i < nsteps) issue_x(i);
  cp_async_commit();

  float acc[2][MT][4];
#pragma unroll
  for (int tt = 0; tt < 2; ++tt)
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[tt][t][e] = 0.f;

  // this lane's A rows (local): 32 wr + 16 tt + g (+ 8), chunk 4 wk + c (swizzled by the row's parity)
  const int ra = 32 * wr + g;
  const uint32_t aoff = (uint32_t)(ra * 128 + (((4 * wk + c) ^ ((ra & 1) << 2)) * 16));
#pragma unroll 1
  for (int i = 0; i < nsteps; ++i) {
    // stage i is in the prologue's groups (i <= S - 2) or in the group of iteration i - S + 1; newer groups may pend
    cp_async_wait_upto(i < S - 2 ? i : S - 2);
    __syncthreads();   // stage i visible to all; slot (i - 1) % S consumed by all
    if (i + S - 1 < nsteps) {
      issue_weights(i + S - 1);
      issue_x(i + S - 1);
    }
    cp_async_commit();

    const uint32_t st = sbase + (uint32_t)((i % S) * C::kStage);
    const uint32_t xs = st + C::kStageW;
    uint4 alo[2], ahi[2];
#pragma unroll
    for (int tt = 0; tt < 2; ++tt) {
      alo[tt] = lds128(st + aoff + tt * 16 * 128);
      ahi[tt] = lds128(st + aoff + tt * 16 * 128 + 8 * 128);
    }
    float blk[2][MT][4];
#pragma unroll
    for (int tt = 0; tt < 2; ++tt)
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) blk[tt][t][e] = 0.f;
#pragma unroll
    for (int sp = 0; sp < 2; ++sp) {
      uint4 b[MT];
#pragma unroll
      for (int t = 0; t < MT; ++t) b[t] = lds128(xs + 16 * ((t * 4 + 2 * wk + sp) * 32 + lane));
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2) {
        const int sw = 2 * sp + s2;
#pragma unroll
        for (int tt = 0; tt < 2; ++tt) {
          const uint32_t wg = u4(alo[tt], sw), wh = u4(ahi[tt], sw);
          uint32_t a[4];
          if (kIntCvt) {
            a[0] = e4m3x2_lo_to_f16x2(wg);
            a[2] = e4m3x2_hi_to_f16x2(wg);
            a[1] = e4m3x2_lo_to_f16x2(wh);
            a[3] = e4m3x2_hi_to_f16x2(wh);
          } else {
            a[0] = e4m3x2_lo16_to_f16x2(wg);
            a[2] = e4m3x2_hi16_to_f16x2(wg);
            a[1] = e4m3x2_lo16_to_f16x2(wh);
            a[3] = e4m3x2_hi16_to_f16x2(wh);
          }
#pragma unroll
          for (int t = 0; t < MT; ++t) {
            if (s2)
              mma_f16_16816(blk[tt][t], a, b[t].z, b[t].w);
            else
              mma_f16_16816(blk[tt][t], a, b[t].x, b[t].y);
          }
        }
      }
    }
    // fold: acc += w_scale[row] * 2^-s[token] * partial
    const float* xinv = reinterpret_cast<const float*>(smem) + ((i % S) * C::kStage + C::kStageW + C::kStageX) / 4;
    const uint32_t* sw_words = reinterpret_cast<const uint32_t*>(xinv + MT * 8);
    const int q = q0 + i;
#pragma unroll
    for (int tt = 0; tt < 2; ++tt) {
      float s0, s1;
      if (kMode == 0) {
        s0 = s1 = __uint_as_float(sw_words[0]);
      } else if (kMode == 1) {
        const int sh = 8 * (int)((uintptr_t)(srow + (int64_t)q * p.s_stride_k) & 3);
        s0 = s1 = ue8m0_to_float(sw_words[0] >> sh);
      } else {
        const int sh = 8 * (q & 3);
        s0 = ue8m0_to_float(sw_words[ra + 16 * tt] >> sh);
        s1 = ue8m0_to_float(sw_words[ra + 16 * tt + 8] >> sh);
      }
      if (kIntCvt) {   // the integer decode carries 2^-8
        s0 *= 256.f;
        s1 *= 256.f;
      }
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const float2 xi = *reinterpret_cast<const float2*>(xinv + 8 * t + 2 * c);
        acc[tt][t][0] = fmaf(s0 * xi.x, blk[tt][t][0], acc[tt][t][0]);
        acc[tt][t][1] = fmaf(s0 * xi.y, blk[tt][t][1], acc[tt][t][1]);
        acc[tt][t][2] = fmaf(s1 * xi.x, blk[tt][t][2], acc[tt][t][2]);
        acc[tt][t][3] = fmaf(s1 * xi.y, blk[tt][t][3], acc[tt][t][3]);
      }
    }
  }

  // the two K halves: warp 2 wr + 1 hands its partial to warp 2 wr through the (now idle) ring, which adds it
  cp_async_wait_upto(0);
  __syncthreads();
  float* xch = reinterpret_cast<float*>(smem);
  if (wk == 1) {
#pragma unroll
    for (int tt = 0; tt < 2; ++tt)
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) xch[(((wr * 2 + tt) * MT + t) * 4 + e) * 32 + lane] = acc[tt][t][e];
  }
  __syncthreads();
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out) + (int64_t)grp * p.out_stride_g;
  const int M = (int)p.M;
  float* part = p.ws + (((int64_t)grp * p.splits + split) * tiles + tile) * ((int64_t)M * kTileN);
  if (wk == 0) {
#pragma unroll
    for (int tt = 0; tt < 2; ++tt) {
      const int64_t row0 = (int64_t)tile * kTileN + ra + 16 * tt, row1 = row0 + 8;
      const float b0 = (p.splits == 1 && row0 < p.N) ? bias_at(p, row0) : 0.f;
      const float b1 = (p.splits == 1 && row1 < p.N) ? bias_at(p, row1) : 0.f;
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float v = acc[tt][t][e] + xch[(((wr * 2 + tt) * MT + t) * 4 + e) * 32 + lane];
          const int tok = 8 * t + 2 * c + (e & 1);
          const int64_t row = e < 2 ? row0 : row1;
          if (tok >= M) continue;
          if (p.splits == 1) {
            if (row < p.N) out[(int64_t)tok * p.out_stride_m + row] = __float2bfloat16_rn(v + (e < 2 ? b0 : b1));
          } else {
            part[(int64_t)tok * kTileN + (row - (int64_t)tile * kTileN)] = v;
          }
        }
    }
  }
  if (p.splits == 1) return;
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    int32_t* cnt = p.counters + (int64_t)grp * tiles + tile;
    const int done = atomicAdd(cnt, 1) + 1;
    last = done == (int)p.splits;
    if (last) *cnt = 0;   // every block of this tile has counted: ready for the next call
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  sum_split_partials(p, out, tile, tiles, M, tid, kThreads);
}

}  // namespace fp8lin
}  // namespace dsv4
