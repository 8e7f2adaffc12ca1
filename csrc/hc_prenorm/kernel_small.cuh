// mHC pre-norm GEMM + square-sum for a few rows (decode: m <= 64) with the caller's K splits (SGLang's
// mhc_pre passes 64 of them at m <= 64): plain fp32 FMA, no tensor cores, no shared memory, one or two rounds
// of loads per 256 K values, so a call is one launch and one or two DRAM round trips (docs/hc_prenorm.md run 16).
//   out[s, i, j] = sum_{k in split s} x[i, k] * fn[j, k],   sqrsum[s, i] = sum_{k in split s} x[i, k]^2
// Why not the MMA kernel (kernel.cuh) here: at m <= 64 the call moves 1.5 MiB of fn and at most 2 MiB of x
// and does at most 25 M multiply-adds, so it is bound by latency: the MMA kernel has 64-row tiles (64 blocks for
// SGLang's 64 splits, or sub-slices and a second reduce grid), this kernel one block per (split, R rows) whose
// 256 threads issue all their loads at once. fp32 FMA of bf16 x (exact in fp32) and fp32 fn is at least as
// precise as the MMA kernel's bf16x2 and DeepGEMM's tf32.
//
// Block = R = kRT * kTR x rows of split s (grid (S, ceil(m / R))), 256 threads = kTR row groups x kJG fn-row
// groups (kJ fn rows each, kJ kJG = 24 >= n) x kTK lanes along K. Lane kt of a (row group, fn-row group) slot
// takes the float4 columns (4 K values) kt, kt + kTK, ... of the split: the kTK lanes of a slot read contiguous
// 16-byte pieces of each fn row (and 8-byte pieces of each x row), hold kRT x kJ sums and kRT square-sums,
// and add them up by shuffles at the end (the kTK lanes of a slot are lanes of one warp). A split may be
// empty (more splits than 64-wide blocks): its partials are written as 0, as DeepGEMM's. With one split
// (num_splits None: SGLang 0.5.13-0.5.22's hc_pre at decode) the launcher runs it on P splits of <= 256 into the
// workspace (DeepGEMM's partition into P splits is the partition of one split into P sub-slices) and
// hc_prenorm_reduce_kernel (kernel.cuh) sums them, as for the MMA kernel's fast instance.
#pragma once
#include <cuda_bf16.h>
#include "common/device.cuh"
#include "hc_prenorm/params.h"

