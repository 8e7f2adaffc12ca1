// mHC pre-norm GEMM + square-sum for a few rows (decode: m <= 64) with the caller's K splits (SGLang's
// mhc_pre passes 64 of them at m <= 64): plain fp32 FMA, no tensor cores, no shared memory, one or two rounds
// of loads per 256 K values, so a call is one launch and one or two DRAM round trips (docs/hc_prenorm.md).
//   out[s, i, j] = sum_{k in split s} x[i, k] * fn[j, k],   sqrsum[s, i] = sum_{k in split s} x[i, k]^2
// Why not the MMA kernel (kernel.cuh) here: at m <= 64 the call moves 1.5 MiB of fn and at most 2 MiB of x
// and does at most 25 M multiply-adds, so it is bound by latency and instruction issue: the MMA kernel has
// 64-row tiles (64 blocks for SGLang's 64 splits, or sub-slices and a second reduce grid), this kernel one
// block per (split, R rows) whose 256 threads issue all the loads of a round at once. fp32 FMA of bf16 x (exact
// in fp32) and fp32 fn is at least as precise as the MMA kernel's bf16x2 and DeepGEMM's tf32.
//
// Block = R = kRT * kTR x rows of split s (grid (S, ceil(m / R))), 256 threads = kTR row groups x kJG fn-row
// groups (kJ fn rows each, kJ kJG = 24 >= n) x kTK lanes along K. Lane kt of a (row group, fn-row group) slot
// takes the float4 columns (4 K values) kt, kt + kTK, ... of the split: the kTK lanes of a slot read contiguous
// 16-byte pieces of each fn row (and 8-byte pieces of each x row), hold kRT x kJ sums and kRT square-sums,
// and add them up by shuffles at the end (the kTK lanes of a slot are lanes of one warp). Two blocks per SM
// (kMinBlocksPerSm: <= 128 registers), which the launch rule (hc_prenorm.small_rows) counts on. A split may
// be empty (more splits than 64-wide blocks): its partials are written as 0, as DeepGEMM's. With one split
// (num_splits None: SGLang's hc_pre DeepGEMM branch, docs/sglang_surface.md, hc_prenorm) the launcher runs it on P
// splits of <= 256 into the workspace (DeepGEMM's partition into P splits is the partition of one split into P
// sub-slices) and hc_prenorm_reduce_kernel (kernel.cuh) sums them, as for the MMA kernel's fast instance, or, with
// an exchange buffer (p.xchg, kXchg), the kernel sums them itself (see xchg_consume): no second grid, or (p.atomic_sum,
// kAtomic) every block adds its values into the caller's out / sqrsum, zeroed by hc_prenorm_zero_kernel (kernel.cuh)
// launched just before: no second grid after it and no partials, at the price of a sum order that depends on timing.
#pragma once
#include <cuda_bf16.h>
#include <type_traits>
#include "common/device.cuh"
#include "hc_prenorm/params.h"

namespace dsv4 {
namespace hcs {

constexpr int kThreads = 256;
// blocks per SM every instance is compiled for (__launch_bounds__: at most 65536 / (2 x 256) = 128 registers);
// hc_prenorm.py's _SMALL_BLOCKS_PER_SM mirrors it. H100: two per SM beat one (and a second wave) at
// m = 16-64 (m = 32: 4.0 against 5.2 us), three spill.
constexpr int kMinBlocksPerSm = 2;
constexpr int kKBlock = DSV4_HC_PRENORM_KBLOCK;   // DeepGEMM's split granularity (params.h)

// ---- the exchange (kXchg): num_splits None's P sub-slice partials summed inside the launch.
// Why: the reduce grid's kernel boundary costs ~2.1 us at m <= 63 (docs/hc_prenorm.md), and the hand-off
// measured before (H100: stores, a fence, a counter, the last block loads) ~2.5 us: three dependent L2
// round trips after the last store. Here each partial carries the call's tag in the same 8-byte word (value bits
// low, tag high; one single-copy-atomic store), so a reader needs no fence and no counter after the stores: it
// loads the words and re-loads any whose tag is not yet this call's.
//   * Who sums: every block takes a ticket of its row block at its start (one relaxed atomic, its result used
//     only at the end); the block that draws the last ticket (P - 1) sums the row block's P partials. Every other
//     block of the row block has then started, and no block waits for anything but that one's partials, so the
//     wait always ends (no assumption on the order or co-residency of blocks). It resets the ticket to 0.
//   * Tags: epochs[r] counts the calls that covered row r; a call tags row r's words epochs[r] + 1 and its summing
//     block stores that back into epochs[r] after reading them. Every block reads epochs[r] before it stores a
//     word of row r and the summing block writes it only after it has seen every word, so all blocks of a call
//     use one tag per row; a word left from an earlier call holds a smaller tag (words are addressed by row,
//     sub-slice and value, not by row block, so changing R between calls changes nothing), until the 32-bit tag
//     wraps (2^32 calls of one row) with a word not written since (only if the sub-slice count changes: a fixed
//     K writes every word of each row it covers on every call).
//   * Order: word (r, s, v) of sub-slice s; value v = chain sums s = c, c + 8, ... (c < 8) from 0, then the
//     eight chains in order: the reduce grid's order (hc_prenorm_reduce_kernel), so both give the same bits.
constexpr int kXVals = DSV4_HC_PRENORM_MAX_N + 1;    // 24 fn rows and the square-sum per (row, sub-slice)
constexpr int kXChains = 8;   // = hcp::kRedWarps, the reduce grid's sums per value (static_assert: hc_prenorm.cu)

__device__ __forceinline__ uint32_t ld_relaxed_u32(const uint32_t* a) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed_u64(const unsigned long long* a) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_u64(unsigned long long* a, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(a), "l"(v) : "memory");
}

struct Xchg {   // views of p.xchg (params.h)
  uint32_t* epochs;
  uint32_t* tickets;
  unsigned long long* words;
  __device__ __forceinline__ explicit Xchg(void* base)
      : epochs((uint32_t*)base), tickets((uint32_t*)base + DSV4_HC_PRENORM_XCHG_ROWS),
        words((unsigned long long*)((char*)base + DSV4_HC_PRENORM_XCHG_HEADER_BYTES)) {}
  __device__ __forceinline__ unsigned long long* word(int64_t r, int s, int v) const {
    return words + (r * DSV4_HC_PRENORM_MAX_SUB + s) * kXVals + v;
  }
};

// The summing block of row block blockIdx.y (kR rows, P = p.num_splits sub-slices): waits for and sums the P tagged
// partials of each of its values, writes out / sqrsum (the caller's [m, 24] / [m]), then readies the epochs and
// the ticket for the next call. Units (chain c, row, value) with the value fastest: consecutive threads read
// consecutive words. A unit's <= 8 words are loaded at once, then the untagged ones re-loaded together until all
// are tagged (a word that never comes would be a bug: after ~2^26 rounds the kernel traps instead of hanging the
// stream).
template <int kR>
__device__ __forceinline__ void xchg_consume(const HcPrenormParams& p, const Xchg& xc) {
  static_assert(DSV4_HC_PRENORM_MAX_SUB <= 8 * kXChains, "a unit's words fit its 8 registers");
  __shared__ float part[kXChains][kR * kXVals];
  const int tid = threadIdx.x, P = (int)p.num_splits;
  const int64_t rbase = (int64_t)blockIdx.y * kR;
  const int nr = (int)min((int64_t)kR, p.m - rbase), nv = nr * kXVals;
  for (int u = tid; u < nv * kXChains; u += kThreads) {
    const int c = u / nv, i = u - c * nv, rr = i / kXVals, v = i - rr * kXVals;
    const unsigned long long* src = xc.word(rbase + rr, c, v);
    unsigned long long w[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = c + kXChains * k < P ? ld_relaxed_u64(src + kXChains * k * kXVals) : 0ull;
    const uint32_t tag = ld_relaxed_u32(xc.epochs + rbase + rr) + 1u;
    // every word not yet tagged is re-loaded in the same round (one L2 round trip per round, not one per word)
    for (uint32_t spins = 0;; ++spins) {
      bool missing = false;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (c + kXChains * k < P && (uint32_t)(w[k] >> 32) != tag) {
          missing = true;
          w[k] = ld_relaxed_u64(src + kXChains * k * kXVals);
        }
      }
      if (!missing) break;
      if (spins == (1u << 26)) __trap();
    }
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (c + kXChains * k < P) sum += __uint_as_float((uint32_t)w[k]);
    part[c][i] = sum;
  }
  __syncthreads();   // (also: every thread's epoch loads are done before they are advanced below)
  for (int i = tid; i < nv; i += kThreads) {
    float t = part[0][i];
#pragma unroll
    for (int c = 1; c < kXChains; ++c) t += part[c][i];
    const int rr = i / kXVals, v = i - rr * kXVals;
    const int64_t r = rbase + rr;
    if (v < DSV4_HC_PRENORM_MAX_N) p.out[r * p.out_stride_m + v * p.out_stride_n] = t;
    else p.sqrsum[r * p.sq_stride_m] = t;
  }
  if (tid < nr)   // this call's tag, for the next call of the stream (read at L2, as above: no stale L1 line)
    xc.epochs[rbase + tid] = ld_relaxed_u32(xc.epochs + rbase + tid) + 1u;
  if (tid == 0) xc.tickets[blockIdx.y] = 0u;
}

// four bf16 x values (one 8-byte load) as fp32: bf16 -> fp32 is the top half of the fp32 word, one shift or mask
// per value; and the sums both kernels below take of them: x . f and x . x, fp32 FMA (x exact in fp32)
__device__ __forceinline__ float4 bf16x4_to_float4(uint2 w) {
  return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                     __uint_as_float(w.y & 0xffff0000u));
}
__device__ __forceinline__ float dot4(float4 x, float4 f, float acc) {
  return fmaf(x.x, f.x, fmaf(x.y, f.y, fmaf(x.z, f.z, fmaf(x.w, f.w, acc))));
}
__device__ __forceinline__ float sqr4(float4 x, float acc) {
  return fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, acc))));
}