namespace dsv4 {
namespace hcs {

constexpr int kThreads = 256;
constexpr int kKBlock = DSV4_HC_PRENORM_KBLOCK;   // DeepGEMM's split granularity (params.h)

__device__ __forceinline__ float4 bf16x4_to_float4(uint2 v) {
  const float2 a = __bfloat1622float2(*(const __nv_bfloat162*)&v.x);
  const float2 b = __bfloat1622float2(*(const __nv_bfloat162*)&v.y);
  return make_float4(a.x, a.y, b.x, b.y);
}

// kRT x rows and kJ fn rows per lane, kTR row groups per block (R = kRT kTR rows), kU columns per lane in one
// round of loads. Slots (a row group x an fn-row group, kTK lanes each) are numbered row-group major: the
// slots of a warp share their x rows and read different fn rows (H100, run 16: 5-13 % faster than the
// other order, whose warps share fn rows); every lane computes the square-sums (4 FMA per x row and column
// next to kJ x 4), the fn-row group 0 lanes store them.
template <int kRT, int kJ, int kTR, int kU>
__global__ void __launch_bounds__(kThreads, 1) hc_prenorm_small_kernel(const HcPrenormParams p) {
  constexpr int kJG = DSV4_HC_PRENORM_MAX_N / kJ;    // fn-row groups
  constexpr int kTK = kThreads / (kTR * kJG);        // lanes along K per slot
  static_assert(kJ * kJG == DSV4_HC_PRENORM_MAX_N, "fn rows split evenly over the groups");
  static_assert(kTK >= 1 && 32 % kTK == 0 && kTK * kTR * kJG == kThreads, "a slot's lanes are lanes of one warp");
  const int tid = threadIdx.x;
  const int kt = tid % kTK, slot = tid / kTK;
  const int jg = slot % kJG, tr = slot / kJG;
  // block s: split s of out / sqrsum (with num_splits None the launcher passes P sub-slices as P splits of the
  // workspace, and a reduce grid sums them)
  const int64_t s = blockIdx.x, S = p.num_splits;
  const int64_t row0 = (int64_t)blockIdx.y * (kRT * kTR) + tr * kRT;
  // split s: DeepGEMM's partition of the 64-wide K blocks (the first nb % S splits get one more)
  const int64_t nb = (p.K + kKBlock - 1) / kKBlock;
  const int64_t b0 = s * (nb / S) + min(s, nb % S), bc = nb / S + (s < nb % S ? 1 : 0);
  const int64_t c0 = b0 * (kKBlock / 4), c1 = min((b0 + bc) * kKBlock, p.K) / 4;   // float4 columns [c0, c1)

  const __nv_bfloat16* xb = (const __nv_bfloat16*)p.x;
  float acc[kRT][kJ], sq[kRT];
#pragma unroll
  for (int rr = 0; rr < kRT; ++rr) {
    sq[rr] = 0.f;
#pragma unroll
    for (int jj = 0; jj < kJ; ++jj) acc[rr][jj] = 0.f;
  }
  pdl_wait();   // x / fn may come from the previous kernel of the stream
  for (int64_t cb = c0 + kt; cb < c1; cb += (int64_t)kTK * kU) {
    // one round: every load first (out of range, rows >= m and fn rows >= n load zeros, which add nothing)
    float4 f[kU][kJ];
    uint2 xv[kU][kRT];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t c = cb + (int64_t)u * kTK;
      const bool ok = c < c1;
#pragma unroll
      for (int jj = 0; jj < kJ; ++jj) {
        const int64_t j = jg * kJ + jj;
        f[u][jj] = (ok && j < p.n) ? __ldg((const float4*)(p.fn + j * p.fn_stride) + c)
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int rr = 0; rr < kRT; ++rr) {
        const int64_t r = row0 + rr;
        xv[u][rr] = (ok && r < p.m) ? __ldg((const uint2*)(xb + r * p.x_stride) + c) : make_uint2(0u, 0u);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int rr = 0; rr < kRT; ++rr) {
        const float4 xf = bf16x4_to_float4(xv[u][rr]);
        sq[rr] = fmaf(xf.x, xf.x, fmaf(xf.y, xf.y, fmaf(xf.z, xf.z, fmaf(xf.w, xf.w, sq[rr]))));
#pragma unroll
        for (int jj = 0; jj < kJ; ++jj) {
          const float4 fv = f[u][jj];
          acc[rr][jj] = fmaf(xf.x, fv.x, fmaf(xf.y, fv.y, fmaf(xf.z, fv.z, fmaf(xf.w, fv.w, acc[rr][jj]))));
        }
      }
  }
  // sum over the slot's kTK lanes (a fixed butterfly: deterministic); every lane then holds every sum
#pragma unroll
  for (int off = kTK / 2; off > 0; off >>= 1)
#pragma unroll
    for (int rr = 0; rr < kRT; ++rr) {
      sq[rr] += __shfl_xor_sync(0xffffffffu, sq[rr], off);
#pragma unroll
      for (int jj = 0; jj < kJ; ++jj) acc[rr][jj] += __shfl_xor_sync(0xffffffffu, acc[rr][jj], off);
    }
  // value v of the slot (kRT x kJ sums, then kRT square-sums) is stored by lane v % kTK (compile-time
  // register index, runtime predicate)
#pragma unroll
  for (int v = 0; v < kRT * kJ; ++v) {
    const int rr = v / kJ, jj = v % kJ;
    const int64_t r = row0 + rr, j = jg * kJ + jj;
    if (v % kTK == kt && r < p.m && j < p.n) p.out[s * p.out_stride_s + r * p.out_stride_m + j * p.out_stride_n] = acc[rr][jj];
  }
  if (jg == 0) {
#pragma unroll
    for (int rr = 0; rr < kRT; ++rr) {
      const int64_t r = row0 + rr;
      if ((kRT * kJ + rr) % kTK == kt && r < p.m) p.sqrsum[s * p.sq_stride_s + r * p.sq_stride_m] = sq[rr];
    }
  }
}

}  // namespace hcs
}  // namespace dsv4