// the reduce-scatter's step of offset kOff (see hc_prenorm_small_kernel): values [0, 2h) -> [0, h) while a
// lane holds more than kVL, then plain butterflies
template <int kTK, int kN, int kVL, int kOff>
__device__ __forceinline__ void halve_steps(float* v, int kt, int& idx0) {
  if constexpr (kOff > 0) {
    if constexpr (kN > kVL) {
      constexpr int h = kN / 2;
      const bool hi = kt & kOff;
#pragma unroll
      for (int i = 0; i < h; ++i) {
        const float send = hi ? v[i] : v[i + h];
        const float keep = hi ? v[i + h] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
      }
      if (hi) idx0 += h;
      halve_steps<kTK, h, kVL, kOff / 2>(v, kt, idx0);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kOff);
      halve_steps<kTK, kN, kVL, kOff / 2>(v, kt, idx0);
    }
  }
}

// kRT x rows and kJ fn rows per lane, kTR row groups per block (R = kRT kTR rows), kU columns per lane in one
// round of loads. Slots (a row group x an fn-row group, kTK lanes each) are numbered row-group major: the
// slots of a warp share their x rows and read different fn rows (H100: 5-13 % faster than the
// other order, whose warps share fn rows; H100: also with the square-sums spread over the fn-row groups of
// that order, 2-19 % slower); every lane computes the square-sums (4 FMA per x row and column next to kJ x 4),
// the fn-row group 0 lanes store them.
// kXchg: P > 1 sub-slices summed in the launch through p.xchg (see xchg_consume) instead of stored as partials.
// kAtomic: P > 1 sub-slices added into the caller's out [m, 24] / sqrsum [m] (out_stride_s = sq_stride_s = 0 from
// the launcher), which hc_prenorm_zero_kernel, the grid before this one, zeroes. The block's values go through
// shared memory so that out leaves as float4 atomics (4x fewer than one per value; H100: scalar atomics
// cost up to 1.5 us more at R = 16, where all blocks finish in one burst). The x / fn loads come before this grid's
// PDL wait: the zero kernel calls launch_dependents only after its own wait, so by the time this grid starts, the
// kernel before the zero kernel has completed and its writes are visible; the wait here, before the atomics, is
// for the zeroed out (H100: 0.15-0.4 us less than waiting at the start).
// kFG: the 24 fn rows spread over kFG blocks of kNB = 24 / kFG rows each (grid y = row blocks x kFG, the fn group
// fastest): with R rows per block, every row block of a split otherwise reads all of the split's fn (24 KB at
// SGLang's 256-wide splits), i.e. fn ceil(m / R)-fold from L2; with kFG = 3 / 6 each block reads a third / a sixth of
// it and fn leaves L2 once per split (plain stores only: not with kXchg / kAtomic, whose sums are per row block).
template <int kRT, int kJ, int kTR, int kU, bool kXchg = false, bool kAtomic = false, int kFG = 1>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) hc_prenorm_small_kernel(const HcPrenormParams p) {
  static_assert(!(kXchg && kAtomic), "one way of summing the sub-slices");
  static_assert(kFG == 1 || !(kXchg || kAtomic), "fn groups: plain stores only");
  constexpr int kNB = DSV4_HC_PRENORM_MAX_N / kFG;   // fn rows per block
  constexpr int kJG = kNB / kJ;                      // fn-row groups of the block
  constexpr int kTK = kThreads / (kTR * kJG);        // lanes along K per slot
  constexpr int kRound = kTK * kU;                   // float4 columns per round of loads
  static_assert(kNB * kFG == DSV4_HC_PRENORM_MAX_N && kJ * kJG == kNB, "fn rows split evenly over the groups");
  static_assert(kTK >= 1 && 32 % kTK == 0 && kTK * kTR * kJG == kThreads, "a slot's lanes are lanes of one warp");
  const int tid = threadIdx.x;
  const int kt = tid % kTK, slot = tid / kTK;
  const int fg = kFG > 1 ? (int)(blockIdx.y % kFG) : 0, rblk = kFG > 1 ? (int)(blockIdx.y / kFG) : (int)blockIdx.y;
  const int jg = slot % kJG, tr = slot / kJG;
  const int j0 = fg * kNB + jg * kJ;                 // the lane's first fn row
  const int64_t row0 = (int64_t)rblk * (kRT * kTR) + tr * kRT;
  // block s: split s of out / sqrsum (with num_splits None the launcher passes P sub-slices as P splits of the
  // workspace, and a reduce grid sums them). Its K: DeepGEMM's partition of the 64-wide K blocks (the first
  // nb % S splits get one more), float4 columns [c0, c1). In 32 bits (api.cu: K < 2^30, S <= 65535): fewer
  // instructions before the loads (H100: up to 8 % faster than the 64-bit form, most at R = 16)
  const int nb = (int)((p.K + kKBlock - 1) / kKBlock), S32 = (int)p.num_splits, s = blockIdx.x;
  const int b0 = s * (nb / S32) + min(s, nb % S32), bc = nb / S32 + (s < nb % S32 ? 1 : 0);
  const int c0 = b0 * (kKBlock / 4), c1 = min((b0 + bc) * kKBlock, (int)p.K) / 4;
  // the lane's rows: rows >= m and fn rows >= n read the last real row (their sums are never stored), so
  // the loads need no row predicate and no zero fill
  const float4* fp[kJ];
  const uint2* xp[kRT];
#pragma unroll
  for (int jj = 0; jj < kJ; ++jj)
    fp[jj] = (const float4*)(p.fn + min((int64_t)(j0 + jj), p.n - 1) * p.fn_stride) + kt;
#pragma unroll
  for (int rr = 0; rr < kRT; ++rr)
    xp[rr] = (const uint2*)((const __nv_bfloat16*)p.x + min(row0 + rr, p.m - 1) * p.x_stride) + kt;

  float acc[kRT][kJ], sq[kRT];
#pragma unroll
  for (int rr = 0; rr < kRT; ++rr) {
    sq[rr] = 0.f;
#pragma unroll
    for (int jj = 0; jj < kJ; ++jj) acc[rr][jj] = 0.f;
  }
  // one round: load kU columns (lane column c + u kTK, u < kU; with kCheck those at or past c1 load zeros)
  // for all rows first, then multiply
  auto round = [&](int c, auto check) {
    constexpr bool kCheck = decltype(check)::value;
    float4 f[kU][kJ];
    uint2 xv[kU][kRT];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int cu = c + u * kTK;
      const bool ok = !kCheck || cu + kt < c1;
#pragma unroll
      for (int jj = 0; jj < kJ; ++jj) f[u][jj] = ok ? __ldg(fp[jj] + cu) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int rr = 0; rr < kRT; ++rr) xv[u][rr] = ok ? __ldg(xp[rr] + cu) : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int rr = 0; rr < kRT; ++rr) {
        const float4 xf = bf16x4_to_float4(xv[u][rr]);
        sq[rr] = sqr4(xf, sq[rr]);
#pragma unroll
        for (int jj = 0; jj < kJ; ++jj) acc[rr][jj] = dot4(xf, f[u][jj], acc[rr][jj]);
      }
  };
  if constexpr (!kAtomic) pdl_wait();   // x / fn may come from the previous kernel of the stream (kAtomic: above)
  // kXchg: the ticket and the epochs of the lane's rows, loaded now and used only after the sums (no wait)
  uint32_t ticket = 0, epoch[kRT];
  if constexpr (kXchg) {
    const Xchg xc(p.xchg);
    if (tid == 0) ticket = atomicAdd(xc.tickets + blockIdx.y, 1u);
#pragma unroll
    for (int rr = 0; rr < kRT; ++rr) epoch[rr] = ld_relaxed_u32(xc.epochs + min(row0 + rr, p.m - 1));
  }
  // (not unrolled: a round's loads already fill the registers; pipelining two rounds would cost occupancy)
  if ((c1 - c0) % kRound == 0) {   // SGLang's 256-wide splits: whole rounds, no column predicate
#pragma unroll 1
    for (int c = c0; c < c1; c += kRound) round(c, std::false_type{});
  } else {
#pragma unroll 1
    for (int c = c0; c < c1; c += kRound) round(c, std::true_type{});
  }
  // sum the slot's values (kRT x kJ sums, then kRT square-sums) over its kTK lanes, a reduce-scatter by
  // recursive halving: at the step of offset o a lane keeps one half of its values (the upper one if bit o of
  // kt is set), sends the other half to lane kt ^ o and adds the partner's copy of the half it keeps; once a
  // lane holds one value, plain butterflies. Fixed order: deterministic. Then each value sits in one lane (or,
  // with fewer values than lanes, in kTK / kV lanes alike) and is stored from there: one store per lane.
  constexpr int kV0 = kRT * kJ + kRT;
  constexpr int kV = kV0 <= 1 ? 1 : 1 << (32 - __builtin_clz(kV0 - 1));   // padded to a power of two
  constexpr int kVL = kV >= kTK ? kV / kTK : 1;                            // values per lane at the end
  constexpr int kCopies = kV < kTK ? kTK / kV : 1;                         // lanes holding each value
  float v[kV];
#pragma unroll
  for (int i = 0; i < kV; ++i) v[i] = 0.f;
#pragma unroll
  for (int rr = 0; rr < kRT; ++rr) {
#pragma unroll
    for (int jj = 0; jj < kJ; ++jj) v[rr * kJ + jj] = acc[rr][jj];
    v[kRT * kJ + rr] = sq[rr];
  }
  int idx0 = 0;   // v[i] is the slot's value idx0 + i
  halve_steps<kTK, kV, kVL, kTK / 2>(v, kt, idx0);
  if constexpr (kXchg) {
    // each value as one tagged word of (row, sub-slice s, value); then the row block's last ticket sums them
    const Xchg xc(p.xchg);
    if (kCopies == 1 || kt % kCopies == 0) {
#pragma unroll
      for (int i = 0; i < kVL; ++i) {
        const int idx = idx0 + i;
        int rr = -1, val = 0;
        if (idx < kRT * kJ) {
          rr = idx / kJ;
          val = j0 + (idx - rr * kJ);   // < 24 = n (P > 1 needs n = 24)
        } else if (idx < kV0 && jg == 0) {
          rr = idx - kRT * kJ;
          val = DSV4_HC_PRENORM_MAX_N;
        }
        uint32_t e = epoch[0];   // epoch[rr] without dynamic indexing (registers, not local memory)
#pragma unroll
        for (int q = 1; q < kRT; ++q) e = rr == q ? epoch[q] : e;
        if (rr >= 0 && row0 + rr < p.m)
          st_relaxed_u64(xc.word(row0 + rr, s, val),
                         ((unsigned long long)(e + 1u) << 32) | __float_as_uint(v[i]));
      }
    }
    __shared__ uint32_t last;
    if (tid == 0) last = ticket == gridDim.x - 1;
    __syncthreads();
    if (last) xchg_consume<kRT * kTR>(p, xc);
    return;
  }
  if constexpr (kAtomic) {
    // the block's values as out rows [R][24] and square-sums [R] in shared memory, then one float4 atomic per four
    // fn rows of a row and one scalar atomic per square-sum
    constexpr int kR = kRT * kTR, kN = DSV4_HC_PRENORM_MAX_N, kQ = kN / 4;
    __shared__ __align__(16) float blk[kR * kN + kR];
    if (kCopies == 1 || kt % kCopies == 0) {
#pragma unroll
      for (int i = 0; i < kVL; ++i) {
        const int idx = idx0 + i;
        if (idx < kRT * kJ) {
          const int rr = idx / kJ;
          blk[(tr * kRT + rr) * kN + j0 + (idx - rr * kJ)] = v[i];
        } else if (idx < kV0 && jg == 0) {
          blk[kR * kN + tr * kRT + (idx - kRT * kJ)] = v[i];
        }
      }
    }
    __syncthreads();
    pdl_wait();   // out / sqrsum zeroed by the zero kernel
    const int64_t rb = (int64_t)blockIdx.y * kR;
    for (int t = tid; t < kR * kQ + kR; t += kThreads) {
      if (t < kR * kQ) {
        const int rr = t / kQ, q4 = t - rr * kQ;
        if (rb + rr < p.m)
          atomicAdd((float4*)(p.out + (rb + rr) * p.out_stride_m) + q4, *(const float4*)(blk + rr * kN + 4 * q4));
      } else if (rb + (t - kR * kQ) < p.m) {
        atomicAdd(p.sqrsum + (rb + (t - kR * kQ)) * p.sq_stride_m, blk[kR * kN + (t - kR * kQ)]);
      }
    }
    return;
  }
  if (kCopies > 1 && kt % kCopies != 0) return;   // a copy: another lane stores it
#pragma unroll
  for (int i = 0; i < kVL; ++i) {
    const int idx = idx0 + i;
    if (idx < kRT * kJ) {
      const int rr = idx / kJ, jj = idx - rr * kJ;
      const int64_t r = row0 + rr, j = j0 + jj;
      if (r < p.m && j < p.n) p.out[s * p.out_stride_s + r * p.out_stride_m + j * p.out_stride_n] = v[i];
    } else if (idx < kV0 && jg == 0 && fg == 0) {
      const int64_t r = row0 + (idx - kRT * kJ);
      if (r < p.m) p.sqrsum[s * p.sq_stride_s + r * p.sq_stride_m] = v[i];
    }
  }
}

// ---- the whole-K kernel for m <= 2 rows and one split (num_splits None at decode): one 1024-thread block per fn
// row j streams that row (64 KB at K = 16384) and the kM x rows over the whole K, so no partial leaves the block
// and no second grid or hand-off is needed; the price is one SM per fn row (24 SMs) reading 64 + kM x 32 KB each
// (docs/hc_prenorm.md). kU float4 columns per thread and round: a round's loads are all issued first.
// Block sum: shuffles, then the 32 warp sums in warp order (deterministic). Block 0 also stores the square-sums.
constexpr int kRowThreads = 1024;
template <int kM, int kU>
__global__ void __launch_bounds__(kRowThreads, 1) hc_prenorm_fnrow_kernel(const HcPrenormParams p) {
  const int j = blockIdx.x, tid = threadIdx.x, nc = (int)(p.K / 4);
  const float4* f = (const float4*)(p.fn + (int64_t)j * p.fn_stride);
  const uint2* xr[kM];
#pragma unroll
  for (int r = 0; r < kM; ++r)
    xr[r] = (const uint2*)((const __nv_bfloat16*)p.x + (int64_t)min(r, (int)p.m - 1) * p.x_stride);
  float acc[kM], sq[kM];
#pragma unroll
  for (int r = 0; r < kM; ++r) acc[r] = sq[r] = 0.f;
  pdl_wait();
#pragma unroll 1
  for (int c0 = 0; c0 < nc; c0 += kRowThreads * kU) {
    float4 fv[kU];
    uint2 xv[kU][kM];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u * kRowThreads + tid;
      const bool ok = c < nc;
      fv[u] = ok ? __ldg(f + c) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int r = 0; r < kM; ++r) xv[u][r] = ok ? __ldg(xr[r] + c) : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int r = 0; r < kM; ++r) {
        const float4 xf = bf16x4_to_float4(xv[u][r]);
        acc[r] = dot4(xf, fv[u], acc[r]);
        sq[r] = sqr4(xf, sq[r]);
      }
  }
  __shared__ float wsum[kRowThreads / 32][2 * kM];
#pragma unroll
  for (int r = 0; r < kM; ++r)
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
      sq[r] += __shfl_xor_sync(0xffffffffu, sq[r], o);
    }
  if ((tid & 31) == 0)
#pragma unroll
    for (int r = 0; r < kM; ++r) wsum[tid >> 5][r] = acc[r], wsum[tid >> 5][kM + r] = sq[r];
  __syncthreads();
  if (tid < 2 * kM) {
    float t = wsum[0][tid];
#pragma unroll 4
    for (int w = 1; w < kRowThreads / 32; ++w) t += wsum[w][tid];
    const int r = tid % kM;
    if (r < p.m) {
      if (tid < kM) p.out[r * p.out_stride_m + j * p.out_stride_n] = t;
      else if (j == 0) p.sqrsum[r * p.sq_stride_m] = t;
    }
  }
}

}  // namespace hcs
}  // namespace dsv4
